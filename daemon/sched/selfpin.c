/* SPDX-License-Identifier: MIT */
/* selfpin.c: a phase whose room the pins of its own connection hold: refused, not waited for. */

/*
 * Theory of operation.
 *
 * A plan's pin that finds no room waits (blocked) for room that others
 * release: copies the job's other ranks or other jobs pin, drains, the next
 * phase's hold (hold_yield()).  Its client waits meanwhile in
 * tier_phase_enter(), which sends nothing: its connection's own pins, those
 * outside the plan (tier_pin()), stay as long as it waits.  When the phase
 * can never be pinned beside them, the wait can never end; an ordinary pin
 * in that place fails -ENOSPC at once, and so does the phase then: its
 * marker is refused (the client's tier_phase_enter() fails, the pins in the
 * way named), and the hold's pins go (sched.c's pass, plan_refuse()).  The
 * plan lives on, so the client can unpin and enter the phase again.
 *
 * "Never" is counted in bytes, as the job's limit and totals count them: the
 * phase's accesses in the tier plus the distinct copies there the
 * connection pins and the phase does not name (those are the phase's own),
 * above the job's limit, a total, or what the tier leaves beside the other
 * live jobs' guarantees (engine_pins_fit_kept(): whole segments, the least
 * they can take).
 *
 * And in place: the totals may fit while the room does not, the pins'
 * copies lying in the job's segments so that no run is left where the
 * phase's copies must go (a copy of A <= S bytes takes one run in one
 * segment, a larger one A / S empty segments and a run for its tail:
 * state/space.c).  Those copies stay where they are; everything else in the
 * job's segments may go (unpinned copies are evicted, other connections'
 * pins and the plan's own let go, transfers end), and the job may hold as
 * many segments as its limit gives, the pool has and the other live jobs'
 * guarantees leave.  So the phase's copies (but those the connection pins
 * itself: in place already) get, at best, the free runs the pins leave in
 * their segments and the other segments whole: when one of them has no
 * place there, or those that fit no run need more than those segments, it
 * never fits (own_room_short()).  That is a necessary condition only: a
 * phase refused so could never be pinned, and one whose copies could go
 * only side by side into the same runs is not refused but waits.
 *
 * A VRAM read of a tensor valid in neither VRAM nor host comes up from NVMe
 * through host (ensure_copy(): a chained transfer), so its pin needs room in
 * host as well, beside the connection's own pins there: that one tensor,
 * by the same rules (never_fits()), whatever the phase's VRAM room, but
 * for the room kept for the other live jobs' guarantees, which binds pins
 * only: a staging copy is none (it may take a segment those leave unused).  Only
 * that tensor: the host copy, once VRAM holds it, is a duplicate any pin
 * may evict, so the phase's stagings need that room one at a time, and its
 * host pins may be taken after them.  A tensor that alone exceeds the job's
 * host limit or a total is no matter of the own pins: not refused for them.
 *
 * Only a phase its client entered (hold 0) is refused: a phase pinned ahead
 * may find the pins gone by the time its marker comes.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/level.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "util/size.h"

/* The pins the connection holds in @tier outside the accesses @acc (@n): their bytes, their names into @names. */
static uint64_t own_pinned(Plan *p, const PlanAcc *acc, uint32_t n_acc, int tier, char *names, size_t size) {
        uint64_t mark = p->sched->stamp += 2, own = 0;
        size_t len = 0;
        unsigned n = 0;
        Tensor *t;
        int pt;

        names[0] = '\0';
        for (uint32_t i = 0; i < n_acc; i++)
                if (acc[i].tier == tier)
                        acc[i].tensor->sched_stamp = mark;      /* the phase's own copy, pinned or not */
        for (size_t i = 0; p->owner_ops->pin(p->owner, i, &t, &pt); i++) {
                char b[SIZE_FORMAT_MAX];
                int k;

                if (pt != tier || t->sched_stamp == mark || t->sched_stamp == mark + 1)
                        continue;
                t->sched_stamp = mark + 1;      /* counted once, however often pinned */
                own += t->alloc_size;
                if (++n > 8) {
                        if (n == 9 && len + 5 < size)
                                len += (size_t) snprintf(names + len, size - len, ", ...");
                        continue;
                }
                size_format(b, sizeof(b), t->alloc_size);
                k = snprintf(names + len, size - len, "%s'%s' (%s)", n > 1 ? ", " : "", t->name, b);
                if (k > 0)
                        len = MIN(size - 1, len + (size_t) k);
        }
        return own;
}

/* Order pieces by segment, then offset. */
static int by_place(const void *x, const void *y) {
        const CopyPiece *a = *(const CopyPiece *const *) x, *b = *(const CopyPiece *const *) y;

        if (a->seg != b->seg)
                return a->seg->id < b->seg->id ? -1 : 1;
        return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Is there a free run of @span bytes at a multiple of @align (at 0 with @at_start) beside @pcs (@n, sorted)? */
static bool run_left(const CopyPiece *const *pcs, size_t n, uint64_t span, uint64_t align, bool at_start) {
        for (size_t i = 0; i < n;) {
                const Segment *seg = pcs[i]->seg;
                uint64_t start = 0;

                for (; i < n && pcs[i]->seg == seg; i++) {
                        uint64_t at = ALIGN_UP(start, align);

                        if ((!at_start || start == 0) && at + span <= pcs[i]->offset)
                                return true;
                        start = MAX(start, pcs[i]->offset + pcs[i]->span);
                }
                if ((!at_start || start == 0) && ALIGN_UP(start, align) + span <= seg->pool->seg_size)
                        return true;
        }
        return false;
}

/*
 * Can the copies of the accesses @acc (@n_acc) in @tier (but those the
 * connection pins) never be placed beside the pieces of the copies the
 * connection pins there?  @pins: they are pins, bound by the room kept for
 * the other live jobs' guarantees (a staging copy is not).  Says why into @why.
 */
static bool own_room_short(Plan *p, const PlanAcc *acc, uint32_t n_acc, int tier, bool pins, char *why,
                           size_t size) {
        const Engine *e = p->sched->engine;
        const Job *j = p->job;
        const SegPool *pool = tier != LEVEL_NVME ? e->registry->pools[tier] : NULL;
        _cleanup_free_ const CopyPiece **pcs = NULL;
        uint64_t seg_size, outside = 0, mark;
        const Tensor *lone = NULL;
        const char *segs, *room = "";
        size_t n = 0, cap = 0;
        unsigned held = 0, free_segs, may;
        char b_seg[SIZE_FORMAT_MAX], b_a[SIZE_FORMAT_MAX], b_b[SIZE_FORMAT_MAX];
        Tensor *t;
        int pt;

        if (!pool)
                return false;           /* NVMe extents: any free ones do, the totals say it */
        seg_size = pool->seg_size;
        for (size_t i = 0; p->owner_ops->pin(p->owner, i, &t, &pt); i++)
                if (pt == tier)
                        cap += t->copy[tier].n_pieces;
        if (cap == 0)
                return false;
        pcs = calloc(cap, sizeof(*pcs));
        if (!pcs)
                return false;           /* (waits, as before) */
        mark = p->sched->stamp += 2;
        for (size_t i = 0; p->owner_ops->pin(p->owner, i, &t, &pt) && n < cap; i++) {
                if (pt == tier)
                        t->sched_stamp = mark;  /* in place, as long as it is pinned */
                for (uint32_t k = 0; pt == tier && k < t->copy[tier].n_pieces && n < cap; k++)
                        pcs[n++] = &t->copy[tier].pieces[k];
        }
        qsort(pcs, n, sizeof(*pcs), by_place);
        for (size_t i = 0; i < n; i++)
                held += i == 0 || pcs[i]->seg != pcs[i - 1]->seg;
        may = (unsigned) MIN(ALIGN_UP(j->limit[tier], seg_size) / seg_size, (uint64_t) pool->n_segs);
        free_segs = may > held ? may - held : 0;
        if (pins && free_segs > 0 &&
            engine_pins_fit_kept(e, j, tier, (uint64_t) (held + free_segs) * seg_size, NULL, 0) < 0) {
                unsigned lo = 0, hi = free_segs;        /* what the other live jobs' guarantees leave it pinned */

                while (hi - lo > 1) {
                        unsigned mid = lo + (hi - lo) / 2;

                        if (engine_pins_fit_kept(e, j, tier, (uint64_t) (held + mid) * seg_size, NULL, 0) == 0)
                                lo = mid;
                        else
                                hi = mid;
                }
                free_segs = lo;
                room = " beside the guaranteed minimums of the other live jobs";
        }

        for (uint32_t i = 0; i < n_acc && !lone; i++) {
                uint64_t whole, tail, align, span;
                bool in_run;

                t = acc[i].tensor;
                if (acc[i].tier != tier || t->sched_stamp == mark || t->sched_stamp == mark + 1)
                        continue;       /* pinned by the connection (a place of its own), or counted */
                t->sched_stamp = mark + 1;      /* (the plan's own pins, in place or not, may move) */
                whole = t->alloc_size / seg_size;
                tail = t->alloc_size % seg_size;
                align = whole ? pool->piece_align : SEG_UNIT;
                span = tail ? ALIGN_UP(tail, align) : 0;
                in_run = span > 0 && run_left(pcs, n, span, align, whole && pool->map_whole);
                if (whole + (span > 0 && !in_run) > free_segs)
                        lone = t;
                outside += whole * seg_size + (in_run ? 0 : span);
        }
        if (!lone && outside <= (uint64_t) free_segs * seg_size)
                return false;
        size_format(b_seg, sizeof(b_seg), seg_size);
        segs = tier == LEVEL_VRAM ? "chunks" : "segments";
        if (lone) {
                size_format(b_a, sizeof(b_a), lone->alloc_size);
                (void) snprintf(why, size, "which hold %u of the %u %s %s (%s each) the job may have%s, "
                                "and leave no %s for tensor '%s' (%s): the room is fragmented", held,
                                held + free_segs, level_to_string(tier), segs, b_seg, room,
                                lone->alloc_size < seg_size ? "free run there" :
                                "place (an empty segment per whole one, a run for any rest)", lone->name, b_a);
                return true;
        }
        size_format(b_a, sizeof(b_a), outside);
        size_format(b_b, sizeof(b_b), (uint64_t) free_segs * seg_size);
        (void) snprintf(why, size, "which hold %u of the %u %s %s (%s each) the job may have%s, and leave "
                        "the phase's tensors too little room outside them: %s of them fit no free run there, %s is "
                        "left: the room is fragmented", held, held + free_segs, level_to_string(tier), segs, b_seg,
                        room, b_a, b_b);
        return true;
}

/*
 * Do the copies of the accesses @acc (@n_acc) in @tier never fit there
 * beside the pins the connection holds outside them?  @pins: they are pins,
 * bound by the room kept for the other live jobs' guarantees; a staging copy
 * is no pin (pin_kept(), engine/op.c), so only the limit and totals bind it.
 * Their bytes into *@ret_need, the pins' into *@ret_own, the pins named
 * into @names, why into @clause.
 */
static bool never_fits(Plan *p, const PlanAcc *acc, uint32_t n_acc, int tier, bool pins, uint64_t *ret_need,
                       uint64_t *ret_own, char *names, size_t nsize, char *clause, size_t csize) {
        const Engine *e = p->sched->engine;
        const Job *j = p->job;
        const char *lvl = level_to_string(tier);
        char beyond[160], b_lim[SIZE_FORMAT_MAX];
        uint64_t need = 0, own, sum;

        for (uint32_t i = 0; i < n_acc; i++)
                if (acc[i].tier == tier)
                        need += acc[i].tensor->alloc_size;
        own = own_pinned(p, acc, n_acc, tier, names, nsize);
        if (own == 0)
                return false;
        *ret_need = need;
        *ret_own = own;
        sum = need + own;
        beyond[0] = '\0';
        if (sum > j->limit[tier]) {
                size_format(b_lim, sizeof(b_lim), j->limit[tier]);
                (void) snprintf(beyond, sizeof(beyond), "the job's %s limit (%s)", lvl, b_lim);
        }
        for (unsigned i = 0; !beyond[0] && i < j->n_totals; i++)
                if (j->totals[i].total[tier] > 0 && sum > j->totals[i].total[tier]) {
                        size_format(b_lim, sizeof(b_lim), j->totals[i].total[tier]);
                        (void) snprintf(beyond, sizeof(beyond), "the %s total of its %s %" PRIu32 " (%s)", lvl,
                                        j->totals[i].kind == QUOTA_UID ? "uid" : "group", j->totals[i].id, b_lim);
                }
        /* (a phase that alone never fits beside the guarantees fails its plan: plan_pin_waits()) */
        if (pins && !beyond[0] && engine_pins_fit_kept(e, j, tier, sum, NULL, 0) < 0 &&
            engine_pins_fit_kept(e, j, tier, need, NULL, 0) == 0) {
                size_format(b_lim, sizeof(b_lim), e->registry->capacity[tier]);
                (void) snprintf(beyond, sizeof(beyond), "what the %s tier (%s) leaves beside the guaranteed "
                                "minimums of the other live jobs", lvl, b_lim);
        }
        if (beyond[0]) {
                (void) snprintf(clause, csize, "beyond %s together", beyond);
                return true;
        }
        return own_room_short(p, acc, n_acc, tier, pins, clause, csize);     /* else room others hold: it may come */
}

/*
 * Must @a's copy come up from NVMe through host, taking room there on its
 * way (ensure_copy(): a VRAM read of a tensor valid in neither VRAM nor
 * host)?  That room is needed for one transfer only: the host copy, once
 * VRAM holds the tensor, is a duplicate any pin may evict.
 */
static bool stages_in_host(const PlanAcc *a) {
        const Tensor *t = a->tensor;

        return a->tier == LEVEL_VRAM && (a->mode & PLAN_READ) && !t->lost && !tensor_is_blank(t) &&
               !copy_valid(t, LEVEL_VRAM) && !copy_valid(t, LEVEL_HOST) && copy_valid(t, LEVEL_NVME);
}

/* Does @bytes alone fit the job's limit and totals in @tier?  Else no unpin gives it room. */
static bool alone_fits(const Job *j, int tier, uint64_t bytes) {
        if (bytes > j->limit[tier])
                return false;
        for (unsigned i = 0; i < j->n_totals; i++)
                if (j->totals[i].total[tier] > 0 && bytes > j->totals[i].total[tier])
                        return false;
        return true;
}

bool plan_self_pinned(Plan *p, int h, const PlanAcc *a) {
        PlanHold *hold = &p->hold[h];
        const PlanPhase *ph = &p->phases[hold->phase];
        const Job *j = p->job;
        const char *lvl = level_to_string(a->tier);
        PlanAcc staged = *a;
        char names[384], clause[400];
        char b_phase[SIZE_FORMAT_MAX], b_own[SIZE_FORMAT_MAX];
        uint64_t need = 0, own = 0;
        int r;

        if (hold->refused)
                return true;            /* the pass refuses it */
        if (h != 0 || !hold->active || !p->owner_ops || !p->owner_ops->pin)
                return false;           /* a phase pinned ahead: its client may unpin before it enters it */
        if (never_fits(p, ph->acc, ph->n_acc, a->tier, true, &need, &own, names, sizeof(names), clause, sizeof(clause))) {
                size_format(b_phase, sizeof(b_phase), need);
                size_format(b_own, sizeof(b_own), own);
                r = snprintf(p->refused_why, sizeof(p->refused_why), "phase %" PRIu32 " of job '%s' can never be "
                             "pinned in %s while this client's own pins there stay: the phase needs %s (tensor '%s' "
                             "found no room), and the client pins %s outside its plan, %s, %s; unpin them before "
                             "entering the phase, or add them to the plan's phase", hold->phase, j->name, lvl,
                             b_phase, a->tensor->name, b_own, names, clause);
        } else {
                /*
                 * Its room in VRAM may come, but not the room in host it passes through: the
                 * connection's own pins there stay, the phase's host pins (which may be taken
                 * after it) and all else may go.
                 */
                staged.tier = LEVEL_HOST;
                if (!stages_in_host(a) || !alone_fits(j, LEVEL_HOST, a->tensor->alloc_size) ||
                    !never_fits(p, &staged, 1, LEVEL_HOST, false, &need, &own, names, sizeof(names), clause,
                                sizeof(clause)))
                        return false;   /* room others hold: it may come */
                size_format(b_phase, sizeof(b_phase), need);
                size_format(b_own, sizeof(b_own), own);
                r = snprintf(p->refused_why, sizeof(p->refused_why), "phase %" PRIu32 " of job '%s' can never be "
                             "pinned in %s while this client's own pins in host stay: tensor '%s' (%s), on NVMe "
                             "only, needs room in host to be brought up to %s, and the client pins %s there outside "
                             "its plan, %s, %s; unpin them before entering the phase", hold->phase, j->name, lvl,
                             a->tensor->name, b_phase, lvl, b_own, names, clause);
        }
        if (r >= (int) sizeof(p->refused_why))
                log_debug("sched: the refusal of phase %" PRIu32 " of job '%s' is cut short", hold->phase, j->name);
        log_job(LOG_WARNING, 0, j->name, "Phase %" PRIu32 " of job '%s' refused: %s", hold->phase, j->name,
                p->refused_why);
        hold->refused = -ENOSPC;
        engine_kick(p->sched->engine);  /* the pass refuses it (not from an op's callback) */
        return true;
}

void plan_refuse(Plan *p, uint64_t seq, uint32_t phase, int status) {
        if (p->owner_ops && p->owner_ops->refused)
                p->owner_ops->refused(p->owner, seq, phase, status, p->refused_why);
        p->refused_why[0] = '\0';
}

void plan_set_owner_ops(Plan *p, const PlanOwnerOps *ops, void *owner) {
        p->owner_ops = ops;
        p->owner = owner;
}
