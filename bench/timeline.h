/* SPDX-License-Identifier: MIT */
/* timeline.h: bench-timeline's options, read by the job, the single-job run and the fair-share run. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Most layers and jobs: plenty for a benchmark, and bounded arrays. */
#define MAX_LAYERS 256
#define MAX_JOBS 16
#define MAX_STEPS 10000
/* A phase that is not ready after this long means tierd is stuck: fail instead of hanging (--phase-timeout). */
#define PHASE_TIMEOUT_S 60

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
