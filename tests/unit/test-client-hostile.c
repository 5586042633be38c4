/* SPDX-License-Identifier: MIT */
/* test-client-hostile.c: libtier against a scripted fake tierd that sends what no tierd would: the client refuses it, never crashes. */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <tier.h>

#include "proto/fence.h"
#include "tests/helpers/fake-cuda.h"
#include "tests/helpers/instrumented.h"
#include "tests/unit/test-client-hostile-fail.h"
#include "tests/unit/test-client-hostile.h"
#include "proto/macro.h"
#include "proto/plan.h"
#include "proto/tier.pb-c.h"
#include "proto/trace.h"
#include "proto/wire.h"


static int mk_memfd(uint64_t size) {
        int fd = memfd_create("fake", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, (off_t) size), 0);
        return fd;
}

static void send_resp(int fd, Tier__Response *resp, const int *fds, size_t n_fds) {
        Tier__Reply reply = TIER__REPLY__INIT;
        uint8_t *buf;
        size_t len;

        reply.kind_case = TIER__REPLY__KIND_RESPONSE;
        reply.response = resp;
        len = tier__reply__get_packed_size(&reply);
        buf = malloc(len);
        tier__reply__pack(&reply, buf);
        (void) wire_send(fd, buf, len, fds, n_fds);
        free(buf);
        for (size_t i = 0; i < n_fds; i++)
                close(fds[i]);
}

/* A sealed-enough memfd holding @len bytes of @data. */
static int memfd_with(const void *data, size_t len) {
        int fd = mk_memfd(len);

        assert_int_equal(pwrite(fd, data, len, 0), (ssize_t) len);
        return fd;
}

/* SC_REPLIES: a status of one job, its two tensors (one lost), and a trace of two transfers. */
static bool answer_reply(Fake *f, const Tier__Request *req, Tier__Response *resp, int *fds, size_t *n_fds) {
        static Tier__JobStatus job = TIER__JOB_STATUS__INIT;
        static Tier__JobStatus *jobp[1] = { &job };
        static Tier__StatusReply sr = TIER__STATUS_REPLY__INIT;
        static Tier__TensorEntry te[2] = { TIER__TENSOR_ENTRY__INIT, TIER__TENSOR_ENTRY__INIT };
        static Tier__TensorEntry *tep[2] = { &te[0], &te[1] };
        static Tier__TensorsReply tr = TIER__TENSORS_REPLY__INIT;
        static Tier__TraceReply trc = TIER__TRACE_REPLY__INIT;
        static const char metrics[] = "# TYPE tier_up gauge\ntier_up 1\n";
        bool in = f->inline_replies && __atomic_load_n(f->inline_replies, __ATOMIC_ACQUIRE);

        job.id = 1;
        job.name = (char *) (f->job_name ? f->job_name : "job");
        job.connections = 1;
        sr.version = (char *) "fake";
        sr.n_jobs = 1;
        sr.jobs = jobp;
        switch (req->op_case) {
        case TIER__REQUEST__OP_STATUS:
                if (req->status->prometheus && in) {
                        resp->result_case = TIER__RESPONSE__RESULT_METRICS_TEXT;
                        resp->metrics_text = (char *) metrics;
                } else if (req->status->prometheus) {
                        fds[(*n_fds)++] = memfd_with(metrics, sizeof(metrics) - 1);
                        resp->result_case = TIER__RESPONSE__RESULT_METRICS_FD;
                        resp->metrics_fd = 0;
                } else if (in) {
                        resp->result_case = TIER__RESPONSE__RESULT_STATUS_REPLY;
                        resp->status_reply = &sr;
                } else {
                        uint8_t buf[1024];
                        size_t len = tier__status_reply__get_packed_size(&sr);

                        assert_true(len <= sizeof(buf));
                        (void) tier__status_reply__pack(&sr, buf);
                        fds[(*n_fds)++] = memfd_with(buf, len);
                        resp->result_case = TIER__RESPONSE__RESULT_STATUS_FD;
                        resp->status_fd = 0;
                }
                return true;
        case TIER__REQUEST__OP_JOB_TENSORS:
                te[0].tensor = 1;
                te[0].name = (char *) "w";
                te[0].size = 4096;
                te[0].state = (char *) "data";
                te[1].tensor = 2;
                te[1].name = (char *) "g";
                te[1].size = 4096;
                te[1].state = (char *) "lost";
                te[1].lost_why = (char *) "fake tierd lost it";
                tr.job = (char *) "job";
                tr.total = 2;
                tr.offset = req->job_tensors->offset;
                tr.n_tensors = req->job_tensors->offset == 0 ? 2 : 0;
                tr.tensors = tep;
                resp->result_case = TIER__RESPONSE__RESULT_TENSORS;
                resp->tensors = &tr;
                return true;
        case TIER__REQUEST__OP_TRACE_STOP: {
                TraceRecord rec[2] = {};

                for (int i = 0; i < 2; i++) {
                        rec[i].kind = TRACE_XFER;
                        rec[i].ts = rec[i].t0 = rec[i].t1 = 1000 + (uint64_t) i;
                        rec[i].bytes = 4096;
                }
                fds[(*n_fds)++] = memfd_with(rec, sizeof(rec));
                trc.records = 2;
                trc.record_size = sizeof(TraceRecord);
                trc.fd = 0;
                trc.start_ns = 1;
                trc.stop_ns = 2000;
                resp->result_case = TIER__RESPONSE__RESULT_TRACE;
                resp->trace = &trc;
                return true;
        }
        default:
                return false;
        }
}

static void answer(Fake *f, int fd, const Tier__Request *req) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        int fds[4];
        size_t n_fds = 0;

        resp.seq = req->seq;
        if (f->scenario == SC_REPLIES && answer_reply(f, req, &resp, fds, &n_fds)) {
                send_resp(fd, &resp, fds, n_fds);
                return;
        }
        switch (req->op_case) {
        case TIER__REQUEST__OP_HELLO: {
                static Tier__HelloReply h = TIER__HELLO_REPLY__INIT;
                static Tier__Limits l = TIER__LIMITS__INIT;

                l.max_message = 1 << 20;
                l.max_name = 255;
                h.version = TIER_PROTOCOL_VERSION;
                h.job_id = 1;
                h.limits = &l;
                h.fence_page_fd = 0;
                h.fence_eventfd = 1;
                h.vram_backend = (char *) "emulated";
                h.vram_device = (char *) "";
                fds[n_fds++] = mk_memfd(4096);
                fds[n_fds++] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
                resp.result_case = TIER__RESPONSE__RESULT_HELLO;
                resp.hello = &h;
                break;
        }
        case TIER__REQUEST__OP_CREATE:
        case TIER__REQUEST__OP_OPEN: {          /* (opened again after a reconnect: 4096 bytes) */
                static Tier__TensorInfo ti = TIER__TENSOR_INFO__INIT;

                ti.tensor = 1;
                if (req->op_case == TIER__REQUEST__OP_OPEN) {
                        ti.size = 4096;
                        ti.name = req->open->name;
                } else {
                        ti.size = req->create->size;
                        ti.name = req->create->name;
                }
                resp.result_case = TIER__RESPONSE__RESULT_TENSOR;
                resp.tensor = &ti;
                break;
        }
        case TIER__REQUEST__OP_PLAN: {
                static Tier__PlanReply pr = TIER__PLAN_REPLY__INIT;
                uint64_t size = plan_page_size(1, 0);

                pr.page_fd = 0;
                pr.marker_fd = 1;
                pr.n_slots = 1;
                if (f->scenario == SC_PLAN_SHORT_MEMFD) {
                        pr.page_size = 64 * 1024;
                        fds[n_fds++] = mk_memfd(0);
                } else {
                        PlanPage *pg;

                        pr.page_size = size;
                        fds[n_fds++] = mk_memfd(size);
                        pg = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
                        assert_true(pg != MAP_FAILED);
                        pg->daemon.error = INT64_C(1) << 32;    /* "failed", low 32 bits zero */
                        munmap(pg, size);
                }
                fds[n_fds++] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
                resp.result_case = TIER__RESPONSE__RESULT_PLAN;
                resp.plan = &pr;
                break;
        }
        case TIER__REQUEST__OP_PIN:
        case TIER__REQUEST__OP_GET_SEGMENTS: {
                static Tier__PinReply pin = TIER__PIN_REPLY__INIT;
                static Tier__Grant g = TIER__GRANT__INIT;
                static Tier__Segment seg = TIER__SEGMENT__INIT;
                static Tier__Segment *segp[1] = { &seg };
                static Tier__SegmentsReply sr = TIER__SEGMENTS_REPLY__INIT;

                seg.id = 0;
                seg.generation = 1;
                seg.tier = TIER__TIER__TIER_HOST;
                seg.size = UINT64_C(1) << 30;
                seg.fd_index = 0;
                seg.kind = (char *) "memfd";
                fds[n_fds++] = mk_memfd(seg.size);
                resp.new_segments = segp;
                resp.n_new_segments = 1;
                if (req->op_case == TIER__REQUEST__OP_PIN) {
                        g.segment = 0;
                        g.generation = 1;
                        g.offset = 0;
                        g.length = 4096;
                        g.tier = TIER__TIER__TIER_HOST;
                        pin.grant = &g;
                        pin.fence = f->scenario == SC_FENCE_FAILED || f->scenario == SC_GONE ||
                                    f->scenario == SC_GONE_BACK ? 1 : 0;
                        resp.result_case = TIER__RESPONSE__RESULT_PIN;
                        resp.pin = &pin;
                } else {
                        resp.result_case = TIER__RESPONSE__RESULT_SEGMENTS;
                        resp.segments = &sr;
                }
                break;
        }
        case TIER__REQUEST__OP_UNPIN:
        case TIER__REQUEST__OP_END_PLAN:
                break;
        case TIER__REQUEST__OP_ACK:
                return;
        default:
                resp.status = -ENOSYS;
                resp.error = (char *) "fake tierd: not scripted";
                break;
        }
        send_resp(fd, &resp, fds, n_fds);
}

static void send_shutdown(int fd, const char *reason) {
        Tier__Reply reply = TIER__REPLY__INIT;
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__Shutdown sh = TIER__SHUTDOWN__INIT;
        uint8_t buf[256];
        size_t len;

        sh.reason = (char *) reason;
        ev.kind_case = TIER__EVENT__KIND_SHUTDOWN;
        ev.shutdown = &sh;
        reply.kind_case = TIER__REPLY__KIND_EVENT;
        reply.event = &ev;
        len = tier__reply__get_packed_size(&reply);
        assert_true(len <= sizeof(buf));
        tier__reply__pack(&reply, buf);
        (void) wire_send(fd, buf, len, NULL, 0);
}

static void send_fence_failed(int fd, uint64_t fence, const char *error) {
        Tier__Reply reply = TIER__REPLY__INIT;
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__FenceFailed ff = TIER__FENCE_FAILED__INIT;
        uint8_t buf[256];
        size_t len;

        ff.fence = fence;
        ff.status = -EIO;
        ff.error = (char *) error;
        ev.kind_case = TIER__EVENT__KIND_FENCE_FAILED;
        ev.fence_failed = &ff;
        reply.kind_case = TIER__REPLY__KIND_EVENT;
        reply.event = &ev;
        len = tier__reply__get_packed_size(&reply);
        assert_true(len <= sizeof(buf));
        tier__reply__pack(&reply, buf);
        (void) wire_send(fd, buf, len, NULL, 0);
}

/* One connection, to its end. */
static void fake_serve(Fake *f, int fd) {
        static uint8_t buf[1 << 20];

        for (;;) {
                int fds[WIRE_MAX_FDS];
                size_t len, n_fds;
                Tier__Request *req;

                if (wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds) < 0)
                        break;
                wire_close_fds(fds, n_fds);
                req = tier__request__unpack(NULL, len, buf);
                if (!req)
                        break;
                answer(f, fd, req);
                if (f->scenario == SC_SHUTDOWN && req->op_case == TIER__REQUEST__OP_HELLO) {
                        send_shutdown(fd, "fake tierd stops");
                        tier__request__free_unpacked(req, NULL);
                        break;          /* and closes the connection */
                }
                if (f->scenario == SC_FENCE_FAILED && req->op_case == TIER__REQUEST__OP_PIN)
                        send_fence_failed(fd, 1, "fake tierd: the read failed");
                if ((f->scenario == SC_GONE || (f->scenario == SC_GONE_BACK && f->served == 0)) &&
                    req->op_case == TIER__REQUEST__OP_PIN) {
                        tier__request__free_unpacked(req, NULL);
                        break;          /* gone, its fence never done */
                }
                tier__request__free_unpacked(req, NULL);
        }
        close(fd);
}

/* SC_REPLIES and SC_GONE_BACK serve one connection after another (a client reconnects), until fake_stop() */
static void *fake_main(void *userdata) {
        Fake *f = userdata;

        (void) pthread_barrier_wait(&f->started);
        do {
                int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);

                if (fd < 0 || __atomic_load_n(&f->stopping, __ATOMIC_ACQUIRE)) {
                        if (fd >= 0)
                                close(fd);
                        break;
                }
                fake_serve(f, fd);
                f->served++;
        } while (f->scenario == SC_REPLIES || f->scenario == SC_GONE_BACK);
        return NULL;
}

void fake_start(Fake *f, int scenario) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };

        f->scenario = scenario;
        f->stopping = false;
        snprintf(f->dir, sizeof(f->dir), "/tmp/fake-tierd.XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->path, sizeof(f->path), "%s/s", f->dir);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
        f->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        assert_true(f->listen_fd >= 0);
        assert_int_equal(bind(f->listen_fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        assert_int_equal(listen(f->listen_fd, 4), 0);
        assert_int_equal(pthread_barrier_init(&f->started, NULL, 2), 0);
        assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
        (void) pthread_barrier_wait(&f->started);
}

void fake_stop(Fake *f) {
        if (f->scenario == SC_REPLIES || f->scenario == SC_GONE_BACK) {
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

                /* the fake waits in accept4() for the next client: this one tells it to end */
                __atomic_store_n(&f->stopping, true, __ATOMIC_RELEASE);
                snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
                assert_true(fd >= 0);
                assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
                close(fd);
        }
        pthread_join(f->thread, NULL);
        pthread_barrier_destroy(&f->started);
        close(f->listen_fd);
        unlink(f->path);
        rmdir(f->dir);
}

/* Run @fn in a child (so a crash is seen as one); its exit status, or 128 + signal. */
int in_child(int (*fn)(const char *path), const char *path) {
        pid_t pid = fork();
        int st;

        assert_true(pid >= 0);
        if (pid == 0) {
                signal(SIGBUS, SIG_DFL);
                signal(SIGSEGV, SIG_DFL);
                signal(SIGALRM, SIG_DFL);
                alarm(10);
                _exit(fn(path));
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

static int submit_and_enter(const char *path) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        tier_plan *p = NULL;
        int r;

        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0 ||
            tier_plan_new(c, &p) < 0 || tier_plan_add(p, 0, t, TIER_HOST, TIER_READ) < 0)
                return 2;
        r = tier_plan_submit(p);
        if (r < 0) {
                tier_plan_free(p);
                fprintf(stderr, "submit: %d %s\n", r, tier_client_last_error(c));
                r = 0;          /* refused: fine */
        } else {
                r = tier_phase_enter(c, 0);
                fprintf(stderr, "tier_phase_enter: %d (%s)\n", r, tier_client_last_error(c));
                r = r < 0 ? 0 : 3;      /* 3: success claimed though tierd never said ready */
        }
        tier_tensor_close(t);           /* (all freed: valgrind counts a leak as a failure) */
        tier_client_free(c);
        return r;
}

/* A plan page memfd shorter than the page_size tierd claims: the client must refuse it, not SIGBUS. */
static void test_plan_page_short_memfd(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_PLAN_SHORT_MEMFD);
        st = in_child(submit_and_enter, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 128 + SIGBUS (135) */
}

/* daemon.error with zero low 32 bits is still an error: tier_phase_enter() must not return 0. */
static void test_phase_error_truncated(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_PLAN_ERROR_WRAPS);
        st = in_child(submit_and_enter, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 3 */
}

static int pin_under_rlimit(const char *path) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        struct rlimit rl;
        int r;

        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0)
                return 2;
        /* room for the process as it is and a little more, not for a 1 GiB mapping */
        {
                FILE *fp = fopen("/proc/self/statm", "r");
                unsigned long pages = 0;

                if (!fp || fscanf(fp, "%lu", &pages) != 1)
                        return 2;
                fclose(fp);
                rl.rlim_cur = rl.rlim_max = pages * 4096ul + (256ul << 20);
        }
        if (setrlimit(RLIMIT_AS, &rl) < 0)
                return 2;
        r = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);
        fprintf(stderr, "tier_pin: %d (%s)\n", r, tier_client_last_error(c));
        tier_tensor_close(t);
        tier_client_free(c);
        return r == -ENOMEM ? 0 : 4;
}

/* Under ASan (its shadow memory) or valgrind (its own mappings) RLIMIT_AS means something else. */
static bool address_space_limit_works(void) {
        return !test_under_asan() && !test_under_valgrind();
}

/* tier_pin(3): -ENOMEM "Out of memory, or no address space left to map the copy", not -EPROTO. */
static void test_pin_no_address_space(void **state) {
        Fake f = {};
        int st;

        if (!address_space_limit_works())
                skip();

        fake_start(&f, SC_SEGMENT_HUGE);
        st = in_child(pin_under_rlimit, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 4: -EPROTO */
}

static int plan_after_client_free(const char *path) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        tier_plan *p = NULL, *q = NULL;
        int r, s;

        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0 ||
            tier_plan_new(c, &p) < 0 || tier_plan_add(p, 0, t, TIER_HOST, TIER_READ) < 0 ||
            tier_plan_new(c, &q) < 0)
                return 2;
        q = tier_plan_free(q);          /* a plan freed before its client is no longer the client's */
        tier_client_free(c);
        r = tier_plan_add(p, 1, t, TIER_HOST, TIER_READ);
        s = tier_plan_submit(p);        /* (read the freed client: valgrind's error, or a crash) */
        fprintf(stderr, "after tier_client_free(): tier_plan_add: %d, tier_plan_submit: %d\n", r, s);
        tier_plan_free(p);
        tier_tensor_close(t);
        return r == -ENOTCONN && s == -ENOTCONN ? 0 : 5;
}

/* A plan not submitted outlives its client, as a tensor handle does: -ENOTCONN, no use after free. */
static void test_plan_outlives_client(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_PLAIN);
        st = in_child(plan_after_client_free, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 5, 1 (valgrind) or 139 (SIGSEGV) */
}

static int moved_refused(const char *path) {
        uint64_t bytes[TIER_LINK_SLOTS];
        tier_client *c = NULL;
        int r;

        if (tier_client_new(path, "job", 0, &c) < 0)
                return 2;
        for (size_t i = 0; i < TIER_LINK_SLOTS; i++)
                bytes[i] = 1000 + i;
        r = tier_client_moved(c, bytes);        /* the fake refuses the status request */
        fprintf(stderr, "tier_client_moved: %d (%s)\n", r, tier_client_last_error(c));
        tier_client_free(c);
        if (r != -ENOSYS)
                return 6;
        for (size_t i = 0; i < TIER_LINK_SLOTS; i++)
                if (bytes[i] != 1000 + i)
                        return 7;
        return 0;
}

/* libtier(3): outputs are left alone on failure; tier_client_moved() zeroed its array first. */
static void test_moved_left_alone_on_failure(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_PLAIN);
        st = in_child(moved_refused, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 7 */
}

static int process_after_shutdown(const char *path) {
        struct pollfd pfd = { .events = POLLRDHUP };
        tier_client *c = NULL;
        int r, again;

        if (tier_client_new(path, "job", 0, &c) < 0)
                return 2;
        /* until the fake has closed the connection (the Shutdown event queued before it) */
        pfd.fd = tier_client_fd(c);
        while (!(pfd.revents & (POLLRDHUP | POLLHUP)))
                if (poll(&pfd, 1, -1) < 0)
                        return 2;
        r = tier_client_process(c);
        again = tier_client_process(c);
        fprintf(stderr, "tier_client_process: %d, then %d (%s)\n", r, again, tier_client_last_error(c));
        tier_client_free(c);
        return r == -ESHUTDOWN && again == -ESHUTDOWN ? 0 : 8;
}

/* tier_client_process(3): -ESHUTDOWN once tierd announced its stop, also when it closed the connection since. */
static void test_process_after_shutdown(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_SHUTDOWN);
        st = in_child(process_after_shutdown, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 8: -ECONNRESET first */
}

static int grant_without_plan(const char *path) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        int r;

        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0)
                return 2;
        r = tier_phase_grant(c, t, TIER_HOST, &g);
        fprintf(stderr, "tier_phase_grant: %d (%s)\n", r, tier_client_last_error(c));
        tier_tensor_close(t);
        tier_client_free(c);
        return r == -EINVAL ? 0 : 9;
}

/* tier_phase_enter(3): -EINVAL when the client runs no plan, for tier_phase_grant() too (it said -ENOENT). */
static void test_phase_grant_without_plan(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_PLAIN);
        st = in_child(grant_without_plan, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 9 */
}

/* The text of the last failure must be its own: @what failed with @r, and its text names @want, not tierd's earlier reason. */
static int own_text(tier_client *c, const char *what, int r, const char *want) {
        const char *text = tier_client_last_error(c);

        fprintf(stderr, "%s: %d (%s)\n", what, r, text);
        if (r != -EINVAL)
                return 1;
        if (strstr(text, "not scripted") || !strstr(text, want))
                return 1;
        return 0;
}

static int argument_errors(const char *path) {
        struct tier_quota q = {}, qr;
        struct tier_grant g;
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        tier_plan *p = NULL;
        char *status = NULL;
        int r, bad = 0;

        /* (connected first: the fake serves one connection, and waits for it) */
        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0 ||
            tier_plan_new(c, &p) < 0)
                return 2;
        /* no client made: tier_client_last_error(NULL) says why */
        r = tier_client_new(path, "job", 0, NULL);
        if (r != -EINVAL || !strstr(tier_client_last_error(NULL), "ret is NULL"))
                return 8;
        r = tier_quota_get(c, TIER_QUOTA_JOB, 0, "job", &qr);    /* the fake refuses it: tierd's reason */
        if (r != -ENOSYS || !strstr(tier_client_last_error(c), "not scripted"))
                return 9;

        /* each refused before anything is sent: its own reason, never the one above */
        bad += own_text(c, "pin mode 0", tier_pin(t, TIER_HOST, 0, &g), "mode 0");
        bad += own_text(c, "pin tier 7", tier_pin(t, 7, TIER_READ, &g), "7 is not a tier");
        bad += own_text(c, "pin NULL grant", tier_pin(t, TIER_HOST, TIER_READ, NULL), "ret is NULL");
        bad += own_text(c, "pin_async NULL fence", tier_pin_async(t, TIER_HOST, TIER_READ, &g, NULL), "ret_fence");
        bad += own_text(c, "evict tier 9", tier_evict(t, 9), "9 is not a tier");
        bad += own_text(c, "stat NULL", tier_tensor_stat(t, NULL), "ret is NULL");
        q.min_set = 1u << 7;
        bad += own_text(c, "quota_set min_set", tier_quota_set(c, TIER_QUOTA_JOB, 0, "job", &q, NULL), "min_set");
        bad += own_text(c, "quota_get kind 99", tier_quota_get(c, 99, 0, NULL, &qr), "99 is not a quota kind");
        bad += own_text(c, "status format 42", tier_client_status(c, 42, &status), "42 is not a status format");
        bad += own_text(c, "plan_add mode 5", tier_plan_add(p, 0, t, TIER_HOST, 5), "mode 5");
        bad += own_text(c, "phase_grant NULL", tier_phase_grant(c, t, TIER_HOST, NULL), "ret is NULL");
        bad += own_text(c, "set_reconnect -1", tier_client_set_reconnect(c, -1), "reconnect timeout");
        tier_plan_free(p);
        tier_tensor_close(t);
        tier_client_free(c);
        return bad ? 10 : 0;
}

/* tier_client_new(3), NOTES: a call refused by its own argument checks says why, not an earlier call's reason. */
static void test_argument_errors_own_text(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_PLAIN);
        st = in_child(argument_errors, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 8 (no text for tier_client_new()) or 10 (tierd's stale text) */
}

/*
 * A failed fence's text names the fence as the caller knows it (tier_pin_async()'s *ret_fence,
 * tagged with the client's bits, and numbered after the fences of before a restart), with
 * tierd's reason: not tierd's own number for it ("fence 1"), which the caller never saw.
 */
static int fence_failed_text(const char *path) {
        char want[64];
        struct tier_grant g;
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        tier_fence fence = 0;
        const char *text;
        int r;

        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0 ||
            tier_pin_async(t, TIER_HOST, TIER_READ, &g, &fence) < 0 || fence == 0)
                return 2;
        r = tier_fence_wait(c, fence, -1);              /* returns once the event is in */
        text = tier_client_last_error(c);
        fprintf(stderr, "fence %#" PRIx64 ": %d (%s)\n", fence, r, text);
        (void) snprintf(want, sizeof(want), "fence %#" PRIx64 " failed: ", fence);
        if (r != -EIO)
                return 3;
        if (strncmp(text, want, strlen(want)) != 0)
                return 4;
        if (!strstr(text, "fake tierd: the read failed"))
                return 5;
        r = tier_fence_done(c, fence);                  /* again, from the ring: the same words */
        if (r != -EIO || strncmp(tier_client_last_error(c), want, strlen(want)) != 0)
                return 6;
        tier_tensor_close(t);
        tier_client_free(c);
        return 0;
}

static void test_fence_failed_names_callers_fence(void **state) {
        Fake f = {};
        int st;

        fake_start(&f, SC_FENCE_FAILED);
        st = in_child(fence_failed_text, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* fails with 4: "fence 1 failed: ..." */
}

/* A fresh connection, for one that broke (the fake serves one after another). */
static int reconnect(tier_client **c, const char *path) {
        tier_client_free(*c);
        *c = NULL;
        return tier_client_new(path, "job", 0, c);
}

/* tier_client_new(), its k-th allocation failed: each failure says why, not tier_strerror()'s "out of memory" */
static int client_new_says_why(const char *path) {
        int bad = 0;

        for (unsigned k = 1; k < 200; k++) {
                tier_client *c = NULL;
                const char *text;
                int r;

                fail_calls = 0;
                fail_kinds = FAIL_ANY;
                fail_on = false;
                fail_at = k;
                r = tier_client_new(path, "job", 0, &c);
                fail_at = 0;
                tier_client_free(c);
                if (fail_calls < k)
                        return r < 0 ? 6 : bad;
                text = tier_client_last_error(NULL);
                if (r < 0 && (!*text || strcmp(text, tier_strerror(r)) == 0)) {
                        fprintf(stderr, "tier_client_new, failure %u: %d says \"%s\"\n", k, r, text);
                        bad++;
                }
        }
        return 7;
}

/*
 * Each call, its k-th allocation (or fstat(), pread()) failed, for k = 1, 2, ... until it
 * succeeds: every failure leaves its own text, not "" (a failure after the request went out,
 * which cleared the text) nor an earlier call's.  (A pin whose segment cannot be taken fetches it
 * once more: its fstat() fails on.)  Among them, running out of memory decoding tierd's reply
 * says so (-ENOMEM), not "malformed packet", and breaks the connection (the next k reconnects).
 */
static int failures_say_why(Fake *f, const char *path) {
        static const char decoding[] = "out of memory decoding tierd's reply to ";
        static const Call calls[] = {
                { "status json (memfd)", 0, call_json, FAIL_ANY, false, NULL },
                { "status table (memfd)", 0, call_table, FAIL_ANY, false, NULL },
                { "status json (inline)", 1, call_json, FAIL_ANY, false, NULL },
                { "metrics (memfd)", 0, call_metrics, FAIL_ANY, false, NULL },
                { "metrics (inline)", 1, call_metrics, FAIL_ANY, false, NULL },
                { "job list", 0, call_jobs, FAIL_ANY, false, NULL },
                { "job tensors", 0, call_tensors, FAIL_ANY, false, NULL },
                { "trace stop", 0, call_trace, FAIL_ANY, false, NULL },
                /* segment 0's slot cannot be had, in the pin's reply nor fetched */
                { "pin, reallocarray() failing on", 0, call_pin, FAIL_ARRAY, true, "out of memory taking segment 0" },
                { "pin, fstat() failing on", 0, call_pin, FAIL_FSTAT, true, NULL },
                { "pin", 0, call_pin, FAIL_ANY, false, NULL },
                { "plan, fstat() failing", 0, call_plan, FAIL_FSTAT, false, "cannot stat the plan page tierd sent: " },
        };
        static const char stale[] = "job name is empty";
        tier_client *c = NULL;
        const char *text;
        int bad, r;

        bad = client_new_says_why(path);
        if (bad > 100)
                return bad - 100;
        if (tier_client_new(path, "job", 0, &c) < 0)
                return 2;
        for (size_t i = 0; i < ELEMENTSOF(calls); i++) {
                unsigned failed = 0, decode = 0, wanted = 0;

                /* each on a connection of its own: no segment mapped yet */
                if (i > 0 && reconnect(&c, path) < 0)
                        return 2;
                __atomic_store_n(f->inline_replies, calls[i].inline_replies, __ATOMIC_RELEASE);
                for (unsigned k = 1; k < 200; k++) {
                        /* an earlier failure's text, which no later failure may show */
                        if (tier_job_tensors(c, "", NULL, NULL) != -EINVAL || strcmp(tier_client_last_error(c), stale))
                                return 3;
                        fail_calls = 0;
                        fail_kinds = calls[i].kinds;
                        fail_on = calls[i].on;
                        fail_at = k;
                        r = calls[i].fn(c);
                        fail_at = 0;
                        if (fail_calls < k) {           /* nothing left to fail: it went through */
                                if (r < 0) {
                                        fprintf(stderr, "%s: %d (%s) with nothing failed\n", calls[i].what, r,
                                                tier_client_last_error(c));
                                        return 4;
                                }
                                break;
                        }
                        if (r < 0) {
                                failed++;
                                text = tier_client_last_error(c);
                                if (!*text || strcmp(text, stale) == 0 || strstr(text, "malformed") ||
                                    (strncmp(text, decoding, strlen(decoding)) == 0 && r != -ENOMEM)) {
                                        fprintf(stderr, "%s, failure %u: %d (%s) says \"%s\"\n", calls[i].what,
                                                k, r, tier_strerror(r), text);
                                        bad++;
                                }
                                decode += strncmp(text, decoding, strlen(decoding)) == 0;
                                wanted += calls[i].want && strncmp(text, calls[i].want, strlen(calls[i].want)) == 0;
                        }
                        /* (a failure made up for, or an unpin's, may have broken it too) */
                        if (tier_client_process(c) < 0 && reconnect(&c, path) < 0)
                                return 2;
                }
                if (failed == 0) {
                        fprintf(stderr, "%s: no failure made it fail\n", calls[i].what);
                        return 5;
                }
                if ((calls[i].kinds & FAIL_ALLOC) && decode == 0) {
                        fprintf(stderr, "%s: no failure was in decoding tierd's reply\n", calls[i].what);
                        bad++;
                }
                if (calls[i].want && wanted == 0) {
                        fprintf(stderr, "%s: no failure said \"%s...\"\n", calls[i].what, calls[i].want);
                        bad++;
                }
        }
        /* last (a failure to load CUDA is kept): the reason is given, not left empty (a libtier built
         * without cuda.h has no CUDA to load: -ENODEV, its own text) */
        fail_calls = 0;
        fail_kinds = FAIL_ALLOC;
        fail_on = false;
        fail_at = 1;
        r = tier_client_cuda_register_host(c);
        fail_at = 0;
        text = tier_client_last_error(c);
        if (TIERD_HAVE_CUDA ?
            r != -ENOMEM || strcmp(text, "CUDA cannot be used in this process: out of memory") != 0 :
            r != -ENODEV || strstr(text, "built without CUDA support") == NULL) {
                fprintf(stderr, "CUDA, out of memory: %d says \"%s\"\n", r, text);
                bad++;
        }
        tier_client_free(c);
        return bad ? 10 : 0;
}

static Fake *replies_fake;

/*
 * tier_client_cuda_register_host() twice on a new client: first with TIER_LIBCUDA=@libcuda and the
 * @fail_alloc-th allocation failing (0: none), then with the fake driver; first * 1000 + again.
 */
static int cuda_call(const char *path, unsigned fail_alloc, const char *libcuda) {
        tier_client *c = NULL;
        int r, again;

        if (tier_client_new(path, "job", 0, &c) < 0)
                return -1000;
        setenv("TIER_LIBCUDA", libcuda, 1);
        fail_calls = 0;
        fail_kinds = FAIL_ALLOC;
        fail_on = false;
        fail_at = fail_alloc;
        r = tier_client_cuda_register_host(c);
        fail_at = 0;
        fprintf(stderr, "first: %d (%s)\n", r, tier_client_last_error(c));
        setenv("TIER_LIBCUDA", getenv("TIER_FAKE_CUDA"), 1);
        again = tier_client_cuda_register_host(c);
        fprintf(stderr, "again: %d (%s)\n", again, tier_client_last_error(c));
        tier_client_free(c);
        return r * 1000 + again;
}

static int cuda_nomem_child(const char *path) {
        const char *fake = getenv("TIER_FAKE_CUDA");
        void *lib = dlopen(fake, RTLD_NOW | RTLD_LOCAL);        /* the instance libtier loads too */
        fake_cuda_fail_t fake_fail = lib ? (fake_cuda_fail_t) dlsym(lib, FAKE_CUDA_FAIL) : NULL;

        if (!fake_fail)
                return 2;
        /* out of host memory loading it: -ENOMEM, and the next call loads it */
        if (cuda_call(path, 1, fake) != -ENOMEM * 1000)
                return 3;
        /* out of GPU memory making the context: likewise */
        fake_fail("cuDevicePrimaryCtxRetain", 2 /* CUDA_ERROR_OUT_OF_MEMORY */, 0, 1);
        if (cuda_call(path, 0, fake) != -ENOMEM * 1000)
                return 4;
        /* no driver: kept, the next call fails alike though the driver is there now */
        if (cuda_call(path, 0, "/nonexistent/libcuda.so.1") != -ENODEV * 1000 - ENODEV)
                return 5;
        return 0;
}

/* A CUDA load that failed for lack of memory is tried again on the next call; other failures are kept. */
static void test_cuda_out_of_memory_retried(void **state) {
        Fake f = {};
        int st;

        if (!getenv("TIER_FAKE_CUDA"))
                skip();                 /* built without cuda.h: libtier has no CUDA to load */
        f.inline_replies = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(f.inline_replies != MAP_FAILED);
        fake_start(&f, SC_REPLIES);             /* one connection after another */
        st = in_child(cuda_nomem_child, f.path);
        fake_stop(&f);
        munmap(f.inline_replies, sizeof(int));
        assert_int_equal(st, 0);        /* failed with 3 (-ENOMEM kept: -12012) before */
}

static int replies_child(const char *path) {
        return failures_say_why(replies_fake, path);
}

/* tier_client_new(3), NOTES: out of memory, or a read failing, after a request went out says so too. */
static void test_failures_after_the_request_own_text(void **state) {
        Fake f = {};
        int st;

        f.inline_replies = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        assert_true(f.inline_replies != MAP_FAILED);
        fake_start(&f, SC_REPLIES);
        replies_fake = &f;
        st = in_child(replies_child, f.path);
        fake_stop(&f);
        munmap(f.inline_replies, sizeof(int));
        assert_int_equal(st, 0);        /* fails with 10: texts left empty */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_plan_page_short_memfd),
                cmocka_unit_test(test_phase_error_truncated),
                cmocka_unit_test(test_pin_no_address_space),
                cmocka_unit_test(test_plan_outlives_client),
                cmocka_unit_test(test_moved_left_alone_on_failure),
                cmocka_unit_test(test_process_after_shutdown),
                cmocka_unit_test(test_phase_grant_without_plan),
                cmocka_unit_test(test_argument_errors_own_text),
                cmocka_unit_test(test_fence_failed_names_callers_fence),
                cmocka_unit_test(test_failures_after_the_request_own_text),
                cmocka_unit_test(test_cuda_out_of_memory_retried),
                cmocka_unit_test(test_fence_done_after_tierd_gone),
                cmocka_unit_test(test_fence_done_reconnects),
                cmocka_unit_test(test_quota_get_lists_every_name),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
