/* SPDX-License-Identifier: MIT */
/* time-util.h: the monotonic clock (CLOCK_MONOTONIC) in ns, us and ms. */
#pragma once

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * UINT64_C(1000000000) + (uint64_t) ts.tv_nsec;
}

static inline uint64_t now_usec(void) {
        return now_ns() / 1000;
}

static inline uint64_t now_ms(void) {
        return now_ns() / 1000000;
}
