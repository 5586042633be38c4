/* SPDX-License-Identifier: MIT */
/* test-reclaim.c: room taken back from other jobs (engine/reclaim.c): how much, and from whom. */

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

/* A host pool of four 4 MiB segments, all of it for one job. */
static void setup(Config *c, void *userdata) {
        c->host_capacity = 16 * MiB;
        c->host_segment_size = 4 * MiB;
        c->host_job_limit = 16 * MiB;
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

/* @n tensors of 4 MiB (a segment each) of @j named PREFIX0.., written in host (their sole copy). */
static void fill(Manager *m, Job *j, const char *prefix, Tensor **t, unsigned n) {
        for (unsigned i = 0; i < n; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "%s%u", prefix, i);
                t[i] = fixture_tensor(j, name, 4 * MiB);
                fixture_host_data(m, t[i], (uint8_t) (0x10 + i));
        }
}

/*
 * A segment reclaim emptied for a requester goes to the renewer (its memory is replaced) before the pool
 * hands it over: the requester waits for it.  Its retry found the pool still dry and no drain in flight,
 * and emptied another segment of the victim: a 4 MiB pin took 8 MiB from 'a', which went below what it had
 * above its share for nothing.  The renewer is held, so the order is explicit: the retry that finds the
 * segment renewing runs before it comes back.
 */
static void test_renewing_segment_is_coming(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        SegPool *pool = &m->host.pool;
        Tensor *ta[4], *tb;
        Job *a, *b;
        Done d = {};

        assert_non_null(pool->renewer);
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        assert_int_equal(job_new(m->registry, "b", 0, &b), 0);
        a->n_conns = b->n_conns = 1;    /* both live: shares of 8 MiB each */
        fill(m, a, "a", ta, 4);
        assert_int_equal(pool->n_free, 0);
        assert_int_equal(engine_job_share(m->engine, a, LEVEL_HOST), 8 * MiB);

        segrenewer_hold(pool->renewer, true);
        tb = fixture_tensor(b, "b", 4 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, tb, LEVEL_HOST, on_done, NULL, &d, NULL), 0);
        /* a segment of 'a' is written down and emptied for 'b', and goes to the renewer */
        FIXTURE_RUN_UNTIL(m, pool->n_renewing == 1);
        assert_int_equal(pool->n_renewing, 1);
        assert_int_equal(d.done, 0);
        assert_int_equal(a->used[LEVEL_HOST], 12 * MiB);
        for (unsigned i = 0; i < 4; i++)
                assert_int_not_equal(ta[i]->copy[LEVEL_HOST].state, COPY_DRAINING);
        /* once it is back, 'b' has it; 'a' gave one segment, no more */
        segrenewer_hold(pool->renewer, false);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_int_equal(d.status, 0);
        assert_int_equal(b->used[LEVEL_HOST], 4 * MiB);
        assert_int_equal(a->used[LEVEL_HOST], 12 * MiB);
        assert_int_equal(tensor_unpin(tb, LEVEL_HOST, false), 0);
        a->n_conns = b->n_conns = 0;
        job_destroy(a);
        job_destroy(b);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_renewing_segment_is_coming),
        };

        return fixture_main("reclaim", tests, ELEMENTSOF(tests));
}
