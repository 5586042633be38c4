/* SPDX-License-Identifier: MIT */
/* test-quota.h: what test-quota.c shares with quota-nvme.c (the NVMe guarantees' tests). */

#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <tier.h>

#include "proto/macro.h"
#include "tests/helpers/harness.h"

#define MiB (UINT64_C(1) << 20)

/* The tierd of the test running now (test-quota.c's setup()). */
extern TestDaemon daemon_;

/* Can this test set quotas (root)?  Says why not. */
bool is_root(const char *what);
/* A connection of job @job (asserted). */
tier_client *connect_job(const char *job);
/* Run "tierctl --socket SOCK ARGS": its exit status; its stdout and stderr in *@out, *@err (malloc'ed, may be NULL). */
int tierctl(char **out, char **err, const char *fmt, ...) _printf_(3, 4);
void assert_contains(const char *haystack, const char *needle);

/* quota-nvme.c */
void test_nvme_min_kept(void **state);
void test_nvme_min_reload(void **state);
