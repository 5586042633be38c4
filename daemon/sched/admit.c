/* SPDX-License-Identifier: MIT */
/* admit.c: admission of prefetches by simulated occupancy, the lookahead horizon, moves per step. */

/*
 * Theory of operation.
 *
 * A prefetch is worth its bytes only if its copy is still there when its
 * phase comes: a copy evicted before its use is read twice.  The prefetch
 * window (plan_window(), below) bounds how far ahead the working set fits,
 * but counts every tensor of those phases at once; what is freed between
 * (a copy whose last use before the deadline has passed, a tensor dropped
 * as dead) and what the engine would pick as a victim are known too, since
 * the plan is.  admit_survives() replays the phases from now up to the
 * prefetch's own with the job's occupancy of the tier: room free now, plus
 * the copies that Belady's order (as victim.c weighs it: time to the next
 * use over the cost of dropping) would evict before the candidate, each
 * from the phase after its last use on; minus what every phase needs there
 * and does not have.  When a phase would find no room but the candidate's,
 * the candidate is not admitted: it is retried when something changes.
 *
 * How far ahead to look is a matter of time, not of a number of phases
 * (admit_horizon()): the reads of the phases to come, read back to back
 * from now, must be done by each phase's predicted start; the farthest
 * phase that would be late so is the horizon, even when that crosses from
 * backward into the optimizer's phases.  Such an early read takes only
 * cheap room (admit_early_room()): evicting a copy that must be read back
 * before those reads are done would trade one read of the burst for
 * another, plus a write.
 *
 * Moves per step: every move of a tensor into a tier is noted with the
 * step (Plan.iter_start_ns) it happened in.  Another move of the same
 * tensor into the same tier in the same step needs a reason, which the
 * debug log shows: a pin (the phase needs it now) or a use in between
 * (the copy served, then was evicted for room), or a prefetch whose copy of
 * this step was evicted before its use (the admission's prediction missed:
 * counted in Plan.moves_refetched).  That one is not refused outright:
 * refusing it saves host <-> VRAM copies but costs more NVMe bytes a step
 * (the pin brings the tensor later, at a worse moment for what it evicts).
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/sched/admit.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/tiers/tier-nvme.h"
#include "util/time-util.h"

/*
 * Prefetches of one tensor into one tier, per step, whose copy may be evicted before its use before
 * the next one is refused (allowing a refetch costs fewer NVMe bytes than allowing none: see the theory).
 */
#define ADMIT_REFETCH_MAX 2

/* NVMe bandwidth the lookahead assumes when [nvme] bandwidth does not throttle (bytes/s per target). */
#define ADMIT_DEFAULT_NVME_BW (2000000000ull)

/* ---- the occupancy simulation ------------------------------------------------------------ */

/* Relative position of phase @ph from the current one (0: current). */
static uint32_t rel_of(const Plan *p, uint32_t ph) {
        return (ph + p->n_phases - plan_cur(p)) % p->n_phases;
}

static uint32_t abs_of(const Plan *p, uint32_t r) {
        return (plan_cur(p) + r) % p->n_phases;
}

/* Predicted start of relative phase @r, which may lie in a later cycle. */
static uint64_t pred_at(const Plan *p, uint32_t r) {
        uint32_t n = p->n_phases;

        if (r == UINT32_MAX)
                return UINT64_MAX;
        if (r <= n)
                return p->pred[r];
        return p->pred[r % n] + (uint64_t) (r / n) * (p->pred[n] - p->pred[0]);
}

/* Class of the next-use index that says when @t's copy in @tier is needed (victim.c's rule). */
static int use_class(const Tensor *t, int tier) {
        if (tier == LEVEL_VRAM)
                return USE_VRAM;
        return copy_valid(t, LEVEL_VRAM) ? USE_HOST : USE_ANY;
}

/* The last relative phase in [@lo, @hi) that uses slot @s in class @c; -1: none. */
static int64_t last_use_in(const Plan *p, uint32_t s, int c, uint32_t lo, uint32_t hi) {
        int64_t last = -1;

        for (uint32_t i = p->use_off[c][s]; i < p->use_off[c][s + 1]; i++) {
                uint32_t r = rel_of(p, p->use_phase[c][i]);

                if (r >= lo && r < hi && (int64_t) r > last)
                        last = r;
        }
        return last;
}

/* The first relative phase after @after (up to a cycle later) that uses slot @s in class @c. */
static uint32_t next_use_after(const Plan *p, uint32_t s, int c, uint32_t after) {
        uint32_t best = UINT32_MAX;

        for (uint32_t i = p->use_off[c][s]; i < p->use_off[c][s + 1]; i++) {
                uint32_t r = rel_of(p, p->use_phase[c][i]);

                while (r <= after)
                        r += p->n_phases;
                best = MIN(best, r);
        }
        return best;
}

/*
 * Does the copy of @t (of this plan) become a better victim than the candidate
 * once relative phase @last (-1: now) is over?  Dead after it (overwritten next),
 * never used again, or used next so late that its score beats the candidate's.
 */
static bool goes_first(const Plan *p, const Tensor *t, int tier, int64_t last, bool sole, double cand_score,
                       uint64_t now) {
        uint32_t from = last < 0 ? 0 : (uint32_t) last, nu;
        double score;

        if (t->plan_refs == 1 && plan_next_access_mode(p, t, abs_of(p, from), false) == PLAN_WRITE)
                return true;
        nu = next_use_after(p, t->plan_slot, use_class(t, tier), from);
        if (nu == UINT32_MAX)
                return true;
        score = (double) (pred_at(p, nu) > now ? pred_at(p, nu) - now : 0);
        if (sole)
                score /= 2;
        return score > cand_score;
}

/*
 * Bytes the prefetches admitted earlier in this pass will take in @tier: their
 * ops are queued and reserve their room only when the engine runs them, after
 * the pass, so without this every admission of a pass would count the same
 * free room (and a burst of small prefetches would be admitted, then evicted again at once).
 */
static uint64_t admitted_now(const Plan *p, int tier) {
        return p->admitted_pass == p->sched->pass_no ? p->admitted[tier] : 0;
}

static void admitted_note(Plan *p, const Tensor *t, int tier) {
        if (p->admitted_pass != p->sched->pass_no) {
                p->admitted_pass = p->sched->pass_no;
                p->admitted[LEVEL_VRAM] = p->admitted[LEVEL_HOST] = 0;
        }
        p->admitted[tier] += t->alloc_size;
        /* a vram copy from NVMe stages through host (xfer_start_chain()) */
        if (tier == LEVEL_VRAM && !copy_valid(t, LEVEL_HOST))
                p->admitted[LEVEL_HOST] += t->alloc_size;
}

/* Does relative phase @r's access @a need room in @tier that it does not have now? */
static bool needs_room(const PlanAcc *a, int tier) {
        const Tensor *t = a->tensor;

        if (t->copy[tier].state != COPY_ABSENT)
                return false;
        if (a->tier == tier)
                return true;
        /* a vram read of what is not in vram stages through host (zeros are filled in place) */
        return tier == LEVEL_HOST && a->tier == LEVEL_VRAM && a->mode != PLAN_WRITE && !copy_valid(t, LEVEL_VRAM) &&
               !tensor_is_blank(t);
}

bool admit_survives(Plan *p, Tensor *t, int tier, uint32_t ahead, char *why, size_t why_size) {
        bool present = t->copy[tier].state != COPY_ABSENT;
        Job *j = p->job;
        uint64_t now = now_ns();
        int64_t room;
        double cand_score;

        if (ahead < 2 || ahead >= p->n_phases)
                return true;            /* the holds pin what they need; nothing to simulate */
        /* no room now for a nearer one as large: none for this one either (a farther use goes first sooner) */
        if (!present && p->sim_now_pass[tier] == p->sched->pass_no && ahead >= p->sim_now_ahead[tier] &&
            t->alloc_size >= p->sim_now_size[tier]) {
                why[0] = 0;
                return false;
        }
        p->sched->admit_sims++;
        memset(p->sim_avail, 0, (p->n_phases + 1) * sizeof(uint64_t));
        p->sim_gen++;
        cand_score = (double) (pred_at(p, ahead) > now ? pred_at(p, ahead) - now : 0);
        if (present && copy_is_sole(t, tier))
                cand_score /= 2;        /* a dirty copy already there: dropping it costs a write too */
        room = (int64_t) j->limit[tier] - (int64_t) j->used[tier] - (int64_t) admitted_now(p, tier);

        /* the copies there now: which would go before the candidate, and from when on */
        list_for_each_safe(node, tmp, &j->tensors) {
                Tensor *v = list_entry(node, Tensor, job_link);
                const Copy *c = &v->copy[tier];
                int64_t last;

                if (v == t || c->state == COPY_ABSENT)
                        continue;
                if (v->plan != p) {
                        /*
                         * No plan names it: the first victim, if the engine may take it
                         * now (engine_copy_evictable(): the same rule as its victims);
                         * another plan's: kept (its uses are not ours to judge).
                         */
                        if (!v->plan && engine_copy_evictable(v, tier))
                                room += (int64_t) v->alloc_size;
                        continue;
                }
                p->sim_stamp[v->plan_slot] = p->sim_gen;
                last = last_use_in(p, v->plan_slot, use_class(v, tier), 0, ahead);
                if (last < 0 && c->pins > 0)
                        continue;       /* pinned outside the plan's holds */
                if (!goes_first(p, v, tier, last, copy_is_sole(v, tier), cand_score, now))
                        continue;
                if (last < 0)
                        room += (int64_t) v->alloc_size;
                else if (last + 2 < ahead)
                        p->sim_avail[last + 2] += v->alloc_size;
        }
        if (!present)
                room -= (int64_t) t->alloc_size;        /* (a copy there is counted in used already) */
        if (room < 0) {
                snprintf(why, why_size, "no room in %s now without evicting a copy needed sooner",
                         level_to_string(tier));
                if (present)
                        return false;
                p->sim_now_pass[tier] = p->sched->pass_no;
                p->sim_now_ahead[tier] = ahead;
                p->sim_now_size[tier] = t->alloc_size;
                return false;
        }

        /* the phases before its own, in order: what each brings in, what each lets go */
        for (uint32_t r = 1; r < ahead; r++) {
                const PlanPhase *ph = &p->phases[abs_of(p, r)];

                room += (int64_t) p->sim_avail[r];
                for (uint32_t i = 0; i < ph->n_acc; i++) {
                        const PlanAcc *a = &ph->acc[i];
                        Tensor *v = a->tensor;
                        int64_t last;

                        if (v == t || v->plan != p || p->sim_stamp[a->slot] == p->sim_gen || !needs_room(a, tier))
                                continue;
                        p->sim_stamp[a->slot] = p->sim_gen;
                        room -= (int64_t) v->alloc_size;
                        last = last_use_in(p, a->slot, use_class(v, tier), r, ahead);
                        if (last < 0)
                                last = r;       /* staged only: its last use in this tier is this phase */
                        if (last + 2 < ahead &&
                            goes_first(p, v, tier, last, (a->mode & PLAN_WRITE) != 0, cand_score, now))
                                p->sim_avail[last + 2] += v->alloc_size;
                }
                if (room < 0) {
                        snprintf(why, why_size, "phase %u (%u ahead) would be %" PRId64 " bytes short in %s "
                                 "without evicting it", abs_of(p, r), r, -room, level_to_string(tier));
                        return false;
                }
        }
        return true;
}

bool admit_evicted(Plan *p, Tensor *t, int tier) {
        char why[160];
        uint32_t nu;

        if (t->plan != p || t->copy[tier].state == COPY_ABSENT)
                return false;
        nu = next_use_after(p, t->plan_slot, use_class(t, tier), 0);
        if (nu == UINT32_MAX)
                return true;
        if (nu < 2 || nu >= p->n_phases)
                return false;
        return !admit_survives(p, t, tier, nu, why, sizeof(why));
}

uint32_t admit_horizon(Plan *p, uint64_t now, uint64_t bw) {
        uint64_t bytes = 0, at_window = 0, at_horizon = 0;
        uint32_t horizon = 0;

        p->horizon = 0;
        p->horizon_ns = 0;
        if (bw == 0)
                return 0;
        p->sim_gen++;
        for (uint32_t r = 1; r < p->n_phases; r++) {
                const PlanPhase *ph = &p->phases[abs_of(p, r)];

                for (uint32_t i = 0; i < ph->n_acc; i++) {
                        const PlanAcc *a = &ph->acc[i];
                        const Tensor *t = a->tensor;

                        /* only what must come from NVMe */
                        if (a->mode == PLAN_WRITE || tensor_is_blank(t) || copy_valid(t, LEVEL_HOST) ||
                            copy_valid(t, LEVEL_VRAM) || p->sim_stamp[a->slot] == p->sim_gen)
                                continue;
                        p->sim_stamp[a->slot] = p->sim_gen;
                        bytes += t->alloc_size;
                }
                if (r == p->window[LEVEL_HOST])
                        at_window = bytes;
                if (r >= 2 && now + (uint64_t) ((double) bytes * 1e9 / (double) bw) > p->pred[r]) {
                        horizon = r;
                        at_horizon = bytes;
                }
        }
        p->horizon = horizon;
        p->horizon_ns = horizon > 0 ? p->pred[horizon] : 0;
        /* write-behind makes room for those reads too (they come into host) */
        if (horizon > p->window[LEVEL_HOST] && at_horizon > at_window)
                p->need[LEVEL_HOST] += at_horizon - at_window;
        return horizon;
}

/* ---- the windows and the lookahead ------------------------------------------------------ */

/*
 * plan_window() - how far ahead prefetching may reach: for vram and host,
 * the largest n such that every tensor phases cur..cur+n touch there fits
 * the job's limit at once.  A copy brought in for a phase beyond that would
 * be evicted again before its use by something needed earlier (Belady evicts
 * the farthest next use first), so it would be read twice.  A tensor needed
 * in vram that is not there now counts in host too: it is staged there.
 * For host, every tensor touched in any tier must also fit vram and host
 * together: what is not in one must be in the other.  Also sets need[]: the
 * bytes these phases, and the first one that does not fit, bring in.
 */
void plan_window(Plan *p) {
        Job *j = p->job;
        uint32_t cur = plan_cur(p);
        uint64_t bytes[2] = { 0, 0 }, mem = 0;
        bool open[2] = { true, true };

        memset(p->wmark, 0, p->n_slots);
        p->window[0] = p->window[1] = 0;
        p->need[0] = p->need[1] = 0;
        for (uint32_t k = 0; k < p->n_phases && (open[0] || open[1]); k++) {
                PlanPhase *ph = &p->phases[(cur + k) % p->n_phases];

                /* before the first marker no phase runs: phase 0 is the next one */
                for (uint32_t i = 0; i < ph->n_acc && !(k == 0 && p->cur == UINT32_MAX); i++) {
                        PlanAcc *a = &ph->acc[i];
                        uint8_t bits = a->tier == LEVEL_VRAM ? 1 : 2;

                        if (a->tier == LEVEL_VRAM && a->mode != PLAN_WRITE && !copy_valid(a->tensor, LEVEL_VRAM) &&
                            !tensor_is_blank(a->tensor))
                                bits |= 2;      /* staged through host (zeros are filled in place) */
                        for (int c = 0; c < 2; c++)
                                if (open[c] && ((bits & ~p->wmark[a->slot]) & (1u << c))) {
                                        p->wmark[a->slot] |= (uint8_t) (1u << c);
                                        bytes[c] += a->tensor->alloc_size;
                                        if (!copy_valid(a->tensor, c))
                                                p->need[c] += a->tensor->alloc_size;
                                }
                        /* every tensor touched, whatever the tier: vram and host hold them together */
                        if (!(p->wmark[a->slot] & 4)) {
                                p->wmark[a->slot] |= 4;
                                mem += a->tensor->alloc_size;
                        }
                }
                /* the phase that overflows still counts in need: write-behind makes room for it */
                for (int c = 0; c < 2; c++) {
                        if (open[c] && (bytes[c] > j->limit[c] ||
                                        (c == LEVEL_HOST && mem > j->limit[LEVEL_VRAM] + j->limit[LEVEL_HOST])))
                                open[c] = false;
                        else if (open[c])
                                p->window[c] = k;
                }
        }
}

/* NVMe read bandwidth the lookahead counts on: the throttle's, else a typical drive's. */
uint64_t admit_nvme_bw(const Sched *s) {
        unsigned n = s->engine->nvme ? MAX(s->engine->nvme->n_targets, 1u) : 1;

        return (s->config->nvme_bandwidth ? s->config->nvme_bandwidth : ADMIT_DEFAULT_NVME_BW) * n;
}

/* ---- admission --------------------------------------------------------------------------- */

/*
 * Would an early read of @t into host (a horizon read: beyond the host
 * window, there only because the reads ahead would be late) make its room
 * by evicting a copy that must itself be read back from NVMe before those
 * reads are done?  Then it moves a read within the same burst instead of
 * out of it, and adds a write: not worth it.  Walks the victims in the
 * engine's order for the candidate's deadline until the room is found;
 * free room, dead copies, host duplicates of valid VRAM copies and copies
 * next used after the horizon's phase are cheap.  false (with @why) when a
 * dear one would go first.
 */
bool admit_early_room(Plan *p, Tensor *t, uint64_t deadline, char *why, size_t why_size) {
        Sched *s = p->sched;
        Job *j = p->job;
        _cleanup_free_ Tensor **v = NULL;
        uint64_t room, need = t->alloc_size, now = now_ns();
        size_t n = 0, k;

        room = j->limit[LEVEL_HOST] > j->used[LEVEL_HOST] + admitted_now(p, LEVEL_HOST) ?
                j->limit[LEVEL_HOST] - j->used[LEVEL_HOST] - admitted_now(p, LEVEL_HOST) : 0;
        if (room >= need || p->horizon_ns == 0)
                return true;
        /* the engine's own candidates, in its own order */
        if (engine_victims(s->engine, j, LEVEL_HOST, t, &v, &n) < 0)
                return true;    /* (the engine decides, as without this check) */
        k = sched_victim_order(s, LEVEL_HOST, v, n, deadline);
        for (size_t i = 0; i < k && room < need; i++) {
                Tensor *x = v[i];
                uint64_t nu = sched_victim_next_use(x, LEVEL_HOST);

                if (!(nu == UINT64_MAX || nu > p->horizon_ns || copy_valid(x, LEVEL_VRAM) ||
                      sched_next_access_overwrites(x))) {
                        snprintf(why, why_size, "an early read would evict '%s', read again in %.1f ms, before the "
                                 "reads ahead are done (%.1f ms)", x->name, ((double) nu - (double) now) / 1e6,
                                 ((double) p->horizon_ns - (double) now) / 1e6);
                        return false;
                }
                room += x->alloc_size;
        }
        if (room < need) {
                snprintf(why, why_size, "no room in host for an early read");
                return false;
        }
        return true;
}

static size_t move_idx(const Plan *p, const Tensor *t, int tier) {
        if (t->plan != p || tier < LEVEL_VRAM || tier > LEVEL_HOST)
                return SIZE_MAX;
        return 2 * (size_t) t->plan_slot + (size_t) tier;
}

/*
 * May prefetch @c go now?  Not a third time in this step when its copies of
 * this step were evicted before their use; only if the occupancy simulation
 * says it stays until its phase (admit_survives()).  A vram prefetch that
 * would not stay is staged in host memory when that copy would.  Refused
 * ones are retried when something moves (Sched.epoch).
 */
bool sched_admit(Sched *s, SchedCand *c) {
        Plan *p = c->plan;
        Tensor *t = c->tensor;
        char reason[160] = "";
        size_t mi = move_idx(p, t, c->tier);

        /*
         * Prefetched and evicted before its use ADMIT_REFETCH_MAX times this step
         * already: the occupancy simulation keeps admitting what the engine then
         * evicts for the next prefetch (a loop of cheap host <-> VRAM copies, seen
         * thousands of times a step with GPT-2 under tight budgets).  Its phase's
         * pin brings it instead.
         */
        if (mi != SIZE_MAX && moves_check(p, t, c->tier, false) == MOVE_REFETCH &&
            p->move_refetch[mi] >= ADMIT_REFETCH_MAX) {
                p->admit_refused++;
                t->sched_blocked = s->epoch;
                log_debug("sched: job '%s' prefetch '%s' -> %s not admitted: evicted before its use %u times this "
                          "step already", p->job->name, t->name, level_to_string(c->tier), (unsigned) p->move_refetch[mi]);
                return false;
        }

        if (c->tier == LEVEL_HOST && c->ahead > p->window[LEVEL_HOST] &&
            !admit_early_room(p, t, c->deadline, reason, sizeof(reason))) {
                p->admit_refused++;
                t->sched_blocked = s->epoch;
                log_debug("sched: job '%s' prefetch '%s' -> host (%u phases ahead) not admitted: %s", p->job->name,
                          t->name, c->ahead, reason);
                return false;
        }
        if (admit_survives(p, t, c->tier, c->ahead, reason, sizeof(reason))) {
                admitted_note(p, t, c->tier);
                return true;
        }
        if (c->tier == LEVEL_VRAM && !copy_valid(t, LEVEL_HOST) &&
            admit_survives(p, t, LEVEL_HOST, c->ahead, reason, sizeof(reason))) {
                c->tier = LEVEL_HOST;    /* vram would not keep it: stage it in host memory */
                c->link = SCHED_LINK_NVME;
                admitted_note(p, t, c->tier);
                return true;
        }
        p->admit_refused++;
        t->sched_blocked = s->epoch;
        if (reason[0])  /* (empty: refused like a nearer one in this pass, which was logged) */
                log_debug("sched: job '%s' prefetch '%s' -> %s (%u phases ahead) not admitted: %s", p->job->name, t->name,
                  level_to_string(c->tier), c->ahead, reason);
        return false;
}

/* ---- moves per step ---------------------------------------------------------------------- */

MoveWhy moves_check(Plan *p, const Tensor *t, int tier, bool pin) {
        size_t i = move_idx(p, t, tier);

        if (i == SIZE_MAX || p->move_step[i] != p->iter_start_ns + 1)
                return MOVE_FIRST;
        if (pin)
                return MOVE_DEMAND;
        return p->move_used[i] ? MOVE_REUSE : MOVE_REFETCH;
}

void moves_note(Plan *p, const Tensor *t, int tier, bool used) {
        size_t i = move_idx(p, t, tier);

        if (i == SIZE_MAX)
                return;
        if (p->move_step[i] != p->iter_start_ns + 1)
                p->move_refetch[i] = 0;         /* a new step */
        p->move_step[i] = p->iter_start_ns + 1;
        p->move_used[i] = used;
}

void moves_landed(Plan *p, const Tensor *t, int tier) {
        MoveWhy why = moves_check(p, t, tier, false);
        size_t i = move_idx(p, t, tier);

        if (why == MOVE_REFETCH) {
                p->moves_refetched++;
                if (p->move_refetch[i] < UINT16_MAX)
                        p->move_refetch[i]++;
        }
        if (why != MOVE_FIRST) {
                p->moves_repeated++;
                log_debug("sched: job '%s' moved '%s' to %s %s", p->job->name, t->name, level_to_string(tier),
                          move_why_to_string(why));
        }
        moves_note(p, t, tier, false);
}

void moves_used(Plan *p, const Tensor *t, int tier) {
        size_t i = move_idx(p, t, tier);

        if (i != SIZE_MAX && p->move_step[i] == p->iter_start_ns + 1)
                p->move_used[i] = true;
}

const char *move_why_to_string(MoveWhy w) {
        static const char *const names[] = {
                [MOVE_FIRST] = "first move this step",
                [MOVE_DEMAND] = "again this step: its phase needs it now",
                [MOVE_REUSE] = "again this step: evicted after its use, needed again",
                [MOVE_REFETCH] = "again this step: its prefetch was evicted before use",
        };

        return w <= MOVE_REFETCH ? names[w] : "?";
}

/* Deadlines this close together count as colliding: fair share decides. */
#define SCHED_COLLIDE_NS (1000000ull)

/*
 * sched_pick() - the next candidate to start: earliest deadline first among
 * those whose job has a free slot on their link (the current phase's pins
 * too: their deadline is now, so they come first, but they are weighed like
 * the rest when jobs collide); among candidates whose deadlines collide with
 * that earliest one (within SCHED_COLLIDE_NS of it, or of now when it is overdue)
 * the job with the smallest fair-share virtual time wins.  @c is sorted by
 * deadline.  Slots are per job (see slot_take() in sched.c).
 */
static bool cand_blocked(const SchedCand *c, const unsigned limit[]) {
        return c->taken || c->job->sched_inflight[c->link] >= limit[c->link];
}

size_t sched_pick(const SchedCand *c, size_t n, uint64_t now, const unsigned limit[]) {
        size_t first = SIZE_MAX, pick = SIZE_MAX;
        uint64_t horizon;

        for (size_t i = 0; i < n; i++) {
                if (cand_blocked(&c[i], limit))
                        continue;
                first = i;
                break;
        }
        if (first == SIZE_MAX)
                return SIZE_MAX;
        horizon = MAX(c[first].deadline, now) + SCHED_COLLIDE_NS;
        for (size_t i = first; i < n && c[i].deadline <= horizon; i++) {
                if (cand_blocked(&c[i], limit))
                        continue;
                if (pick == SIZE_MAX || c[i].job->vtime < c[pick].job->vtime)
                        pick = i;
        }
        return pick == SIZE_MAX ? first : pick;
}
