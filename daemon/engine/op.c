/* SPDX-License-Identifier: MIT */
/* op.c: the op engine: ops and their state machine, making space. */

/*
 * Theory of operation.
 *
 * Every request that may move data becomes an Op: pin, prefetch or evict
 * of one tensor to one tier (from a client, or from the scheduler), and,
 * internally, drain (write a victim down, then drop it) and clean (write a
 * sole copy down, keep it: write-behind).  An op never owns a transfer; it
 * only waits.  op_advance() looks at the tensor as it is now and takes the
 * next step towards the op's goal, returning DONE, an error, or a reason
 * to wait:
 *
 *   WAIT_TENSOR   a transfer of this tensor is running (Tensor.xfer); the op
 *                 sits in Tensor.waiters and runs again when it ends.
 *   WAIT_SPACE    the tier is full and victims are being written down; the
 *                 op sits in Engine.space_waiters and runs again whenever
 *                 space is freed or a drain ends.
 *
 * Because ops hold no I/O, cancelling one (its client vanished) is always
 * immediate and safe: transfers in flight (xfer.c) finish on their own and
 * leave a resident, unpinned copy behind.
 *
 * A copy may be dropped only if it is not the sole valid copy (copy_is_sole)
 * — otherwise it is first written to the tier below (NVMe writes always come
 * from the host copy).  Making space: the unpinned copies of the same job in
 * that tier, in the order the scheduler gives (EngineSchedOps.victim_order:
 * least recently used first without one, Belady's next use under the
 * timeline policy); those with a valid copy elsewhere (or dead bytes) are
 * dropped at once, sole copies are drained and the op waits.  Nothing
 * pinned or in use by an op is ever chosen.  When nothing can be freed the
 * op fails with -ENOSPC and a message naming the tier and the limit.
 *
 * The engine runs from a defer source that engine_kick() arms, so ops
 * queued while handling one packet are advanced once that handler returns,
 * together; then the scheduler's pass (EngineSchedOps.pass) looks at the
 * new state and may queue more, which run in the same go.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>

#include "daemon/base/log.h"
#include "daemon/engine/engine-private.h"
#include "daemon/state/book.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* make_space() calls while one reservation still finds no room after freeing copies. */
#define RESERVE_ATTEMPTS_MAX 64

int op_fail(Op *op, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(op->error, sizeof(op->error), fmt, ap);
        va_end(ap);
        return r;
}

/* ---- space ------------------------------------------------------------------------------ */

static void wake_space_waiters(Engine *e) {
        if (list_empty(&e->space_waiters))
                return;
        list_for_each_safe(n, tmp, &e->space_waiters)
                list_entry(n, Op, wait_link)->wait = OP_WAIT_RUN;
        list_splice_tail(&e->run_queue, &e->space_waiters);
        engine_kick(e);
}

void engine_wake_space_waiters(Engine *e) {
        wake_space_waiters(e);
}


static void sched_changed(Engine *e) {
        if (e->sched && e->sched->changed)
                e->sched->changed(e->sched_userdata);
}

void engine_claims_changed(Engine *e) {
        engine_limits_changed(e);       /* (room kept for its guarantees, NVMe's too: blocked write-downs retry) */
}

void engine_limits_changed(Engine *e) {
        for (int i = 0; i < TIERS; i++)
                e->space_gen[i]++;
        wake_space_waiters(e);
        sched_changed(e);
}

/* Record the choice of victim @v in @tier (@why TRACE_WHY_*), with its next planned use. */
static void victim_trace(Engine *e, const Tensor *v, int tier, int why, uint32_t flags) {
        uint64_t next = e->sched && e->sched->next_use ? e->sched->next_use(e->sched_userdata, (Tensor *) v, tier) : 0;

        trace_decision(&e->trace, v, tier, why, next, flags, now_ns());
}

int victim_evict(Engine *e, Tensor *v, int tier, uint32_t flags, uint64_t *freed, uint64_t *draining,
                 unsigned *blocked) {
        Op *d;
        int r;

        if (!copy_is_sole(v, tier)) {
                if (trace_on(&e->trace))
                        victim_trace(e, v, tier, TRACE_WHY_DROP_CLEAN, flags);
                *freed += v->alloc_size;
                copy_free(v, tier);
                return 0;
        }
        if (e->sched && e->sched->overwrites_next && e->sched->overwrites_next(e->sched_userdata, v)) {
                /* its plan overwrites it before reading it: nothing to write back */
                if (trace_on(&e->trace))
                        victim_trace(e, v, tier, TRACE_WHY_DROP_DEAD, flags);
                v->dead = true;
                *freed += v->alloc_size;
                copy_free(v, tier);
                return 0;
        }
        if (tier == LEVEL_NVME)
                return 0;       /* nothing below NVMe */
        if (engine_drain_blocked(e, v, tier)) {
                if (trace_on(&e->trace))
                        victim_trace(e, v, tier, TRACE_WHY_BLOCKED, flags);
                (*blocked)++;   /* draining it again would fail the same way, and again */
                return 0;
        }
        /* write it down first */
        r = op_submit(e, OP_DRAIN, v, tier, NULL, NULL, NULL, &d);
        if (r < 0)
                return r;
        /*
         * A drain is forced (the requester was chosen by deadline already), so
         * it may take any room below; it is charged to its job's fair share.
         */
        if (e->sched && e->sched->charge)
                e->sched->charge(e->sched_userdata, v->job, v->alloc_size);
        copy_set_state(v, tier, COPY_DRAINING);
        *draining += v->alloc_size;
        if (trace_on(&e->trace))
                victim_trace(e, v, tier, TRACE_WHY_DRAIN, flags);
        return 0;
}

bool engine_copy_evictable(const Tensor *t, int tier) {
        return copy_evictable(t, tier);
}

/*
 * Would @op's pin take room kept for other jobs' guarantees (reclaim.c)?  Its
 * copy as placed, or with none placed the least it can take, with @reclaim a
 * segment taken from another job.  0 (not @op's pin either), or -errno with
 * op->error set; op->kept says whether it was refused for that room.
 */
static int pin_kept(Op *op, Tensor *t, int tier, bool reclaim) {
        int r;

        op->kept = false;
        if (op->kind != OP_PIN || t != op->tensor || tier != op->tier)
                return 0;
        r = reclaim ? engine_pin_check_reclaim(op->engine, t, tier, op->error, sizeof(op->error)) :
                engine_pin_check(op->engine, t, tier, op->error, sizeof(op->error));
        if (r == -ENOMEM)
                return op_fail(op, r, "out of memory");
        op->kept = r == -EAGAIN;
        return r;
}

/*
 * Reserve space for @t in @tier: its pieces (copy_alloc()), after making room
 * among the job's own copies when it is at its limit or short of room.
 * 0, ADV_WAIT_SPACE, or -errno with op->error set (space_explain()).
 */
static int copy_reserve(Op *op, Tensor *t, int tier) {
        Engine *e = op->engine;
        Copy *c = &t->copy[tier];
        SpaceShort why = SPACE_OK;
        unsigned blocked = 0;
        int r;

        for (unsigned attempt = 0;; attempt++) {
                r = copy_alloc(t, tier, &why);
                if (r >= 0)
                        break;
                if (r != -ENOSPC)
                        return op_fail(op, r, "cannot allocate %s space for tensor '%s': %s", level_to_string(tier),
                                       t->name, strerror(-r));
                if (why == SPACE_TOO_LARGE || why == SPACE_OVER_QUOTA || why == SPACE_TARGETS ||
                    why == SPACE_TOTAL_OVER || why == SPACE_NVME_KEPT)
                        break;          /* making room among the job's copies cannot help */
                /* (not for a pin the segment would take into room kept for guarantees: refused anyway) */
                if (why == SPACE_POOL && (r = pin_kept(op, t, tier, true)) != -EAGAIN) {
                        if (r < 0)
                                return r;
                        /* the pool is dry: room may be owed by lingering jobs or jobs above their share */
                        r = reclaim(e, op, t, tier);
                        if (r == ADV_RETRY && attempt < RESERVE_ATTEMPTS_MAX)
                                continue;
                        if (r == ADV_WAIT_SPACE)
                                return ADV_WAIT_SPACE;
                        if (r < 0 && r != -ENOSPC)
                                return op_fail(op, r, "cannot take %s room back for job '%s': %s",
                                               level_to_string(tier), t->job->name, strerror(-r));
                        /* segments the pool gets back from the renewer (renew.c) before the job's own copies */
                        if (e->registry->pools[tier]->n_renewing > 0 && !op->no_wait)
                                return ADV_WAIT_SPACE;
                }
                blocked = 0;
                r = engine_make_space(e, op, t, tier, copy_room_needed(t, tier), &blocked);
                if (r == ADV_RETRY && attempt < RESERVE_ATTEMPTS_MAX)
                        continue;
                if (r == ADV_WAIT_SPACE)
                        return ADV_WAIT_SPACE;
                if (why == SPACE_TOTAL && (r == -ENOSPC || r == -EAGAIN)) {
                        /* its own copies cannot make the room: the other jobs under the total may owe it */
                        int q = reclaim_total(e, t, tier);

                        if (q == ADV_RETRY && attempt < RESERVE_ATTEMPTS_MAX)
                                continue;
                        if (q == ADV_WAIT_SPACE && !op->no_wait)
                                return ADV_WAIT_SPACE;
                        if (q < 0 && q != -ENOSPC)
                                return op_fail(op, q, "cannot take %s room back under a total for job '%s': %s",
                                               level_to_string(tier), t->job->name, strerror(-q));
                }
                if (tier == LEVEL_VRAM && e->vram->pool.n_revoking > 0 && !op->no_wait)
                        return ADV_WAIT_SPACE;  /* chunks come back once their old clients let go (revoke.c) */

                if (r == -EAGAIN)
                        return op_fail(op, -EAGAIN, "no %s space to spare before the deadline", level_to_string(tier));
                if (r < 0 && r != -ENOSPC)
                        return op_fail(op, r, "cannot make room in %s for job '%s': %s", level_to_string(tier),
                                       t->job->name, strerror(-r));
                r = -ENOSPC;
                break;
        }
        if (r >= 0) {
                /* the room this pin would hold may be kept for other jobs' guarantees (reclaim.c) */
                r = pin_kept(op, t, tier, false);
                if (r < 0) {
                        copy_release(t, tier);
                        return r;
                }
        }
        if (r < 0 && op->kept)
                return -EAGAIN;         /* no room taken from others for it: op->error says why */
        if (r < 0) {
                r = space_explain(t, tier, why, op->error, sizeof(op->error));
                if (blocked > 0 && tier + 1 < TIERS) {
                        size_t len = strlen(op->error);

                        (void) snprintf(op->error + len, sizeof(op->error) - len, "; %u of its tensors there cannot "
                                        "be written down to %s: %s", blocked, level_to_string(tier + 1),
                                        e->drain_error[tier]);
                }
                return r;
        }
        copy_set_state(t, tier, COPY_FILLING);
        c->pins = 0;
        copy_touch(t, tier);
        return 0;
}

/* ---- the state machine -------------------------------------------------------- */

static int zero_fill(Op *op, Tensor *t, int tier) {
        Engine *e = op->engine;
        Copy *c = &t->copy[tier];

        for (uint32_t i = 0; i < c->n_pieces; i++) {
                const CopyPiece *p = &c->pieces[i];

                if (tier == LEVEL_HOST)
                        memset((uint8_t *) p->seg->map + p->offset, 0, p->len);
                else {
                        int r = e->vram->ops->zero(e->vram, p->seg, p->offset, p->len);
                        if (r < 0)
                                return op_fail(op, r, "cannot zero VRAM: %s", vram_zero_why(r));
                }
        }
        copy_set_state(t, tier, COPY_RESIDENT);
        c->version = t->version;
        /*
         * A dead tensor's zeros (its plan's own hold, past the write) are not its bytes: no other
         * read gets them as data (ensure_copy()'s dead check; copy_valid() is false), nor a copy
         * taken from them, until that write
         */
        c->unwritten = t->dead;
        tensor_note(t);
        return ADV_DONE;
}

/*
 * A stale copy of @t in @tier (written in another tier since) is refilled in place: the reservation
 * the transfer fills.  Not one a pin that may write holds (its pinner may write it: its dirty unpin
 * would be taken back by the refill's end), nor a ghost's (its client of before may write it): that
 * is refused; the scheduler's holds retry once something is unpinned (a ghost's release).  0, -EBUSY.
 */
static int refill_stale(Op *op, Tensor *t, int tier) {
        Copy *c = &t->copy[tier];

        if (c->state != COPY_RESIDENT && c->state != COPY_DRAINING)
                return 0;
        /*
         * Reserved for a write-only pin that has not written it yet (no old bytes were brought): no
         * read gets its room as data.  A plan's hold waits for that pin's unpin (-EBUSY is retried
         * once something is unpinned: the plan's own read after its write, pinned ahead); a plain
         * pin is told so.
         */
        if (c->writers > 0 && c->unwritten && c->version == t->version)
                return op_fail(op, -EBUSY, "tensor '%s' of job '%s': its %s copy is reserved for a write-only pin "
                               "(TIER_WRITE) of rank %" PRIu32 " that has not written it yet, and holds none of "
                               "its data until that pin's unpin; pin again then", t->name, t->job->name,
                               level_to_string(tier), c->writer_rank);
        if (c->writers > 0 || ((t->ghost >> tier) & 1))
                return op_fail(op, -EBUSY, "tensor '%s' of job '%s': its %s copy is older than the tensor "
                               "(written in another tier since) and still pinned by a connection%s: it is brought "
                               "up to date after that pin goes; pin again then", t->name, t->job->name,
                               level_to_string(tier), c->writers > 0 ? "" : " of before tierd restarted, which "
                               "may still write into it (until each rank that held it attaches again)");
        copy_set_state(t, tier, COPY_FILLING);
        tensor_note(t);
        return 0;
}

/*
 * ensure_chained() - @t is wanted in VRAM and its only valid copy is on
 * NVMe: reserve host (and, @staging_first, VRAM after it: a scheduler's
 * prefetch takes VRAM only once host has room) and start a chained transfer
 * that reads NVMe into host and copies each piece on to VRAM as it arrives
 * (xfer.c).  A prefetch that finds no VRAM room yet stages into host alone,
 * as it always did, and tries VRAM again once that is done.  ADV_WAIT_*, or
 * -errno.
 */
static int ensure_chained(Op *op, Tensor *t, bool staging_first) {
        Copy *h = &t->copy[LEVEL_HOST];
        bool reserved = false;
        int r;

        r = refill_stale(op, t, LEVEL_HOST);
        if (r < 0)
                return r;
        if (h->state == COPY_ABSENT) {
                r = copy_reserve(op, t, LEVEL_HOST);
                if (r != 0)
                        return r;       /* a prefetch gives up holding nothing */
                reserved = true;
        }
        if (staging_first && t->copy[LEVEL_VRAM].state == COPY_ABSENT &&
            copy_reserve(op, t, LEVEL_VRAM) != 0)
                r = xfer_start(op, t, LEVEL_NVME, LEVEL_HOST);    /* VRAM is tried again once host holds it */
        else
                r = xfer_start_chain(op, t);
        if (r < 0) {
                if (reserved)
                        copy_free(t, LEVEL_HOST);        /* nothing will fill it */
                return r;
        }
        return ADV_WAIT_TENSOR;
}

/* Make @tier hold a valid copy of @t.  ADV_DONE, ADV_WAIT_*, or -errno. */
static int ensure_copy(Op *op, Tensor *t, int tier) {
        Copy *c = &t->copy[tier];
        int r, src;

        if (copy_valid(t, tier))
                return ADV_DONE;
        if (t->xfer)
                return ADV_WAIT_TENSOR;
        /*
         * Its newest version is a write-only pin's of before tierd restarted (memstore.c), which its
         * rank's next Hello keeps or takes back (job_release_ghosts()): until then no copy holds bytes
         * known to be the tensor's, and the copy of the version before must stay as it is.  Only a
         * whole write goes (it takes such a copy over, copy_writers()); the rest waits for that Hello
         * (a plan's hold is retried then: the ghost's unpin).
         */
        if (t->ghost_unwritten && !(op->discard && op->tensor == t && op->tier == tier))
                return op_fail(op, -EBUSY, "tensor '%s' of job '%s' was being written whole by a write-only pin "
                               "(TIER_WRITE) of rank %" PRIu32 " when tierd stopped: whether that pin wrote it is "
                               "known once a client of rank %" PRIu32 " attaches again; pin again then", t->name,
                               t->job->name, t->ghost_rank, t->ghost_rank);
        if (t->ghost_unwritten & (1u << tier))
                return ADV_DONE;        /* that copy is this whole write's now (copy_writers()) */
        if (tier == LEVEL_NVME && (t->version == 0 || t->dead))
                return ADV_DONE;        /* zeros, or bytes about to be overwritten, need no image */
        /*
         * Dead because a plan overwrites it next (its bytes dropped after their last read): only
         * that write (a pin that brings nothing) gets room, and a read gets no zeros for its data,
         * unless it joins a copy reserved for a write in progress (a phase after that write), or
         * is that plan's own (its client went to a phase past the write: tier.torch's optimizer
         * phase of a block its backward did not reach this step, which ignores the bytes).  After
         * a restart likewise (the memory store keeps the rank); dead and lost with no rank (a
         * table of before the rank was kept) is no plan's: no read.
         */
        if (t->dead && (t->dead_rank || t->lost) && tensor_is_blank(t) &&
            !(op->discard && op->tensor == t && op->tier == tier) &&
            !(c->state != COPY_ABSENT && c->unwritten && c->writers > 0) &&
            (!t->dead_rank || op->plan_rank1 != t->dead_rank)) {
                if (op->kind == OP_PREFETCH)
                        return ADV_DONE;        /* nothing to bring */
                if (!t->dead_rank)
                        return op_fail(op, -ENODATA, "tensor '%s' of job '%s' holds no data: it was dead when "
                                       "tierd stopped (a plan overwrites it whole next, so its bytes were dropped); "
                                       "write it whole (a TIER_WRITE pin)", t->name, t->job->name);
                if (t->plan_refs == 0)  /* (ended, or not submitted again since a restart) */
                        return op_fail(op, -ENODATA, "tensor '%s' of job '%s' holds no data: the plan of rank %"
                                       PRIu32 " overwrites it whole next (that plan is not running now: it ended, "
                                       "or was not submitted again since tierd restarted), so its bytes were "
                                       "dropped after their last read (or after the phase that wrote them, where "
                                       "the plan never reads it); write it whole (a TIER_WRITE pin)", t->name,
                                       t->job->name, t->dead_rank - 1);
                return op_fail(op, -ENODATA, "tensor '%s' of job '%s' holds no data: the plan of rank %" PRIu32
                               " overwrites it whole next, so its bytes were dropped after their last read; "
                               "read it after that write, or write it whole (a TIER_WRITE pin)", t->name,
                               t->job->name, t->dead_rank - 1);
        }

        r = refill_stale(op, t, tier);
        if (r < 0)
                return r;
        /*
         * A scheduler prefetch into VRAM stages the host copy before it takes
         * VRAM: when staging finds no room it gives up holding nothing.
         */
        if (tier == LEVEL_VRAM && op->no_wait && c->state == COPY_ABSENT && !op->discard &&
            !tensor_is_blank(t)) {
                if (!copy_valid(t, LEVEL_HOST) && copy_valid(t, LEVEL_NVME))
                        return ensure_chained(op, t, true);
                r = ensure_copy(op, t, LEVEL_HOST);
                if (r != ADV_DONE)
                        return r;
        }
        if (c->state == COPY_ABSENT) {
                r = copy_reserve(op, t, tier);
                if (r != 0)
                        return r;
        }

        /*
         * The phase overwrites the whole tensor: the old bytes need not be brought, unless they
         * are the version its job committed, of which the write makes an image first: this copy
         * is that image's source then (ensure_copy(LEVEL_NVME) above, from OP_PIN)
         */
        if (op->discard && tier != LEVEL_NVME && op->tensor == t && op->tier == tier &&
            !(op->write && tensor_needs_image(t))) {
                copy_set_state(t, tier, COPY_RESIDENT);
                c->version = t->version;
                c->unwritten = true;    /* not the tensor's bytes until its writer wrote them */
                return ADV_DONE;
        }

        /* c is reserved (FILLING); find a source */
        if (tensor_is_blank(t)) {
                if (tier == LEVEL_NVME)
                        return ADV_DONE;
                return zero_fill(op, t, tier);
        }
        if (t->lost)
                return op_fail(op, -ENODATA, "tensor '%s' of job '%s' is lost: %s; write it whole (a TIER_WRITE "
                               "pin) or destroy it", t->name, t->job->name, tensor_lost_reason(t));

        switch (tier) {
        case LEVEL_VRAM:
                if (!copy_valid(t, LEVEL_HOST) && copy_valid(t, LEVEL_NVME))
                        return ensure_chained(op, t, false);
                _fallthrough_;
        case LEVEL_NVME:
                /* both come from host: the VRAM copy over PCIe, the NVMe image by O_DIRECT writes */
                r = ensure_copy(op, t, LEVEL_HOST);
                if (r != ADV_DONE)
                        return r;
                src = LEVEL_HOST;
                break;
        case LEVEL_HOST:
                if (copy_valid(t, LEVEL_VRAM))
                        src = LEVEL_VRAM;
                else if (copy_valid(t, LEVEL_NVME))
                        src = LEVEL_NVME;
                else
                        return op_fail(op, -EIO, "tensor '%s' has no valid copy (internal error)", t->name);
                break;
        default:
                return -EINVAL;
        }
        r = xfer_start(op, t, src, tier);
        if (r < 0)
                return r;
        return ADV_WAIT_TENSOR;
}

static int advance_evict(Op *op, Tensor *t, int tier) {
        bool below = t->version == 0 || t->dead;
        int r;

        for (int i = 0; i < tier; i++)
                if (t->copy[i].pins > 0)
                        return op_fail(op, -EBUSY, "tensor '%s' is pinned in %s", t->name, level_to_string(i));
        if (t->xfer)
                return ADV_WAIT_TENSOR;

        /* is there already a valid copy at or below @tier? */
        for (int i = tier; i < TIERS; i++)
                if (copy_valid(t, i))
                        below = true;
        if (!below) {
                r = ensure_copy(op, t, tier);
                if (r != ADV_DONE)
                        return r;
        }
        for (int i = 0; i < tier; i++)
                copy_free(t, i);
        return ADV_DONE;
}

static int advance_drain(Op *op, Tensor *t, int tier) {
        Copy *c = &t->copy[tier];
        int r;

        if (c->state != COPY_DRAINING)
                return ADV_DONE;        /* pinned again meanwhile: keep it */
        if (copy_is_sole(t, tier)) {
                r = ensure_copy(op, t, tier + 1);
                if (r != ADV_DONE)
                        return r;
        }
        if (c->state == COPY_DRAINING && c->pins == 0)
                copy_free(t, tier);
        return ADV_DONE;
}

static int advance_clean(Op *op, Tensor *t, int tier) {
        if (!copy_is_sole(t, tier) || t->copy[tier].pins > 0)
                return ADV_DONE;
        return ensure_copy(op, t, tier + 1);
}

static int op_advance(Op *op) {
        Tensor *t = op->tensor;
        int r;

        if (op->failed < 0)             /* a transfer we waited for failed */
                return op->failed;

        switch (op->kind) {
        case OP_PIN:
                /* a copy with its room already, or one refused wherever its room were made (a reservation
                 * is checked in copy_reserve()) */
                if (!op->pinned) {
                        r = pin_kept(op, t, op->tier, false);
                        if (r < 0)
                                return r;
                }
                if (op->write && tensor_needs_image(t)) {
                        /* its committed data lies in memory only: to NVMe first, so that a rollback finds it */
                        r = ensure_copy(op, t, LEVEL_NVME);
                        if (r != ADV_DONE)
                                return r;
                }
                if (t->copy[op->tier].state == COPY_DRAINING)
                        copy_set_state(t, op->tier, COPY_RESIDENT);        /* cancel the drain */
                r = ensure_copy(op, t, op->tier);
                /*
                 * A pin that may write waits while a transfer of the tensor runs, as the fast path
                 * (rpc.c) and the scheduler's holds do: the transfer reads a copy of the version the
                 * pinner would replace (a write-down's O_DIRECT writes and crc32c read the host copy)
                 * and records that version when it ends.  Reads share it.
                 */
                if (r == ADV_DONE && op->write && t->xfer)
                        return ADV_WAIT_TENSOR;
                if (r > 0 && op->reserved && !op->reserved_sent && t->copy[op->tier].state == COPY_FILLING) {
                        /* async pin: the destination is known, the client may go on */
                        t->copy[op->tier].pins++;
                        op->pinned = true;
                        op->reserved_sent = true;
                        op->reserved(op);
                }
                return r;
        case OP_PREFETCH:
                return ensure_copy(op, t, op->tier);
        case OP_EVICT:
                return advance_evict(op, t, op->tier);
        case OP_DRAIN:
                return advance_drain(op, t, op->tier);
        case OP_CLEAN:
                return advance_clean(op, t, op->tier);
        default:
                return -EINVAL;
        }
}

/* ---- op lifecycle ------------------------------------------------------------------------ */

static void op_free(Op *op) {
        Tensor *t = op->tensor;

        list_del(&op->wait_link);
        list_del(&op->all_link);
        t->op_refs--;
        /* a reservation nobody will fill any more (whatever the op's kind) */
        if (op->tier >= 0 && t->copy[op->tier].state == COPY_FILLING && !t->xfer && t->copy[op->tier].pins == 0)
                copy_free(t, op->tier);
        free(op);
}

static void op_end(Op *op, int r) {
        Tensor *t = op->tensor;

        if (op->kind == OP_PIN && op->tier >= 0) {
                Copy *c = &t->copy[op->tier];

                if (r >= 0) {
                        if (!op->pinned)
                                c->pins++;
                        op->pinned = true;
                        copy_touch(t, op->tier);
                } else if (op->pinned) {
                        c->pins--;
                        op->pinned = false;
                }
        }
        /*
         * A failed op's reservation nobody will fill goes before the op reports:
         * what its owner concludes ("no space now") then holds for the space as it
         * is after, and freeing the reservation does not look like space appearing
         * later (which would retry the same op at once, forever).
         */
        if (r < 0 && op->tier >= 0 && t->copy[op->tier].state == COPY_FILLING && !t->xfer &&
            t->copy[op->tier].pins == 0)
                copy_free(t, op->tier);
        else if (r < 0 && !t->xfer)
                tensor_free_stale(t);   /* (a copy a failed transfer left to its op's pin) */
        if (op->complete)
                op->complete(op, r, r < 0 ? op->error : NULL);
        op_free(op);
}

/*
 * A drain (or write-behind) that failed keeps its copy: it stays resident (and sole), and the
 * failure is logged.  The copy is not chosen for a drain again until room
 * appears below: the ops waiting for space then fail instead of draining it
 * over and over.
 */
static void drain_failed(Op *op, int r) {
        Engine *e = op->engine;
        Copy *c = &op->tensor->copy[op->tier];

        /* (op->failed: a transfer's error, else its reservation's: blocked.c) */
        engine_drain_failed(e, op->tensor, op->tier, r, op->failed == 0);
        if (op->tier + 1 < TIERS)
                (void) snprintf(e->drain_error[op->tier], sizeof(e->drain_error[op->tier]), "%s", op->error);

        log_tensor(LOG_WARNING, 0, op->tensor->job->name, op->tensor->name, level_to_string(op->tier),
                   "Cannot write tensor '%s' of job '%s' down from %s: %s",
                   op->tensor->name, op->tensor->job->name, level_to_string(op->tier), op->error);
        if (c->state == COPY_DRAINING)
                copy_set_state(op->tensor, op->tier, COPY_RESIDENT);
}

static void engine_run_queue(Engine *e) {
        while (!list_empty(&e->run_queue)) {
                Op *op = list_entry(e->run_queue.next, Op, wait_link);
                int r;

                list_del(&op->wait_link);
                op->wait = OP_WAIT_NONE;
                r = op_advance(op);
                if (r == ADV_WAIT_TENSOR) {
                        list_add_tail(&op->tensor->waiters, &op->wait_link);
                        op->wait = OP_WAIT_TENSOR;
                        continue;
                }
                if (r == ADV_WAIT_SPACE) {
                        list_add_tail(&e->space_waiters, &op->wait_link);
                        op->wait = OP_WAIT_SPACE;
                        continue;
                }
                if (op->kind == OP_DRAIN)
                        wake_space_waiters(e);  /* success or not, let them re-check */
                if (r < 0 && op->error[0] == 0)
                        snprintf(op->error, sizeof(op->error), "%s", strerror(-r));
                /* a write-behind that failed for want of room, or for a stale pin, is no failed write */
                if (r < 0 && (op->kind == OP_DRAIN ||
                              (op->kind == OP_CLEAN && r != -EAGAIN && r != -ENOSPC && r != -EBUSY)))
                        drain_failed(op, r);
                op_end(op, r < 0 ? r : 0);
        }
}

void engine_run(Engine *e) {
        e->runs++;
        engine_run_queue(e);
        /* the scheduler looks at the new state and may queue more */
        if (e->sched && e->sched->pass) {
                e->sched->pass(e->sched_userdata);
                engine_run_queue(e);
        }
}

void engine_xfer_ended(Engine *e, Tensor *t, List *waiters, int error, const char *errmsg) {
        list_for_each_safe(n, tmp, waiters) {
                Op *op = list_entry(n, Op, wait_link);

                list_del(&op->wait_link);
                if (error < 0) {
                        /* it completes through the run queue with the error recorded */
                        snprintf(op->error, sizeof(op->error), "%s", errmsg);
                        op->failed = error;
                }
                list_add_tail(&e->run_queue, &op->wait_link);
                op->wait = OP_WAIT_RUN;
        }
        if (t->doomed) {
                tensor_release_copies(t);       /* frees it */
                return;
        }
        tensor_free_stale(t);
        wake_space_waiters(e);  /* its copies may go now (make_space() passes over copies in a transfer) */
        sched_changed(e);
        engine_kick(e);
}

int op_submit(Engine *e, OpKind kind, Tensor *t, int tier,
              void (*complete)(Op *, int, const char *), void (*reserved)(Op *), void *userdata, Op **ret) {
        Op *op;

        op = calloc(1, sizeof(*op));
        if (!op)
                return -ENOMEM;
        *op = (Op) {
                .engine = e,
                .kind = kind,
                .tensor = t,
                .tier = tier,
                .complete = complete,
                .reserved = reserved,
                .userdata = userdata,
                .wait = OP_WAIT_RUN,
                .internal = kind == OP_DRAIN || kind == OP_CLEAN,
        };
        t->op_refs++;
        list_add_tail(&e->ops, &op->all_link);
        list_add_tail(&e->run_queue, &op->wait_link);
        engine_kick(e);
        if (ret)
                *ret = op;
        return 0;
}

void op_cancel(Op *op) {
        if (op->cancelled)
                op->cancelled(op);
        if (op->kind == OP_PIN && op->pinned && op->tier >= 0) {
                op->tensor->copy[op->tier].pins--;
                op->pinned = false;
        }
        op->complete = NULL;
        op_free(op);
}

void engine_cancel_job(Engine *e, Job *j) {
        list_for_each_safe(n, tmp, &e->ops) {
                Op *op = list_entry(n, Op, all_link);

                if (op->tensor->job != j)
                        continue;
                if (op->kind == OP_DRAIN && op->tensor->copy[op->tier].state == COPY_DRAINING)
                        copy_set_state(op->tensor, op->tier, COPY_RESIDENT);
                op_cancel(op);
        }
}

/* Cancel tierd's own ops on @t, or (@t NULL) on every tensor of @j; a transfer one started runs to its end. */
static unsigned cancel_internal(Engine *e, const Tensor *t, const Job *j) {
        unsigned n_cancelled = 0;

        list_for_each_safe(n, tmp, &e->ops) {
                Op *op = list_entry(n, Op, all_link);
                Tensor *v = op->tensor;

                if (!op->internal || (t ? v != t : v->job != j))
                        continue;
                if (op->kind == OP_DRAIN && v->copy[op->tier].state == COPY_DRAINING)
                        copy_set_state(v, op->tier, COPY_RESIDENT);
                op_cancel(op);
                n_cancelled++;
        }
        return n_cancelled;
}

int engine_tensor_free(Engine *e, Tensor *t) {
        /* tierd's own work on it: its bytes are not wanted any more */
        (void) cancel_internal(e, t, NULL);
        return tensor_free(t);
}

void engine_cancel_internal(Engine *e, Job *j) {
        if (cancel_internal(e, NULL, j) == 0)
                return;         /* (a waiting rollback asks every few ms: nothing new, nothing to wake) */
        wake_space_waiters(e);  /* an op that waited for a drain cancelled here looks again */
        engine_kick(e);
}

int engine_rollback(Engine *e, Job *j, unsigned *ret_rolled, unsigned *ret_lost, char *why, size_t why_size) {
        const Tensor *busy = NULL;
        int r;

        list_for_each_safe(n, tmp, &e->ops) {
                const Op *op = list_entry(n, Op, all_link);

                if (!op->internal && op->tensor->job == j) {
                        busy = op->tensor;      /* a client's request */
                        break;
                }
        }
        r = job_rollback_refused(j, busy, why, why_size);
        if (r < 0)
                return r;
        engine_cancel_internal(e, j);
        return job_rollback(j, ret_rolled, ret_lost, why, why_size);
}

/* ---- the engine ----------------------------------------------------------------------------- */

static int on_run(sd_event_source *s, void *userdata) {
        engine_run(userdata);
        return 0;
}

void engine_kick(Engine *e) {
        if (e->run_source)
                (void) sd_event_source_set_enabled(e->run_source, SD_EVENT_ONESHOT);
}

static void on_job_ending(void *userdata, Job *j) {
        engine_cancel_job(userdata, j);
}

static void on_space_freed(void *userdata, int tier) {
        Engine *e = userdata;

        if (tier >= 0 && tier < TIERS)
                e->space_gen[tier]++;
        wake_space_waiters(e);
        sched_changed(e);       /* space the scheduler may have been waiting for */
}

static void on_unpinned(void *userdata, int tier) {
        Engine *e = userdata;

        /* room there can be made now (the copy may be written down): write-downs blocked for it retry */
        if (tier >= 0 && tier < TIERS)
                e->space_gen[tier]++;
        wake_space_waiters(e);
        sched_changed(e);       /* the scheduler's pins blocked for room retry */
}

static const RegistryOps engine_registry_ops = {
        .job_ending = on_job_ending,
        .space_freed = on_space_freed,
        .unpinned = on_unpinned,
};

int engine_new(sd_event *event, Registry *registry, Uring *uring, NvmeTier *nvme, VramBackend *vram, Engine **ret) {
        Engine *e;
        int r;

        e = calloc(1, sizeof(*e));
        if (!e)
                return -ENOMEM;
        e->event = sd_event_ref(event);
        e->registry = registry;
        e->uring = uring;
        e->nvme = nvme;
        e->vram = vram;
        list_init(&e->ops);
        list_init(&e->xfers);
        list_init(&e->run_queue);
        list_init(&e->space_waiters);
        for (int d = 0; d < 2; d++)
                list_init(&e->vlink.waiting[d]);

        r = sd_event_add_defer(event, &e->run_source, on_run, e);
        if (r < 0) {
                engine_free(e);
                return r;
        }
        (void) sd_event_source_set_enabled(e->run_source, SD_EVENT_OFF);
        (void) sd_event_source_set_description(e->run_source, "op-engine");
        registry_set_ops(registry, &engine_registry_ops, e);
        book_set_durable_cb(registry->book, engine_book_durable, e);
        *ret = e;
        return 0;
}

void engine_set_sched(Engine *e, const EngineSchedOps *ops, void *userdata) {
        e->sched = ops;
        e->sched_userdata = userdata;
}

Engine *engine_free(Engine *e) {
        if (!e)
                return NULL;
        /* nothing of the registry's, nor of the NVMe index, reaches a freed engine */
        registry_set_ops(e->registry, NULL, NULL);
        book_set_durable_cb(e->registry->book, NULL, NULL);
        list_for_each_safe(n, tmp, &e->ops)
                op_cancel(list_entry(n, Op, all_link));
        if (e->n_xfers > 0)
                log_warning("Abandoning %u transfer(s) still in flight at exit", e->n_xfers);
        xfer_abandon_all(e);
        trace_reset(&e->trace);
        sd_event_source_disable_unref(e->run_source);
        sd_event_unref(e->event);
        free(e);
        return NULL;
}
