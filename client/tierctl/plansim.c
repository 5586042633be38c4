/* SPDX-License-Identifier: MIT */
/* plansim.c: replay of a training step under job limits (the rules are in plansim.h). */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "client/tierctl/plansim.h"

enum { V, H, N, TIERS };                /* VRAM, host, NVMe */
enum { R = 1, W = 2 };                  /* access modes */
enum { WARMUP_STEPS = 4, MEASURED_STEPS = 2 };

typedef struct Access {
        unsigned phase;                 /* within a step */
        unsigned tier;                  /* V or H */
        unsigned mode;
} Access;

typedef struct Tensor {
        double size;
        bool valid[TIERS];
        Access acc[3];                  /* W: fwd, bwd, opt; G: bwd, opt; O: opt */
        unsigned n_acc;
        unsigned long long stamp;
} Tensor;

typedef struct Sim {
        const PlanSimInput *in;
        unsigned L, phases;             /* phases per step: 3 L */
        Tensor *t;                      /* W_0.., G_0.., O_0.. */
        double *start;                  /* start time of each phase within a step */
        double step_time;
        double used[TIERS], limit[TIERS];
        unsigned long long now;         /* global phase counter */
        PlanSimResult count;
        unsigned long long stamp;
} Sim;

static int fail(char *err, size_t err_size, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* The accesses of phase p (within a step): up to 3, tensor indexes in @tensor. */
static unsigned phase_accesses(unsigned L, unsigned p, unsigned tensor[3], Access acc[3]) {
        unsigned i = p % L;

        if (p < L) {
                tensor[0] = i;
                acc[0] = (Access) { p, V, R };
                return 1;
        }
        if (p < 2 * L) {
                unsigned b = L - 1 - i;

                tensor[0] = b;
                acc[0] = (Access) { p, V, R };
                tensor[1] = L + b;
                acc[1] = (Access) { p, V, W };
                return 2;
        }
        tensor[0] = L + i;
        acc[0] = (Access) { p, H, R };
        tensor[1] = 2 * L + i;
        acc[1] = (Access) { p, H, R | W };
        tensor[2] = i;
        acc[2] = (Access) { p, H, R | W };
        return 3;
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

static bool held(const Sim *s, unsigned ti) {
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

static void evict(Sim *s, unsigned ti, unsigned tier) {
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
                unsigned victim = 0;

                for (unsigned ti = 0; ti < 3 * s->L; ti++) {
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

static void bring(Sim *s, unsigned ti, const Access *a) {
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
static bool prefetch_one(Sim *s, unsigned ti, unsigned tier, unsigned phase) {
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
                        unsigned q = (cur + d) % s->phases, tensor[3];
                        Access acc[3];
                        unsigned n = phase_accesses(s->L, q, tensor, acc);
                        bool full = false;

                        for (unsigned k = 0; k < n && !full; k++) {
                                Tensor *t = &s->t[tensor[k]];
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
                                        (void) prefetch_one(s, tensor[k], tier, q);
                                else if (!t->valid[V])
                                        (void) prefetch_one(s, tensor[k], H, q);        /* staged */
                        }
                        if (full)
                                break;
                }
        }
}

static void run_phase(Sim *s) {
        unsigned p = (unsigned) (s->now % s->phases), tensor[3];
        Access acc[3];
        unsigned n = phase_accesses(s->L, p, tensor, acc);

        for (unsigned k = 0; k < n; k++)
                bring(s, tensor[k], &acc[k]);
        /* dead copies go when the phase that used them last ends */
        for (unsigned k = 0; k < n; k++) {
                Tensor *t = &s->t[tensor[k]];
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

int plan_simulate(const PlanSimInput *in, PlanSimResult *ret, char *err, size_t err_size) {
        double w = in->weights, g = in->grads, o = in->opt;
        Sim s = { .in = in, .L = in->layers };
        bool timed = in->fwd_s > 0 || in->bwd_s > 0 || in->opt_s > 0;

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

        s.phases = 3 * s.L;
        s.t = calloc(3 * (size_t) s.L, sizeof(*s.t));
        s.start = calloc(s.phases, sizeof(*s.start));
        if (!s.t || !s.start) {
                free(s.t);
                free(s.start);
                return fail(err, err_size, "out of memory");
        }
        for (unsigned p = 0; p < s.phases; p++) {
                unsigned tensor[3];
                Access acc[3];
                unsigned n = phase_accesses(s.L, p, tensor, acc);
                double d = !timed ? 1 : p < s.L ? in->fwd_s : p < 2 * s.L ? in->bwd_s : in->opt_s;

                for (unsigned k = 0; k < n; k++)
                        s.t[tensor[k]].acc[s.t[tensor[k]].n_acc++] = acc[k];
                s.start[p] = s.step_time;
                s.step_time += d;
        }
        if (s.step_time <= 0)
                s.step_time = 1;
        for (unsigned i = 0; i < 3 * s.L; i++) {
                s.t[i].size = i < s.L ? w : i < 2 * s.L ? g : o;
                s.t[i].valid[N] = true;         /* the state starts on NVMe; warm-up settles it */
        }
        s.limit[V] = in->vram_limit;
        s.limit[H] = in->host_limit;
        s.limit[N] = INFINITY;
        for (unsigned k = 0; k < WARMUP_STEPS * s.phases; k++)
                run_phase(&s);
        s.count = (PlanSimResult) {};
        for (unsigned k = 0; k < MEASURED_STEPS * s.phases; k++)
                run_phase(&s);
        ret->link_down = s.count.link_down / MEASURED_STEPS;
        ret->link_up = s.count.link_up / MEASURED_STEPS;
        ret->nvme_read = s.count.nvme_read / MEASURED_STEPS;
        ret->nvme_write = s.count.nvme_write / MEASURED_STEPS;
        free(s.t);
        free(s.start);
        return 0;
}
