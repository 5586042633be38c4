/* SPDX-License-Identifier: MIT */
/* test-compat.c: old and new clients against this tierd, this libtier against old and new tierds. */

/*
 * The protocol version is what a client and tierd agree on at Hello
 * (libtier(3), COMPATIBILITY): tierd serves every version from
 * WIRE_PROTOCOL_MIN to WIRE_PROTOCOL_VERSION and answers in the client's;
 * libtier speaks TIER_PROTOCOL_VERSION and accepts only an answer in it.
 *
 * The clients of other versions are raw Hello packets (what an older or a
 * newer libtier sends first); the tierds of other versions are a fake one
 * forked here, answering Hello as an older tierd did (a refusal with its
 * text) or as a broken one would (an answer in another version).  Each
 * refusal must come before anything changes and say which side to upgrade.
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "proto/wire.h"
#include "tests/helpers/harness.h"
#include "tier.pb-c.h"

static const char *const CONFIG =
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 4M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n"
        "extent_size = 1M\n"
        "[limits]\n"
        "max_tensors = 4\n";

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

static int raw_connect(const char *path) {
        int fd = test_raw_connect(path);

        assert_true(fd >= 0);
        return fd;
}

static void send_packed(int fd, const ProtobufCMessage *m) {
        size_t len = protobuf_c_message_get_packed_size(m);
        uint8_t *buf = malloc(len ? len : 1);

        assert_non_null(buf);
        protobuf_c_message_pack(m, buf);
        assert_int_equal(wire_send(fd, buf, len, NULL, 0), 0);
        free(buf);
}

/* One response: its status, tierd's reason in @error, the hello's version in *@version (0 without one). */
static int raw_response(int fd, char *error, size_t size, uint32_t *version) {
        uint8_t buf[65536];
        int fds[WIRE_MAX_FDS];
        size_t len, n_fds;
        Tier__Reply *rep;
        int r;

        r = wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds);
        assert_int_equal(r, 0);
        wire_close_fds(fds, n_fds);
        rep = tier__reply__unpack(NULL, len, buf);
        assert_non_null(rep);
        assert_int_equal(rep->kind_case, TIER__REPLY__KIND_RESPONSE);
        r = rep->response->status;
        snprintf(error, size, "%s", rep->response->error ? rep->response->error : "");
        *version = rep->response->result_case == TIER__RESPONSE__RESULT_HELLO && rep->response->hello ?
                           rep->response->hello->version : 0;
        tier__reply__free_unpacked(rep, NULL);
        return r;
}

/* A client speaking protocol @version says Hello to tierd as job @job; the response's status. */
static int hello_as(int fd, uint32_t version, const char *job, char *error, size_t size, uint32_t *ret_version) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;

        h.version = version;
        h.job = (char *) job;
        req.seq = 1;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        send_packed(fd, &req.base);
        return raw_response(fd, error, size, ret_version);
}

/* Whether tierd has a job named @job (its status, through this libtier). */
static bool job_exists(const char *job) {
        tier_client *c = NULL;
        struct tier_job_info *jobs = NULL;
        size_t n = 0;
        bool found = false;

        assert_int_equal(tier_client_new(daemon_.socket, NULL, 0, &c), 0);
        assert_int_equal(tier_job_list(c, &jobs, &n), 0);
        for (size_t i = 0; i < n; i++)
                found = found || strcmp(jobs[i].name, job) == 0;
        free(jobs);
        tier_client_free(c);
        return found;
}

/*
 * A Hello that names the writes its client holds (libtier's, after a restart
 * of tierd): names of tensors the job lacks are nothing to tierd; more than a
 * client may hold (8 x max_tensors: its pins and two plan phases' grants) is
 * refused, and no job is made.
 */
static void test_hello_held_writes(void **state) {
        Tier__HeldWrite hw[33], *hwp[33];
        char error[512];

        for (size_t n = 3; n <= 33; n += 30) {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__Hello h = TIER__HELLO__INIT;
                const char *job = n == 3 ? "held-ok" : "held-many";
                uint32_t answered;
                int fd = raw_connect(daemon_.socket);

                for (size_t i = 0; i < n; i++) {
                        tier__held_write__init(&hw[i]);
                        hw[i].tensor = (char *) "nosuch";
                        hw[i].tier = TIER__TIER__TIER_HOST;
                        hwp[i] = &hw[i];
                }
                h.version = WIRE_PROTOCOL_VERSION;
                h.job = (char *) job;
                h.says_writes = true;
                h.n_held_writes = n;
                h.held_writes = hwp;
                req.seq = 1;
                req.op_case = TIER__REQUEST__OP_HELLO;
                req.hello = &h;
                send_packed(fd, &req.base);
                if (n == 3)
                        assert_int_equal(raw_response(fd, error, sizeof(error), &answered), 0);
                else {
                        assert_int_equal(raw_response(fd, error, sizeof(error), &answered), -EINVAL);
                        assert_non_null(strstr(error, "names 33 held writes, more than a client may hold (32)"));
                }
                close(fd);
        }
        assert_false(job_exists("held-many"));
}

/* Every version tierd serves works: Hello answered in the client's version, then requests. */
static void test_clients_tierd_serves(void **state) {
        char error[512];

        for (uint32_t v = WIRE_PROTOCOL_MIN; v <= WIRE_PROTOCOL_VERSION; v++) {
                Tier__Request req = TIER__REQUEST__INIT;
                Tier__Stat st = TIER__STAT__INIT;
                uint32_t answered;
                int fd = raw_connect(daemon_.socket);

                assert_int_equal(hello_as(fd, v, "served", error, sizeof(error), &answered), 0);
                assert_int_equal(answered, v);
                /* a request after it is served: an unknown tensor is a clean -ENOENT */
                st.tensor = 12345;
                req.seq = 2;
                req.op_case = TIER__REQUEST__OP_STAT;
                req.stat = &st;
                send_packed(fd, &req.base);
                assert_int_equal(raw_response(fd, error, sizeof(error), &answered), -ENOENT);
                close(fd);
        }
        /* and this libtier, of course */
        {
                tier_client *c = NULL;
                tier_tensor *t = NULL;

                assert_int_equal(tier_client_new(daemon_.socket, "served-lib", 0, &c), 0);
                assert_int_equal(tier_tensor_create(c, "x", 4096, &t), 0);
                assert_int_equal(tier_tensor_destroy(t), 0);
                tier_client_free(c);
        }
}

/* A client older than tierd serves is refused at Hello, told to rebuild; no job is made. */
static void test_older_client(void **state) {
        char error[512];
        uint32_t answered;
        int fd = raw_connect(daemon_.socket);

        assert_true(WIRE_PROTOCOL_MIN >= 1);
        assert_int_equal(hello_as(fd, WIRE_PROTOCOL_MIN - 1, "too-old", error, sizeof(error), &answered),
                         -EPROTONOSUPPORT);
        assert_non_null(strstr(error, "older than this tierd serves"));
        assert_non_null(strstr(error, "rebuild the client against libtier.so.1"));
        close(fd);
        assert_false(job_exists("too-old"));
}

/* A client newer than tierd is refused at Hello, told to upgrade tierd; no job is made. */
static void test_newer_client(void **state) {
        char error[512];
        uint32_t answered;
        int fd = raw_connect(daemon_.socket);

        assert_int_equal(hello_as(fd, WIRE_PROTOCOL_VERSION + 1, "too-new", error, sizeof(error), &answered),
                         -EPROTONOSUPPORT);
        assert_non_null(strstr(error, "newer than this tierd"));
        assert_non_null(strstr(error, "upgrade tierd"));
        close(fd);
        assert_false(job_exists("too-new"));
}

/* ---- this libtier against other tierds -------------------------------------------------------- */

typedef enum FakeAnswer {
        FAKE_REFUSE,            /* as tierd 0.x refused any version but its own */
        FAKE_ANSWER_IN,         /* a HelloReply in version .version */
} FakeAnswer;

/*
 * A fake tierd on @path (bound and listening before this returns, so the
 * client's connect cannot come first): it answers one Hello as @answer
 * says and exits 0 once the client has gone, 1 if the first packet was not
 * a Hello of this libtier's version.
 */
static pid_t fake_tierd(const char *path, FakeAnswer answer, uint32_t version, const char *refusal) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        pid_t pid;

        assert_true(lfd >= 0);
        strcpy(sa.sun_path, path);
        (void) unlink(path);
        assert_int_equal(bind(lfd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        assert_int_equal(listen(lfd, 1), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                Tier__Reply rep = TIER__REPLY__INIT;
                Tier__Response resp = TIER__RESPONSE__INIT;
                Tier__HelloReply hr = TIER__HELLO_REPLY__INIT;
                uint8_t buf[4096];
                int fds[WIRE_MAX_FDS];
                size_t len, n_fds;
                Tier__Request *req;
                bool ok;
                int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

                if (fd < 0 || wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds) < 0)
                        _exit(1);
                wire_close_fds(fds, n_fds);
                req = tier__request__unpack(NULL, len, buf);
                ok = req && req->op_case == TIER__REQUEST__OP_HELLO && req->hello->version == TIER_PROTOCOL_VERSION;
                resp.seq = req ? req->seq : 0;
                if (answer == FAKE_REFUSE) {
                        resp.status = -EPROTONOSUPPORT;
                        resp.error = (char *) refusal;
                } else {
                        hr.version = version;
                        resp.result_case = TIER__RESPONSE__RESULT_HELLO;
                        resp.hello = &hr;
                }
                rep.kind_case = TIER__REPLY__KIND_RESPONSE;
                rep.response = &resp;
                len = tier__reply__pack(&rep, buf);
                if (req)
                        tier__request__free_unpacked(req, NULL);        /* valgrind runs this child too */
                if (wire_send(fd, buf, len, NULL, 0) < 0)
                        _exit(1);
                /* until the client closes */
                while (wire_recv(fd, buf, sizeof(buf), &len, fds, &n_fds) == 0)
                        wire_close_fds(fds, n_fds);
                _exit(ok ? 0 : 1);
        }
        close(lfd);
        return pid;
}

static void fake_done(pid_t pid, const char *path) {
        int status;

        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        (void) unlink(path);
}

/* Each way another tierd can answer this libtier: -EPROTONOSUPPORT, the reason, which side to upgrade. */
static void test_libtier_against_other_tierds(void **state) {
        static const struct {
                FakeAnswer answer;
                uint32_t version;
                const char *refusal;
                const char *said[3];
        } cases[] = {
                /* tierd 0.x (libtier.so.0's), had it spoken an older version: its own words, and ours */
                { FAKE_REFUSE, 0, "protocol version 2 not supported (tierd speaks version 1)",
                  { "protocol version 2 not supported (tierd speaks version 1)", "this libtier speaks protocol",
                    NULL } },
                /* a tierd that answers in an older version than ours */
                { FAKE_ANSWER_IN, TIER_PROTOCOL_VERSION - 1, NULL,
                  { "older than this libtier's", "upgrade tierd", NULL } },
                /* a tierd that answers in a newer version, not in ours: it broke the rule */
                { FAKE_ANSWER_IN, TIER_PROTOCOL_VERSION + 1, NULL,
                  { "newer than this libtier's", "upgrade libtier", NULL } },
        };
        char path[512];

        snprintf(path, sizeof(path), "%s/fake.sock", daemon_.dir);
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                pid_t pid = fake_tierd(path, cases[i].answer, cases[i].version, cases[i].refusal);
                tier_client *c = NULL;
                const char *why;

                assert_int_equal(tier_client_new(path, "job", 0, &c), -EPROTONOSUPPORT);
                assert_null(c);
                why = tier_client_last_error(NULL);
                for (size_t k = 0; cases[i].said[k]; k++)
                        if (!strstr(why, cases[i].said[k]))
                                fail_msg("case %zu: \"%s\" lacks \"%s\"", i, why, cases[i].said[k]);
                fake_done(pid, path);
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_clients_tierd_serves),
                cmocka_unit_test(test_older_client),
                cmocka_unit_test(test_newer_client),
                cmocka_unit_test(test_hello_held_writes),
                cmocka_unit_test(test_libtier_against_other_tierds),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
