/* SPDX-License-Identifier: MIT */
/* test-csum.c: the NVMe extents' crc32c on worker threads, handed back on the loop (tiers/csum.c, engine/xfer.c). */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/csum.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/crc32c.h"
#include "tests/unit/fixture.h"

#define N_JOBS 64

typedef struct Item {
        CsumJob job;
        pthread_t called_on;
        int calls;
        int order;              /* the how-many-th callback this was */
} Item;

static int n_called;
static Csum *requeue_into;      /* test_csum_callbacks: the first callback queues item requeue_item */
static Item *requeue_item;

static void on_summed(CsumJob *job) {
        Item *it = container_of(job, Item, job);

        it->called_on = pthread_self();
        it->calls++;
        it->order = n_called++;
        if (requeue_into && requeue_item) {
                Item *again = requeue_item;

                requeue_item = NULL;
                csum_queue(requeue_into, &again->job);
        }
}

/* Run @e until @n callbacks ran, or FIXTURE_NEVER_USEC passed. */
static void run_until_called(sd_event *e, int n) {
        uint64_t deadline = fixture_deadline();

        while (n_called < n) {
                struct timespec ts;

                clock_gettime(CLOCK_MONOTONIC, &ts);
                if ((uint64_t) ts.tv_sec * 1000000ull + (uint64_t) ts.tv_nsec / 1000 > deadline)
                        break;
                assert_true(sd_event_run(e, 2000) >= 0);
        }
}

/*
 * Every job comes back with crc32c of its bytes, once, on the loop's
 * thread, whatever the number of workers (0: computed in csum_queue(), still
 * handed back through the loop, never inside csum_queue()); a callback may
 * queue another job.
 */
static void test_csum_callbacks(void **state) {
        static uint8_t buf[N_JOBS][9000];
        const unsigned threads[] = { 0, 1, 3 };

        for (size_t i = 0; i < N_JOBS; i++)
                for (size_t k = 0; k < sizeof(buf[i]); k++)
                        buf[i][k] = (uint8_t) (i * 31 + k * 7 + (k >> 8));

        for (size_t w = 0; w < ELEMENTSOF(threads); w++) {
                Item items[N_JOBS + 1] = {};
                sd_event *e = NULL;
                Csum *c = NULL;

                assert_int_equal(sd_event_new(&e), 0);
                assert_int_equal(csum_new(e, threads[w], &c), 0);
                assert_int_equal(csum_threads(c), threads[w]);
                n_called = 0;
                requeue_into = c;
                requeue_item = &items[N_JOBS];
                items[N_JOBS].job = (CsumJob) { .buf = buf[0], .len = 4096, .cb = on_summed };
                for (size_t i = 0; i < N_JOBS; i++) {
                        items[i].job = (CsumJob) { .buf = buf[i], .len = sizeof(buf[i]) - i, .cb = on_summed };
                        csum_queue(c, &items[i].job);
                }
                assert_int_equal(n_called, 0);          /* not inside csum_queue(), even on the loop */
                assert_int_equal(csum_pending(c), N_JOBS);
                run_until_called(e, N_JOBS + 1);
                assert_int_equal(n_called, N_JOBS + 1);
                assert_int_equal(csum_pending(c), 0);
                for (size_t i = 0; i <= N_JOBS; i++) {
                        assert_int_equal(items[i].calls, 1);
                        assert_true(pthread_equal(items[i].called_on, pthread_self()));
                        assert_int_equal(items[i].job.crc, crc32c(0, items[i].job.buf, items[i].job.len));
                }
                assert_true(items[N_JOBS].order > 0);   /* queued by the first callback: after it (in any batch) */
                assert_int_equal(csum_bytes_off_loop(c),
                                 threads[w] == 0 ? 0 : (N_JOBS * sizeof(buf[0]) - N_JOBS * (N_JOBS - 1) / 2 + 4096));
                requeue_into = NULL;
                c = csum_free(c);
                e = sd_event_unref(e);
        }
        assert_int_equal(csum_new(NULL, CSUM_THREADS_MAX + 1, &(Csum *) { NULL }), -EINVAL);
}

/* Held, the workers take nothing: the loop runs on and no callback comes; freed held, none ever does (no leak). */
static void test_csum_hold_and_free(void **state) {
        static uint8_t buf[4096];
        Item items[4] = {};
        sd_event *e = NULL;
        Csum *c = NULL;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(csum_new(e, 2, &c), 0);
        n_called = 0;
        csum_hold(c, true);
        for (size_t i = 0; i < ELEMENTSOF(items); i++) {
                items[i].job = (CsumJob) { .buf = buf, .len = sizeof(buf), .cb = on_summed };
                csum_queue(c, &items[i].job);
        }
        for (int i = 0; i < 10; i++)
                assert_true(sd_event_run(e, 1000) >= 0);
        assert_int_equal(n_called, 0);
        assert_int_equal(csum_pending(c), 4);
        csum_hold(c, false);
        run_until_called(e, 4);
        assert_int_equal(n_called, 4);

        csum_hold(c, true);
        csum_queue(c, &items[0].job);
        c = csum_free(c);
        assert_int_equal(n_called, 4);
        assert_int_equal(items[0].calls, 1);
        sd_event_unref(e);
}

static void setup(Config *c, void *userdata) {
        c->host_capacity = 16 * MiB;
        c->host_segment_size = 4 * MiB;
        c->host_job_limit = 16 * MiB;
        c->nvme_extent_size = 256 * 1024;
}

typedef struct Done {
        int done;
        int status;
} Done;

static void on_done(Op *op, int status, const char *error) {
        Done *d = op->userdata;

        d->done = 1;
        d->status = status;
}

/*
 * With the checksum workers held, an eviction to NVMe writes nothing to the
 * drive (no write goes before its crc32c is taken) and a fetch back stays
 * unfinished (no read counts before its crc32c is checked) while the loop
 * serves another job's pins; released, both end and the bytes come back.
 * Orders, not times: the checksums cannot have run on the loop.
 */
static void test_engine_checksums_off_the_loop(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        NvmeTarget *tg = &m->nvme->targets[0];
        Tensor *t, *other, *third;
        Done ev = {}, back = {}, pin = {}, pin2 = {};
        uint64_t written;
        Job *a, *b;

        assert_non_null(m->csum);
        assert_int_equal(csum_threads(m->csum), 1);
        assert_ptr_equal(m->engine->csum, m->csum);
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        assert_int_equal(job_new(m->registry, "b", 0, &b), 0);
        t = fixture_tensor(a, "t", 1 * MiB + 4096);     /* 5 extents, the last one short */
        fixture_host_data(m, t, 0x5a);

        csum_hold(m->csum, true);
        written = tg->bytes_written;
        assert_int_equal(op_submit(m->engine, OP_EVICT, t, LEVEL_NVME, on_done, NULL, &ev, NULL), 0);
        other = fixture_tensor(b, "other", 1 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, other, LEVEL_HOST, on_done, NULL, &pin, NULL), 0);
        FIXTURE_RUN_UNTIL(m, pin.done);
        assert_int_equal(pin.status, 0);
        fixture_run(m, 20);
        assert_int_equal(ev.done, 0);
        assert_int_equal(tg->bytes_written, written);   /* not one byte before its checksum */
        assert_true(csum_pending(m->csum) >= 1);
        csum_hold(m->csum, false);
        FIXTURE_RUN_UNTIL(m, ev.done);
        assert_int_equal(ev.status, 0);
        assert_int_equal(tg->bytes_written - written, t->alloc_size);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_false(copy_valid(t, LEVEL_HOST));

        csum_hold(m->csum, true);
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_done, NULL, &back, NULL), 0);
        third = fixture_tensor(b, "third", 1 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, third, LEVEL_HOST, on_done, NULL, &pin2, NULL), 0);
        FIXTURE_RUN_UNTIL(m, pin2.done && tg->bytes_read >= t->alloc_size);
        assert_int_equal(pin2.status, 0);
        assert_true(tg->bytes_read >= t->alloc_size);  /* the reads are done: their checks are not */
        fixture_run(m, 20);
        assert_int_equal(back.done, 0);
        assert_false(copy_valid(t, LEVEL_HOST));
        csum_hold(m->csum, false);
        FIXTURE_RUN_UNTIL(m, back.done);
        assert_int_equal(back.status, 0);
        for (uint64_t off = 0; off < t->size; off += 4093)
                assert_int_equal(fixture_byte(t, LEVEL_HOST, off), 0x5a);
        assert_int_equal(tg->crc_errors, 0);
        assert_true(csum_bytes_off_loop(m->csum) >= 2 * t->alloc_size);

        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        assert_int_equal(tensor_unpin(other, LEVEL_HOST, false), 0);
        assert_int_equal(tensor_unpin(third, LEVEL_HOST, false), 0);
        fixture_free(m);
}

/* Whether @deadline (fixture_deadline()) is still ahead. */
static bool now_before(uint64_t deadline) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000ull + (uint64_t) ts.tv_nsec / 1000 <= deadline;
}

/*
 * A client that writes its host copy while tierd writes it to NVMe (it may:
 * its segment is mapped writable): the crc32c taken before the write no
 * longer describes what the drive got.  That is the client's doing, not the
 * drive's: the write-down fails, the job counts it (Job.nvme_host_changed),
 * the source stays, and the target's crc_errors stays 0 (before, the
 * write-down succeeded and the read back counted a crc error on the target).
 * The order is explicit: the workers take the checksums, the client writes,
 * and only then does the loop hand the writes to the ring.
 */
static void test_host_written_during_write_down(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        NvmeTarget *tg = &m->nvme->targets[0];
        Done ev = {}, back = {};
        uint64_t off_loop, deadline = fixture_deadline();
        Tensor *t;
        Job *a;

        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        t = fixture_tensor(a, "t", 1 * MiB);            /* 4 extents */
        fixture_host_data(m, t, 0x5a);

        csum_hold(m->csum, true);
        off_loop = csum_bytes_off_loop(m->csum);
        assert_int_equal(op_submit(m->engine, OP_EVICT, t, LEVEL_NVME, on_done, NULL, &ev, NULL), 0);
        fixture_run(m, 2);
        assert_int_equal(csum_pending(m->csum), 4);
        csum_hold(m->csum, false);
        /* the checksums are taken, the loop has not run: no write is with the ring yet */
        while (csum_bytes_off_loop(m->csum) - off_loop < t->alloc_size && now_before(deadline))
                sched_yield();
        assert_int_equal(csum_bytes_off_loop(m->csum) - off_loop, t->alloc_size);
        fixture_fill(t, LEVEL_HOST, 0xa5);              /* the client writes, unannounced */
        FIXTURE_RUN_UNTIL(m, ev.done);
        assert_true(ev.done);
        if (!copy_valid(t, LEVEL_HOST)) {               /* the write-down counted as good: read it back */
                assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_done, NULL, &back, NULL), 0);
                FIXTURE_RUN_UNTIL(m, back.done);
        }
        assert_int_equal(tg->crc_errors, 0);            /* the drive is not at fault */
        assert_int_equal(ev.status, -EIO);
        assert_int_equal(a->nvme_host_changed, 4);
        assert_false(copy_valid(t, LEVEL_NVME));
        assert_true(copy_valid(t, LEVEL_HOST));         /* the source stays, with the client's bytes */
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 12345), 0xa5);
        fixture_free(m);
}

static void setup_on_loop(Config *c, void *userdata) {
        setup(c, userdata);
        c->nvme_checksum_threads = 0;
}

/* [nvme] checksum_threads = 0: the same transfers, the checksums on the loop (nothing counted off it). */
static void test_engine_checksums_on_the_loop(void **state) {
        Manager *m = fixture_new(64 * MiB, setup_on_loop, NULL);
        Tensor *t;
        Job *a;

        assert_int_equal(csum_threads(m->csum), 0);
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        t = fixture_tensor(a, "t", 3 * MiB);
        fixture_host_data(m, t, 0xc3);
        fixture_on_nvme(m, t);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        for (uint64_t off = 0; off < t->size; off += 4093)
                assert_int_equal(fixture_byte(t, LEVEL_HOST, off), 0xc3);
        assert_int_equal(csum_bytes_off_loop(m->csum), 0);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_csum_callbacks),
                cmocka_unit_test(test_csum_hold_and_free),
                cmocka_unit_test(test_engine_checksums_off_the_loop),
                cmocka_unit_test(test_engine_checksums_on_the_loop),
                cmocka_unit_test(test_host_written_during_write_down),
        };

        return fixture_main("csum", tests, ELEMENTSOF(tests));
}
