/* SPDX-License-Identifier: MIT */
/* timeline-job.c: bench-timeline's synthetic training job on an iteration plan, and tierd's link counters. */

/*
 * Theory of operation
 *
 * A job is one client of tierd running one plan (timeline-plan.c): by
 * default the synthetic one, L layers; layer i has parameters P_i,
 * gradients G_i and optimizer state O_i, the plan of
 * tests/integration/test-timeline.c:
 *
 *   fwd_i  (i = 0..L-1):          P_i in VRAM, read
 *   bwd_i  (layers in reverse,
 *           b = L-1-i):           P_b in VRAM, read; G_b in VRAM, write
 *   opt_i  (i = 0..L-1):          G_i in host, read; O_i and P_i in host, read-write
 *
 * (--plan FILE: any plan, such as the one tier.torch derives for a model.)
 * Each phase is entered with tier_phase_enter(); then the job checks sample words
 * (one per 64 KiB and the last) of every tensor it reads against the
 * version it last wrote, stamps the next version into the same words of
 * every tensor it writes, and spins until the phase's compute time
 * (--fwd-us, --bwd-us, --opt-us: a busy loop standing in for the GPU or
 * the CPU optimizer) has passed since tier_phase_enter() returned.  A wrong word
 * anywhere counts as a mismatch, and a run with any is not "verified".
 *
 * With --phase-timeout, tier_phase_enter() runs under alarm(): a phase that never
 * becomes ready means tierd is stuck, and job_on_alarm() ends the process
 * with a message saying so instead of letting it hang.
 *
 * The runs measure what tierd moved from its status: counters_read() fetches
 * tier_client_status() JSON and timeline-status.c reads the counters out of it.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "bench/timeline-job.h"
#include "bench/timeline-plan.h"
#include "bench/timeline-status.h"
#include "bench/timeline.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* One word in this many bytes of every tensor is checked and stamped: a word in every NVMe extent. */
#define SAMPLE_STRIDE (UINT64_C(64) << 10)

/* What job_on_alarm() says when a phase never becomes ready; written before each tier_phase_enter(). */
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

        r = tier_client_status(c, TIER_STATUS_JSON, &json);
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

uint64_t job_compute_us(const Job *j, unsigned ph) {
        switch (j->a->plan->kind[ph]) {
        case TL_FWD:
                return j->a->fwd_us;
        case TL_BWD:
                return j->a->bwd_us;
        default:
                return j->a->opt_us;
        }
}

int job_phase(Job *j, unsigned ph, uint64_t compute_us) {
        const TlPlan *pl = j->a->plan;
        struct tier_grant g;
        char where[256];
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
        r = tier_phase_enter(j->c, ph);
        if (j->a->phase_timeout > 0)
                alarm(0);
        if (r < 0) {
                log_tier_error(j->c, r, "tier_phase_enter");
                return r;
        }
        if (j->n_trace < j->cap_trace) {
                j->trace[j->n_trace][0] = ph;
                j->trace[j->n_trace][1] = t0;
                j->trace[j->n_trace][2] = now_ns();
                j->n_trace++;
        }
        t0 = now_ns();
        for (size_t i = pl->start[ph]; i < pl->start[ph + 1]; i++) {
                const CbAccess *a = &pl->acc[i];
                unsigned id = a->tensor;

                (void) snprintf(where, sizeof(where), "phase %u, %s", ph, pl->names[id]);
                if ((r = grant(j, j->t[id], a->tier, &g)) < 0)
                        return r;
                if (a->mode & TIER_READ)
                        check(j, &g, id, j->ver[id], where);
                if (a->mode & TIER_WRITE)
                        stamp(j, &g, id, ++j->ver[id]);
        }
        spin_until(t0 + compute_us * 1000);
        j->compute_ns += now_ns() - t0;
        j->phases++;
        return 0;
}

int job_step(Job *j) {
        int r;

        for (unsigned ph = 0; ph < j->n_phases; ph++)
                if ((r = job_phase(j, ph, job_compute_us(j, ph))) < 0)
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
        r = tier_quota_set(ctl, TIER_QUOTA_JOB, 0, job, &q, NULL);
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
        for (size_t i = 0; j->t && i < j->a->plan->n_tensors; i++)
                if (j->t[i])
                        tier_tensor_close(j->t[i]);
        free(j->t);
        free(j->ver);
        free(j->trace);
        free(j);
        return NULL;
}

int job_new(const Args *a, const char *name, unsigned weight, Job **ret) {
        const TlPlan *pl = a->plan;
        tier_plan *plan = NULL;
        Job *j;
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->a = a;
        j->n_phases = (unsigned) pl->n_phases;
        j->seed = splitmix64(now_ns() ^ ((uint64_t) getpid() << 32));
        j->t = calloc(pl->n_tensors, sizeof(*j->t));
        j->ver = calloc(pl->n_tensors, sizeof(*j->ver));
        if (!j->t || !j->ver) {
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
        for (size_t i = 0; i < pl->n_tensors; i++) {
                r = tier_tensor_create(j->c, pl->names[i], pl->size[i], &j->t[i]);
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
        for (size_t k = 0; k < pl->n_phases && r >= 0; k++)
                for (size_t i = pl->start[k]; i < pl->start[k + 1] && r >= 0; i++)
                        r = tier_plan_add(plan, (unsigned) k, j->t[pl->acc[i].tensor], pl->acc[i].tier,
                                          pl->acc[i].mode);
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
        int r = tier_phase_enter(j->c, 0);

        if (r < 0)
                log_tier_error(j->c, r, "the closing tier_phase_enter");
        return r;
}

