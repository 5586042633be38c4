/* SPDX-License-Identifier: MIT */
/* timeline-fair.h: bench-timeline --fair: jobs of different weights at once, their shares against the weights. */
#pragma once

typedef struct Args Args;

/*
 * fair_run() - one job alone, then one job per weight of @a at once (child
 * processes), each for @a->duration after its warm-up; print the JSON line
 * (Jain's index, shares, NVMe throughput against the lone job's).
 */
int fair_run(const Args *a);

typedef struct StepResult StepResult;

/*
 * same_run() - @a->jobs jobs of the same plan at once (child processes,
 * names bench-timeline-PID-k): each warms up, all meet at a barrier, each
 * runs --steps steps; tierd's link counters are read around the window
 * (from the barrier until every job is done).  Fills *@ret; prints nothing.
 */
int same_run(const Args *a, StepResult *ret);
