/* SPDX-License-Identifier: MIT */
/* common.c: helpers shared by the benchmark programs. */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tier.h>

#include "bench/common.h"
#include "util/time-util.h"

/* Used when neither --socket nor $TIER_SOCKET is given and meson did not say. */
#ifndef TIERD_DEFAULT_SOCKET
#define TIERD_DEFAULT_SOCKET "/run/tierd/tierd.sock"
#endif

void bench_log(const char *fmt, ...) {
        va_list ap;

        fprintf(stderr, "%s: ", program_invocation_short_name);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
}

int bench_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
        uint64_t v;
        char *end;

        if (!s || *s < '0' || *s > '9')
                return -EINVAL;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno != 0)
                return -ERANGE;
        if (*end != '\0')
                return -EINVAL;
        if (v < min || v > max)
                return -ERANGE;
        *ret = v;
        return 0;
}

int bench_parse_seconds(const char *s, double *ret) {
        double v;
        char *end;

        if (!s || *s == '\0')
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (errno != 0 || *end != '\0')
                return -EINVAL;
        if (!isfinite(v) || v <= 0)
                return -ERANGE;
        *ret = v;
        return 0;
}

const char *bench_socket_path(const char *arg) {
        const char *e;

        if (arg && *arg)
                return arg;
        e = getenv("TIER_SOCKET");
        if (e && *e)
                return e;
        return TIERD_DEFAULT_SOCKET;
}

int bench_connect(tier_client **ret, const char *socket, const char *job, unsigned rank, int timeout_ms) {
        /* A daemon that was just started may have bound its socket but not listen yet. */
        const uint64_t retry_ns = UINT64_C(50000000);
        uint64_t deadline = now_ns() + (uint64_t) (timeout_ms > 0 ? timeout_ms : 0) * NSEC_PER_MSEC;

        for (;;) {
                int r = tier_client_new(socket, job, rank, ret);
                if (r >= 0)
                        return r;
                if ((r != -ENOENT && r != -ECONNREFUSED) || now_ns() >= deadline)
                        return r;
                struct timespec ts = timespec_from_ns(retry_ns);
                (void) nanosleep(&ts, NULL);
        }
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

double bench_percentile_us(uint64_t *ns, size_t n, double p) {
        size_t rank;

        if (n == 0)
                return NAN;
        qsort(ns, n, sizeof(*ns), cmp_u64);
        rank = (size_t) ceil(p * (double) n);
        if (rank < 1)
                rank = 1;
        if (rank > n)
                rank = n;
        return (double) ns[rank - 1] / 1e3;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;

        return x < y ? -1 : x > y;
}

double bench_median(const double *v, size_t n) {
        _cleanup_free_ double *s = NULL;

        if (n == 0)
                return NAN;
        s = malloc(n * sizeof(*s));
        if (!s)
                return NAN;
        memcpy(s, v, n * sizeof(*s));
        qsort(s, n, sizeof(*s), cmp_double);
        return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* ---- result line ---------------------------------------------------------------------- */

void bench_json_init(BenchJson *j, const char *bench) {
        json_writer_init(&j->w);
        json_object_begin(&j->w);
        bench_json_string(j, "bench", bench);
}

void bench_json_u64(BenchJson *j, const char *key, uint64_t v) {
        json_key(&j->w, key);
        json_uint(&j->w, v);
}

void bench_json_i64(BenchJson *j, const char *key, int64_t v) {
        json_key(&j->w, key);
        json_int(&j->w, v);
}

void bench_json_double(BenchJson *j, const char *key, double v) {
        json_key(&j->w, key);
        json_double(&j->w, v);
}

void bench_json_double_array(BenchJson *j, const char *key, const double *v, size_t n) {
        json_key(&j->w, key);
        json_array_begin(&j->w);
        for (size_t i = 0; i < n; i++)
                json_double(&j->w, v[i]);
        json_array_end(&j->w);
}

void bench_json_bool(BenchJson *j, const char *key, bool v) {
        json_key(&j->w, key);
        json_bool(&j->w, v);
}

void bench_json_string(BenchJson *j, const char *key, const char *v) {
        json_key(&j->w, key);
        json_string(&j->w, v ? v : "");
}

int bench_json_print(BenchJson *j) {
        _cleanup_free_ char *text = NULL;
        int r;

        json_object_end(&j->w);
        r = json_writer_finish(&j->w, &text, NULL);
        json_writer_deinit(&j->w);
        if (r < 0)
                return r;
        printf("%s\n", text);
        if (fflush(stdout) != 0)
                return negative_errno();
        return 0;
}
