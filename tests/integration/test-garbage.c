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
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
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
        int fd = test_raw_connect(daemon_.socket);

        assert_true(fd >= 0);
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

        assert_int_equal(tier_client_new(daemon_.socket, "bystander", 0, &bystander), 0);
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
                        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
                        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
                }
        }
        assert_int_equal(kill(daemon_.pid, 0), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        tier_tensor_close(t);
        tier_client_free(bystander);
        for (size_t i = 0; i < n; i++)
                free(s[i].data);
}

/* ---- a hostile neighbour: fds of the wrong type, other jobs' ids, another uid ------------ */

static unsigned count_fds(pid_t pid) {
        char path[64];
        unsigned n = 0;
        DIR *d;
        struct dirent *de;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
        d = opendir(path);
        if (!d)
                return 0;
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n;
}

/* The next response's status (1: the connection closed, 2: no answer within 5 s). */
static int reply_status(int fd) {
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len, n_fds;

        for (;;) {
                struct pollfd p = { .fd = fd, .events = POLLIN };
                Tier__Reply *rep;
                int r;

                if (poll(&p, 1, 5000) <= 0)
                        return 2;
                r = wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds);
                if (r < 0)
                        return 1;
                wire_close_fds(fds, n_fds);
                rep = tier__reply__unpack(NULL, len, buf);
                if (!rep)
                        return 3;
                if (rep->kind_case != TIER__REPLY__KIND_RESPONSE) {
                        tier__reply__free_unpacked(rep, NULL);
                        continue;       /* an event */
                }
                r = rep->response->status;
                tier__reply__free_unpacked(rep, NULL);
                return r;
        }
}

static int send_req(int fd, Tier__Request *req, const int *fds, size_t n_fds) {
        Blob b = pack(req);
        int r = wire_send(fd, b.data, b.len, fds, n_fds);

        free(b.data);
        return r;
}

/* Hello as job @job on a new raw connection: the connection, or -1 if refused. */
static int hostile_connect(const char *job) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        /* no cmocka assertion here: a forked child of another uid calls this too */
        if (fd < 0)
                return -1;
        strcpy(sa.sun_path, daemon_.socket);
        if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                fprintf(stderr, "cannot connect to %s: %s\n", daemon_.socket, strerror(errno));
                close(fd);
                return -1;
        }
        h.version = TIER_PROTOCOL_VERSION;
        h.job = (char *) job;
        req.seq = 1;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        if (send_req(fd, &req, NULL, 0) < 0 || reply_status(fd) != 0) {
                close(fd);
                return -1;
        }
        return fd;
}

/*
 * Requests that name @ids (the bystander's tensors) or the bystander's job from
 * connection @fd.  Returns how many of them tierd granted (0 is right: none is
 * the connection's to touch), or -1 if tierd stopped answering.  @may_control:
 * the sender is the bystander's uid, whom job control is allowed.
 */
static int poke_others(int fd, const uint64_t *ids, size_t n_ids, bool may_control) {
        int granted = 0, r;
        uint64_t seq = 100;

        for (size_t i = 0; i < n_ids; i++) {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__Pin pin = TIER__PIN__INIT;
                Tier__Unpin un = TIER__UNPIN__INIT;
                Tier__Evict ev = TIER__EVICT__INIT;
                Tier__Prefetch pf = TIER__PREFETCH__INIT;
                Tier__Stat st = TIER__STAT__INIT;
                Tier__Free fr = TIER__FREE__INIT;

                for (int op = 0; op < 6; op++) {
                        tier__request__init(&req);
                        req.seq = seq++;
                        switch (op) {
                        case 0: pin.tensor = ids[i]; pin.tier = TIER__TIER__TIER_HOST;
                                req.op_case = TIER__REQUEST__OP_PIN; req.pin = &pin; break;
                        case 1: un.tensor = ids[i]; un.tier = TIER__TIER__TIER_HOST; un.dirty = 1;
                                req.op_case = TIER__REQUEST__OP_UNPIN; req.unpin = &un; break;
                        case 2: ev.tensor = ids[i]; ev.tier = TIER__TIER__TIER_NVME;
                                req.op_case = TIER__REQUEST__OP_EVICT; req.evict = &ev; break;
                        case 3: pf.tensor = ids[i]; pf.tier = TIER__TIER__TIER_VRAM;
                                req.op_case = TIER__REQUEST__OP_PREFETCH; req.prefetch = &pf; break;
                        case 4: st.tensor = ids[i];
                                req.op_case = TIER__REQUEST__OP_STAT; req.stat = &st; break;
                        default: fr.tensor = ids[i];
                                req.op_case = TIER__REQUEST__OP_FREE; req.free = &fr; break;
                        }
                        if (send_req(fd, &req, NULL, 0) < 0)
                                return -1;
                        r = reply_status(fd);
                        if (r == 1 || r == 2 || r == 3)
                                return -1;
                        if (r == 0) {
                                fprintf(stderr, "request %d on another job's tensor %#" PRIx64 " was granted\n", op,
                                        ids[i]);
                                granted++;
                        }
                }
        }
        /* segments that are not the connection's, a page of tensors past the end, an ack of nothing */
        {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__GetSegments gs = TIER__GET_SEGMENTS__INIT;
                Tier__JobTensors jt = TIER__JOB_TENSORS__INIT;
                Tier__Ack ack = TIER__ACK__INIT;
                Tier__JobEvict je = TIER__JOB_EVICT__INIT;
                uint32_t seg[8] = { 0, 1, 2, 3, 4, 5, 0x7fffffff, 0xffffffff };
                uint8_t big[80 * 1024];

                gs.n_ids = 8;
                gs.ids = seg;
                req.seq = seq++;
                req.op_case = TIER__REQUEST__OP_GET_SEGMENTS;
                req.get_segments = &gs;
                if (send_req(fd, &req, NULL, 0) < 0 || (r = reply_status(fd)) >= 1)
                        return -1;
                jt.job = (char *) "bystander";
                jt.offset = 0xfffffff0u;
                jt.limit = 0xffffffffu;
                tier__request__init(&req);
                req.seq = seq++;
                req.op_case = TIER__REQUEST__OP_JOB_TENSORS;
                req.job_tensors = &jt;
                if (send_req(fd, &req, NULL, 0) < 0 || reply_status(fd) >= 1)
                        return -1;
                ack.segment = 3;
                ack.generation = 99;
                tier__request__init(&req);
                req.seq = seq++;
                req.op_case = TIER__REQUEST__OP_ACK;
                req.ack = &ack;
                if (send_req(fd, &req, NULL, 0) < 0)
                        return -1;
                if (!may_control) {
                        je.job = (char *) "bystander";
                        je.tier = TIER__TIER__TIER_NVME;
                        tier__request__init(&req);
                        req.seq = seq++;
                        req.op_case = TIER__REQUEST__OP_JOB_EVICT;
                        req.job_evict = &je;
                        if (send_req(fd, &req, NULL, 0) < 0 || (r = reply_status(fd)) >= 1)
                                return -1;
                        if (r == 0) {
                                fprintf(stderr, "another uid's job evict of the bystander was granted\n");
                                granted++;
                        }
                }
                /* last: a packet over max_message (64K) and a truncated one cost this connection only */
                memset(big, 0x0a, sizeof(big));
                if (wire_send(fd, big, sizeof(big), NULL, 0) == 0)
                        (void) reply_status(fd);
        }
        return granted;
}

static void fill_pattern(tier_tensor *t, unsigned idx, bool check) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        for (uint64_t o = 0; o < g.length; o++) {
                uint8_t v = (uint8_t) (o * 7 + idx * 13 + (o >> 9));

                if (!check)
                        ((uint8_t *) g.ptr)[o] = v;
                else if (((uint8_t *) g.ptr)[o] != v) {
                        fprintf(stderr, "bystander tensor %u byte %" PRIu64 " changed\n", idx, o);
                        fail();
                }
        }
        assert_int_equal(tier_unpin(t, TIER_HOST, !check), 0);
}

static void test_hostile_neighbour(void **state) {
        tier_client *bystander = NULL;
        tier_tensor *t[3];
        struct tier_tensor_info *info = NULL;
        size_t n_info = 0;
        uint64_t ids[3];
        unsigned fds_before, fds_after = 0;
        int wrong[6], sp[2], fd, r;
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__StatusRequest sr = TIER__STATUS_REQUEST__INIT;
        Tier__Create cr = TIER__CREATE__INIT;

        assert_int_equal(tier_client_new(daemon_.socket, "bystander", 0, &bystander), 0);
        for (unsigned i = 0; i < 3; i++) {
                char name[8];

                snprintf(name, sizeof(name), "v%u", i);
                assert_int_equal(tier_tensor_create(bystander, name, 1 << 20, &t[i]), 0);
                fill_pattern(t[i], i, false);
        }
        assert_int_equal(tier_evict(t[1], TIER_NVME), 0);
        assert_int_equal(tier_prefetch(t[2], TIER_VRAM), 0);
        assert_int_equal(tier_job_tensors(bystander, "bystander", &info, &n_info), 0);
        assert_int_equal(n_info, 3);
        for (size_t i = 0; i < n_info; i++)
                ids[i] = info[i].id;
        free(info);
        fds_before = count_fds(daemon_.pid);

        /* fds of every wrong type on requests that carry none: tierd must close them all */
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
        wrong[0] = sp[0];
        wrong[1] = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        wrong[2] = open("/", O_PATH | O_CLOEXEC);
        wrong[3] = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        assert_true(wrong[1] >= 0 && wrong[2] >= 0 && wrong[3] >= 0);
        assert_int_equal(ftruncate(wrong[3], 4096), 0);
        assert_int_equal(fcntl(wrong[3], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL), 0);
        wrong[4] = eventfd(0, EFD_CLOEXEC);
        assert_true(wrong[4] >= 0);
        fd = hostile_connect("hostile");
        assert_true(fd >= 0);
        wrong[5] = fd;  /* its own socket */
        for (unsigned round = 0; round < 64; round++) {
                int pass[WIRE_MAX_FDS];
                size_t n = 1 + round % WIRE_MAX_FDS;
                char name[16];

                for (size_t i = 0; i < n; i++)
                        pass[i] = wrong[(round + i) % 6];
                tier__request__init(&req);
                req.seq = 10 + round;
                if (round % 2) {
                        snprintf(name, sizeof(name), "h%u", round);
                        cr.name = name;
                        cr.size = 4096;
                        req.op_case = TIER__REQUEST__OP_CREATE;
                        req.create = &cr;
                } else {
                        req.op_case = TIER__REQUEST__OP_STATUS;
                        req.status = &sr;
                }
                assert_int_equal(send_req(fd, &req, pass, n), 0);
                /* the fds are dropped, the request is served as if they were not there */
                assert_int_equal(reply_status(fd), 0);
        }
        close(fd);
        /* the ids of another job's tensors (ids are per job: in a job that has none, they must
         * name nothing), segments that are not its own, a page past the end, oversized packets */
        fd = hostile_connect("prober");
        assert_true(fd >= 0);
        r = poke_others(fd, ids, 3, true);
        assert_int_equal(r, 0);
        close(fd);

        /* the same from another uid, when we may become one */
        if (geteuid() == 0) {
                pid_t pid;
                int st;

                assert_int_equal(chmod(daemon_.dir, 0711), 0);
                assert_int_equal(chmod(daemon_.socket, 0666), 0);
                pid = fork();

                assert_true(pid >= 0);
                if (pid == 0) {
                        int c, g = 0;

                        if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
                                _exit(10);
                        /* the bystander's job is not this uid's to join */
                        if (hostile_connect("bystander") >= 0)
                                _exit(11);
                        c = hostile_connect("nobody");
                        if (c < 0)
                                _exit(12);
                        g = poke_others(c, ids, 3, false);
                        _exit(g < 0 ? 13 : g > 0 ? 14 : 0);
                }
                assert_int_equal(waitpid(pid, &st, 0), pid);
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                        fprintf(stderr, "the other uid's child ended with status %d\n", st);
                assert_true(WIFEXITED(st));
                assert_int_equal(WEXITSTATUS(st), 0);
        } else
                fprintf(stderr, "not root: the other uid's part is skipped\n");

        for (unsigned i = 0; i < 6; i++)
                if (i != 5)
                        close(wrong[i]);
        close(sp[1]);

        /* every fd passed was closed again; the bystander's bytes are as written */
        for (unsigned i = 0; i < 100; i++) {
                fds_after = count_fds(daemon_.pid);
                if (fds_after == fds_before)
                        break;
                usleep(20000);
        }
        if (fds_after != fds_before)
                fprintf(stderr, "tierd had %u fds before the hostile client, %u after\n", fds_before, fds_after);
        assert_int_equal(fds_after, fds_before);
        assert_int_equal(kill(daemon_.pid, 0), 0);
        for (unsigned i = 0; i < 3; i++) {
                fill_pattern(t[i], i, true);
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        }
        tier_client_free(bystander);
}

/* A Create of @name (@len bytes, NULs allowed) on raw connection @fd as request @seq: the status. */
static int create_raw(int fd, uint64_t seq, const char *name, size_t len) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Create cr = TIER__CREATE__INIT;
        char *stand_in = malloc(len + 1);
        Blob b;
        uint8_t *at;
        int r;

        assert_non_null(stand_in);
        memset(stand_in, 'Q', len);
        stand_in[len] = '\0';
        cr.name = stand_in;
        cr.size = 4096;
        req.seq = seq;
        req.op_case = TIER__REQUEST__OP_CREATE;
        req.create = &cr;
        b = pack(&req);
        at = memmem(b.data, b.len, stand_in, len);
        assert_non_null(at);
        memcpy(at, name, len);          /* what protobuf-c would never pack from a C string */
        r = wire_send(fd, b.data, b.len, NULL, 0);
        free(b.data);
        free(stand_in);
        assert_int_equal(r, 0);
        return reply_status(fd);
}

/* Names with a NUL inside, or not UTF-8, are refused with -EINVAL, never cut short; the connection goes on. */
static void test_names_not_text(void **state) {
        static const char nul[] = "bad\0name", latin1[] = "caf\xe9", overlong[] = "\xc0\xaf", surrogate[] = "\xed\xa0\x80";
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;
        int fd = hostile_connect("names");
        char job[] = "jobQname";

        assert_true(fd >= 0);
        assert_int_equal(create_raw(fd, 2, nul, sizeof(nul) - 1), -EINVAL);
        assert_int_equal(create_raw(fd, 3, latin1, sizeof(latin1) - 1), -EINVAL);
        assert_int_equal(create_raw(fd, 4, overlong, sizeof(overlong) - 1), -EINVAL);
        assert_int_equal(create_raw(fd, 5, surrogate, sizeof(surrogate) - 1), -EINVAL);
        /* "bad" was not made by the first: it is free to create; UTF-8 is fine */
        assert_int_equal(create_raw(fd, 6, "bad", 3), 0);
        assert_int_equal(create_raw(fd, 7, "caf\xc3\xa9 \xf0\x9f\x98\x80", 10), 0);
        close(fd);

        /* a Hello whose job has a NUL inside: refused, and no job 'job' is made */
        fd = raw_connect();
        h.version = TIER_PROTOCOL_VERSION;
        h.job = job;
        req.seq = 1;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        {
                Blob b = pack(&req);
                uint8_t *at = memmem(b.data, b.len, job, strlen(job));

                assert_non_null(at);
                at[3] = '\0';
                assert_int_equal(wire_send(fd, b.data, b.len, NULL, 0), 0);
                free(b.data);
        }
        assert_int_equal(reply_status(fd), -EINVAL);
        close(fd);

        /* libtier refuses what is not UTF-8 before sending */
        {
                tier_client *c = NULL;
                tier_tensor *t = NULL;

                assert_int_equal(tier_client_new(daemon_.socket, "caf\xe9", 0, &c), -EINVAL);
                tier_client_free(c);
                c = NULL;
                assert_int_equal(tier_client_new(daemon_.socket, "names-c", 0, &c), 0);
                assert_int_equal(tier_tensor_create(c, "\xff", 4096, &t), -EINVAL);
                assert_non_null(strstr(tier_client_last_error(c), "not valid UTF-8"));
                tier_client_free(c);
        }
}

/*
 * A connection that asks for its job's segments over and over (each answer carries their fds) and reads
 * nothing: tierd's copies of the fds it queues are bounded, the connection is cut off, and tierd holds no
 * more fds than before it; the job serves a new client.  Each answer used to carry up to 16 fds, kept
 * for the unread replies up to 4096 of them, and in flight beyond: a member of group tier could run tierd
 * out of fds for everyone.
 */
static void test_segment_flood(void **state) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__GetSegments gs = TIER__GET_SEGMENTS__INIT;
        uint32_t ids[4];
        tier_client *c = NULL;
        tier_tensor *t[4];
        struct tier_grant g;
        unsigned base, most = 0;
        int fd, sent = 0;

        assert_int_equal(tier_client_new(daemon_.socket, "flood", 0, &c), 0);
        for (int i = 0; i < 4; i++) {
                char name[8];

                snprintf(name, sizeof(name), "t%d", i);
                assert_int_equal(tier_tensor_create(c, name, 4u << 20, &t[i]), 0);
                assert_int_equal(tier_pin(t[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
                ids[i] = g.segment;
        }
        fd = hostile_connect("flood");
        assert_true(fd >= 0);
        base = count_fds(daemon_.pid);
        gs.n_ids = 4;
        gs.ids = ids;
        req.op_case = TIER__REQUEST__OP_GET_SEGMENTS;
        req.get_segments = &gs;
        for (uint64_t seq = 2; seq < 2000; seq++) {
                req.seq = seq;
                if (send_req(fd, &req, NULL, 0) < 0)
                        break;
                sent++;
                if (count_fds(daemon_.pid) > most)
                        most = count_fds(daemon_.pid);
        }
        assert_true(sent < 1998);                       /* cut off (its unread fds, or 4096 segments asked for) */
        assert_true(most <= base + 512 + 16);           /* OUTQ_FDS_MAX and one reply's */
        drain(fd);                                      /* to its end: tierd closed it */
        close(fd);
        for (int i = 0; i < 4; i++) {
                assert_int_equal(tier_unpin(t[i], TIER_HOST, 0), 0);
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        }
        tier_client_free(c);
        assert_int_equal(tier_client_new(daemon_.socket, "flood", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "again", 4u << 20, &t[0]), 0);
        assert_int_equal(tier_pin(t[0], TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t[0], TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(t[0]), 0);
        tier_client_free(c);
        assert_true(count_fds(daemon_.pid) <= base);
}


/* Receive every reply on @fd until EOF or @n responses: how many came, the bytes of the memfds they carried. */
static unsigned read_replies(int fd, unsigned n, uint64_t *fd_bytes) {
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len, n_fds;
        unsigned got = 0;

        *fd_bytes = 0;
        while (got < n) {
                Tier__Reply *rep;

                if (wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds) < 0)
                        break;
                for (size_t i = 0; i < n_fds; i++) {
                        struct stat st;

                        if (fstat(fds[i], &st) == 0 && S_ISREG(st.st_mode))
                                *fd_bytes += (uint64_t) st.st_size;
                }
                wire_close_fds(fds, n_fds);
                rep = tier__reply__unpack(NULL, len, buf);
                assert_non_null(rep);
                got += rep->kind_case == TIER__REPLY__KIND_RESPONSE;
                tier__reply__free_unpacked(rep, NULL);
        }
        return got;
}

/*
 * A connection that asks for the metrics over and over (24 jobs with long names: each answer is a memfd of
 * about 150 KiB) and reads nothing: the memfds of its unread replies are bounded (OUTQ_MEMFD_BYTES_MAX,
 * 16 MiB: what it can read before EOF is under that and one more reply), the connection is cut off, and
 * tierd serves others.  The memfds used to count for nothing, neither in tierd's queue (only their fds,
 * 512) nor in the socket's: about 280 of them (42 MiB) came through, 790 (120 MiB) were held at once.
 */
static void test_memfd_flood(void **state) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__StatusRequest sr = TIER__STATUS_REQUEST__INIT;
        tier_client *c[24];
        tier_tensor *t = NULL;
        struct tier_grant g;
        char name[256];
        uint64_t bytes, one;
        unsigned sent = 0, got;
        int fd;

        for (unsigned i = 0; i < 24; i++) {
                memset(name, 'j', 250);
                snprintf(name + 250, 6, "%03u", i);
                assert_int_equal(tier_client_new(daemon_.socket, name, 0, &c[i]), 0);
        }
        sr.prometheus = 1;
        req.op_case = TIER__REQUEST__OP_STATUS;
        req.status = &sr;

        /* one reply, read: its size */
        fd = hostile_connect("");
        assert_true(fd >= 0);
        req.seq = 2;
        assert_int_equal(send_req(fd, &req, NULL, 0), 0);
        assert_int_equal(read_replies(fd, 1, &one), 1);
        assert_true(one > 64u << 10);   /* a memfd */

        /* one that reads nothing */
        for (uint64_t seq = 3; seq < 2003; seq++) {
                req.seq = seq;
                if (send_req(fd, &req, NULL, 0) < 0)
                        break;
                sent++;
        }
        got = read_replies(fd, sent, &bytes);
        fprintf(stderr, "sent %u requests, read %u replies with %" PRIu64 " bytes of memfds\n", sent, got, bytes);
        assert_true(got < sent);                                /* cut off */
        assert_true(bytes <= (16u << 20) + 2 * one);            /* OUTQ_MEMFD_BYTES_MAX, one more (a job grew) */
        close(fd);

        /* the others are served */
        assert_int_equal(tier_tensor_create(c[0], "after", 4096, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        for (unsigned i = 0; i < 24; i++)
                tier_client_free(c[i]);
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
                cmocka_unit_test(test_hostile_neighbour),
                cmocka_unit_test(test_names_not_text),
                cmocka_unit_test(test_segment_flood),
                cmocka_unit_test(test_memfd_flood),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests_name("garbage", tests, setup, teardown);
}
