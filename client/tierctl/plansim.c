/* SPDX-License-Identifier: MIT */
/* plansim.c: replay of a training step under job limits (the rules are in plansim.h). */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "client/tierctl/plansim.h"
#include "proto/macro.h"

enum { V, H, N, TIERS };                /* VRAM, host, NVMe */
enum { R = PLAN_SIM_READ, W = PLAN_SIM_WRITE };
enum { WARMUP_STEPS = 4, MEASURED_STEPS = 2 };

typedef struct Access {
        unsigned phase;                 /* within a step */
        unsigned tier;                  /* V or H */
        unsigned mode;
} Access;

typedef struct Tensor {
        double size;
        bool valid[TIERS];
        Access *acc;                    /* its accesses in phase order */
        unsigned n_acc;
        unsigned long long stamp;
} Tensor;

typedef struct Sim {
        const PlanSimPlan *plan;
        unsigned phases;
        size_t n_tensors;
        Tensor *t;
        Access *acc_all;                /* backing store of every Tensor.acc */
        double *start;                  /* start time of each phase within a step */
        double step_time;
        double used[TIERS], limit[TIERS];
        unsigned long long now;         /* global phase counter */
        PlanSimResult count;
        unsigned long long stamp;
} Sim;

_printf_(3, 4) static int fail(char *err, size_t err_size, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* The accesses of phase @p (within a step). */
static const PlanSimAccess *phase_acc(const Sim *s, unsigned p, size_t *n) {
        *n = s->plan->start[p + 1] - s->plan->start[p];
        return s->plan->acc + s->plan->start[p];
}

/* Phases from now to the tensor's next access after the current phase, and that access. */
static const Access *next_access(const Sim *s, const Tensor *t, const Access *after) {
        unsigned cur = (unsigned) (s->now % s->phases);
        const Access *best = NULL;
        unsigned best_d = 0;

        for (unsigned k = 0; k < t->n_acc; k++) {
                const Access *a = &t->acc[k];
                unsigned from = after ? after->phase : cur;
                unsigned d = a->phase > from ? a->phase - from : a->phase + s->phases - from;

                if (after && a == after)
                        continue;
                if (!best || d < best_d) {
                        best = a;
                        best_d = d;
                }
        }
        return best;
}

static double until(const Sim *s, unsigned phase) {
        unsigned cur = (unsigned) (s->now % s->phases);
        double d = s->start[phase] - s->start[cur];

        return phase > cur ? d : d + s->step_time;
}

static bool held(const Sim *s, size_t ti) {
        unsigned cur = (unsigned) (s->now % s->phases);

        for (unsigned k = 0; k < s->t[ti].n_acc; k++) {
                unsigned p = s->t[ti].acc[k].phase;

                if (p == cur || p == (cur + 1) % s->phases)
                        return true;
        }
        return false;
}

/* Time to the next use of the tensor's copy in @tier; INFINITY when it is not used again (dead or stale first). */
static double next_use(const Sim *s, const Tensor *t, unsigned tier) {
        const Access *a = next_access(s, t, NULL);

        for (unsigned hops = 0; a && hops < t->n_acc; hops++) {
                if (a->mode == W)
                        return INFINITY;        /* dead: overwritten before it is read */
                if (a->tier == tier)
                        return until(s, a->phase);
                /* served from the other tier's copy when there is one */
                if (!t->valid[a->tier])
                        return until(s, a->phase);
                if (a->mode & W)
                        return INFINITY;        /* the other tier's copy is written: this one goes stale */
                a = next_access(s, t, a);
        }
        return INFINITY;
}

static bool make_room_by(Sim *s, unsigned tier, double size, double deadline);
#define make_room(s, tier, size) ((void) make_room_by(s, tier, size, -1))

static void evict(Sim *s, size_t ti, unsigned tier) {
        Tensor *t = &s->t[ti];
        bool sole = true, dead;
        const Access *a = next_access(s, t, NULL);

        for (unsigned k = 0; k < TIERS; k++)
                if (k != tier && t->valid[k])
                        sole = false;
        dead = a && a->mode == W;
        if (sole && !dead) {
                if (tier == V) {
                        /* drained copies make room only from copies needed after them */
                        if (!make_room_by(s, H, t->size, next_use(s, t, V)))
                                make_room(s, H, t->size);
                        s->count.link_up += t->size;
                        t->valid[H] = true;
                        s->used[H] += t->size;
                } else {
                        s->count.nvme_write += t->size;
                        t->valid[N] = true;
                }
        }
        t->valid[tier] = false;
        s->used[tier] -= t->size;
}

static bool make_room_by(Sim *s, unsigned tier, double size, double deadline) {
        while (s->used[tier] + size > s->limit[tier] * (1 + 1e-12)) {
                double best = -1;
                size_t victim = 0;

                for (size_t ti = 0; ti < s->n_tensors; ti++) {
                        const Tensor *t = &s->t[ti];
                        double score, cost = 1;

                        if (!t->valid[tier] || held(s, ti))
                                continue;
                        if ((t->valid[tier] ? 1 : 0) + (t->valid[tier == V ? H : V] ? 1 : 0) +
                            (t->valid[N] ? 1 : 0) == 1)
                                cost = 2;
                        score = next_use(s, t, tier);
                        if (score <= deadline)
                                continue;       /* needed before the requester: not a victim */
                        score /= cost;
                        if (score > best) {
                                best = score;
                                victim = ti;
                        }
                }
                if (best < 0)
                        return false;   /* everything is held: the limits were checked to hold two phases */
                evict(s, victim, tier);
        }
        return true;
}

static void bring(Sim *s, size_t ti, const Access *a) {
        Tensor *t = &s->t[ti];

        if (!t->valid[a->tier]) {
                make_room(s, a->tier, t->size);
                if (a->mode & R) {
                        if (a->tier == V) {
                                if (!t->valid[H] && t->valid[N]) {
                                        make_room(s, H, t->size);       /* staged through host */
                                        s->count.nvme_read += t->size;
                                        t->valid[H] = true;
                                        s->used[H] += t->size;
                                }
                                s->count.link_down += t->size;
                        } else if (t->valid[V])
                                s->count.link_up += t->size;
                        else if (t->valid[N])
                                s->count.nvme_read += t->size;
                }
                t->valid[a->tier] = true;
                s->used[a->tier] += t->size;
        }
        if (a->mode & W)
                for (unsigned k = 0; k < TIERS; k++)
                        if (k != a->tier && t->valid[k]) {
                                t->valid[k] = false;
                                s->used[k] -= k == N ? 0 : t->size;
                        }
}

/* Copy tensor @ti into @tier for its access at @phase, making room only from copies needed later. */
static bool prefetch_one(Sim *s, size_t ti, unsigned tier, unsigned phase) {
        Tensor *t = &s->t[ti];
        double deadline = until(s, phase);

        if (t->valid[tier])
                return true;
        if (tier == V && !t->valid[H]) {
                if (!t->valid[N] || !make_room_by(s, H, t->size, deadline))
                        return false;
                s->count.nvme_read += t->size;
                t->valid[H] = true;
                s->used[H] += t->size;
        }
        if (!make_room_by(s, tier, t->size, deadline))
                return false;
        if (tier == V)
                s->count.link_down += t->size;
        else if (t->valid[V])
                s->count.link_up += t->size;
        else if (t->valid[N])
                s->count.nvme_read += t->size;
        else
                return false;
        t->valid[tier] = true;
        s->used[tier] += t->size;
        return true;
}

/*
 * Prefetch as far ahead as the working set fits (tierd's plan_window()): for
 * VRAM the distinct tensors touched there from the next phase on must fit the
 * VRAM limit; for host those touched in host, plus VRAM ones staged through it.
 */
static void prefetch(Sim *s) {
        unsigned cur = (unsigned) (s->now % s->phases);

        for (unsigned tier = V; tier <= H; tier++) {
                double sum = 0, all = 0;

                s->stamp++;
                for (unsigned d = 1; d < s->phases; d++) {
                        unsigned q = (cur + d) % s->phases;
                        size_t n;
                        const PlanSimAccess *acc = phase_acc(s, q, &n);
                        bool full = false;

                        for (size_t k = 0; k < n && !full; k++) {
                                Tensor *t = &s->t[acc[k].tensor];
                                const Access *next = next_access(s, t, NULL);

                                if (tier == V && acc[k].tier != V)
                                        continue;
                                if (t->stamp != s->stamp) {
                                        t->stamp = s->stamp;
                                        all += t->size;
                                        if (tier == V || acc[k].tier == H || !t->valid[V])
                                                sum += t->size;
                                        if (sum > s->limit[tier] * (1 + 1e-12) ||
                                            (tier == H && all > (s->limit[V] + s->limit[H]) * (1 + 1e-12))) {
                                                full = true;
                                                break;
                                        }
                                }
                                if (!(acc[k].mode & R) || !next || next->phase != q)
                                        continue;       /* write-only, or written before this access */
                                if (tier == V || acc[k].tier == H)
                                        (void) prefetch_one(s, acc[k].tensor, tier, q);
                                else if (!t->valid[V])
                                        (void) prefetch_one(s, acc[k].tensor, H, q);    /* staged */
                        }
                        if (full)
                                break;
                }
        }
}

/* The client's write-downs on entering phase @p (PlanSimPlan.down): to NVMe, and out of VRAM and host. */
static void write_down(Sim *s, unsigned p) {
        if (!s->plan->down_start)
                return;
        for (size_t i = s->plan->down_start[p]; i < s->plan->down_start[p + 1]; i++) {
                size_t ti = s->plan->down[i];
                Tensor *t = &s->t[ti];

                if (held(s, ti))
                        continue;       /* pinned by tierd's holds: the eviction ends with EBUSY */
                if (!t->valid[N] && (t->valid[V] || t->valid[H])) {
                        if (!t->valid[H])
                                s->count.link_up += t->size;    /* through host */
                        s->count.nvme_write += t->size;
                        t->valid[N] = true;
                }
                for (unsigned k = V; k <= H; k++)
                        if (t->valid[k]) {
                                t->valid[k] = false;
                                s->used[k] -= t->size;
                        }
        }
}

static void run_phase(Sim *s) {
        unsigned p = (unsigned) (s->now % s->phases);
        size_t n;
        const PlanSimAccess *acc = phase_acc(s, p, &n);

        write_down(s, p);

        for (size_t k = 0; k < n; k++) {
                Access a = { p, acc[k].tier, acc[k].mode };

                bring(s, acc[k].tensor, &a);
        }
        /* dead copies go when the phase that used them last ends */
        for (size_t k = 0; k < n; k++) {
                Tensor *t = &s->t[acc[k].tensor];
                const Access *a = next_access(s, t, NULL);

                if (a && a->mode == W)
                        for (unsigned j = 0; j < TIERS; j++)
                                if (t->valid[j]) {
                                        t->valid[j] = false;
                                        s->used[j] -= j == N ? 0 : t->size;
                                }
        }
        prefetch(s);
        s->now++;
}

static void sim_free(Sim *s) {
        free(s->t);
        free(s->acc_all);
        free(s->start);
}

/* Two consecutive phases (the current one and the next, both held) must fit each tier's budget. */
static int check_pairs(const Sim *s, char *err, size_t err_size) {
        static const char *const opt[] = { "--vram-limit", "--host-limit" };
        static const char *const name[] = { "vram", "host" };

        for (unsigned tier = V; tier <= H; tier++)
                for (unsigned p = 0; p < s->phases; p++) {
                        unsigned q = (p + 1) % s->phases;
                        double need = 0;
                        size_t n;
                        const PlanSimAccess *acc;

                        for (size_t ti = 0; ti < s->n_tensors; ti++)
                                s->t[ti].stamp = 0;
                        for (unsigned h = 0; h < (s->phases > 1 ? 2u : 1u); h++) {
                                acc = phase_acc(s, h ? q : p, &n);
                                for (size_t k = 0; k < n; k++)
                                        if (acc[k].tier == tier && !s->t[acc[k].tensor].stamp) {
                                                s->t[acc[k].tensor].stamp = 1;
                                                need += s->t[acc[k].tensor].size;
                                        }
                        }
                        if (need > s->limit[tier] * (1 + 1e-12))
                                return fail(err, err_size, "%s %.0f bytes cannot hold phases %u and %u of the plan "
                                            "(%.0f bytes in %s; tierd holds the next phase while one runs): raise it",
                                            opt[tier], s->limit[tier], p, q, need, name[tier]);
                }
        return 0;
}

int plan_simulate_plan(const PlanSimPlan *plan, double vram_limit, double host_limit, PlanSimResult *ret, char *err,
                       size_t err_size) {
        Sim s = { .plan = plan };
        size_t total = 0, *fill = NULL;
        int r;

        if (plan->n_phases < 1 || plan->n_phases > PLAN_SIM_MAX_PHASES)
                return fail(err, err_size, "a plan to replay has 1 to %u phases, not %zu", PLAN_SIM_MAX_PHASES,
                            plan->n_phases);
        if (plan->n_tensors < 1 || plan->n_tensors > PLAN_SIM_MAX_TENSORS)
                return fail(err, err_size, "a plan to replay has 1 to %u tensors, not %zu", PLAN_SIM_MAX_TENSORS,
                            plan->n_tensors);
        if (!(isfinite(vram_limit) && vram_limit > 0 && isfinite(host_limit) && host_limit > 0))
                return fail(err, err_size, "the budgets to replay under must be above 0 bytes");
        s.phases = (unsigned) plan->n_phases;
        s.n_tensors = plan->n_tensors;
        total = plan->start[plan->n_phases];
        s.t = calloc(s.n_tensors, sizeof(*s.t));
        s.acc_all = calloc(total ? total : 1, sizeof(*s.acc_all));
        s.start = calloc(s.phases, sizeof(*s.start));
        fill = calloc(s.n_tensors, sizeof(*fill));
        if (!s.t || !s.acc_all || !s.start || !fill) {
                free(fill);
                sim_free(&s);
                return fail(err, err_size, "out of memory");
        }
        for (size_t ti = 0; ti < s.n_tensors; ti++) {
                if (!(isfinite(plan->size[ti]) && plan->size[ti] >= 0)) {
                        free(fill);
                        sim_free(&s);
                        return fail(err, err_size, "tensor %zu of the plan has no size (0 bytes or more)", ti);
                }
                s.t[ti].size = plan->size[ti];
                s.t[ti].valid[N] = true;        /* the state starts on NVMe; warm-up settles it */
        }
        for (size_t i = 0; i < total; i++) {
                const PlanSimAccess *a = &plan->acc[i];

                if (a->tensor >= s.n_tensors || a->tier > H || !(a->mode & (R | W)) || (a->mode & ~(R | W))) {
                        free(fill);
                        sim_free(&s);
                        return fail(err, err_size, "access %zu of the plan names no tensor, tier or mode", i);
                }
                s.t[a->tensor].n_acc++;
        }
        for (size_t p = 0; plan->down_start && p < plan->n_phases; p++)
                for (size_t i = plan->down_start[p]; i < plan->down_start[p + 1]; i++)
                        if (plan->down_start[p + 1] < plan->down_start[p] || plan->down[i] >= s.n_tensors) {
                                free(fill);
                                sim_free(&s);
                                return fail(err, err_size, "write-down %zu of phase %zu of the plan names no tensor",
                                            i - plan->down_start[p], p);
                        }
        for (size_t ti = 0, off = 0; ti < s.n_tensors; ti++) {
                s.t[ti].acc = s.acc_all + off;
                off += s.t[ti].n_acc;
        }
        for (unsigned p = 0; p < s.phases; p++) {
                double d = plan->phase_s ? plan->phase_s[p] : 1;

                if (!(isfinite(d) && d >= 0)) {
                        free(fill);
                        sim_free(&s);
                        return fail(err, err_size, "phase %u of the plan has no time", p);
                }
                for (size_t i = plan->start[p]; i < plan->start[p + 1]; i++) {
                        Tensor *t = &s.t[plan->acc[i].tensor];

                        t->acc[fill[plan->acc[i].tensor]++] = (Access) { p, plan->acc[i].tier, plan->acc[i].mode };
                }
                s.start[p] = s.step_time;
                s.step_time += d;
        }
        free(fill);
        if (s.step_time <= 0)
                s.step_time = 1;
        s.limit[V] = vram_limit;
        s.limit[H] = host_limit;
        s.limit[N] = INFINITY;
        r = check_pairs(&s, err, err_size);
        if (r < 0) {
                sim_free(&s);
                return r;
        }
        for (size_t ti = 0; ti < s.n_tensors; ti++)
                s.t[ti].stamp = 0;
        for (unsigned k = 0; k < WARMUP_STEPS * s.phases; k++)
                run_phase(&s);
        s.count = (PlanSimResult) {};
        for (unsigned k = 0; k < MEASURED_STEPS * s.phases; k++)
                run_phase(&s);
        ret->link_down = s.count.link_down / MEASURED_STEPS;
        ret->link_up = s.count.link_up / MEASURED_STEPS;
        ret->nvme_read = s.count.nvme_read / MEASURED_STEPS;
        ret->nvme_write = s.count.nvme_write / MEASURED_STEPS;
        sim_free(&s);
        return 0;
}

/*
 * The synthetic plan (plansim.h): tensors W_i = i, G_i = L + i, O_i = 2 L + i;
 * phases fwd_i, bwd (reverse), opt_i.
 */
int plan_simulate(const PlanSimInput *in, PlanSimResult *ret, char *err, size_t err_size) {
        double w = in->weights, g = in->grads, o = in->opt;
        bool timed = in->fwd_s > 0 || in->bwd_s > 0 || in->opt_s > 0;
        unsigned L = in->layers;
        PlanSimPlan plan = {};
        double *size = NULL, *phase_s = NULL;
        size_t *start = NULL;
        PlanSimAccess *acc = NULL;
        size_t n = 0;
        int r;

        if (in->layers < 1 || in->layers > PLAN_SIM_MAX_LAYERS)
                return fail(err, err_size, "--layers must be from 1 to %u to replay a step under limits",
                            PLAN_SIM_MAX_LAYERS);
        if (!(isfinite(w) && w > 0) || !(isfinite(g) && g >= 0) || !(isfinite(o) && o >= 0))
                return fail(err, err_size, "the per-layer weights must be above 0 bytes, gradients and "
                            "optimizer state 0 or more");
        if (!(isfinite(in->fwd_s) && in->fwd_s >= 0 && isfinite(in->bwd_s) && in->bwd_s >= 0 &&
              isfinite(in->opt_s) && in->opt_s >= 0))
                return fail(err, err_size, "the phase times must be 0 or more seconds");
        if (!(in->vram_limit >= 2 * (w + g)))
                return fail(err, err_size, "--vram-limit %.0f bytes cannot hold two backward phases of one "
                            "layer each (2 x (weights + gradients) = %.0f bytes): raise it or use more layers",
                            in->vram_limit, 2 * (w + g));
        if (!(in->host_limit >= 2 * (w + g + o)))
                return fail(err, err_size, "--host-limit %.0f bytes cannot hold two optimizer phases of one "
                            "layer each (2 x (weights + gradients + optimizer) = %.0f bytes): raise it or use "
                            "more layers", in->host_limit, 2 * (w + g + o));

        size = calloc(3 * (size_t) L, sizeof(*size));
        phase_s = calloc(3 * (size_t) L, sizeof(*phase_s));
        start = calloc(3 * (size_t) L + 1, sizeof(*start));
        acc = calloc(6 * (size_t) L, sizeof(*acc));
        if (!size || !phase_s || !start || !acc) {
                r = fail(err, err_size, "out of memory");
                goto out;
        }
        for (unsigned i = 0; i < L; i++) {
                size[i] = w;
                size[L + i] = g;
                size[2 * L + i] = o;
        }
        for (unsigned p = 0; p < 3 * L; p++) {
                unsigned i = p % L;

                start[p] = n;
                if (p < L) {
                        acc[n++] = (PlanSimAccess) { i, V, R };
                        phase_s[p] = timed ? in->fwd_s : 1;
                } else if (p < 2 * L) {
                        unsigned b = L - 1 - i;

                        acc[n++] = (PlanSimAccess) { b, V, R };
                        acc[n++] = (PlanSimAccess) { L + b, V, W };
                        phase_s[p] = timed ? in->bwd_s : 1;
                } else {
                        acc[n++] = (PlanSimAccess) { L + i, H, R };
                        acc[n++] = (PlanSimAccess) { 2 * L + i, H, R | W };
                        acc[n++] = (PlanSimAccess) { i, H, R | W };
                        phase_s[p] = timed ? in->opt_s : 1;
                }
        }
        start[3 * L] = n;
        plan = (PlanSimPlan) { .n_tensors = 3 * (size_t) L, .size = size, .n_phases = 3 * (size_t) L,
                               .start = start, .acc = acc, .phase_s = phase_s };
        r = plan_simulate_plan(&plan, in->vram_limit, in->host_limit, ret, err, err_size);
out:
        free(size);
        free(phase_s);
        free(start);
        free(acc);
        return r;
}
