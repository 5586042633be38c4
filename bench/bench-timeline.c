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
 * The job itself (its tensors and plan, the pattern it checks and stamps in
 * every phase, the link counters read from tierd's status) is
 * timeline-job.c; the fair-share run (--fair) is timeline-fair.c.  This file
 * reads the arguments and runs the single job.
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
 * One JSON line on stdout per run; progress on stderr.  Nothing is asserted.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "bench/timeline-fair.h"
#include "bench/timeline-job.h"
#include "bench/timeline-status.h"
#include "bench/timeline.h"
#include "proto/macro.h"
#include "util/size.h"
#include "util/time-util.h"

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

        r = counters_read(j->c, &c0, policy, sizeof(policy));
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
        r = counters_read(j->c, &c1, NULL, 0);
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
        signal(SIGALRM, job_on_alarm);
        r = a.n_weights > 0 ? fair_run(&a) : run_single(&a);
        return r < 0 ? 1 : 0;
}
