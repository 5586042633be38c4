/* SPDX-License-Identifier: MIT */
/* daemon.h: start a real tierd on a temporary directory for integration tests. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

typedef struct TestDaemon {
        pid_t pid;
        char dir[256];          /* temp state dir, removed by test_daemon_stop */
        char socket[300];
        char config[300];
        char log[300];
} TestDaemon;

/*
 * test_daemon_start() - write @config_body (the [nvme] target lines may use
 * "@DIR@", replaced by the temp dir) to a file, start $TIER_BUILD/daemon/tierd
 * with NOTIFY_SOCKET pointing at a socket of ours, and wait for READY=1.
 * Returns 0, or -errno after printing the daemon's log.
 */
int test_daemon_start(TestDaemon *d, const char *config_body);
/* SIGTERM, wait; returns the exit status (or -1 if it had to be killed), removes the dir. */
int test_daemon_stop(TestDaemon *d);
/* Run "tierctl --socket S --json status" and return its output (malloc'ed) or NULL. */
char *test_tierctl_json(TestDaemon *d);
/* Sum of every "KEY": number in @json. */
unsigned long long test_json_sum(const char *json, const char *key);
/* Path of a built program ("daemon/tierd", "client/tierctl") under $TIER_BUILD. */
const char *test_build_path(const char *rel, char *buf, size_t size);
