/* SPDX-License-Identifier: MIT */
/* test-garbage.c: a deterministic mutation fuzzer against a real tierd. */

/*
 * Valid requests (hello, create, pin, unpin, evict, prefetch, stat, plan,
 * quota, status) are packed, then mutated (bit flips, byte overwrites,
 * truncation, extension, splices of two requests) and sent, with and
 * without a valid Hello first, some with fds attached.  Whatever tierd
 * answers (an error reply or a closed connection) is fine; what is not fine
 * is a crash, a hang, or a bystander client that stops working.  Run under
 * ASan (scripts/test --asan), the daemon is built with the sanitizers too.
 */

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "proto/plan.h"
#include "proto/wire.h"
#include "tests/helpers/harness.h"
#include "tier.pb-c.h"

#define ROUNDS 2000
/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (32u << 20)

static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 0\n"
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 4M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:128M\n";

static TestDaemon daemon_;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

#define MIN(a, b) ((a) < (b) ? (a) : (b))

static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

typedef struct Blob {
        uint8_t *data;
        size_t len;
} Blob;

static Blob pack(Tier__Request *req) {
        Blob b;

        b.len = tier__request__get_packed_size(req);
        b.data = malloc(b.len + 1);
        assert_non_null(b.data);
        tier__request__pack(req, b.data);
        return b;
}

static size_t seeds(Blob *out) {
        Tier__Request req;
        Tier__Hello h = TIER__HELLO__INIT;
        Tier__Create cr = TIER__CREATE__INIT;
        Tier__Pin pin = TIER__PIN__INIT;
        Tier__Unpin un = TIER__UNPIN__INIT;
        Tier__Evict ev = TIER__EVICT__INIT;
        Tier__Prefetch pf = TIER__PREFETCH__INIT;
        Tier__Stat st = TIER__STAT__INIT;
        Tier__StatusRequest sr = TIER__STATUS_REQUEST__INIT;
        Tier__QuotaGet qg = TIER__QUOTA_GET__INIT, qg2 = TIER__QUOTA_GET__INIT;
        Tier__QuotaSet qs = TIER__QUOTA_SET__INIT, qs2 = TIER__QUOTA_SET__INIT;
        Tier__SubmitPlan sp = TIER__SUBMIT_PLAN__INIT;
        Tier__PlanPhase ph = TIER__PLAN_PHASE__INIT, *php = &ph;
        Tier__PlanAccess pa = TIER__PLAN_ACCESS__INIT, *pap = &pa;
        Tier__GetSegments gs = TIER__GET_SEGMENTS__INIT;
        uint64_t limits[3] = { 1 << 20, 1 << 20, 1 << 20 };
        uint32_t ids[2] = { 0, 65536 };
        size_t n = 0;

#define SEED(field, value, op)                                  \
        do {                                                    \
                tier__request__init(&req);                      \
                req.seq = n + 1;                                \
                req.op_case = op;                               \
                req.field = value;                              \
                out[n++] = pack(&req);                          \
        } while (0)

        h.version = TIER_PROTOCOL_VERSION;
        h.job = (char *) "fuzz";
        SEED(hello, &h, TIER__REQUEST__OP_HELLO);
        cr.name = (char *) "t";
        cr.size = 1 << 20;
        SEED(create, &cr, TIER__REQUEST__OP_CREATE);
        pin.tensor = 1ull << 32;
        pin.tier = TIER__TIER__TIER_VRAM;
        pin.async = 1;
        SEED(pin, &pin, TIER__REQUEST__OP_PIN);
        un.tensor = 1ull << 32;
        un.tier = TIER__TIER__TIER_HOST;
        un.dirty = 1;
        SEED(unpin, &un, TIER__REQUEST__OP_UNPIN);
        ev.tensor = 1ull << 32;
        ev.tier = TIER__TIER__TIER_NVME;
        SEED(evict, &ev, TIER__REQUEST__OP_EVICT);
        pf.tensor = 1ull << 32;
        pf.tier = TIER__TIER__TIER_HOST;
        pf.async = 1;
        SEED(prefetch, &pf, TIER__REQUEST__OP_PREFETCH);
        st.tensor = 1ull << 32;
        SEED(stat, &st, TIER__REQUEST__OP_STAT);
        SEED(status, &sr, TIER__REQUEST__OP_STATUS);
        qg.job = (char *) "fuzz";
        SEED(quota_get, &qg, TIER__REQUEST__OP_QUOTA_GET);
        qs.job = (char *) "fuzz";
        qs.n_tier_limit = 3;
        qs.tier_limit = limits;
        qs.weight = 2;
        SEED(quota_set, &qs, TIER__REQUEST__OP_QUOTA_SET);
        /* the quota targets and minima: a uid's quota with a guarantee, a group's read */
        qs2.kind = 1;
        qs2.id = 4242;
        qs2.n_tier_min = 3;
        qs2.tier_min = limits;
        qs2.min_set = 2;
        qs2.clear = 1;
        SEED(quota_set, &qs2, TIER__REQUEST__OP_QUOTA_SET);
        qg2.kind = 2;
        qg2.id = 0;
        SEED(quota_get, &qg2, TIER__REQUEST__OP_QUOTA_GET);
        pa.tensor = 1ull << 32;
        pa.tier = TIER__TIER__TIER_VRAM;
        pa.mode = PLAN_READ;
        ph.n_accesses = 1;
        ph.accesses = &pap;
        sp.n_phases = 1;
        sp.phases = &php;
        SEED(plan, &sp, TIER__REQUEST__OP_PLAN);
        gs.n_ids = 2;
        gs.ids = ids;
        SEED(get_segments, &gs, TIER__REQUEST__OP_GET_SEGMENTS);
#undef SEED
        return n;
}

static Blob mutate(const Blob *s, const Blob *other) {
        size_t len = s->len, cap = s->len + 64;
        Blob b = { malloc(cap), 0 };
        unsigned k = (unsigned) (rnd() % 6), times = 1 + (unsigned) (rnd() % 4);

        assert_non_null(b.data);
        memcpy(b.data, s->data, len);
        for (unsigned t = 0; t < times; t++) {
                switch (k) {
                case 0: /* flip bits */
                        if (len)
                                b.data[rnd() % len] ^= (uint8_t) (1u << (rnd() % 8));
                        break;
                case 1: /* overwrite a byte with something interesting */
                        if (len) {
                                static const uint8_t v[] = { 0x00, 0xff, 0x7f, 0x80, 0x01, 0x0a, 0x12, 0x22 };
                                b.data[rnd() % len] = v[rnd() % sizeof(v)];
                        }
                        break;
                case 2: /* truncate */
                        if (len > 1)
                                len = 1 + rnd() % (len - 1);
                        break;
                case 3: /* extend with random bytes */
                        while (len < cap && rnd() % 4)
                                b.data[len++] = (uint8_t) rnd();
                        break;
                case 4: /* splice another request's tail */
                        if (len && other->len) {
                                size_t at = rnd() % len, from = rnd() % other->len;
                                size_t n = MIN(other->len - from, cap - at);

                                memcpy(b.data + at, other->data + from, n);
                                len = at + n;
                        }
                        break;
                default: /* huge varints */
                        if (len > 2) {
                                size_t at = rnd() % (len - 1);
                                for (size_t i = at; i < len - 1 && i < at + 9; i++)
                                        b.data[i] = 0xff;
                        }
                        break;
                }
        }
        b.len = len ? len : 1;
        return b;
}

static int raw_connect(void) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        assert_true(fd >= 0);
        strcpy(sa.sun_path, daemon_.socket);
        assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        return fd;
}

/* Drain replies for a moment; any reply or EOF is acceptable. */
static void drain(int fd) {
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len, n_fds;

        for (;;) {
                struct pollfd p = { .fd = fd, .events = POLLIN };

                if (poll(&p, 1, 3) <= 0)
                        return;
                if (wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds) < 0)
                        return;
                wire_close_fds(fds, n_fds);
        }
}

static void test_mutations(void **state) {
        Blob s[32];
        size_t n = seeds(s);
        tier_client *bystander = NULL;
        tier_tensor *t;
        struct tier_grant g;

        assert_int_equal(tier_client_new(&bystander, daemon_.socket, "bystander", 0), 0);
        assert_int_equal(tier_tensor_create(bystander, "b", 4096, &t), 0);

        for (unsigned round = 0; round < ROUNDS; round++) {
                int fd = raw_connect();
                unsigned per_conn = 1 + (unsigned) (rnd() % 8);

                if (rnd() % 4) {
                        /* most rounds get past the handshake first */
                        assert_int_equal(wire_send(fd, s[0].data, s[0].len, NULL, 0), 0);
                        drain(fd);
                }
                for (unsigned i = 0; i < per_conn; i++) {
                        const Blob *a = &s[rnd() % n], *b = &s[rnd() % n];
                        Blob m = rnd() % 8 ? mutate(a, b) : (Blob) { NULL, 0 };
                        int pass[2] = { daemon_.pid > 0 ? STDIN_FILENO : 0, fd };
                        int r;

                        if (!m.data) {
                                /* an unmutated valid request, to reach deeper states */
                                m.data = malloc(a->len);
                                assert_non_null(m.data);
                                memcpy(m.data, a->data, a->len);
                                m.len = a->len;
                        }
                        bool with_fds = rnd() % 16 == 0;

                        r = wire_send(fd, m.data, m.len, with_fds ? pass : NULL, with_fds ? 2 : 0);
                        free(m.data);
                        if (r < 0)
                                break;  /* tierd closed it: fine */
                }
                drain(fd);
                close(fd);

                if (round % 500 == 0) {
                        /* the daemon lives and still serves others */
                        assert_int_equal(kill(daemon_.pid, 0), 0);
                        assert_int_equal(tier_pin(t, TIER_HOST, &g), 0);
                        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
                }
        }
        assert_int_equal(kill(daemon_.pid, 0), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, &g), 0);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        tier_tensor_close(t);
        tier_client_free(bystander);
        for (size_t i = 0; i < n; i++)
                free(s[i].data);
}

static int setup(void **state) {
        return test_daemon_start(&daemon_, CONFIG) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&daemon_) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_mutations),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests_name("garbage", tests, setup, teardown);
}
