/* SPDX-License-Identifier: MIT */
/* test-ipc.c: the request layer driven in-process over a socketpair; the listener's stale-socket check. */

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/fence.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "daemon/sched/plan.h"
#include "proto/fence.h"
#include "proto/plan.h"
#include "proto/wire.h"
#include "tests/unit/fixture.h"
#include "tier.pb-c.h"

/* ---- getgrnam() counted and answered by the test: it links with -Wl,--wrap=getgrnam ------------ */

struct group *__real_getgrnam(const char *name);
struct group *__wrap_getgrnam(const char *name);

#define ADMIN_GID 4242
static unsigned getgrnam_calls;
/* tier-admin's lookup: 0 finds it, -1 finds no such group, an errno fails as NSS does */
static int getgrnam_answer;

struct group *__wrap_getgrnam(const char *name) {
        static char gr_name[] = "tier-admin", gr_passwd[] = "x";
        static char *members[] = { NULL };
        static struct group g = { .gr_name = gr_name, .gr_passwd = gr_passwd, .gr_gid = ADMIN_GID,
                                  .gr_mem = members };

        getgrnam_calls++;
        if (strcmp(name, "tier-admin") != 0)
                return __real_getgrnam(name);
        if (getgrnam_answer != 0) {
                errno = getgrnam_answer > 0 ? getgrnam_answer : 0;
                return NULL;
        }
        return &g;
}

/* ---- a connection over a socketpair, its requests dispatched by hand --------------------------- */

typedef struct Peer {
        Manager *m;
        Conn *conn;             /* tierd's side */
        int fd;                 /* the client's side */
        uint64_t seq;
} Peer;

static void peer_new(Manager *m, uid_t uid, gid_t gid, Peer *ret) {
        int sv[2];

        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
        *ret = (Peer) { .m = m, .fd = sv[1] };
        assert_int_equal(conn_new(m->server, sv[0], uid, gid, getpid(), &ret->conn), 0);
}

static void peer_free(Peer *p) {
        conn_close(p->conn);
        close(p->fd);
}

/* Dispatch @req as @p's next request and return the Response (free with tier__reply__free_unpacked). */
static Tier__Reply *peer_call(Peer *p, Tier__Request *req) {
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len = 0, n_fds = 0;
        Tier__Reply *reply;

        req->seq = ++p->seq;
        assert_true(rpc_dispatch(&p->m->rpc, p->conn, req) >= 0);
        assert_int_equal(wire_recv(p->fd, buf, sizeof(buf), &len, fds, &n_fds), 0);
        wire_close_fds(fds, n_fds);
        reply = tier__reply__unpack(NULL, len, buf);
        assert_non_null(reply);
        assert_int_equal(reply->kind_case, TIER__REPLY__KIND_RESPONSE);
        assert_int_equal(reply->response->seq, p->seq);
        return reply;
}

/* A Hello for @job as @rank; @says_writes: as libtier >= 1.1, naming the writes it holds (none here). */
static int peer_hello_rank(Peer *p, const char *job, uint32_t rank, bool says_writes) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;
        Tier__Reply *reply;
        int status;

        h.version = WIRE_PROTOCOL_VERSION;
        h.job = (char *) job;
        h.rank = rank;
        h.says_writes = says_writes;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        reply = peer_call(p, &req);
        status = reply->response->status;
        tier__reply__free_unpacked(reply, NULL);
        return status;
}

static int peer_hello(Peer *p, const char *job) {
        return peer_hello_rank(p, job, 0, false);
}

static int peer_quota_set(Peer *p, const char *job, unsigned weight) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaSet q = TIER__QUOTA_SET__INIT;
        Tier__Reply *reply;
        int status;

        q.job = (char *) job;
        q.weight = weight;
        req.op_case = TIER__REQUEST__OP_QUOTA_SET;
        req.quota_set = &q;
        reply = peer_call(p, &req);
        status = reply->response->status;
        tier__reply__free_unpacked(reply, NULL);
        return status;
}

static unsigned slots_taken(const Job *j) {
        unsigned n = 0;

        for (int i = 0; i < 4; i++)
                n += (unsigned) __builtin_popcountll(j->fence_slots[i]);
        return n;
}

static int open_fds(void) {
        int n = 0;

        for (int fd = 0; fd < 1024; fd++)
                if (fcntl(fd, F_GETFD) >= 0)
                        n++;
        return n;
}

/*
 * A Hello that fails halfway (no fd left for the connection's eventfd) takes
 * nothing with it: no fence slot, no eventfd, no out-of-order fence table.
 * Before, the table (and, had the eventfd been made, the eventfd) stayed
 * with the connection, and the client's next Hello overwrote them: leaked.
 */
static void test_hello_all_or_nothing(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        struct rlimit old, low;
        Peer p, q;
        Job *j;
        int fd, before;

        peer_new(m, 0, 0, &q);          /* the job exists already, with one rank */
        assert_int_equal(peer_hello(&q, "job"), 0);
        j = job_find(m->registry, "job");
        assert_non_null(j);
        assert_int_equal(slots_taken(j), 1);

        peer_new(m, 0, 0, &p);
        before = open_fds();
        /* no descriptor to spare: the lowest free one is the limit */
        assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
        fd = dup(0);
        assert_true(fd >= 0);
        close(fd);
        low = old;
        low.rlim_cur = (rlim_t) fd;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
        assert_int_equal(peer_hello(&p, "job"), -ENOMEM);
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);

        assert_false(p.conn->hello_done);
        assert_null(p.conn->job);
        assert_int_equal(p.conn->efd, -1);
        assert_null(p.conn->fence_completed);
        assert_int_equal(slots_taken(j), 1);
        assert_int_equal(j->n_conns, 1);
        assert_int_equal(open_fds(), before);

        /* the client may try again, and gets everything once */
        assert_int_equal(peer_hello(&p, "job"), 0);
        assert_ptr_equal(p.conn->job, j);
        assert_true(p.conn->efd >= 0);
        assert_non_null(p.conn->fence_completed);
        assert_int_equal(slots_taken(j), 2);
        assert_int_equal(j->n_conns, 2);
        assert_int_equal(open_fds(), before + 1);
        /* and a third Hello is a protocol error, not a second set */
        assert_int_equal(peer_hello(&p, "job"), -EPROTO);
        assert_int_equal(slots_taken(j), 2);

        peer_free(&p);
        peer_free(&q);
        fixture_free(m);
}

/* Names hold no control characters, C1 (U+0080..U+009F: U+009B is a terminal's CSI) included; other text is fine. */
static void test_names_refuse_c1_controls(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Peer p;

        peer_new(m, 0, 0, &p);
        assert_int_equal(peer_hello(&p, "evil\xc2\x9b" "31m"), -EINVAL);     /* was 0: a job so named */
        assert_null(job_find(m->registry, "evil\xc2\x9b" "31m"));
        assert_int_equal(peer_hello(&p, "caf\xc3\xa9 \xc2\xa0\xc2\xbf"), 0);      /* U+00A0, U+00BF: not controls */
        assert_int_equal(peer_quota_set(&p, "nel\xc2\x85", 5), -EINVAL);
        peer_free(&p);
        fixture_free(m);
}

/*
 * Whether a peer may set quotas is decided from the admin group looked up at
 * start (and reload), never by an NSS lookup per request in the event loop,
 * which may block on a directory service.
 */
static void test_admin_group_resolved_once(void **state) {
        Manager *m;
        Peer admin, user, owner;
        unsigned calls;

        getgrnam_calls = 0;
        m = fixture_new(32 * MiB, NULL, NULL);
        assert_int_equal(getgrnam_calls, 1);    /* at start */
        assert_true(m->rpc.have_admin_gid);
        assert_int_equal(m->rpc.admin_gid, ADMIN_GID);

        peer_new(m, 1000, 1000, &owner);
        assert_int_equal(peer_hello(&owner, "j"), 0);
        peer_new(m, 1001, ADMIN_GID, &admin);
        peer_new(m, 1002, 1002, &user);
        assert_int_equal(peer_hello(&admin, NULL), 0);
        assert_int_equal(peer_hello(&user, NULL), 0);

        calls = getgrnam_calls;
        for (int i = 0; i < 5; i++) {
                assert_int_equal(peer_quota_set(&admin, "j", 2 + (unsigned) i), 0);
                assert_int_equal(peer_quota_set(&user, "j", 3), -EPERM);
        }
        assert_int_equal(getgrnam_calls, calls);
        assert_int_equal(job_find(m->registry, "j")->weight, 6);

        /* a reload looks it up again */
        rpc_resolve_admin_group(&m->rpc);
        assert_int_equal(getgrnam_calls, calls + 1);

        peer_free(&admin);
        peer_free(&user);
        peer_free(&owner);
        fixture_free(m);
}

/*
 * A reload whose lookup of tier-admin fails (the group database: EIO, an LDAP
 * server down) keeps the gid found before; only "no such group" drops it.
 * The failure dropped the admin rights of every member until a later reload.
 */
static void test_admin_group_kept_when_lookup_fails(void **state) {
        Manager *m;
        Peer admin, owner;

        getgrnam_answer = 0;
        m = fixture_new(32 * MiB, NULL, NULL);
        assert_true(m->rpc.have_admin_gid);
        peer_new(m, 1000, 1000, &owner);
        assert_int_equal(peer_hello(&owner, "j"), 0);
        peer_new(m, 1001, ADMIN_GID, &admin);
        assert_int_equal(peer_hello(&admin, NULL), 0);

        getgrnam_answer = EIO;
        rpc_resolve_admin_group(&m->rpc);
        assert_true(m->rpc.have_admin_gid);
        assert_int_equal(m->rpc.admin_gid, ADMIN_GID);
        assert_int_equal(peer_quota_set(&admin, "j", 3), 0);

        getgrnam_answer = -1;           /* the group is gone */
        rpc_resolve_admin_group(&m->rpc);
        assert_false(m->rpc.have_admin_gid);
        assert_int_equal(peer_quota_set(&admin, "j", 4), -EPERM);

        getgrnam_answer = 0;
        peer_free(&admin);
        peer_free(&owner);
        fixture_free(m);
}

static uint64_t peer_create(Peer *p, const char *name, uint64_t size) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Create cr = TIER__CREATE__INIT;
        Tier__Reply *reply;
        uint64_t id;

        cr.name = (char *) name;
        cr.size = size;
        req.op_case = TIER__REQUEST__OP_CREATE;
        req.create = &cr;
        reply = peer_call(p, &req);
        assert_int_equal(reply->response->status, 0);
        assert_int_equal(reply->response->result_case, TIER__RESPONSE__RESULT_TENSOR);
        id = reply->response->tensor->tensor;
        tier__reply__free_unpacked(reply, NULL);
        return id;
}

/* An asynchronous evict of tensor @id to @tier: the Response's status. */
static int peer_evict_async(Peer *p, uint64_t id, int tier) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Evict ev = TIER__EVICT__INIT;
        Tier__Reply *reply;
        int status;

        ev.tensor = id;
        ev.tier = (Tier__Tier) tier;
        ev.async = true;
        req.op_case = TIER__REQUEST__OP_EVICT;
        req.evict = &ev;
        reply = peer_call(p, &req);
        status = reply->response->status;
        tier__reply__free_unpacked(reply, NULL);
        return status;
}

/* Write marker @seq for @phase into the plan page, as tier_phase_enter() does; @kick: and its eventfd. */
static void page_marker(Conn *c, uint64_t seq, uint32_t phase, bool kick) {
        PlanPage *pg = c->plan->page;
        uint64_t one = 1;

        pg->client.phase = phase;
        pg->client.mark_ns = 0;
        __atomic_store_n(&pg->client.marker_seq, seq, __ATOMIC_RELEASE);
        if (kick)
                assert_int_equal(write(c->plan->marker_fd, &one, sizeof(one)), (ssize_t) sizeof(one));
}

/*
 * tier_phase_enter() returns without a round trip, so the request a client sends
 * right after it can be read before the marker's eventfd wakes the loop.
 * tierd consumes a connection's pending marker before dispatching its next
 * request: an evict of a tensor only the previous phase pinned is not
 * refused as busy.  Before, the evict came first and got -EBUSY (tier.torch
 * counted that as "kept up": a write-down of placement B skipped).  The
 * order here is explicit: the loop does not run between the marker and the
 * request.
 */
static void test_marker_before_next_request(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__SubmitPlan sp = TIER__SUBMIT_PLAN__INIT;
        Tier__PlanPhase ph[2] = { TIER__PLAN_PHASE__INIT, TIER__PLAN_PHASE__INIT };
        Tier__PlanPhase *php[2] = { &ph[0], &ph[1] };
        Tier__PlanAccess acc[2] = { TIER__PLAN_ACCESS__INIT, TIER__PLAN_ACCESS__INIT };
        Tier__PlanAccess *accp[2] = { &acc[0], &acc[1] };
        Tier__Reply *reply;
        Tensor *a;
        uint64_t ida, idb;
        Peer p;

        peer_new(m, 0, 0, &p);
        assert_int_equal(peer_hello(&p, "job"), 0);
        ida = peer_create(&p, "a", 1 * MiB);
        idb = peer_create(&p, "b", 1 * MiB);
        /* phase 0 writes a in host, phase 1 b */
        acc[0].tensor = ida;
        acc[0].tier = TIER__TIER__TIER_HOST;
        acc[0].mode = PLAN_READ | PLAN_WRITE;
        acc[1].tensor = idb;
        acc[1].tier = TIER__TIER__TIER_HOST;
        acc[1].mode = PLAN_READ | PLAN_WRITE;
        ph[0].n_accesses = ph[1].n_accesses = 1;
        ph[0].accesses = &accp[0];
        ph[1].accesses = &accp[1];
        sp.n_phases = 2;
        sp.phases = php;
        req.op_case = TIER__REQUEST__OP_PLAN;
        req.plan = &sp;
        reply = peer_call(&p, &req);
        assert_int_equal(reply->response->status, 0);
        tier__reply__free_unpacked(reply, NULL);
        assert_non_null(p.conn->plan);

        /* phase 0, through the eventfd as usual: a is pinned in host once the loop has run */
        page_marker(p.conn, 1, 0, true);
        a = tensor_find(job_find(m->registry, "job"), ida);
        assert_non_null(a);
        FIXTURE_RUN_UNTIL(m, a->copy[LEVEL_HOST].pins != 0);
        assert_int_equal(a->copy[LEVEL_HOST].pins, 1);

        /* phase 1 is written (the eventfd not read yet), then the evict of a arrives */
        page_marker(p.conn, 2, 1, false);
        assert_int_equal(peer_evict_async(&p, ida, LEVEL_NVME), 0);
        assert_int_equal(a->copy[LEVEL_HOST].pins, 0);
        assert_int_equal(p.conn->plan->cur, 1);
        /* and the eviction ends with a written down (the next phase of the cycle, 0, may hold it in host again) */
        FIXTURE_RUN_UNTIL(m, copy_valid(a, LEVEL_NVME));
        assert_true(copy_valid(a, LEVEL_NVME));

        peer_free(&p);
        fixture_free(m);
}

/* ---- binding: a socket file is removed only when nobody listens on it ------------------------- */

static int listener(const char *path, int backlog) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

        assert_true(fd >= 0);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        assert_int_equal(listen(fd, backlog), 0);
        return fd;
}

static int connect_to(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

        assert_true(fd >= 0);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                int r = -errno;

                close(fd);
                return r;
        }
        return fd;
}

static void test_stale_socket_only_when_refused(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        char path[108];
        Server *s;
        int live, queued, probe;

        snprintf(path, sizeof(path), "/tmp/tierd-ipc-%d.sock", (int) getpid());
        (void) unlink(path);

        /*
         * A live daemon whose backlog is full answers connect() with EAGAIN:
         * its socket must stay.  (Before, any failed connect() removed it.)
         */
        live = listener(path, 0);
        queued = connect_to(path);
        assert_true(queued >= 0);
        assert_int_equal(connect_to(path), -EAGAIN);
        assert_int_equal(server_new(m->event, &m->config, NULL, NULL, &s), 0);
        assert_int_equal(server_listen(s, -1, path), -EADDRINUSE);
        s = server_free(s);
        close(queued);
        close(accept4(live, NULL, NULL, SOCK_CLOEXEC));  /* the daemon takes the one it had queued */
        probe = connect_to(path);       /* still the live daemon's socket */
        assert_true(probe >= 0);
        close(probe);

        /* a daemon that answers: refused as well */
        assert_int_equal(server_new(m->event, &m->config, NULL, NULL, &s), 0);
        assert_int_equal(server_listen(s, -1, path), -EADDRINUSE);
        s = server_free(s);

        /* a socket file nobody listens on (its daemon crashed): replaced */
        close(live);
        assert_int_equal(connect_to(path), -ECONNREFUSED);
        assert_int_equal(server_new(m->event, &m->config, NULL, NULL, &s), 0);
        assert_int_equal(server_listen(s, -1, path), 0);
        probe = connect_to(path);
        assert_true(probe >= 0);
        close(probe);
        s = server_free(s);             /* unlinks what it bound */
        assert_int_equal(access(path, F_OK), -1);
        fixture_free(m);
}

/*
 * connect() to a file that is not a socket is refused (ECONNREFUSED) just as to
 * a stale socket: tierd refuses to start and leaves the file alone.  Before, it
 * removed whatever was at the socket path (a -s typo could delete a file).
 */
static void test_stale_check_keeps_non_socket(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        char path[108], buf[8] = "";
        Server *s;
        int fd;

        snprintf(path, sizeof(path), "/tmp/tierd-ipc-file-%d", (int) getpid());
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "keep", 4), 4);
        close(fd);
        assert_int_equal(connect_to(path), -ECONNREFUSED);

        assert_int_equal(server_new(m->event, &m->config, NULL, NULL, &s), 0);
        assert_int_equal(server_listen(s, -1, path), -EEXIST);
        s = server_free(s);

        fd = open(path, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(read(fd, buf, sizeof(buf)), 4);
        assert_memory_equal(buf, "keep", 4);
        close(fd);
        assert_int_equal(unlink(path), 0);
        fixture_free(m);
}

/* ---- a fast-path pin that may write takes a ghost copy over ----------------------------------------- */

static int gh_done, gh_status;

static void gh_complete(Op *op, int status, const char *error) {
        (void) op;
        (void) error;
        gh_done++;
        gh_status = status;
}

static int peer_pin_or_unpin(Peer *p, uint64_t id, int tier, uint32_t mode, bool unpin, bool dirty) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Pin pin = TIER__PIN__INIT;
        Tier__Unpin un = TIER__UNPIN__INIT;
        Tier__Reply *reply;
        int status;

        if (unpin) {
                un.tensor = id;
                un.tier = (Tier__Tier) tier;
                un.dirty = dirty;
                req.op_case = TIER__REQUEST__OP_UNPIN;
                req.unpin = &un;
        } else {
                pin.tensor = id;
                pin.tier = (Tier__Tier) tier;
                pin.mode = mode;
                req.op_case = TIER__REQUEST__OP_PIN;
                req.pin = &pin;
        }
        reply = peer_call(p, &req);
        status = reply->response->status;
        tier__reply__free_unpacked(reply, NULL);
        return status;
}

/*
 * After a restart, rank 0's write-only ghost of 't' (its grant may not have reached it) is held until
 * rank 0 says Hello.  Rank 1 attaches first, pins the (valid) ghost copy read-write on the fast path,
 * writes it and unpins dirty: a client that write-pins a ghost copy makes it its own (copy_writers()),
 * so rank 0's later Hello must not undo rank 1's write (the ghost pin stays until that Hello).  It did:
 * pin_record() ran copy_writers() before the fast path's cp->pins++, so the ghost was not taken over,
 * and rank 0's Hello reverted the copy.
 */
static void test_fast_pin_takes_ghost_over(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Peer p1, p0;
        Job *j;
        Tensor *t;
        Copy *c;
        Op *op;

        peer_new(m, 0, 0, &p1);
        assert_int_equal(peer_hello_rank(&p1, "gj", 1, true), 0);
        j = job_find(m->registry, "gj");
        assert_non_null(j);
        (void) peer_create(&p1, "t", 1 * MiB);
        t = tensor_find_name(j, "t");
        c = &t->copy[LEVEL_HOST];

        /* as memstore_restore() puts back a write-only pin's copy of rank 0: valid, held (a ghost pin) */
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, gh_complete, NULL, NULL, &op), 0);
        op->discard = true;
        FIXTURE_RUN_UNTIL(m, gh_done);
        assert_int_equal(gh_status, 0);
        t->version++;
        c->version = t->version;
        c->unwritten = false;           /* (restore_copy() puts it back resident, at the write's version) */
        c->writer_rank = 0;
        t->ghost_rank = 0;
        t->ghost_ranks[LEVEL_HOST] = (RankSet) { .rank = { 0 }, .n = 1 };
        t->ghost |= 1u << LEVEL_HOST;
        t->ghost_unwritten |= 1u << LEVEL_HOST;
        tensor_pin_account(t, LEVEL_HOST, +1);
        assert_true(copy_valid(t, LEVEL_HOST));

        /* rank 1 writes it (read-write pin: the fast path, the copy being valid) */
        assert_int_equal(peer_pin_or_unpin(&p1, t->id, LEVEL_HOST, 3, false, false), 0);
        assert_int_equal(t->ghost_unwritten, 0);        /* taken over: nothing goes back */
        assert_int_equal(peer_pin_or_unpin(&p1, t->id, LEVEL_HOST, 0, true, true), 0);
        assert_int_equal(t->version, 2);
        /* (still held for rank 0 of before, which may write through its mapping, until its Hello) */
        assert_true(t->ghost && c->pins == 1);

        /* rank 0 comes back, naming no write it holds */
        peer_new(m, 0, 0, &p0);
        assert_int_equal(peer_hello_rank(&p0, "gj", 0, true), 0);
        assert_int_equal(t->version, 2);                /* rank 1's write stands */
        assert_true(!t->ghost && c->pins == 0);
        assert_false(t->lost);
        assert_true(copy_valid(t, LEVEL_HOST));

        peer_free(&p0);
        peer_free(&p1);
        fixture_free(m);
}

/* A Hello of @rank (says_writes) naming the write of @tensor in @tier (NULL: none) as held. */
static int peer_hello_held(Peer *p, const char *job, uint32_t rank, const char *tensor, int tier) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;
        Tier__HeldWrite hw = TIER__HELD_WRITE__INIT, *held[1] = { &hw };
        Tier__Reply *reply;
        int status;

        h.version = WIRE_PROTOCOL_VERSION;
        h.job = (char *) job;
        h.rank = rank;
        h.says_writes = true;
        hw.tensor = (char *) tensor;
        hw.tier = (Tier__Tier) tier;
        h.n_held_writes = tensor ? 1 : 0;
        h.held_writes = held;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        reply = peer_call(p, &req);
        status = reply->response->status;
        tier__reply__free_unpacked(reply, NULL);
        return status;
}

/* @t's host copy as memstore_restore() puts back a write-only pin's copy of rank @rank (as above). */
static void ghost_unwritten_host(Manager *m, Tensor *t, uint32_t rank) {
        Copy *c = &t->copy[LEVEL_HOST];
        Op *op;

        gh_done = 0;
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, gh_complete, NULL, NULL, &op), 0);
        op->discard = true;
        FIXTURE_RUN_UNTIL(m, gh_done);
        assert_int_equal(gh_status, 0);
        t->version++;
        c->version = t->version;
        c->unwritten = false;
        c->writer_rank = rank;
        t->ghost_rank = rank;
        t->ghost |= 1u << LEVEL_HOST;
        t->ghost_unwritten |= 1u << LEVEL_HOST;
        tensor_pin_account(t, LEVEL_HOST, +1);
}

/*
 * Two live connections whose Hello names the same job and rank (tier.torch's two engines of one job
 * on clients of the default rank 0) are allowed: rank is the client's word only, and nothing of a
 * connection's (fence slot, pins, plan, evict) is kept per rank.  What is, is what must outlive a
 * connection: the writes held when tierd went (the memory store records the writer's rank), decided
 * by the first Hello of that rank after the restart.  Once a client of the rank said it, a second
 * one's Hello, naming nothing, takes nothing from it.  The other order is the limit of a rank shared:
 * a client of it that comes back first decides for both, and a write-only copy the other one held
 * goes back to the version before (that client's pin is gone and its calls said -ERESTART, as for
 * any write it made just before tierd went; nothing it did not write counts as written).
 */
static void test_same_rank_connections(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Peer a, b, a2, b2;
        Tensor *t, *u;
        Job *j;

        (void) state;
        peer_new(m, 0, 0, &a);
        peer_new(m, 0, 0, &b);
        assert_int_equal(peer_hello_rank(&a, "sr", 0, true), 0);
        assert_int_equal(peer_hello_rank(&b, "sr", 0, true), 0);
        j = job_find(m->registry, "sr");
        assert_non_null(j);
        assert_int_equal(j->n_conns, 2);
        assert_int_not_equal(a.conn->fence_slot, b.conn->fence_slot);
        (void) peer_create(&a, "t", 1 * MiB);
        (void) peer_create(&a, "u", 1 * MiB);
        t = tensor_find_name(j, "t");
        u = tensor_find_name(j, "u");

        /* as after a restart: rank 0 held write-only pins of both (the new tierd's connections are new) */
        peer_free(&a);
        peer_free(&b);
        ghost_unwritten_host(m, t, 0);
        ghost_unwritten_host(m, u, 0);

        /* a's client comes back first, naming t: t counts as written; b's Hello (naming nothing) changes nothing */
        peer_new(m, 0, 0, &a2);
        peer_new(m, 0, 0, &b2);
        assert_int_equal(peer_hello_held(&a2, "sr", 0, "t", LEVEL_HOST), 0);
        assert_int_equal(t->ghost, 0);
        assert_int_equal(t->version, 1);
        assert_int_equal(peer_hello_held(&b2, "sr", 0, NULL, 0), 0);
        assert_int_equal(t->version, 1);
        assert_true(copy_valid(t, LEVEL_HOST));
        /* u (b's write, say) was decided by a2's Hello too, not naming it: back to zeros, whatever b2 says */
        assert_int_equal(u->ghost, 0);
        assert_int_equal(u->version, 0);
        assert_false(u->lost);

        peer_free(&a2);
        peer_free(&b2);
        fixture_free(m);
}

/* ---- one evict of a job at a time ------------------------------------------------------------------ */

/* Send @p a JobEvict of @job to NVMe; dispatched only: its Response comes once its ops end. */
static void peer_job_evict_send(Peer *p, const char *job, Tier__JobEvict *je, Tier__Request *req) {
        tier__request__init(req);
        tier__job_evict__init(je);
        je->job = (char *) job;
        je->tier = TIER__TIER__TIER_NVME;
        req->op_case = TIER__REQUEST__OP_JOB_EVICT;
        req->job_evict = je;
        req->seq = ++p->seq;
        assert_true(rpc_dispatch(&p->m->rpc, p->conn, req) >= 0);
}

/*
 * An operator's evict of a job (tierctl evict) runs on when its asker goes.  Asked again and again from
 * new connections (each gone before the reply), every ask queued one more evict op per tensor beside
 * the ones still running: without bound, and the same work each time.  Now one evict of a job runs at
 * a time: an ask after its asker went joins it (and gets its reply), any other is -EBUSY.  The order is
 * explicit: the loop does not run until the last ask, so no op can end in between.
 */
static void test_job_evict_asked_again(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tier__JobEvict je;
        Tier__Request req;
        Tier__Reply *reply;
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len = 0, n_fds = 0;
        Peer owner, ctl, busy;
        Tensor *t, *u;
        Job *j;

        (void) state;
        peer_new(m, 0, 0, &owner);
        assert_int_equal(peer_hello_rank(&owner, "ev", 0, true), 0);
        j = job_find(m->registry, "ev");
        assert_non_null(j);
        t = fixture_tensor(j, "t", 1 * MiB);
        u = fixture_tensor(j, "u", 1 * MiB);
        fixture_host_data(m, t, 1);     /* sole copies in host: their evict writes them down first */
        fixture_host_data(m, u, 2);
        assert_int_equal(t->op_refs, 0);

        for (int i = 0; i < 50; i++) {
                peer_new(m, 0, 0, &ctl);
                assert_int_equal(peer_hello(&ctl, ""), 0);
                peer_job_evict_send(&ctl, "ev", &je, &req);
                assert_int_equal(t->op_refs, 1);        /* the first ask's op, joined: not one per ask */
                assert_int_equal(u->op_refs, 1);
                if (i == 49)
                        break;
                peer_free(&ctl);
        }

        /* another ask while that one has its asker: refused, naming who asked it */
        peer_new(m, 0, 0, &busy);
        assert_int_equal(peer_hello(&busy, ""), 0);
        tier__request__init(&req);
        tier__job_evict__init(&je);
        je.job = (char *) "ev";
        je.tier = TIER__TIER__TIER_HOST;
        req.op_case = TIER__REQUEST__OP_JOB_EVICT;
        req.job_evict = &je;
        reply = peer_call(&busy, &req);
        assert_int_equal(reply->response->status, -EBUSY);
        assert_non_null(strstr(reply->response->error, "is being evicted to nvme already, asked by pid"));
        tier__reply__free_unpacked(reply, NULL);
        assert_int_equal(t->op_refs, 1);

        /* the last asker gets the reply of the one evict, which did the work once */
        FIXTURE_RUN_UNTIL(m, ctl.conn->evict == NULL);
        assert_null(ctl.conn->evict);
        assert_int_equal(wire_recv(ctl.fd, buf, sizeof(buf), &len, fds, &n_fds), 0);
        wire_close_fds(fds, n_fds);
        reply = tier__reply__unpack(NULL, len, buf);
        assert_non_null(reply);
        assert_int_equal(reply->kind_case, TIER__REPLY__KIND_RESPONSE);
        assert_int_equal(reply->response->seq, ctl.seq);
        assert_int_equal(reply->response->status, 0);
        assert_int_equal(reply->response->evict->evicted, 2);
        assert_int_equal(reply->response->evict->failed, 0);
        tier__reply__free_unpacked(reply, NULL);
        assert_int_equal(t->op_refs, 0);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_true(list_empty(&m->rpc.evicts));

        /* and the next ask is a new evict (nothing left to do: answered at once) */
        reply = peer_call(&busy, &req);
        assert_int_equal(reply->response->status, 0);
        tier__reply__free_unpacked(reply, NULL);

        peer_free(&busy);
        peer_free(&ctl);
        peer_free(&owner);
        fixture_free(m);
}

/*
 * A commit while a rollback of the job waits for transfers (the job frozen) is refused: it made the waiting
 * rollback roll back to the new commit, a no-op answered as a success.
 */
static void test_commit_refused_while_rollback_waits(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__JobCommit jc = TIER__JOB_COMMIT__INIT;
        Tier__Reply *reply;
        Peer p;
        Job *j;

        (void) state;
        peer_new(m, 0, 0, &p);
        assert_int_equal(peer_hello_rank(&p, "frozen", 0, true), 0);
        j = job_find(m->registry, "frozen");
        assert_non_null(j);
        j->frozen++;                    /* as a waiting rollback leaves it (commit.c rollback_request()) */
        jc.step = 9;
        req.op_case = TIER__REQUEST__OP_COMMIT;
        req.commit = &jc;
        reply = peer_call(&p, &req);
        assert_int_equal(reply->response->status, -EBUSY);
        assert_non_null(strstr(reply->response->error, "waits for the transfers in flight"));
        tier__reply__free_unpacked(reply, NULL);
        assert_false(j->committing);
        j->frozen--;
        reply = peer_call(&p, &req);
        assert_int_equal(reply->response->status, 0);
        tier__reply__free_unpacked(reply, NULL);
        assert_true(j->committing);
        peer_free(&p);
        fixture_free(m);
}

/*
 * A connection's pins are found by tensor and tier (ipc/pins.c): forgetting
 * N pins in the order they were recorded looks at a bounded number of
 * entries each, not at all the pins still held (a scan that was N^2 / 2
 * entries: 65536 pins unpinned in order took 6.6 s of tierd's loop), and
 * each forget returns the latest pin of its pair, whatever the others.
 */
/*
 * tierctl tensors pages through a job's tensors by offset: each page walked the job's list from its start to
 * the offset, so a listing was quadratic in the tensors.  A page asked for where the connection's last one
 * ended starts there (Conn.list_*); the tensors walked (Conn.list_steps) are counted, not timed.
 */
static void test_tensor_pages_resume(void **state) {
        enum { N = 4096, PAGE = 64 };
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        bool *seen = calloc(N, sizeof(bool));
        uint32_t offset = 0;
        Peer owner, ctl;
        Job *j;

        assert_non_null(seen);
        peer_new(m, 0, 0, &owner);
        assert_int_equal(peer_hello(&owner, "ls"), 0);
        j = job_find(m->registry, "ls");
        for (int i = 0; i < N; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "t%d", i);
                (void) fixture_tensor(j, name, 4096);
        }
        peer_new(m, 0, 0, &ctl);
        assert_int_equal(peer_hello(&ctl, ""), 0);
        for (;;) {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__JobTensors q = TIER__JOB_TENSORS__INIT;
                Tier__Reply *reply;
                Tier__TensorsReply *tr;
                size_t n;

                q.job = (char *) "ls";
                q.offset = offset;
                q.limit = PAGE;
                req.op_case = TIER__REQUEST__OP_JOB_TENSORS;
                req.job_tensors = &q;
                reply = peer_call(&ctl, &req);
                tr = reply->response->tensors;
                assert_non_null(tr);
                assert_int_equal(tr->total, N);
                for (size_t i = 0; i < tr->n_tensors; i++) {
                        int k = atoi(tr->tensors[i]->name + 1);

                        assert_false(seen[k]);          /* each once, in order */
                        assert_int_equal(k, (int) offset + (int) i);
                        seen[k] = true;
                }
                n = tr->n_tensors;
                tier__reply__free_unpacked(reply, NULL);
                offset += (uint32_t) n;
                if (n == 0 || offset >= N)
                        break;
        }
        assert_int_equal(offset, N);
        assert_true(ctl.conn->list_steps <= 3 * (uint64_t) N);  /* (from the start each page: about N^2 / 2 / PAGE) */
        free(seen);
        peer_free(&ctl);
        peer_free(&owner);
        fixture_free(m);
}

static void test_pins_found_by_index(void **state) {
        enum { N = 8192 };
        Tensor *t = calloc(N, sizeof(Tensor));  /* (read pins only: pin_record() looks at nothing in them) */
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tensor *a, *b;
        Conn c = {};
        Job *j;

        assert_non_null(t);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        a = fixture_tensor(j, "A", 4096);
        b = fixture_tensor(j, "B", 4096);
        for (int i = 0; i < N; i++)
                assert_int_equal(pin_record(&c, &t[i], LEVEL_HOST, false, false), 0);
        /* pins that may write, and a tensor pinned three times in one tier: read, read, write-only */
        assert_int_equal(pin_record(&c, a, LEVEL_VRAM, false, true), 0);
        assert_int_equal(pin_record(&c, a, LEVEL_HOST, false, false), 0);
        for (int i = 0; i < 2; i++)
                assert_int_equal(pin_record(&c, b, LEVEL_HOST, false, false), 0);
        assert_int_equal(pin_record(&c, b, LEVEL_HOST, true, false), 0);
        assert_int_equal(c.n_pins, N + 5);
        assert_int_equal(a->rw_pins, 1);

        c.pin_steps = 0;
        for (int i = 0; i < N; i++)
                assert_int_equal(pin_forget(&c, &t[i], LEVEL_HOST), 0);
        assert_true(c.pin_steps <= 4 * (uint64_t) N);   /* (a scan: about N^2 / 2) */
        assert_int_equal(pin_forget(&c, &t[5], LEVEL_HOST), -ENOENT);
        assert_int_equal(pin_forget(&c, a, LEVEL_NVME), -ENOENT);
        /* b in host: the write-only pin (the latest), then the two read ones */
        assert_int_equal(pin_forget(&c, b, LEVEL_HOST), PIN_WRITE_ONLY | PIN_WRITER);
        copy_writers(b, LEVEL_HOST, -1, 0);
        assert_int_equal(pin_forget(&c, b, LEVEL_HOST), 0);
        assert_int_equal(pin_record(&c, &t[7], LEVEL_HOST, false, false), 0);  /* a freed slot again */
        assert_int_equal(pin_forget(&c, b, LEVEL_HOST), 0);
        assert_int_equal(pin_forget(&c, b, LEVEL_HOST), -ENOENT);
        assert_int_equal(pin_forget(&c, a, LEVEL_VRAM), PIN_WRITER);
        copy_writers(a, LEVEL_VRAM, -1, 0);
        assert_int_equal(a->rw_pins, 0);
        assert_int_equal(pin_forget(&c, a, LEVEL_HOST), 0);
        assert_int_equal(pin_forget(&c, &t[7], LEVEL_HOST), 0);
        assert_int_equal(c.n_pins, 0);
        pins_free(&c);
        free(t);
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fast_pin_takes_ghost_over),
                cmocka_unit_test(test_commit_refused_while_rollback_waits),
                cmocka_unit_test(test_same_rank_connections),
                cmocka_unit_test(test_job_evict_asked_again),
                cmocka_unit_test(test_hello_all_or_nothing),
                cmocka_unit_test(test_admin_group_resolved_once),
                cmocka_unit_test(test_admin_group_kept_when_lookup_fails),
                cmocka_unit_test(test_stale_socket_only_when_refused),
                cmocka_unit_test(test_stale_check_keeps_non_socket),
                cmocka_unit_test(test_marker_before_next_request),
                cmocka_unit_test(test_pins_found_by_index),
                cmocka_unit_test(test_names_refuse_c1_controls),
                cmocka_unit_test(test_tensor_pages_resume),
        };

        return fixture_main("ipc", tests, sizeof(tests) / sizeof(tests[0]));
}
