/* SPDX-License-Identifier: MIT */
/* test-integration.c: a real tierd on a temp dir, driven through libtier and raw packets. */

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
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "proto/wire.h"
#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"
#include "tier.pb-c.h"

#define MiB (1024ull * 1024ull)

/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (96 * MiB)

/* Small pools: two striped targets; the job's host limit is below what the tests create. */
static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 30\n"
        "[limits]\n"
        "max_inflight = 64\n"
        "max_tensors = 64\n"
        "[host]\n"
        "capacity = 96M\n"
        "segment_size = 16M\n"
        "job_limit = 32M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 32M\n"
        "chunk_size = 8M\n"
        "job_limit = 16M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "target = @DIR@/t1.img:256M\n"
        "extent_size = 1M\n";

static TestDaemon daemon_;

static int setup(void **state) {
        int r = test_daemon_start(&daemon_, CONFIG);

        if (r < 0) {
                fprintf(stderr, "cannot start tierd: %s\n", strerror(-r));
                return -1;
        }
        return 0;
}

static int teardown(void **state) {
        int r = test_daemon_stop(&daemon_);

        if (r != 0) {
                fprintf(stderr, "tierd did not exit cleanly (status %d)\n", r);
                return -1;
        }
        return 0;
}

static tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(daemon_.socket, job, 0, &c);

        if (r < 0)
                fprintf(stderr, "connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(c));
        assert_int_equal(r, 0);
        return c;
}

static uint8_t pattern(uint64_t tensor, uint64_t off) {
        return (uint8_t) ((off * 31 + tensor * 7 + (off >> 12)) ^ (tensor << 3));
}

static void fill(tier_tensor *t, uint64_t idx, int tier) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, tier, TIER_READ_WRITE, &g), 0);
        assert_non_null(g.ptr);
        assert_int_equal(g.length, tier_tensor_size(t));
        for (uint64_t i = 0; i < g.length; i++)
                ((uint8_t *) g.ptr)[i] = pattern(idx, i);
        assert_int_equal(tier_unpin(t, tier, 1), 0);
}

static void verify(tier_tensor *t, uint64_t idx, int tier) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, tier, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < g.length; i++)
                if (((uint8_t *) g.ptr)[i] != pattern(idx, i)) {
                        fprintf(stderr, "tensor %" PRIu64 " byte %" PRIu64 ": %u != %u\n", idx, i,
                                ((uint8_t *) g.ptr)[i], pattern(idx, i));
                        fail();
                }
        assert_int_equal(tier_unpin(t, tier, 0), 0);
}

/* Count the targets whose "bytes_written" is non-zero. */
static unsigned targets_written(const json_t *status) {
        unsigned n = 0;
        json_t *t;
        size_t i;

        json_array_foreach(json_object_get(status, "targets"), i, t)
                if (json_integer_value(json_object_get(t, "bytes_written")) > 0)
                        n++;
        return n;
}

/* ---- host -> NVMe -> host, striped over two targets ------------------------------------ */

static void test_integrity_striped(void **state) {
        enum { N = 10 };
        static const uint64_t sizes[N] = { 8 * MiB, 8 * MiB, 8 * MiB, 5 * MiB + 123, 8 * MiB,
                                           1, 4096, 3 * MiB + 4095, 8 * MiB, 7 * MiB };
        tier_client *c = connect_job("integrity");
        tier_tensor *t[N];
        struct tier_stat st;
        char name[32];
        json_t *status;

        /* 55 MiB of tensors against a 32 MiB host limit: tierd must spill by itself */
        for (unsigned i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "t%u", i);
                assert_int_equal(tier_tensor_create(c, name, sizes[i], &t[i]), 0);
                fill(t[i], i, TIER_HOST);
        }
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_evict(t[i], TIER_NVME), 0);
        for (unsigned i = 0; i < N; i++) {
                assert_int_equal(tier_tensor_stat(t[i], &st), 0);
                assert_int_equal(st.state[TIER_HOST], 0);
                assert_int_equal(st.state[TIER_NVME], 2);
        }
        /* read back in reverse order, through the spill path again */
        for (unsigned i = N; i-- > 0;)
                verify(t[i], i, TIER_HOST);
        /* one round trip through (emulated) VRAM as well */
        verify(t[6], 6, TIER_VRAM);
        fill(t[6], 60, TIER_VRAM);
        assert_int_equal(tier_evict(t[6], TIER_NVME), 0);
        verify(t[6], 60, TIER_HOST);

        status = test_daemon_status(&daemon_);
        assert_non_null(status);
        assert_int_equal(json_array_size(json_object_get(status, "targets")), 2);
        assert_int_equal(targets_written(status), 2);   /* striped over both */
        assert_int_equal(test_json_sum(status, "crc_errors"), 0);
        json_decref(status);

        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        tier_client_free(c);
}

/* ---- async forms and fences ---------------------------------------------------------------- */

static void test_async_fences(void **state) {
        enum { N = 6 };
        tier_client *c = connect_job("fences");
        tier_tensor *t[N];
        tier_fence f[N];
        struct tier_grant g;
        char name[32];

        for (unsigned i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "a%u", i);
                assert_int_equal(tier_tensor_create(c, name, 4 * MiB, &t[i]), 0);
                fill(t[i], 100 + i, TIER_HOST);
        }
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_evict_async(t[i], TIER_NVME, &f[i]), 0);
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_fence_wait(c, f[i], 10000), 0);
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_prefetch_async(t[i], TIER_HOST, &f[i]), 0);
        for (unsigned i = N; i-- > 0;)
                assert_int_equal(tier_fence_wait(c, f[i], 10000), 0);
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_fence_done(c, f[i]), 1);
        for (unsigned i = 0; i < N; i++)
                verify(t[i], 100 + i, TIER_HOST);

        /* async pin: the grant comes at once, the bytes after the fence */
        assert_int_equal(tier_evict(t[0], TIER_NVME), 0);
        assert_int_equal(tier_pin_async(t[0], TIER_VRAM, TIER_READ_WRITE, &g, &f[0]), 0);
        assert_int_equal(tier_fence_wait(c, f[0], 10000), 0);
        for (uint64_t i = 0; i < g.length; i += 4093)
                assert_int_equal(((uint8_t *) g.ptr)[i], pattern(100, i));
        assert_int_equal(tier_unpin(t[0], TIER_VRAM, 0), 0);

        /*
         * A fence belongs to the client that handed it out: another client of the
         * same job, with fences of the same numbers of its own, refuses it, and so
         * does the client itself for the number without its tag.
         */
        {
                tier_client *other = connect_job("fences");
                tier_tensor *o;
                tier_fence mine;

                assert_int_equal(tier_tensor_open(other, "a1", &o), 0);
                for (unsigned i = 0; i < 2 * N + 1; i++) {
                        /* moves that must each do something, so that each has a fence */
                        if (i % 2 == 0)
                                assert_int_equal(tier_prefetch_async(o, TIER_HOST, &mine), 0);
                        else
                                assert_int_equal(tier_evict_async(o, TIER_NVME, &mine), 0);
                        assert_int_equal(tier_fence_wait(other, mine, 10000), 0);
                }
                assert_true(mine != 0);
                assert_int_equal(tier_fence_done(other, f[1]), -EINVAL);
                assert_int_equal(tier_fence_wait(other, f[1], 0), -EINVAL);
                assert_non_null(strstr(tier_client_last_error(other), "not handed out by this client"));
                assert_int_equal(tier_fence_done(c, mine), -EINVAL);
                assert_int_equal(tier_fence_done(c, f[1] & UINT64_C(0xffffffffffff)), -EINVAL);
                assert_int_equal(tier_fence_done(c, f[1]), 1);
                assert_int_equal(tier_fence_done(other, mine), 1);
                assert_int_equal(tier_fence_done(other, 0), 1);
                tier_tensor_close(o);
                tier_client_free(other);
        }

        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        tier_client_free(c);
}

/* ---- two jobs are isolated ----------------------------------------------------------------- */

static void test_jobs_isolated(void **state) {
        tier_client *a = connect_job("job-a"), *b = connect_job("job-b");
        tier_tensor *ta, *tb, *tx = NULL;
        struct tier_grant ga, gb;

        assert_int_equal(tier_tensor_create(a, "secret", 1 * MiB, &ta), 0);
        assert_int_equal(tier_pin(ta, TIER_HOST, TIER_READ_WRITE, &ga), 0);
        memset(ga.ptr, 0xab, ga.length);

        /* b cannot name a's tensor */
        assert_int_equal(tier_tensor_open(b, "secret", &tx), -ENOENT);
        assert_null(tx);
        /* b's memory is its own segment, and fresh memory reads as zeros */
        assert_int_equal(tier_tensor_create(b, "secret", 1 * MiB, &tb), 0);
        assert_int_equal(tier_pin(tb, TIER_HOST, TIER_READ_WRITE, &gb), 0);
        assert_int_not_equal(ga.segment, gb.segment);
        assert_ptr_not_equal(ga.ptr, gb.ptr);
        for (uint64_t i = 0; i < gb.length; i++)
                assert_int_equal(((uint8_t *) gb.ptr)[i], 0);
        assert_int_equal(tier_unpin(tb, TIER_HOST, 0), 0);
        assert_int_equal(tier_unpin(ta, TIER_HOST, 1), 0);

        assert_int_equal(tier_tensor_destroy(ta), 0);
        assert_int_equal(tier_tensor_destroy(tb), 0);
        tier_client_free(a);
        tier_client_free(b);
}

/* ---- another uid may not join a job (root only: the child changes its uid) ------------------ */

static void test_other_uid_refused(void **state) {
        tier_client *a;
        tier_tensor *t;
        pid_t pid;
        int st;

        if (geteuid() != 0) {
                printf("joining a job as another uid needs root (setresuid): skipped\n");
                skip();
        }
        a = connect_job("job-owned");
        assert_int_equal(tier_tensor_create(a, "secret", 1 * MiB, &t), 0);

        assert_int_equal(chmod(daemon_.dir, 0711), 0);
        assert_int_equal(chmod(daemon_.socket, 0666), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                tier_client *x = NULL;
                int r;

                if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
                        _exit(3);
                r = tier_client_new(daemon_.socket, "job-owned", 1, &x);
                if (r == -EACCES && strstr(tier_client_last_error(x), "belongs to uid 0: uid 65534 (pid "))
                        _exit(0);
                fprintf(stderr, "other uid joining job-owned: %d %s\n", r, tier_client_last_error(x));
                _exit(1);
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        {
                char needle[96];

                /* the denial is in tierd's log with the peer's uid and pid */
                snprintf(needle, sizeof(needle), "Denied: uid 65534 (pid %d) may not attach to job 'job-owned'",
                         (int) pid);
                test_daemon_collect(&daemon_, 200);
                assert_true(test_daemon_log_contains(&daemon_, needle));
        }

        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(a);
}

/* ---- a SIGKILLed client leaves no pins -------------------------------------------------------- */

static void test_sigkill_releases_pins(void **state) {
        int ready[2];
        pid_t pid;
        char c;
        json_t *status;
        unsigned long long pinned = 1;

        assert_int_equal(pipe(ready), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                tier_client *cl = NULL;
                tier_tensor *t[6];
                struct tier_grant g;
                tier_fence f;
                char name[16];

                close(ready[0]);
                if (tier_client_new(daemon_.socket, "victim", 0, &cl) < 0)
                        _exit(1);
                for (int i = 0; i < 6; i++) {
                        snprintf(name, sizeof(name), "k%d", i);
                        if (tier_tensor_create(cl, name, 4 * MiB, &t[i]) < 0)
                                _exit(2);
                }
                if (tier_pin(t[0], TIER_HOST, TIER_READ_WRITE, &g) < 0 || tier_pin(t[1], TIER_HOST, TIER_READ_WRITE, &g) < 0 ||
                    tier_pin(t[2], TIER_VRAM, TIER_READ_WRITE, &g) < 0)
                        _exit(3);
                memset(g.ptr, 1, g.length);
                /* prefetches in flight when the axe falls */
                for (int i = 3; i < 6; i++)
                        if (tier_prefetch_async(t[i], TIER_VRAM, &f) < 0 && i < 4)
                                _exit(4);
                if (write(ready[1], "x", 1) != 1)
                        _exit(5);
                pause();
                _exit(0);
        }
        close(ready[1]);
        assert_int_equal(read(ready[0], &c, 1), 1);
        close(ready[0]);

        status = test_daemon_status(&daemon_);
        assert_non_null(status);
        assert_true(test_json_sum(status, "pinned") > 0);
        assert_true(test_json_job_tier(status, "victim", "host", "pinned") > 0);
        assert_true(test_json_job_tier(status, "victim", "vram", "pinned") > 0);
        json_decref(status);

        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(waitpid(pid, NULL, 0), pid);

        for (int i = 0; i < 100 && pinned > 0; i++) {
                usleep(50000);
                status = test_daemon_status(&daemon_);
                assert_non_null(status);
                pinned = test_json_sum(status, "pinned");
                if (pinned == 0) {
                        /* the job lingers with its tensors, no connection */
                        json_t *victim = test_json_job(status, "victim");

                        assert_non_null(victim);
                        assert_int_equal(json_integer_value(json_object_get(victim, "connections")), 0);
                        assert_int_equal(json_integer_value(json_object_get(victim, "tensors")), 6);
                }
                json_decref(status);
        }
        assert_int_equal(pinned, 0);
}

/* ---- malformed input never hurts other clients ------------------------------------------------ */

static int raw_connect(void) {
        int fd = test_raw_connect(daemon_.socket);

        assert_true(fd >= 0);
        return fd;
}

/* Receive one reply: its response status, or 1 for "connection closed". */
static int raw_status(int fd) {
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len, n_fds;
        Tier__Reply *rep;
        int r;

        r = wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds);
        if (r == -ECONNRESET)
                return 1;
        assert_int_equal(r, 0);
        wire_close_fds(fds, n_fds);
        rep = tier__reply__unpack(NULL, len, buf);
        assert_non_null(rep);
        assert_int_equal(rep->kind_case, TIER__REPLY__KIND_RESPONSE);
        r = rep->response->status;
        tier__reply__free_unpacked(rep, NULL);
        return r;
}

static void raw_send_request(int fd, Tier__Request *req) {
        size_t len = tier__request__get_packed_size(req);
        uint8_t *buf = malloc(len);

        assert_non_null(buf);
        tier__request__pack(req, buf);
        assert_int_equal(wire_send(fd, buf, len, NULL, 0), 0);
        free(buf);
}

static void raw_hello(int fd, uint32_t version) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;

        h.version = version;
        h.job = (char *) "raw";
        req.seq = 1;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        raw_send_request(fd, &req);
}

static void test_bad_input(void **state) {
        tier_client *good = connect_job("bystander");
        tier_tensor *t;
        struct tier_grant g;
        int fd, r;

        assert_int_equal(tier_tensor_create(good, "x", 1 * MiB, &t), 0);
        fill(t, 7, TIER_HOST);

        /* garbage instead of protobuf: error reply, then closed */
        fd = raw_connect();
        assert_int_equal(wire_send(fd, "\xff\xff\xff\xff\x0f garbage", 14, NULL, 0), 0);
        r = raw_status(fd);
        assert_true(r == -EBADMSG || r == 1);
        assert_int_equal(raw_status(fd), 1);
        close(fd);

        /* unknown protocol version: a clear error */
        fd = raw_connect();
        raw_hello(fd, 99);
        assert_int_equal(raw_status(fd), -EPROTONOSUPPORT);
        assert_int_equal(raw_status(fd), 1);
        close(fd);

        /* a request before Hello */
        fd = raw_connect();
        {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__Stat s = TIER__STAT__INIT;

                s.tensor = 1;
                req.seq = 5;
                req.op_case = TIER__REQUEST__OP_STAT;
                req.stat = &s;
                raw_send_request(fd, &req);
        }
        assert_int_equal(raw_status(fd), -EPROTO);
        close(fd);

        /* an oversize packet (the limit is 64 KiB), with fds attached for good measure */
        fd = raw_connect();
        {
                size_t big = 200 * 1024;
                uint8_t *buf = calloc(1, big);
                int pass[2] = { 0, 1 };

                assert_non_null(buf);
                r = wire_send(fd, buf, big, pass, 2);
                free(buf);
                if (r == 0)
                        assert_int_equal(raw_status(fd) <= 1, 1);
        }
        close(fd);

        /* a valid hello, then nonsense ids and tiers get error replies, the connection survives */
        fd = raw_connect();
        raw_hello(fd, TIER_PROTOCOL_VERSION);
        assert_int_equal(raw_status(fd), 0);
        {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__Pin p = TIER__PIN__INIT;

                p.tensor = 0xdeadbeef12345ull;
                p.tier = TIER__TIER__TIER_HOST;
                req.seq = 2;
                req.op_case = TIER__REQUEST__OP_PIN;
                req.pin = &p;
                raw_send_request(fd, &req);
                assert_int_equal(raw_status(fd), -ENOENT);
                p.tier = (Tier__Tier) 17;
                req.seq = 3;
                raw_send_request(fd, &req);
                assert_int_equal(raw_status(fd), -ENOENT);
        }
        close(fd);

        /* the bystander never noticed */
        verify(t, 7, TIER_HOST);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        assert_int_equal(kill(daemon_.pid, 0), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(good);
}

/* ---- every limit answers with a status that names it ----------------------------------------------- */

/*
 * A fork()'s child shares the parent's connection, which tierd cannot tell
 * apart: every call of the child refuses with -EBADF, sending nothing, and
 * tier_tensor_close() and tier_client_free() there only let go of the
 * child's copies.  The parent waits for the child before it looks: its pin,
 * its tensor and its connection are as they were.
 */
static void test_fork_child_refused(void **state) {
        tier_client *c = connect_job("forked");
        tier_tensor *t = NULL;
        struct tier_grant g;
        int status;
        pid_t pid;

        assert_int_equal(tier_tensor_create(c, "x", 1 * MiB, &t), 0);
        fill(t, 9, TIER_HOST);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);

        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                struct tier_grant g2;
                tier_fence f = 0;
                int bad = 0;

                /* no cmocka here: the result is the exit status, each bit a call that was not refused */
                bad |= (tier_pin(t, TIER_HOST, TIER_READ, &g2) != -EBADF) << 0;
                bad |= (tier_unpin(t, TIER_HOST, 0) != -EBADF) << 1;
                bad |= (tier_evict_async(t, TIER_NVME, &f) != -EBADF) << 2;
                bad |= (tier_tensor_destroy(t) != -EBADF) << 3;
                bad |= (tier_fence_done(c, 0) != -EBADF) << 4;
                bad |= (strstr(tier_client_last_error(c), "fork()") == NULL) << 5;
                bad |= (tier_client_fd(c) != -EBADF) << 6;
                t = tier_tensor_close(t);
                c = tier_client_free(c);
                _exit(bad);
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);

        /* the parent's pin is still there (the child's unpin never reached tierd), and the data */
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        verify(t, 9, TIER_HOST);
        assert_true(tier_client_fd(c) >= 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

static void test_limits_and_errors(void **state) {
        tier_client *c = connect_job("limits");
        tier_tensor *t, *u, *p[4];
        struct tier_grant g;
        char longname[400];
        int r;

        memset(longname, 'n', sizeof(longname) - 1);
        longname[sizeof(longname) - 1] = 0;
        assert_int_equal(tier_tensor_create(c, longname, 10, &t), -ENAMETOOLONG);
        /* a job name longer than max_name is that error in every call that names a job, not "no such job" */
        {
                struct tier_tensor_info *info = NULL;
                struct tier_evict_result er;
                struct tier_detach_result dr;
                size_t n = 0;

                assert_int_equal(tier_job_tensors(c, longname, &info, &n), -ENAMETOOLONG);
                assert_non_null(strstr(tier_client_last_error(c), "longer than max_name (255 bytes)"));
                assert_null(info);
                assert_int_equal(tier_job_evict(c, longname, TIER_NVME, &er), -ENAMETOOLONG);
                assert_int_equal(tier_job_detach(c, longname, &dr), -ENAMETOOLONG);
        }
        /* larger than a segment is fine; larger than the job may ever hold in host or vram is not */
        assert_int_equal(tier_tensor_create(c, "big", 64 * MiB, &t), -EFBIG);
        assert_non_null(strstr(tier_client_last_error(c), "can never be held for job 'limits'"));
        assert_int_equal(tier_tensor_create(c, "zero", 0, &t), -EINVAL);

        assert_int_equal(tier_tensor_create(c, "t", 1 * MiB, &t), 0);
        assert_int_equal(tier_tensor_create(c, "t", 1 * MiB, &u), -EEXIST);
        assert_int_equal(tier_pin(t, TIER_NVME, TIER_READ_WRITE, &g), -EINVAL);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), -ENOENT);
        /* NVMe is never pinned: an unpin there is a wrong argument (tier_pin(3)), not "no such pin" */
        assert_int_equal(tier_unpin(t, TIER_NVME, 0), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(c), "not nvme"));
        assert_int_equal(tier_unpin(t, 7, 0), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(c), "not a tier"));
        assert_int_equal(tier_evict(t, TIER_VRAM), -EINVAL);

        /* a fresh tensor reads as zeros */
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < g.length; i++)
                assert_int_equal(((uint8_t *) g.ptr)[i], 0);
        assert_int_equal(tier_tensor_destroy(t), -EBUSY);
        assert_int_equal(tier_evict(t, TIER_NVME), -EBUSY);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);

        /*
         * three 10 MiB tensors in a 32 MiB limit of two 16 MiB segments: 30 MiB fit the limit, but not
         * the segments (10 + 10 leaves 6 + 6): a clear -ENOSPC that says so, no hang
         */
        for (int i = 0; i < 3; i++) {
                char name[8];

                snprintf(name, sizeof(name), "p%d", i);
                assert_int_equal(tier_tensor_create(c, name, 10 * MiB, &p[i]), 0);
        }
        assert_int_equal(tier_pin(p[0], TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_pin(p[1], TIER_HOST, TIER_READ_WRITE, &g), 0);
        r = tier_pin(p[2], TIER_HOST, TIER_READ_WRITE, &g);
        assert_int_equal(r, -ENOSPC);
        assert_non_null(strstr(tier_client_last_error(c), "the space is fragmented"));
        assert_non_null(strstr(tier_client_last_error(c), "its longest free run is 6.0 MiB"));
        for (int i = 0; i < 2; i++)
                assert_int_equal(tier_unpin(p[i], TIER_HOST, 0), 0);
        /* once unpinned, the same pin succeeds (an unpinned tensor makes room) */
        assert_int_equal(tier_pin(p[2], TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(p[2], TIER_HOST, 0), 0);
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_tensor_destroy(p[i]), 0);

        /* pins per connection are bounded (twice max_tensors = 128 here) */
        {
                int k, last = 0;

                for (k = 0; k < 200; k++) {
                        last = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);
                        if (last < 0)
                                break;
                }
                assert_int_equal(k, 128);
                assert_int_equal(last, -EMFILE);
                assert_non_null(strstr(tier_client_last_error(c), "too many pins"));
                for (int i = 0; i < k; i++)
                        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        }
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

/* ---- every fd tierd holds is close-on-exec ------------------------------------------------ */

static void test_fds_cloexec(void **state) {
        tier_client *c = connect_job("fds");
        tier_tensor *t;
        struct tier_grant g;
        char path[64], line[256];
        unsigned checked = 0;
        DIR *d;
        struct dirent *de;

        /* some of everything: a segment, a transfer, the fence page, a status memfd */
        assert_int_equal(tier_tensor_create(c, "x", 1 * MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_VRAM, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t, TIER_VRAM, 1), 0);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);

        snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int) daemon_.pid);
        d = opendir(path);
        assert_non_null(d);
        while ((de = readdir(d))) {
                char fi[400];
                FILE *f;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(fi, sizeof(fi), "%s/%s", path, de->d_name);
                f = fopen(fi, "re");
                if (!f)
                        continue;
                while (fgets(line, sizeof(line), f))
                        if (strncmp(line, "flags:", 6) == 0) {
                                unsigned long flags = strtoul(line + 6, NULL, 8);
                                int fd = atoi(de->d_name);

                                /* 0, 1, 2 are inherited stdio: everything else is ours */
                                if (fd > 2 && !(flags & 02000000)) {
                                        fprintf(stderr, "tierd fd %d lacks O_CLOEXEC (flags %lo)\n", fd, flags);
                                        fail();
                                }
                                checked++;
                        }
                fclose(f);
        }
        closedir(d);
        assert_true(checked > 8);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fds_cloexec),
                cmocka_unit_test(test_integrity_striped),
                cmocka_unit_test(test_async_fences),
                cmocka_unit_test(test_jobs_isolated),
                cmocka_unit_test(test_other_uid_refused),
                cmocka_unit_test(test_sigkill_releases_pins),
                cmocka_unit_test(test_bad_input),
                cmocka_unit_test(test_limits_and_errors),
                cmocka_unit_test(test_fork_child_refused),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests_name("integration", tests, setup, teardown);
}
