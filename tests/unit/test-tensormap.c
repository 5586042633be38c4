/* SPDX-License-Identifier: MIT */
/* test-tensormap.c: the name -> tensor hash table: its books under churn, and its keyed hash. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/state/tensormap.h"

#define N_KEYS 5000

static char keys[N_KEYS][24];

static void test_put_get_remove(void **state) {
        TensorMap *m = tensormap_new();

        assert_non_null(m);
        for (int i = 0; i < N_KEYS; i++) {
                snprintf(keys[i], sizeof(keys[i]), "layer.%d.weight", i);
                assert_int_equal(tensormap_put(m, keys[i], &keys[i]), 0);
        }
        assert_int_equal(tensormap_size(m), N_KEYS);
        assert_int_equal(tensormap_put(m, keys[7], &keys[8]), -EEXIST);
        for (int i = 0; i < N_KEYS; i++)
                assert_ptr_equal(tensormap_get(m, keys[i]), &keys[i]);
        assert_null(tensormap_get(m, "layer.5000.weight"));
        assert_null(tensormap_get(m, ""));

        /* remove every third: the rest stay reachable (backward shift keeps the probe chains whole) */
        for (int i = 0; i < N_KEYS; i += 3)
                assert_ptr_equal(tensormap_remove(m, keys[i]), &keys[i]);
        assert_null(tensormap_remove(m, keys[0]));
        for (int i = 0; i < N_KEYS; i++)
                if (i % 3 == 0)
                        assert_null(tensormap_get(m, keys[i]));
                else
                        assert_ptr_equal(tensormap_get(m, keys[i]), &keys[i]);
        assert_int_equal(tensormap_size(m), N_KEYS - (N_KEYS + 2) / 3);
        /* and they can come back */
        for (int i = 0; i < N_KEYS; i += 3)
                assert_int_equal(tensormap_put(m, keys[i], &keys[i]), 0);
        assert_int_equal(tensormap_size(m), N_KEYS);
        tensormap_free(m);
}

/*
 * Names come from clients: with a fixed hash (FNV-1a, as before), a client
 * could compute names that all land in one probe chain and make every
 * lookup of its job, in the event loop, walk all of them.  Each map has its
 * own random key, so the same name hashes differently in two maps, and
 * nobody outside tierd can know where a name lands.
 */
static void test_hash_is_keyed(void **state) {
        TensorMap *a = tensormap_new(), *b = tensormap_new();
        int differ = 0;

        assert_non_null(a);
        assert_non_null(b);
        for (int i = 0; i < 8; i++) {
                char k[16];

                snprintf(k, sizeof(k), "t%d", i);
                /* the same map always agrees with itself */
                assert_true(tensormap_hash(a, k) == tensormap_hash(a, k));
                differ += tensormap_hash(a, k) != tensormap_hash(b, k);
        }
        assert_int_equal(differ, 8);    /* equal by chance with probability 2^-64 each */
        /* names that differ only late in the string, or by length, still spread */
        assert_true(tensormap_hash(a, "aaaaaaaaaaaaaaaa1") != tensormap_hash(a, "aaaaaaaaaaaaaaaa2"));
        assert_true(tensormap_hash(a, "12345678") != tensormap_hash(a, "123456789"));
        tensormap_free(a);
        tensormap_free(b);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_put_get_remove),
                cmocka_unit_test(test_hash_is_keyed),
        };

        return cmocka_run_group_tests_name("tensormap", tests, NULL, NULL);
}
