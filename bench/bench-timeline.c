/* SPDX-License-Identifier: MIT */
/* bench-timeline.c: a synthetic training job on an iteration plan: step time against its lower bound. */

/*
 * Theory of operation
 *
 * The program is one (or, with --fair, several) synthetic training jobs, each
 * a client of a running tierd whose policy ([sched] policy), budgets (job
 * limits below the job's data) and link throttles ([nvme] bandwidth, [vram]
 * bandwidth) bench/run has set, so that all three tiers are in play and the
 * run is reproducible.
 *
 * A job has L layers; layer i has parameters P_i, gradients G_i and
 * optimizer state O_i.  Its plan is the one of tests/integration/test-timeline.c:
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
 * anywhere makes "verified" false.
 *
 * Single job (the default): --warmup steps, then --steps timed steps.  A
 * step is the time between two tier_phase(c, 0) calls.  Around the timed
 * steps the program reads tierd's status (tier_status, JSON) and takes the
 * deltas of the global link counters (the job is tierd's only one), and of
 * tier_phase_stall().  The baseline is the step's lower bound in the same
 * run: max(compute, NVMe bytes / NVMe bandwidth, host<->VRAM bytes / link
 * bandwidth), with the bytes this run actually moved per step (reads and
 * writes share a throttled NVMe target, and both directions share the
 * emulated VRAM link).  ratio = step_s / lower_bound_s.
 *
 * --fair W1,W2,...: first one job alone (weight 1) for --duration seconds
 * after its warm-up, then one job per weight at once, each of which sets
 * its own weight with tier_quota_set() on a control connection (the
 * daemon requires root or tier-admin) before it submits its plan.  All
 * warm up, meet at a barrier and run until the same deadline; a job's
 * throughput is the phases it completed per second (finer than steps; all
 * jobs run the same plan, so a phase is the same work for each).  With
 * x_i = throughput_i / weight_i, Jain's index J = (sum x)^2 / (n sum x^2)
 * is 1 when the shares follow the weights exactly.  The aggregate NVMe
 * throughput of the group is compared with that of the lone job.
 *
 * One JSON line on stdout per run; progress on stderr.  Nothing is asserted.
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "proto/macro.h"
#include "util/size.h"
#include "util/time-util.h"

/* One word in this many bytes of every tensor is checked and stamped: a word in every NVMe extent. */
#define SAMPLE_STRIDE (UINT64_C(64) << 10)
/* Most layers and jobs: plenty for a benchmark, and bounded arrays. */
#define MAX_LAYERS 256
#define MAX_JOBS 16
#define MAX_STEPS 10000
/* A phase that is not ready after this long means tierd is stuck: fail instead of hanging (--phase-timeout). */
#define PHASE_TIMEOUT_S 60
/* Tensor ids in the pattern. */
#define ID_P 0u
#define ID_G 1000u
#define ID_O 2000u

typedef struct Args {
        const char *socket;
        const char *job;
        uint64_t layers;
        uint64_t p_size, g_size, o_size;
        uint64_t fwd_us, bwd_us, opt_us;
        uint64_t warmup, steps;
        uint64_t nvme_bw, link_bw;      /* bytes/s, for the lower bound; 0: not counted */
        uint64_t targets;               /* NVMe targets the bandwidth is per */
        uint64_t weight;                /* set this job's weight first (0: leave it) */
        double duration;                /* --fair: seconds of each timed run */
        unsigned weights[MAX_JOBS];
        size_t n_weights;               /* --fair: > 0 */
        const char *config;             /* a name for the JSON line */
        const char *trace;              /* single job: write every timed phase's marker and ready times here */
        uint64_t phase_timeout;         /* seconds; 0: wait forever */
} Args;

/* Link counters from tierd's status (bytes). */
typedef struct Counters {
        uint64_t nvme_read, nvme_write, to_vram, from_vram;
        uint64_t target_read, target_written;
} Counters;

typedef struct Job {
        tier_client *c;
        const Args *a;
        tier_tensor **P, **G, **O;
        unsigned *vp, *vg, *vo;         /* version last written; 0: never (zeros) */
        uint64_t seed;
        uint64_t words_checked;
        uint64_t mismatches;
        uint64_t phases;                /* phases completed */
        uint64_t compute_ns;            /* time between tier_phase() returning and the next call */
        unsigned n_phases;
        /* --trace: per timed phase, when tier_phase() was called and when it returned */
        uint64_t (*trace)[3];
        size_t n_trace, cap_trace;
} Job;

/* Per-process result of one --fair job, sent to the parent through a pipe. */
typedef struct FairResult {
        int status;                     /* 0, or the negative error that ended it */
        uint64_t phases;
        uint64_t steps;
        uint64_t mismatches;
        uint64_t words_checked;
        double seconds;                 /* from the barrier to its last phase */
        double stall_s;
} FairResult;

/* What the SIGALRM handler says when a phase never becomes ready; written before each tier_phase(). */
static char stuck_msg[256];
static size_t stuck_len;

static void on_alarm(int sig) {
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

/* ---- status JSON ------------------------------------------------------------ */

/* The unsigned number after `"key":` at or after @from, within @end (NULL: anywhere). */
static int json_u64(const char *from, const char *end, const char *key, uint64_t *ret) {
        char pat[96];
        const char *p;
        char *e;

        (void) snprintf(pat, sizeof(pat), "\"%s\":", key);
        p = strstr(from, pat);
        if (!p || (end && p >= end))
                return -EBADMSG;
        p += strlen(pat);
        errno = 0;
        *ret = strtoull(p, &e, 10);
        if (errno || e == p)
                return -EBADMSG;
        return 0;
}

static int link_bytes(const char *json, const char *name, uint64_t *ret) {
        char pat[64];
        const char *p;

        (void) snprintf(pat, sizeof(pat), "{\"name\":\"%s\",", name);
        p = strstr(json, pat);
        if (!p)
                return -EBADMSG;
        return json_u64(p, NULL, "bytes", ret);
}

/* Global link counters and the sum of the NVMe targets' counters. */
static int read_counters(tier_client *c, Counters *ret, char *policy, size_t policy_size) {
        _cleanup_free_ char *json = NULL;
        const char *p, *end;
        Counters k = {};
        int r;

        r = tier_status(c, TIER_STATUS_JSON, &json);
        if (r < 0) {
                log_tier_error(c, r, "status");
                return r;
        }
        if (link_bytes(json, "nvme->host", &k.nvme_read) < 0 || link_bytes(json, "host->nvme", &k.nvme_write) < 0 ||
            link_bytes(json, "host->vram", &k.to_vram) < 0 || link_bytes(json, "vram->host", &k.from_vram) < 0) {
                bench_log("no link counters in tierd's status");
                return -EBADMSG;
        }
        p = strstr(json, "\"targets\":[");
        end = p ? strstr(p, "],\"jobs\"") : NULL;
        while (p && end && (p = strstr(p, "{\"path\":")) && p < end) {
                uint64_t w = 0, rd = 0;

                if (json_u64(p, end, "bytes_written", &w) < 0 || json_u64(p, end, "bytes_read", &rd) < 0)
                        break;
                k.target_written += w;
                k.target_read += rd;
                p++;
        }
        if (policy) {
                const char *q = strstr(json, "\"policy\":\"");
                size_t n = 0;

                policy[0] = '\0';
                if (q) {
                        q += strlen("\"policy\":\"");
                        while (q[n] && q[n] != '"' && n + 1 < policy_size)
                                n++;
                        memcpy(policy, q, n);
                        policy[n] = '\0';
                }
        }
        *ret = k;
        return 0;
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

/*
 * job_phase() - enter phase @ph and do its work: check what it reads, stamp
 * what it writes, spin until @compute_us have passed since it was ready.
 */
static int job_phase(Job *j, unsigned ph, uint64_t compute_us) {
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

static int job_step(Job *j) {
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
static Job *job_free(Job *j) {
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

/* Connect as @name, set the weight if asked, create the tensors and submit the plan. */
static int job_new(const Args *a, const char *name, unsigned weight, Job **ret) {
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

/* The last phase's writes are released by one more marker. */
static int job_finish(Job *j) {
        int r = tier_phase(j->c, 0);

        if (r < 0)
                log_tier_error(j->c, r, "the closing tier_phase");
        return r;
}

/* ---- single job ------------------------------------------------------------------ */

static double per_step_gb(uint64_t bytes, uint64_t steps) {
        return (double) bytes / (double) steps / 1e9;
}

static int run_single(const Args *a) {
        _cleanup_free_ double *step_s = NULL;
        Job *j = NULL;
        Counters c0, c1;
        char policy[32] = "", job[64];
        uint64_t t0, t_end, compute0, words0;
        double stall0, stall_s, compute_s, nvme_s, link_s, bound, step_med, step_mean;
        uint64_t nvme_r, nvme_w, link_b, tgt_r, tgt_w;
        BenchJson js;
        int r;

        step_s = calloc(a->steps, sizeof(double));
        if (!step_s)
                return -ENOMEM;
        if (!a->job)
                (void) snprintf(job, sizeof(job), "bench-timeline-%ld", (long) getpid());
        r = job_new(a, a->job ? a->job : job, (unsigned) a->weight, &j);
        if (r < 0)
                return r;
        bench_log("job %s: %" PRIu64 " layers, P %" PRIu64 " G %" PRIu64 " O %" PRIu64 " bytes; limits vram %" PRIu64
                  " host %" PRIu64 "; compute fwd %" PRIu64 " bwd %" PRIu64 " opt %" PRIu64 " us", a->job ? a->job : job,
                  a->layers, a->p_size, a->g_size, a->o_size, tier_client_limit(j->c, TIER_VRAM),
                  tier_client_limit(j->c, TIER_HOST), a->fwd_us, a->bwd_us, a->opt_us);

        for (uint64_t s = 0; s < a->warmup; s++) {
                uint64_t ts = now_ns();

                r = job_step(j);
                if (r < 0)
                        goto finish;
                bench_log("warm-up step %" PRIu64 ": %.3f s", s + 1, (double) (now_ns() - ts) / 1e9);
        }

        r = read_counters(j->c, &c0, policy, sizeof(policy));
        if (r < 0)
                goto finish;
        stall0 = tier_phase_stall(j->c);
        compute0 = j->compute_ns;
        words0 = j->words_checked;
        if (a->trace) {
                j->cap_trace = a->steps * j->n_phases + 1;
                j->trace = calloc(j->cap_trace, sizeof(*j->trace));
                if (!j->trace)
                        j->cap_trace = 0;
        }
        t0 = now_ns();
        for (uint64_t s = 0; s < a->steps; s++) {
                uint64_t ts = now_ns();

                r = job_step(j);
                if (r < 0)
                        goto finish;
                step_s[s] = (double) (now_ns() - ts) / 1e9;
                bench_log("step %" PRIu64 ": %.3f s, stall so far %.3f s", s + 1, step_s[s],
                          tier_phase_stall(j->c) - stall0);
        }
        /* the step ends where the next one's marker goes */
        r = job_finish(j);
        if (r < 0)
                goto finish;
        t_end = now_ns();
        r = read_counters(j->c, &c1, NULL, 0);
        if (r < 0)
                goto finish;
        if (a->trace) {
                FILE *f = fopen(a->trace, "we");

                if (!f)
                        bench_log("cannot write %s: %m", a->trace);
                else {
                        /* phase, marker time, ready time (CLOCK_MONOTONIC ns) */
                        for (size_t k = 0; k < j->n_trace; k++)
                                fprintf(f, "%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", j->trace[k][0], j->trace[k][1],
                                        j->trace[k][2]);
                        fclose(f);
                }
        }
        stall_s = (tier_phase_stall(j->c) - stall0) / (double) a->steps;
        compute_s = (double) (j->compute_ns - compute0) / 1e9 / (double) a->steps;

        nvme_r = c1.nvme_read - c0.nvme_read;
        nvme_w = c1.nvme_write - c0.nvme_write;
        link_b = (c1.to_vram - c0.to_vram) + (c1.from_vram - c0.from_vram);
        tgt_r = c1.target_read - c0.target_read;
        tgt_w = c1.target_written - c0.target_written;
        nvme_s = a->nvme_bw ? (double) (nvme_r + nvme_w) / (double) a->steps / ((double) a->nvme_bw * (double) a->targets)
                            : 0;
        link_s = a->link_bw ? (double) link_b / (double) a->steps / (double) a->link_bw : 0;
        bound = MAX(compute_s, MAX(nvme_s, link_s));
        step_med = bench_median(step_s, a->steps);
        step_mean = (double) (t_end - t0) / 1e9 / (double) a->steps;
        bench_log("policy %s: step %.3f s (mean %.3f), bound %.3f s (compute %.3f, nvme %.3f, link %.3f), "
                  "stall %.3f s/step, verified %s", policy, step_med, step_mean, bound, compute_s, nvme_s, link_s,
                  stall_s, j->mismatches == 0 ? "yes" : "NO");

        bench_json_init(&js, "timeline");
        if (a->config)
                bench_json_string(&js, "config", a->config);
        bench_json_string(&js, "policy", policy);
        bench_json_double(&js, "step_s", step_med);
        bench_json_double(&js, "lower_bound_s", bound);
        bench_json_double(&js, "ratio", step_med / bound);
        bench_json_double(&js, "step_s_mean", step_mean);
        bench_json_double(&js, "stall_s", stall_s);
        bench_json_double(&js, "compute_s", compute_s);
        bench_json_double(&js, "nvme_s", nvme_s);
        bench_json_double(&js, "link_s", link_s);
        bench_json_double(&js, "nvme_read_gb", per_step_gb(nvme_r, a->steps));
        bench_json_double(&js, "nvme_write_gb", per_step_gb(nvme_w, a->steps));
        bench_json_double(&js, "link_gb", per_step_gb(link_b, a->steps));
        bench_json_double(&js, "target_read_gb", per_step_gb(tgt_r, a->steps));
        bench_json_double(&js, "target_write_gb", per_step_gb(tgt_w, a->steps));
        bench_json_bool(&js, "verified", j->mismatches == 0);
        bench_json_u64(&js, "words_checked", j->words_checked - words0);
        bench_json_u64(&js, "steps", a->steps);
        bench_json_u64(&js, "warmup", a->warmup);
        bench_json_u64(&js, "layers", a->layers);
        bench_json_u64(&js, "param_bytes", a->p_size);
        bench_json_u64(&js, "grad_bytes", a->g_size);
        bench_json_u64(&js, "opt_bytes", a->o_size);
        bench_json_u64(&js, "vram_limit", tier_client_limit(j->c, TIER_VRAM));
        bench_json_u64(&js, "host_limit", tier_client_limit(j->c, TIER_HOST));
        bench_json_u64(&js, "nvme_bw", a->nvme_bw);
        bench_json_u64(&js, "nvme_targets", a->targets);
        bench_json_u64(&js, "link_bw", a->link_bw);
        bench_json_u64(&js, "fwd_us", a->fwd_us);
        bench_json_u64(&js, "bwd_us", a->bwd_us);
        bench_json_u64(&js, "opt_us", a->opt_us);
        /* every step while the line stays short */
        if (a->steps <= 64)
                bench_json_double_array(&js, "step_s_all", step_s, a->steps);
        r = bench_json_print(&js);
        if (r < 0)
                bench_log("printing the result: %s", strerror(-r));
finish:
        job_free(j);
        return r;
}

/* ---- fair share ------------------------------------------------------------------ */

static int write_all(int fd, const void *buf, size_t n) {
        const char *p = buf;

        while (n > 0) {
                ssize_t k = write(fd, p, n);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return negative_errno();
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

static int read_all(int fd, void *buf, size_t n) {
        char *p = buf;

        while (n > 0) {
                ssize_t k = read(fd, p, n);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return negative_errno();
                if (k == 0)
                        return -EPIPE;
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

/*
 * fair_child() - one job of a group: set up and warm up, say "ready" on
 * @up, read the deadline (CLOCK_MONOTONIC ns) from @down, run phases until
 * it, and send a FairResult on @up.
 */
static int fair_child(const Args *a, const char *name, unsigned weight, int up, int down) {
        FairResult res = {};
        Job *j = NULL;
        uint64_t deadline, t0, last = 0, phases0, steps = 0;
        unsigned ph = 0;
        double stall0;
        int r;

        r = job_new(a, name, weight, &j);
        for (uint64_t s = 0; r >= 0 && s < a->warmup; s++)
                r = job_step(j);
        res.status = r;
        if (write_all(up, &res, sizeof(res)) < 0 || r < 0)
                goto finish;
        r = read_all(down, &deadline, sizeof(deadline));
        if (r < 0)
                goto finish;

        t0 = now_ns();
        stall0 = tier_phase_stall(j->c);
        phases0 = j->phases;
        while ((last = now_ns()) < deadline) {
                unsigned L = (unsigned) a->layers;
                uint64_t us = ph < L ? a->fwd_us : ph < 2 * L ? a->bwd_us : a->opt_us;

                r = job_phase(j, ph, us);
                if (r < 0)
                        break;
                ph = (ph + 1) % j->n_phases;
                if (ph == 0)
                        steps++;
        }
        res.status = r;
        res.phases = j->phases - phases0;
        res.steps = steps;
        res.seconds = (double) (last - t0) / 1e9;
        res.stall_s = tier_phase_stall(j->c) - stall0;
        /* finish the step so that every tensor's last version is released */
        while (r >= 0 && ph != 0) {
                unsigned L = (unsigned) a->layers;

                r = job_phase(j, ph, ph < L ? a->fwd_us : ph < 2 * L ? a->bwd_us : a->opt_us);
                ph = (ph + 1) % j->n_phases;
        }
        if (r >= 0)
                r = job_finish(j);
        if (res.status >= 0)
                res.status = r;
        res.mismatches = j->mismatches;
        res.words_checked = j->words_checked;
        (void) write_all(up, &res, sizeof(res));
finish:
        job_free(j);
        return r < 0 ? 1 : 0;
}

typedef struct Group {
        size_t n;
        FairResult res[MAX_JOBS];
        double seconds;                 /* the timed window, as the parent saw it */
        uint64_t nvme_bytes;            /* reads and writes of all targets in the window */
        uint64_t nvme_read, nvme_write;
        bool verified;
} Group;

/* Run @n jobs (weights @w, names PREFIX-k) to one deadline, --duration after they are all warm. */
static int run_group(const Args *a, const char *prefix, const unsigned *w, size_t n, Group *g) {
        pid_t pids[MAX_JOBS] = {};
        int up[MAX_JOBS][2], down[MAX_JOBS][2];
        tier_client *ctl = NULL;
        Counters c0, c1;
        uint64_t t0, deadline;
        int r = 0;

        *g = (Group) { .n = n, .verified = true };
        for (size_t k = 0; k < n; k++)
                up[k][0] = up[k][1] = down[k][0] = down[k][1] = -1;

        r = bench_connect(&ctl, a->socket, NULL, 0, 10000);
        if (r < 0) {
                bench_log("control connection: %s", tier_strerror(r));
                return r;
        }
        fflush(stdout);
        fflush(stderr);
        for (size_t k = 0; k < n; k++) {
                char name[64];

                if (pipe2(up[k], O_CLOEXEC) < 0 || pipe2(down[k], O_CLOEXEC) < 0) {
                        r = negative_errno();
                        goto out;
                }
                (void) snprintf(name, sizeof(name), "%s-%zu-w%u", prefix, k, w[k]);
                pids[k] = fork();
                if (pids[k] < 0) {
                        r = negative_errno();
                        goto out;
                }
                if (pids[k] == 0) {
                        (void) prctl(PR_SET_PDEATHSIG, SIGTERM);
                        for (size_t x = 0; x <= k; x++) {
                                if (x != k) {
                                        close(up[x][1]);
                                        close(down[x][0]);
                                }
                                close(up[x][0]);
                                close(down[x][1]);
                        }
                        _exit(fair_child(a, name, w[k], up[k][1], down[k][0]));
                }
                close(up[k][1]);
                close(down[k][0]);
                up[k][1] = down[k][0] = -1;
        }
        /* everyone warm */
        for (size_t k = 0; k < n; k++) {
                r = read_all(up[k][0], &g->res[k], sizeof(g->res[k]));
                if (r < 0 || g->res[k].status < 0) {
                        bench_log("job %zu of %s did not start (%s)", k, prefix,
                                  tier_strerror(r < 0 ? r : g->res[k].status));
                        r = r < 0 ? r : g->res[k].status;
                        goto out;
                }
        }
        r = read_counters(ctl, &c0, NULL, 0);
        if (r < 0)
                goto out;
        t0 = now_ns();
        deadline = t0 + (uint64_t) (a->duration * 1e9);
        for (size_t k = 0; k < n; k++) {
                r = write_all(down[k][1], &deadline, sizeof(deadline));
                if (r < 0)
                        goto out;
        }
        {
                struct timespec ts = timespec_from_ns(deadline);

                while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
                        ;
        }
        r = read_counters(ctl, &c1, NULL, 0);
        if (r < 0)
                goto out;
        g->seconds = (double) (now_ns() - t0) / 1e9;
        g->nvme_read = c1.nvme_read - c0.nvme_read;
        g->nvme_write = c1.nvme_write - c0.nvme_write;
        g->nvme_bytes = g->nvme_read + g->nvme_write;
        for (size_t k = 0; k < n; k++) {
                r = read_all(up[k][0], &g->res[k], sizeof(g->res[k]));
                if (r < 0 || g->res[k].status < 0) {
                        bench_log("job %zu of %s failed (%s)", k, prefix, tier_strerror(r < 0 ? r : g->res[k].status));
                        r = r < 0 ? r : g->res[k].status;
                        goto out;
                }
                if (g->res[k].mismatches > 0)
                        g->verified = false;
        }
out:
        for (size_t k = 0; k < n; k++) {
                int st;

                safe_close(up[k][0]);
                safe_close(up[k][1]);
                safe_close(down[k][0]);
                safe_close(down[k][1]);
                if (pids[k] > 0) {
                        if (r < 0)
                                (void) kill(pids[k], SIGTERM);
                        while (waitpid(pids[k], &st, 0) < 0 && errno == EINTR)
                                ;
                        if (r >= 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
                                bench_log("job %zu of %s exited with status 0x%x", k, prefix, (unsigned) st);
                                r = -EIO;
                        }
                }
        }
        tier_client_free(ctl);
        return r;
}

static int run_fair(const Args *a) {
        static const unsigned one = 1;
        Group solo, grp;
        char policy[32] = "";
        double x[MAX_JOBS], share[MAX_JOBS], want[MAX_JOBS], steps_per_s[MAX_JOBS], stall[MAX_JOBS];
        double sum = 0, sum2 = 0, wsum = 0, tsum = 0, jain, solo_gbps, agg_gbps;
        size_t n = a->n_weights;
        tier_client *ctl = NULL;
        Counters dummy;
        BenchJson js;
        int r;

        r = bench_connect(&ctl, a->socket, NULL, 0, 10000);
        if (r < 0) {
                bench_log("connecting to tierd at %s: %s", a->socket, tier_strerror(r));
                return r;
        }
        r = read_counters(ctl, &dummy, policy, sizeof(policy));
        tier_client_free(ctl);
        if (r < 0)
                return r;

        bench_log("one job alone for %.1f s", a->duration);
        r = run_group(a, "solo", &one, 1, &solo);
        if (r < 0)
                return r;
        solo_gbps = (double) solo.nvme_bytes / solo.seconds / 1e9;
        bench_log("alone: %.2f phases/s, NVMe %.3f GB/s", (double) solo.res[0].phases / solo.res[0].seconds, solo_gbps);

        bench_log("%zu jobs at once for %.1f s", n, a->duration);
        r = run_group(a, "fair", a->weights, n, &grp);
        if (r < 0)
                return r;
        agg_gbps = (double) grp.nvme_bytes / grp.seconds / 1e9;
        for (size_t k = 0; k < n; k++) {
                double thr = (double) grp.res[k].phases / grp.seconds;

                x[k] = thr / a->weights[k];
                sum += x[k];
                sum2 += x[k] * x[k];
                wsum += a->weights[k];
                tsum += thr;
                steps_per_s[k] = thr / (3.0 * (double) a->layers);
                stall[k] = grp.res[k].stall_s;
                bench_log("job %zu (weight %u): %" PRIu64 " phases, %.3f steps/s, stall %.2f s", k, a->weights[k],
                          grp.res[k].phases, steps_per_s[k], stall[k]);
        }
        for (size_t k = 0; k < n; k++) {
                share[k] = tsum > 0 ? (double) grp.res[k].phases / grp.seconds / tsum : NAN;
                want[k] = (double) a->weights[k] / wsum;
        }
        jain = sum2 > 0 ? sum * sum / ((double) n * sum2) : NAN;
        bench_log("Jain %.3f, aggregate NVMe %.3f GB/s vs %.3f alone", jain, agg_gbps, solo_gbps);

        bench_json_init(&js, "timeline");
        bench_json_string(&js, "config", a->config ? a->config : "fair");
        bench_json_string(&js, "policy", policy);
        bench_json_u64(&js, "jobs", n);
        {
                double wd[MAX_JOBS];

                for (size_t k = 0; k < n; k++)
                        wd[k] = a->weights[k];
                bench_json_double_array(&js, "weights", wd, n);
        }
        bench_json_double(&js, "jain", jain);
        bench_json_double_array(&js, "share", share, n);
        bench_json_double_array(&js, "share_target", want, n);
        bench_json_double_array(&js, "steps_per_s", steps_per_s, n);
        bench_json_double_array(&js, "stall_s", stall, n);
        bench_json_double(&js, "aggregate_nvme_gbps", agg_gbps);
        bench_json_double(&js, "solo_nvme_gbps", solo_gbps);
        bench_json_double(&js, "aggregate_vs_solo", agg_gbps / solo_gbps);
        bench_json_double(&js, "solo_steps_per_s",
                          (double) solo.res[0].phases / solo.seconds / (3.0 * (double) a->layers));
        bench_json_double(&js, "nvme_read_gbps", (double) grp.nvme_read / grp.seconds / 1e9);
        bench_json_double(&js, "nvme_write_gbps", (double) grp.nvme_write / grp.seconds / 1e9);
        bench_json_double(&js, "duration_s", grp.seconds);
        bench_json_bool(&js, "verified", grp.verified && solo.verified);
        bench_json_u64(&js, "layers", a->layers);
        bench_json_u64(&js, "param_bytes", a->p_size);
        bench_json_u64(&js, "nvme_bw", a->nvme_bw);
        bench_json_u64(&js, "fwd_us", a->fwd_us);
        bench_json_u64(&js, "bwd_us", a->bwd_us);
        bench_json_u64(&js, "opt_us", a->opt_us);
        r = bench_json_print(&js);
        if (r < 0)
                bench_log("printing the result: %s", strerror(-r));
        return r;
}

/* ---- arguments ------------------------------------------------------------------ */

static void usage(FILE *f) {
        fprintf(f,
                "usage: bench-timeline [options]\n"
                "  --socket PATH        tierd's socket (default: $TIER_SOCKET, else the built-in path)\n"
                "  --job NAME           job name (default bench-timeline-PID; single job only)\n"
                "  --layers L           layers (default 8)\n"
                "  --tensor-size SIZE   size of P, G and O of every layer (default 4M)\n"
                "  --param-size, --grad-size, --opt-size SIZE   one of them\n"
                "  --fwd-us, --bwd-us, --opt-us N   compute per phase, busy loop (defaults 10000, 20000, 10000)\n"
                "  --warmup N           untimed steps first (default 3)\n"
                "  --steps N            timed steps (default 10)\n"
                "  --nvme-bw BYTES      [nvme] bandwidth per target, for the lower bound\n"
                "  --targets N          NVMe targets (default 1)\n"
                "  --link-bw BYTES      [vram] bandwidth, for the lower bound\n"
                "  --weight N           set the job's weight first (needs root or tier-admin)\n"
                "  --fair W1,W2,...     fair-share run: one job alone, then one job per weight at once\n"
                "  --duration SEC       length of each --fair run (default 15)\n"
                "  --config NAME        a label for the JSON line\n"
                "  --trace FILE         single job: write \"phase marker_ns ready_ns\" (CLOCK_MONOTONIC) of\n"
                "                       every timed phase to FILE, to line up with tierd's debug log\n"
                "  --phase-timeout SEC  fail when a phase is not ready after SEC seconds (default 60; 0: never)\n");
}

static int parse_weights(const char *s, Args *a) {
        _cleanup_free_ char *copy = strdup(s);
        char *save = NULL;

        if (!copy)
                return -ENOMEM;
        a->n_weights = 0;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                uint64_t v;

                if (a->n_weights >= MAX_JOBS || bench_parse_uint(tok, 1, 1000, &v) < 0)
                        return -EINVAL;
                a->weights[a->n_weights++] = (unsigned) v;
        }
        return a->n_weights > 0 ? 0 : -EINVAL;
}

static int parse_args(int argc, char **argv, Args *a) {
        enum {
                ARG_SOCKET = 0x100, ARG_JOB, ARG_LAYERS, ARG_TSIZE, ARG_PSIZE, ARG_GSIZE, ARG_OSIZE, ARG_FWD,
                ARG_BWD, ARG_OPT, ARG_WARMUP, ARG_STEPS, ARG_NVME_BW, ARG_TARGETS, ARG_LINK_BW, ARG_WEIGHT,
                ARG_FAIR, ARG_DURATION, ARG_CONFIG, ARG_TRACE, ARG_PHASE_TIMEOUT,
        };
        static const struct option options[] = {
                { "socket",      required_argument, NULL, ARG_SOCKET },
                { "job",         required_argument, NULL, ARG_JOB },
                { "layers",      required_argument, NULL, ARG_LAYERS },
                { "tensor-size", required_argument, NULL, ARG_TSIZE },
                { "param-size",  required_argument, NULL, ARG_PSIZE },
                { "grad-size",   required_argument, NULL, ARG_GSIZE },
                { "opt-size",    required_argument, NULL, ARG_OSIZE },
                { "fwd-us",      required_argument, NULL, ARG_FWD },
                { "bwd-us",      required_argument, NULL, ARG_BWD },
                { "opt-us",      required_argument, NULL, ARG_OPT },
                { "warmup",      required_argument, NULL, ARG_WARMUP },
                { "steps",       required_argument, NULL, ARG_STEPS },
                { "nvme-bw",     required_argument, NULL, ARG_NVME_BW },
                { "targets",     required_argument, NULL, ARG_TARGETS },
                { "link-bw",     required_argument, NULL, ARG_LINK_BW },
                { "weight",      required_argument, NULL, ARG_WEIGHT },
                { "fair",        required_argument, NULL, ARG_FAIR },
                { "duration",    required_argument, NULL, ARG_DURATION },
                { "config",      required_argument, NULL, ARG_CONFIG },
                { "trace",       required_argument, NULL, ARG_TRACE },
                { "phase-timeout", required_argument, NULL, ARG_PHASE_TIMEOUT },
                { "help",        no_argument,       NULL, 'h' },
                {}
        };
        int c, r = 0;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case ARG_SOCKET:
                        a->socket = optarg;
                        break;
                case ARG_JOB:
                        a->job = optarg;
                        break;
                case ARG_LAYERS:
                        r = bench_parse_uint(optarg, 1, MAX_LAYERS, &a->layers);
                        break;
                case ARG_TSIZE:
                        r = size_parse(optarg, &a->p_size);
                        a->g_size = a->o_size = a->p_size;
                        break;
                case ARG_PSIZE:
                        r = size_parse(optarg, &a->p_size);
                        break;
                case ARG_GSIZE:
                        r = size_parse(optarg, &a->g_size);
                        break;
                case ARG_OSIZE:
                        r = size_parse(optarg, &a->o_size);
                        break;
                case ARG_FWD:
                        r = bench_parse_uint(optarg, 0, UINT64_C(60000000), &a->fwd_us);
                        break;
                case ARG_BWD:
                        r = bench_parse_uint(optarg, 0, UINT64_C(60000000), &a->bwd_us);
                        break;
                case ARG_OPT:
                        r = bench_parse_uint(optarg, 0, UINT64_C(60000000), &a->opt_us);
                        break;
                case ARG_WARMUP:
                        r = bench_parse_uint(optarg, 0, MAX_STEPS, &a->warmup);
                        break;
                case ARG_STEPS:
                        r = bench_parse_uint(optarg, 1, MAX_STEPS, &a->steps);
                        break;
                case ARG_NVME_BW:
                        r = size_parse(optarg, &a->nvme_bw);
                        break;
                case ARG_TARGETS:
                        r = bench_parse_uint(optarg, 1, 16, &a->targets);
                        break;
                case ARG_LINK_BW:
                        r = size_parse(optarg, &a->link_bw);
                        break;
                case ARG_WEIGHT:
                        r = bench_parse_uint(optarg, 1, 1000, &a->weight);
                        break;
                case ARG_FAIR:
                        r = parse_weights(optarg, a);
                        break;
                case ARG_DURATION:
                        r = bench_parse_seconds(optarg, &a->duration);
                        break;
                case ARG_CONFIG:
                        a->config = optarg;
                        break;
                case ARG_TRACE:
                        a->trace = optarg;
                        break;
                case ARG_PHASE_TIMEOUT:
                        r = bench_parse_uint(optarg, 0, 86400, &a->phase_timeout);
                        break;
                case 'h':
                        usage(stdout);
                        exit(EXIT_SUCCESS);
                default:
                        usage(stderr);
                        return -EINVAL;
                }
                if (r < 0) {
                        bench_log("bad value for --%s: \"%s\"", options[c - ARG_SOCKET].name, optarg);
                        return r;
                }
        }
        if (optind < argc) {
                bench_log("unexpected argument \"%s\"", argv[optind]);
                return -EINVAL;
        }
        if (a->p_size < 8 || a->g_size < 8 || a->o_size < 8 || a->p_size % 8 || a->g_size % 8 || a->o_size % 8) {
                bench_log("tensor sizes must be positive multiples of 8 bytes");
                return -EINVAL;
        }
        if (a->n_weights > 0 && a->job) {
                bench_log("--job names the single job; --fair names its jobs itself");
                return -EINVAL;
        }
        return 0;
}

int main(int argc, char **argv) {
        Args a = {
                .layers = 8,
                .p_size = UINT64_C(4) << 20,
                .g_size = UINT64_C(4) << 20,
                .o_size = UINT64_C(4) << 20,
                .fwd_us = 10000,
                .bwd_us = 20000,
                .opt_us = 10000,
                .warmup = 3,
                .steps = 10,
                .targets = 1,
                .duration = 15,
                .phase_timeout = PHASE_TIMEOUT_S,
        };
        int r;

        if (parse_args(argc, argv, &a) < 0)
                return 2;
        a.socket = bench_socket_path(a.socket);
        signal(SIGPIPE, SIG_IGN);
        signal(SIGALRM, on_alarm);
        r = a.n_weights > 0 ? run_fair(&a) : run_single(&a);
        return r < 0 ? 1 : 0;
}
