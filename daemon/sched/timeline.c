/* SPDX-License-Identifier: MIT */
/* timeline.c: the shared scheduling timeline: plans, deadlines, victims, fair share. */

/*
 * Theory of operation.
 *
 * A connection (one rank) may submit an iteration plan: a cyclic list of
 * phases, each naming the tensors it touches, the tier it needs them in
 * and how (read, write).  The rank then marks phase boundaries through a
 * shared page (proto/plan.h): writing the marker and kicking an eventfd
 * costs no round trip, and it waits only when tierd has not yet said that
 * the phase may run.  From the marker timestamps tierd learns each phase's
 * duration (an exponential moving average), which turns every plan into a
 * prediction of when each future access happens: the shared timeline.
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
 * evicted again before its use).  Each gets the predicted start of its
 * phase as a deadline.  Candidates are issued earliest deadline first, at
 * most a few per job and link at a time (so that the link's bandwidth goes
 * to the earliest deadline instead of being split); when deadlines collide
 * (all within a short window, as when a link is saturated) the job with the
 * smallest virtual time wins and is charged bytes / weight.  Below, each
 * link has a fair queue by weight (uring.c, mover.c), so that drains and
 * demand transfers are shared by weight too.  A prefetch only evicts copies
 * whose next use is later than its own deadline (Belady's rule, exact here
 * because the future is known), farthest first, weighed by the cost of
 * dropping (a sole copy costs a write and a read back); when no such victim
 * exists it is not issued now and is retried when something moves.  When
 * VRAM is full for a far access, the tensor is staged in host memory
 * instead, so the NVMe hop of the chain happens early and the host->VRAM
 * hop later.  What a plan overwrites next without reading is dead: its
 * copies are dropped when its last reader is done (plan_drop_dead()).
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
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/engine/mover.h"
#include "daemon/sched/timeline.h"
#include "daemon/ipc/server.h"
#include "daemon/state/tensormap.h"
#include "daemon/tiers/uring.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "tier.pb-c.h"

/* Transfers the scheduler keeps in flight per link: enough to keep it busy, few enough to stay EDF. */
#define NVME_INFLIGHT 3
#define PCIE_INFLIGHT 2
/* Deadlines this close together count as colliding: fair share decides. */
#define COLLIDE_NS (1000000ull)
/* A phase whose duration is not known yet is assumed to take this long. */
#define DEFAULT_PHASE_NS (1000000ull)
/* Weight of a new sample in a phase's moving average (1/4). */
#define EMA_SHIFT 2

#define SLINK_NVME SCHED_LINK_NVME
#define SLINK_PCIE SCHED_LINK_PCIE
#define _SLINK_MAX _SCHED_LINK_MAX

static const unsigned link_limit[_SCHED_LINK_MAX] = { NVME_INFLIGHT, PCIE_INFLIGHT };
/*
 * The scheduler's slots are per job: each job keeps its next transfers
 * queued at each link, where a fair queue by weight (uring.c for NVMe,
 * mover.c for the VRAM link) decides who goes first.
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

typedef struct PinCtx {
        Plan *plan;
        int hold;
        uint32_t idx;
        int link;
} PinCtx;

typedef SchedCand Cand;

/* Per-hold bookkeeping, sized by the plan's largest phase. */
typedef struct HoldState {
        bool *pinned;
        Op **ops;
        PinCtx *ctx;
        uint64_t *blocked;      /* epoch in which the pin found no space */
} HoldState;

typedef struct PlanPriv {
        HoldState hs[2];
        uint32_t max_acc;
        uint64_t *pred;         /* predicted start of phase cur+n, n = 0..P */
        uint8_t *wmark;         /* per slot: counted in the vram (bit 0) / host (bit 1) / both together (bit 2) window */
        uint32_t window[2];     /* phases ahead whose working set fits vram / host (plan_window) */
        uint64_t need[2];       /* bytes those phases and the one after bring into vram / host */
} PlanPriv;

void (*sched_trace)(const char *what, const Tensor *t, int tier, uint64_t deadline_ns) = NULL;

static List plans = LIST_INIT(plans);
static bool in_run;
static uint64_t pass_no;
/* Bumped whenever space may have been freed or data moved: blocked prefetches retry then. */
static uint64_t epoch = 1;

/* Tiers in which a held phase (current or next) writes @t, as of this pass. */
static uint8_t written_in(const Tensor *t) {
        return t->sched_pass == pass_no ? t->sched_written : 0;
}

/*
 * Another tier's copy of @t would go stale when a held phase's write lands:
 * it must not be brought in before that phase ends.
 */
static bool stale_soon(const Tensor *t, int tier) {
        return (written_in(t) & ~(1u << tier)) != 0;
}

static void mark_writes(Plan *p, int h) {
        PlanPhase *ph;

        if (!p->hold[h].active)
                return;
        ph = &p->phases[p->hold[h].phase];
        for (uint32_t i = 0; i < ph->n_acc; i++) {
                PlanAcc *a = &ph->acc[i];

                if (!(a->mode & PLAN_WRITE))
                        continue;
                if (a->tensor->sched_pass != pass_no) {
                        a->tensor->sched_pass = pass_no;
                        a->tensor->sched_written = 0;
                }
                a->tensor->sched_written |= (uint8_t) (1u << a->tier);
        }
}

uint64_t mono_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ull + (uint64_t) ts.tv_nsec;
}

static PlanPriv *priv(Plan *p) {
        return (PlanPriv *) (p + 1);
}

static SchedPolicyKind policy(Manager *m) {
        return m->config.sched_policy;
}

/* ---- predictions ------------------------------------------------------------------------ */

static uint64_t phase_ns(const Plan *p, uint32_t ph) {
        return p->phases[ph].samples ? p->phases[ph].ema_ns : DEFAULT_PHASE_NS;
}

/* pred[n]: predicted start of the phase n markers after the current one. */
static void plan_predict(Plan *p) {
        PlanPriv *pp = priv(p);
        uint64_t now = mono_ns(), t;
        uint32_t cur = p->cur == UINT32_MAX ? p->n_phases - 1 : p->cur;

        t = p->cur == UINT32_MAX ? now : MAX(p->cur_mark_ns, now - MIN(now, phase_ns(p, cur)));
        pp->pred[0] = t;
        for (uint32_t n = 1; n <= p->n_phases; n++) {
                t += phase_ns(p, (cur + n - 1) % p->n_phases);
                pp->pred[n] = MAX(t, now);
        }
}

/* Classes of the next-use index: accesses in vram, in vram or host (a vram access stages through host), in host. */
enum { USE_VRAM, USE_ANY, USE_HOST, _USE_MAX };

/* Predicted time of the next use of @t in class @c (USE_*) by plan @p, after its current phase. */
static uint64_t next_use_class(Plan *p, Tensor *t, int c) {
        uint32_t s = t->plan_slot, lo = p->use_off[c][s], hi = p->use_off[c][s + 1];
        uint32_t cur = p->cur == UINT32_MAX ? p->n_phases - 1 : p->cur, best = UINT32_MAX;

        if (lo == hi)
                return UINT64_MAX;
        for (uint32_t i = lo; i < hi; i++) {
                uint32_t n = (p->use_phase[c][i] + p->n_phases - cur) % p->n_phases;

                if (n == 0)
                        n = p->n_phases;
                best = MIN(best, n);
        }
        return priv(p)->pred[best];
}

/* Predicted time of the next use of @t's copy in @tier (vram, or host and what stages through it). */
static uint64_t next_use(Plan *p, Tensor *t, int tier) {
        return next_use_class(p, t, tier == TIER_VRAM ? USE_VRAM : USE_ANY);
}

/* Mode of the first access of @t by @p in the phases after @from (and in @from too if @inclusive); 0: none. */
static uint8_t next_access_mode(Plan *p, Tensor *t, uint32_t from, bool inclusive) {
        uint32_t s = t->plan_slot, best = UINT32_MAX;
        uint8_t mode = 0;

        for (uint32_t i = p->acc_off[s]; i < p->acc_off[s + 1]; i++) {
                uint32_t n = (p->acc_phase[i] + p->n_phases - from) % p->n_phases;

                if (n == 0 && !inclusive)
                        n = p->n_phases;
                if (n < best) {
                        best = n;
                        mode = p->acc_mode[i];
                }
        }
        return mode;
}

bool sched_next_access_overwrites(Tensor *t) {
        Plan *p = t->plan;

        /* only what one plan alone names: another plan may read it meanwhile */
        if (!p || p->manager->config.sched_policy != SCHED_POLICY_TIMELINE || p->cur == UINT32_MAX ||
            t->plan_refs != 1)
                return false;
        /* the first phase after the current one that touches it, in any tier */
        return next_access_mode(p, t, p->cur, false) == PLAN_WRITE;
}

uint64_t sched_next_use_ns(Tensor *t, int tier) {
        uint64_t nu;

        if (!t->plan || t->plan->manager->config.sched_policy != SCHED_POLICY_TIMELINE)
                return 0;
        nu = next_use(t->plan, t, tier > TIER_HOST ? TIER_HOST : tier);
        return nu == UINT64_MAX ? 0 : nu;
}

typedef struct Victim {
        Tensor *t;
        uint64_t next;
        double score;           /* time to the next use / cost of dropping: higher goes first */
        uint64_t last_use;
} Victim;

static int victim_cmp(const void *a, const void *b) {
        const Victim *x = a, *y = b;

        if (x->score != y->score)
                return x->score > y->score ? -1 : 1;
        return x->last_use < y->last_use ? -1 : x->last_use > y->last_use;
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
        if (tier == TIER_HOST && copy_valid(t, TIER_VRAM))
                return next_use_class(t->plan, t, USE_HOST);
        return next_use(t->plan, t, tier);
}

size_t sched_victim_order(Manager *m, int tier, Tensor **cands, size_t n, uint64_t deadline_ns) {
        Victim *v;
        size_t k = 0;
        uint64_t now;

        if (policy(m) != SCHED_POLICY_TIMELINE || n == 0)
                return n;       /* already least recently used first */
        v = calloc(n, sizeof(*v));
        if (!v)
                return n;
        now = mono_ns();
        for (size_t i = 0; i < n; i++) {
                Tensor *t = cands[i];
                uint64_t nu = victim_next_use(t, tier);
                double score;

                if (deadline_ns > 0 && nu <= deadline_ns)
                        continue;       /* needed before the requester: keep it */
                /*
                 * Belady's farthest next use, weighed by what dropping costs: a sole
                 * copy is written down and read back (two transfers), another only
                 * read back (one), so a clean copy goes before a dirty one needed
                 * up to twice as late.
                 */
                score = nu == UINT64_MAX ? INFINITY : (double) (nu > now ? nu - now : 0);
                if (copy_is_sole(t, tier))
                        score /= 2;
                v[k++] = (Victim) { t, nu, score, t->copy[tier].last_use };
        }
        qsort(v, k, sizeof(*v), victim_cmp);
        for (size_t i = 0; i < k; i++)
                cands[i] = v[i].t;
        free(v);
        return k;
}

/* ---- the page ---------------------------------------------------------------------------------- */

static void plan_set_ready(Plan *p, uint64_t seq, uint32_t phase) {
        uint64_t one = 1;

        __atomic_store_n(&p->page->daemon.ready, PLAN_READY(seq, phase), __ATOMIC_RELEASE);
        if (p->conn && p->conn->efd >= 0)
                (void) write(p->conn->efd, &one, sizeof(one));
}

static void plan_set_error(Plan *p, int error, const char *what) {
        uint64_t one = 1;

        if (p->page->daemon.error)
                return;
        log_job(LOG_ERR, 0, p->job->name, "Plan of job '%s' failed: %s", p->job->name, what);
        __atomic_store_n(&p->page->daemon.error, (int64_t) error, __ATOMIC_RELEASE);
        if (p->conn && p->conn->efd >= 0)
                (void) write(p->conn->efd, &one, sizeof(one));
}

static void slot_publish(Plan *p, Tensor *t, int tier) {
        PlanSlot *s;
        uint32_t seg, gen;
        uint64_t off;

        if (t->plan != p || tier > TIER_HOST)
                return;
        copy_grant(t, tier, &seg, &gen, &off);
        s = &p->page->slots[2 * t->plan_slot + (uint32_t) tier];
        s->segment = seg + t->copy[tier].seg->pool->id_base;
        s->generation = gen;
        s->offset = off;
}

/* ---- holds ---------------------------------------------------------------------------------------- */

static void hold_release(Plan *p, int h, bool unpin) {
        PlanHold *hold = &p->hold[h];
        HoldState *hs = &priv(p)->hs[h];
        PlanPhase *ph;

        if (!hold->active)
                return;
        ph = &p->phases[hold->phase];
        for (uint32_t i = 0; i < ph->n_acc; i++) {
                PlanAcc *a = &ph->acc[i];

                if (hs->ops[i])
                        op_cancel(hs->ops[i]);  /* on_pin_cancelled() does the books */
                if (hs->pinned[i]) {
                        tensor_pin_account(a->tensor, a->tier, -1);
                        if (unpin)
                                (void) tensor_unpin(a->tensor, a->tier, (a->mode & PLAN_WRITE) != 0);
                        hs->pinned[i] = false;
                }
        }
        *hold = (PlanHold) {};
}

static void on_pin_done(Op *op, int status, const char *error) {
        PinCtx *ctx = op->userdata;
        Plan *p = ctx->plan;
        HoldState *hs = &priv(p)->hs[ctx->hold];
        PlanHold *hold = &p->hold[ctx->hold];
        PlanAcc *a = &p->phases[hold->phase].acc[ctx->idx];

        hs->ops[ctx->idx] = NULL;
        slot_put(p->job, ctx->link);
        if (status >= 0) {
                hs->pinned[ctx->idx] = true;
                hold->n_pinned++;
                tensor_pin_account(a->tensor, a->tier, +1);
                slot_publish(p, a->tensor, a->tier);
        } else if (status == -ENOSPC || status == -EAGAIN) {
                hs->blocked[ctx->idx] = epoch;
        } else {
                char what[256];

                snprintf(what, sizeof(what), "cannot bring tensor '%s' to %s: %s", a->tensor->name,
                         tier_to_string(a->tier), error ? error : strerror(-status));
                plan_set_error(p, status, what);
        }
        /* no space now: retried when something is freed or moves, not in a busy loop */
        if (status >= 0)
                manager_kick(p->manager);
}

static void on_pin_cancelled(Op *op) {
        PinCtx *ctx = op->userdata;

        priv(ctx->plan)->hs[ctx->hold].ops[ctx->idx] = NULL;
        slot_put(ctx->plan->job, ctx->link);
}

static void on_prefetch_cancelled(Op *op) {
        op->tensor->sched_op = NULL;
        slot_put(op->tensor->job, (int) (intptr_t) op->userdata);
}

static int access_link(Tensor *t, int tier, uint8_t mode) {
        if (mode == PLAN_WRITE)         /* nothing to bring: only making room uses a link, the one below */
                return tier == TIER_VRAM ? SLINK_PCIE : SLINK_NVME;
        if (tier == TIER_HOST)
                return copy_valid(t, TIER_VRAM) ? SLINK_PCIE : SLINK_NVME;
        return copy_valid(t, TIER_HOST) ? SLINK_PCIE : SLINK_NVME;
}

/* Pin what is already resident; collect the rest as candidates. */
static void hold_fill(Plan *p, int h, uint64_t deadline, Cand **cands, size_t *n, size_t *cap) {
        PlanHold *hold = &p->hold[h];
        HoldState *hs = &priv(p)->hs[h];
        PlanPhase *ph = &p->phases[hold->phase];

        for (uint32_t i = 0; i < ph->n_acc; i++) {
                PlanAcc *a = &ph->acc[i];
                Tensor *t = a->tensor;
                Copy *c = &t->copy[a->tier];

                if (hs->pinned[i] || hs->ops[i] || hs->blocked[i] == epoch)
                        continue;
                /* the next phase reads what the current one writes in another tier: only after it */
                if (h == 1 && p->hold[0].active && stale_soon(t, a->tier))
                        continue;
                if (copy_valid(t, a->tier) && !t->xfer) {
                        if (c->state == COPY_DRAINING)
                                c->state = COPY_RESIDENT;       /* wanted: cancel the drain */
                        c->pins++;
                        hs->pinned[i] = true;
                        hold->n_pinned++;
                        tensor_pin_account(t, a->tier, +1);
                        slot_publish(p, t, a->tier);
                        continue;
                }
                if (*n == *cap) {
                        size_t nc = *cap ? *cap * 2 : 64;
                        Cand *x = realloc(*cands, nc * sizeof(Cand));

                        if (!x)
                                return;
                        *cands = x;
                        *cap = nc;
                }
                (*cands)[(*n)++] = (Cand) {
                        .plan = p, .job = p->job, .tensor = t, .tier = a->tier, .hold = h, .idx = i,
                        .deadline = deadline, .link = access_link(t, a->tier, a->mode),
                };
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
        }
}

static void hold_start(Plan *p, int h, uint64_t seq, uint32_t phase) {
        p->hold[h] = (PlanHold) { .active = true, .seq = seq, .phase = phase };
        memset(priv(p)->hs[h].blocked, 0, priv(p)->max_acc * sizeof(uint64_t));
}

/* ---- markers ------------------------------------------------------------------------------------------ */

static void plan_iteration(Plan *p, uint64_t now) {
        Job *j = p->job;
        uint64_t stall = __atomic_load_n(&p->page->client.stall_ns, __ATOMIC_ACQUIRE);

        if (p->iter_start_ns) {
                p->iterations++;
                p->last_step_s = (double) (now - p->iter_start_ns) / 1e9;
                p->last_stall_s = stall >= p->iter_stall_ns ? (double) (stall - p->iter_stall_ns) / 1e9 : 0;
                for (int i = 0; i < 4; i++)
                        p->last_step_links[i] = j->link_bytes[i] - p->iter_links[i];
                log_debug("sched: job '%s' (weight %u) step %" PRIu64 ": %.3f s, stall %.3f s, NVMe read %" PRIu64
                          " write %" PRIu64 ", vram link %" PRIu64 " bytes", j->name, j->weight, p->iterations,
                          p->last_step_s, p->last_stall_s, p->last_step_links[LINK_NVME_TO_HOST],
                          p->last_step_links[LINK_HOST_TO_NVME],
                          p->last_step_links[LINK_HOST_TO_VRAM] + p->last_step_links[LINK_VRAM_TO_HOST]);
        }
        p->iter_start_ns = now;
        p->iter_stall_ns = stall;
        for (int i = 0; i < 4; i++)
                p->iter_links[i] = j->link_bytes[i];
}

static void plan_release_after_use(Plan *p, uint32_t done_phase, uint32_t next_phase) {
        Manager *m = p->manager;
        PlanPhase *d = &p->phases[done_phase], *nx = &p->phases[next_phase];

        /* ondemand: nothing is cached; what the finished phase used goes back down */
        for (uint32_t i = 0; i < d->n_acc; i++) {
                Tensor *t = d->acc[i].tensor;
                bool again = false;

                for (uint32_t k = 0; k < nx->n_acc; k++)
                        if (nx->acc[k].tensor == t)
                                again = true;
                if (!again && t->op_refs == 0 && t->copy[TIER_VRAM].pins == 0 && t->copy[TIER_HOST].pins == 0)
                        (void) op_submit(m, OP_EVICT, t, TIER_NVME, NULL, NULL, NULL, NULL);
        }
}

/*
 * After @done_phase (the phase just released), drop every copy of the
 * tensors it used whose next planned access overwrites them whole: they are
 * dead, and keeping them would only take room (and Belady would rank them by
 * that overwrite as if it were a read).  Only tensors this plan alone names,
 * and nothing pinned, moving or in use by an op.
 */
static void plan_drop_dead(Plan *p, uint32_t done_phase) {
        Manager *m = p->manager;
        PlanPhase *d = &p->phases[done_phase];

        for (uint32_t i = 0; i < d->n_acc; i++) {
                Tensor *t = d->acc[i].tensor;
                bool busy = t->xfer || t->op_refs > 0 || t->sched_op || t->plan != p || t->plan_refs != 1;

                for (int tier = 0; tier < TIERS && !busy; tier++)
                        busy = t->copy[tier].pins > 0;
                /* from the phase the client is in now (it may have skipped some), that one included */
                if (busy || t->dead || next_access_mode(p, t, p->cur, true) != PLAN_WRITE)
                        continue;
                t->dead = true;
                for (int tier = 0; tier < TIERS; tier++)
                        copy_free(m, t, tier);
                log_debug("sched: '%s' of job '%s' is dead until its next write: copies dropped", t->name,
                          p->job->name);
        }
}

static int on_marker(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Plan *p = userdata;
        uint64_t v, seq, mark, now = mono_ns();
        uint32_t phase, prev = p->cur, done;

        (void) read(p->marker_fd, &v, sizeof(v));
        seq = __atomic_load_n(&p->page->client.marker_seq, __ATOMIC_ACQUIRE);
        if (seq <= p->seq)
                return 0;
        phase = __atomic_load_n(&p->page->client.phase, __ATOMIC_RELAXED);
        mark = __atomic_load_n(&p->page->client.mark_ns, __ATOMIC_RELAXED);
        if (phase >= p->n_phases) {
                plan_set_error(p, -EINVAL, "marker names a phase the plan does not have");
                return 0;
        }
        /* the client's clock reading is only a hint: keep it between the last marker and now */
        if (mark > now || mark < p->cur_mark_ns)
                mark = now;

        /* learn the duration of the phase that just ended */
        if (prev != UINT32_MAX && seq == p->seq + 1) {
                PlanPhase *ph = &p->phases[prev];
                uint64_t d = mark - p->cur_mark_ns;

                if (ph->samples++ == 0)
                        ph->ema_ns = d;
                else
                        ph->ema_ns = ph->ema_ns - (ph->ema_ns >> EMA_SHIFT) + (d >> EMA_SHIFT);
        }
        if (prev == UINT32_MAX || phase <= prev)
                plan_iteration(p, mark);

        log_debug("sched: job '%s' marker %" PRIu64 ": phase %u", p->job->name, seq, phase);
        /* the previous marker's phase is over: its pins go (written accesses dirty) */
        done = p->hold[0].active ? p->hold[0].phase : UINT32_MAX;
        hold_release(p, 0, true);
        if (prev != UINT32_MAX && policy(p->manager) == SCHED_POLICY_ONDEMAND)
                plan_release_after_use(p, prev, phase);

        if (p->hold[1].active && p->hold[1].seq == seq && p->hold[1].phase == phase) {
                /* pinned ahead: it becomes the current hold */
                HoldState tmp = priv(p)->hs[0];

                p->hold[0] = p->hold[1];
                priv(p)->hs[0] = priv(p)->hs[1];
                priv(p)->hs[1] = tmp;
                for (uint32_t i = 0; i < priv(p)->max_acc; i++) {
                        priv(p)->hs[0].ctx[i].hold = 0;
                        priv(p)->hs[1].ctx[i].hold = 1;
                }
                p->hold[1] = (PlanHold) {};
        } else {
                hold_release(p, 1, true);       /* the client went elsewhere */
                hold_start(p, 0, seq, phase);
        }
        p->seq = seq;
        p->cur = phase;
        p->cur_mark_ns = mark;
        if (done != UINT32_MAX && policy(p->manager) == SCHED_POLICY_TIMELINE)
                plan_drop_dead(p, done);
        epoch++;
        manager_kick(p->manager);
        return 0;
}

/* ---- the pass ---------------------------------------------------------------------------------------- */

static int cand_cmp(const void *a, const void *b) {
        const Cand *x = a, *y = b;

        return x->deadline < y->deadline ? -1 : x->deadline > y->deadline;
}

static void on_prefetch_done(Op *op, int status, const char *error) {
        Tensor *t = op->tensor;
        int link = (int) (intptr_t) op->userdata;

        t->sched_op = NULL;
        slot_put(t->job, link);
        if (status == -EAGAIN || status == -ENOSPC)
                t->sched_blocked = epoch;
        log_debug("sched: '%s' %s done: %d (%s)", t->name, op->kind == OP_CLEAN ? "clean" : "prefetch", status,
                  error ? error : "");
        if (status >= 0)
                manager_kick(op->manager);
}

/*
 * sched_pick() - the next candidate to start: earliest deadline first among
 * those whose job has a free slot on their link (the current phase's pins
 * too: their deadline is now, so they come first, but they are weighed like
 * the rest when jobs collide); among candidates whose deadlines collide with
 * that earliest one (within COLLIDE_NS of it, or of now when it is overdue)
 * the job with the smallest fair-share virtual time wins.  @c is sorted by
 * deadline.  Slots are per job (see slot_take()).
 */
static bool cand_blocked(const SchedCand *c, const unsigned limit[]) {
        return c->taken || !slot_free(c->job, c->link, limit);
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
        horizon = MAX(c[first].deadline, now) + COLLIDE_NS;
        for (size_t i = first; i < n && c[i].deadline <= horizon; i++) {
                if (cand_blocked(&c[i], limit))
                        continue;
                if (pick == SIZE_MAX || c[i].job->vtime < c[pick].job->vtime)
                        pick = i;
        }
        return pick == SIZE_MAX ? first : pick;
}

void sched_charge(Job *j, uint64_t bytes) {
        j->vtime += (double) bytes / (double) MAX(j->weight, 1u);
}

static bool cand_pending(const Cand *c, Cand *all, size_t n) {
        /* a prefetch for a tensor that already has a candidate earlier in the list is a duplicate */
        for (size_t i = 0; i < n && &all[i] != c; i++)
                if (all[i].tensor == c->tensor && all[i].tier <= c->tier)
                        return true;
        return false;
}

static uint8_t p_acc_mode(const Cand *c) {
        const PlanHold *h = &c->plan->hold[c->hold];

        return c->plan->phases[h->phase].acc[c->idx].mode;
}

static void issue(Manager *m, Cand *c) {
        Job *j = c->plan->job;
        Op *op = NULL;
        int r;

        if (c->hold >= 0) {
                HoldState *hs = &priv(c->plan)->hs[c->hold];
                PinCtx *ctx = &hs->ctx[c->idx];

                ctx->plan = c->plan;
                ctx->hold = c->hold;
                ctx->idx = c->idx;
                ctx->link = c->link;
                r = op_submit(m, OP_PIN, c->tensor, c->tier, on_pin_done, NULL, ctx, &op);
                if (r < 0)
                        return;
                op->deadline_ns = c->deadline;
                /* a write-only access overwrites the tensor: no need to bring its old bytes */
                op->discard = p_acc_mode(c) == PLAN_WRITE;
                op->cancelled = on_pin_cancelled;
                hs->ops[c->idx] = op;
        } else {
                r = op_submit(m, OP_PREFETCH, c->tensor, c->tier, on_prefetch_done, NULL,
                              (void *) (intptr_t) c->link, &op);
                if (r < 0)
                        return;
                op->deadline_ns = c->deadline;
                op->no_wait = true;
                op->cancelled = on_prefetch_cancelled;
                c->tensor->sched_op = op;
        }
        slot_take(j, c->link);
        sched_charge(j, c->tensor->alloc_size);
        if (sched_trace)
                sched_trace(c->hold >= 0 ? "pin" : "prefetch", c->tensor, c->tier, c->deadline);
        log_debug("sched: job '%s' %s '%s' -> %s (hold %d, deadline in %.3f ms, link %s)", j->name,
                  c->hold >= 0 ? "pin" : "prefetch", c->tensor->name, tier_to_string(c->tier), c->hold,
                  ((double) c->deadline - (double) mono_ns()) / 1e6, c->link == SLINK_NVME ? "nvme" : "pcie");
}

static void add_cand(Cand **cands, size_t *n, size_t *cap, Cand c) {
        if (*n == *cap) {
                size_t nc = *cap ? *cap * 2 : 64;
                Cand *x = realloc(*cands, nc * sizeof(Cand));

                if (!x)
                        return;
                *cands = x;
                *cap = nc;
        }
        (*cands)[(*n)++] = c;
}

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
static void plan_window(Plan *p) {
        PlanPriv *pp = priv(p);
        Job *j = p->job;
        uint32_t cur = p->cur == UINT32_MAX ? p->n_phases - 1 : p->cur, k;
        uint64_t bytes[2] = { 0, 0 }, mem = 0;
        bool open[2] = { true, true };

        memset(pp->wmark, 0, p->n_slots);
        pp->window[0] = pp->window[1] = 0;
        pp->need[0] = pp->need[1] = 0;
        for (k = 0; k < p->n_phases && (open[0] || open[1]); k++) {
                PlanPhase *ph = &p->phases[(cur + k) % p->n_phases];

                /* before the first marker no phase runs: phase 0 is the next one */
                for (uint32_t i = 0; i < ph->n_acc && !(k == 0 && p->cur == UINT32_MAX); i++) {
                        PlanAcc *a = &ph->acc[i];
                        uint8_t bits = a->tier == TIER_VRAM ? 1 : 2;

                        if (a->tier == TIER_VRAM && a->mode != PLAN_WRITE && !copy_valid(a->tensor, TIER_VRAM) &&
                            !tensor_is_blank(a->tensor))
                                bits |= 2;      /* staged through host (zeros are filled in place) */
                        for (int c = 0; c < 2; c++)
                                if (open[c] && ((bits & ~pp->wmark[a->slot]) & (1u << c))) {
                                        pp->wmark[a->slot] |= (uint8_t) (1u << c);
                                        bytes[c] += a->tensor->alloc_size;
                                        if (!copy_valid(a->tensor, c))
                                                pp->need[c] += a->tensor->alloc_size;
                                }
                        /* every tensor touched, whatever the tier: vram and host hold them together */
                        if (!(pp->wmark[a->slot] & 4)) {
                                pp->wmark[a->slot] |= 4;
                                mem += a->tensor->alloc_size;
                        }
                }
                /* the phase that overflows still counts in need: write-behind makes room for it */
                for (int c = 0; c < 2; c++) {
                        if (open[c] && (bytes[c] > j->limit[c] ||
                                        (c == TIER_HOST && mem > j->limit[TIER_VRAM] + j->limit[TIER_HOST])))
                                open[c] = false;
                        else if (open[c])
                                pp->window[c] = k;
                }
        }
}

static void collect_prefetch(Manager *m, Plan *p, Cand **cands, size_t *n, size_t *cap) {
        PlanPriv *pp = priv(p);
        uint32_t cur = p->cur == UINT32_MAX ? p->n_phases - 1 : p->cur;

        plan_window(p);
        /* phases after the one pinned ahead, as far as the windows reach */
        for (uint32_t k = 2; k <= MAX(pp->window[0], pp->window[1]) && k < p->n_phases; k++) {
                PlanPhase *ph = &p->phases[(cur + k) % p->n_phases];

                for (uint32_t i = 0; i < ph->n_acc; i++) {
                        PlanAcc *a = &ph->acc[i];
                        Tensor *t = a->tensor;
                        int tier = a->tier;

                        if (a->mode == PLAN_WRITE || copy_valid(t, tier))
                                continue;       /* overwritten whole (the pin takes the room), or there already */
                        if (tier == TIER_VRAM && k > pp->window[0]) {
                                if (k > pp->window[1])
                                        continue;
                                tier = TIER_HOST;       /* beyond the vram window: stage it in host memory */
                        } else if (tier == TIER_HOST && k > pp->window[1])
                                continue;
                        if (t->sched_op || t->xfer || copy_valid(t, tier) || stale_soon(t, tier) ||
                            t->sched_blocked == epoch)
                                continue;
                        if (tensor_is_blank(t))
                                continue;       /* zeros or dead bytes: nothing to move */
                        add_cand(cands, n, cap, (Cand) {
                                .plan = p, .job = p->job, .tensor = t, .tier = tier, .hold = -1, .idx = i,
                                .deadline = pp->pred[k], .link = access_link(t, tier, PLAN_READ),
                        });
                }
        }
}

static void write_behind(Manager *m, Plan *p) {
        Job *j = p->job;

        for (int tier = TIER_VRAM; tier <= TIER_HOST; tier++) {
                int link = tier == TIER_VRAM ? SLINK_PCIE : SLINK_NVME;
                uint64_t need = priv(p)->need[tier], free_bytes, got = 0;
                Tensor **v;
                size_t n = 0, k;

                free_bytes = j->limit[tier] > j->used[tier] ? j->limit[tier] - j->used[tier] : 0;
                if (need <= free_bytes || !slot_free(j, link, link_limit))
                        continue;
                /*
                 * Writes to NVMe only while it is idle: a write in its way would delay a
                 * read with a deadline by a whole transfer, and a copy cleaned early may
                 * stay after all (the prediction of victims is not exact).
                 */
                if (tier == TIER_HOST && (j->sched_inflight[link] > 0 || uring_busy(m->uring)))
                        continue;
                v = calloc(j->n_tensors + 1, sizeof(Tensor *));
                if (!v)
                        return;
                list_for_each_safe(node, tmp, &m->lru[tier]) {
                        Copy *c = list_entry(node, Copy, lru);
                        Tensor *t = container_of(c, Tensor, copy[tier]);

                        if (t->job == j && c->state == COPY_RESIDENT && c->pins == 0 && !t->xfer && n < j->n_tensors)
                                v[n++] = t;
                }
                k = sched_victim_order(m, tier, v, n, 0);
                for (size_t i = 0; i < k && got < need - free_bytes; i++) {
                        Tensor *t = v[i];

                        got += t->alloc_size;
                        if (!copy_is_sole(t, tier) || t->sched_op || t->op_refs > 0 || t->sched_blocked == epoch ||
                            sched_next_access_overwrites(t))
                                continue;
                        if (!slot_free(j, link, link_limit))
                                break;
                        {
                                Op *op = NULL;

                                if (op_submit(m, OP_CLEAN, t, tier, on_prefetch_done, NULL,
                                              (void *) (intptr_t) link, &op) >= 0) {
                                        op->cancelled = on_prefetch_cancelled;
                                        op->deadline_ns = sched_next_use_ns(t, tier + 1);
                                        op->no_wait = true;     /* opportunistic: never waits for room */
                                        sched_charge(j, t->alloc_size);
                                        t->sched_op = op;
                                        slot_take(j, link);
                                        if (sched_trace)
                                                sched_trace("clean", t, tier, 0);
                                        if (tier == TIER_HOST)
                                                break;  /* one at a time: a read arriving waits for one write at most */
                                }
                        }
                }
                free(v);
        }
}

void sched_run(Manager *m) {
        Cand *cands = NULL;
        size_t n = 0, cap = 0;
        uint64_t now = mono_ns();
        double min_vt = -1;

        if (list_empty(&plans) || in_run)
                return;
        in_run = true;
        pass_no++;

        /* what the held phases write, so nothing is fetched that their writes would make stale */
        list_for_each_safe(node, tmp, &plans) {
                Plan *p = list_entry(node, Plan, link);

                if (policy(m) == SCHED_POLICY_TIMELINE && !p->hold[1].active && !p->page->daemon.error)
                        hold_start(p, 1, p->seq + 1, p->cur == UINT32_MAX ? 0 : (p->cur + 1) % p->n_phases);
                mark_writes(p, 0);
                mark_writes(p, 1);
        }

        list_for_each_safe(node, tmp, &plans) {
                Plan *p = list_entry(node, Plan, link);

                if (p->page->daemon.error)
                        continue;
                plan_predict(p);
                /* the current marker's phase (demand: deadline now) */
                if (p->hold[0].active) {
                        hold_fill(p, 0, now, &cands, &n, &cap);
                        hold_check_ready(p, 0);
                }
                if (policy(m) == SCHED_POLICY_TIMELINE) {
                        if (!p->hold[1].active)
                                hold_start(p, 1, p->seq + 1, p->cur == UINT32_MAX ? 0 : (p->cur + 1) % p->n_phases);
                        hold_fill(p, 1, priv(p)->pred[1], &cands, &n, &cap);
                        hold_check_ready(p, 1);
                        collect_prefetch(m, p, &cands, &n, &cap);
                }
        }

        if (n > 1)
                qsort(cands, n, sizeof(Cand), cand_cmp);

        /* fair share: jobs that come back to the queue start at the current minimum virtual time */
        for (size_t i = 0; i < n; i++) {
                Job *j = cands[i].plan->job;

                if (min_vt < 0 || j->vtime < min_vt)
                        min_vt = j->vtime;
        }

        for (;;) {
                size_t pick = sched_pick(cands, n, now, link_limit);

                if (pick == SIZE_MAX)
                        break;
                cands[pick].taken = true;
                if (cands[pick].hold < 0 && (cand_pending(&cands[pick], cands, n) || cands[pick].tensor->sched_op))
                        continue;
                if (cands[pick].plan->job->vtime < min_vt)
                        cands[pick].plan->job->vtime = min_vt;
                /* far prefetch into full VRAM: stage it in host memory instead */
                if (cands[pick].hold < 0 && cands[pick].tier == TIER_VRAM) {
                        Job *j = cands[pick].plan->job;

                        if (j->used[TIER_VRAM] + cands[pick].tensor->alloc_size > j->limit[TIER_VRAM]) {
                                if (copy_valid(cands[pick].tensor, TIER_HOST))
                                        continue;
                                cands[pick].tier = TIER_HOST;
                        }
                }
                issue(m, &cands[pick]);
        }

        if (policy(m) == SCHED_POLICY_TIMELINE)
                list_for_each_safe(node, tmp, &plans) {
                        Plan *p = list_entry(node, Plan, link);

                        if (!p->page->daemon.error)
                                write_behind(m, p);
                }
        free(cands);
        in_run = false;
}

/* ---- plans: creation and end --------------------------------------------------------------------------- */

static int errf(char *error, size_t size, int r, const char *fmt, ...) _printf_(4, 5);
static int errf(char *error, size_t size, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(error, size, fmt, ap);
        va_end(ap);
        return r;
}

/* Bytes the union of phases @a and @b pins in @tier (marks slots in @mark). */
static uint64_t phases_bytes(Plan *p, uint32_t a, uint32_t b, int tier, uint8_t *mark) {
        uint64_t bytes = 0;
        uint32_t list[2] = { a, b };

        for (int k = 0; k < (a == b ? 1 : 2); k++) {
                PlanPhase *ph = &p->phases[list[k]];

                for (uint32_t i = 0; i < ph->n_acc; i++)
                        if (ph->acc[i].tier == tier && !mark[ph->acc[i].slot]) {
                                mark[ph->acc[i].slot] = 1;
                                bytes += ph->acc[i].tensor->alloc_size;
                        }
        }
        for (int k = 0; k < (a == b ? 1 : 2); k++) {
                PlanPhase *ph = &p->phases[list[k]];

                for (uint32_t i = 0; i < ph->n_acc; i++)
                        mark[ph->acc[i].slot] = 0;
        }
        return bytes;
}

/* For each slot, the phases that touch it (any tier) with the union of their modes. */
static int build_access_index(Plan *p) {
        uint32_t *last;

        p->acc_off = calloc(p->n_slots + 1, sizeof(uint32_t));
        last = malloc(p->n_slots * sizeof(uint32_t) + 1);
        if (!p->acc_off || !last) {
                free(last);
                return -ENOMEM;
        }
        memset(last, 0xff, p->n_slots * sizeof(uint32_t));
        for (uint32_t k = 0; k < p->n_phases; k++)
                for (uint32_t i = 0; i < p->phases[k].n_acc; i++) {
                        uint32_t sl = p->phases[k].acc[i].slot;

                        if (last[sl] != k) {
                                last[sl] = k;
                                p->acc_off[sl + 1]++;
                        }
                }
        for (uint32_t sl = 0; sl < p->n_slots; sl++)
                p->acc_off[sl + 1] += p->acc_off[sl];
        p->acc_phase = malloc((p->acc_off[p->n_slots] + 1) * sizeof(uint32_t));
        p->acc_mode = calloc(p->acc_off[p->n_slots] + 1, 1);
        if (!p->acc_phase || !p->acc_mode) {
                free(last);
                return -ENOMEM;
        }
        {
                uint32_t *pos = malloc((p->n_slots + 1) * sizeof(uint32_t));

                if (!pos) {
                        free(last);
                        return -ENOMEM;
                }
                memcpy(pos, p->acc_off, (p->n_slots + 1) * sizeof(uint32_t));
                memset(last, 0xff, p->n_slots * sizeof(uint32_t));
                for (uint32_t k = 0; k < p->n_phases; k++)
                        for (uint32_t i = 0; i < p->phases[k].n_acc; i++) {
                                PlanAcc *a = &p->phases[k].acc[i];

                                if (last[a->slot] != k) {
                                        last[a->slot] = k;
                                        p->acc_phase[pos[a->slot]++] = k;
                                }
                                p->acc_mode[pos[a->slot] - 1] |= a->mode;
                        }
                free(pos);
        }
        free(last);
        return 0;
}

static bool use_in_class(const PlanAcc *a, int c) {
        return c == USE_ANY || (c == USE_VRAM ? a->tier == TIER_VRAM : a->tier == TIER_HOST);
}

static int build_use_index(Plan *p) {
        for (int c = 0; c < _USE_MAX; c++) {
                uint32_t *cnt = calloc(p->n_slots + 1, sizeof(uint32_t));
                uint32_t *last = malloc(p->n_slots * sizeof(uint32_t));

                p->use_off[c] = cnt;
                if (!cnt || !last) {
                        free(last);
                        return -ENOMEM;
                }
                memset(last, 0xff, p->n_slots * sizeof(uint32_t));
                for (uint32_t k = 0; k < p->n_phases; k++)
                        for (uint32_t i = 0; i < p->phases[k].n_acc; i++) {
                                PlanAcc *a = &p->phases[k].acc[i];

                                if (!use_in_class(a, c) || last[a->slot] == k)
                                        continue;
                                last[a->slot] = k;
                                cnt[a->slot + 1]++;
                        }
                for (uint32_t s = 0; s < p->n_slots; s++)
                        cnt[s + 1] += cnt[s];
                p->use_phase[c] = malloc((cnt[p->n_slots] + 1) * sizeof(uint32_t));
                if (!p->use_phase[c]) {
                        free(last);
                        return -ENOMEM;
                }
                {
                        uint32_t *pos = malloc((p->n_slots + 1) * sizeof(uint32_t));

                        if (!pos) {
                                free(last);
                                return -ENOMEM;
                        }
                        memcpy(pos, cnt, (p->n_slots + 1) * sizeof(uint32_t));
                        memset(last, 0xff, p->n_slots * sizeof(uint32_t));
                        for (uint32_t k = 0; k < p->n_phases; k++)
                                for (uint32_t i = 0; i < p->phases[k].n_acc; i++) {
                                        PlanAcc *a = &p->phases[k].acc[i];

                                        if (!use_in_class(a, c) || last[a->slot] == k)
                                                continue;
                                        last[a->slot] = k;
                                        p->use_phase[c][pos[a->slot]++] = k;
                                }
                        free(pos);
                }
                free(last);
        }
        return 0;
}

int plan_new(Conn *c, const Tier__SubmitPlan *req, Plan **ret, char *error, size_t esize) {
        Manager *m = c->manager;
        Job *j = c->job;
        TensorMap *seen = NULL;
        uint32_t n_acc = 0, max_acc = 0;
        PlanPriv *pp;
        Plan *p;
        int r;

        if (req->n_phases == 0)
                return errf(error, esize, -EINVAL, "a plan needs at least one phase");
        if (req->n_phases > PLAN_MAX_PHASES)
                return errf(error, esize, -E2BIG, "plan has %zu phases (at most %d)", req->n_phases, PLAN_MAX_PHASES);
        for (size_t k = 0; k < req->n_phases; k++) {
                n_acc += (uint32_t) req->phases[k]->n_accesses;
                max_acc = MAX(max_acc, (uint32_t) req->phases[k]->n_accesses);
                if (n_acc > PLAN_MAX_ACCESSES)
                        return errf(error, esize, -E2BIG, "plan has more than %d accesses", PLAN_MAX_ACCESSES);
        }

        p = calloc(1, sizeof(Plan) + sizeof(PlanPriv));
        if (!p)
                return -ENOMEM;
        pp = priv(p);
        p->manager = m;
        p->conn = c;
        p->job = j;
        p->page_fd = p->marker_fd = -1;
        p->cur = UINT32_MAX;
        list_init(&p->link);
        p->n_phases = (uint32_t) req->n_phases;
        p->n_acc = n_acc;
        pp->max_acc = MAX(max_acc, 1u);
        p->phases = calloc(p->n_phases, sizeof(PlanPhase));
        p->acc_storage = calloc(MAX(n_acc, 1u), sizeof(PlanAcc));
        p->slots = calloc(MAX(n_acc, 1u), sizeof(Tensor *));
        pp->pred = calloc(p->n_phases + 1, sizeof(uint64_t));
        pp->wmark = calloc(MAX(n_acc, 1u), 1);
        seen = tensormap_new();
        r = 0;
        for (int h = 0; h < 2; h++) {
                pp->hs[h].pinned = calloc(pp->max_acc, sizeof(bool));
                pp->hs[h].ops = calloc(pp->max_acc, sizeof(Op *));
                pp->hs[h].ctx = calloc(pp->max_acc, sizeof(PinCtx));
                pp->hs[h].blocked = calloc(pp->max_acc, sizeof(uint64_t));
                if (!pp->hs[h].pinned || !pp->hs[h].ops || !pp->hs[h].ctx || !pp->hs[h].blocked)
                        r = -ENOMEM;
        }
        if (r < 0 || !p->phases || !p->acc_storage || !p->slots || !pp->pred || !pp->wmark || !seen) {
                r = -ENOMEM;
                goto fail;
        }

        n_acc = 0;
        for (uint32_t k = 0; k < p->n_phases; k++) {
                const Tier__PlanPhase *rp = req->phases[k];
                PlanPhase *ph = &p->phases[k];

                ph->acc = &p->acc_storage[n_acc];
                for (size_t i = 0; i < rp->n_accesses; i++) {
                        const Tier__PlanAccess *ra = rp->accesses[i];
                        Tensor *t = tensor_find(j, ra->tensor);
                        uintptr_t slot;
                        PlanAcc *dup = NULL;

                        if (!t) {
                                r = errf(error, esize, -ENOENT, "phase %u names tensor id %" PRIu64
                                         " that job '%s' does not have", k, ra->tensor, j->name);
                                goto fail;
                        }
                        if (ra->tier != TIER__TIER__TIER_VRAM && ra->tier != TIER__TIER__TIER_HOST) {
                                r = errf(error, esize, -EINVAL, "phase %u: tensor '%s' must be needed in vram or host",
                                         k, t->name);
                                goto fail;
                        }
                        if (ra->mode == 0 || (ra->mode & ~(PLAN_READ | PLAN_WRITE))) {
                                r = errf(error, esize, -EINVAL, "phase %u: tensor '%s': invalid access mode %u",
                                         k, t->name, ra->mode);
                                goto fail;
                        }
                        if (ra->tier == TIER__TIER__TIER_VRAM && t->alloc_size > m->vram->pool.seg_size) {
                                r = errf(error, esize, -EFBIG, "phase %u: tensor '%s' does not fit a VRAM chunk", k,
                                         t->name);
                                goto fail;
                        }
                        for (uint32_t x = 0; x < ph->n_acc; x++)
                                if (ph->acc[x].tensor == t && ph->acc[x].tier == (uint8_t) ra->tier)
                                        dup = &ph->acc[x];
                        if (dup) {
                                dup->mode |= (uint8_t) ra->mode;
                                continue;
                        }
                        slot = (uintptr_t) tensormap_get(seen, t->name);
                        if (slot == 0) {
                                if (p->n_slots >= PLAN_MAX_SLOTS) {
                                        r = errf(error, esize, -E2BIG, "plan names more than %d tensors", PLAN_MAX_SLOTS);
                                        goto fail;
                                }
                                p->slots[p->n_slots] = t;
                                slot = ++p->n_slots;
                                r = tensormap_put(seen, t->name, (void *) slot);
                                if (r < 0)
                                        goto fail;
                        }
                        ph->acc[ph->n_acc++] = (PlanAcc) {
                                .tensor = t, .slot = (uint32_t) slot - 1, .tier = (uint8_t) ra->tier,
                                .mode = (uint8_t) ra->mode,
                        };
                        n_acc++;
                }
        }

        /* does it fit the job's quota?  timeline pins two consecutive phases at once */
        {
                uint8_t *mark = calloc(p->n_slots + 1, 1);
                bool pairs = m->config.sched_policy == SCHED_POLICY_TIMELINE && p->n_phases > 1;

                if (!mark) {
                        r = -ENOMEM;
                        goto fail;
                }
                for (uint32_t k = 0; k < p->n_phases; k++)
                        for (int tier = TIER_VRAM; tier <= TIER_HOST; tier++) {
                                uint32_t k2 = pairs ? (k + 1) % p->n_phases : k;
                                uint64_t b = phases_bytes(p, k, k2, tier, mark);

                                if (b > j->limit[tier]) {
                                        free(mark);
                                        if (pairs)
                                                r = errf(error, esize, -ENOSPC,
                                                         "phases %u and %u together pin %" PRIu64 " bytes of %s, more than "
                                                         "job '%s' may use there (%" PRIu64 "; the timeline policy pins "
                                                         "the next phase while one runs)",
                                                         k, k2, b, tier_to_string(tier), j->name, j->limit[tier]);
                                        else
                                                r = errf(error, esize, -ENOSPC,
                                                         "phase %u pins %" PRIu64 " bytes of %s, more than job '%s' may "
                                                         "use there (%" PRIu64 ")", k, b, tier_to_string(tier), j->name,
                                                         j->limit[tier]);
                                        goto fail;
                                }
                        }
                free(mark);
        }

        r = build_use_index(p);
        if (r >= 0)
                r = build_access_index(p);
        if (r < 0)
                goto fail;

        /* the shared page and the marker eventfd */
        p->page_size = plan_page_size(p->n_slots);
        p->page_fd = memfd_create("tierd-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (p->page_fd < 0 || ftruncate(p->page_fd, (off_t) p->page_size) < 0 ||
            fcntl(p->page_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                r = negative_errno();
                goto fail;
        }
        p->page = mmap(NULL, p->page_size, PROT_READ | PROT_WRITE, MAP_SHARED, p->page_fd, 0);
        if (p->page == MAP_FAILED) {
                p->page = NULL;
                r = negative_errno();
                goto fail;
        }
        p->marker_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->marker_fd < 0) {
                r = negative_errno();
                goto fail;
        }
        r = sd_event_add_io(m->event, &p->marker_source, p->marker_fd, EPOLLIN, on_marker, p);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(p->marker_source, "plan-marker");

        for (uint32_t s = 0; s < p->n_slots; s++) {
                p->slots[s]->plan_refs++;
                if (!p->slots[s]->plan) {
                        p->slots[s]->plan = p;
                        p->slots[s]->plan_slot = s;
                }
        }
        p->slots_counted = true;
        list_add_tail(&plans, &p->link);
        tensormap_free(seen);
        manager_kick(m);
        *ret = p;
        return 0;
fail:
        tensormap_free(seen);
        plan_free(p);
        return r;
}

void plan_free(Plan *p) {
        PlanPriv *pp;

        if (!p)
                return;
        pp = priv(p);
        if (pp->hs[0].pinned && pp->hs[1].pinned && p->phases) {
                hold_release(p, 0, true);
                hold_release(p, 1, true);
        }
        list_del(&p->link);
        for (uint32_t s = 0; s < p->n_slots; s++) {
                if (!p->slots[s])
                        continue;
                if (p->slots_counted && p->slots[s]->plan_refs > 0)
                        p->slots[s]->plan_refs--;
                if (p->slots[s]->plan == p)
                        p->slots[s]->plan = NULL;
        }
        sd_event_source_disable_unref(p->marker_source);
        safe_close(p->marker_fd);
        if (p->page)
                munmap(p->page, p->page_size);
        safe_close(p->page_fd);
        for (int h = 0; h < 2; h++) {
                free(pp->hs[h].pinned);
                free(pp->hs[h].ops);
                free(pp->hs[h].ctx);
                free(pp->hs[h].blocked);
        }
        for (int c = 0; c < _USE_MAX; c++) {
                free(p->use_off[c]);
                free(p->use_phase[c]);
        }
        free(p->acc_off);
        free(p->acc_phase);
        free(p->acc_mode);
        free(pp->pred);
        free(pp->wmark);
        free(p->phases);
        free(p->acc_storage);
        free(p->slots);
        free(p);
}

void sched_transfer_done(Manager *m) {
        epoch++;
        if (!list_empty(&plans))
                manager_kick(m);
}

int sched_init(Manager *m) {
        return 0;
}

void sched_deinit(Manager *m) {
        list_for_each_safe(node, tmp, &plans)
                plan_free(list_entry(node, Plan, link));
}

void plan_status(Plan *p, Tier__PlanStatus *ps) {
        uint64_t step = 0;

        for (uint32_t k = 0; k < p->n_phases; k++)
                step += phase_ns(p, k);
        ps->phase = p->cur == UINT32_MAX ? 0 : p->cur;
        ps->phases = p->n_phases;
        ps->iterations = p->iterations;
        ps->step_s = (double) step / 1e9;
        ps->stall_s = p->last_stall_s;
}
