/* SPDX-License-Identifier: MIT */
/* victim.c: which copies go first when room is made (Belady by the plans' next uses), and what a plan overwrites next. */

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/engine/engine.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "util/time-util.h"

bool sched_next_access_overwrites(Tensor *t) {
        Plan *p = t->plan;

        /* only what one plan alone names: another plan may read it meanwhile */
        if (!p || p->sched->config->sched_policy != SCHED_POLICY_TIMELINE || p->cur == UINT32_MAX || t->plan_refs != 1)
                return false;
        /*
         * The current phase's accesses are pinned once granted, so what counts
         * is the first phase after it; but a read not pinned yet is still to
         * come, and needs the bytes.
         */
        if (plan_cur_read_pending(p, t, USE_ANY))
                return false;
        /* the first phase after the current one that touches it, in any tier */
        return plan_next_access_mode(p, t, p->cur, false) == PLAN_WRITE;
}

bool sched_drops_dead(Tensor *t) {
        if (!sched_next_access_overwrites(t))
                return false;
        /* not the version its job committed: a rollback keeps it as it finds it (plan_drop_dead()) */
        if (t->job->committing && !t->commit_dead && t->version == t->commit_version)
                return false;
        t->dead_rank = t->plan->rank + 1;       /* a read of it now fails, not zeros (op.c) */
        return true;
}

uint64_t sched_next_use_ns(Tensor *t, int tier) {
        uint64_t nu;

        if (!t->plan || t->plan->sched->config->sched_policy != SCHED_POLICY_TIMELINE)
                return 0;
        nu = plan_next_use(t->plan, t, tier > LEVEL_HOST ? LEVEL_HOST : tier);
        return nu == UINT64_MAX ? 0 : nu;
}

/* ---- victims ---------------------------------------------------------------------------------- */

typedef struct Victim {
        Tensor *t;
        double score;           /* time to the next use / cost of dropping: higher goes first */
        uint64_t last_use;
        size_t idx;             /* among the victims, in the candidates' order: ties keep it */
} Victim;

/* Best victim first: the highest score, then the least recently used, then the candidates' order. */
static int victim_cmp(const Victim *x, const Victim *y, Sched *s) {
        s->victim_cmps++;
        if (x->score != y->score)
                return x->score > y->score ? -1 : 1;
        if (x->last_use != y->last_use)
                return x->last_use < y->last_use ? -1 : 1;
        return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int victim_qcmp(const void *a, const void *b, void *s) {
        return victim_cmp(a, b, s);
}

/*
 * When @t's copy in @tier is next needed.  A host copy of a tensor that is
 * valid in vram is needed only by the next host access: the vram accesses
 * before it are served from vram, so such copies go first (for free: they
 * are not the sole copy).  A tensor whose plan overwrites it next is never
 * needed again.
 */
static uint64_t victim_next_use(Tensor *t, int tier) {
        if (!t->plan)
                return UINT64_MAX;
        if (sched_next_access_overwrites(t))
                return UINT64_MAX;
        if (tier == LEVEL_HOST && copy_valid(t, LEVEL_VRAM))
                return plan_next_use_class(t->plan, t, USE_HOST);
        return plan_next_use(t->plan, t, tier);
}

uint64_t sched_victim_next_use(Tensor *t, int tier) {
        return victim_next_use(t, tier);
}

/*
 * The victims of @cands, in place: those needed later than @deadline_ns
 * (0: all) to the front, in their order, the others behind them.  For when
 * there is no memory to rank them: still only what may go, least recently
 * used first.
 */
static size_t victim_filter_tier(Tensor **cands, size_t n, int tier, uint64_t deadline_ns) {
        size_t k = 0;

        if (deadline_ns == 0)
                return n;
        for (size_t i = 0; i < n; i++)
                if (victim_next_use(cands[i], tier) > deadline_ns) {
                        Tensor *t = cands[k];

                        cands[k++] = cands[i];
                        cands[i] = t;
                }
        return k;
}

size_t sched_ops_victim_order(void *userdata, int tier, Tensor **cands, size_t n, uint64_t deadline_ns) {
        return sched_victim_order(userdata, tier, cands, n, deadline_ns);
}

/* Under lru and ondemand sched_victim_order() keeps the candidates' order (least recently used first). */
bool sched_ops_victims_lru(void *userdata, int tier) {
        const Sched *s = userdata;

        return s->config->sched_policy != SCHED_POLICY_TIMELINE;
}

/*
 * Scores the victims of @cands into @v (k of them, in the candidates' order) and moves
 * the others, needed no later than @deadline_ns (0: none is), to cands[k..n).
 */
static size_t victims_score(int tier, Tensor **cands, size_t n, uint64_t deadline_ns, Victim *v) {
        size_t k = 0, w = 0;
        uint64_t now = now_ns();

        for (size_t i = 0; i < n; i++) {
                Tensor *t = cands[i];
                uint64_t nu = victim_next_use(t, tier);
                double score;

                if (deadline_ns > 0 && nu <= deadline_ns) {
                        cands[w++] = t;         /* needed before the requester: kept (w <= i: read already) */
                        continue;
                }
                /*
                 * Belady's farthest next use, weighed by what dropping costs: a sole
                 * copy is written down and read back (two transfers), another only
                 * read back (one), so a clean copy goes before a dirty one needed
                 * up to twice as late.
                 */
                score = nu == UINT64_MAX ? INFINITY : (double) (nu > now ? nu - now : 0);
                if (copy_is_sole(t, tier))
                        score /= 2;
                v[k] = (Victim) { t, score, t->copy[tier].last_use, k };
                k++;
        }
        /* the kept ones behind the victims */
        memmove(cands + k, cands, w * sizeof(*cands));
        return k;
}

/* EngineSchedOps.victim_order's contract (daemon/engine/engine.h): cands[0..k) may go, best first; cands[k..n) stay. */
size_t sched_victim_order(Sched *s, int tier, Tensor **cands, size_t n, uint64_t deadline_ns) {
        _cleanup_free_ Victim *v = NULL;
        size_t k;

        if (s->config->sched_policy != SCHED_POLICY_TIMELINE || n == 0)
                return n;       /* already least recently used first */
        v = calloc(n, sizeof(*v));
        if (!v)
                return victim_filter_tier(cands, n, tier, deadline_ns);
        k = victims_score(tier, cands, n, deadline_ns, v);
        qsort_r(v, k, sizeof(*v), victim_qcmp, s);
        for (size_t i = 0; i < k; i++)
                cands[i] = v[i].t;
        return k;
}

bool sched_may_clean(Sched *s, Tensor *t, int tier) {
        return copy_is_sole(t, tier) && !t->sched_op && t->sched_blocked != s->epoch &&
               t->sched_cleaned[tier] != t->version && !engine_drain_blocked(s->engine, t, tier) &&
               !sched_next_access_overwrites(t);
}

size_t sched_clean_order(Sched *s, int tier, Tensor **cands, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (sched_may_clean(s, cands[i], tier))
                        return sched_victim_order(s, tier, cands, n, 0);
        return 0;       /* none it could write: the order would be for nothing */
}

/* The heap of @v[0..n) (the best victim at the root) with @v[i] put in its place below. */
static void victim_sift(Sched *s, Victim *v, size_t n, size_t i) {
        for (;;) {
                size_t best = i, l = 2 * i + 1, r = l + 1;
                Victim x;

                if (l < n && victim_cmp(&v[l], &v[best], s) < 0)
                        best = l;
                if (r < n && victim_cmp(&v[r], &v[best], s) < 0)
                        best = r;
                if (best == i)
                        return;
                x = v[i];
                v[i] = v[best];
                v[best] = x;
                i = best;
        }
}

/*
 * EngineSchedOps.victim_take: the victims of sched_victim_order(), in its order,
 * handed to @take until it has enough.  A heap (built in linear time, each victim
 * taken in logarithmic time) instead of the whole order: a choice that takes a
 * few of many copies sorts none of them.
 */
int sched_victim_take(Sched *s, int tier, Tensor **cands, size_t n, uint64_t deadline_ns,
                      int (*take)(void *ctx, Tensor *t), void *ctx) {
        _cleanup_free_ Victim *v = NULL;
        size_t k;
        int r;

        if (s->config->sched_policy == SCHED_POLICY_TIMELINE && n > 0)
                v = calloc(n, sizeof(*v));
        if (!v) {
                /* not ranked (lru, ondemand; or short of memory): in the order given */
                k = sched_victim_order(s, tier, cands, n, deadline_ns);
                for (size_t i = 0; i < k; i++)
                        if ((r = take(ctx, cands[i])) != 0)
                                return MIN(r, 0);
                return 0;
        }
        k = victims_score(tier, cands, n, deadline_ns, v);
        for (size_t i = k / 2; i-- > 0;)
                victim_sift(s, v, k, i);
        while (k > 0) {
                Tensor *t = v[0].t;

                v[0] = v[--k];
                victim_sift(s, v, k, 0);
                if ((r = take(ctx, t)) != 0)
                        return MIN(r, 0);
        }
        return 0;
}

int sched_ops_victim_take(void *userdata, int tier, Tensor **cands, size_t n, uint64_t deadline_ns,
                          int (*take)(void *ctx, Tensor *t), void *ctx) {
        return sched_victim_take(userdata, tier, cands, n, deadline_ns, take, ctx);
}
