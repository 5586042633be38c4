/* SPDX-License-Identifier: MIT */
/* test-wakeup.c: a client's wakeup fd (HelloReply.fence_eventfd) cannot stop tierd, whatever the client does with it. */

/*
 * tierd wakes a client that sleeps on a fence or a plan phase by writing a
 * token to the connection's wakeup fd.  That write happens on tierd's only
 * event loop: if it ever blocked, every job would stop.  The fd was an
 * eventfd, whose one open file description the client shared: the client
 * could clear O_NONBLOCK and fill the counter, and tierd's next write
 * blocked for good.  It is now a pipe: the client has the read end (no
 * write to it, no flag on tierd's write end), and tierd writes a token only
 * while none is unread, so a client that never reads cannot fill it either.
 *
 * The hostile clients are raw connections (they keep the fds libtier would
 * hide); the bystander is libtier.  alarm() is only a safety net that turns
 * a stopped tierd into a failure (and kills it): the tests order their
 * steps through the fence page, never through time.
 */

#include <errno.h>
#include <fcntl.h>
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
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "proto/fence.h"
#include "proto/wire.h"
#include "tests/helpers/harness.h"
#include "tier.pb-c.h"

/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (32u << 20)
/* Seconds before the safety net fires: far more than any of these tests takes. */
#define SAFETY_NET_S 120
/* Wakeups a client leaves unread: more 8-byte tokens than a pipe's default 64 KiB holds. */
#define UNREAD_WAKEUPS (65536 / 8 + 512)
/* Pins in flight per batch of the loop above (each followed by its unpin). */
#define BATCH 32

static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 0\n"
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 4M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n"
        "extent_size = 1M\n";

static TestDaemon daemon_;

/* A raw client: its socket and what its Hello gave it. */
typedef struct Raw {
        int fd;
        uint64_t seq;
        const FencePage *page;
        unsigned slot;
        int wake;               /* HelloReply.fence_eventfd: the wakeup fd */
} Raw;

/*
 * SIGALRM: tierd stopped serving.  Kill it (its log printed), remove its
 * directory, fail.  Not async-signal-safe, but it fires while this test waits
 * in a system call (tierd not answering), and the process ends right after.
 */
static void safety_net(int sig) {
        static const char msg[] = "tierd stopped serving (its loop blocked): killing it\n";

        (void) sig;
        (void) !write(STDERR_FILENO, msg, sizeof(msg) - 1);
        test_daemon_cleanup(&daemon_);
        _exit(1);
}

static void send_request(Raw *r, Tier__Request *req) {
        size_t len;
        uint8_t *buf;

        req->seq = ++r->seq;
        len = tier__request__get_packed_size(req);
        buf = malloc(len + 1);
        assert_non_null(buf);
        tier__request__pack(req, buf);
        assert_int_equal(wire_send(r->fd, buf, len, NULL, 0), 0);
        free(buf);
}

/* The next Response on @r (events skipped); its fds into @fds (NULL: closed).  Free with tier__reply__free_unpacked. */
static Tier__Reply *next_response(Raw *r, int *fds, size_t *n_fds) {
        static uint8_t buf[65536];

        for (;;) {
                int got[WIRE_MAX_FDS];
                size_t len = 0, n = 0;
                Tier__Reply *rep;

                assert_int_equal(wire_recv(r->fd, buf, sizeof(buf), &len, got, &n), 0);
                rep = tier__reply__unpack(NULL, len, buf);
                assert_non_null(rep);
                if (rep->kind_case == TIER__REPLY__KIND_RESPONSE) {
                        if (fds) {
                                memcpy(fds, got, n * sizeof(int));
                                *n_fds = n;
                        } else
                                wire_close_fds(got, n);
                        return rep;
                }
                wire_close_fds(got, n);
                tier__reply__free_unpacked(rep, NULL);
        }
}

/* Send @req, return its Response's status (and, for a pin, its fence in @fence). */
static int call(Raw *r, Tier__Request *req, uint64_t *fence) {
        Tier__Reply *rep;
        int status;

        send_request(r, req);
        rep = next_response(r, NULL, NULL);
        status = rep->response->status;
        if (fence)
                *fence = rep->response->result_case == TIER__RESPONSE__RESULT_PIN ? rep->response->pin->fence : 0;
        tier__reply__free_unpacked(rep, NULL);
        return status;
}

/* Connect as job @job: the socket, the fence page mapped, the wakeup fd kept. */
static void raw_hello(Raw *r, const char *job) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;
        Tier__HelloReply *hr;
        Tier__Reply *rep;
        int fds[WIRE_MAX_FDS];
        size_t n_fds = 0;
        void *page;

        *r = (Raw) { .fd = test_raw_connect(daemon_.socket), .wake = -1 };
        assert_true(r->fd >= 0);
        h.version = TIER_PROTOCOL_VERSION;
        h.job = (char *) job;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        send_request(r, &req);
        rep = next_response(r, fds, &n_fds);
        assert_int_equal(rep->response->status, 0);
        assert_int_equal(rep->response->result_case, TIER__RESPONSE__RESULT_HELLO);
        hr = rep->response->hello;
        assert_true(hr->fence_page_fd >= 0 && (size_t) hr->fence_page_fd < n_fds);
        assert_true(hr->fence_eventfd >= 0 && (size_t) hr->fence_eventfd < n_fds);
        page = mmap(NULL, sizeof(FencePage), PROT_READ, MAP_SHARED, fds[hr->fence_page_fd], 0);
        assert_true(page != MAP_FAILED);
        r->page = page;
        r->slot = hr->fence_slot;
        r->wake = fds[hr->fence_eventfd];
        fds[hr->fence_eventfd] = -1;
        for (size_t i = 0; i < n_fds; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
        tier__reply__free_unpacked(rep, NULL);
}

static void raw_close(Raw *r) {
        munmap((void *) r->page, sizeof(FencePage));
        close(r->wake);
        close(r->fd);
}

static uint64_t raw_create(Raw *r, const char *name, uint64_t size) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Create cr = TIER__CREATE__INIT;
        Tier__Reply *rep;
        uint64_t id;

        cr.name = (char *) name;
        cr.size = size;
        req.op_case = TIER__REQUEST__OP_CREATE;
        req.create = &cr;
        send_request(r, &req);
        rep = next_response(r, NULL, NULL);
        assert_int_equal(rep->response->status, 0);
        assert_int_equal(rep->response->result_case, TIER__RESPONSE__RESULT_TENSOR);
        id = rep->response->tensor->tensor;
        tier__reply__free_unpacked(rep, NULL);
        return id;
}

static void pin_request(Tier__Request *req, Tier__Pin *pin, uint64_t id, bool async) {
        tier__request__init(req);
        tier__pin__init(pin);
        pin->tensor = id;
        pin->tier = TIER__TIER__TIER_HOST;
        pin->async = async;
        pin->mode = 1;          /* PIN_READ */
        req->op_case = TIER__REQUEST__OP_PIN;
        req->pin = pin;
}

static void unpin_request(Tier__Request *req, Tier__Unpin *un, uint64_t id) {
        tier__request__init(req);
        tier__unpin__init(un);
        un->tensor = id;
        un->tier = TIER__TIER__TIER_HOST;
        req->op_case = TIER__REQUEST__OP_UNPIN;
        req->unpin = un;
}

/*
 * Wait until fence @fence of @r is done in the fence page.  tierd stores the
 * watermark, then writes the wakeup fd, in one step of its loop: once this
 * returns, tierd's write of that wakeup has begun (and, had it blocked, every
 * request of any client after this point would wait forever).
 */
static void wait_done(const Raw *r, uint64_t fence) {
        while (__atomic_load_n(&r->page->done[r->slot], __ATOMIC_ACQUIRE) < fence)
                usleep(1000);
}

/* The bystander, a libtier client of another job: a pin, and a fence it waits for on its own wakeup fd. */
static void bystander_served(void) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        tier_fence f;

        assert_int_equal(tier_client_new(daemon_.socket, "bystander", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "b", 1 << 20, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x5a, 1 << 20);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_evict_async(t, TIER_NVME, &f), 0);
        assert_int_equal(tier_fence_wait(c, f, -1), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

/*
 * A client clears O_NONBLOCK on its wakeup fd and writes 0xfffffffffffffffe
 * to it, then has a fence complete.  Before, the fd was an eventfd sharing
 * tierd's file description: the write filled the counter, tierd's write of
 * the wakeup then blocked its loop and the bystander was never served
 * (the safety net fired).  Now the fd is a pipe's read end: the write fails
 * with EBADF, and tierd goes on.
 */
static void test_hostile_wakeup_fd(void **state) {
        uint64_t huge = 0xfffffffffffffffeull, id, fence = 0;
        Tier__Request req;
        Tier__Pin pin;
        Raw r;
        ssize_t w;
        int e, flags;

        raw_hello(&r, "hostile");
        id = raw_create(&r, "t", 4096);
        pin_request(&req, &pin, id, false);
        assert_int_equal(call(&r, &req, NULL), 0);     /* resident in host from now on */

        flags = fcntl(r.wake, F_GETFL);
        assert_true(flags >= 0);
        assert_int_equal(fcntl(r.wake, F_SETFL, flags & ~O_NONBLOCK), 0);
        w = write(r.wake, &huge, sizeof(huge));
        e = errno;

        alarm(SAFETY_NET_S);
        pin_request(&req, &pin, id, true);
        assert_int_equal(call(&r, &req, &fence), 0);
        assert_true(fence > 0);
        wait_done(&r, fence);           /* tierd has written (or is stuck writing) the wakeup */
        bystander_served();
        alarm(0);

        assert_int_equal(w, -1);        /* the client cannot write to its wakeup fd at all */
        assert_int_equal(e, EBADF);
        raw_close(&r);
}

/*
 * A client that never reads its wakeup fd, through more wakeups than a pipe
 * holds tokens: tierd never blocks (its write end is its own, non-blocking)
 * and leaves one token unread at most, so an old libtier, which reads 8 bytes
 * per wakeup, empties it in one read.  The next wakeup still comes.
 */
static void test_wakeup_never_read(void **state) {
        uint64_t id, fence = 0, token;
        Tier__Request req;
        Tier__Pin pin;
        Tier__Unpin un;
        struct pollfd p;
        int unread = -1;
        Raw r;

        raw_hello(&r, "quiet");
        id = raw_create(&r, "t", 4096);
        pin_request(&req, &pin, id, false);
        assert_int_equal(call(&r, &req, NULL), 0);     /* held: the async pins below find it resident */

        alarm(SAFETY_NET_S);
        for (unsigned done = 0; done < UNREAD_WAKEUPS; done += BATCH) {
                for (unsigned i = 0; i < BATCH; i++) {
                        pin_request(&req, &pin, id, true);
                        send_request(&r, &req);
                        unpin_request(&req, &un, id);
                        send_request(&r, &req);
                }
                for (unsigned i = 0; i < 2 * BATCH; i++) {
                        Tier__Reply *rep = next_response(&r, NULL, NULL);

                        assert_int_equal(rep->response->status, 0);
                        if (rep->response->result_case == TIER__RESPONSE__RESULT_PIN)
                                fence = rep->response->pin->fence;
                        tier__reply__free_unpacked(rep, NULL);
                }
        }
        assert_true(fence >= UNREAD_WAKEUPS);
        wait_done(&r, fence);
        bystander_served();

        /* one token waits, whatever the number of wakeups: one 8-byte read empties the pipe */
        p = (struct pollfd) { .fd = r.wake, .events = POLLIN };
        assert_int_equal(poll(&p, 1, -1), 1);
        assert_int_equal(ioctl(r.wake, FIONREAD, &unread), 0);
        assert_int_equal(unread, (int) sizeof(token));
        assert_int_equal(read(r.wake, &token, sizeof(token)), (ssize_t) sizeof(token));
        assert_int_equal(read(r.wake, &token, sizeof(token)), -1);
        assert_int_equal(errno, EAGAIN);

        /* and the next wakeup comes (tierd checked for an unread token, found none) */
        pin_request(&req, &pin, id, true);
        assert_int_equal(call(&r, &req, &fence), 0);
        assert_int_equal(poll(&p, 1, -1), 1);
        assert_int_equal(read(r.wake, &token, sizeof(token)), (ssize_t) sizeof(token));
        wait_done(&r, fence);
        alarm(0);
        raw_close(&r);
}

static int setup(void **state) {
        return test_daemon_start(&daemon_, CONFIG) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        alarm(0);               /* a test that failed an assertion left it set */
        return test_daemon_stop(&daemon_) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_hostile_wakeup_fd),
                cmocka_unit_test(test_wakeup_never_read),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        signal(SIGALRM, safety_net);
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests_name("wakeup", tests, setup, teardown);
}
