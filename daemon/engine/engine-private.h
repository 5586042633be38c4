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
 * A transfer: one tensor's valid copy in @src copied into its reserved copy
 * in @dst.  It belongs to the tensor (Tensor.xfer), not to an op: ops only
 * wait for it (Tensor.waiters), so cancelling an op never touches I/O.
 */
typedef struct Xfer {
        Engine *engine;
        Tensor *tensor;
        int src, dst;
        uint64_t version;
        unsigned pending;       /* NVMe parts not completed yet */
        int error;
        char errmsg[160];
        VramDir vdir;
        XferCopy *vcopies;      /* host <-> VRAM: one copy per stretch within one host and one VRAM piece */
        uint32_t n_vcopies;
        uint32_t vpending;      /* of them with the backend, not done yet */
        List vlink;             /* VramLink.waiting, while it waits for the VRAM link */
        double vtag;            /* its virtual start time there (fairq.h) */
        XferPart *parts;
        uint32_t n_parts;
        uint64_t queued_ns, start_ns;   /* set only while a trace runs (0: unknown) */
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

/* Free every transfer still in flight, as if it never started (tierd's exit, nothing will complete them). */
void xfer_abandon_all(Engine *e);

/*
 * engine_xfer_ended() - the transfer of @t ended (t->xfer is NULL again):
 * the ops that waited for it run again, failing with @error (< 0, reason
 * @errmsg) if it failed.  Called by xfer.c.
 */
void engine_xfer_ended(Engine *e, Tensor *t, List *waiters, int error, const char *errmsg);

/* Can @v's copy in @tier go now (resident, and nothing pins it, moves it or works on it)? */
static inline bool copy_evictable(const Tensor *v, int tier) {
        const Copy *c = &v->copy[tier];

        return c->state == COPY_RESIDENT && c->pins == 0 && v->op_refs == 0 && !v->xfer;
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
 * reclaim() - the pool of @tier has no segment for @want (SPACE_POOL): take
 * room back from other jobs, lingering ones first, then those above their
 * share (reclaim.c).  ADV_RETRY (copies were dropped: a segment may be
 * empty now), ADV_WAIT_SPACE (drains started or running), -ENOSPC (no job
 * owes the requester anything: it makes room among its own copies), or
 * another -errno.
 */
int reclaim(Engine *e, Op *op, Tensor *want, int tier);
