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
 * they can take).  Only a phase its client entered (hold 0) is refused: a
 * phase pinned ahead may find the pins gone by the time its marker comes.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/base/level.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "util/size.h"

/* The pins the connection holds in @tier outside the phase: their bytes, their names into @names. */
static uint64_t own_pinned(Plan *p, const PlanPhase *ph, int tier, char *names, size_t size) {
        uint64_t mark = p->sched->stamp += 2, own = 0;
        size_t len = 0;
        unsigned n = 0;
        Tensor *t;
        int pt;

        names[0] = '\0';
        for (uint32_t i = 0; i < ph->n_acc; i++)
                if (ph->acc[i].tier == tier)
                        ph->acc[i].tensor->sched_stamp = mark;  /* the phase's own copy, pinned or not */
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

bool plan_self_pinned(Plan *p, int h, const PlanAcc *a) {
        PlanHold *hold = &p->hold[h];
        const PlanPhase *ph = &p->phases[hold->phase];
        const Engine *e = p->sched->engine;
        const Job *j = p->job;
        int tier = a->tier;
        const char *lvl = level_to_string(tier);
        char names[384], beyond[160], b_phase[SIZE_FORMAT_MAX], b_own[SIZE_FORMAT_MAX], b_lim[SIZE_FORMAT_MAX];
        uint64_t phase = 0, own, sum;

        if (hold->refused)
                return true;            /* the pass refuses it */
        if (h != 0 || !hold->active || !p->owner_ops || !p->owner_ops->pin)
                return false;           /* a phase pinned ahead: its client may unpin before it enters it */
        for (uint32_t i = 0; i < ph->n_acc; i++)
                if (ph->acc[i].tier == tier)
                        phase += ph->acc[i].tensor->alloc_size;
        own = own_pinned(p, ph, tier, names, sizeof(names));
        if (own == 0)
                return false;
        sum = phase + own;
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
        if (!beyond[0] && engine_pins_fit_kept(e, j, tier, sum, NULL, 0) < 0 &&
            engine_pins_fit_kept(e, j, tier, phase, NULL, 0) == 0) {
                size_format(b_lim, sizeof(b_lim), e->registry->capacity[tier]);
                (void) snprintf(beyond, sizeof(beyond), "what the %s tier (%s) leaves beside the guaranteed "
                                "minimums of the other live jobs", lvl, b_lim);
        }
        if (!beyond[0])
                return false;           /* room others hold: it may come */
        size_format(b_phase, sizeof(b_phase), phase);
        size_format(b_own, sizeof(b_own), own);
        if (snprintf(p->refused_why, sizeof(p->refused_why), "phase %" PRIu32 " of job '%s' can never be pinned "
                     "in %s while this client's own pins there stay: the phase needs %s (tensor '%s' found no "
                     "room), and the client pins %s outside its plan, %s, beyond %s together; unpin them before "
                     "entering the phase, or add them to the plan's phase", hold->phase, j->name, lvl, b_phase,
                     a->tensor->name, b_own, names, beyond) >= (int) sizeof(p->refused_why))
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
