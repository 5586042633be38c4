/* SPDX-License-Identifier: MIT */
/* fuzz-client.c: fuzz target: libtier against a hostile daemon (fuzzed replies and events, with fds). */

/*
 * Theory of operation: a training job links libtier, so a tierd that
 * sends garbage (a bug, a version mismatch, memory corruption) must get
 * errors from libtier, never a crash of the job.  Each input is:
 *
 *   u8 n (at most 24), then n pairs (code, arg): the libtier calls the
 *   "job" makes after tier_client_new() (create, open, pin, unpin, evict,
 *   prefetch, stat, status, process, wait, plans, phases, quotas, ...; bit
 *   4 of a code: first tier_client_set_timeout() of code >> 5 ms, 0..7);
 *   then packets until the end: u8 flags, u16 length, the bytes.
 *
 * A thread plays tierd on a listening socket in a temporary directory: it
 * accepts the job's connection and sends the packets in order.  flags bit
 * 0: first wait (at most 50 ms) for the next request; bit 1: the packet,
 * if it unpacks as a tier.Reply carrying a Response, gets the seq of the
 * latest request (else libtier rightly drops the connection at once);
 * bits 2..7: fds to pass beside it (a 1M memfd, a 4K memfd, an eventfd, a
 * socket, /dev/null, an O_PATH directory, in that order of fd index).  An
 * empty packet with bit 1 is a stall: the fake daemon neither reads nor
 * sends for 50 ms (longer than any timeout the calls set), so that a
 * request times out and libtier closes the connection.
 * After the last packet the fake daemon hangs up, so every call returns.
 *
 * Grants libtier returns are read and written end to end (a grant must lie
 * inside memory libtier mapped), and after tier_client_free() the process
 * must hold exactly the fds it held before.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <tier.h>

#include "proto/fence.h"
#include "proto/plan.h"
#include "proto/tier.pb-c.h"
#include "proto/wire.h"
#include "tests/fuzz/fuzz.h"

#define MAX_OPS 24
#define N_HANDLES 4
#define WAIT_MS 50

static const int packet_fd_kinds[6] = { FD_MEMFD_BIG, FD_MEMFD, FD_EVENTFD, FD_SOCKET, FD_DEVNULL, FD_DIR_PATH };

static char dir[] = "/tmp/tierd-fuzz-client.XXXXXX";
static char sock_path[sizeof(dir) + 16];
static int listen_fd = -1;
static bool verbose;            /* $TIER_FUZZ_LOG: say what each call returned */

typedef struct Server {
        FuzzIn in;              /* the packets */
        int fd;
} Server;

static void cleanup(void) {
        (void) unlink(sock_path);
        (void) rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };

        verbose = getenv("TIER_FUZZ_LOG") != NULL;
        FUZZ_CHECK(mkdtemp(dir));
        snprintf(sock_path, sizeof(sock_path), "%s/s", dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
        listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        FUZZ_CHECK(listen_fd >= 0);
        FUZZ_CHECK(bind(listen_fd, (struct sockaddr *) &sa, sizeof(sa)) == 0);
        FUZZ_CHECK(listen(listen_fd, 4) == 0);
        atexit(cleanup);
        return 0;
}

/* Read the requests queued (waiting up to @wait_ms for one); the seq of the latest; -1 once the job hung up. */
static int read_requests(Server *s, int wait_ms, uint64_t *seq) {
        static uint8_t buf[1u << 20];

        for (;;) {
                struct pollfd pfd = { .fd = s->fd, .events = POLLIN };
                int fds[WIRE_MAX_FDS];
                size_t len, n_fds;
                Tier__Request *req;
                int r;

                r = poll(&pfd, 1, wait_ms);
                if (r == 0)
                        return 0;
                r = wire_recv(s->fd, buf, sizeof(buf), &len, fds, &n_fds);
                if (r == -EAGAIN)
                        return 0;
                if (r < 0)
                        return -1;
                wire_close_fds(fds, n_fds);
                FUZZ_CHECK(n_fds == 0);         /* libtier never sends fds */
                req = tier__request__unpack(NULL, len, buf);
                FUZZ_CHECK(req);                /* nor anything but a tier.Request */
                if (req->seq != 0)              /* Ack carries none */
                        *seq = req->seq;
                tier__request__free_unpacked(req, NULL);
                wait_ms = 0;
        }
}

static void *server_main(void *userdata) {
        Server *s = userdata;
        uint64_t seq = 0;
        struct pollfd pfd = { .fd = listen_fd, .events = POLLIN };

        if (poll(&pfd, 1, 2000) <= 0)
                return NULL;
        s->fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (s->fd < 0)
                return NULL;

        while (s->in.n > 0) {
                uint8_t flags = fin_u8(&s->in), *packed = NULL;
                const uint8_t *p;
                size_t len = fin_bytes(&s->in, fin_u16(&s->in), &p);
                int fds[6];
                size_t n_fds = 0;
                int r;

                if (len == 0 && (flags & 2)) {  /* a stall: the job's request timeout, if any, runs out */
                        (void) poll(NULL, 0, WAIT_MS);
                        continue;
                }
                if (read_requests(s, (flags & 1) ? WAIT_MS : 0, &seq) < 0)
                        break;
                if (flags & 2) {
                        Tier__Reply *reply = tier__reply__unpack(NULL, len, p);

                        if (reply && reply->kind_case == TIER__REPLY__KIND_RESPONSE && reply->response) {
                                reply->response->seq = seq;
                                packed = malloc(tier__reply__get_packed_size(reply) + 1);
                                FUZZ_CHECK(packed);
                                len = tier__reply__pack(reply, packed);
                                p = packed;
                        }
                        if (reply)
                                tier__reply__free_unpacked(reply, NULL);
                }
                for (int k = 0; k < 6; k++)
                        if (flags & (4u << k))
                                fds[n_fds++] = fuzz_make_fd(packet_fd_kinds[k]);
                for (;;) {
                        r = len > 0 ? wire_send(s->fd, p, len, fds, n_fds) : 0;
                        if (r != -EAGAIN)
                                break;
                        /* the job is not reading: it waits for something else, or is done */
                        pfd = (struct pollfd) { .fd = s->fd, .events = POLLOUT };
                        if (poll(&pfd, 1, WAIT_MS) <= 0)
                                break;
                }
                wire_close_fds(fds, n_fds);
                free(packed);
                if (r < 0 && r != -EAGAIN)
                        break;
        }
        close(s->fd);           /* tierd hangs up: every call in progress returns */
        s->fd = -1;
        return NULL;
}

/* A grant must lie in memory this process mapped: touch every page of it. */
static void touch_grant(const struct tier_grant *g, uint64_t size) {
        volatile uint8_t *p = g->ptr;

        if (!p)
                return;
        FUZZ_CHECK(g->length == size);
        for (uint64_t off = 0; off < g->length; off += 4096)
                p[off] = (uint8_t) (p[off] + 1);
        if (g->length > 0)
                p[g->length - 1] = 0;
}

typedef struct Job {
        tier_client *c;
        tier_tensor *t[N_HANDLES];
        tier_fence fence;
        bool pinned[N_HANDLES][TIER_LEVEL_MAX];
} Job;

static void run_op(Job *j, uint8_t code, uint8_t arg) {
        tier_tensor **t = &j->t[arg % N_HANDLES];
        int tier = (arg >> 2) % TIER_LEVEL_MAX;
        struct tier_grant g;
        struct tier_stat st;
        struct tier_quota q = { .max = { 1 << 20, 0, 0 }, .weight = arg };
        uint64_t moved[TIER_LINK_SLOTS];
        char name[8], *text = NULL;
        tier_plan *plan = NULL;
        int r;

        snprintf(name, sizeof(name), "t%u", arg % N_HANDLES);
        if (code & 0x10)                /* a request timeout first: code >> 5 ms (0: none) */
                FUZZ_CHECK(tier_client_set_timeout(j->c, code >> 5) == 0);
        switch (code % 16) {
        case 0:
                if (!*t)
                        (void) tier_tensor_create(j->c, name, 4096u << (arg >> 5), t);
                break;
        case 1:
                if (!*t)
                        (void) tier_tensor_open(j->c, name, t);
                break;
        case 2:
        case 3:
                if (!*t)
                        break;
                memset(&g, 0, sizeof(g));
                r = code % 16 == 2 ? tier_pin(*t, tier, (arg >> 4) & 3, &g)
                                   : tier_pin_async(*t, tier, TIER_READ_WRITE, &g, &j->fence);
                if (r >= 0)
                        touch_grant(&g, tier_tensor_size(*t));
                break;
        case 4:
                if (*t)
                        (void) tier_unpin(*t, tier, arg & 0x80);
                break;
        case 5:
                if (*t)
                        (void) ((arg & 0x80) ? tier_evict_async(*t, tier, &j->fence) : tier_evict(*t, tier));
                break;
        case 6:
                if (*t)
                        (void) ((arg & 0x80) ? tier_prefetch_async(*t, tier, &j->fence) : tier_prefetch(*t, tier));
                break;
        case 7:
                if (*t)
                        (void) tier_tensor_stat(*t, &st);
                break;
        case 8:
                if (tier_client_status(j->c, arg & 1, &text) >= 0) {
                        FUZZ_CHECK(text);
                        free(text);
                }
                break;
        case 9:
                (void) tier_client_process(j->c);
                (void) tier_client_moved(j->c, moved);
                break;
        case 10:
                (void) tier_fence_done(j->c, j->fence + (arg & 3));
                (void) tier_fence_wait(j->c, j->fence, 0);
                break;
        case 11:
                if (tier_plan_new(j->c, &plan) < 0)
                        break;
                for (unsigned k = 0; k < N_HANDLES; k++)
                        if (j->t[k])
                                (void) tier_plan_add(plan, k & (arg & 1), j->t[k], k & 1 ? TIER_VRAM : TIER_HOST,
                                                     TIER_READ + (int) (k & 1));
                if (tier_plan_submit(plan) < 0)
                        tier_plan_free(plan);
                break;
        case 12:
                (void) tier_phase_enter(j->c, arg & 3);
                (void) tier_phase_stall(j->c);
                break;
        case 13:
                if (*t && tier_phase_grant(j->c, *t, tier, &g) >= 0)
                        touch_grant(&g, tier_tensor_size(*t));
                else
                        (void) tier_plan_end(j->c);
                break;
        case 14:
                if (*t && (arg & 0x80) && tier_tensor_destroy(*t) >= 0)
                        *t = NULL;
                else
                        *t = tier_tensor_close(*t);
                break;
        case 15:
                (void) ((arg & 1) ? tier_quota_set(j->c, TIER_QUOTA_JOB, 0, (arg & 2) ? "other" : NULL, &q, NULL)
                                  : tier_quota_get(j->c, TIER_QUOTA_JOB, 0, (arg & 2) ? "other" : NULL, &q));
                (void) tier_client_last_error(j->c);
                (void) tier_client_vram_backend(j->c);
                (void) tier_client_limit(j->c, tier);
                break;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        FuzzIn in = { data, size };
        uint8_t ops[2 * MAX_OPS];
        unsigned n_ops = fin_u8(&in) % (MAX_OPS + 1);
        int fds_before = fuzz_count_fds();
        Server s = { .fd = -1 };
        Job j = {};
        pthread_t thread;
        int r;

        for (unsigned i = 0; i < 2 * n_ops; i++)
                ops[i] = fin_u8(&in);
        s.in = in;
        FUZZ_CHECK(pthread_create(&thread, NULL, server_main, &s) == 0);

        r = tier_client_new(sock_path, "job", 0, &j.c);
        if (verbose)
                fprintf(stderr, "tier_client_new: %d %s\n", r, r < 0 ? tier_client_last_error(NULL) : "");
        if (r >= 0) {
                for (unsigned i = 0; i < n_ops; i++) {
                        run_op(&j, ops[2 * i], ops[2 * i + 1]);
                        if (verbose)
                                fprintf(stderr, "op %u (%u, %u): last error: %s\n", i, ops[2 * i] % 16,
                                        ops[2 * i + 1], tier_client_last_error(j.c));
                }
                for (unsigned k = 0; k < N_HANDLES; k++)
                        j.t[k] = tier_tensor_close(j.t[k]);
                j.c = tier_client_free(j.c);
        }
        FUZZ_CHECK(pthread_join(thread, NULL) == 0);
        if (fuzz_count_fds() != fds_before) {
                fprintf(stderr, "fds leaked: %d open before the input, %d after\n", fds_before, fuzz_count_fds());
                abort();
        }
        return 0;
}

/* ---- seeds: a conversation with a well-behaved tierd, then some a buggy one might have ------------ */

/* A packet of the fake daemon: a Response (seq patched in) or an Event. */
static void put_reply(FuzzOut *o, Tier__Reply *reply, uint8_t flags) {
        static uint8_t buf[8192];
        size_t n = tier__reply__pack(reply, buf);

        fout_u8(o, flags);
        fout_u16(o, (uint16_t) n);
        fout_bytes(o, buf, n);
}

#define WAIT_PATCH 3
#define FDS(mask) ((uint8_t) ((mask) << 2))     /* bit 0: 1M memfd, 1: 4K memfd, 2: eventfd, ... */

static void put_response(FuzzOut *o, Tier__Response *resp, uint8_t fds) {
        Tier__Reply reply = TIER__REPLY__INIT;

        reply.kind_case = TIER__REPLY__KIND_RESPONSE;
        reply.response = resp;
        put_reply(o, &reply, WAIT_PATCH | fds);
}

static void put_hello_reply(FuzzOut *o) {
        Tier__Response r = TIER__RESPONSE__INIT;
        Tier__HelloReply h = TIER__HELLO_REPLY__INIT;
        Tier__Limits l = TIER__LIMITS__INIT;
        uint64_t limit[3] = { 4 << 20, 8 << 20, 64 << 20 }, seg[3] = { 1 << 20, 1 << 20, 1 << 20 };

        l.max_message = 1 << 20;
        l.max_tensors = 64;
        l.max_inflight = 16;
        l.max_name = 255;
        l.tier_limit = limit;
        l.n_tier_limit = 3;
        l.tensor_max = limit;
        l.n_tensor_max = 3;
        l.segment_size = seg;
        l.n_segment_size = 3;
        h.version = TIER_PROTOCOL_VERSION;
        h.job_id = 1;
        h.limits = &l;
        h.fence_slot = 0;
        h.fence_page_fd = 0;            /* the 4K memfd */
        h.fence_eventfd = 1;            /* the eventfd */
        h.vram_backend = (char *) "emulated";
        h.vram_device = (char *) "";
        h.created = true;
        r.result_case = TIER__RESPONSE__RESULT_HELLO;
        r.hello = &h;
        put_response(o, &r, FDS(2 | 4));
}

static void put_tensor_reply(FuzzOut *o, uint64_t id, uint64_t size, const char *name) {
        Tier__Response r = TIER__RESPONSE__INIT;
        Tier__TensorInfo ti = TIER__TENSOR_INFO__INIT;

        ti.tensor = id;
        ti.size = size;
        ti.name = (char *) name;
        r.result_case = TIER__RESPONSE__RESULT_TENSOR;
        r.tensor = &ti;
        put_response(o, &r, 0);
}

/* A grant of @size bytes at @offset of segment 0, generation 1, which the reply sends (the 1M memfd) when @with_segment. */
static void put_pin_reply(FuzzOut *o, int tier, uint64_t offset, uint64_t size, uint64_t fence, bool with_segment) {
        Tier__Response r = TIER__RESPONSE__INIT;
        Tier__PinReply pr = TIER__PIN_REPLY__INIT;
        Tier__Grant g = TIER__GRANT__INIT;
        Tier__Segment seg = TIER__SEGMENT__INIT, *segp = &seg;

        g.segment = 0;
        g.generation = 1;
        g.offset = offset;
        g.length = size;
        g.tier = (Tier__Tier) tier;
        pr.grant = &g;
        pr.fence = fence;
        r.result_case = TIER__RESPONSE__RESULT_PIN;
        r.pin = &pr;
        if (with_segment) {
                seg.id = 0;
                seg.generation = 1;
                seg.tier = (Tier__Tier) tier;
                seg.size = 1 << 20;
                seg.fd_index = 0;
                seg.kind = (char *) "memfd";
                r.new_segments = &segp;
                r.n_new_segments = 1;
        }
        put_response(o, &r, with_segment ? FDS(1) : 0);
}

static void put_status(FuzzOut *o, int status, const char *error) {
        Tier__Response r = TIER__RESPONSE__INIT;

        r.status = status;
        r.error = (char *) error;
        put_response(o, &r, 0);
}

static void put_fence_reply(FuzzOut *o, uint64_t fence) {
        Tier__Response r = TIER__RESPONSE__INIT;
        Tier__FenceReply fr = TIER__FENCE_REPLY__INIT;

        fr.fence = fence;
        r.result_case = TIER__RESPONSE__RESULT_FENCE;
        r.fence = &fr;
        put_response(o, &r, 0);
}

static void put_event(FuzzOut *o, int kind, uint64_t a) {
        Tier__Reply reply = TIER__REPLY__INIT;
        Tier__Event e = TIER__EVENT__INIT;
        Tier__FenceFailed ff = TIER__FENCE_FAILED__INIT;
        Tier__Shutdown sd = TIER__SHUTDOWN__INIT;
        Tier__Revoke rv = TIER__REVOKE__INIT;

        switch (kind) {
        case 0:
                ff.fence = a;
                ff.status = -EIO;
                ff.error = (char *) "injected";
                e.kind_case = TIER__EVENT__KIND_FENCE_FAILED;
                e.fence_failed = &ff;
                break;
        case 1:
                sd.reason = (char *) "stopping";
                e.kind_case = TIER__EVENT__KIND_SHUTDOWN;
                e.shutdown = &sd;
                break;
        default:
                rv.segment = (uint32_t) a;
                rv.generation = 1;
                rv.timeout_ms = 100;
                e.kind_case = TIER__EVENT__KIND_REVOKE;
                e.revoke = &rv;
                break;
        }
        reply.kind_case = TIER__REPLY__KIND_EVENT;
        reply.event = &e;
        put_reply(o, &reply, 0);
}

static void put_status_reply(FuzzOut *o) {
        Tier__Response r = TIER__RESPONSE__INIT;
        Tier__StatusReply s = TIER__STATUS_REPLY__INIT;
        Tier__TierStatus ts[3], *tsp[3];
        Tier__JobStatus js = TIER__JOB_STATUS__INIT, *jsp = &js;
        Tier__JobTierUsage u = TIER__JOB_TIER_USAGE__INIT, *up = &u;
        Tier__PlanStatus ps = TIER__PLAN_STATUS__INIT, *psp = &ps;
        Tier__LinkStatus ls = TIER__LINK_STATUS__INIT, *lsp = &ls;
        Tier__TargetStatus tg = TIER__TARGET_STATUS__INIT, *tgp = &tg;

        for (int i = 0; i < 3; i++) {
                tier__tier_status__init(&ts[i]);
                ts[i].tier = (Tier__Tier) i;
                ts[i].backend = (char *) "memfd";
                ts[i].capacity = 1 << 22;
                ts[i].used = 1 << 20;
                tsp[i] = &ts[i];
        }
        ls.name = (char *) "host->nvme";
        ls.bytes = 1 << 20;
        ps.phases = 2;
        ps.step_links = &lsp;
        ps.n_step_links = 1;
        u.tier = TIER__TIER__TIER_HOST;
        u.used = 4096;
        js.id = 1;
        js.name = (char *) "job";
        js.usage = &up;
        js.n_usage = 1;
        js.plans = &psp;
        js.n_plans = 1;
        js.moved = &lsp;
        js.n_moved = 1;
        tg.path = (char *) "/var/lib/tierd/t0.img";
        s.version = (char *) "0.1.0";
        s.tiers = tsp;
        s.n_tiers = 3;
        s.jobs = &jsp;
        s.n_jobs = 1;
        s.links = &lsp;
        s.n_links = 1;
        s.targets = &tgp;
        s.n_targets = 1;
        s.policy = (char *) "timeline";
        r.result_case = TIER__RESPONSE__RESULT_STATUS_REPLY;
        r.status_reply = &s;
        put_response(o, &r, 0);
}

static void put_plan_reply(FuzzOut *o, uint32_t n_slots) {
        Tier__Response r = TIER__RESPONSE__INIT;
        Tier__PlanReply pr = TIER__PLAN_REPLY__INIT;

        pr.page_fd = 0;                 /* the 1M memfd */
        pr.page_size = plan_page_size(n_slots, 0);
        pr.marker_fd = 1;               /* the eventfd */
        pr.n_slots = n_slots;
        pr.policy = (char *) "timeline";
        r.result_case = TIER__RESPONSE__RESULT_PLAN;
        r.plan = &pr;
        put_response(o, &r, FDS(1 | 4));
}

static void put_ops(FuzzOut *o, const uint8_t *ops, unsigned n) {
        fout_u8(o, (uint8_t) n);
        fout_bytes(o, ops, 2 * n);
}

int fuzz_write_seeds(const char *dir_out) {
        FuzzOut *o = calloc(1, sizeof(FuzzOut));
        int r = 0;

        if (!o)
                return -ENOMEM;

        /* create t0 (4K), pin it in host (a grant in a new segment), unpin, evict async, stat, status */
        static const uint8_t ops1[] = { 0, 0, 2, 1 << 2, 4, 0x80 | 1 << 2, 5, 0x80 | 2 << 2, 10, 0, 7, 0, 8, 1, 8, 0 };
        put_ops(o, ops1, sizeof(ops1) / 2);
        put_hello_reply(o);
        put_tensor_reply(o, 1ull << 32, 4096, "t0");
        put_pin_reply(o, TIER_HOST, 8192, 4096, 0, true);
        put_status(o, 0, NULL);
        put_fence_reply(o, 1);
        put_event(o, 0, 1);
        put_status(o, -ENOENT, "no tensor with that id");
        put_status_reply(o);
        put_status_reply(o);
        r = r ?: fuzz_write_file(dir_out, "seed-session", o->buf, o->n);

        /* a plan over two tensors, a phase, the daemon revokes the segment and shuts down */
        o->n = 0;
        static const uint8_t ops2[] = { 0, 0, 0, 1, 11, 0, 12, 0, 13, 0, 9, 0, 2, 0, 13, 1 };
        put_ops(o, ops2, sizeof(ops2) / 2);
        put_hello_reply(o);
        put_tensor_reply(o, 1ull << 32, 4096, "t0");
        put_tensor_reply(o, 2ull << 32 | 1, 4096, "t1");
        put_plan_reply(o, 2);
        put_event(o, 2, 0);
        put_event(o, 1, 0);
        put_pin_reply(o, TIER_VRAM, 0, 4096, 3, true);
        put_status(o, 0, NULL);
        r = r ?: fuzz_write_file(dir_out, "seed-plan", o->buf, o->n);

        /* what a buggy daemon might say: a grant past its segment, a wrong seq, a hello without its fds */
        o->n = 0;
        static const uint8_t ops3[] = { 0, 0, 2, 1 << 2, 3, 0, 15, 1, 15, 0 };
        put_ops(o, ops3, sizeof(ops3) / 2);
        put_hello_reply(o);
        put_tensor_reply(o, 1ull << 32, 4096, "t0");
        put_pin_reply(o, TIER_HOST, (1 << 20) - 100, 4096, 0, true);
        put_pin_reply(o, TIER_HOST, 0, 1 << 21, 0, false);
        put_status(o, -EPERM, "needs root");
        r = r ?: fuzz_write_file(dir_out, "seed-bad-grants", o->buf, o->n);

        /* a grant shorter than the tensor, at the end of its segment: the job would write past the mapping */
        o->n = 0;
        put_ops(o, ops3, sizeof(ops3) / 2);
        put_hello_reply(o);
        put_tensor_reply(o, 1ull << 32, 4096, "t0");
        put_pin_reply(o, TIER_HOST, (1 << 20) - 100, 100, 0, true);
        put_pin_reply(o, TIER_HOST, (1 << 20) - 4096, 4096, 0, false);
        r = r ?: fuzz_write_file(dir_out, "seed-short-grant", o->buf, o->n);

        o->n = 0;
        put_ops(o, ops1, sizeof(ops1) / 2);
        {
                size_t at = o->n;       /* a hello reply sent at once, without the seq or the fds */


                put_hello_reply(o);
                o->buf[at] = 0;
        }
        r = r ?: fuzz_write_file(dir_out, "seed-bad-hello", o->buf, o->n);

        /*
         * a timeout of 5 ms (bit 4 of a code): a pin answered with fence 1, then a prefetch tierd does not
         * answer in time (a stall): the connection closes, fence 1 is frozen not done, later calls fail
         */
        o->n = 0;
#define TIMEOUT_5MS (0x10 | 5 << 5)
        static const uint8_t ops4[] = { 0 | TIMEOUT_5MS, 0, 3, 1 << 2, 6 | TIMEOUT_5MS, 0x80 | 2 << 2, 10, 0, 10, 1,
                                        2, 1 << 2 | 3 << 4, 9, 0, 8, 0 };
        put_ops(o, ops4, sizeof(ops4) / 2);
        put_hello_reply(o);
        put_tensor_reply(o, 1ull << 32, 4096, "t0");
        put_pin_reply(o, TIER_HOST, 8192, 4096, 1, true);
        fout_u8(o, 2);                  /* a stall */
        fout_u16(o, 0);
        put_fence_reply(o, 2);          /* too late */
        put_event(o, 0, 1);
        r = r ?: fuzz_write_file(dir_out, "seed-timeout", o->buf, o->n);

        free(o);
        return r;
}
