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
#include <sys/stat.h>
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

/* tierd again on the same directory, with the fault rules @faults (NULL: none). */
static void spawn(const char *faults) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };

        if (faults)
                assert_int_equal(setenv("TIERD_TEST_FAULTS", faults, 1), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        unsetenv("TIERD_TEST_FAULTS");
}

/* A fresh tierd, with the fault rules @faults (NULL: none), with the harness's fd store when @store. */
static void start_with(const char *faults, bool store) {
        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        d.fd_store = store;
        spawn(faults);
        if (store)
                assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-table", 1, 10000), 0);
}

static void start(void) {
        start_with(NULL, false);
}

/* How long tierd's log is now (it only grows: each start appends). */
static long log_size(void) {
        struct stat st;

        assert_int_equal(stat(d.log, &st), 0);
        return (long) st.st_size;
}

/* tierd's log from @off on (free() it). */
static char *log_since(long off) {
        FILE *f = fopen(d.log, "re");
        char *text;
        long n;

        assert_non_null(f);
        assert_int_equal(fseek(f, 0, SEEK_END), 0);
        n = ftell(f) - off;
        assert_true(n >= 0);
        assert_int_equal(fseek(f, off, SEEK_SET), 0);
        text = calloc(1, (size_t) n + 1);
        assert_non_null(text);
        assert_int_equal(fread(text, 1, (size_t) n, f), (size_t) n);
        fclose(f);
        return text;
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

/* Every byte of @n at @p is @v. */
static bool all(const void *p, size_t n, uint8_t v) {
        for (size_t i = 0; i < n; i++)
                if (((const uint8_t *) p)[i] != v)
                        return false;
        return true;
}

/*
 * With the fd store: job 'ghost' writes x (0x33, in host only), pins it for
 * writing again and writes half of it (0x44), and tierd is SIGKILLed; the
 * next start (@faults: its fault rules) puts x back held for writing by that
 * client of before the restart (a ghost, Tensor.ghost).  *@ret_g: the
 * client's grant, still mapped.
 */
static void ghost_made(const char *faults, tier_client **ret_c, tier_tensor **ret_x, struct tier_grant *ret_g) {
        start_with(NULL, true);
        *ret_c = connect_job("ghost");
        assert_int_equal(tier_tensor_create(*ret_c, "x", MiB, ret_x), 0);
        assert_int_equal(tier_pin(*ret_x, TIER_HOST, TIER_READ_WRITE, ret_g), 0);
        memset(ret_g->ptr, 0x33, ret_g->length);
        assert_int_equal(tier_unpin(*ret_x, TIER_HOST, 1), 0);
        assert_int_equal(tier_pin(*ret_x, TIER_HOST, TIER_READ_WRITE, ret_g), 0);
        memset(ret_g->ptr, 0x44, ret_g->length / 2);
        test_daemon_drain(&d);                          /* what the store was sent is in */
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn(faults);
        assert_true(test_daemon_log_contains(&d, "1 with newer data kept in memory"));
}

/*
 * A stop before the ghost's rank attached again: x is not written down (its
 * client may still be writing it: NVMe would get a torn copy), and the log
 * says that the memory store keeps it, not that it is lost.  It used to be
 * given to a write-down that failed ("pinned in host"), and the stop said it
 * was lost.  The client writes the other half after the stop, and the next
 * start, the store kept, has every byte it wrote.
 */
static void test_stop_keeps_ghost(void **state) {
        tier_client *c, *c2;
        tier_tensor *x = NULL, *x2 = NULL;
        struct tier_grant g, g2;
        char *log;
        long off;

        ghost_made(NULL, &c, &x, &g);
        off = log_size();
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
        log = log_since(off);
        printf("%s", log);
        assert_null(strstr(log, "Stopping: writing"));
        assert_non_null(strstr(log, "Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe "
                                    "(1 held for writing by a client of before tierd's restart whose rank had not "
                                    "attached again, not written down since that client may still be writing it): "
                                    "they stay in the memory store, and the next start puts them back"));
        /* (lost only if the service manager empties the store: a stop, not a restart) */
        assert_null(strstr(log, "is lost"));
        assert_null(strstr(log, "(lost)"));
        assert_null(strstr(log, "they are lost"));
        free(log);

        memset((uint8_t *) g.ptr + g.length / 2, 0x44, g.length - g.length / 2);      /* after tierd stopped */
        spawn(NULL);
        c2 = connect_job("ghost");              /* its Hello: the copy counts as written */
        assert_int_equal(tier_tensor_open(c2, "x", &x2), 0);
        assert_int_equal(tier_pin(x2, TIER_HOST, TIER_READ, &g2), 0);
        assert_true(all(g2.ptr, g2.length, 0x44));
        assert_int_equal(tier_unpin(x2, TIER_HOST, 0), 0);
        tier_tensor_close(x2);
        tier_client_free(c2);
        tier_tensor_close(x);
        tier_client_free(c);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/*
 * The ghost of rank 1 (x, held for writing by it at the SIGKILL), after rank
 * 0 of its job attached again and left (its Hello does not release rank 1's
 * copy): the stop does not write x down, and says why truly, of the rank,
 * not of the job (it said "whose job had not attached again").
 */
static void test_stop_keeps_ghost_of_a_rank_not_back(void **state) {
        tier_client *c0, *c1;
        tier_tensor *x = NULL;
        struct tier_grant g;
        char *log;
        long off;

        start_with(NULL, true);
        assert_int_equal(tier_client_new(d.socket, "ghost", 1, &c1), 0);
        assert_int_equal(tier_tensor_create(c1, "x", MiB, &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x55, g.length);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        spawn(NULL);
        c0 = connect_job("ghost");              /* rank 0: the job is back, rank 1 is not */
        tier_client_free(c0);
        off = log_size();
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
        log = log_since(off);
        printf("%s", log);
        assert_null(strstr(log, "Stopping: writing"));
        assert_null(strstr(log, "whose job had not attached again"));
        assert_non_null(strstr(log, "(1 held for writing by a client of before tierd's restart whose rank had not "
                                    "attached again, not written down since that client may still be writing it): "
                                    "they stay in the memory store"));
        free(log);
        tier_tensor_close(x);
        tier_client_free(c1);
}

/*
 * The same, but the start after the SIGKILL cannot make its memory store
 * table (fault store-table): memory is not kept in that run, so the ghost is
 * lost at its stop, and the log says so and why.  It said "could not be
 * (lost)" for a failed write-down instead; the next start finds x lost.
 */
static void test_stop_ghost_lost_without_store(void **state) {
        tier_client *c, *c2;
        tier_tensor *x = NULL, *x2 = NULL;
        struct tier_grant g, g2;
        char *log;
        long off;

        ghost_made("store-table", &c, &x, &g);
        assert_true(test_daemon_log_contains(&d, "Memory store: cannot make its table"));
        off = log_size();
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
        log = log_since(off);
        printf("%s", log);
        assert_null(strstr(log, "Stopping: writing"));
        assert_non_null(strstr(log, "Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe "
                                    "(1 held for writing by a client of before tierd's restart whose rank had not "
                                    "attached again, not written down since that client may still be writing it): "
                                    "they are lost (the next start reports them)"));
        free(log);

        spawn(NULL);
        c2 = connect_job("ghost");
        assert_int_equal(tier_tensor_open(c2, "x", &x2), 0);
        assert_int_equal(tier_pin(x2, TIER_HOST, TIER_READ, &g2), -ENODATA);
        tier_tensor_close(x2);
        tier_client_free(c2);
        tier_tensor_close(x);
        tier_client_free(c);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
}

/*
 * A write-down that fails (nvme-write-eio) in a stop that ends in time: the
 * stop's summary counts it as failed and lost.  Only a stop cut short used to
 * say what was left only in memory.
 */
static void test_stop_write_down_failed(void **state) {
        tier_client *c;
        tier_tensor *x = NULL;
        struct tier_grant g;
        char *log;

        start_with("nvme-write-eio:job=failing", false);
        c = connect_job("failing");
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x33, g.length);
        assert_int_equal(tier_unpin(x, TIER_HOST, 1), 0);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
        log = log_since(0);
        assert_non_null(strstr(log, "Stopping: tensor 'x' of job 'failing' could not be written down to NVMe"));
        assert_non_null(strstr(log, "Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe "
                                    "(1 whose write-down failed): they are lost (the next start reports them)"));
        assert_null(strstr(log, "Stopping with"));      /* it ended in time */
        free(log);
        tier_tensor_close(x);
        tier_client_free(c);
}

/*
 * The signal again while a write-down is on its way (nvme-delay holds it
 * 60 s; it is asked for before STOPPING=1 reaches us): the summary says its
 * write-down had not ended.
 */
static void test_stop_cut_short_write_down_unfinished(void **state) {
        tier_client *c;
        tier_tensor *x = NULL;
        struct tier_grant g;
        char *log;

        start_with("nvme-delay:job=slow,ms=60000", false);
        c = connect_job("slow");
        assert_int_equal(tier_tensor_create(c, "x", MiB, &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x33, g.length);
        assert_int_equal(tier_unpin(x, TIER_HOST, 1), 0);
        assert_int_equal(kill(d.pid, SIGTERM), 0);
        assert_true(test_daemon_wait_notify(&d, "STOPPING=1", 10000) >= 0);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
        log = log_since(0);
        /* the second signal, or (on a machine slower than the bound) the write-down's idle bound
         * before it: either way the summary is the same */
        assert_true(strstr(log, "received again") || strstr(log, "giving up on 1 of them"));
        assert_non_null(strstr(log, "Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe "
                                    "(1 whose write-down had not ended): they are lost (the next start reports them)"));
        free(log);
        tier_tensor_close(x);
        tier_client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_stop_idle_client, teardown),
                cmocka_unit_test_teardown(test_stop_waits_for_transfer, teardown),
                cmocka_unit_test_teardown(test_stop_keeps_ghost, teardown),
                cmocka_unit_test_teardown(test_stop_keeps_ghost_of_a_rank_not_back, teardown),
                cmocka_unit_test_teardown(test_stop_ghost_lost_without_store, teardown),
                cmocka_unit_test_teardown(test_stop_write_down_failed, teardown),
                cmocka_unit_test_teardown(test_stop_cut_short_write_down_unfinished, teardown),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests_name("stop", tests, NULL, NULL);
}
