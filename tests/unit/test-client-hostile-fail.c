/* SPDX-License-Identifier: MIT */
/* test-client-hostile-fail.c: test-client-hostile's fault injection (libc wrapped) and the calls it fails. */

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <tier.h>

#include "tests/unit/test-client-hostile-fail.h"

/* Fault injection: -Wl,--wrap (tests/unit/meson.build) sends these calls here (test-client-hostile-fail.h). */
_Thread_local unsigned fail_at, fail_calls, fail_kinds;
_Thread_local bool fail_on;

static bool fail_now(unsigned kind, int err) {
        if (fail_at == 0 || !(fail_kinds & kind))
                return false;
        fail_calls++;
        if (fail_calls < fail_at || (fail_calls > fail_at && !fail_on))
                return false;
        errno = err;
        return true;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_reallocarray(void *p, size_t n, size_t size);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_vasprintf(char **ret, const char *fmt, va_list ap);
int __real_fstat64(int fd, struct stat *st);
ssize_t __real_pread64(int fd, void *buf, size_t n, off_t off);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_reallocarray(void *p, size_t n, size_t size);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_vasprintf(char **ret, const char *fmt, va_list ap);
int __wrap_fstat64(int fd, struct stat *st);
ssize_t __wrap_pread64(int fd, void *buf, size_t n, off_t off);

void *__wrap_malloc(size_t n) {
        return fail_now(FAIL_ALLOC, ENOMEM) ? NULL : __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size) {
        return fail_now(FAIL_ALLOC, ENOMEM) ? NULL : __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) {
        return fail_now(FAIL_ALLOC, ENOMEM) ? NULL : __real_realloc(p, n);
}
void *__wrap_reallocarray(void *p, size_t n, size_t size) {
        return fail_now(FAIL_ALLOC | FAIL_ARRAY, ENOMEM) ? NULL : __real_reallocarray(p, n, size);
}
char *__wrap_strdup(const char *s) {
        return fail_now(FAIL_ALLOC, ENOMEM) ? NULL : __real_strdup(s);
}
char *__wrap_strndup(const char *s, size_t n) {
        return fail_now(FAIL_ALLOC, ENOMEM) ? NULL : __real_strndup(s, n);
}
int __wrap_vasprintf(char **ret, const char *fmt, va_list ap) {
        return fail_now(FAIL_ALLOC, ENOMEM) ? -1 : __real_vasprintf(ret, fmt, ap);
}
int __wrap_fstat64(int fd, struct stat *st) {
        return fail_now(FAIL_FSTAT, EIO) ? -1 : __real_fstat64(fd, st);
}
ssize_t __wrap_pread64(int fd, void *buf, size_t n, off_t off) {
        return fail_now(FAIL_PREAD, EIO) ? -1 : __real_pread64(fd, buf, n, off);
}

static int call_status(tier_client *c, int format) {
        char *s = NULL;
        int r = tier_client_status(c, format, &s);

        free(s);
        return r;
}
int call_json(tier_client *c) {
        return call_status(c, TIER_STATUS_JSON);
}
int call_table(tier_client *c) {
        return call_status(c, TIER_STATUS_TABLE);
}
int call_metrics(tier_client *c) {
        return call_status(c, TIER_STATUS_PROMETHEUS);
}
int call_jobs(tier_client *c) {
        struct tier_job_info *j = NULL;
        size_t n = 0;
        int r = tier_job_list(c, &j, &n);

        free(j);
        return r;
}
int call_tensors(tier_client *c) {
        struct tier_tensor_info *t = NULL;
        size_t n = 0;
        int r = tier_job_tensors(c, "job", &t, &n);

        free(t);
        return r;
}
int call_trace(tier_client *c) {
        tier_trace *t = NULL;
        int r = tier_trace_stop(c, &t);

        tier_trace_free(t);
        return r;
}
int call_plan(tier_client *c) {
        tier_tensor *t = NULL;
        tier_plan *p = NULL;
        int r = tier_tensor_create(c, "w", 4096, &t);

        if (r >= 0)
                r = tier_plan_new(c, &p);
        if (r >= 0)
                r = tier_plan_add(p, 0, t, TIER_HOST, TIER_READ);
        if (r >= 0)
                r = tier_plan_submit(p);
        if (r < 0)
                tier_plan_free(p);      /* (a submitted plan is the client's) */
        tier_tensor_close(t);
        return r;
}
int call_pin(tier_client *c) {
        tier_tensor *t = NULL;
        struct tier_grant g;
        int r = tier_tensor_create(c, "w", 4096, &t);

        if (r >= 0)
                r = tier_pin(t, TIER_HOST, TIER_READ, &g);
        if (r >= 0)
                (void) tier_unpin(t, TIER_HOST, 0);
        tier_tensor_close(t);
        return r;
}
