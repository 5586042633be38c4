/* SPDX-License-Identifier: MIT */
/* test-wire.c: SOCK_SEQPACKET framing and fd passing over a socketpair. */

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <cmocka.h>

#include "proto/macro.h"
#include "proto/pbcheck.h"
#include "proto/tier.pb-c.h"
#include "proto/utf8.h"
#include "proto/wire.h"

/* The two ends of a connection: a is the "client", b the "daemon". */
typedef struct Pair {
        int fd[2];
} Pair;

static Pair pair = { { -1, -1 } };

static int pair_open(void **state, int flags) {
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | flags, 0, pair.fd) < 0)
                return -1;
        *state = &pair;
        return 0;
}

static int pair_setup(void **state) {
        return pair_open(state, 0);
}

static int pair_setup_nonblock(void **state) {
        return pair_open(state, SOCK_NONBLOCK);
}

static int pair_teardown(void **state) {
        Pair *p = *state;

        p->fd[0] = safe_close(p->fd[0]);
        p->fd[1] = safe_close(p->fd[1]);
        return 0;
}

/* Open fds of this process, not counting the one used to count. */
static int count_fds(void) {
        DIR *d = opendir("/proc/self/fd");
        struct dirent *de;
        int n = 0;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n - 1;
}

static int make_memfd(const char *content) {
        int fd = memfd_create("test-wire", MFD_CLOEXEC);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, content, strlen(content)), (ssize_t) strlen(content));
        return fd;
}

/* Send @n_fds copies of @fd with a raw sendmsg(), bypassing wire_send()'s limit. */
static void raw_send_fds(int sock, const void *buf, size_t len, int fd, size_t n_fds) {
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * 64)];
        } control;
        int fds[64];
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = CMSG_SPACE(sizeof(int) * n_fds),
        };
        struct cmsghdr *cmsg;

        assert_true(n_fds <= ELEMENTSOF(fds));
        memset(&control, 0, sizeof(control));
        for (size_t i = 0; i < n_fds; i++)
                fds[i] = fd;
        cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * n_fds);
        assert_int_equal(sendmsg(sock, &msg, MSG_NOSIGNAL), (ssize_t) len);
}

static void test_roundtrip(void **state) {
        Pair *p = *state;
        char buf[256];
        int fds[WIRE_MAX_FDS];
        size_t len = 99, n_fds = 99;

        assert_int_equal(wire_send(p->fd[0], "hello", 5, NULL, 0), 0);
        assert_int_equal(wire_send(p->fd[0], "world!", 6, NULL, 0), 0);

        /* Packet boundaries are kept. */
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), 0);
        assert_int_equal(len, 5);
        assert_int_equal(n_fds, 0);
        assert_memory_equal(buf, "hello", 5);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), 0);
        assert_int_equal(len, 6);
        assert_memory_equal(buf, "world!", 6);

        /* Other direction, exact fit, NULL fd outputs. */
        assert_int_equal(wire_send(p->fd[1], "xyz", 3, NULL, 0), 0);
        assert_int_equal(wire_recv(p->fd[0], buf, 3, &len, NULL, NULL), 0);
        assert_int_equal(len, 3);
        assert_memory_equal(buf, "xyz", 3);
}

static void test_large_payload(void **state) {
        Pair *p = *state;
        const size_t n = 64 * 1024;
        _cleanup_free_ unsigned char *out = malloc(n), *in = malloc(n);
        size_t len;

        assert_non_null(out);
        assert_non_null(in);
        for (size_t i = 0; i < n; i++)
                out[i] = (unsigned char) (i * 7);

        assert_int_equal(wire_send(p->fd[0], out, n, NULL, 0), 0);
        assert_int_equal(wire_recv(p->fd[1], in, n, &len, NULL, NULL), 0);
        assert_int_equal(len, n);
        assert_memory_equal(in, out, n);
}

static void test_invalid_send(void **state) {
        Pair *p = *state;
        int fds[WIRE_MAX_FDS + 1];

        for (size_t i = 0; i < ELEMENTSOF(fds); i++)
                fds[i] = STDIN_FILENO;
        assert_int_equal(wire_send(p->fd[0], "x", 1, fds, WIRE_MAX_FDS + 1), -EINVAL);
        assert_int_equal(wire_send(p->fd[0], "", 0, NULL, 0), -EINVAL);
        assert_int_equal(wire_send(-1, "x", 1, NULL, 0), -EBADF);
}

static void test_pass_fds(void **state) {
        Pair *p = *state;
        int out[WIRE_MAX_FDS], in[WIRE_MAX_FDS];
        char buf[64], content[32];
        size_t len, n_fds;

        for (size_t i = 0; i < WIRE_MAX_FDS; i++) {
                snprintf(content, sizeof(content), "memfd %zu", i);
                out[i] = make_memfd(content);
        }

        /* One fd, then the maximum. */
        assert_int_equal(wire_send(p->fd[0], "one", 3, out, 1), 0);
        assert_int_equal(wire_send(p->fd[0], "all", 3, out, WIRE_MAX_FDS), 0);
        /* The sender keeps its fds. */
        assert_true(fcntl(out[0], F_GETFD) >= 0);

        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, in, &n_fds), 0);
        assert_int_equal(len, 3);
        assert_int_equal(n_fds, 1);
        assert_int_equal(pread(in[0], content, sizeof(content), 0), 7);
        assert_memory_equal(content, "memfd 0", 7);
        assert_true(fcntl(in[0], F_GETFD) & FD_CLOEXEC);
        wire_close_fds(in, n_fds);
        assert_int_equal(in[0], -1);

        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, in, &n_fds), 0);
        assert_int_equal(n_fds, WIRE_MAX_FDS);
        for (size_t i = 0; i < n_fds; i++) {
                char want[32];
                ssize_t k;

                snprintf(want, sizeof(want), "memfd %zu", i);
                k = pread(in[i], content, sizeof(content), 0);
                assert_int_equal(k, (ssize_t) strlen(want));
                assert_memory_equal(content, want, strlen(want));
                assert_true(fcntl(in[i], F_GETFD) & FD_CLOEXEC);
                /* A new descriptor for the same file. */
                assert_int_not_equal(in[i], out[i]);
        }
        wire_close_fds(in, n_fds);
        wire_close_fds(out, WIRE_MAX_FDS);
}

/* A packet larger than the buffer is an error, consumed whole, and its fds are closed. */
static void test_oversize(void **state) {
        Pair *p = *state;
        char big[100], buf[10];
        int fds[WIRE_MAX_FDS], memfd[2];
        size_t len = 99, n_fds = 99;
        int before;

        memset(big, 'x', sizeof(big));
        memfd[0] = make_memfd("a");
        memfd[1] = make_memfd("b");
        before = count_fds();

        assert_int_equal(wire_send(p->fd[0], big, sizeof(big), memfd, 2), 0);
        assert_int_equal(wire_send(p->fd[0], "next", 4, NULL, 0), 0);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EMSGSIZE);
        assert_int_equal(len, 0);
        assert_int_equal(n_fds, 0);
        assert_int_equal(count_fds(), before);

        /* The oversized packet is gone; the next one is intact. */
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), 0);
        assert_int_equal(len, 4);
        assert_memory_equal(buf, "next", 4);

        wire_close_fds(memfd, 2);
}

/* More fds than WIRE_MAX_FDS: control data truncated, everything closed. */
static void test_too_many_fds(void **state) {
        Pair *p = *state;
        int fds[WIRE_MAX_FDS], memfd;
        char buf[16];
        size_t len, n_fds = 99;
        int before;

        memfd = make_memfd("many");
        before = count_fds();

        raw_send_fds(p->fd[0], "many", 4, memfd, WIRE_MAX_FDS + 1);
        raw_send_fds(p->fd[0], "lots", 4, memfd, 60);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EBADMSG);
        assert_int_equal(n_fds, 0);
        assert_int_equal(count_fds(), before);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EBADMSG);
        assert_int_equal(count_fds(), before);

        /* Exactly the maximum through the raw path is fine. */
        raw_send_fds(p->fd[0], "max", 3, memfd, WIRE_MAX_FDS);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), 0);
        assert_int_equal(n_fds, WIRE_MAX_FDS);
        assert_int_equal(count_fds(), before + WIRE_MAX_FDS);
        wire_close_fds(fds, n_fds);
        assert_int_equal(count_fds(), before);

        safe_close(memfd);
}

/* fds arriving where the caller wants none are refused and closed. */
static void test_unwanted_fds(void **state) {
        Pair *p = *state;
        char buf[16];
        size_t len;
        int memfd, before;

        memfd = make_memfd("unwanted");
        before = count_fds();
        assert_int_equal(wire_send(p->fd[0], "fd", 2, &memfd, 1), 0);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, NULL, NULL), -EBADMSG);
        assert_int_equal(count_fds(), before);
        safe_close(memfd);
}

/* With SO_PASSCRED every packet carries SCM_CREDENTIALS: not ours, so -EBADMSG. */
static void test_foreign_cmsg(void **state) {
        Pair *p = *state;
        int one = 1, fds[WIRE_MAX_FDS], memfd, before;
        char buf[16];
        size_t len, n_fds;

        assert_int_equal(setsockopt(p->fd[1], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
        memfd = make_memfd("cred");
        before = count_fds();

        assert_int_equal(wire_send(p->fd[0], "cred", 4, &memfd, 1), 0);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EBADMSG);
        assert_int_equal(count_fds(), before);

        safe_close(memfd);
}

/* An empty packet with fds (no wire_send() makes one) is malformed, not EOF. */
static void test_empty_packet_with_fds(void **state) {
        Pair *p = *state;
        int fds[WIRE_MAX_FDS], memfd, before;
        char buf[16];
        size_t len, n_fds;

        memfd = make_memfd("empty");
        before = count_fds();
        raw_send_fds(p->fd[0], "", 0, memfd, 1);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EBADMSG);
        assert_int_equal(count_fds(), before);
        safe_close(memfd);
}

static void test_peer_closed(void **state) {
        Pair *p = *state;
        int fds[WIRE_MAX_FDS];
        char buf[16];
        size_t len, n_fds;

        /* Queued packets are still delivered, then end-of-stream. */
        assert_int_equal(wire_send(p->fd[0], "last", 4, NULL, 0), 0);
        p->fd[0] = safe_close(p->fd[0]);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), 0);
        assert_int_equal(len, 4);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -ECONNRESET);
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -ECONNRESET);
}

static void test_send_to_closed_peer(void **state) {
        Pair *p = *state;
        struct sigaction sa = { .sa_handler = SIG_DFL }, old;

        /* With the default action SIGPIPE would kill the test. */
        assert_int_equal(sigaction(SIGPIPE, &sa, &old), 0);
        p->fd[1] = safe_close(p->fd[1]);
        assert_int_equal(wire_send(p->fd[0], "anyone?", 7, NULL, 0), -EPIPE);
        assert_int_equal(sigaction(SIGPIPE, &old, NULL), 0);
}

static void test_nonblocking(void **state) {
        Pair *p = *state;
        int fds[WIRE_MAX_FDS];
        char buf[1024];
        size_t len, n_fds, sent = 0;
        int r;

        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EAGAIN);

        /* Fill the socket until it pushes back, then drain it. */
        memset(buf, 'z', sizeof(buf));
        for (;;) {
                r = wire_send(p->fd[0], buf, sizeof(buf), NULL, 0);
                if (r == -EAGAIN)
                        break;
                assert_int_equal(r, 0);
                sent++;
                assert_true(sent < 1000000);
        }
        assert_true(sent > 0);
        for (size_t i = 0; i < sent; i++) {
                assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), 0);
                assert_int_equal(len, sizeof(buf));
        }
        assert_int_equal(wire_recv(p->fd[1], buf, sizeof(buf), &len, fds, &n_fds), -EAGAIN);
}

static void test_utf8(_unused_ void **state) {
        static const struct { const char *s; size_t len; bool ok; } cases[] = {
                { "", 0, true }, { "plain", 5, true }, { "caf\xc3\xa9", 5, true },
                { "\xe2\x82\xac", 3, true }, { "\xf0\x9f\x98\x80", 4, true }, { "\xf4\x8f\xbf\xbf", 4, true },
                { "caf\xe9", 4, false },                       /* Latin-1 */
                { "\xc0\xaf", 2, false }, { "\xe0\x80\xaf", 3, false }, { "\xf0\x80\x80\xaf", 4, false },  /* overlong */
                { "\xed\xa0\x80", 3, false }, { "\xed\xbf\xbf", 3, false },    /* surrogates */
                { "\xf4\x90\x80\x80", 4, false }, { "\xf5\x80\x80\x80", 4, false },  /* above U+10FFFF */
                { "\x80", 1, false }, { "\xc3", 1, false }, { "\xe2\x82", 2, false },  /* stray, truncated */
                { "\xe2\x28\xa1", 3, false },
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++)
                if (utf8_valid(cases[i].s, cases[i].len) != cases[i].ok)
                        fail_msg("case %zu: expected %s", i, cases[i].ok ? "valid" : "invalid");
}

/* Every string field, nested ones too, is checked on the encoded bytes; other fields are not. */
static void test_pb_check_strings(_unused_ void **state) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaSet qs = TIER__QUOTA_SET__INIT;
        uint64_t limits[3] = { 0, 0x5151515151ull, 0 };
        char job[] = "QQQQ", why[160];
        uint8_t buf[256], *at;
        size_t len;

        qs.job = job;
        qs.n_tier_limit = 3;
        qs.tier_limit = limits;
        req.seq = 0x51;
        req.op_case = TIER__REQUEST__OP_QUOTA_SET;
        req.quota_set = &qs;
        len = tier__request__pack(&req, buf);
        assert_int_equal(pb_check_strings(&tier__request__descriptor, buf, len, why, sizeof(why)), 0);
        assert_string_equal(why, "");
        at = memmem(buf, len, job, 4);
        assert_non_null(at);
        at[1] = 0;
        assert_int_equal(pb_check_strings(&tier__request__descriptor, buf, len, why, sizeof(why)), -EINVAL);
        assert_string_equal(why, "QuotaSet.job contains a NUL byte");
        at[1] = 0xff;
        assert_int_equal(pb_check_strings(&tier__request__descriptor, buf, len, why, sizeof(why)), -EINVAL);
        assert_string_equal(why, "QuotaSet.job is not valid UTF-8");
        /* truncated: left to the unpacker (0 here, NULL there) */
        at[1] = 'Q';
        assert_int_equal(pb_check_strings(&tier__request__descriptor, buf, len - 3, NULL, 0), 0);
        assert_null(tier__request__unpack(NULL, len - 3, buf));
}

static void test_close_fds(_unused_ void **state) {
        int fds[3] = { -1, -1, -1 };

        fds[0] = make_memfd("x");
        fds[2] = make_memfd("y");
        wire_close_fds(fds, 3);
        for (size_t i = 0; i < 3; i++)
                assert_int_equal(fds[i], -1);
        wire_close_fds(NULL, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_utf8),
                cmocka_unit_test(test_pb_check_strings),
                cmocka_unit_test_setup_teardown(test_roundtrip, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_large_payload, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_invalid_send, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_pass_fds, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_oversize, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_too_many_fds, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_unwanted_fds, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_foreign_cmsg, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_empty_packet_with_fds, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_peer_closed, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_send_to_closed_peer, pair_setup, pair_teardown),
                cmocka_unit_test_setup_teardown(test_nonblocking, pair_setup_nonblock, pair_teardown),
                cmocka_unit_test(test_close_fds),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
