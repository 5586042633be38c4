/* SPDX-License-Identifier: MIT */
/* test-client-hostile-fail.h: test-client-hostile's fault injection (test-client-hostile-fail.c). */
#pragma once

#include <stdbool.h>

#include <tier.h>

/*
 * While fail_at is set, this thread's fail_at-th call of an allocator, fstat() or pread() of the
 * kinds in fail_kinds fails (ENOMEM, EIO), and with fail_on every one after it too; fail_calls
 * counts the calls.
 */
enum { FAIL_ALLOC = 1, FAIL_FSTAT = 2, FAIL_PREAD = 4, FAIL_ANY = 7, FAIL_ARRAY = 8 /* reallocarray() only */ };
extern _Thread_local unsigned fail_at, fail_calls, fail_kinds;
extern _Thread_local bool fail_on;

typedef struct Call {
        const char *what;
        int inline_replies;
        int (*fn)(tier_client *c);
        unsigned kinds;                 /* what fails */
        bool on;                        /* and goes on failing */
        const char *want;               /* NULL, or what one of the failures' texts starts with */
} Call;

/* One library call each, what it made freed; its result */
int call_json(tier_client *c);
int call_table(tier_client *c);
int call_metrics(tier_client *c);
int call_jobs(tier_client *c);
int call_tensors(tier_client *c);
int call_trace(tier_client *c);
int call_plan(tier_client *c);
int call_pin(tier_client *c);
