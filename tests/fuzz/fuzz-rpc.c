/* SPDX-License-Identifier: MIT */
/* fuzz-rpc.c: fuzz target: packets (with fds) into an in-process tierd, decoded by conn.c, dispatched by rpc.c. */

/*
 * Theory of operation: each input runs against a fresh daemon core
 * (core.c: registry, scheduler, engine, emulated VRAM, memfd host pool,
 * a file NVMe target) with two fake clients, each the far end of a
 * socketpair whose near end is a Conn (conn_new(), as the server makes on
 * accept).  The input is a list of commands, one byte each and its
 * arguments:
 *
 *   op % 8 = 0..2  a packet on client (op >> 3) & 1: u16 length (at most
 *                  8K), the payload, then a u8 mask of fds to pass beside it
 *                  (bit k: fuzz_make_fd(k): memfd, eventfd, /dev/null,
 *                  O_PATH directory, socket, sealed memfd, pipe, directory)
 *            3     run the loop ((op >> 3) & 7) + 1 times without waiting
 *            4     read every reply queued for client (op >> 3) & 1
 *            5     (re)connect client (op >> 3) & 1 as uid 0 or, when bit
 *                  4 is set, uid 1000 (not an admin)
 *            6     poke a kept fd: u8 index, u16 offset, u8 length, bytes:
 *                  written into it (a plan page, a fence page) or, when
 *                  that fails, 1 added to it (a plan's marker eventfd)
 *            7     wait until no transfer is in flight
 *
 * Replies are read and must each unpack as a tier.Reply; the fds they carry
 * are kept (the last 16) for command 6, as a client scribbling on its plan
 * page would.  After the input both clients hang up and transfers settle:
 * tierd must then hold no connection, job, used or pinned byte (jobs do
 * not linger here).  The core is freed, and the process must hold exactly
 * the fds it held before (no fd a client passed, or tierd made, may leak).
 */

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/ipc/conn.h"
#include "daemon/ipc/server.h"
#include "daemon/state/registry.h"
#include "proto/level.h"
#include "proto/plan.h"
#include "proto/wire.h"
#include "tests/fuzz/core.h"
#include "tests/fuzz/fuzz.h"
#include "tier.pb-c.h"

#define N_CLIENTS 2
#define KEEP_FDS 16
#define MAX_PACKET 8192

typedef struct Fuzz {
        Manager *m;
        int client[N_CLIENTS];          /* our end, or -1 */
        int kept[KEEP_FDS];             /* fds from replies, a ring */
        unsigned n_kept;
        bool verbose;                   /* $TIER_FUZZ_LOG: say what tierd replied */
        uint8_t rbuf[1u << 20];
} Fuzz;

static Fuzz F;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        F.verbose = getenv("TIER_FUZZ_LOG") != NULL;
        return 0;
}

static void client_close(Fuzz *f, int i) {
        if (f->client[i] >= 0)
                close(f->client[i]);
        f->client[i] = -1;
}

static void client_open(Fuzz *f, int i, uid_t uid) {
        int sv[2];
        Conn *c = NULL;

        client_close(f, i);
        FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
        if (conn_new(f->m->server, sv[0], uid, uid, getpid(), &c) < 0) {
                /* refused (too many connections): conn_new() does not take the fd then */
                close(sv[0]);
                close(sv[1]);
                return;
        }
        f->client[i] = sv[1];
}

static void keep_fd(Fuzz *f, int fd) {
        unsigned k = f->n_kept++ % KEEP_FDS;

        if (f->kept[k] >= 0)
                close(f->kept[k]);
        f->kept[k] = fd;
}

static void drain(Fuzz *f, int i) {
        int fds[WIRE_MAX_FDS];
        size_t len, n_fds;

        if (f->client[i] < 0)
                return;
        for (;;) {
                Tier__Reply *reply;
                int r = wire_recv(f->client[i], f->rbuf, sizeof(f->rbuf), &len, fds, &n_fds);

                if (r == -EAGAIN)
                        return;
                if (r < 0) {            /* tierd closed it */
                        client_close(f, i);
                        return;
                }
                reply = tier__reply__unpack(NULL, len, f->rbuf);
                if (!reply) {
                        fprintf(stderr, "tierd sent a packet of %zu bytes that is no tier.Reply\n", len);
                        abort();
                }
                if (f->verbose && reply->kind_case == TIER__REPLY__KIND_RESPONSE)
                        fprintf(stderr, "client %d: seq %" PRIu64 " status %d %s (%zu fds)\n", i, reply->response->seq,
                                reply->response->status, reply->response->error ? reply->response->error : "", n_fds);
                else if (f->verbose)
                        fprintf(stderr, "client %d: event (%zu fds)\n", i, n_fds);
                tier__reply__free_unpacked(reply, NULL);
                for (size_t k = 0; k < n_fds; k++)
                        keep_fd(f, fds[k]);
        }
}

static void send_packet(Fuzz *f, int i, const uint8_t *p, size_t len, uint8_t mask) {
        int fds[_FD_KIND_MAX];
        size_t n_fds = 0;
        int r;

        if (f->client[i] < 0 || len == 0)
                return;
        for (int k = 0; k < _FD_KIND_MAX; k++)
                if (mask & (1u << k))
                        fds[n_fds++] = fuzz_make_fd(k);
        r = wire_send(f->client[i], p, len, fds, n_fds);
        if (r == -EAGAIN) {
                /* the socket is full: let tierd read, read its replies, try once more */
                core_run(f->m, 0);
                drain(f, i);
                if (f->client[i] >= 0)
                        (void) wire_send(f->client[i], p, len, fds, n_fds);
        }
        wire_close_fds(fds, n_fds);
        core_run(f->m, 0);
}

static void poke(Fuzz *f, FuzzIn *in) {
        unsigned idx = fin_u8(in) % KEEP_FDS;
        uint16_t off = fin_u16(in);
        const uint8_t *p;
        size_t len = fin_bytes(in, fin_u8(in) % 65, &p);
        uint64_t one = 1;
        int fd = f->kept[idx];

        if (fd < 0)
                return;
        if (len == 0 || pwrite(fd, p, len, off) < 0)
                (void) !write(fd, &one, sizeof(one));
        core_run(f->m, 0);
}

static bool all_released(Manager *m) {
        Registry *r = m->registry;

        if (server_n_conns(m->server) > 0 || r->n_jobs > 0 || !list_empty(&r->dying_jobs))
                return false;
        for (int t = 0; t < TIERS; t++)
                if (r->used[t] > 0 || r->pinned[t] > 0)
                        return false;
        return true;
}

/*
 * Every client has hung up and jobs do not linger: once the transfers in
 * flight are done, tierd must hold nothing for anyone (no connection, job,
 * used or pinned byte), whatever the clients did before.
 */
static void check_released(Manager *m) {
        Registry *r = m->registry;

        for (int i = 0; i < 2000 && !all_released(m); i++)     /* one event source per pass */
                core_run(m, 10000);
        if (!all_released(m)) {
                fprintf(stderr, "after every client left: %u connections, %u jobs (%s dying), used %" PRIu64 "/%" PRIu64
                        "/%" PRIu64 ", pinned %" PRIu64 "/%" PRIu64 "/%" PRIu64 " (vram/host/nvme)\n",
                        server_n_conns(m->server), r->n_jobs, list_empty(&r->dying_jobs) ? "none" : "some",
                        r->used[0], r->used[1], r->used[2], r->pinned[0], r->pinned[1], r->pinned[2]);
                abort();
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        FuzzIn in = { data, size };
        Fuzz *f = &F;
        int fds_before = fuzz_count_fds();

        f->m = core_new(SCHED_POLICY_TIMELINE);
        for (int i = 0; i < N_CLIENTS; i++)
                f->client[i] = -1;
        for (int k = 0; k < KEEP_FDS; k++)
                f->kept[k] = -1;
        f->n_kept = 0;
        client_open(f, 0, 0);
        client_open(f, 1, 0);

        while (in.n > 0) {
                uint8_t op = fin_u8(&in);
                int i = (op >> 3) & 1;
                const uint8_t *p;
                size_t len;

                switch (op % 8) {
                case 0:
                case 1:
                case 2:
                        len = fin_bytes(&in, fin_u16(&in) % (MAX_PACKET + 1), &p);
                        send_packet(f, i, p, len, fin_u8(&in));
                        break;
                case 3:
                        for (int k = 0; k <= ((op >> 3) & 7); k++)
                                core_run(f->m, 0);
                        break;
                case 4:
                        core_run(f->m, 0);
                        drain(f, i);
                        break;
                case 5:
                        client_open(f, i, (op & 0x10) ? 1000 : 0);
                        break;
                case 6:
                        poke(f, &in);
                        break;
                case 7:
                        core_settle(f->m);
                        break;
                }
        }

        for (int i = 0; i < N_CLIENTS; i++) {
                drain(f, i);
                client_close(f, i);
        }
        for (int k = 0; k < KEEP_FDS; k++)
                if (f->kept[k] >= 0)
                        close(f->kept[k]);
        check_released(f->m);
        core_free(f->m);
        f->m = NULL;
        if (fuzz_count_fds() != fds_before) {
                fprintf(stderr, "fds leaked: %d open before the input, %d after\n", fds_before, fuzz_count_fds());
                abort();
        }
        return 0;
}

/* ---- seeds: request sequences a client would send, then some a client should not ------------------ */

/* The id tierd gives a job's @k-th tensor (1-based): generation k, slot k - 1 (tensor.c). */
#define TID(k) (((uint64_t) (k) << 32) | ((k) - 1))

static void put_req(FuzzOut *o, int client, Tier__Request *req, uint64_t seq, uint8_t fd_mask) {
        uint8_t buf[4096];
        size_t n;

        req->seq = seq;
        n = tier__request__pack(req, buf);
        fout_u8(o, (uint8_t) (client << 3));            /* op 0: a packet */
        fout_u16(o, (uint16_t) n);
        fout_bytes(o, buf, n);
        fout_u8(o, fd_mask);
        fout_u8(o, (uint8_t) (3 | 7 << 3));            /* run the loop 8 times */
}

static void put_hello(FuzzOut *o, int client, const char *job, uint32_t rank, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;

        h.version = WIRE_PROTOCOL_VERSION;
        h.job = (char *) job;
        h.rank = rank;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        put_req(o, client, &req, seq, 0);
}

static void put_create(FuzzOut *o, int client, const char *name, uint64_t size, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Create c = TIER__CREATE__INIT;

        c.name = (char *) name;
        c.size = size;
        req.op_case = TIER__REQUEST__OP_CREATE;
        req.create = &c;
        put_req(o, client, &req, seq, 0);
}

static void put_pin(FuzzOut *o, int client, uint64_t t, int tier, bool async, uint32_t mode, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Pin p = TIER__PIN__INIT;

        p.tensor = t;
        p.tier = (Tier__Tier) tier;
        p.async = async;
        p.mode = mode;
        req.op_case = TIER__REQUEST__OP_PIN;
        req.pin = &p;
        put_req(o, client, &req, seq, 0);
}

static void put_unpin(FuzzOut *o, int client, uint64_t t, int tier, bool dirty, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Unpin u = TIER__UNPIN__INIT;

        u.tensor = t;
        u.tier = (Tier__Tier) tier;
        u.dirty = dirty;
        req.op_case = TIER__REQUEST__OP_UNPIN;
        req.unpin = &u;
        put_req(o, client, &req, seq, 0);
}

static void put_move(FuzzOut *o, int client, bool evict, uint64_t t, int tier, bool async, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Evict e = TIER__EVICT__INIT;
        Tier__Prefetch p = TIER__PREFETCH__INIT;

        if (evict) {
                e.tensor = t;
                e.tier = (Tier__Tier) tier;
                e.async = async;
                req.op_case = TIER__REQUEST__OP_EVICT;
                req.evict = &e;
        } else {
                p.tensor = t;
                p.tier = (Tier__Tier) tier;
                p.async = async;
                req.op_case = TIER__REQUEST__OP_PREFETCH;
                req.prefetch = &p;
        }
        put_req(o, client, &req, seq, 0);
}

static void put_simple(FuzzOut *o, int client, Tier__Request__OpCase kind, uint64_t t, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Free fr = TIER__FREE__INIT;
        Tier__Stat st = TIER__STAT__INIT;
        Tier__StatusRequest sr = TIER__STATUS_REQUEST__INIT;
        Tier__EndPlan ep = TIER__END_PLAN__INIT;
        Tier__Open op = TIER__OPEN__INIT;
        Tier__GetSegments gs = TIER__GET_SEGMENTS__INIT;
        Tier__Ack ack = TIER__ACK__INIT;
        uint32_t ids[3] = { 0, 1, 7 };

        req.op_case = kind;
        switch (kind) {
        case TIER__REQUEST__OP_FREE:
                fr.tensor = t;
                req.free = &fr;
                break;
        case TIER__REQUEST__OP_STAT:
                st.tensor = t;
                req.stat = &st;
                break;
        case TIER__REQUEST__OP_STATUS:
                req.status = &sr;
                break;
        case TIER__REQUEST__OP_END_PLAN:
                req.end_plan = &ep;
                break;
        case TIER__REQUEST__OP_OPEN:
                op.name = (char *) "a";
                req.open = &op;
                break;
        case TIER__REQUEST__OP_GET_SEGMENTS:
                gs.ids = ids;
                gs.n_ids = 3;
                req.get_segments = &gs;
                break;
        case TIER__REQUEST__OP_ACK:
                ack.segment = (uint32_t) t;
                ack.generation = 1;
                req.ack = &ack;
                break;
        default:
                abort();
        }
        put_req(o, client, &req, seq, 0);
}

/* A plan of @n_phases phases over the first two tensors: phase k reads one in host and writes the other in vram. */
static void put_plan(FuzzOut *o, int client, unsigned n_phases, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__SubmitPlan sp = TIER__SUBMIT_PLAN__INIT;
        Tier__PlanPhase phases[4], *phasep[4];
        Tier__PlanAccess acc[4][2], *accp[4][2];

        for (unsigned k = 0; k < n_phases; k++) {
                tier__plan_phase__init(&phases[k]);
                for (unsigned a = 0; a < 2; a++) {
                        tier__plan_access__init(&acc[k][a]);
                        acc[k][a].tensor = TID(1 + ((k + a) & 1));
                        acc[k][a].tier = a ? TIER__TIER__TIER_VRAM : TIER__TIER__TIER_HOST;
                        acc[k][a].mode = a ? PLAN_WRITE : PLAN_READ;
                        accp[k][a] = &acc[k][a];
                }
                phases[k].accesses = accp[k];
                phases[k].n_accesses = 2;
                phasep[k] = &phases[k];
        }
        sp.phases = phasep;
        sp.n_phases = n_phases;
        req.op_case = TIER__REQUEST__OP_PLAN;
        req.plan = &sp;
        put_req(o, client, &req, seq, 0);
}

static void put_quota(FuzzOut *o, int client, const char *job, uint32_t weight, uint64_t seq) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaSet qs = TIER__QUOTA_SET__INIT;
        Tier__QuotaGet qg = TIER__QUOTA_GET__INIT;
        uint64_t limits[3] = { 1ull << 20, 2ull << 20, 0 };

        if (weight == 0) {
                qg.job = (char *) job;
                req.op_case = TIER__REQUEST__OP_QUOTA_GET;
                req.quota_get = &qg;
        } else {
                qs.job = (char *) job;
                qs.weight = weight;
                qs.tier_limit = limits;
                qs.n_tier_limit = 3;
                req.op_case = TIER__REQUEST__OP_QUOTA_SET;
                req.quota_set = &qs;
        }
        put_req(o, client, &req, seq, 0);
}

static void put_op(FuzzOut *o, uint8_t op) {
        fout_u8(o, op);
}

/* A plan marker: write phase @phase and marker_seq @seq into the plan page (kept fd @idx), then poke its eventfd. */
static void put_marker(FuzzOut *o, unsigned page_idx, unsigned efd_idx, uint32_t phase, uint64_t seq) {
        put_op(o, 6);
        fout_u8(o, (uint8_t) page_idx);
        fout_u16(o, offsetof(PlanClientArea, phase));
        fout_u8(o, 4);
        fout_u32(o, phase);
        put_op(o, 6);
        fout_u8(o, (uint8_t) page_idx);
        fout_u16(o, offsetof(PlanClientArea, marker_seq));
        fout_u8(o, 8);
        fout_u64(o, seq);
        put_op(o, 6);
        fout_u8(o, (uint8_t) efd_idx);
        fout_u16(o, 0);
        fout_u8(o, 0);
}

static int write_seed(const char *dir, const char *name, FuzzOut *o) {
        return fuzz_write_file(dir, name, o->buf, o->n);
}

int fuzz_write_seeds(const char *dir) {
        static const uint8_t garbage[] = { 0x08, 0x01, 0x12, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x41 };
        FuzzOut *o = calloc(1, sizeof(FuzzOut));
        int r = 0;

        if (!o)
                return -ENOMEM;

        /* the life of one tensor: create, pin, write, unpin, evict to NVMe, prefetch back, stat, free */
        put_hello(o, 0, "job", 0, 1);
        put_create(o, 0, "a", 256 << 10, 2);
        put_create(o, 0, "b", 300000, 3);
        put_pin(o, 0, TID(1), LEVEL_HOST, false, 0, 4);
        put_op(o, 7);
        put_unpin(o, 0, TID(1), LEVEL_HOST, true, 5);
        put_move(o, 0, true, TID(1), LEVEL_NVME, false, 6);
        put_op(o, 7);
        put_move(o, 0, false, TID(1), LEVEL_VRAM, true, 7);
        put_op(o, 7);
        put_pin(o, 0, TID(2), LEVEL_VRAM, true, PLAN_WRITE, 8);
        put_op(o, 7);
        put_unpin(o, 0, TID(2), LEVEL_VRAM, false, 9);
        put_simple(o, 0, TIER__REQUEST__OP_STAT, TID(1), 10);
        put_simple(o, 0, TIER__REQUEST__OP_STATUS, 0, 11);
        put_simple(o, 0, TIER__REQUEST__OP_FREE, TID(1), 12);
        put_simple(o, 0, TIER__REQUEST__OP_GET_SEGMENTS, 0, 13);
        put_op(o, 4);
        r = r ?: write_seed(dir, "seed-tensor", o);

        /* two ranks of one job: open, pins from both, an ack, one rank dies mid-transfer */
        o->n = 0;
        put_hello(o, 0, "job", 0, 1);
        put_hello(o, 1, "job", 1, 1);
        put_create(o, 0, "a", 700000, 2);
        put_simple(o, 1, TIER__REQUEST__OP_OPEN, 0, 2);
        put_pin(o, 1, TID(1), LEVEL_HOST, true, PLAN_READ, 3);
        put_pin(o, 0, TID(1), LEVEL_VRAM, true, 0, 3);
        put_move(o, 1, true, TID(1), LEVEL_NVME, true, 4);
        put_simple(o, 0, TIER__REQUEST__OP_ACK, 0, 4);
        put_op(o, 4);
        put_op(o, 4 | 1 << 3);
        put_op(o, 5 | 1 << 3);                          /* rank 1 reconnects, its pins gone */
        put_hello(o, 1, "job", 1, 1);
        put_op(o, 7);
        r = r ?: write_seed(dir, "seed-ranks", o);

        /* a plan, its markers through the page and the marker eventfd, then its end */
        o->n = 0;
        put_hello(o, 0, "job", 0, 1);                   /* kept fds 0, 1: fence page, eventfd */
        put_create(o, 0, "a", 200000, 2);
        put_create(o, 0, "b", 128 << 10, 3);
        put_op(o, 4);
        put_plan(o, 0, 2, 4);
        put_op(o, 4);                                   /* kept fds 2, 3: plan page, marker eventfd */
        put_marker(o, 2, 3, 0, 1);
        put_op(o, 7);
        put_marker(o, 2, 3, 1, 2);
        put_op(o, 7);
        put_marker(o, 2, 3, 7, 2);                      /* a phase the plan lacks */
        put_op(o, 7);
        put_simple(o, 0, TIER__REQUEST__OP_END_PLAN, 0, 5);
        put_op(o, 4);
        r = r ?: write_seed(dir, "seed-plan", o);

        /* quotas from an admin and from uid 1000; a control connection's status */
        o->n = 0;
        put_hello(o, 0, "job", 0, 1);
        put_quota(o, 0, "job", 0, 2);
        put_quota(o, 0, "job", 50, 3);
        put_op(o, 5 | 1 << 3 | 1 << 4);
        put_hello(o, 1, "", 0, 1);
        put_quota(o, 1, "job", 10, 2);
        put_simple(o, 1, TIER__REQUEST__OP_STATUS, 0, 3);
        put_op(o, 4);
        put_op(o, 4 | 1 << 3);
        r = r ?: write_seed(dir, "seed-quota", o);

        /* two jobs of two uids: the second names the first one's tensor ids, and quotas it may not set */
        o->n = 0;
        put_hello(o, 0, "a", 0, 1);
        put_create(o, 0, "x", 65536, 2);
        put_op(o, 5 | 1 << 3 | 1 << 4);                 /* client 1 as uid 1000 */
        put_hello(o, 1, "b", 0, 1);
        put_create(o, 1, "x", 4096, 2);
        put_pin(o, 1, TID(2), LEVEL_HOST, false, 0, 3);
        put_simple(o, 1, TIER__REQUEST__OP_FREE, TID(1) + 1, 4);
        put_quota(o, 1, "a", 7, 5);
        put_pin(o, 0, TID(1), LEVEL_HOST, false, 0, 3);
        put_op(o, 4);
        put_op(o, 4 | 1 << 3);
        r = r ?: write_seed(dir, "seed-two-jobs", o);

        /* names tierd refuses (bidi format characters, C1 controls, not UTF-8) beside ones it takes */
        o->n = 0;
        put_hello(o, 0, "job\xe2\x80\xae", 0, 1);        /* U+202E RIGHT-TO-LEFT OVERRIDE */
        put_hello(o, 0, "j\xc2\x9b" "1m", 0, 2);           /* U+009B CSI */
        put_hello(o, 0, "j\xd8\x9cob", 0, 3);              /* U+061C ARABIC LETTER MARK */
        put_hello(o, 0, "j\xc3\xb6" "b", 0, 4);               /* U+00F6: taken */
        put_create(o, 0, "w\xe2\x81\xa6", 4096, 5);      /* U+2066 LEFT-TO-RIGHT ISOLATE */
        put_create(o, 0, "x\xc2\x85", 4096, 6);           /* U+0085 NEXT LINE */
        put_create(o, 0, "y\xe2\x80\x8f", 4096, 7);      /* U+200F RIGHT-TO-LEFT MARK */
        put_create(o, 0, "z\xc0\xaf", 4096, 8);           /* overlong: not UTF-8 */
        put_create(o, 0, "\xe2\x80\x8d", 4096, 9);       /* U+200D ZERO WIDTH JOINER: not bidi */
        put_quota(o, 0, "job\xe2\x80\xad", 5, 10);       /* U+202D */
        put_op(o, 5 | 1 << 3 | 1 << 4);                 /* client 1 as uid 1000: the same job */
        put_hello(o, 1, "j\xc3\xb6" "b", 1, 1);
        put_hello(o, 1, "j\xc3\xb6" "b\xe2\x80\x8e", 0, 2);
        put_op(o, 4);
        put_op(o, 4 | 1 << 3);
        r = r ?: write_seed(dir, "seed-names", o);

        /* the job name "owned" (core.c: [quota] owner = 1000): taken by uid 1000, asked for by uid 0 before and after */
        o->n = 0;
        put_hello(o, 0, "owned", 0, 1);
        put_op(o, 4);
        put_op(o, 5 | 1 << 3 | 1 << 4);
        put_hello(o, 1, "owned", 0, 1);
        put_create(o, 1, "a", 4096, 2);
        put_op(o, 5);
        put_hello(o, 0, "owned", 1, 1);
        put_simple(o, 0, TIER__REQUEST__OP_OPEN, 0, 2);
        put_quota(o, 0, "owned", 0, 3);
        put_quota(o, 1, "owned", 9, 3);
        put_op(o, 4);
        put_op(o, 4 | 1 << 3);
        put_op(o, 5 | 1 << 3);                          /* uid 1000 gone: its job ends, the name is free */
        put_hello(o, 1, "owned", 0, 1);
        put_op(o, 4 | 1 << 3);
        r = r ?: write_seed(dir, "seed-owner", o);

        /* tensors up to the bounds: 64 a job, 96 a uid (core.c), two jobs of uid 0 */
        o->n = 0;
        put_hello(o, 0, "a", 0, 1);
        put_hello(o, 1, "b", 0, 1);
        for (unsigned k = 0; k < 66; k++) {
                char name[8];

                snprintf(name, sizeof(name), "%u", k);
                put_create(o, 0, name, 4096, 2 + k);
                if (k < 34)
                        put_create(o, 1, name, 4096, 2 + k);
                put_op(o, 4);
                put_op(o, 4 | 1 << 3);
        }
        put_simple(o, 0, TIER__REQUEST__OP_FREE, TID(1), 100);
        put_create(o, 1, "again", 4096, 101);
        put_op(o, 4 | 1 << 3);
        r = r ?: write_seed(dir, "seed-many", o);

        /* what a client must not do: fds beside requests, garbage, a request before hello, a second hello */
        o->n = 0;
        put_create(o, 1, "early", 4096, 1);
        put_op(o, 5 | 1 << 3);
        put_req(o, 1, &(Tier__Request) TIER__REQUEST__INIT, 1, 0xff);
        put_hello(o, 0, "job", 0, 2);
        put_create(o, 0, "big", 1ull << 40, 4);
        put_pin(o, 0, 99, LEVEL_HOST, false, 0, 5);
        put_pin(o, 0, TID(1), 7, false, 9, 6);
        fout_u8(o, 0);
        fout_u16(o, sizeof(garbage));
        fout_bytes(o, garbage, sizeof(garbage));
        fout_u8(o, 0x3c);
        put_op(o, 4);
        r = r ?: write_seed(dir, "seed-bad", o);

        free(o);
        return r;
}
