/* SPDX-License-Identifier: MIT */
/* timeline-job.c: bench-timeline's synthetic training job on an iteration plan, and tierd's link counters. */

/*
 * Theory of operation
 *
 * A job is one client of tierd.  It has L layers; layer i has parameters
 * P_i, gradients G_i and optimizer state O_i.  Its plan is the one of
 * tests/integration/test-timeline.c:
 *
 *   fwd_i  (i = 0..L-1):          P_i in VRAM, read
 *   bwd_i  (layers in reverse,
 *           b = L-1-i):           P_b in VRAM, read; G_b in VRAM, write
 *   opt_i  (i = 0..L-1):          G_i in host, read; O_i and P_i in host, read-write
 *
 * Each phase is entered with tier_phase(); then the job checks sample words
 * (one per 64 KiB and the last) of every tensor it reads against the
 * version it last wrote, stamps the next version into the same words of
 * every tensor it writes, and spins until the phase's compute time
 * (--fwd-us, --bwd-us, --opt-us: a busy loop standing in for the GPU or
 * the CPU optimizer) has passed since tier_phase() returned.  A wrong word
 * anywhere counts as a mismatch, and a run with any is not "verified".
 *
 * With --phase-timeout, tier_phase() runs under alarm(): a phase that never
 * becomes ready means tierd is stuck, and job_on_alarm() ends the process
 * with a message saying so instead of letting it hang.
 *
 * The runs measure what tierd moved from its status: counters_read() fetches
 * tier_status() JSON and timeline-status.c reads the counters out of it.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "bench/timeline-job.h"
#include "bench/timeline-status.h"
#include "bench/timeline.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* One word in this many bytes of every tensor is checked and stamped: a word in every NVMe extent. */
#define SAMPLE_STRIDE (UINT64_C(64) << 10)
/* Tensor ids in the pattern. */
#define ID_P 0u
#define ID_G 1000u
#define ID_O 2000u

/* What job_on_alarm() says when a phase never becomes ready; written before each tier_phase(). */
static char stuck_msg[256];
static size_t stuck_len;

void job_on_alarm(int sig) {
        (void) write(STDERR_FILENO, stuck_msg, stuck_len);
        _exit(3);
}

static uint64_t splitmix64(uint64_t x) {
        x += UINT64_C(0x9e3779b97f4a7c15);
        x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
        return x ^ (x >> 31);
}

/* Word @w of version @v of tensor @id; version 0 is all zeros (a new tensor). */
static inline uint64_t pattern(uint64_t seed, unsigned id, unsigned v, uint64_t w) {
        if (v == 0)
                return 0;
        return splitmix64(seed ^ ((uint64_t) id << 48) ^ ((uint64_t) v << 24) ^ w) | 1;
}

static void log_tier_error(tier_client *c, int r, const char *what) {
        const char *why = c ? tier_client_last_error(c) : "";

        bench_log("%s failed: %s%s%s", what, tier_strerror(r), why && *why ? ": " : "", why && *why ? why : "");
}

static void spin_until(uint64_t t) {
        while (now_ns() < t)
                ;
}

/* ---- status ------------------------------------------------------------------- */

int counters_read(tier_client *c, Counters *ret, char *policy, size_t policy_size) {
        _cleanup_free_ char *json = NULL;
        int r;

        r = tier_status(c, TIER_STATUS_JSON, &json);
        if (r < 0) {
                log_tier_error(c, r, "status");
                return r;
        }
        r = counters_parse(json, ret, policy, policy_size);
        if (r < 0)
                bench_log("no link counters in tierd's status");
        return r;
}

/* ---- the job ------------------------------------------------------------------ */

static unsigned ph_fwd(const Job *j, unsigned i) {
        return i;
}

static unsigned ph_bwd(const Job *j, unsigned i) {
        return (unsigned) j->a->layers + i;
}

static unsigned ph_opt(const Job *j, unsigned i) {
        return 2 * (unsigned) j->a->layers + i;
}

/* Check the sample words of @g against version @v of tensor @id. */
static void check(Job *j, const struct tier_grant *g, unsigned id, unsigned v, const char *where) {
        const uint64_t *w = g->ptr;
        uint64_t words = g->length / 8;

        if (!w) {
                if (j->mismatches++ == 0)
                        bench_log("%s: tensor %u has no mapping", where, id);
                return;
        }
        for (uint64_t k = 0; k < words; k += SAMPLE_STRIDE / 8) {
                uint64_t idx[2] = { k, MIN(k + SAMPLE_STRIDE / 8, words) - 1 };

                for (int x = 0; x < (k + SAMPLE_STRIDE / 8 >= words ? 2 : 1); x++) {
                        uint64_t want = pattern(j->seed, id, v, idx[x]);

                        j->words_checked++;
                        if (w[idx[x]] != want) {
                                if (j->mismatches++ == 0)
                                        bench_log("%s: tensor %u word %" PRIu64 " is %#" PRIx64 ", want %#" PRIx64
                                                  " (version %u)", where, id, idx[x], w[idx[x]], want, v);
                        }
                }
        }
}

static void stamp(Job *j, const struct tier_grant *g, unsigned id, unsigned v) {
        uint64_t *w = g->ptr;
        uint64_t words = g->length / 8;

        if (!w)
                return;
        for (uint64_t k = 0; k < words; k += SAMPLE_STRIDE / 8) {
                w[k] = pattern(j->seed, id, v, k);
                if (k + SAMPLE_STRIDE / 8 >= words)
                        w[words - 1] = pattern(j->seed, id, v, words - 1);
        }
}

static int grant(Job *j, tier_tensor *t, int tier, struct tier_grant *g) {
        int r = tier_phase_grant(j->c, t, tier, g);

        if (r < 0)
                log_tier_error(j->c, r, "tier_phase_grant");
        return r;
}

int job_phase(Job *j, unsigned ph, uint64_t compute_us) {
        unsigned L = (unsigned) j->a->layers;
        struct tier_grant g;
        char where[48];
        uint64_t t0;
        int r;

        if (j->a->phase_timeout > 0) {
                int k = snprintf(stuck_msg, sizeof(stuck_msg), "%s: pid %ld: phase %u not ready after %" PRIu64
                                 " s: tierd is stuck (see its log)\n", program_invocation_short_name,
                                 (long) getpid(), ph, j->a->phase_timeout);

                stuck_len = k > 0 ? MIN((size_t) k, sizeof(stuck_msg) - 1) : 0;
                alarm((unsigned) j->a->phase_timeout);
        }
        t0 = now_ns();
        r = tier_phase(j->c, ph);
        if (j->a->phase_timeout > 0)
                alarm(0);
        if (r < 0) {
                log_tier_error(j->c, r, "tier_phase");
                return r;
        }
        if (j->n_trace < j->cap_trace) {
                j->trace[j->n_trace][0] = ph;
                j->trace[j->n_trace][1] = t0;
                j->trace[j->n_trace][2] = now_ns();
                j->n_trace++;
        }
        t0 = now_ns();
        if (ph < L) {
                unsigned i = ph;

                (void) snprintf(where, sizeof(where), "fwd %u", i);
                if ((r = grant(j, j->P[i], TIER_VRAM, &g)) < 0)
                        return r;
                check(j, &g, ID_P + i, j->vp[i], where);
        } else if (ph < 2 * L) {
                unsigned b = L - 1 - (ph - L);

                (void) snprintf(where, sizeof(where), "bwd %u", b);
                if ((r = grant(j, j->P[b], TIER_VRAM, &g)) < 0)
                        return r;
                check(j, &g, ID_P + b, j->vp[b], where);
                if ((r = grant(j, j->G[b], TIER_VRAM, &g)) < 0)
                        return r;
                stamp(j, &g, ID_G + b, ++j->vg[b]);
        } else {
                unsigned i = ph - 2 * L;

                (void) snprintf(where, sizeof(where), "opt %u", i);
                if ((r = grant(j, j->G[i], TIER_HOST, &g)) < 0)
                        return r;
                check(j, &g, ID_G + i, j->vg[i], where);
                if ((r = grant(j, j->O[i], TIER_HOST, &g)) < 0)
                        return r;
                check(j, &g, ID_O + i, j->vo[i], where);
                stamp(j, &g, ID_O + i, ++j->vo[i]);
                if ((r = grant(j, j->P[i], TIER_HOST, &g)) < 0)
                        return r;
                check(j, &g, ID_P + i, j->vp[i], where);
                stamp(j, &g, ID_P + i, ++j->vp[i]);
        }
        spin_until(t0 + compute_us * 1000);
        j->compute_ns += now_ns() - t0;
        j->phases++;
        return 0;
}

int job_step(Job *j) {
        unsigned L = (unsigned) j->a->layers;
        int r;

        for (unsigned i = 0; i < L; i++)
                if ((r = job_phase(j, ph_fwd(j, i), j->a->fwd_us)) < 0)
                        return r;
        for (unsigned i = 0; i < L; i++)
                if ((r = job_phase(j, ph_bwd(j, i), j->a->bwd_us)) < 0)
                        return r;
        for (unsigned i = 0; i < L; i++)
                if ((r = job_phase(j, ph_opt(j, i), j->a->opt_us)) < 0)
                        return r;
        return 0;
}

static int set_own_weight(const Args *a, const char *job, unsigned weight) {
        struct tier_quota q = { .weight = weight };
        tier_client *ctl = NULL;
        int r;

        r = bench_connect(&ctl, a->socket, NULL, 0, 10000);
        if (r < 0) {
                bench_log("control connection: %s", tier_strerror(r));
                return r;
        }
        r = tier_quota_set(ctl, job, &q);
        if (r < 0)
                log_tier_error(ctl, r, "setting the weight (needs root or group tier-admin)");
        tier_client_free(ctl);
        return r;
}

/*
 * The connection goes first, and its plan with it; the tensors are only
 * closed, and tierd frees them when the job's linger time ends (it refuses
 * to destroy a tensor that a live plan names).
 */
Job *job_free(Job *j) {
        if (!j)
                return NULL;
        j->c = tier_client_free(j->c);
        for (uint64_t i = 0; i < j->a->layers; i++) {
                if (j->P && j->P[i])
                        tier_tensor_close(j->P[i]);
                if (j->G && j->G[i])
                        tier_tensor_close(j->G[i]);
                if (j->O && j->O[i])
                        tier_tensor_close(j->O[i]);
        }
        free(j->P);
        free(j->G);
        free(j->O);
        free(j->vp);
        free(j->vg);
        free(j->vo);
        free(j->trace);
        free(j);
        return NULL;
}

int job_new(const Args *a, const char *name, unsigned weight, Job **ret) {
        unsigned L = (unsigned) a->layers;
        tier_plan *plan = NULL;
        Job *j;
        char tn[32];
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->a = a;
        j->n_phases = 3 * L;
        j->seed = splitmix64(now_ns() ^ ((uint64_t) getpid() << 32));
        j->P = calloc(L, sizeof(*j->P));
        j->G = calloc(L, sizeof(*j->G));
        j->O = calloc(L, sizeof(*j->O));
        j->vp = calloc(L, sizeof(*j->vp));
        j->vg = calloc(L, sizeof(*j->vg));
        j->vo = calloc(L, sizeof(*j->vo));
        if (!j->P || !j->G || !j->O || !j->vp || !j->vg || !j->vo) {
                job_free(j);
                return -ENOMEM;
        }

        r = bench_connect(&j->c, a->socket, name, 0, 10000);
        if (r < 0) {
                bench_log("connecting to tierd at %s as job %s: %s", a->socket, name, *tier_client_last_error(NULL) ?
                          tier_client_last_error(NULL) : tier_strerror(r));
                job_free(j);
                return r;
        }
        /* the job exists now: its weight must be in place before its plan competes */
        if (weight > 0) {
                r = set_own_weight(a, name, weight);
                if (r < 0) {
                        job_free(j);
                        return r;
                }
        }
        for (unsigned i = 0; i < L; i++) {
                (void) snprintf(tn, sizeof(tn), "P%u", i);
                r = tier_tensor_create(j->c, tn, a->p_size, &j->P[i]);
                if (r >= 0) {
                        (void) snprintf(tn, sizeof(tn), "G%u", i);
                        r = tier_tensor_create(j->c, tn, a->g_size, &j->G[i]);
                }
                if (r >= 0) {
                        (void) snprintf(tn, sizeof(tn), "O%u", i);
                        r = tier_tensor_create(j->c, tn, a->o_size, &j->O[i]);
                }
                if (r < 0) {
                        log_tier_error(j->c, r, "creating a tensor");
                        job_free(j);
                        return r;
                }
        }

        r = tier_plan_new(j->c, &plan);
        if (r < 0) {
                job_free(j);
                return r;
        }
        for (unsigned i = 0; i < L && r >= 0; i++) {
                unsigned b = L - 1 - i;         /* backward runs the layers in reverse */

                if (r >= 0)
                        r = tier_plan_add(plan, ph_fwd(j, i), j->P[i], TIER_VRAM, TIER_READ);
                if (r >= 0)
                        r = tier_plan_add(plan, ph_bwd(j, i), j->P[b], TIER_VRAM, TIER_READ);
                if (r >= 0)
                        r = tier_plan_add(plan, ph_bwd(j, i), j->G[b], TIER_VRAM, TIER_WRITE);
                if (r >= 0)
                        r = tier_plan_add(plan, ph_opt(j, i), j->G[i], TIER_HOST, TIER_READ);
                if (r >= 0)
                        r = tier_plan_add(plan, ph_opt(j, i), j->O[i], TIER_HOST, TIER_READ_WRITE);
                if (r >= 0)
                        r = tier_plan_add(plan, ph_opt(j, i), j->P[i], TIER_HOST, TIER_READ_WRITE);
        }
        if (r >= 0)
                r = tier_plan_submit(plan);
        if (r < 0) {
                log_tier_error(j->c, r, "submitting the plan");
                tier_plan_free(plan);
                job_free(j);
                return r;
        }
        *ret = j;
        return 0;
}

int job_finish(Job *j) {
        int r = tier_phase(j->c, 0);

        if (r < 0)
                log_tier_error(j->c, r, "the closing tier_phase");
        return r;
}

