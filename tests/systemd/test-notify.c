/* SPDX-License-Identifier: MIT */
/* test-notify.c: what tierd tells the service manager: EXTEND_TIMEOUT_USEC=, READY=1, STATUS=, WATCHDOG=1, RELOADING=1, STOPPING=1. */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "tests/helpers/harness.h"
#include "util/time-util.h"

/* What systemd would set for WatchdogSec=0.5s. */
#define WATCHDOG_USEC 500000u
/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (32u << 20)

static const char *const CONFIG =
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 8M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n";

static TestDaemon d;

/* Start tierd on d with our notify socket; @watchdog_usec as systemd would set it. */
static void start(uint64_t watchdog_usec) {
        TestDaemonOptions o = { .watchdog_usec = watchdog_usec, .wait_ready = true };

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
}

static int teardown(void **state) {
        test_daemon_cleanup(&d);
        return 0;
}

/*
 * READY=1 comes with a STATUS= that describes the tiers, in the same message.  With a service manager
 * ($NOTIFY_SOCKET) that keeps no fds ($FDSTORE unset), the log says why the memory store is off, and
 * only that: it added "no service manager ($NOTIFY_SOCKET)", which was wrong.
 */
static void test_ready_status(void **state) {
        TestDaemonOptions o = { .wait_ready = true, .log_level = "debug" };
        char status[1024];
        int i;

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        assert_true(test_daemon_log_contains(&d, "Memory store: off ($FDSTORE unset"));
        assert_false(test_daemon_log_contains(&d, "no service manager"));
        i = test_daemon_find_notify(&d, "READY=1");
        assert_true(i >= 0);
        assert_non_null(test_notify_field(d.notes[i].text, "STATUS", status, sizeof(status)));
        printf("READY=1 with STATUS=%s\n", status);
        assert_non_null(strstr(status, "vram"));
        assert_non_null(strstr(status, "(emulated)"));
        assert_non_null(strstr(status, "host"));
        assert_non_null(strstr(status, "nvme"));
        assert_non_null(strstr(status, "1 target(s)"));
        /* no watchdog asked for: none sent */
        test_daemon_collect(&d, 700);
        for (size_t k = 0; k < d.n_notes; k++)
                assert_null(strstr(d.notes[k].text, "WATCHDOG=1"));
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/*
 * Making the pools takes about 1.8 s per GiB: before READY=1, tierd asks the
 * service manager to wait longer (EXTEND_TIMEOUT_USEC=), or a large pool
 * outlasts TimeoutStartSec= and systemd kills tierd while it starts.  It
 * sent nothing.
 */
static void test_extend_timeout_before_ready(void **state) {
        char value[32];
        int extend, ready;

        start(0);
        extend = test_daemon_find_notify(&d, "EXTEND_TIMEOUT_USEC=");
        ready = test_daemon_find_notify(&d, "READY=1");
        assert_true(extend >= 0);
        assert_true(ready > extend);
        assert_non_null(test_notify_field(d.notes[extend].text, "EXTEND_TIMEOUT_USEC", value, sizeof(value)));
        assert_true(strtoull(value, NULL, 10) >= 1000000);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/*
 * WATCHDOG_USEC=500000: WATCHDOG=1 from the event loop, over and over.  Idle,
 * sd-event pings every half to three quarters of the interval, 2.7 to 4
 * times a second.  The pings are counted per second (two intervals) over
 * WATCHDOG_SLOTS seconds and every second must have one: a quarter of that
 * rate, which a loaded machine (ASan, valgrind; the times are when this
 * process received them) still keeps, while a tierd that stops pinging for
 * two seconds, anywhere in the window, leaves a second empty.
 */
#define WATCHDOG_SLOTS 3
#define WATCHDOG_SLOT_USEC (2 * WATCHDOG_USEC)

static void test_watchdog(void **state) {
        uint64_t t_start, last, max_gap = 0;
        unsigned n = 0, per_slot[WATCHDOG_SLOTS] = { 0 };
        size_t first;
        int i;

        start(WATCHDOG_USEC);
        i = test_daemon_find_notify(&d, "READY=1");
        assert_true(i >= 0);
        first = d.n_notes;
        t_start = last = now_usec();

        test_daemon_collect(&d, WATCHDOG_SLOTS * WATCHDOG_SLOT_USEC / 1000);
        for (size_t k = first; k < d.n_notes; k++) {
                uint64_t slot = (d.notes[k].usec - t_start) / WATCHDOG_SLOT_USEC;

                if (strcmp(d.notes[k].text, "WATCHDOG=1") != 0)
                        continue;
                n++;
                if (slot < WATCHDOG_SLOTS)
                        per_slot[slot]++;
                if (d.notes[k].usec - last > max_gap)
                        max_gap = d.notes[k].usec - last;
                last = d.notes[k].usec;
        }
        printf("%u WATCHDOG=1 in %.1f s (%u, %u, %u per second), longest gap %.0f ms (WATCHDOG_USEC=%u)\n", n,
               (double) (now_usec() - t_start) / 1e6, per_slot[0], per_slot[1], per_slot[2], (double) max_gap / 1e3,
               WATCHDOG_USEC);
        for (unsigned s = 0; s < WATCHDOG_SLOTS; s++)
                assert_true(per_slot[s] >= 1);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/* WATCHDOG_PID naming another process: the watchdog is not ours, nothing is sent (sd_watchdog_enabled(3)). */
static void test_watchdog_other_pid(void **state) {
        TestDaemonOptions o = { .watchdog_usec = WATCHDOG_USEC, .watchdog_pid = 1, .wait_ready = true };

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        test_daemon_collect(&d, 1200);
        for (size_t k = 0; k < d.n_notes; k++)
                assert_null(strstr(d.notes[k].text, "WATCHDOG=1"));
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/* SIGHUP: RELOADING=1 with MONOTONIC_USEC= of the moment, then READY=1 with STATUS=. */
static void test_reload(void **state) {
        char v[256];
        uint64_t before, after, mono;
        int i, j;

        start(WATCHDOG_USEC);
        before = now_usec();
        kill(d.pid, SIGHUP);
        i = test_daemon_wait_notify(&d, "RELOADING=1", 10000);
        assert_true(i >= 0);
        after = now_usec();
        assert_non_null(test_notify_field(d.notes[i].text, "MONOTONIC_USEC", v, sizeof(v)));
        mono = strtoull(v, NULL, 10);
        printf("RELOADING=1 MONOTONIC_USEC=%" PRIu64 " (sent between %" PRIu64 " and %" PRIu64 ")\n",
               mono, before, after);
        assert_true(mono >= before && mono <= after);
        j = test_daemon_wait_notify(&d, "READY=1", 10000);
        assert_true(j > i);
        assert_non_null(test_notify_field(d.notes[j].text, "STATUS", v, sizeof(v)));
        assert_null(strstr(v, "refused"));

        /* a second reload works the same */
        kill(d.pid, SIGHUP);
        assert_true(test_daemon_wait_notify(&d, "RELOADING=1", 10000) >= 0);
        assert_true(test_daemon_wait_notify(&d, "READY=1", 10000) >= 0);
        /* and the watchdog goes on */
        assert_true(test_daemon_wait_notify(&d, "WATCHDOG=1", 2000) >= 0);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/* SIGTERM and SIGINT: STOPPING=1, then exit status 0. */
static void test_stopping(void **state) {
        static const int sigs[] = { SIGTERM, SIGINT };

        for (size_t k = 0; k < 2; k++) {
                int st;

                start(WATCHDOG_USEC);
                st = test_daemon_kill(&d, sigs[k], 15000);
                if (st != 0)
                        test_daemon_dump_log(&d);
                assert_int_equal(st, 0);
                assert_true(test_daemon_find_notify(&d, "STOPPING=1") >= 0);
                assert_true(test_daemon_log_contains(&d, k == 0 ? "SIGTERM received" : "SIGINT received"));
                test_daemon_cleanup(&d);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_ready_status, teardown),
                cmocka_unit_test_teardown(test_extend_timeout_before_ready, teardown),
                cmocka_unit_test_teardown(test_watchdog, teardown),
                cmocka_unit_test_teardown(test_watchdog_other_pid, teardown),
                cmocka_unit_test_teardown(test_reload, teardown),
                cmocka_unit_test_teardown(test_stopping, teardown),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        return cmocka_run_group_tests_name("notify", tests, NULL, NULL);
}
