/* SPDX-License-Identifier: MIT */
/* victims.c: making room among a job's own copies (make_space), and the candidate victims. */

/*
 * Theory of operation.
 *
 * A reservation that finds its job at its limit makes room among the job's
 * own unpinned copies in the tier, in the scheduler's victim order
 * (EngineSchedOps.victim_order).  Each job keeps its copies per tier in
 * least recently used order (Job.lru, Copy.job_lru: Registry.lru's order
 * restricted to the job), and the bytes of its copies being drained
 * (Job.draining, kept by copy_set_state()), so a choice looks at no other
 * job's copies and counts the room coming without a walk.
 *
 * Under lru and ondemand the order is the list's (EngineSchedOps.victims_lru):
 * make_space() walks it from the least recently used copy and stops once the
 * room is there, so an eviction storm costs each reservation the victims it
 * takes (and the pinned or busy copies before them), not every copy of the
 * job: walking them all, twice, for each choice was quadratic work (40960
 * copies: milliseconds per choice).  Under timeline every candidate is scored
 * by its predicted next use, which moves with every phase: that scoring stays
 * linear in the job's copies, but only the victims taken are ordered
 * (EngineSchedOps.victim_take: a heap, not a sort of every copy).  The copies
 * still in a transfer (room that comes by itself) are counted only when
 * nothing could be freed or drained.
 */

#include <errno.h>
#include <stdlib.h>

#include "daemon/engine/engine-private.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"

int engine_victims(Engine *e, const Job *j, int tier, const Tensor *except, Tensor ***ret, size_t *ret_n) {
        _cleanup_free_ Tensor **cands = NULL;
        size_t n = 0;

        cands = calloc(j->n_tensors + 1, sizeof(Tensor *));
        if (!cands)
                return -ENOMEM;
        list_for_each_safe(node, tmp, (List *) &j->lru[tier]) {
                Tensor *v = container_of(list_entry(node, Copy, job_lru), Tensor, copy[tier]);

                e->victim_steps++;
                if (v != except && copy_evictable(v, tier) && n < j->n_tensors)
                        cands[n++] = v;
        }
        *ret = TAKE_PTR(cands);
        *ret_n = n;
        return 0;
}

/* Room that comes by itself: @j's copies in @tier in a transfer (which ends on its own), or a frozen job's. */
static uint64_t room_moving(Engine *e, Job *j, Tensor *want, int tier) {
        uint64_t moving = 0;

        list_for_each_safe(node, tmp, &j->lru[tier]) {
                Copy *c = list_entry(node, Copy, job_lru);
                Tensor *v = container_of(c, Tensor, copy[tier]);

                e->victim_steps++;
                if (c->state != COPY_DRAINING && v != want && (v->xfer || j->frozen) && c->pins == 0)
                        moving += v->alloc_size;        /* (a frozen job's: once its rollback's wait ends) */
        }
        return moving;
}

/* Under lru and ondemand: the job's copies least recently used first, until @need is freed or coming. */
static int evict_lru(Engine *e, Job *j, Tensor *want, int tier, uint64_t need, uint64_t *freed,
                     uint64_t *draining, unsigned *blocked) {
        list_for_each_safe(node, tmp, &j->lru[tier]) {
                Tensor *v = container_of(list_entry(node, Copy, job_lru), Tensor, copy[tier]);
                int r;

                if (*freed + *draining >= need)
                        break;
                e->victim_steps++;
                if (v == want || !copy_evictable(v, tier))
                        continue;
                r = victim_evict(e, v, tier, 0, freed, draining, blocked);
                if (r < 0)
                        return r;
        }
        return 0;
}

typedef struct Taking {
        Engine *e;
        int tier;
        uint64_t need, freed, draining;
        unsigned *blocked;
} Taking;

/* EngineSchedOps.victim_take's @take: evicts @v; 1 once the room is freed or coming. */
static int take_victim(void *ctx, Tensor *v) {
        Taking *g = ctx;
        int r;

        r = victim_evict(g->e, v, g->tier, 0, &g->freed, &g->draining, g->blocked);
        if (r < 0)
                return r;
        return g->freed + g->draining >= g->need;
}

int engine_make_space(Engine *e, Op *op, Tensor *want, int tier, uint64_t need, unsigned *blocked) {
        Job *j = want->job;
        /* room that comes by itself: copies being drained */
        uint64_t freed = 0, draining = tier == LEVEL_NVME ? 0 : j->draining[tier];
        _cleanup_free_ Tensor **cands = NULL;
        size_t n = 0, k;
        int r;

        if (e->sched && e->sched->victims_lru && e->sched->victims_lru(e->sched_userdata, tier)) {
                r = evict_lru(e, j, want, tier, need, &freed, &draining, blocked);
                if (r < 0)
                        return r;
        } else if (freed + draining < need) {
                r = engine_victims(e, j, tier, want, &cands, &n);
                if (r < 0)
                        return r;
                if (e->sched && e->sched->victim_take) {
                        /* in the policy's order (Belady by next use), ordering only those taken */
                        Taking g = { e, tier, need, freed, draining, blocked };

                        r = e->sched->victim_take(e->sched_userdata, tier, cands, n, op->deadline_ns,
                                                  take_victim, &g);
                        if (r < 0)
                                return r;
                        freed = g.freed;
                        draining = g.draining;
                } else {
                        /* the policy orders them (Belady by next use) */
                        k = e->sched && e->sched->victim_order ?
                                e->sched->victim_order(e->sched_userdata, tier, cands, n, op->deadline_ns) : n;
                        for (size_t i = 0; i < k && freed + draining < need; i++) {
                                r = victim_evict(e, cands[i], tier, 0, &freed, &draining, blocked);
                                if (r < 0)
                                        return r;
                        }
                }
        }
        if (freed > 0)
                return ADV_RETRY;
        if (draining > 0)
                return ADV_WAIT_SPACE;
        if (op->no_wait)
                return -EAGAIN;
        /*
         * copies in a transfer may go once it ends (engine_xfer_ended() wakes the waiters), a
         * frozen job's once it thaws (ipc/commit.c wakes them)
         */
        return room_moving(e, j, want, tier) > 0 ? ADV_WAIT_SPACE : -ENOSPC;
}
