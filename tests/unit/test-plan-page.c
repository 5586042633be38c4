/* SPDX-License-Identifier: MIT */
/*
 * test-plan-page.c: a client that writes all over its plan page (proto/plan.h: the page is writable
 * by both sides).  tierd reads back only the client area, range-checked; what it wrote itself (where
 * a slot's pieces go, whether the plan failed) it keeps on its side and never takes from the page.
 */

#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>

#include "tests/unit/timeline-fixture.h"

/*
 * -Wl,--wrap: preadv2() (preadv64v2 with 64-bit off_t) answers EOPNOTSUPP on cue, as a kernel before
 * 5.12 does for an eventfd; read() of the watched fd is counted and never waits.
 */
ssize_t __real_preadv64v2(int fd, const struct iovec *iov, int n, off_t off, int flags);
ssize_t __real_read(int fd, void *buf, size_t len);
ssize_t __wrap_preadv64v2(int fd, const struct iovec *iov, int n, off_t off, int flags);
ssize_t __wrap_read(int fd, void *buf, size_t len);
static bool preadv_unsupported;
static int watched_fd = -1;
static unsigned watched_reads;

ssize_t __wrap_preadv64v2(int fd, const struct iovec *iov, int n, off_t off, int flags) {
        if (preadv_unsupported) {
                errno = EOPNOTSUPP;
                return -1;
        }
        return __real_preadv64v2(fd, iov, n, off, flags);
}

ssize_t __wrap_read(int fd, void *buf, size_t len) {
        if (fd >= 0 && fd == watched_fd) {
                watched_reads++;
                errno = EAGAIN;         /* what the blocking read did instead: wait for the client's next marker */
                return -1;
        }
        return __real_read(fd, buf, len);
}

/*
 * A host copy in two pieces (a 6 MiB tensor, 4 MiB segments): tierd writes its pieces at the slot's
 * own stretch of the page, wherever the client pointed first_piece (it used to write them at the
 * page's first_piece: a client's number, up to 2^32 pieces past the page, into tierd's memory).
 */
static void test_first_piece_not_read_back(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        Tensor *a, *b;
        Job *j;
        Rank *c;
        Plan *p;
        PlanSlot *s;
        const PlanPiece *pieces;
        uint32_t first, wrong;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", 6 * MiB);
        b = tensor(j, "B", MiB);
        fixture_host_data(m, a, 1);
        fixture_host_data(m, b, 2);
        {
                Acc acc[] = { { 0, b, LEVEL_HOST, PLAN_READ }, { 0, a, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 2, 1, &p, err, sizeof(err)), 0);
        }
        s = &p->page->slots[2 * 1 + LEVEL_HOST];        /* slot 1 is A */
        first = s->first_piece;
        pieces = plan_pieces(p->page, p->n_slots);
        /* in the page (a number past it crashed tierd), away from A's stretch */
        wrong = first + 8;
        assert_true((uint8_t *) &pieces[wrong + 2] <= (uint8_t *) p->page + p->page_size);
        s->first_piece = wrong;
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, PLAN_READY_SEQ(p->page->daemon.ready) == 1);
        assert_int_equal(p->page->daemon.error, 0);
        assert_int_equal(a->copy[LEVEL_HOST].n_pieces, 2);
        assert_int_equal(s->n_pieces, 2);
        assert_int_equal(s->first_piece, first);                /* said again */
        for (uint32_t i = 0; i < 2; i++) {
                const CopyPiece *cp = &a->copy[LEVEL_HOST].pieces[i];

                assert_int_equal(pieces[first + i].segment, cp->seg->pool->id_base + cp->seg->id);
                assert_int_equal(pieces[first + i].offset, cp->offset);
                assert_int_equal(pieces[first + i].length, cp->len);
                assert_int_equal(pieces[wrong + i].length, 0);  /* nothing written where the client said */
        }
        finish(m, j, c, p);
}

/*
 * The client writes the daemon area's error: tierd goes on with the plan (it used to take the page's
 * error for its own and stop tending the plan: no pins, no ready, no write-behind, and a real failure
 * of the plan went unlogged).
 */
static void test_error_not_read_back(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        Tensor *a;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        fixture_host_data(m, a, 1);
        {
                Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 1, 1, &p, err, sizeof(err)), 0);
        }
        __atomic_store_n(&p->page->daemon.error, -EIO, __ATOMIC_RELEASE);
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, p->hold[0].ready_sent);
        assert_true(p->hold[0].ready_sent);
        assert_int_equal(PLAN_READY_SEQ(p->page->daemon.ready), 1);
        finish(m, j, c, p);
}

/*
 * The client clears O_NONBLOCK on the marker eventfd (its fd shares tierd's open file description)
 * and sends a request without a new marker: tierd looks for a marker first (sched_plan_sync()) and
 * must not wait in read() for one (it did: tierd's loop stopped, every job with it).  alarm() turns
 * that old hang into a failure; the fixed read returns at once.
 */
static void test_marker_read_never_blocks(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        Tensor *a;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        fixture_host_data(m, a, 1);
        {
                Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 1, 1, &p, err, sizeof(err)), 0);
        }
        marker(m, p, 0);
        assert_int_equal(fcntl(p->marker_fd, F_SETFL, fcntl(p->marker_fd, F_GETFL) & ~O_NONBLOCK), 0);
        alarm(10);
        sched_plan_sync(p);                     /* nothing new: the eventfd reads 0 */
        alarm(0);
        assert_int_equal(p->seq, 1);
        marker(m, p, 0);                        /* and markers still come through */
        assert_int_equal(p->seq, 2);
        finish(m, j, c, p);
}

/*
 * No plain read() of the marker eventfd, not even where preadv2(RWF_NOWAIT) is unsupported: it was
 * the fallback there (kernels before 5.12), and a client that cleared O_NONBLOCK blocked tierd's loop
 * in it again.  tierd now refuses such a kernel at start (core/kernel.c, test-kernel) instead.
 */
static void test_marker_never_plain_read(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        Tensor *a;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        fixture_host_data(m, a, 1);
        {
                Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 1, 1, &p, err, sizeof(err)), 0);
        }
        marker(m, p, 0);
        assert_int_equal(fcntl(p->marker_fd, F_SETFL, fcntl(p->marker_fd, F_GETFL) & ~O_NONBLOCK), 0);
        watched_fd = p->marker_fd;
        watched_reads = 0;
        preadv_unsupported = true;
        sched_plan_sync(p);                     /* nothing new */
        preadv_unsupported = false;
        watched_fd = -1;
        assert_int_equal(watched_reads, 0);
        assert_int_equal(p->seq, 1);
        marker(m, p, 0);                        /* and markers still come through */
        assert_int_equal(p->seq, 2);
        finish(m, j, c, p);
}

/*
 * stall_ns is the client's number: a step's stall counts at most the time since the step began (the
 * client waits one phase at a time, each wait after its marker), and the job's counter
 * (tierd_job_plan_stall_seconds_total) never goes down.  A client that wrote 2^64 - 1, then 0, then
 * 2^64 - 1 again added about 2^64 ns twice: the counter wrapped and went down.
 */
static void test_stall_bounded(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        uint64_t t0, prev;
        Tensor *a;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        fixture_host_data(m, a, 1);
        {
                Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 1, 1, &p, err, sizeof(err)), 0);
        }
        t0 = now_ns();
        marker(m, p, 0);                        /* the first step begins */
        prev = j->plan_stall_ns;
        for (int i = 0; i < 4; i++) {
                p->page->client.stall_ns = i % 2 ? 0 : UINT64_MAX;
                marker(m, p, 0);                /* a step ends */
                assert_int_equal(j->plan_iterations, (uint64_t) i + 1);
                assert_true(j->plan_stall_ns >= prev);
                assert_true(j->plan_stall_ns <= now_ns() - t0);
                assert_true(p->last_stall_s * 1e9 <= (double) (now_ns() - t0));
                prev = j->plan_stall_ns;
        }
        finish(m, j, c, p);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_first_piece_not_read_back),
                cmocka_unit_test(test_error_not_read_back),
                cmocka_unit_test(test_marker_read_never_blocks),
                cmocka_unit_test(test_marker_never_plain_read),
                cmocka_unit_test(test_stall_bounded),
        };

        return fixture_main("plan-page", tests, sizeof(tests) / sizeof(tests[0]));
}
