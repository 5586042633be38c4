/* SPDX-License-Identifier: MIT */
/* timeline-job.h: bench-timeline's synthetic training job, and the link counters it reads from tierd. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct Args Args;
typedef struct Counters Counters;
typedef struct tier_client tier_client;
typedef struct tier_tensor tier_tensor;

typedef struct Job {
        tier_client *c;
        const Args *a;
        tier_tensor **t;                /* the plan's tensors */
        unsigned *ver;                  /* version last written; 0: never (zeros) */
        uint64_t seed;
        uint64_t words_checked;
        uint64_t mismatches;
        uint64_t phases;                /* phases completed */
        uint64_t compute_ns;            /* time between tier_phase_enter() returning and the next call */
        unsigned n_phases;
        /* --trace: per timed phase, when tier_phase_enter() was called and when it returned */
        uint64_t (*trace)[3];
        size_t n_trace, cap_trace;
} Job;

/* Connect as @name, set the weight if asked (@weight > 0), create the tensors and submit the plan. */
int job_new(const Args *a, const char *name, unsigned weight, Job **ret);
/* Close the connection (and the plan with it), then the tensors; takes NULL, returns NULL. */
Job *job_free(Job *j);

/*
 * job_phase() - enter phase @ph and do its work: check what it reads, stamp
 * what it writes, spin until @compute_us have passed since it was ready.
 */
int job_phase(Job *j, unsigned ph, uint64_t compute_us);
/* Phase @ph's compute time: --fwd-us, --bwd-us or --opt-us by its kind. */
uint64_t job_compute_us(const Job *j, unsigned ph);
/* One step: every phase of the plan in order, each with its compute time. */
int job_step(Job *j);
/* The last phase's writes are released by one more marker. */
int job_finish(Job *j);

/*
 * job_on_alarm() - the SIGALRM handler: job_phase() arms the alarm with
 * --phase-timeout around tier_phase_enter(); when it fires, say which phase never
 * became ready and _exit(3).
 */
void job_on_alarm(int sig);

/*
 * counters_read() - tierd's link counters into *@ret (and with @policy, its
 * policy's name), from tier_client_status() on @c: see counters_parse() in
 * bench/timeline-status.h.  Logs why it failed.
 */
int counters_read(tier_client *c, Counters *ret, char *policy, size_t policy_size);
