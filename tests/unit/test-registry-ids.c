/* SPDX-License-Identifier: MIT */
/*
 * A job's ids, names and slots (tensor_new(), tensor_free(), job_fence_slot_get()): an id's slot
 * is reused with a new generation, the lowest free slot is taken without a walk from slot 0, a
 * fence slot handed out again bumps its failure count (a closed connection's fence never reads
 * as done).  Split from test-registry.c (the op engine's state machine).
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/core/manager.h"
#include "daemon/state/registry.h"
#include "proto/fence.h"
#include "tests/unit/fixture.h"

static Manager *new_manager(void) {
        return fixture_new(32 * MiB, NULL, NULL);
}

static void test_ids_names_slots(void **state) {
        Manager *m = new_manager();
        Job *j;
        Tensor *a, *b, *c;
        unsigned s1, s2;
        uint64_t old;

        assert_int_equal(job_new(m->registry, "j", 1000, &j), 0);
        assert_ptr_equal(job_find(m->registry, "j"), j);
        assert_null(job_find(m->registry, "k"));
        assert_int_equal(j->limit[LEVEL_HOST], 4 * MiB);

        assert_int_equal(tensor_new(j, "a", 100, &a), 0);
        assert_int_equal(tensor_new(j, "a", 100, &b), -EEXIST);
        assert_int_equal(tensor_new(j, "b", 5000, &b), 0);
        assert_int_equal(b->alloc_size, 8192);
        assert_ptr_equal(tensor_find(j, a->id), a);
        assert_ptr_equal(tensor_find_name(j, "b"), b);
        assert_null(tensor_find(j, a->id + (1ull << 32)));     /* wrong generation */

        old = a->id;
        assert_int_equal(tensor_free(a), 0);
        assert_null(tensor_find(j, old));
        assert_null(tensor_find_name(j, "a"));
        assert_int_equal(tensor_new(j, "c", 1, &c), 0);
        assert_int_equal((uint32_t) c->id, (uint32_t) old);   /* slot reused ... */
        assert_int_not_equal(c->id, old);                     /* ... with a new generation */
        assert_null(tensor_find(j, old));

        assert_int_equal(job_fence_slot_get(j, &s1), 0);
        assert_int_equal(job_fence_slot_get(j, &s2), 0);
        assert_int_not_equal(s1, s2);
        /* a reused slot starts over at done 0, its failed counter bumped, never reset (registry.c) */
        j->fences->done[s1] = 7;
        j->fences->failed[s1] = 2;
        job_fence_slot_put(j, s1);
        assert_int_equal(job_fence_slot_get(j, &s2), 0);
        assert_int_equal(s2, s1);
        assert_int_equal(j->fences->done[s1], 0);
        assert_int_equal(j->fences->failed[s1], 3);
        for (unsigned i = 2; i < FENCE_SLOTS; i++)
                assert_int_equal(job_fence_slot_get(j, &s2), 0);
        assert_int_equal(job_fence_slot_get(j, &s2), -EUSERS);

        job_destroy(j);
        fixture_free(m);
}

/* Id slots: the lowest free one is taken, found without a walk from slot 0 each time (n^2/2 looks). Counted. */
static void test_id_slots_linear(void **state) {
        enum { N = 4096 };
        Manager *m = new_manager();
        Tensor *t[N], *x;
        char name[32];
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 1000, &j), 0);
        for (unsigned i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "t%u", i);
                assert_int_equal(tensor_new(j, name, 1, &t[i]), 0);
                assert_int_equal((uint32_t) t[i]->id, i);
        }
        assert_true(j->by_id_looks <= 2 * N);
        assert_int_equal(tensor_free(t[N / 2]), 0);
        assert_int_equal(tensor_free(t[7]), 0);
        for (unsigned i = 0, want[] = { 7, N / 2, N }; i < 3; i++) {    /* the lowest free slot each time */
                snprintf(name, sizeof(name), "x%u", i);
                assert_int_equal(tensor_new(j, name, 1, &x), 0);
                assert_int_equal((uint32_t) x->id, want[i]);
        }
        assert_true(j->by_id_looks <= 2 * N + N / 2 + 8);
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_ids_names_slots),
                cmocka_unit_test(test_id_slots_linear),
        };

        return fixture_main("registry-ids", tests, sizeof(tests) / sizeof(tests[0]));
}
