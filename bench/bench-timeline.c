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
 * reads the arguments, builds the plan and runs the single job.
 *
 * Single job (the default): --warmup steps, then --steps timed steps.  A
 * step is the time between two tier_phase_enter(c, 0) calls.  Around the timed
 * steps the program reads tierd's status (tier_client_status, JSON) and takes the
 * deltas of the global link counters (the job is tierd's only one), and of
 * tier_phase_stall().  The baseline is the step's lower bound in the same
 * run: max(compute, NVMe bytes / NVMe bandwidth, host<->VRAM bytes / link
 * bandwidth), with the bytes this run actually moved per step (reads and
 * writes share a throttled NVMe target, and both directions share the
 * emulated VRAM link).  ratio = step_s / lower_bound_s.  The capacity-aware
 * bound has the same form with the fewest bytes any schedule of the plan
 * needs under the job's limits (capbound.c) instead of the bytes moved:
 * ratio_capacity = step_s / capacity_bound_s.  Those bytes are the fewest
 * *found* (capbound_min(), a heuristic: on a few tiny plans the exhaustive
 * search needs fewer), so capacity_bound_s is the least found, not a lower
 * bound; capacity_floor_s is the same from capbound_floor()'s proven bytes,
 * never above the best possible.
 * held2_bound_s is the capacity-aware bound with the fewest NVMe bytes found
 * for schedules that hold two phases at a time, as the timeline policy does
 * (capbound_min_held()): what that design costs, not a bound on every
 * schedule.
 * time_bound_s adds when the bytes can move (capbound_time(): the reads a
 * window of phases needs beyond what memory holds at its start, and the
 * writes of what it changes beyond what memory holds at its end, against
 * the compute of that window): max(capacity_floor_s, that)
 * (capbound_lower(): proven terms only), ratio_time = step_s / time_bound_s.
 *
 * --plan FILE runs another plan (timeline-plan.c); --jobs N runs N jobs of
 * the plan at once (same_run() in timeline-fair.c) and reports them as one
 * line, the bytes of all and the slowest job's step; --capbound prints the
 * fewest bytes alone.
 *
 * One JSON line on stdout per run; progress on stderr.  Nothing is asserted.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tier.h>

#include "bench/capbound.h"
#include "bench/common.h"
#include "bench/timeline-fair.h"
#include "bench/timeline-job.h"
#include "bench/timeline-plan.h"
#include "bench/timeline-status.h"
#include "bench/timeline.h"
#include "proto/macro.h"
#include "util/size.h"
#include "util/time-util.h"

/* ---- the capacity-aware bound ------------------------------------------------------ */

/* Fewest bytes per step of @a's plan under these limits (capbound_min()); logs why not. */
static int plan_min_bytes(const Args *a, uint64_t vram, uint64_t host, CbBytes *nvme, CbBytes *link,
                          CbBytes *floor) {
        CbPlan cb = tl_plan_cb(a->plan);
        int r = capbound_min(&cb, vram, host, nvme, link);

        if (r >= 0)
                r = capbound_floor(&cb, vram, host, floor);
        if (r < 0)
                bench_log("no capacity-aware bound: %s", r == -E2BIG ?
                          "one phase needs more than the job's limits hold" : strerror(-r));
        return r;
}

/* The compute asked for in phase @k: the busy loop of its kind (--fwd-us, --bwd-us, --opt-us), in seconds. */
static double phase_compute_s(const Args *a, size_t k) {
        TlKind kind = a->plan->kind[k];

        return (double) (kind == TL_FWD ? a->fwd_us : kind == TL_BWD ? a->bwd_us : a->opt_us) / 1e6;
}

/* The compute asked for in every phase of @a's plan, in seconds (malloc'ed; NULL when out of memory). */
static double *plan_compute(const Args *a) {
        double *compute = calloc(a->plan->n_phases, sizeof(double));

        for (size_t k = 0; compute && k < a->plan->n_phases; k++)
                compute[k] = phase_compute_s(a, k);
        return compute;
}

/*
 * time_bound_s: the best lower bound on a step of @n_jobs jobs under these limits, with the
 * compute asked for (capbound_lower(): the time-aware bound of one job, which has its own
 * limits and at best the whole NVMe bandwidth during its burst, and the proven floor's bytes
 * of all jobs over the shared links): NAN (logged) when there is none.
 */
static double plan_time_bound(const Args *a, uint64_t vram, uint64_t host, unsigned n_jobs, CbTime *tb) {
        CbPlan cb = tl_plan_cb(a->plan);
        _cleanup_free_ double *compute = plan_compute(a);
        double s;
        int r;

        if (!compute)
                return NAN;
        r = capbound_lower(&cb, vram, host, compute, (double) a->nvme_bw * (double) a->targets, (double) a->link_bw,
                           n_jobs, tb, &s);
        if (r < 0) {
                bench_log("no time-aware bound: %s", strerror(-r));
                *tb = (CbTime) { .from = SIZE_MAX, .to = SIZE_MAX };
                return NAN;
        }
        return s;
}

/*
 * A step a planned schedule of the model reaches (capbound_planned()), @held phases held at
 * a time, each of @n_jobs jobs with its share of the NVMe bandwidth: NAN (logged) when none.
 */
static double plan_planned(const Args *a, uint64_t vram, uint64_t host, unsigned held, double n_jobs,
                           CbPlanned *pl) {
        CbPlan cb = tl_plan_cb(a->plan);
        _cleanup_free_ double *compute = plan_compute(a);
        int r;

        *pl = (CbPlanned) { .step_s = NAN };
        if (!compute)
                return NAN;
        r = capbound_planned(&cb, vram, host, held, compute, (double) a->nvme_bw * (double) a->targets / n_jobs,
                             (double) a->link_bw / n_jobs, a->planned_tries, pl);
        if (r < 0) {
                bench_log("no planned schedule (%u phases held): %s", held, strerror(-r));
                *pl = (CbPlanned) { .step_s = NAN };
        }
        return pl->step_s;
}

/* Fewest NVMe bytes per step when two phases are held at a time, as tierd's timeline policy does. */
static int plan_held_bytes(const Args *a, uint64_t vram, uint64_t host, CbBytes *nvme) {
        CbPlan cb = tl_plan_cb(a->plan);
        int r = capbound_min_held(&cb, vram, host, 2, nvme, NULL);

        if (r < 0)
                bench_log("no bytes for two phases held: %s", r == -E2BIG ?
                          "two phases need more than the job's limits hold" : strerror(-r));
        return r;
}

/* --capbound VRAM,HOST: the fewest bytes per step alone, no tierd needed (bench/run --matrix scales compute by it). */
static int run_capbound(const Args *a) {
        CbBytes n, l, f, h;
        BenchJson js;
        int r = plan_min_bytes(a, a->cb_vram, a->cb_host, &n, &l, &f);

        if (r < 0)
                return r;
        bench_json_init(&js, "capbound");
        bench_json_string(&js, "plan", a->plan->name);
        bench_json_u64(&js, "phases", a->plan->n_phases);
        bench_json_u64(&js, "tensors", a->plan->n_tensors);
        bench_json_u64(&js, "plan_bytes", tl_plan_bytes(a->plan));
        bench_json_u64(&js, "vram_limit", a->cb_vram);
        bench_json_u64(&js, "host_limit", a->cb_host);
        /* whole bytes (a mean over a cycle of several steps is rounded) */
        bench_json_u64(&js, "min_nvme_read_bytes", (uint64_t) llround(n.nvme_read));
        bench_json_u64(&js, "min_nvme_write_bytes", (uint64_t) llround(n.nvme_write));
        bench_json_u64(&js, "min_link_bytes", (uint64_t) llround(l.link_up + l.link_down));
        bench_json_u64(&js, "floor_nvme_bytes", (uint64_t) llround(f.nvme_read + f.nvme_write));
        bench_json_u64(&js, "floor_link_bytes", (uint64_t) llround(f.link_up + f.link_down));
        if (plan_held_bytes(a, a->cb_vram, a->cb_host, &h) >= 0)
                bench_json_u64(&js, "min_held2_nvme_bytes", (uint64_t) llround(h.nvme_read + h.nvme_write));
        if (a->nvme_bw > 0) {
                CbPlanned pl;
                CbTime tb;

                bench_json_double(&js, "time_bound_s", plan_time_bound(a, a->cb_vram, a->cb_host, 1, &tb));
                bench_json_double(&js, "planned_s", plan_planned(a, a->cb_vram, a->cb_host, 1, 1, &pl));
                bench_json_u64(&js, "planned_nvme_bytes", (uint64_t) llround(pl.bytes.nvme_read + pl.bytes.nvme_write));
                bench_json_u64(&js, "planned_rule", pl.rule);
                bench_json_u64(&js, "planned_built", pl.built);         /* built for time: no rule */
                bench_json_double(&js, "planned_held2_s", plan_planned(a, a->cb_vram, a->cb_host, 2, 1, &pl));
                bench_json_u64(&js, "planned_held2_nvme_bytes",
                               (uint64_t) llround(pl.bytes.nvme_read + pl.bytes.nvme_write));
        }
        return bench_json_print(&js);
}

/* ---- the result line --------------------------------------------------------------- */

static double per_step_gb(uint64_t bytes, uint64_t steps) {
        return (double) bytes / (double) steps / 1e9;
}

/*
 * Both bounds and the JSON line of a timed run of @res->jobs jobs.  The
 * capacity-aware bound takes the compute asked for (the busy loops), not
 * compute_s as measured: that adds the phase grants (a round trip to a busy
 * tierd when a segment is new to the job), checks and stamps, time the
 * system costs and a bound must not grant it.  With
 * several jobs (each its own limits, the links shared) a "step" is every
 * job doing one step: the bytes are the window's over --steps, the bound is
 * max(compute of one job, all jobs' least NVMe bytes / NVMe bandwidth, all
 * jobs' least link bytes / link bandwidth), and step_s the slowest job's
 * median step.
 */
static int report(const Args *a, const StepResult *res) {
        CbBytes min_n = {}, min_l = {}, fl = {};
        double floor_s = NAN, n_jobs = (double) res->jobs, step_med = 0, nvme_s, link_s, bound, cap_bound = NAN, asked = 0;
        double time_b, held_b = NAN;
        CbTime tb = { .from = SIZE_MAX, .to = SIZE_MAX };
        CbBytes held = { NAN, NAN, NAN, NAN };
        uint64_t nvme_r = res->nvme_read, nvme_w = res->nvme_write, link_b = res->link;
        BenchJson js;
        int r;

        for (size_t k = 0; k < res->jobs; k++)
                step_med = MAX(step_med, res->step_s[k]);
        /* the busy loops of a step: the compute asked for (compute_s adds the grants, checks and stamps) */
        for (size_t k = 0; k < a->plan->n_phases; k++)
                asked += phase_compute_s(a, k);
        nvme_s = a->nvme_bw ? (double) (nvme_r + nvme_w) / (double) a->steps / ((double) a->nvme_bw * (double) a->targets)
                            : 0;
        link_s = a->link_bw ? (double) link_b / (double) a->steps / (double) a->link_bw : 0;
        bound = MAX(res->compute_s, MAX(nvme_s, link_s));
        if (plan_min_bytes(a, res->vram_limit, res->host_limit, &min_n, &min_l, &fl) >= 0) {
                cap_bound = MAX(asked,
                                MAX(a->nvme_bw ? n_jobs * (min_n.nvme_read + min_n.nvme_write) /
                                                 ((double) a->nvme_bw * (double) a->targets) : 0,
                                    a->link_bw ? n_jobs * (min_l.link_up + min_l.link_down) / (double) a->link_bw : 0));
                floor_s = MAX(asked, MAX(a->nvme_bw ? n_jobs * (fl.nvme_read + fl.nvme_write) /
                                                      ((double) a->nvme_bw * (double) a->targets) : 0,
                                         a->link_bw ? n_jobs * (fl.link_up + fl.link_down) / (double) a->link_bw : 0));
        }
        if (!isnan(cap_bound) && plan_held_bytes(a, res->vram_limit, res->host_limit, &held) >= 0)
                held_b = MAX(cap_bound, a->nvme_bw ? n_jobs * (held.nvme_read + held.nvme_write) /
                                                     ((double) a->nvme_bw * (double) a->targets) : 0);
        /* proven terms only: cap_bound is the least found, above the true minimum on some plans */
        time_b = plan_time_bound(a, res->vram_limit, res->host_limit, (unsigned) res->jobs, &tb);
        bench_log("policy %s: step %.3f s (mean %.3f), bound %.3f s (compute %.3f, nvme %.3f, link %.3f), "
                  "least found %.3f s (%.3f GB NVMe, %.3f GB link a step), stall %.3f s/step, "
                  "verified %s", res->policy, step_med, res->step_mean, bound, res->compute_s, nvme_s, link_s,
                  cap_bound, n_jobs * (min_n.nvme_read + min_n.nvme_write) / 1e9,
                  n_jobs * (min_l.link_up + min_l.link_down) / 1e9, res->stall_s, res->verified ? "yes" : "NO");
        if (tb.from != SIZE_MAX)
                bench_log("time-aware bound %.3f s: from phase %zu to phase %zu, %.3f GB read and %.3f GB written "
                          "beyond memory (%.3f GB up the link beyond VRAM)", tb.step_s, tb.from, tb.to,
                          tb.read_bytes / 1e9, tb.write_bytes / 1e9, tb.up_bytes / 1e9);

        bench_json_init(&js, "timeline");
        if (a->config)
                bench_json_string(&js, "config", a->config);
        bench_json_string(&js, "policy", res->policy);
        bench_json_double(&js, "step_s", step_med);
        bench_json_double(&js, "lower_bound_s", bound);
        bench_json_double(&js, "ratio", step_med / bound);
        bench_json_double(&js, "step_s_mean", res->step_mean);
        bench_json_double(&js, "stall_s", res->stall_s);
        bench_json_double(&js, "compute_s", res->compute_s);
        bench_json_double(&js, "nvme_s", nvme_s);
        bench_json_double(&js, "link_s", link_s);
        bench_json_double(&js, "nvme_read_gb", per_step_gb(nvme_r, a->steps));
        bench_json_double(&js, "nvme_write_gb", per_step_gb(nvme_w, a->steps));
        bench_json_double(&js, "link_gb", per_step_gb(link_b, a->steps));
        bench_json_double(&js, "target_read_gb", per_step_gb(res->target_read, a->steps));
        bench_json_double(&js, "target_write_gb", per_step_gb(res->target_write, a->steps));
        bench_json_bool(&js, "verified", res->verified);
        bench_json_u64(&js, "words_checked", res->words_checked);
        bench_json_u64(&js, "steps", a->steps);
        bench_json_u64(&js, "warmup", a->warmup);
        bench_json_u64(&js, "layers", a->layers);
        bench_json_u64(&js, "param_bytes", a->p_size);
        bench_json_u64(&js, "grad_bytes", a->g_size);
        bench_json_u64(&js, "opt_bytes", a->o_size);
        bench_json_u64(&js, "vram_limit", res->vram_limit);
        bench_json_u64(&js, "host_limit", res->host_limit);
        bench_json_u64(&js, "nvme_bw", a->nvme_bw);
        bench_json_u64(&js, "nvme_targets", a->targets);
        bench_json_u64(&js, "link_bw", a->link_bw);
        bench_json_u64(&js, "fwd_us", a->fwd_us);
        bench_json_u64(&js, "bwd_us", a->bwd_us);
        bench_json_u64(&js, "opt_us", a->opt_us);
        bench_json_double(&js, "capacity_bound_s", cap_bound);
        bench_json_double(&js, "ratio_capacity", step_med / cap_bound);
        bench_json_double(&js, "min_nvme_read_gb", n_jobs * min_n.nvme_read / 1e9);
        bench_json_double(&js, "min_nvme_write_gb", n_jobs * min_n.nvme_write / 1e9);
        bench_json_double(&js, "min_link_gb", n_jobs * (min_l.link_up + min_l.link_down) / 1e9);
        bench_json_double(&js, "compute_asked_s", asked);
        bench_json_double(&js, "capacity_floor_s", floor_s);
        bench_json_double(&js, "held2_bound_s", held_b);
        bench_json_double(&js, "min_held2_nvme_gb", n_jobs * (held.nvme_read + held.nvme_write) / 1e9);
        bench_json_double(&js, "time_bound_s", time_b);
        bench_json_double(&js, "ratio_time", step_med / time_b);
        if (a->planned) {
                CbPlanned pl;
                double s1 = plan_planned(a, res->vram_limit, res->host_limit, 1, n_jobs, &pl);
                double s2 = plan_planned(a, res->vram_limit, res->host_limit, 2, n_jobs, &pl);

                bench_json_double(&js, "planned_s", s1);
                bench_json_double(&js, "planned_held2_s", s2);
                bench_json_double(&js, "ratio_planned", step_med / MIN(s1, s2));
        }
        if (tb.from != SIZE_MAX) {
                bench_json_u64(&js, "time_window_from", tb.from);
                bench_json_u64(&js, "time_window_to", tb.to);
        }
        bench_json_double(&js, "floor_nvme_gb", n_jobs * (fl.nvme_read + fl.nvme_write) / 1e9);
        bench_json_double(&js, "floor_link_gb", n_jobs * (fl.link_up + fl.link_down) / 1e9);
        bench_json_u64(&js, "jobs", res->jobs);
        bench_json_string(&js, "plan", a->plan->name);
        if (res->jobs > 1)
                bench_json_double_array(&js, "step_s_jobs", res->step_s, res->jobs);
        /* every step while the line stays short */
        if (a->steps <= 64 && res->step_s_all)
                bench_json_double_array(&js, "step_s_all", res->step_s_all, a->steps);
        r = bench_json_print(&js);
        if (r < 0)
                bench_log("printing the result: %s", strerror(-r));
        return r;
}

/* ---- single job ------------------------------------------------------------------ */

static int run_single(const Args *a) {
        _cleanup_free_ double *step_s = NULL;
        StepResult res = { .jobs = 1 };
        Job *j = NULL;
        Counters c0, c1;
        char job[64];
        uint64_t t0, t_end, compute0, words0;
        double stall0;
        int r;

        step_s = calloc(a->steps, sizeof(double));
        if (!step_s)
                return -ENOMEM;
        if (!a->job)
                (void) snprintf(job, sizeof(job), "bench-timeline-%ld", (long) getpid());
        r = job_new(a, a->job ? a->job : job, (unsigned) a->weight, &j);
        if (r < 0)
                return r;
        res.vram_limit = tier_client_limit(j->c, TIER_VRAM);
        res.host_limit = tier_client_limit(j->c, TIER_HOST);
        bench_log("job %s: plan %s, %zu phases, %zu tensors, %" PRIu64 " bytes; limits vram %" PRIu64
                  " host %" PRIu64 "; compute fwd %" PRIu64 " bwd %" PRIu64 " opt %" PRIu64 " us",
                  a->job ? a->job : job, a->plan->name, a->plan->n_phases, a->plan->n_tensors,
                  tl_plan_bytes(a->plan), res.vram_limit, res.host_limit, a->fwd_us, a->bwd_us, a->opt_us);

        for (uint64_t s = 0; s < a->warmup; s++) {
                uint64_t ts = now_ns();

                r = job_step(j);
                if (r < 0)
                        goto finish;
                bench_log("warm-up step %" PRIu64 ": %.3f s", s + 1, (double) (now_ns() - ts) / 1e9);
        }

        r = counters_read(j->c, &c0, res.policy, sizeof(res.policy));
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
        res.stall_s = (tier_phase_stall(j->c) - stall0) / (double) a->steps;
        res.compute_s = (double) (j->compute_ns - compute0) / 1e9 / (double) a->steps;
        res.nvme_read = c1.nvme_read - c0.nvme_read;
        res.nvme_write = c1.nvme_write - c0.nvme_write;
        res.link = (c1.to_vram - c0.to_vram) + (c1.from_vram - c0.from_vram);
        res.target_read = c1.target_read - c0.target_read;
        res.target_write = c1.target_written - c0.target_written;
        res.step_s[0] = bench_median(step_s, a->steps);
        res.step_mean = (double) (t_end - t0) / 1e9 / (double) a->steps;
        res.verified = j->mismatches == 0;
        res.words_checked = j->words_checked - words0;
        res.step_s_all = step_s;
        r = report(a, &res);
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
                "  --phase-timeout SEC  fail when a phase is not ready after SEC seconds (default 60; 0: never)\n"
                "  --plan FILE          run the plan in FILE (JSON, written by bench/torch_plan.py) instead of\n"
                "                       the synthetic one; --layers and the sizes are then unused\n"
                "  --jobs N             N jobs of the plan at once, each with its own limits (default 1)\n"
                "  --capbound VRAM,HOST print the fewest NVMe and link bytes per step of the plan under these\n"
                "                       limits (bench/capbound.c) and exit; needs no tierd\n"
                "  --planned            report planned_s and planned_held2_s: steps a schedule of the model\n"
                "                       reaches, timed (capbound_planned(); each job with its share of the\n"
                "                       links), holding one and two phases\n"
                "  --planned-tries N    perturbed schedules the planned step tries beyond the model's rules\n"
                "                       (default 0)\n");
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
                ARG_FAIR, ARG_DURATION, ARG_CONFIG, ARG_TRACE, ARG_PHASE_TIMEOUT, ARG_CAPBOUND, ARG_PLAN, ARG_JOBS,
                ARG_PLANNED_TRIES, ARG_PLANNED,
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
                { "capbound",    required_argument, NULL, ARG_CAPBOUND },
                { "plan",        required_argument, NULL, ARG_PLAN },
                { "jobs",        required_argument, NULL, ARG_JOBS },
                { "planned-tries", required_argument, NULL, ARG_PLANNED_TRIES },
                { "planned",     no_argument,       NULL, ARG_PLANNED },
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
                case ARG_PLAN:
                        a->plan_file = optarg;
                        break;
                case ARG_JOBS:
                        r = bench_parse_uint(optarg, 1, MAX_JOBS, &a->jobs);
                        break;
                case ARG_PLANNED_TRIES:
                        r = bench_parse_uint(optarg, 0, 100000, &a->planned_tries);
                        break;
                case ARG_PLANNED:
                        a->planned = true;
                        break;
                case ARG_CAPBOUND: {
                        _cleanup_free_ char *v = strdup(optarg);
                        char *comma = v ? strchr(v, ',') : NULL;

                        r = -EINVAL;
                        if (comma) {
                                *comma = 0;
                                r = size_parse(v, &a->cb_vram);
                                if (r >= 0)
                                        r = size_parse(comma + 1, &a->cb_host);
                        }
                        a->capbound = r >= 0;
                        break;
                }
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
        if (a->jobs > 1 && (a->job || a->n_weights > 0 || a->trace)) {
                bench_log("--jobs names its jobs itself and goes with neither --fair nor --trace");
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
                .jobs = 1,
        };
        TlPlan *plan = NULL;
        char err[512] = "";
        int r;

        if (parse_args(argc, argv, &a) < 0)
                return 2;
        r = a.plan_file ? tl_plan_load(a.plan_file, &plan, err, sizeof(err)) :
                          tl_plan_synthetic(a.layers, a.p_size, a.g_size, a.o_size, &plan);
        if (r < 0) {
                bench_log("%s", *err ? err : strerror(-r));
                return r == -EBADMSG ? 2 : 1;
        }
        a.plan = plan;
        a.socket = bench_socket_path(a.socket);
        signal(SIGPIPE, SIG_IGN);
        signal(SIGALRM, job_on_alarm);
        if (a.capbound)
                r = run_capbound(&a);
        else if (a.n_weights > 0)
                r = fair_run(&a);
        else if (a.jobs > 1) {
                StepResult res;

                r = same_run(&a, &res);
                if (r >= 0)
                        r = report(&a, &res);
        } else
                r = run_single(&a);
        tl_plan_free(plan);
        return r < 0 ? 1 : 0;
}
