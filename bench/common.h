/* SPDX-License-Identifier: MIT */
/* common.h: helpers shared by the benchmark programs (logging, arguments, statistics, JSON lines). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/macro.h"
#include "util/json.h"

/*
 * Sizes are read with size_parse() (util/size.h: 4096, 64K, 16M, 1G, ...) and
 * times taken with now_ns() (util/time-util.h), as everywhere else in tierd.
 */

typedef struct tier_client tier_client;

/* Progress and errors go to stderr, prefixed with the program name. */
void bench_log(const char *fmt, ...) _printf_(1, 2);

/* Parse a decimal unsigned integer in [min, max]. */
int bench_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret);
/* Parse a positive finite decimal number (seconds). */
int bench_parse_seconds(const char *s, double *ret);

/*
 * bench_socket_path() - the socket to use: @arg, else $TIER_SOCKET, else the
 * build's default.  Never NULL.
 */
const char *bench_socket_path(const char *arg);

/*
 * bench_connect() - tier_client_new(), retried for up to @timeout_ms while
 * the socket is missing or not yet listening (a daemon that was just started).
 */
int bench_connect(tier_client **ret, const char *socket, const char *job, unsigned rank, int timeout_ms);

/*
 * bench_percentile_us() - nearest-rank percentile @p (0..1] of @n samples in
 * nanoseconds, in microseconds.  Sorts @ns in place.
 */
double bench_percentile_us(uint64_t *ns, size_t n, double p);

/* Median of @n values; NAN when @n is 0. */
double bench_median(const double *v, size_t n);

/*
 * The result line of a benchmark: one JSON object, {"bench":NAME,...}, with
 * the fields in the order they are added, printed on stdout by
 * bench_json_print(), which also frees it.  Scripts read these lines, so keys
 * and their order are an interface.  Written by util/json.c: strings are
 * always valid JSON, doubles are %.6g, non-finite ones null.
 */
typedef struct BenchJson {
        JsonWriter w;
} BenchJson;

void bench_json_init(BenchJson *j, const char *bench);
void bench_json_u64(BenchJson *j, const char *key, uint64_t v);
void bench_json_i64(BenchJson *j, const char *key, int64_t v);
void bench_json_double(BenchJson *j, const char *key, double v);
void bench_json_double_array(BenchJson *j, const char *key, const double *v, size_t n);
void bench_json_bool(BenchJson *j, const char *key, bool v);
/* NULL is written as "". */
void bench_json_string(BenchJson *j, const char *key, const char *v);
/* Print the object and a newline on stdout and free it; -ENOMEM if it could not be built. */
int bench_json_print(BenchJson *j);
