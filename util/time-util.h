/* SPDX-License-Identifier: MIT */
/* time-util.h: the monotonic clock in the units tierd and its tools count in. */
#pragma once

#include <stdint.h>
#include <time.h>

/*
 * Everything here is CLOCK_MONOTONIC: it never jumps with the wall clock, and
 * it is the clock sd-event timers, clock_nanosleep(TIMER_ABSTIME) deadlines and
 * the timestamps tierd and libtier exchange are measured on.  Values are
 * unsigned counts since an unspecified start (boot, on Linux); only
 * differences and comparisons mean anything.  clock_gettime() cannot fail for
 * CLOCK_MONOTONIC on Linux, so there is no error return.
 */

#define NSEC_PER_SEC  UINT64_C(1000000000)
#define NSEC_PER_MSEC UINT64_C(1000000)
#define NSEC_PER_USEC UINT64_C(1000)
#define USEC_PER_SEC  UINT64_C(1000000)
#define USEC_PER_MSEC UINT64_C(1000)
#define MSEC_PER_SEC  UINT64_C(1000)

/* @ts as nanoseconds; negative fields (not from the monotonic clock) count as 0. */
static inline uint64_t timespec_to_ns(const struct timespec *ts) {
        if (ts->tv_sec < 0 || ts->tv_nsec < 0)
                return 0;
        return (uint64_t) ts->tv_sec * NSEC_PER_SEC + (uint64_t) ts->tv_nsec;
}

/* @ns as a struct timespec, e.g. an absolute deadline for clock_nanosleep(TIMER_ABSTIME). */
static inline struct timespec timespec_from_ns(uint64_t ns) {
        return (struct timespec) {
                .tv_sec = (time_t) (ns / NSEC_PER_SEC),
                .tv_nsec = (long) (ns % NSEC_PER_SEC),
        };
}

static inline uint64_t now_ns(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return timespec_to_ns(&ts);
}

static inline uint64_t now_usec(void) {
        return now_ns() / NSEC_PER_USEC;
}

static inline uint64_t now_ms(void) {
        return now_ns() / NSEC_PER_MSEC;
}

/* A duration in nanoseconds as seconds, for printing rates and timings. */
static inline double ns_to_sec(uint64_t ns) {
        return (double) ns / (double) NSEC_PER_SEC;
}
