/* SPDX-License-Identifier: MIT */
/* timeline.h: bench-timeline's options, read by the job, the single-job run and the fair-share run. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most layers and jobs: plenty for a benchmark, and bounded arrays. */
#define MAX_LAYERS 256
#define MAX_JOBS 16
#define MAX_STEPS 10000
/* A phase that is not ready after this long means tierd is stuck: fail instead of hanging (--phase-timeout). */
#define PHASE_TIMEOUT_S 60

typedef struct TlPlan TlPlan;

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
        uint64_t jobs;                  /* --jobs: that many jobs of the plan at once (1: the single job) */
        const TlPlan *plan;             /* the job's plan: synthetic from the options above, or --plan FILE */
        const char *plan_file;
        bool capbound;                  /* --capbound: print the fewest bytes per step and exit */
        uint64_t cb_vram, cb_host;      /* its limits */
        bool planned;                   /* --planned: the result line times the model's schedules too */
        uint64_t planned_tries;         /* --planned-tries: capbound_planned()'s random search */
} Args;

/* A timed run of --steps steps of one or (--jobs) several jobs at once: what the result line reports. */
typedef struct StepResult {
        size_t jobs;
        char policy[32];
        double step_s[MAX_JOBS];        /* each job's median step */
        double step_mean;               /* the window / steps (the slowest job's) */
        double stall_s, compute_s;      /* per step of one job (the mean over jobs) */
        uint64_t nvme_read, nvme_write, link, target_read, target_write;     /* the window's bytes, all jobs */
        bool verified;
        uint64_t words_checked;
        uint64_t vram_limit, host_limit;        /* each job's */
        const double *step_s_all;       /* the single job's steps; NULL with several */
} StepResult;
