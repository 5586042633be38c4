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
