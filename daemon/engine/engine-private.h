/* SPDX-License-Identifier: MIT */
/* engine-private.h: what op.c and xfer.c share inside the engine (never used outside daemon/engine). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/engine.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"

typedef struct XferPart XferPart;
typedef struct XferCopy XferCopy;

/*
 * A step on the VRAM link: a run of a transfer's copies that waits in
 * VramLink.waiting by its own fair tag and then takes one of the link's
 * slots until its copies are done.  A plain host <-> VRAM transfer is one
 * step; a chained transfer has one per extent (its pieces).
 */
typedef struct XferStep {
        struct Xfer *xfer;
        List vlink;             /* VramLink.waiting, while it waits for the VRAM link */
        double vtag;            /* its virtual start time there (fairq.h) */
        uint32_t first, n;      /* its copies: Xfer.vcopies[first, first + n) */
        uint32_t pending;       /* of them with the backend, not done yet */
        uint32_t piece;         /* its index (the extent, in a chained transfer) */
        uint64_t bytes;
        bool queued;            /* in VramLink.waiting */
} XferStep;

/*
 * A transfer: one tensor's valid copy in @src copied into its reserved copy
 * in @dst.  It belongs to the tensor (Tensor.xfer), not to an op: ops only
 * wait for it (Tensor.waiters), so cancelling an op never touches I/O.
 *
 * A chained transfer (@chain) reads NVMe into host and, piece by piece, host
 * into the reserved VRAM copy: an extent's VRAM copy goes to the link as soon
 * as the extent is read and its checksum holds, while the later extents are
 * still being read.  Both copies become resident when all is done; the host
 * copy goes if the read failed, the VRAM copy (not pinned) if anything failed.
 */
typedef struct Xfer {
        Engine *engine;
        Tensor *tensor;
        int src, dst;
        uint64_t version;
        unsigned pending;       /* NVMe parts not completed yet */
        int error;              /* the first hop's (NVMe <-> host, or the only one) */
        char errmsg[160];
        VramDir vdir;
        XferCopy *vcopies;      /* host <-> VRAM: one copy per stretch within one host and one VRAM piece (and extent, chained) */
        uint32_t n_vcopies;
        XferStep *steps;        /* host <-> VRAM steps: 1, or one per extent (chained) */
        uint32_t n_steps;
        uint32_t steps_out;     /* chained: steps queued or with the backend */
        uint32_t next_step;     /* chained: the next step to queue, once its extent is read */
        bool chain;
        bool *read_ok;          /* chained: per extent, read and checksummed */
        int verror;             /* chained: the VRAM hop's error */
        char verrmsg[160];
        XferPart *parts;
        uint32_t n_parts;
        uint64_t queued_ns, start_ns;   /* set only while a trace runs (0: unknown) */
        uint64_t vqueued_ns, vstart_ns; /* chained, the VRAM hop: likewise */
        uint32_t host_changed;  /* NVMe write: extents whose host bytes changed while written (xfer.c) */
        uint64_t book_seq;      /* written to NVMe, waiting for the NVMe index to be durable (0: not) */
        List link;              /* Engine.xfers */
} Xfer;

/* What a step of an op (op_advance() and the space handling under it) comes to, besides -errno. */
enum {
        ADV_DONE = 0,
        ADV_WAIT_TENSOR = 1,
        ADV_WAIT_SPACE = 2,
        ADV_RETRY = 3,          /* internal to space handling: something was freed, try again */
};

/* Record why @op fails in op->error; returns @r. */
int op_fail(Op *op, int r, const char *fmt, ...) _printf_(3, 4);

/* Start moving @t's valid copy in @src into the reserved copy in @dst (xfer.c).  0 or -errno (op->error set). */
int xfer_start(Op *op, Tensor *t, int src, int dst);
/*
 * xfer_start_chain() - start moving @t's valid NVMe copy into its reserved
 * host copy and, piece by piece as the extents arrive, on into its reserved
 * VRAM copy (a chained transfer, see Xfer).  0 or -errno (op->error set).
 */
int xfer_start_chain(Op *op, Tensor *t);

/* Free every transfer still in flight, as if it never started (tierd's exit, nothing will complete them). */
void xfer_abandon_all(Engine *e);
/* The NVMe index made more records durable: end the NVMe writes that waited for it (a BookDurable callback). */
void engine_book_durable(void *userdata);

/*
 * engine_xfer_ended() - the transfer of @t ended (t->xfer is NULL again):
 * the ops that waited for it run again, failing with @error (< 0, reason
 * @errmsg) if it failed.  Called by xfer.c.
 */
void engine_xfer_ended(Engine *e, Tensor *t, List *waiters, int error, const char *errmsg);

/* Can @v's copy in @tier go now (resident, and nothing pins it, moves it or works on it)? */
static inline bool copy_evictable(const Tensor *v, int tier) {
        const Copy *c = &v->copy[tier];

        return c->state == COPY_RESIDENT && c->pins == 0 && v->op_refs == 0 && !v->xfer && !v->job->frozen;
}

/*
 * victim_evict() - make @v's copy in @tier go: dropped at once (adding to
 * *@freed) when another copy is valid or its bytes are dead, else written
 * down first by a drain (adding to *@draining; the copy is DRAINING).
 * *@blocked counts a copy passed over because its last drain failed and
 * nothing changed below since.  @flags: TRACE_F_* for the trace (reclaim or
 * not).  0 or -errno.
 */
int victim_evict(Engine *e, Tensor *v, int tier, uint32_t flags, uint64_t *freed, uint64_t *draining,
                 unsigned *blocked);

/*
 * engine_make_space() - choose victims in @tier of @want's job and free or
 * drain them until @need bytes are freed or coming (victims.c).  Returns
 * ADV_RETRY (something was freed), ADV_WAIT_SPACE (drains started, or copies
 * that could go are in a transfer), -EAGAIN (@op does not wait), -ENOSPC
 * (nothing can go) or another -errno.  *@blocked counts the victims passed
 * over because writing them down failed already.
 */
int engine_make_space(Engine *e, Op *op, Tensor *want, int tier, uint64_t need, unsigned *blocked);

/*
 * engine_drain_failed() - writing @v's copy in @tier down failed with @r
 * (@reserving: its room below could not be reserved, no transfer failed):
 * @v is blocked until the tier below changes, and for want of room
 * (-ENOSPC) so are its job's sole copies as large that have none there
 * (blocked.c, Job.drain_short).
 */
void engine_drain_failed(Engine *e, Tensor *v, int tier, int r, bool reserving);

/*
 * reclaim() - the pool of @tier has no segment for @want (SPACE_POOL): take
 * room back from other jobs, lingering ones first, then those above their
 * share (reclaim.c).  ADV_RETRY (copies were dropped: a segment may be
 * empty now), ADV_WAIT_SPACE (drains started or running), -ENOSPC (no job
 * owes the requester anything: it makes room among its own copies), or
 * another -errno.
 */
int reclaim(Engine *e, Op *op, Tensor *want, int tier);
/*
 * reclaim_total() - @want's copy would take a total of its job's uid or
 * group above itself (SPACE_TOTAL): take room back from the other jobs under
 * that total, lingering ones first, then live ones above their part of it
 * (reclaim.c).  ADV_RETRY, ADV_WAIT_SPACE, -ENOSPC (nothing owed), -errno.
 */
int reclaim_total(Engine *e, Tensor *want, int tier);
