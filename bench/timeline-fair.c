/* SPDX-License-Identifier: MIT */
/* timeline-fair.c: bench-timeline --fair: jobs of different weights at once, their shares against the weights. */

/*
 * Theory of operation
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
 * Every job is a child process with its own connection (tierd tells jobs
 * apart by connection and name).  Two pipes per child make the barrier:
 * the child writes a FairResult on "up" once it is warm (its status says
 * whether it started), the parent writes the common deadline
 * (CLOCK_MONOTONIC ns) on "down" once every child is warm, and the child
 * writes its final FairResult on "up" when it is done.  The parent reads
 * tierd's link counters on its own control connection around the window.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "bench/timeline-fair.h"
#include "bench/timeline-job.h"
#include "bench/timeline-plan.h"
#include "bench/timeline-status.h"
#include "bench/timeline.h"
#include "proto/macro.h"
#include "util/time-util.h"

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
 * Job @k's pipes (up: child -> parent, down: parent -> child) and process.
 * In the child (returns 0) only its own ends of pair @k are open; in the
 * parent (returns the pid) the child's ends are closed.  -errno on failure.
 */
static pid_t spawn_job(size_t k, int up[][2], int down[][2]) {
        pid_t pid;

        if (pipe2(up[k], O_CLOEXEC) < 0 || pipe2(down[k], O_CLOEXEC) < 0)
                return negative_errno();
        pid = fork();
        if (pid < 0)
                return negative_errno();
        if (pid == 0) {
                (void) prctl(PR_SET_PDEATHSIG, SIGTERM);
                for (size_t x = 0; x <= k; x++) {
                        if (x != k) {
                                close(up[x][1]);
                                close(down[x][0]);
                        }
                        close(up[x][0]);
                        close(down[x][1]);
                }
                return 0;
        }
        close(up[k][1]);
        close(down[k][0]);
        up[k][1] = down[k][0] = -1;
        return pid;
}

/* Close every job's pipes and wait for it (killing it first when @r < 0); a job that failed makes -EIO. */
static int reap_jobs(size_t n, int up[][2], int down[][2], const pid_t pids[], int r, const char *what) {
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
                                bench_log("job %zu of %s exited with status 0x%x", k, what, (unsigned) st);
                                r = -EIO;
                        }
                }
        }
        return r;
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
                r = job_phase(j, ph, job_compute_us(j, ph));
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
                r = job_phase(j, ph, job_compute_us(j, ph));
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

                (void) snprintf(name, sizeof(name), "%s-%zu-w%u", prefix, k, w[k]);
                pids[k] = spawn_job(k, up, down);
                if (pids[k] < 0) {
                        r = pids[k];
                        goto out;
                }
                if (pids[k] == 0)
                        _exit(fair_child(a, name, w[k], up[k][1], down[k][0]));
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
        r = counters_read(ctl, &c0, NULL, 0);
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
        r = counters_read(ctl, &c1, NULL, 0);
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
        r = reap_jobs(n, up, down, pids, r, prefix);
        tier_client_free(ctl);
        return r;
}

int fair_run(const Args *a) {
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
        r = counters_read(ctl, &dummy, policy, sizeof(policy));
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
                steps_per_s[k] = thr / (double) a->plan->n_phases;
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
                          (double) solo.res[0].phases / solo.seconds / (double) a->plan->n_phases);
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

/* ---- --jobs N: the same plan N times at once ------------------------------------------- */

typedef struct SameResult {
        int status;
        double step_med, window_s, stall_s, compute_s;
        uint64_t mismatches, words_checked;
        uint64_t vram_limit, host_limit;
} SameResult;

static int same_child(const Args *a, const char *name, int up, int down) {
        _cleanup_free_ double *step_s = calloc(a->steps, sizeof(double));
        SameResult res = {};
        Job *j = NULL;
        uint64_t go, t0, compute0, words0;
        double stall0;
        int r = step_s ? 0 : -ENOMEM;

        if (r >= 0)
                r = job_new(a, name, 0, &j);
        for (uint64_t s = 0; r >= 0 && s < a->warmup; s++)
                r = job_step(j);
        res.status = r;
        if (write_all(up, &res, sizeof(res)) < 0 || r < 0)
                goto finish;
        r = read_all(down, &go, sizeof(go));
        if (r < 0)
                goto finish;
        stall0 = tier_phase_stall(j->c);
        compute0 = j->compute_ns;
        words0 = j->words_checked;
        t0 = now_ns();
        for (uint64_t s = 0; r >= 0 && s < a->steps; s++) {
                uint64_t ts = now_ns();

                r = job_step(j);
                step_s[s] = (double) (now_ns() - ts) / 1e9;
        }
        if (r >= 0)
                r = job_finish(j);
        res.status = r;
        res.window_s = (double) (now_ns() - t0) / 1e9;
        res.step_med = bench_median(step_s, a->steps);
        res.stall_s = (tier_phase_stall(j->c) - stall0) / (double) a->steps;
        res.compute_s = (double) (j->compute_ns - compute0) / 1e9 / (double) a->steps;
        res.mismatches = j->mismatches;
        res.words_checked = j->words_checked - words0;
        res.vram_limit = tier_client_limit(j->c, TIER_VRAM);
        res.host_limit = tier_client_limit(j->c, TIER_HOST);
        (void) write_all(up, &res, sizeof(res));
finish:
        job_free(j);
        return r < 0 ? 1 : 0;
}

int same_run(const Args *a, StepResult *ret) {
        size_t n = a->jobs;
        pid_t pids[MAX_JOBS] = {};
        int up[MAX_JOBS][2], down[MAX_JOBS][2];
        SameResult res[MAX_JOBS];
        tier_client *ctl = NULL;
        Counters c0, c1;
        uint64_t go = 1;
        int r = 0;

        *ret = (StepResult) { .jobs = n, .verified = true };
        for (size_t k = 0; k < n; k++)
                up[k][0] = up[k][1] = down[k][0] = down[k][1] = -1;
        r = bench_connect(&ctl, a->socket, NULL, 0, 10000);
        if (r < 0) {
                bench_log("control connection: %s", tier_strerror(r));
                return r;
        }
        r = counters_read(ctl, &c0, ret->policy, sizeof(ret->policy));
        if (r < 0)
                goto out;
        fflush(stdout);
        fflush(stderr);
        for (size_t k = 0; k < n; k++) {
                char name[64];

                (void) snprintf(name, sizeof(name), "bench-timeline-%ld-%zu", (long) getpid(), k);
                pids[k] = spawn_job(k, up, down);
                if (pids[k] < 0) {
                        r = pids[k];
                        goto out;
                }
                if (pids[k] == 0)
                        _exit(same_child(a, name, up[k][1], down[k][0]));
        }
        for (size_t k = 0; k < n; k++) {
                r = read_all(up[k][0], &res[k], sizeof(res[k]));
                if (r < 0 || res[k].status < 0) {
                        bench_log("job %zu did not start (%s)", k, tier_strerror(r < 0 ? r : res[k].status));
                        r = r < 0 ? r : res[k].status;
                        goto out;
                }
        }
        bench_log("%zu jobs warm: %" PRIu64 " timed steps each", n, a->steps);
        r = counters_read(ctl, &c0, NULL, 0);
        if (r < 0)
                goto out;
        for (size_t k = 0; k < n; k++) {
                r = write_all(down[k][1], &go, sizeof(go));
                if (r < 0)
                        goto out;
        }
        for (size_t k = 0; k < n; k++) {
                r = read_all(up[k][0], &res[k], sizeof(res[k]));
                if (r < 0 || res[k].status < 0) {
                        bench_log("job %zu failed (%s)", k, tier_strerror(r < 0 ? r : res[k].status));
                        r = r < 0 ? r : res[k].status;
                        goto out;
                }
        }
        r = counters_read(ctl, &c1, NULL, 0);
        if (r < 0)
                goto out;
        for (size_t k = 0; k < n; k++) {
                ret->step_s[k] = res[k].step_med;
                ret->step_mean = MAX(ret->step_mean, res[k].window_s / (double) a->steps);
                ret->stall_s += res[k].stall_s / (double) n;
                ret->compute_s += res[k].compute_s / (double) n;
                ret->words_checked += res[k].words_checked;
                if (res[k].mismatches > 0)
                        ret->verified = false;
                ret->vram_limit = res[k].vram_limit;
                ret->host_limit = res[k].host_limit;
                bench_log("job %zu: median step %.3f s, stall %.3f s/step", k, res[k].step_med, res[k].stall_s);
        }
        ret->nvme_read = c1.nvme_read - c0.nvme_read;
        ret->nvme_write = c1.nvme_write - c0.nvme_write;
        ret->link = (c1.to_vram - c0.to_vram) + (c1.from_vram - c0.from_vram);
        ret->target_read = c1.target_read - c0.target_read;
        ret->target_write = c1.target_written - c0.target_written;
out:
        r = reap_jobs(n, up, down, pids, r, "the plan");
        tier_client_free(ctl);
        return r;
}
