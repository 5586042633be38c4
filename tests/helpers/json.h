/* SPDX-License-Identifier: MIT */
/* json.h: read tierd's JSON status (tierctl --json status, tier_client_status()) with jansson. */
#pragma once

#include <jansson.h>

typedef struct TestDaemon TestDaemon;

/* @text parsed, or NULL after printing where and why it is not JSON. */
json_t *test_json_parse(const char *text);
/* "tierctl --json status" of @d, parsed; NULL if tierctl failed or printed no JSON. */
json_t *test_daemon_status(const TestDaemon *d);

/* The object of @status's "jobs" array whose "name" is @name (borrowed), or NULL. */
json_t *test_json_job(const json_t *status, const char *name);
/* Job @job's usage of @tier ("vram", "host", "nvme"): its @field ("used", "limit", "pinned"); -1 if absent. */
long long test_json_job_tier(const json_t *status, const char *job, const char *tier, const char *field);
/* @field ("capacity", "used", "pinned") of @tier in @status's "tiers" array; -1 if absent. */
long long test_json_tier(const json_t *status, const char *tier, const char *field);
/* The sum of every integer member named @key in @json, at any depth. */
unsigned long long test_json_sum(const json_t *json, const char *key);
