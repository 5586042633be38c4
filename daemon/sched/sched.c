/* SPDX-License-Identifier: MIT */
/* sched.c: the shared scheduling timeline: holds, deadlines (EDF), prefetch, write-behind, fair share (victims: victim.c). */

/*
 * Theory of operation.
 *
 * Plans (plan.c) turn every rank's phases into predicted times: the shared
 * timeline.  This file acts on it.  It registers with the op engine
 * (EngineSchedOps) and so is asked, without the engine calling up, for the
 * order of victims, whether a tensor's bytes are dead, and to charge a
 * job's fair share; the engine runs its pass after every run of ops.
 *
 * Pins.  Each marker's phase is held by a PlanHold: one pin per access.
 * When marker s+1 arrives, the hold of marker s is released (written
 * accesses unpin dirty).  Under the timeline policy the hold for marker
 * s+1 is built while marker s runs, so in the steady state a marker finds
 * its phase ready and does not wait; under lru and ondemand it is built
 * when the marker arrives.
 *
 * Transfers (timeline).  Every pass collects candidates: the accesses of
 * the next phase not pinned yet, and the accesses of the phases after it
 * whose tensor is not in the needed tier, as far ahead as the job's
 * working set fits its limits (plan_window(): further would only be
 * evicted again before its use) or farther where reads must start early
 * (admit_horizon()); each prefetch is issued only if a simulation of the
 * tier's occupancy up to its phase says it survives until then
 * (sched_admit(), admit.c).  Each gets the predicted start of its
 * phase as a deadline.  Candidates are issued earliest deadline first, at
 * most a few per job and link at a time (so that the link's bandwidth goes
 * to the earliest deadline instead of being split); when deadlines collide
 * (all within a short window, as when a link is saturated) the job with the
 * smallest virtual time wins and is charged bytes / weight.  Below, each
 * link has a fair queue by weight (uring.c, the engine's VRAM link), so
 * that drains and demand transfers are shared by weight too.  A prefetch
 * only evicts copies whose next use is later than its own deadline
 * (Belady's rule, exact here because the future is known), farthest first,
 * weighed by the cost of dropping (a sole copy costs a write and a read
 * back); when no such victim exists it is not issued now and is retried
 * when something moves (Sched.epoch).  When VRAM is full for a far access,
 * the tensor is staged in host memory instead, so the NVMe hop of the chain
 * happens early and the host->VRAM hop later.  What a plan overwrites next
 * without reading is dead: its copies are dropped when its last reader is
 * done (plan_drop_dead()).
 *
 * Write-behind (timeline).  For each tier, the bytes the prefetch window
 * (and the phase after it) will bring in beyond the free space are matched
 * against the copies Belady would evict for them; those that are the sole
 * copy (dirty) are written down now, in the background, so that their
 * eviction later is a free drop: towards NVMe only while it is idle, one at
 * a time, since a write in front of a read with a deadline costs a whole
 * transfer.  Clean copies are always dropped without I/O.  Copies that will
 * be used again before they would be evicted are never written early.
 *
 * ondemand drops (writing down when dirty) everything a phase used as soon
 * as the next marker arrives; lru keeps copies until space is needed and
 * then evicts the least recently used.  Neither prefetches.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/sched/admit.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "util/time-util.h"
#include "util/uring.h"

/* Transfers the scheduler keeps in flight per job and link: enough to keep it busy, few enough to stay EDF. */
#define NVME_INFLIGHT 3
#define PCIE_INFLIGHT 2

static const unsigned link_limit[_SCHED_LINK_MAX] = { NVME_INFLIGHT, PCIE_INFLIGHT };

typedef SchedCand Cand;

static SchedPolicyKind policy(const Sched *s) {
        return s->config->sched_policy;
}

/*
 * The scheduler's slots are per job: each job keeps its next transfers
 * queued at each link, where a fair queue by weight (uring.c for NVMe,
 * the engine for the VRAM link) decides who goes first.
 */
static void slot_take(Job *j, int link) {
        j->sched_inflight[link]++;
}

static void slot_put(Job *j, int link) {
        j->sched_inflight[link]--;
}

static bool slot_free(const Job *j, int link, const unsigned limit[]) {
        return j->sched_inflight[link] < limit[link];
}

/* Tiers in which a held phase (current or next) writes @t, as of this pass. */
static uint8_t written_in(const Sched *s, const Tensor *t) {
        return t->sched_pass == s->pass_no ? t->sched_written : 0;
}

/*
 * Another tier's copy of @t would go stale when a held phase's write lands:
 * it must not be brought in before that phase ends.
 */
static bool stale_soon(const Sched *s, const Tensor *t, int tier) {
        return (written_in(s, t) & ~(1u << tier)) != 0;
}

static void mark_writes(Plan *p, int h) {
        Sched *s = p->sched;
        PlanPhase *ph;

        if (!p->hold[h].active)
                return;
        ph = &p->phases[p->hold[h].phase];
        for (uint32_t i = 0; i < ph->n_acc; i++) {
                PlanAcc *a = &ph->acc[i];

                if (!(a->mode & PLAN_WRITE))
                        continue;
                if (a->tensor->sched_pass != s->pass_no) {
                        a->tensor->sched_pass = s->pass_no;
                        a->tensor->sched_written = 0;
                }
                a->tensor->sched_written |= (uint8_t) (1u << a->tier);
        }
}

void sched_charge(Job *j, uint64_t bytes) {
        j->vtime += (double) bytes / (double) MAX(j->weight, 1u);
}

/* ---- holds ---------------------------------------------------------------------------------------- */

/* Let hold @h's pin of access @i go; with @unpin the pin itself, dirty where the phase wrote (@written). */
static void hold_unpin_one(Plan *p, int h, uint32_t i, bool unpin, bool written) {
        PlanAcc *a = &p->phases[p->hold[h].phase].acc[i];
        Tensor *t = a->tensor;

        tensor_pin_account(t, a->tier, -1);
        if (a->mode == (PLAN_READ | PLAN_WRITE))
                t->rw_pins--;
        if (unpin) {
                /* written: the other plans' holds are told once the release is over (plan_notify_written()) */
                if (tensor_unpin(t, a->tier, written && (a->mode & PLAN_WRITE) != 0) == 0 && written &&
                    (a->mode & PLAN_WRITE))
                        t->sched_changed = true;
                if (a->mode & PLAN_WRITE)
                        copy_writers(t, a->tier, -1, p->rank);   /* after the version the write made */
                /* a write-only pin may have reserved the copy without the old bytes: unwritten, it holds nothing */
                if (!written && a->mode == PLAN_WRITE && t->copy[a->tier].pins == 0 && !t->xfer &&
                    !copy_is_sole(t, a->tier))
                        copy_free(t, a->tier);
        }
        p->hs[h].pinned[i] = false;
        p->hold[h].n_pinned--;
}

/*
 * Release hold @h: cancel its pins in flight and, with @unpin, drop the pins it
 * holds, dirtying what the phase may write when @written (a hold of a phase the
 * client has not entered was not written).
 */
static void hold_release(Plan *p, int h, bool unpin, bool written) {
        PlanHold *hold = &p->hold[h];
        HoldState *hs = &p->hs[h];

        if (!hold->active)
                return;
        for (uint32_t i = 0; i < p->phases[hold->phase].n_acc; i++) {
                if (hs->ops[i])
                        op_cancel(hs->ops[i]);  /* on_pin_cancelled() does the books */
                if (hs->pinned[i])
                        hold_unpin_one(p, h, i, unpin, written);
        }
        *hold = (PlanHold) {};
}

static void on_pin_done(Op *op, int status, const char *error) {
        PinCtx *ctx = op->userdata;
        Plan *p = ctx->plan;
        HoldState *hs = &p->hs[ctx->hold];
        PlanHold *hold = &p->hold[ctx->hold];
        PlanAcc *a = &p->phases[hold->phase].acc[ctx->idx];

        hs->ops[ctx->idx] = NULL;
        slot_put(p->job, ctx->link);
        if (status >= 0) {
                hs->pinned[ctx->idx] = true;
                hold->n_pinned++;
                tensor_pin_account(a->tensor, a->tier, +1);
                if (a->mode == (PLAN_READ | PLAN_WRITE))
                        a->tensor->rw_pins++;
                if (a->mode & PLAN_WRITE) {
                        copy_writers(a->tensor, a->tier, +1, p->rank);  /* before the phase can be said ready */
                }
                plan_slot_publish(p, a);
                engine_kick(p->sched->engine);
        } else if (plan_pin_waits(p, ctx->hold, a, status, error, op->kept))
                hs->blocked[ctx->idx] = p->sched->epoch;        /* retried when something is freed, unpinned
                                                                 * or moves, not in a busy loop */
}

static void on_pin_cancelled(Op *op) {
        PinCtx *ctx = op->userdata;

        ctx->plan->hs[ctx->hold].ops[ctx->idx] = NULL;
        slot_put(ctx->plan->job, ctx->link);
}

static void on_prefetch_cancelled(Op *op) {
        op->tensor->sched_op = NULL;
        slot_put(op->tensor->job, (int) (intptr_t) op->userdata);
}

static int access_link(Tensor *t, int tier, uint8_t mode) {
        if (mode == PLAN_WRITE)         /* nothing to bring: only making room uses a link, the one below */
                return tier == LEVEL_VRAM ? SCHED_LINK_PCIE : SCHED_LINK_NVME;
        if (tier == LEVEL_HOST)
                return copy_valid(t, LEVEL_VRAM) ? SCHED_LINK_PCIE : SCHED_LINK_NVME;
        return copy_valid(t, LEVEL_HOST) ? SCHED_LINK_PCIE : SCHED_LINK_NVME;
}

/* Candidates of one pass: a growing array, dropped silently when memory runs out (the next pass retries). */
typedef struct CandList {
        Cand *c;
        size_t n, cap;
} CandList;

static void add_cand(CandList *l, Cand c) {
        if (c.hold < 0 && c.tensor->job->frozen)
                return;         /* a rollback waits for the job's transfers: no prefetch of tierd's own */
        if (l->n == l->cap) {
                size_t nc = l->cap ? l->cap * 2 : 64;
                Cand *x = realloc(l->c, nc * sizeof(Cand));

                if (!x)
                        return;
                l->c = x;
                l->cap = nc;
        }
        l->c[l->n++] = c;
}

/* Pin what is already resident; collect the rest as candidates. */
static void hold_fill(Plan *p, int h, uint64_t deadline, CandList *cands) {
        PlanHold *hold = &p->hold[h];
        HoldState *hs = &p->hs[h];
        PlanPhase *ph = &p->phases[hold->phase];

        for (uint32_t i = 0; i < ph->n_acc; i++) {
                PlanAcc *a = &ph->acc[i];
                Tensor *t = a->tensor;
                Copy *c = &t->copy[a->tier];

                if (hs->pinned[i] || hs->ops[i] || hs->blocked[i] == p->sched->epoch)
                        continue;
                /* the next phase reads what the current one writes in another tier: only after it */
                if (h == 1 && p->hold[0].active && stale_soon(p->sched, t, a->tier))
                        continue;
                /* (a write whose committed data lies in memory only goes through an op: to NVMe first) */
                /* (a pin into room kept for other jobs' guarantees too: the op says why not, and it waits) */
                if (copy_valid(t, a->tier) && !t->xfer && !((a->mode & PLAN_WRITE) && tensor_needs_image(t)) &&
                    engine_pin_check(p->sched->engine, t, a->tier, NULL, 0) == 0) {
                        if (c->state == COPY_DRAINING)
                                copy_set_state(t, a->tier, COPY_RESIDENT);       /* wanted: cancel the drain */
                        c->pins++;
                        hs->pinned[i] = true;
                        hold->n_pinned++;
                        tensor_pin_account(t, a->tier, +1);
                        if (a->mode == (PLAN_READ | PLAN_WRITE))
                                t->rw_pins++;
                        if (a->mode & PLAN_WRITE) {
                                copy_writers(t, a->tier, +1, p->rank);
                        }
                        plan_slot_publish(p, a);
                        moves_used(p, t, a->tier);
                        continue;
                }
                add_cand(cands, (Cand) {
                        .plan = p, .job = p->job, .tensor = t, .tier = a->tier, .hold = h, .idx = i,
                        .deadline = deadline, .link = access_link(t, a->tier, a->mode),
                });
        }
}

static void hold_check_ready(Plan *p, int h) {
        PlanHold *hold = &p->hold[h];

        /* ready is a watermark: the next marker's phase only after the current one's */
        if (h == 1 && p->hold[0].active && !p->hold[0].ready_sent)
                return;
        if (hold->active && !hold->ready_sent && hold->n_pinned == p->phases[hold->phase].n_acc) {
                hold->ready_sent = true;
                plan_set_ready(p, hold->seq, hold->phase);
                /* its marker came first: the rank waited for it */
                if (trace_on(&p->sched->engine->trace) && hold->seq == p->seq)
                        trace_stall(&p->sched->engine->trace, p->job, p->trace_id, hold->seq, hold->phase,
                                    p->cur_mark_ns, now_ns());
        }
}

static void hold_start(Plan *p, int h, uint64_t seq, uint32_t phase) {
        p->hold[h] = (PlanHold) { .active = true, .seq = seq, .phase = phase };
        memset(p->hs[h].blocked, 0, p->max_acc * sizeof(uint64_t));
}

/* The next marker's hold (timeline), for the phase after the current one. */
static void hold_start_next(Plan *p) {
        hold_start(p, 1, p->seq + 1, p->cur == UINT32_MAX ? 0 : (p->cur + 1) % p->n_phases);
}

/*
 * Does the current phase wait for room (a pin of it found none, and none is in
 * flight)?  Then the next phase's hold must not keep copies pinned: they may be
 * the very room it needs (the job's limit holds both phases at most when each
 * fits alone), and nothing else would change while the client waits.
 */
static bool hold_starved(const Plan *p) {
        const PlanHold *hold = &p->hold[0];
        const HoldState *hs = &p->hs[0];

        if (!hold->active)
                return false;
        for (uint32_t i = 0; i < p->phases[hold->phase].n_acc; i++)
                if (!hs->pinned[i] && !hs->ops[i] && hs->blocked[i] != 0)
                        return true;
        return false;
}

/* Give the next phase's pins up for the current phase's sake; did any go? */
static bool hold_yield(Plan *p) {
        bool any = p->hold[1].n_pinned > 0;

        for (uint32_t i = 0; !any && p->hold[1].active && i < p->phases[p->hold[1].phase].n_acc; i++)
                any = p->hs[1].ops[i] != NULL;
        if (!any)
                return false;
        log_debug("sched: job '%s' phase %u waits for room: the next phase's pins are given up", p->job->name,
                  p->hold[0].phase);
        hold_release(p, 1, true, false);
        hold_start_next(p);
        return true;
}

/* ---- markers ------------------------------------------------------------------------------------------ */

/*
 * Take the client's newest marker from the plan page, if it wrote one we
 * have not seen: the previous phase's pins go and the marker's phase is
 * held.  Runs from the marker eventfd's source and, before each request of
 * the plan's connection, from sched_plan_sync(): whichever comes first
 * consumes the marker, the other finds nothing new.
 */
static void plan_consume_marker(Plan *p) {
        Sched *s = p->sched;
        uint64_t seq, mark;
        uint32_t phase, prev = p->cur, done, passed = UINT32_MAX;
        int r;

        r = plan_read_marker(p, now_ns(), &seq, &phase, &mark);
        if (r == -EINVAL)
                plan_set_error(p, -EINVAL, "marker names a phase the plan does not have");
        if (r < 0)
                return;
        plan_learn(p, seq, phase, mark);
        if (trace_on(&s->engine->trace))
                trace_phase(&s->engine->trace, p->job, p->trace_id, seq, phase, mark);

        log_debug("sched: job '%s' marker %" PRIu64 ": phase %u", p->job->name, seq, phase);
        /*
         * the previous marker's phase is over: its pins go, written accesses dirty if the phase was
         * said ready (else its client got an error or nothing, and wrote nothing: a write-only pin
         * there holds no data, the reservation's garbage)
         */
        done = p->hold[0].active && !p->hold[0].refused ? p->hold[0].phase : UINT32_MAX;   /* (refused: never ran) */
        hold_release(p, 0, true, p->hold[0].ready_sent);
        if (prev != UINT32_MAX && policy(s) == SCHED_POLICY_ONDEMAND)
                plan_release_after_use(p, prev, phase);

        if (p->hold[1].active && p->hold[1].seq == seq && p->hold[1].phase == phase) {
                /* pinned ahead: it becomes the current hold */
                HoldState tmp = p->hs[0];

                p->hold[0] = p->hold[1];
                p->hs[0] = p->hs[1];
                p->hs[1] = tmp;
                for (uint32_t i = 0; i < p->max_acc; i++) {
                        p->hs[0].ctx[i].hold = 0;
                        p->hs[1].ctx[i].hold = 1;
                }
                p->hold[1] = (PlanHold) {};
        } else {
                /*
                 * The client went elsewhere (this marker is the one the hold was
                 * for: it never entered the held phase, which wrote nothing, and a
                 * write-only pin there holds no data), or through that phase and
                 * on before we read its marker (markers can be skipped: that phase
                 * was ready, so it may have written there)
                 */
                if (p->hold[1].active && seq > p->hold[1].seq)
                        passed = p->hold[1].phase;      /* gone through: it is over too */
                hold_release(p, 1, true, seq > p->hold[1].seq);
                if (!s->stopping)
                        hold_start(p, 0, seq, phase);
        }
        p->seq = seq;
        p->cur = phase;
        p->cur_mark_ns = mark;
        if (policy(s) == SCHED_POLICY_TIMELINE) {
                /* what the phases over (the last one, and one pinned ahead the client went through) leave dead */
                if (done != UINT32_MAX)
                        plan_drop_dead(p, done);
                if (passed != UINT32_MAX && passed != done)
                        plan_drop_dead(p, passed);
        }
        plan_log_residency(p);
        plan_notify_written(p);
        s->epoch++;
        engine_kick(s->engine);
}

static int on_marker(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        plan_consume_marker(userdata);
        return 0;
}

void sched_plan_sync(Plan *p) {
        if (p)
                plan_consume_marker(p);
}

/* Does hold @h, of a phase its client has not entered, pin for reading in access @i a copy of @t older than @t? */
static bool held_stale(const Plan *p, int h, uint32_t i, const Tensor *t) {
        const PlanAcc *a;

        if (!p->hold[h].active || p->hold[h].seq <= p->seq || i >= p->phases[p->hold[h].phase].n_acc)
                return false;
        a = &p->phases[p->hold[h].phase].acc[i];
        return a->tensor == t && p->hs[h].pinned[i] && (a->mode & PLAN_READ) && t->copy[a->tier].version != t->version;
}

void sched_tensor_changed(Sched *s, Tensor *t) {
        list_for_each_safe(node, tmp, &s->plans) {
                Plan *p = list_entry(node, Plan, link);
                bool stale = false;

                for (int h = 0; h < 2 && p->job == t->job; h++)
                        for (uint32_t i = 0; i < p->max_acc; i++)
                                stale = stale || held_stale(p, h, i, t);
                if (!stale)
                        continue;
                /*
                 * A ready said for a held phase goes back to the one before (none before the first
                 * marker), then the client's marker is looked for: tier_phase_enter() stores its marker before
                 * it reads the ready (a system call between: a barrier), so either the client waits for
                 * a new ready or its marker is seen here and the hold it entered is left alone.
                 */
                for (int h = 1; h >= 0; h--)
                        if (p->hold[h].active && p->hold[h].seq > p->seq && p->hold[h].ready_sent) {
                                p->hold[h].ready_sent = false;
                                plan_set_ready(p, h ? p->hold[0].seq : 0, h ? p->hold[0].phase : 0);
                                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                        }
                plan_consume_marker(p);
                for (int h = 0; h < 2; h++)
                        for (uint32_t i = 0; i < p->max_acc; i++)
                                if (held_stale(p, h, i, t)) {
                                        log_debug("sched: job '%s' '%s', held for phase %u, went stale (written "
                                                  "outside the plan): pinned again", p->job->name, t->name,
                                                  p->hold[h].phase);
                                        hold_unpin_one(p, h, i, true, false);
                                }
                for (int h = 0; h < 2; h++)
                        hold_check_ready(p, h);         /* what kept its pins, or the marker made current */
                s->epoch++;
                engine_kick(s->engine);
        }
}

bool sched_plan_holds(const Plan *p) {
        return p->hold[0].active || p->hold[1].active;
}

void sched_stop(Sched *s) {
        s->stopping = true;
        list_for_each_safe(node, tmp, &s->plans) {
                Plan *p = list_entry(node, Plan, link);

                for (int h = 1; h >= 0; h--)
                        if (p->hold[h].active && !p->hold[h].ready_sent)
                                hold_release(p, h, true, false);
        }
}

/* ---- the pass ---------------------------------------------------------------------------------------- */

static int cand_cmp(const void *a, const void *b) {
        const Cand *x = a, *y = b;

        return x->deadline < y->deadline ? -1 : x->deadline > y->deadline;
}

/* Which NVMe copy @t has: a copy written anew has new extents (or new crcs); 0: none. */
static uint64_t nvme_copy_id(const Tensor *t) {
        const Copy *c = &t->copy[LEVEL_NVME];

        if (c->state == COPY_ABSENT || c->n_extents == 0)
                return 0;
        return ((uint64_t) c->extents[0].crc << 32 | c->extents[0].target) ^ (c->extents[0].unit + 1);
}

/* A prefetch of @t failed for good (not for room): the same read would fail the same way. */
static bool prefetch_failed(const Tensor *t) {
        return t->sched_failed == t->version + 1 && t->sched_failed_src == nvme_copy_id(t);
}

static void on_prefetch_done(Op *op, int status, const char *error) {
        Tensor *t = op->tensor;
        Sched *s = op->engine->sched_userdata;         /* the engine's scheduler: us */
        int link = (int) (intptr_t) op->userdata;

        t->sched_op = NULL;
        slot_put(t->job, link);
        if (status == -EAGAIN || status == -ENOSPC || status == -EBUSY)
                t->sched_blocked = s->epoch;    /* (-EBUSY: a stale copy still pinned, until it is unpinned) */
        else if (status < 0 && op->kind == OP_PREFETCH) {
                /* not again until it is written or its NVMe copy is: the plan's own pin reports the error */
                t->sched_failed = t->version + 1;
                t->sched_failed_src = nvme_copy_id(t);
        }
        /*
         * Write-behind copies a version once per tier: if room below runs short
         * and its copy there is dropped again (it is no sole copy), cleaning it
         * anew would copy the same bytes over and over.
         */
        if (op->kind == OP_CLEAN && status >= 0 && op->tier >= 0 && op->tier < TIERS)
                t->sched_cleaned[op->tier] = t->version;
        if (op->kind == OP_PREFETCH && status >= 0 && t->plan)
                moves_landed(t->plan, t, op->tier);
        log_debug("sched: '%s' %s done: %d (%s)", t->name, op->kind == OP_CLEAN ? "clean" : "prefetch", status,
                  error ? error : "");
        if (status >= 0)
                engine_kick(op->engine);
}

static bool cand_pending(const Cand *c, const Cand *all, size_t n) {
        /* a prefetch for a tensor that already has a candidate earlier in the list is a duplicate */
        for (size_t i = 0; i < n && &all[i] != c; i++)
                if (all[i].tensor == c->tensor && all[i].tier <= c->tier)
                        return true;
        return false;
}

static uint8_t cand_mode(const Cand *c) {
        const PlanHold *h = &c->plan->hold[c->hold];

        return c->plan->phases[h->phase].acc[c->idx].mode;
}

static void issue(Sched *s, Cand *c) {
        Job *j = c->plan->job;
        Op *op = NULL;
        MoveWhy why;
        int r;

        if (c->hold >= 0) {
                HoldState *hs = &c->plan->hs[c->hold];
                PinCtx *ctx = &hs->ctx[c->idx];

                *ctx = (PinCtx) { .plan = c->plan, .hold = c->hold, .idx = c->idx, .link = c->link };
                r = op_submit(s->engine, OP_PIN, c->tensor, c->tier, on_pin_done, NULL, ctx, &op);
                if (r < 0)
                        return;
                /*
                 * The current phase's pin is needed now: any copy it does not pin may
                 * make room for it (a prediction that puts another use "sooner" than
                 * now is late, and keeping for it would leave the client waiting with
                 * nothing left to change).
                 */
                op->deadline_ns = c->hold == 0 ? 0 : c->deadline;
                /* a write-only access overwrites the tensor: no need to bring its old bytes */
                op->discard = cand_mode(c) == PLAN_WRITE;
                op->write = (cand_mode(c) & PLAN_WRITE) != 0;
                op->plan_rank1 = c->plan->rank + 1;
                op->cancelled = on_pin_cancelled;
                hs->ops[c->idx] = op;
        } else {
                r = op_submit(s->engine, OP_PREFETCH, c->tensor, c->tier, on_prefetch_done, NULL,
                              (void *) (intptr_t) c->link, &op);
                if (r < 0)
                        return;
                op->deadline_ns = c->deadline;
                op->no_wait = true;
                op->internal = true;    /* no client waits: freeing the tensor cancels it */
                op->cancelled = on_prefetch_cancelled;
                c->tensor->sched_op = op;
        }
        /* a pin joining a transfer in flight moves nothing; a prefetch is noted when its copy lands */
        if (c->hold >= 0 && c->tensor->copy[c->tier].state == COPY_ABSENT) {
                why = moves_check(c->plan, c->tensor, c->tier, true);
                if (why != MOVE_FIRST) {
                        c->plan->moves_repeated++;
                        log_debug("sched: job '%s' moves '%s' to %s %s", j->name, c->tensor->name,
                                  level_to_string(c->tier), move_why_to_string(why));
                }
                moves_note(c->plan, c->tensor, c->tier, true);
        } else if (c->hold >= 0)
                moves_used(c->plan, c->tensor, c->tier);
        slot_take(j, c->link);
        sched_charge(j, c->tensor->alloc_size);
        if (s->trace)
                s->trace(s->trace_userdata, c->hold >= 0 ? "pin" : "prefetch", c->tensor, c->tier, c->deadline);
        if (trace_on(&s->engine->trace))
                trace_decision(&s->engine->trace, c->tensor, c->tier, c->hold == 0 ? TRACE_WHY_PIN_NOW :
                               c->hold == 1 ? TRACE_WHY_PIN_NEXT : TRACE_WHY_PREFETCH, c->deadline, 0, now_ns());
        log_debug("sched: job '%s' %s '%s' -> %s (hold %d, deadline in %.3f ms, link %s)", j->name,
                  c->hold >= 0 ? "pin" : "prefetch", c->tensor->name, level_to_string(c->tier), c->hold,
                  ((double) c->deadline - (double) now_ns()) / 1e6, c->link == SCHED_LINK_NVME ? "nvme" : "pcie");
}

static void collect_prefetch(Plan *p, CandList *cands, uint64_t now) {
        Sched *s = p->sched;
        uint32_t cur = plan_cur(p), horizon;

        plan_window(p);
        /*
         * Phases after the one pinned ahead, as far as the windows reach, or
         * farther where reads must start early (admit_horizon()); beyond the
         * windows the occupancy simulation alone admits them (admit()).
         */
        horizon = MAX(MAX(p->window[0], p->window[1]), admit_horizon(p, now, admit_nvme_bw(s)));
        for (uint32_t k = 2; k <= horizon && k < p->n_phases; k++) {
                PlanPhase *ph = &p->phases[(cur + k) % p->n_phases];

                for (uint32_t i = 0; i < ph->n_acc; i++) {
                        PlanAcc *a = &ph->acc[i];
                        Tensor *t = a->tensor;
                        int tier = a->tier;

                        if (a->mode == PLAN_WRITE || copy_valid(t, tier))
                                continue;       /* overwritten whole (the pin takes the room), or there already */
                        if (tier == LEVEL_VRAM && k > p->window[0])
                                tier = LEVEL_HOST;       /* beyond the vram window: stage it in host memory */
                        if (t->sched_op || t->xfer || copy_valid(t, tier) || stale_soon(s, t, tier) ||
                            t->sched_blocked == s->epoch || prefetch_failed(t))
                                continue;
                        if (tensor_is_blank(t) || t->lost)
                                continue;       /* zeros or dead bytes: nothing to move; lost: nothing to bring */
                        if (sched_next_access_overwrites(t))
                                continue;       /* written whole before this read: the old bytes are not needed */
                        add_cand(cands, (Cand) {
                                .plan = p, .job = p->job, .tensor = t, .tier = tier, .hold = -1, .idx = i,
                                .deadline = p->pred[k], .ahead = k, .link = access_link(t, tier, PLAN_READ),
                        });
                }
        }
}

/* Start write-behind of @t's sole copy in @tier (op OP_CLEAN, opportunistic).  true when started. */
static bool clean_start(Sched *s, Tensor *t, int tier, int link) {
        Op *op = NULL;

        if (op_submit(s->engine, OP_CLEAN, t, tier, on_prefetch_done, NULL, (void *) (intptr_t) link, &op) < 0)
                return false;
        op->cancelled = on_prefetch_cancelled;
        op->deadline_ns = sched_next_use_ns(t, tier + 1);
        op->no_wait = true;     /* opportunistic: never waits for room */
        sched_charge(t->job, t->alloc_size);
        t->sched_op = op;
        slot_take(t->job, link);
        if (s->trace)
                s->trace(s->trace_userdata, "clean", t, tier, 0);
        if (trace_on(&s->engine->trace))
                trace_decision(&s->engine->trace, t, tier, TRACE_WHY_CLEAN, op->deadline_ns, 0, now_ns());
        return true;
}

static void write_behind(Sched *s, Plan *p) {
        Job *j = p->job;

        for (int tier = LEVEL_VRAM; tier <= LEVEL_HOST; tier++) {
                int link = tier == LEVEL_VRAM ? SCHED_LINK_PCIE : SCHED_LINK_NVME;
                uint64_t need = p->need[tier], free_bytes, got = 0;
                _cleanup_free_ Tensor **v = NULL;
                size_t n = 0, k;

                free_bytes = j->limit[tier] > j->used[tier] ? j->limit[tier] - j->used[tier] : 0;
                /* towards NVMe the occupancy simulation finds the rest (admit_evicted()) */
                if ((need <= free_bytes && tier != LEVEL_HOST) || !slot_free(j, link, link_limit))
                        continue;
                /*
                 * Writes to NVMe only while it is idle: a write in its way would delay a
                 * read with a deadline by a whole transfer, and a copy cleaned early may
                 * stay after all (the prediction of victims is not exact).
                 */
                if (tier == LEVEL_HOST && (j->sched_inflight[link] > 0 || uring_busy(s->uring)))
                        continue;
                /* the copies the engine would take, in its order: what a drain would write if not we */
                if (engine_victims(s->engine, j, tier, NULL, &v, &n) < 0)
                        return;
                k = sched_clean_order(s, tier, v, n);
                for (size_t i = 0; i < k && (got + free_bytes < need || tier == LEVEL_HOST); i++) {
                        Tensor *t = v[i];
                        bool for_window = got + free_bytes < need;

                        got += t->alloc_size;
                        if (!sched_may_clean(s, t, tier))
                                continue;
                        /*
                         * Beyond the window's need: a dirty host copy that the plan's
                         * future will evict before its next use anyway is written now,
                         * while NVMe is idle, instead of as a drain in a read's way.
                         */
                        uint64_t sims = s->admit_sims;

                        if (!for_window && (!t->plan || !admit_evicted(t->plan, t, tier))) {
                                /* one of this plan's that the replay keeps: so it does those after it (admit.h) */
                                if (t->plan == p && s->admit_sims != sims)
                                        break;
                                continue;
                        }
                        if (!slot_free(j, link, link_limit))
                                break;
                        /* towards NVMe one at a time: a read arriving waits for one write at most */
                        if (clean_start(s, t, tier, link) && tier == LEVEL_HOST)
                                break;
                }
        }
}

void sched_run(Sched *s) {
        CandList cands = {};
        uint64_t now = now_ns();
        double min_vt = -1;

        if (list_empty(&s->plans) || s->in_run || s->stopping)
                return;
        s->in_run = true;
        s->pass_no++;

        /* what the held phases write, so nothing is fetched that their writes would make stale */
        list_for_each_safe(node, tmp, &s->plans) {
                Plan *p = list_entry(node, Plan, link);

                if (policy(s) == SCHED_POLICY_TIMELINE && !p->hold[1].active && !p->error)
                        hold_start_next(p);
                mark_writes(p, 0);
                mark_writes(p, 1);
        }

        list_for_each_safe(node, tmp, &s->plans) {
                Plan *p = list_entry(node, Plan, link);

                bool starved;

                if (p->error)
                        continue;
                if (p->hold[0].refused && !p->hold[0].refused_told) {
                        PlanHold was = p->hold[0];      /* room its own client pins (selfpin.c) */

                        hold_release(p, 0, true, false);        /* its pins go, clean; it stays, as the */
                        p->hold[0] = was;               /* watermark: nothing after it is said ready */
                        p->hold[0].n_pinned = 0;
                        p->hold[0].refused_told = true;
                        plan_refuse(p, was.seq, was.phase, was.refused);
                        s->epoch++;
                }
                plan_predict(p, now);
                starved = policy(s) == SCHED_POLICY_TIMELINE && hold_starved(p);
                if (starved && hold_yield(p))
                        s->epoch++;     /* room may have come free: the blocked pins retry now */
                /* the current marker's phase (demand: deadline now) */
                if (p->hold[0].active && !p->hold[0].refused) {
                        hold_fill(p, 0, now, &cands);
                        hold_check_ready(p, 0);
                }
                if (policy(s) == SCHED_POLICY_TIMELINE) {
                        if (!p->hold[1].active)
                                hold_start_next(p);
                        if (!starved) {
                                hold_fill(p, 1, p->pred[1], &cands);
                                hold_check_ready(p, 1);
                        }
                        collect_prefetch(p, &cands, now);
                }
        }

        if (cands.n > 1)
                qsort(cands.c, cands.n, sizeof(Cand), cand_cmp);

        /* fair share: jobs that come back to the queue start at the current minimum virtual time */
        for (size_t i = 0; i < cands.n; i++)
                if (min_vt < 0 || cands.c[i].job->vtime < min_vt)
                        min_vt = cands.c[i].job->vtime;

        for (;;) {
                size_t pick = sched_pick(cands.c, cands.n, now, link_limit);
                Cand *c;

                if (pick == SIZE_MAX)
                        break;
                c = &cands.c[pick];
                c->taken = true;
                if (c->hold < 0 && (cand_pending(c, cands.c, cands.n) || c->tensor->sched_op))
                        continue;
                if (c->job->vtime < min_vt)
                        c->job->vtime = min_vt;
                /* far prefetch into full VRAM: stage it in host memory instead */
                if (c->hold < 0 && c->tier == LEVEL_VRAM &&
                    c->job->used[LEVEL_VRAM] + c->tensor->alloc_size > c->job->limit[LEVEL_VRAM]) {
                        if (copy_valid(c->tensor, LEVEL_HOST))
                                continue;
                        c->tier = LEVEL_HOST;
                }
                if (c->hold < 0 && !sched_admit(s, c))
                        continue;
                issue(s, c);
        }

        if (policy(s) == SCHED_POLICY_TIMELINE)
                list_for_each_safe(node, tmp, &s->plans) {
                        Plan *p = list_entry(node, Plan, link);

                        if (!p->error)
                                write_behind(s, p);
                }
        free(cands.c);
        s->in_run = false;
}

/* ---- plans: start and end ------------------------------------------------------------------------------- */

int sched_plan_new(Sched *s, Job *j, int efd, const PlanSpec *spec, Plan **ret, char *error, size_t esize) {
        Plan *p;
        int r;

        r = plan_new(s, j, efd, spec, policy(s) == SCHED_POLICY_TIMELINE, &p, error, esize);
        if (r < 0)
                return r;
        r = sd_event_add_io(s->event, &p->marker_source, p->marker_fd, EPOLLIN, on_marker, p);
        if (r < 0) {
                plan_free(p);
                return r;
        }
        (void) sd_event_source_set_description(p->marker_source, "plan-marker");

        for (uint32_t i = 0; i < p->n_slots; i++) {
                Tensor *t = p->slots[i];

                t->plan_refs++;
                if (!t->plan) {
                        t->plan = p;
                        t->plan_slot = i;
                }
        }
        p->attached = true;
        p->trace_id = ++s->engine->trace.next_plan;    /* numbered whether a trace runs or not */
        list_add_tail(&s->plans, &p->link);
        list_add_tail(&j->plans, &p->job_link);
        engine_kick(s->engine);
        *ret = p;
        return 0;
}

void sched_plan_free(Plan *p) {
        uint64_t marked;
        uint32_t phase;

        if (!p)
                return;
        /*
         * Its pins go as dirty where the plan writes, in a phase the client may have written: one said
         * ready to it, and the hold ahead if its marker names that phase (or a later marker follows:
         * the client could pass that seq only through the phase said ready), as plan_consume_marker()
         * would have found.  Another phase's write-only pin holds no data (it was reserved without
         * the old bytes): it goes unwritten.
         */
        plan_peek_marker(p, &marked, &phase);
        hold_release(p, 0, true, p->hold[0].ready_sent);
        hold_release(p, 1, true, p->hold[1].ready_sent && (marked > p->hold[1].seq ||
                                                           (marked == p->hold[1].seq && phase == p->hold[1].phase)));
        if (p->attached) {
                for (uint32_t i = 0; i < p->n_slots; i++) {
                        Tensor *t = p->slots[i];

                        if (t->plan_refs > 0)
                                t->plan_refs--;
                        if (t->plan == p)
                                t->plan = NULL;
                }
                list_del(&p->link);
                list_del(&p->job_link);
                /* a tensor another plan of the job names too is that plan's now (next-use predictions) */
                list_for_each_safe(node, tmp, &p->job->plans) {
                        Plan *q = list_entry(node, Plan, job_link);

                        for (uint32_t i = 0; i < q->n_slots; i++)
                                if (!q->slots[i]->plan) {
                                        q->slots[i]->plan = q;
                                        q->slots[i]->plan_slot = i;
                                }
                }
                plan_notify_written(p);         /* to the other plans: this one is out of the list */
        }
        plan_free(p);
}

/* ---- the scheduler ---------------------------------------------------------------------------------------- */

static bool ops_overwrites_next(void *userdata, Tensor *t) {
        return sched_drops_dead(t);
}

static void ops_charge(void *userdata, Job *j, uint64_t bytes) {
        sched_charge(j, bytes);
}

static void ops_changed(void *userdata) {
        Sched *s = userdata;

        s->epoch++;
        if (!list_empty(&s->plans))
                engine_kick(s->engine);
}

static void ops_pass(void *userdata) {
        sched_run(userdata);
}

static uint64_t ops_next_use(void *userdata, Tensor *t, int tier) {
        return sched_next_use_ns(t, tier);
}

static const EngineSchedOps sched_engine_ops = {
        .victim_order = sched_ops_victim_order,
        .victim_take = sched_ops_victim_take,
        .victims_lru = sched_ops_victims_lru,
        .overwrites_next = ops_overwrites_next,
        .charge = ops_charge,
        .changed = ops_changed,
        .pass = ops_pass,
        .next_use = ops_next_use,
};

int sched_new(sd_event *event, const Config *config, Registry *registry, Engine *engine, Uring *uring,
              VramBackend *vram, Sched **ret) {
        Sched *s = calloc(1, sizeof(*s));

        if (!s)
                return -ENOMEM;
        *s = (Sched) {
                .event = event,
                .config = config,
                .registry = registry,
                .engine = engine,
                .uring = uring,
                .vram = vram,
                .epoch = 1,
        };
        list_init(&s->plans);
        engine_set_sched(engine, &sched_engine_ops, s);
        *ret = s;
        return 0;
}

void sched_set_trace(Sched *s, SchedTrace trace, void *userdata) {
        s->trace = trace;
        s->trace_userdata = userdata;
}

Sched *sched_free(Sched *s) {
        if (!s)
                return NULL;
        list_for_each_safe(node, tmp, &s->plans)
                sched_plan_free(list_entry(node, Plan, link));
        if (s->engine && s->engine->sched == &sched_engine_ops)
                engine_set_sched(s->engine, NULL, NULL);
        free(s);
        return NULL;
}
