/* SPDX-License-Identifier: MIT */
/*
 * test-nvme-failures.c: what the scheduler and the engine do after an NVMe transfer failed for
 * good (a crc32c mismatch, a write the drive refuses), or a VRAM copy failed: nothing is started
 * again and again.
 */

#include "tests/unit/timeline-fixture.h"

#include "daemon/state/book-private.h"
#include "daemon/state/book.h"
#include "daemon/tiers/fault.h"
#include "daemon/tiers/tier-nvme.h"

static unsigned n_prefetch_t2;

static void count_prefetches(void *userdata, const char *what, const Tensor *t, int tier, uint64_t deadline) {
        if (strcmp(what, "prefetch") == 0 && strcmp(t->name, "t2") == 0)
                n_prefetch_t2++;
        record(userdata, what, t, tier, deadline);
}

/*
 * A scheduler prefetch whose read fails for good (t2's extent no longer
 * matches its crc32c) is not started again for the same version and NVMe
 * copy.  It used to be started anew at every pass until the phase that
 * needs it came: the corrupt extent read in a loop.
 */
static void test_prefetch_failed_for_good_not_retried(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 3 * MiB);
        Tensor *t[6];
        Job *j;
        Rank *c;
        Plan *p;
        char err[256], name[8];
        Acc acc[6];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        for (int i = 0; i < 6; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                t[i] = tensor(j, name, MiB);
                make_on_nvme(m, t[i]);
                acc[i] = (Acc) { (unsigned) i, t[i], LEVEL_HOST, PLAN_READ };
        }
        t[2]->copy[LEVEL_NVME].extents[0].crc ^= 1;     /* its extent went bad on the medium */
        sched_set_trace(m->sched, count_prefetches, NULL);
        n_prefetch_t2 = 0;
        assert_int_equal(submit_plan(c, acc, 6, 6, &p, err, sizeof(err)), 0);
        set_durations(p, 10000);                /* phase 2 is ~20 s away: only a prefetch reads t2 */
        sched_run(m->sched);
        FIXTURE_RUN_UNTIL(m, n_prefetch_t2 >= 1 && !t[2]->sched_op);
        assert_int_equal(n_prefetch_t2, 1);
        assert_true(m->nvme->targets[0].crc_errors >= 1);
        run_loop(m, 300);
        assert_int_equal(n_prefetch_t2, 1);
        assert_false(copy_valid(t[2], LEVEL_HOST));
        finish(m, j, c, p);
}

static unsigned n_clean[8];

static void count_cleans(void *userdata, const char *what, const Tensor *t, int tier, uint64_t deadline) {
        if (strcmp(what, "clean") == 0)
                n_clean[(unsigned char) t->name[0] % 8]++;
        record(userdata, what, t, tier, deadline);
}

/*
 * Write-behind of sole host copies to a drive that fails every write: each
 * copy's failed clean is not started again before room is freed on NVMe
 * (Tensor.drain_blocked, as for a drain).  It used to be started anew at
 * every pass: an endless loop of failing writes and error logs.
 */
static void test_failed_write_behind_not_retried(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 3 * MiB);
        Tensor *a, *b, *d, *e, *cc;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];
        unsigned total = 0;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        d = tensor(j, "D", MiB);
        e = tensor(j, "E", MiB);
        cc = tensor(j, "C", MiB);
        make_on_nvme(m, cc);
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 1, b, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 2, d, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 3, e, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 4, cc, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 5, 5, &p, err, sizeof(err)), 0);
        }
        sched_set_trace(m->sched, count_cleans, NULL);
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        m->faults->rules[0].after = 0;          /* from here on every NVMe write fails */
        memset(n_clean, 0, sizeof(n_clean));
        marker(m, p, 1);
        FIXTURE_RUN_UNTIL(m, n_clean['A' % 8] >= 1 && !a->sched_op);
        assert_int_equal(n_clean['A' % 8], 1);
        run_loop(m, 300);
        for (int i = 0; i < 8; i++) {
                assert_true(n_clean[i] <= 1);
                total += n_clean[i];
        }
        assert_true(m->nvme->targets[0].io_errors >= 1 && m->nvme->targets[0].io_errors <= total);
        assert_true(copy_valid(a, LEVEL_HOST));
        assert_false(copy_valid(a, LEVEL_NVME));
        finish(m, j, c, p);
}

/* fdatasync() of one NVMe target fails with EIO (the drive could not flush what it took) */
int __real_fdatasync(int fd);
int __wrap_fdatasync(int fd);
static volatile int fail_sync_fd = -1;

int __wrap_fdatasync(int fd) {
        if (fd == fail_sync_fd) {
                errno = EIO;
                return -1;
        }
        return __real_fdatasync(fd);
}

static void setup_small(Config *c, void *userdata) {
        c->host_job_limit = 4 * MiB;
}

typedef struct Done {
        int done, status;
        char msg[512];
} Done;

static void on_done(Op *op, int status, const char *error) {
        Done *d = op->userdata;

        d->done++;
        d->status = status;
        snprintf(d->msg, sizeof(d->msg), "%s", error ? error : "");
}

/*
 * A write-down whose target cannot make it durable (its fdatasync() fails)
 * fails with that errno: the host copy, the only one, stays, the NVMe copy
 * goes, the target counts an I/O error and the NVMe index stays on.  It
 * used to be reported written, the host copy dropped, and the index of
 * every job thrown away as if the state directory were full.
 */
static void test_target_sync_failure_fails_the_write_down(void **state) {
        Manager *m = fixture_new(64 * MiB, setup_small, NULL);
        Done d = {};
        Job *j;
        Tensor *t, *u;
        Op *op;

        assert_non_null(m->registry->book);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->registry->book, j);        /* as a Hello does (ipc/rpc.c) */
        t = fixture_tensor(j, "T", MiB);
        u = fixture_tensor(j, "U", MiB);
        assert_true(t->book_key != 0);
        fixture_host_data(m, t, 0x5a);
        fail_sync_fd = m->nvme->targets[0].fd;
        assert_int_equal(op_submit(m->engine, OP_EVICT, t, LEVEL_NVME, on_done, NULL, &d, &op), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        fail_sync_fd = -1;
        assert_int_equal(d.done, 1);
        assert_int_equal(d.status, -EIO);
        assert_non_null(strstr(d.msg, "fdatasync"));
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_false(copy_valid(t, LEVEL_NVME));
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 5), 0x5a);
        assert_true(m->nvme->targets[0].io_errors >= 1);
        assert_false(m->registry->book->off_books);
        assert_int_not_equal(t->book_state, BOOK_T_NVME);
        /* the book goes on: the next write-down is recorded and reported */
        fixture_host_data(m, u, 7);
        assert_int_equal(fixture_op(m, OP_EVICT, u, LEVEL_NVME), 0);
        assert_true(copy_valid(u, LEVEL_NVME));
        assert_int_equal(u->book_state, BOOK_T_NVME);
        assert_false(m->registry->book->off_books);
        job_destroy(j);
        fixture_free(m);
}

/*
 * The link counters and the trace say what moved: a write-down whose fdatasync() fails moved
 * nothing that counts (the client is told it failed), so host->nvme does not grow, for tierd or
 * the job, and its trace record has the error and 0 bytes; the next write-down counts its bytes.
 * Its bytes used to be counted once the drive took them, before the flush that failed: a link
 * (and the trace: "bytes 0 for a failed transfer") said a failed write-down moved 1 MiB.
 */
static void test_sync_failure_counts_no_bytes(void **state) {
        Manager *m = fixture_new(64 * MiB, setup_small, NULL);
        Trace *tr = &m->engine->trace;
        Done d = {};
        Job *j;
        Tensor *t, *u;
        Op *op;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        book_job(m->registry->book, j);
        t = fixture_tensor(j, "T", MiB);
        u = fixture_tensor(j, "U", MiB);
        fixture_host_data(m, t, 0x5a);
        assert_int_equal(trace_start(tr, 16, now_ns()), 0);
        fail_sync_fd = m->nvme->targets[0].fd;
        assert_int_equal(op_submit(m->engine, OP_EVICT, t, LEVEL_NVME, on_done, NULL, &d, &op), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        fail_sync_fd = -1;
        assert_int_equal(d.status, -EIO);
        assert_int_equal(m->nvme->targets[0].bytes_written, MiB);     /* the drive took them */
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, 0);
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].ops, 0);
        assert_int_equal(j->link_bytes[LINK_HOST_TO_NVME], 0);
        assert_int_equal(tr->n, 1);
        assert_int_equal(tr->rec[0].kind, TRACE_XFER);
        assert_int_equal(tr->rec[0].link, LINK_HOST_TO_NVME);
        assert_int_equal(tr->rec[0].bytes, 0);
        assert_int_equal(tr->rec[0].error, -EIO);
        /* one that goes through counts, once */
        fixture_host_data(m, u, 7);
        assert_int_equal(fixture_op(m, OP_EVICT, u, LEVEL_NVME), 0);
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, MiB);
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].ops, 1);
        assert_int_equal(j->link_bytes[LINK_HOST_TO_NVME], MiB);
        assert_int_equal(tr->n, 2);
        assert_int_equal(tr->rec[1].bytes, MiB);
        assert_int_equal(tr->rec[1].error, 0);
        trace_reset(tr);
        job_destroy(j);
        fixture_free(m);
}

/*
 * A stale host copy client A holds for reading, whose refill in place failed (VRAM -> host: its bytes
 * are garbage, kept under A's pin), is pinned for reading by D while A still holds it: the refill in
 * place must make it the tensor's bytes, with one transfer.  A fill that went through kept the copy's
 * "unwritten" of the failed one, so it was never valid, and the pin refilled it again, forever.
 */
static void test_garbage_refilled_under_a_reader(void **state) {
        Manager *m;
        Tensor *t;
        Job *j;
        uint64_t moved = 0, now = 0;

        setenv("TIERD_TEST_FAULTS", "vram-d2h-eio:count=1", 1);
        m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        unsetenv("TIERD_TEST_FAULTS");
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x11);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);      /* client A reads it */
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);      /* client B writes VRAM */
        fixture_fill(t, LEVEL_VRAM, 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, true), 0);
        assert_true(fixture_op(m, OP_PIN, t, LEVEL_HOST) < 0);          /* C: the VRAM -> host copy fails */
        assert_true(t->copy[LEVEL_HOST].unwritten);                     /* A's garbage */
        for (int i = 0; i < _LINK_MAX; i++)
                moved += j->link_bytes[i];
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);      /* D, while A holds it */
        for (int i = 0; i < _LINK_MAX; i++)
                now += j->link_bytes[i];
        assert_int_equal(now, moved + MiB);                             /* one refill, not one after another */
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        assert_int_equal(engine_tensor_free(m->engine, t), 0);
        job_destroy(j);
        fixture_free(m);
}

static void setup_short_nvme(Config *c, void *userdata) {
        c->nvme_extent_size = 64 * 1024;
        c->nvme_job_limit = 64 * 1024;          /* one 64 KiB copy */
}

/*
 * A host tier full of small sole copies whose job has no room left on NVMe:
 * a pin that needs room tries one write-down, which fails for want of room
 * below, and then fails itself, every other victim as large passed over as
 * blocked (engine/blocked.c).  It used to drain the copies one after the
 * other, each failing the same way and each failure ranking all of them
 * again, all in one run of the loop: with 65536 4 KiB tensors, minutes in
 * which tierd served no one.  Room freed on NVMe unblocks them.
 */
static void test_full_nvme_tries_one_drain(void **state) {
        Manager *m = fixture_new(64 * MiB, setup_short_nvme, NULL);
        enum { N = 64 };                        /* 64 x 64 KiB: the job's 4 MiB host limit */
        Tensor *t[N], *x, *want;
        unsigned tried = 0;
        char name[8];
        Done d = {};
        Op *op;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        x = fixture_tensor(j, "X", 64 * 1024);
        fixture_on_nvme(m, x);                  /* the job's nvme limit, sole there */
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                t[i] = fixture_tensor(j, name, 64 * 1024);
                fixture_host_data(m, t[i], (uint8_t) i);
        }
        want = fixture_tensor(j, "W", 64 * 1024);
        assert_int_equal(op_submit(m->engine, OP_PIN, want, LEVEL_HOST, on_done, NULL, &d, &op), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_int_equal(d.status, -ENOSPC);
        assert_non_null(strstr(d.msg, "64 of its tensors there cannot be written down to nvme"));
        for (int i = 0; i < N; i++) {
                assert_true(copy_valid(t[i], LEVEL_HOST));
                tried += t[i]->drain_blocked[LEVEL_HOST] != 0;
        }
        assert_int_equal(tried, 1);             /* one write-down tried, not 64 */
        /* room on NVMe: they may go again */
        assert_int_equal(engine_tensor_free(m->engine, x), 0);
        assert_int_equal(fixture_op(m, OP_PIN, want, LEVEL_HOST), 0);
        assert_int_equal(tensor_unpin(want, LEVEL_HOST, false), 0);
        assert_true(copy_valid(t[0], LEVEL_NVME));
        job_destroy(j);
        fixture_free(m);
}

/*
 * A write-down from VRAM that found no room in host because the job's host
 * copies were all pinned: once they are unpinned, host room can be made
 * (by writing them down to NVMe), though no host copy was freed.  The
 * job's other VRAM victims must still be tried then: a VRAM pin that needs
 * room succeeds.  (Job.drain_short blocked every victim as large until a
 * host copy happened to be freed: the pin failed -ENOSPC, "2 of its
 * tensors there cannot be written down to host".)
 */
static void test_unpinned_below_unblocks_drains(void **state) {
        Manager *m = fixture_new(64 * MiB, NULL, NULL);
        Tensor *v[2], *h[4], *want;
        char name[8];
        Done d = {};
        Op *op;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (int i = 0; i < 2; i++) {           /* the job's 2 MiB of vram, sole there */
                snprintf(name, sizeof(name), "v%d", i);
                v[i] = fixture_tensor(j, name, MiB);
                fixture_touch(m, v[i], LEVEL_VRAM, true);
                assert_true(copy_valid(v[i], LEVEL_VRAM) && !copy_valid(v[i], LEVEL_HOST));
        }
        for (int i = 0; i < 4; i++) {           /* the job's 4 MiB of host, pinned */
                snprintf(name, sizeof(name), "h%d", i);
                h[i] = fixture_tensor(j, name, MiB);
                assert_int_equal(fixture_op(m, OP_PIN, h[i], LEVEL_HOST), 0);
        }
        want = fixture_tensor(j, "W", MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, want, LEVEL_VRAM, on_done, NULL, &d, &op), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_int_equal(d.status, -ENOSPC);
        /* the client lets its host pins go, written: room in host can be made now */
        for (int i = 0; i < 4; i++)
                assert_int_equal(tensor_unpin(h[i], LEVEL_HOST, true), 0);
        d = (Done) {};
        assert_int_equal(op_submit(m->engine, OP_PIN, want, LEVEL_VRAM, on_done, NULL, &d, &op), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_string_equal(d.msg, "");
        assert_int_equal(d.status, 0);
        assert_int_equal(tensor_unpin(want, LEVEL_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_prefetch_failed_for_good_not_retried),
                cmocka_unit_test(test_failed_write_behind_not_retried),
                cmocka_unit_test(test_target_sync_failure_fails_the_write_down),
                cmocka_unit_test(test_sync_failure_counts_no_bytes),
                cmocka_unit_test(test_garbage_refilled_under_a_reader),
                cmocka_unit_test(test_full_nvme_tries_one_drain),
                cmocka_unit_test(test_unpinned_below_unblocks_drains),
        };

        /* a rule that does not fire until a test arms it (after = 0) */
        setenv("TIERD_TEST_FAULTS", "nvme-write-eio:after=4000000000", 1);

        return fixture_main("nvme-failures", tests, sizeof(tests) / sizeof(tests[0]));
}
