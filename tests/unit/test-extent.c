/* SPDX-License-Identifier: MIT */
/* test-extent.c: the bitmap unit allocator, by hand and against a reference model. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/tiers/extent.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/macro.h"

static void extent_alloc_deinitp(ExtentAlloc *a) {
        extent_alloc_deinit(a);
}
#define _cleanup_extent_ _cleanup_(extent_alloc_deinitp)

static uint64_t get(ExtentAlloc *a, uint64_t count) {
        uint64_t unit = UINT64_MAX;

        assert_int_equal(extent_alloc_get(a, count, &unit), 0);
        return unit;
}

static void assert_range_used(const ExtentAlloc *a, uint64_t unit, uint64_t count, bool used) {
        for (uint64_t u = unit; u < unit + count; u++)
                assert_int_equal(extent_alloc_is_used(a, u), used);
}

static void test_init(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;

        assert_int_equal(extent_alloc_init(&a, 100), 0);
        assert_int_equal(a.n_units, 100);
        assert_int_equal(a.n_free, 100);
        assert_int_equal(extent_alloc_largest_free(&a), 100);
        assert_range_used(&a, 0, 100, false);
        /* Past the end reads as used: it can never be handed out. */
        assert_true(extent_alloc_is_used(&a, 100));
        assert_true(extent_alloc_is_used(&a, UINT64_MAX));

        extent_alloc_deinit(&a);
        assert_null(a.bits);
        /* deinit twice is harmless. */
        extent_alloc_deinit(&a);

        /* An empty allocator is always full. */
        uint64_t unit;
        assert_int_equal(extent_alloc_init(&a, 0), 0);
        assert_int_equal(extent_alloc_get(&a, 1, &unit), -ENOSPC);
        assert_int_equal(extent_alloc_largest_free(&a), 0);
        assert_int_equal(extent_alloc_put(&a, 0, 1), -EINVAL);
}

static void test_basic(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        uint64_t unit;

        assert_int_equal(extent_alloc_init(&a, 100), 0);
        assert_int_equal(extent_alloc_get(&a, 0, &unit), -EINVAL);

        assert_int_equal(get(&a, 10), 0);
        assert_int_equal(get(&a, 5), 10);
        assert_int_equal(a.n_free, 85);
        assert_range_used(&a, 0, 15, true);
        assert_range_used(&a, 15, 85, false);
        assert_int_equal(extent_alloc_largest_free(&a), 85);

        /* Next fit: the freed front is not reused while space remains ahead. */
        assert_int_equal(extent_alloc_put(&a, 0, 10), 0);
        assert_int_equal(a.n_free, 95);
        assert_int_equal(get(&a, 3), 15);
        assert_range_used(&a, 0, 10, false);

        /* Runs that straddle 64-bit words. */
        assert_int_equal(get(&a, 60), 18);
        assert_range_used(&a, 18, 60, true);
        assert_int_equal(extent_alloc_put(&a, 18, 60), 0);
        assert_range_used(&a, 18, 60, false);

        /* Double free. */
        assert_int_equal(extent_alloc_put(&a, 18, 1), -EINVAL);
}

static void test_not_word_multiple(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        uint64_t unit;

        assert_int_equal(extent_alloc_init(&a, 70), 0);
        assert_int_equal(extent_alloc_get(&a, 71, &unit), -ENOSPC);
        assert_int_equal(get(&a, 70), 0);
        assert_int_equal(a.n_free, 0);
        assert_int_equal(extent_alloc_get(&a, 1, &unit), -ENOSPC);
        assert_int_equal(extent_alloc_put(&a, 0, 70), 0);
        assert_int_equal(extent_alloc_largest_free(&a), 70);
        /* The last unit is reachable, the one after it is not. */
        assert_int_equal(extent_alloc_reserve(&a, 69, 1), 0);
        assert_int_equal(extent_alloc_reserve(&a, 70, 1), -EINVAL);
        assert_int_equal(extent_alloc_largest_free(&a), 69);
}

static void test_exhaustion(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        uint64_t unit;

        assert_int_equal(extent_alloc_init(&a, 256), 0);
        for (uint64_t i = 0; i < 256; i++)
                assert_int_equal(get(&a, 1), i);
        assert_int_equal(a.n_free, 0);
        assert_int_equal(extent_alloc_get(&a, 1, &unit), -ENOSPC);
        assert_int_equal(extent_alloc_largest_free(&a), 0);

        /* One hole anywhere is found again. */
        assert_int_equal(extent_alloc_put(&a, 200, 1), 0);
        assert_int_equal(get(&a, 1), 200);
        assert_int_equal(extent_alloc_get(&a, 1, &unit), -ENOSPC);
}

/* Free every other unit: half the space is free, yet no run of 2 exists. */
static void test_fragmentation(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        uint64_t unit;

        assert_int_equal(extent_alloc_init(&a, 1000), 0);
        assert_int_equal(get(&a, 1000), 0);
        for (uint64_t i = 0; i < 1000; i += 2)
                assert_int_equal(extent_alloc_put(&a, i, 1), 0);

        assert_int_equal(a.n_free, 500);
        assert_int_equal(extent_alloc_largest_free(&a), 1);
        assert_int_equal(extent_alloc_get(&a, 2, &unit), -ENOSPC);
        assert_int_equal(a.n_free, 500);

        /* Free a neighbour: now exactly one run of 3 exists. */
        assert_int_equal(extent_alloc_put(&a, 501, 1), 0);
        assert_int_equal(extent_alloc_largest_free(&a), 3);
        assert_int_equal(get(&a, 2), 500);
        assert_int_equal(get(&a, 1), 502);
}

static void test_hint_wrap(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;

        assert_int_equal(extent_alloc_init(&a, 100), 0);
        assert_int_equal(get(&a, 60), 0);
        assert_int_equal(get(&a, 30), 60);
        assert_int_equal(a.hint, 90);
        assert_int_equal(extent_alloc_put(&a, 0, 60), 0);

        /* Only 10 free after the hint: wrap to the front. */
        assert_int_equal(get(&a, 20), 0);
        assert_int_equal(a.hint, 20);
        /* Space after the hint is used before wrapping. */
        assert_int_equal(get(&a, 40), 20);
        assert_int_equal(a.hint, 60);
        assert_int_equal(get(&a, 10), 90);
        assert_int_equal(a.hint, 0);
        assert_int_equal(a.n_free, 0);

        /* A run that starts before the hint and crosses it. */
        assert_int_equal(extent_alloc_put(&a, 0, 100), 0);
        assert_int_equal(get(&a, 100), 0);
        assert_int_equal(extent_alloc_put(&a, 40, 20), 0);
        a.hint = 50;
        assert_int_equal(get(&a, 20), 40);

        /* A hint past the end (from a smaller allocator) is treated as 0. */
        assert_int_equal(extent_alloc_put(&a, 10, 5), 0);
        a.hint = 1000;
        assert_int_equal(get(&a, 5), 10);
}

static void test_put_invalid(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        _cleanup_free_ uint64_t *saved = NULL;
        size_t words = 2;

        assert_int_equal(extent_alloc_init(&a, 100), 0);
        assert_int_equal(get(&a, 10), 0);
        assert_int_equal(get(&a, 10), 10);
        assert_int_equal(extent_alloc_put(&a, 10, 10), 0);

        saved = malloc(words * sizeof(uint64_t));
        assert_non_null(saved);
        memcpy(saved, a.bits, words * sizeof(uint64_t));

        /* Partly allocated, not allocated, out of range, empty, overflowing. */
        assert_int_equal(extent_alloc_put(&a, 5, 10), -EINVAL);
        assert_int_equal(extent_alloc_put(&a, 10, 1), -EINVAL);
        assert_int_equal(extent_alloc_put(&a, 95, 10), -EINVAL);
        assert_int_equal(extent_alloc_put(&a, 100, 1), -EINVAL);
        assert_int_equal(extent_alloc_put(&a, 0, 0), -EINVAL);
        assert_int_equal(extent_alloc_put(&a, 1, UINT64_MAX), -EINVAL);
        assert_int_equal(extent_alloc_put(&a, UINT64_MAX, 2), -EINVAL);

        assert_memory_equal(saved, a.bits, words * sizeof(uint64_t));
        assert_int_equal(a.n_free, 90);
        assert_range_used(&a, 0, 10, true);
}

static void test_reserve(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;

        assert_int_equal(extent_alloc_init(&a, 200), 0);
        assert_int_equal(extent_alloc_reserve(&a, 10, 5), 0);
        assert_range_used(&a, 10, 5, true);
        assert_int_equal(a.n_free, 195);

        /* Overlap is -EBUSY and changes nothing. */
        assert_int_equal(extent_alloc_reserve(&a, 12, 5), -EBUSY);
        assert_range_used(&a, 15, 2, false);
        assert_int_equal(a.n_free, 195);
        assert_int_equal(extent_alloc_reserve(&a, 190, 11), -EINVAL);
        assert_int_equal(extent_alloc_reserve(&a, 0, 0), -EINVAL);

        /* get() goes around reserved units. */
        assert_int_equal(get(&a, 10), 0);
        assert_int_equal(a.hint, 10);
        assert_int_equal(get(&a, 10), 15);

        /* Reserved units are released with put(). */
        assert_int_equal(extent_alloc_put(&a, 10, 5), 0);
        assert_int_equal(a.n_free, 180);

        /* A whole-bitmap reservation across many words. */
        assert_int_equal(extent_alloc_put(&a, 0, 10), 0);
        assert_int_equal(extent_alloc_put(&a, 15, 10), 0);
        assert_int_equal(extent_alloc_reserve(&a, 0, 200), 0);
        assert_int_equal(a.n_free, 0);
        assert_int_equal(extent_alloc_largest_free(&a), 0);
}

static void test_largest_free(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;

        assert_int_equal(extent_alloc_init(&a, 300), 0);
        assert_int_equal(extent_alloc_reserve(&a, 0, 300), 0);
        assert_int_equal(extent_alloc_put(&a, 3, 4), 0);
        assert_int_equal(extent_alloc_largest_free(&a), 4);
        assert_int_equal(extent_alloc_put(&a, 60, 70), 0);      /* crosses words */
        assert_int_equal(extent_alloc_largest_free(&a), 70);
        assert_int_equal(extent_alloc_put(&a, 250, 50), 0);     /* reaches the end */
        assert_int_equal(extent_alloc_largest_free(&a), 70);
        assert_int_equal(extent_alloc_put(&a, 200, 50), 0);
        assert_int_equal(extent_alloc_largest_free(&a), 100);
}

/* Many words: full words must be skipped, and results stay exact. */
static void test_large(_unused_ void **state) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        const uint64_t n = UINT64_C(1) << 20;
        uint64_t unit;

        assert_int_equal(extent_alloc_init(&a, n), 0);
        assert_int_equal(get(&a, n - 1), 0);
        assert_int_equal(extent_alloc_get(&a, 2, &unit), -ENOSPC);
        assert_int_equal(get(&a, 1), n - 1);
        assert_int_equal(extent_alloc_put(&a, 123457, 1000), 0);
        assert_int_equal(extent_alloc_largest_free(&a), 1000);
        assert_int_equal(get(&a, 1000), 123457);
}

/* ---- reference model ---------------------------------------------------- */

typedef struct Model {
        bool *used;
        uint64_t n, n_free, hint;
} Model;

static bool model_free_run(const Model *m, uint64_t start, uint64_t count) {
        if (start + count > m->n)
                return false;
        for (uint64_t u = start; u < start + count; u++)
                if (m->used[u])
                        return false;
        return true;
}

/* The documented policy, written the slow and obvious way. */
static int model_get(Model *m, uint64_t count, uint64_t *ret) {
        uint64_t hint = m->hint < m->n ? m->hint : 0;

        for (uint64_t pass = 0; pass < 2; pass++) {
                uint64_t from = pass == 0 ? hint : 0, to = pass == 0 ? m->n : hint;

                for (uint64_t s = from; s < to; s++)
                        if (model_free_run(m, s, count)) {
                                for (uint64_t u = s; u < s + count; u++)
                                        m->used[u] = true;
                                m->n_free -= count;
                                m->hint = s + count < m->n ? s + count : 0;
                                *ret = s;
                                return 0;
                        }
        }
        return -ENOSPC;
}

static uint64_t model_largest(const Model *m) {
        uint64_t best = 0, cur = 0;

        for (uint64_t u = 0; u < m->n; u++) {
                cur = m->used[u] ? 0 : cur + 1;
                best = MAX(best, cur);
        }
        return best;
}

typedef struct Run {
        uint64_t unit, count;
} Run;

static uint64_t rng_state = UINT64_C(0x2545f4914f6cdd1d);

static uint64_t rng(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

static void check_against_model(const ExtentAlloc *a, const Model *m) {
        assert_int_equal(a->n_free, m->n_free);
        assert_int_equal(a->hint, m->hint);
        for (uint64_t u = 0; u < m->n; u++)
                assert_int_equal(extent_alloc_is_used(a, u), m->used[u]);
        assert_int_equal(extent_alloc_largest_free(a), model_largest(m));
}

static void run_random(uint64_t n, unsigned steps, uint64_t max_count) {
        _cleanup_extent_ ExtentAlloc a = EXTENT_ALLOC_NULL;
        _cleanup_free_ bool *used = calloc(n, sizeof(bool));
        _cleanup_free_ Run *runs = calloc(n, sizeof(Run));
        Model m = { .used = used, .n = n, .n_free = n };
        size_t n_runs = 0;

        assert_non_null(used);
        assert_non_null(runs);
        assert_int_equal(extent_alloc_init(&a, n), 0);

        for (unsigned step = 0; step < steps; step++) {
                unsigned op = (unsigned) (rng() % 10);

                if (op < 5) {
                        uint64_t count = 1 + rng() % max_count, got = UINT64_MAX, want = UINT64_MAX;
                        int r = extent_alloc_get(&a, count, &got);

                        assert_int_equal(r, model_get(&m, count, &want));
                        if (r == 0) {
                                assert_int_equal(got, want);
                                runs[n_runs++] = (Run) { got, count };
                        }
                } else if (op < 8 && n_runs > 0) {
                        size_t i = (size_t) (rng() % n_runs);
                        Run run = runs[i];

                        assert_int_equal(extent_alloc_put(&a, run.unit, run.count), 0);
                        for (uint64_t u = run.unit; u < run.unit + run.count; u++)
                                m.used[u] = false;
                        m.n_free += run.count;
                        runs[i] = runs[--n_runs];
                } else if (op < 9) {
                        /* A random put: valid only if every unit is used, else nothing changes. */
                        uint64_t unit = rng() % (n + 2), count = rng() % (max_count + 1);
                        bool ok = count > 0 && unit + count <= n;

                        for (uint64_t u = unit; ok && u < unit + count; u++)
                                ok = m.used[u];
                        if (ok)
                                continue;       /* would split a tracked run */
                        assert_int_equal(extent_alloc_put(&a, unit, count), -EINVAL);
                } else {
                        uint64_t unit = rng() % n, count = 1 + rng() % max_count;
                        int want;

                        if (unit + count > n)
                                want = -EINVAL;
                        else {
                                want = 0;
                                for (uint64_t u = unit; u < unit + count; u++)
                                        if (m.used[u])
                                                want = -EBUSY;
                        }
                        assert_int_equal(extent_alloc_reserve(&a, unit, count), want);
                        if (want == 0) {
                                for (uint64_t u = unit; u < unit + count; u++)
                                        m.used[u] = true;
                                m.n_free -= count;
                                runs[n_runs++] = (Run) { unit, count };
                        }
                }

                if (step % 16 == 0)
                        check_against_model(&a, &m);
        }
        check_against_model(&a, &m);
}

static void test_random(_unused_ void **state) {
        run_random(1000, 20000, 40);    /* not a word multiple, busy */
        run_random(64, 5000, 8);        /* one exact word */
        run_random(4096, 5000, 300);    /* long runs across words */
}

/* nvme_alloc() stripes from the first target; a full target's extents go to the next ones with room, so
 * targets of unequal sizes hold their sum, and a failure gives back what it took. */
static void test_nvme_unequal_targets(void **state) {
        NvmeTarget t[2] = {};
        NvmeTier n = { .targets = t, .n_targets = 2, .extent_size = 4096 };
        NvmeExtent *a, *b, *c, *d;
        uint32_t na, nb, nc, nd;

        assert_int_equal(extent_alloc_init(&t[0].extents, 4), 0);
        assert_int_equal(extent_alloc_init(&t[1].extents, 1), 0);
        assert_int_equal(nvme_alloc(&n, 2 * 4096, 0, &a, &na), 0);       /* t0, t1: t1 is full now */
        assert_int_equal(na, 2);
        assert_int_equal(a[0].target, 0);
        assert_int_equal(a[1].target, 1);
        assert_int_equal(nvme_alloc(&n, 2 * 4096, 1, &b, &nb), 0);       /* t1 full: both on t0 */
        assert_int_equal(b[0].target, 0);
        assert_int_equal(b[1].target, 0);
        assert_int_equal(nvme_alloc(&n, 2 * 4096, 0, &c, &nc), -ENOSPC); /* one extent left in all */
        assert_int_equal(t[0].extents.n_free, 1);                          /* the one it took, back */
        assert_int_equal(nvme_alloc(&n, 4096, 1, &d, &nd), 0);
        assert_int_equal(d[0].target, 0);
        assert_int_equal(t[0].extents.n_free + t[1].extents.n_free, 0);
        nvme_free(&n, a, na);
        nvme_free(&n, b, nb);
        nvme_free(&n, d, nd);
        assert_int_equal(t[0].extents.n_free, 4);
        assert_int_equal(t[1].extents.n_free, 1);
        extent_alloc_deinit(&t[0].extents);
        extent_alloc_deinit(&t[1].extents);
        (void) c;
        (void) nc;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_init),
                cmocka_unit_test(test_basic),
                cmocka_unit_test(test_not_word_multiple),
                cmocka_unit_test(test_exhaustion),
                cmocka_unit_test(test_fragmentation),
                cmocka_unit_test(test_hint_wrap),
                cmocka_unit_test(test_put_invalid),
                cmocka_unit_test(test_reserve),
                cmocka_unit_test(test_largest_free),
                cmocka_unit_test(test_large),
                cmocka_unit_test(test_random),
                cmocka_unit_test(test_nvme_unequal_targets),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
