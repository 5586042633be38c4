/* SPDX-License-Identifier: MIT */
/* test-uring.c: the NVMe request queue: fair order by weight, bounded credit, pacing. */

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/uring.h"

/* ---- io_uring_submit() failing on cue: the test links with -Wl,--wrap=io_uring_submit ---------- */

int __real_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring);

static unsigned submit_fail;            /* fail this many calls with submit_error, taking nothing */
static int submit_error = -EAGAIN;
static unsigned submit_calls;

int __wrap_io_uring_submit(struct io_uring *ring) {
        submit_calls++;
        if (submit_fail > 0) {
                submit_fail--;
                return submit_error;
        }
        return __real_io_uring_submit(ring);
}

#define KiB 1024u
#define REQ (64u * KiB)
#define MAX_REQS 32

/* Completion order, one letter per request (its flow). */
static char order[MAX_REQS + 1];
static unsigned n_done;

typedef struct Req {
        UringReq req;
        char flow;
} Req;

static void on_done(UringReq *r, int res) {
        Req *q = (Req *) r;

        assert_int_equal(res, (int) REQ);
        if (n_done < MAX_REQS)
                order[n_done++] = q->flow;
}

typedef struct Fixture {
        sd_event *event;
        Uring *u;
        int fd;
        char path[64];
        uint8_t *buf;
        Req reqs[MAX_REQS];
        unsigned n_reqs;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(*f));

        assert_non_null(f);
        snprintf(f->path, sizeof(f->path), "/var/tmp/tierd-uring.XXXXXX");
        f->fd = mkostemp(f->path, O_CLOEXEC);
        assert_true(f->fd >= 0);
        assert_int_equal(ftruncate(f->fd, MAX_REQS * REQ), 0);
        assert_int_equal(sd_event_new(&f->event), 0);
        assert_int_equal(uring_new(f->event, 8, &f->u), 0);
        assert_int_equal(uring_register_files(f->u, &f->fd, 1), 0);
        /*
         * 4 MiB/s: a 64 KiB request takes 16 ms, much longer than the pacer's
         * 2 ms burst, so the next one goes 14 ms after the previous one (which
         * is long done by then, even on a loaded machine): requests complete in
         * the order they were submitted.
         */
        assert_int_equal(uring_set_throttle(f->u, 0, 4u << 20), 0);
        f->buf = calloc(1, REQ);
        assert_non_null(f->buf);
        memset(order, 0, sizeof(order));
        n_done = 0;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;

        uring_free(f->u);
        sd_event_unref(f->event);
        close(f->fd);
        unlink(f->path);
        free(f->buf);
        free(f);
        return 0;
}

static void queue(Fixture *f, char name, FairFlow *flow, unsigned weight) {
        Req *q;

        assert_true(f->n_reqs < MAX_REQS);
        q = &f->reqs[f->n_reqs];
        *q = (Req) {
                .req = { .cb = on_done, .flow = flow, .weight = weight, .op = URING_WRITE, .file_index = 0,
                         .buf_index = -1, .buf = f->buf, .len = REQ, .offset = (uint64_t) f->n_reqs * REQ },
                .flow = name,
        };
        f->n_reqs++;
        uring_queue(f->u, &q->req);
}

static void wait_done(Fixture *f, unsigned n) {
        /* what tierd's loop does once per iteration (a post source runs only after another source) */
        assert_true(uring_flush(f->u) >= 0);
        for (int i = 0; i < 200 && n_done < n; i++)
                assert_true(sd_event_run(f->event, 100000) >= 0);
        assert_int_equal(n_done, n);
        assert_false(uring_busy(f->u));
}

/* Two backlogged flows of weights 1 and 4 are served 1:4 (ties: first come, first served). */
static void test_weighted_order(void **state) {
        Fixture *f = *state;
        FairFlow a = {}, b = {};

        for (int i = 0; i < 8; i++)
                queue(f, 'A', &a, 1);
        for (int i = 0; i < 8; i++)
                queue(f, 'B', &b, 4);
        assert_true(uring_busy(f->u));
        wait_done(f, 16);
        /* virtual start times: A 0, 64K, 128K, ...; B 0, 16K, 32K, 48K, 64K, ... */
        assert_string_equal(order, "ABBBBABBBBAAAAAA");
}

/*
 * A flow back from idleness may start behind the virtual time by the credit
 * (here 128 KiB: two requests at weight 1), not by all the service it missed.
 */
static void test_bounded_credit(void **state) {
        Fixture *f = *state;
        FairFlow a = {}, c = {};

        uring_set_fair_credit(f->u, 128 * KiB);
        for (int i = 0; i < 8; i++)
                queue(f, 'A', &a, 1);
        wait_done(f, 8);                /* virtual time is now A's last start: 7 x 64K */
        for (int i = 0; i < 4; i++)
                queue(f, 'A', &a, 1);   /* 8 x 64K, 9 x ... */
        for (int i = 0; i < 4; i++)
                queue(f, 'C', &c, 1);   /* 5 x 64K, 6 x ..., 8 x 64K (after A's equal tag) */
        wait_done(f, 16);
        assert_string_equal(order + 8, "CCCACAAA");

        /* no credit: a newcomer starts at the virtual time and alternates at once */
        uring_set_fair_credit(f->u, 0);
        {
                FairFlow d = {};

                n_done = 0;
                memset(order, 0, sizeof(order));
                f->n_reqs = 0;
                for (int i = 0; i < 3; i++)
                        queue(f, 'A', &a, 1);
                for (int i = 0; i < 3; i++)
                        queue(f, 'D', &d, 1);
                wait_done(f, 6);
                /* A's last start was 11 x 64K; its next ones 12.., D's start at 11 x 64K */
                assert_string_equal(order, "DADADA");
        }
}

/* Requests without a flow go at the current virtual time, among the others in arrival order. */
static void test_no_flow(void **state) {
        Fixture *f = *state;

        for (int i = 0; i < 4; i++)
                queue(f, 'N', NULL, 0);
        wait_done(f, 4);
        assert_string_equal(order, "NNNN");
}

/*
 * The kernel takes nothing (-EAGAIN, as with too many requests in flight):
 * the SQE stays in the ring and is offered again by itself, without some
 * other request coming to flush it.  Before, it waited for the next flush
 * that had something new to queue: forever, if nothing else came.
 */
static void test_submit_retried(void **state) {
        Fixture *f = *state;

        assert_int_equal(uring_set_throttle(f->u, 0, 0), 0);
        submit_calls = 0;
        submit_fail = 1;
        queue(f, 'R', NULL, 0);
        assert_int_equal(uring_flush(f->u), -EAGAIN);
        assert_int_equal(submit_calls, 1);
        for (int i = 0; i < 200 && n_done < 1; i++)
                assert_true(sd_event_run(f->event, 10000) >= 0);
        assert_int_equal(n_done, 1);
        assert_int_equal(submit_calls, 2);
        assert_false(uring_busy(f->u));

        /* and a later flush with nothing new still submits what was left */
        submit_fail = 1;
        queue(f, 'S', NULL, 0);
        assert_int_equal(uring_flush(f->u), -EAGAIN);
        assert_int_equal(uring_flush(f->u), 1);
        for (int i = 0; i < 200 && n_done < 2; i++)
                assert_true(sd_event_run(f->event, 10000) >= 0);
        assert_string_equal(order, "RS");
        assert_false(uring_busy(f->u));
}

/* ---- prep runs once, before the request goes; callbacks run after the ring is refilled ---------- */

static unsigned n_prepped, prepped_at_first_done;

static void on_prep(UringReq *r) {
        assert_int_equal(r->done, 0);           /* before the device saw it */
        n_prepped++;
}

static void on_done_refilled(UringReq *r, int res) {
        assert_int_equal(res, (int) REQ);
        if (n_done++ == 0)
                prepped_at_first_done = n_prepped;
}

static void test_prep_and_refill(void **state) {
        Fixture *f = *state;

        assert_int_equal(uring_set_throttle(f->u, 0, 0), 0);
        n_prepped = prepped_at_first_done = 0;
        for (unsigned i = 0; i < 16; i++) {
                Req *q = &f->reqs[f->n_reqs++];

                *q = (Req) {
                        .req = { .cb = on_done_refilled, .prep = on_prep, .op = URING_WRITE, .buf_index = -1,
                                 .buf = f->buf, .len = REQ, .offset = (uint64_t) i * REQ },
                };
                uring_queue(f->u, &q->req);
        }
        assert_true(uring_flush(f->u) >= 0);
        assert_int_equal(n_prepped, 8);         /* the ring's depth: the others wait, unprepared */
        for (int i = 0; i < 200 && n_done < 16; i++)
                assert_true(sd_event_run(f->event, 100000) >= 0);
        assert_int_equal(n_done, 16);
        assert_int_equal(n_prepped, 16);        /* once each */
        /* the first callback ran once the ring had taken the next requests */
        assert_true(prepped_at_first_done > 8);
        assert_false(uring_busy(f->u));
}

/* ---- a hard submit error, retried every millisecond, is reported once per run of failures ---------- */

static unsigned n_reported, last_reported_in_a_row;

static void on_submit_failed(Uring *u, int error, unsigned ready, unsigned in_a_row, void *userdata) {
        assert_int_equal(error, -ENOMEM);
        n_reported++;
        last_reported_in_a_row = in_a_row;
}

static const UringHooks hooks_report = {
        .submit_failed = on_submit_failed,
};

/*
 * io_uring_submit() fails with -ENOMEM 10 times in a row: the SQE is offered again until it goes, and
 * the owner hears of it once (it logged a warning at each retry, a thousand a second), and once more
 * for a later run of failures after a submit that went.
 */
static void test_submit_error_reported_once(void **state) {
        Fixture *f = *state;

        assert_int_equal(uring_set_throttle(f->u, 0, 0), 0);
        uring_set_hooks(f->u, &hooks_report, NULL);
        n_reported = 0;
        submit_calls = 0;
        submit_error = -ENOMEM;
        submit_fail = 10;
        queue(f, 'R', NULL, 0);
        assert_int_equal(uring_flush(f->u), -ENOMEM);
        for (int i = 0; i < 1000 && n_done < 1; i++)
                assert_true(sd_event_run(f->event, 100000) >= 0);
        assert_int_equal(n_done, 1);
        assert_int_equal(submit_calls, 11);
        assert_int_equal(n_reported, 1);
        assert_int_equal(last_reported_in_a_row, 1);

        submit_fail = 2;
        queue(f, 'S', NULL, 0);
        assert_int_equal(uring_flush(f->u), -ENOMEM);
        for (int i = 0; i < 1000 && n_done < 2; i++)
                assert_true(sd_event_run(f->event, 100000) >= 0);
        assert_string_equal(order, "RS");
        assert_int_equal(n_reported, 2);
        assert_false(uring_busy(f->u));
        submit_error = -EAGAIN;
        uring_set_hooks(f->u, NULL, NULL);
}

/* ---- a device that answers -EAGAIN for good ------------------------------------------------------ */

/* Stop answering -EAGAIN after this many attempts: what an unbounded requeue reaches. */
#define AGAIN_CAP 10000u

static unsigned again_attempts, again_fail;
static int again_res = 1;

static int on_fault_again(Uring *u, const UringReq *req, void *userdata) {
        again_attempts++;
        return again_attempts <= again_fail ? -EAGAIN : 0;
}

static void on_done_again(UringReq *r, int res) {
        again_res = res;
        n_done++;
}

static const UringHooks hooks_again = {
        .fault_submit = on_fault_again,
};

static void run_again(Fixture *f, unsigned fail) {
        Req *q = &f->reqs[f->n_reqs++];

        again_attempts = 0;
        again_fail = fail;
        again_res = 1;
        n_done = 0;
        *q = (Req) {
                .req = { .cb = on_done_again, .op = URING_WRITE, .buf_index = -1, .buf = f->buf,
                         .len = REQ },
        };
        uring_queue(f->u, &q->req);
        assert_true(uring_flush(f->u) >= 0);
        for (int i = 0; i < 200 && n_done < 1; i++)
                assert_true(sd_event_run(f->event, 100000) >= 0);
        assert_int_equal(n_done, 1);
        assert_false(uring_busy(f->u));
}

/*
 * Every attempt of a request comes back -EAGAIN: it fails with -EIO after URING_MAX_AGAIN attempts.
 * It used to be requeued for as long as the device said so, the completion handler spinning.  A few
 * -EAGAIN in a row are only retried.
 */
static void test_again_bounded(void **state) {
        Fixture *f = *state;

        assert_int_equal(uring_set_throttle(f->u, 0, 0), 0);
        uring_set_hooks(f->u, &hooks_again, NULL);
        run_again(f, AGAIN_CAP);
        assert_int_equal(again_res, -EIO);
        assert_int_equal(again_attempts, URING_MAX_AGAIN);

        run_again(f, URING_MAX_AGAIN - 1);
        assert_int_equal(again_res, (int) REQ);
        assert_int_equal(again_attempts, URING_MAX_AGAIN);
        uring_set_hooks(f->u, NULL, NULL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_weighted_order, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bounded_credit, setup, teardown),
                cmocka_unit_test_setup_teardown(test_no_flow, setup, teardown),
                cmocka_unit_test_setup_teardown(test_submit_retried, setup, teardown),
                cmocka_unit_test_setup_teardown(test_prep_and_refill, setup, teardown),
                cmocka_unit_test_setup_teardown(test_again_bounded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_submit_error_reported_once, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
