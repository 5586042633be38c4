/* SPDX-License-Identifier: MIT */
/* test-renew.c: segments a job gives back get their new memory off the event loop (tiers/renew.c). */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/renew.h"
#include "daemon/tiers/segpool.h"
#include "tests/unit/fixture.h"

static void setup(Config *c, void *userdata) {
        c->host_capacity = 32 * MiB;
        c->host_segment_size = 4 * MiB;
        c->host_job_limit = 32 * MiB;
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
 * A job holding six of the pool's eight segments ends while the renewer is
 * held: the loop goes on serving (another job's pin into a free segment
 * completes, and a pin that needs one of the six waits instead of failing)
 * before any of the six is renewed; released, they come back with a new
 * generation and zeroed memory, and the waiting pin completes.  Orders, not
 * times: nothing of the six's renewal can run on the loop.
 */
static void test_renew_off_the_loop(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        SegPool *pool = &m->host.pool;
        Tensor *big[6], *small, *later;
        uint32_t gen[8];
        Job *a, *b;
        Done d1 = {}, d2 = {};
        Op *op;

        assert_non_null(pool->renewer);
        assert_int_equal(pool->n_segs, 8);
        assert_int_equal(job_new(m->registry, "big", 0, &a), 0);
        for (int i = 0; i < 6; i++) {
                char name[8];

                snprintf(name, sizeof(name), "t%d", i);
                big[i] = fixture_tensor(a, name, 4 * MiB);
                fixture_host_data(m, big[i], 0xa5);     /* one whole segment each, written */
        }
        assert_int_equal(pool->n_free, 2);
        for (uint32_t i = 0; i < pool->n_segs; i++)
                gen[i] = pool->segs[i].generation;

        segrenewer_hold(pool->renewer, true);
        job_destroy(a);                                 /* its six segments go to the renewer */
        assert_int_equal(pool->n_renewing, 6);
        assert_int_equal(segrenewer_pending(pool->renewer), 6);
        assert_int_equal(pool->n_free, 2);

        /* the loop serves another job meanwhile: a pin into one of the two free segments */
        assert_int_equal(job_new(m->registry, "other", 0, &b), 0);
        small = fixture_tensor(b, "small", 4 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, small, LEVEL_HOST, on_done, NULL, &d1, NULL), 0);
        FIXTURE_RUN_UNTIL(m, d1.done);
        assert_int_equal(d1.status, 0);
        assert_int_equal(pool->n_renewing, 6);          /* still: the renewal ran nowhere */
        assert_int_equal(tensor_unpin(small, LEVEL_HOST, false), 0);

        /* two more whole segments: one is free, the next must wait for the renewer, not fail */
        later = fixture_tensor(b, "later", 8 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, later, LEVEL_HOST, on_done, NULL, &d2, &op), 0);
        fixture_run(m, 20);
        assert_int_equal(d2.done, 0);
        assert_int_equal(pool->n_renewing, 6);

        segrenewer_hold(pool->renewer, false);
        FIXTURE_RUN_UNTIL(m, d2.done && pool->n_renewing == 0);
        assert_int_equal(d2.done, 1);
        assert_int_equal(d2.status, 0);
        assert_int_equal(pool->n_renewing, 0);
        assert_int_equal(segrenewer_pending(pool->renewer), 0);
        for (uint32_t i = 0, renewed = 0; i < pool->n_segs; i++) {
                Segment *s = &pool->segs[i];

                if (s->generation != gen[i]) {
                        renewed++;
                        assert_true(s->fd >= 0);
                        assert_non_null(s->map);
                        if (!s->owner)          /* fresh memory: zeros, not the old job's 0xa5 */
                                for (uint64_t k = 0; k < pool->seg_size; k += 4096)
                                        assert_int_equal(((uint8_t *) s->map)[k], 0);
                }
                if (i == pool->n_segs - 1)
                        assert_int_equal(renewed, 6);
        }
        assert_int_equal(tensor_unpin(later, LEVEL_HOST, false), 0);
        job_destroy(b);
        FIXTURE_RUN_UNTIL(m, pool->n_renewing == 0);
        assert_int_equal(pool->n_free, 8);
        fixture_free(m);
}

/* tierd's exit with renewals queued and held: the renewer ends first, nothing leaks (ASan, valgrind). */
static void test_exit_while_renewing(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        SegPool *pool = &m->host.pool;
        Job *a;

        assert_int_equal(job_new(m->registry, "big", 0, &a), 0);
        for (int i = 0; i < 4; i++) {
                char name[8];

                snprintf(name, sizeof(name), "t%d", i);
                fixture_host_data(m, fixture_tensor(a, name, 4 * MiB), 1);
        }
        segrenewer_hold(pool->renewer, true);
        job_destroy(a);
        assert_int_equal(pool->n_renewing, 4);
        fixture_free(m);
}

/* A renewal that fails: the segment stays out of service (renew.c), like a host pool's mlock refused. */
static int make_memory_fails(SegPool *p, Segment *seg, uint64_t size) {
        return -ENOMEM;
}

/*
 * Every renewal of a batch fails: a pin waiting for those segments (reclaim and copy_reserve wait while
 * segments renew) is woken all the same, and fails for want of room, instead of waiting for
 * segments that never come.  Before, the waiters were woken only when a segment came back: the pin
 * waited for good.  Orders, not times: the renewer is held until the pin waits.
 */
static void test_renew_fails_wakes(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        SegPool *pool = &m->host.pool;
        const SegPoolOps *ops = pool->ops;
        SegPoolOps failing = *ops;
        Tensor *t;
        Done d = {};
        Job *a, *b;

        assert_int_equal(job_new(m->registry, "big", 0, &a), 0);
        for (int i = 0; i < 8; i++) {
                char name[8];

                snprintf(name, sizeof(name), "t%d", i);
                fixture_host_data(m, fixture_tensor(a, name, 4 * MiB), 1);
        }
        assert_int_equal(pool->n_free, 0);
        segrenewer_hold(pool->renewer, true);
        job_destroy(a);
        assert_int_equal(pool->n_renewing, 8);

        assert_int_equal(job_new(m->registry, "other", 0, &b), 0);
        t = fixture_tensor(b, "t", 4 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_done, NULL, &d, NULL), 0);
        fixture_run(m, 5);
        assert_int_equal(d.done, 0);                    /* waiting for the renewer */

        failing.make_memory = make_memory_fails;
        pool->ops = &failing;
        segrenewer_hold(pool->renewer, false);
        FIXTURE_RUN_UNTIL(m, pool->n_renewing == 0 && d.done);
        assert_int_equal(pool->n_renewing, 0);
        assert_int_equal(d.done, 1);
        assert_true(d.status < 0);                   /* (the eight are out of service: no room) */
        pool->ops = ops;
        job_destroy(b);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_renew_off_the_loop),
                cmocka_unit_test(test_exit_while_renewing),
                cmocka_unit_test(test_renew_fails_wakes),
        };
        return fixture_main("renew", tests, sizeof(tests) / sizeof(tests[0]));
}
