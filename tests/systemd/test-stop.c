/* SPDX-License-Identifier: MIT */
/* test-stop.c: the graceful stop: clients are told, transfers in flight end, exit status 0. */

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tier.pb-c.h"
#include "util/time-util.h"

#define MiB (1024u * 1024u)
/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (32 * MiB)

/*
 * The emulated host->VRAM link is throttled to 2 MiB/s, and its throttle
 * never lets a copy end early (tiers/vram-emul.c), so moving one 4 MiB
 * tensor up takes at least 2 s: still in flight when SIGTERM comes a few
 * calls later even on a loaded machine, short enough for the drain (10 s)
 * to wait for it.
 */
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
        "bandwidth = 2M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n";

static TestDaemon d;

static double now_s(void) {
        return ns_to_sec(now_ns());
}

static void start(void) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
}

static tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(d.socket, job, 0, &c);

        if (r < 0)
                fprintf(stderr, "connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(NULL));
        assert_int_equal(r, 0);
        return c;
}

static int teardown(void **state) {
        test_daemon_cleanup(&d);
        return 0;
}

/*
 * An idle client: the first thing it receives after SIGTERM is Event.shutdown
 * (read here from the socket itself, under libtier), then the end of the
 * connection; tierd exits 0 at once.
 */
static void test_stop_idle_client(void **state) {
        struct pollfd p = { .events = POLLIN };
        Tier__Reply *reply;
        tier_tensor *t = NULL;
        tier_client *c;
        uint8_t buf[4096];
        ssize_t n;
        double t0;
        int r;

        start();
        c = connect_job("idle");
        assert_int_equal(tier_tensor_create(c, "x", MiB, &t), 0);

        t0 = now_s();
        r = test_daemon_kill(&d, SIGTERM, 15000);
        printf("tierd exited with status %d after %.2f s\n", r, now_s() - t0);
        assert_int_equal(r, 0);
        /* nothing to wait for: tierd did not sit out its drain bound (10 s) */
        assert_false(test_daemon_log_contains(&d, "Stopping with"));

        p.fd = tier_client_fd(c);
        assert_int_equal(poll(&p, 1, 5000), 1);
        n = recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT);
        assert_true(n > 0);
        reply = tier__reply__unpack(NULL, (size_t) n, buf);
        assert_non_null(reply);
        assert_int_equal(reply->kind_case, TIER__REPLY__KIND_EVENT);
        assert_int_equal(reply->event->kind_case, TIER__EVENT__KIND_SHUTDOWN);
        printf("the client got Event.shutdown: \"%s\"\n", reply->event->shutdown->reason);
        assert_string_equal(reply->event->shutdown->reason, "tierd is stopping");
        tier__reply__free_unpacked(reply, NULL);
        assert_int_equal(recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT), 0);      /* then the end */

        /* through libtier: the request fails, it does not hang */
        r = tier_tensor_stat(t, &(struct tier_stat) {});
        printf("request after the stop: %s\n", tier_strerror(r));
        assert_true(r == -ESHUTDOWN || r == -ECONNRESET);

        tier_tensor_close(t);
        tier_client_free(c);
        assert_false(test_daemon_log_contains(&d, "still in flight"));
}

/* A transfer in flight at SIGTERM: tierd waits for it (not for the bound), then exits 0. */
static void test_stop_waits_for_transfer(void **state) {
        struct tier_grant g;
        tier_tensor *t = NULL;
        tier_fence f = 0;
        tier_client *c;
        char status[512] = "";
        double t_issue, t0, took;
        int r, i;

        start();
        c = connect_job("busy");
        assert_int_equal(tier_tensor_create(c, "w", 4 * MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x5a, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);

        /* 4 MiB at 2 MiB/s: the copy cannot end before t_issue + 2 s */
        t_issue = now_s();
        assert_int_equal(tier_pin_async(t, TIER_VRAM, TIER_READ_WRITE, &g, &f), 0);
        t0 = now_s();
        kill(d.pid, SIGTERM);
        i = test_daemon_wait_notify(&d, "STOPPING=1", 10000);
        assert_true(i >= 0);
        (void) test_notify_field(d.notes[i].text, "STATUS", status, sizeof(status));
        printf("STOPPING=1 STATUS=%s\n", status);
        /* the copy was still running when tierd began to drain */
        assert_non_null(strstr(status, "Stopping: 1 transfer(s) in flight"));

        /* the client hears of it and does not hang */
        r = tier_fence_wait(c, f, 10000);
        printf("tier_fence_wait on the fence during the stop: %s\n", r < 0 ? tier_strerror(r) : "done");
        assert_true(r != -ETIMEDOUT);
        /*
         * The pin may write: tierd waits for it to go (up to its drain bound), so
         * that what was written through it is in memory when the stop writes it
         * down; letting go is still sent after Event.shutdown.
         */
        if (r == 0) {
                assert_int_equal(kill(d.pid, 0), 0);
                assert_int_equal(tier_unpin(t, TIER_VRAM, 1), 0);
        }

        r = test_daemon_kill(&d, 0, 15000);     /* signal 0: no second SIGTERM, only wait */
        took = now_s() - t0;
        printf("tierd exited with status %d %.2f s after SIGTERM, %.2f s after the copy was asked for\n", r,
               took, t0 + took - t_issue);
        if (r != 0)
                test_daemon_dump_log(&d);
        assert_int_equal(r, 0);
        /* it waited for the copy: not gone before the throttle could let the copy end */
        assert_true(t0 + took - t_issue >= 2.0);
        /* the drain ended because nothing was left, not at its bound, and nothing was abandoned */
        assert_true(test_daemon_log_contains(&d, "Drained: no transfer in flight"));
        assert_false(test_daemon_log_contains(&d, "Stopping with"));
        assert_false(test_daemon_log_contains(&d, "Abandoning"));

        tier_tensor_close(t);
        tier_client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_stop_idle_client, teardown),
                cmocka_unit_test_teardown(test_stop_waits_for_transfer, teardown),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        return cmocka_run_group_tests_name("stop", tests, NULL, NULL);
}
