/* SPDX-License-Identifier: MIT */
/* test-ipc-names.c: a name with control or bidi characters refused, saying the name to give instead (rpc.c check_name()). */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/quota-rule.h"
#include "daemon/core/manager.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "proto/wire.h"
#include "tests/unit/fixture.h"
#include "tier.pb-c.h"
#include "util/escape.h"

/* A connection over a socketpair, its requests dispatched by hand (as test-ipc.c). */
typedef struct Peer {
        Manager *m;
        Conn *conn;
        int fd;
        uint64_t seq;
} Peer;

static void peer_new(Manager *m, Peer *ret) {
        int sv[2];

        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
        *ret = (Peer) { .m = m, .fd = sv[1] };
        assert_int_equal(conn_new(m->server, sv[0], 0, 0, getpid(), &ret->conn), 0);
}

static void peer_free(Peer *p) {
        conn_close(p->conn);
        close(p->fd);
}

/* @req dispatched on @p: its Response (free with tier__reply__free_unpacked()). */
static Tier__Reply *call(Peer *p, Tier__Request *req) {
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
        return reply;
}

/* A Hello for @job: its Response. */
static Tier__Reply *hello(Peer *p, const char *job) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello h = TIER__HELLO__INIT;

        h.version = WIRE_PROTOCOL_VERSION;
        h.job = (char *) job;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &h;
        return call(p, &req);
}

/* A Create of tensor @name (4 KiB) on @p's job: its Response. */
static Tier__Reply *create(Peer *p, const char *name) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Create cr = TIER__CREATE__INIT;

        cr.name = (char *) name;
        cr.size = 4096;
        req.op_case = TIER__REQUEST__OP_CREATE;
        req.create = &cr;
        return call(p, &req);
}

/* A QuotaSet of weight @weight for job name @job: its Response. */
static Tier__Reply *quota_set(Peer *p, const char *job, unsigned weight) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaSet q = TIER__QUOTA_SET__INIT;

        q.job = (char *) job;
        q.weight = weight;
        req.op_case = TIER__REQUEST__OP_QUOTA_SET;
        req.quota_set = &q;
        return call(p, &req);
}

/*
 * The refusal of a name with control characters says what to do: the name a job of it from an older
 * tierd was restored under (test-book-names.c), and holds none itself.
 */
static void test_names_refusal_says_escaped_name(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tier__Reply *reply;
        Peer p;

        peer_new(m, &p);
        reply = hello(&p, "evil\xc2\x9b" "31m");
        assert_int_equal(reply->response->status, -EINVAL);
        assert_non_null(strstr(reply->response->error, "job name contains control characters; a job an older tierd "
                                                     "made under such a name was restored under its escaped text"));
        assert_non_null(strstr(reply->response->error, ": 'evil\\u009b31m'"));
        assert_null(strstr(reply->response->error, "\xc2\x9b"));
        tier__reply__free_unpacked(reply, NULL);
        peer_free(&p);
        fixture_free(m);
}

/*
 * A name with a bidirectional format character (U+202E RLO: "abc<RLO>gpj.exe" prints as "abcexe.jpg") is
 * refused as one with a control character is, naming it by its code point and saying the escaped name to
 * use instead, for jobs, tensors and quotas alike; a name that only looks alike (ZWJ U+200D) is text.  They
 * were taken (status 0) and printed raw.
 */
static void test_names_refuse_bidi(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tier__Reply *reply;
        Peer p;

        peer_new(m, &p);
        reply = hello(&p, "abc\xe2\x80\xae" "gpj.exe");
        assert_int_equal(reply->response->status, -EINVAL);
        assert_non_null(strstr(reply->response->error, "job name contains the bidirectional format character U+202E; "
                                                     "a job an older tierd made under such a name was restored "
                                                     "under its escaped text"));
        assert_non_null(strstr(reply->response->error, ": 'abc\\u202egpj.exe'"));
        assert_null(strstr(reply->response->error, "\xe2\x80\xae"));
        assert_null(job_find(m->registry, "abc\xe2\x80\xae" "gpj.exe"));
        tier__reply__free_unpacked(reply, NULL);

        reply = hello(&p, "ok\xe2\x80\x8d");
        assert_int_equal(reply->response->status, 0);
        tier__reply__free_unpacked(reply, NULL);
        reply = create(&p, "w\xe2\x81\xa7" "x");
        assert_int_equal(reply->response->status, -EINVAL);
        assert_non_null(strstr(reply->response->error, "tensor name contains the bidirectional format character "
                                                     "U+2067; "));
        assert_non_null(strstr(reply->response->error, ": 'w\\u2067x'"));
        tier__reply__free_unpacked(reply, NULL);
        reply = create(&p, "w");
        assert_int_equal(reply->response->status, 0);
        tier__reply__free_unpacked(reply, NULL);

        reply = quota_set(&p, "\xd8\x9c" "job", 5);
        assert_int_equal(reply->response->status, -EINVAL);
        assert_string_equal(reply->response->error, "job name contains the bidirectional format character U+061C");
        tier__reply__free_unpacked(reply, NULL);
        assert_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, "\xd8\x9c" "job"));
        peer_free(&p);
        fixture_free(m);
}

/*
 * A name whose escaped text is longer than max_name (255 here): the refusal says the name it was
 * restored under, cut with a hash to fit, which a Hello takes (it said the escaped text cut at 255
 * bytes, a name no job has, as if whole).
 */
static void test_names_refusal_long_escaped_name(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        char name[201], want[300], *e;
        Tier__Reply *reply;
        Peer p;

        for (int i = 0; i < 100; i++)
                memcpy(name + 2 * i, "\xc2\x9b", 2);   /* "\u009b" 100 times: 600 bytes */
        name[200] = '\0';
        e = text_escape_name(name, 255, false);
        assert_non_null(e);
        assert_int_equal(strlen(e), 255);
        snprintf(want, sizeof(want), ": '%s'", e);
        peer_new(m, &p);
        reply = hello(&p, name);
        assert_int_equal(reply->response->status, -EINVAL);
        assert_non_null(strstr(reply->response->error, want));
        tier__reply__free_unpacked(reply, NULL);
        reply = hello(&p, e);
        assert_int_equal(reply->response->status, 0);
        tier__reply__free_unpacked(reply, NULL);
        peer_free(&p);
        fixture_free(m);
        free(e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_names_refusal_says_escaped_name),
                cmocka_unit_test(test_names_refuse_bidi),
                cmocka_unit_test(test_names_refusal_long_escaped_name),
        };

        return fixture_main("ipc-names", tests, sizeof(tests) / sizeof(tests[0]));
}
