/* SPDX-License-Identifier: MIT */
/* test-fault.c: TIERD_TEST_FAULTS rules: parsing, refusals, and when a rule fires. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/tiers/fault.h"

static void test_parse(void **state) {
        FaultSet f;
        char err[256];

        assert_int_equal(fault_set_parse("nvme-read-eio:every=3,after=1,count=2,target=1,job=train;nvme-delay:ms=5",
                                         &f, err, sizeof(err)), 0);
        assert_int_equal(f.n_rules, 2);
        assert_int_equal(f.rules[0].kind, FAULT_READ_EIO);
        assert_int_equal(f.rules[0].every, 3);
        assert_int_equal(f.rules[0].after, 1);
        assert_int_equal(f.rules[0].count, 2);
        assert_int_equal(f.rules[0].target, 1);
        assert_string_equal(f.rules[0].job, "train");
        assert_int_equal(f.rules[1].kind, FAULT_DELAY);
        assert_int_equal(f.rules[1].ms, 5);
        assert_int_equal(f.rules[1].target, FAULT_TARGET_ANY);
        assert_int_equal(f.rules[1].every, 1);
        assert_int_equal(fault_set_parse("vram-h2d-eio:job=a;vram-d2h-eio", &f, err, sizeof(err)), 0);
        assert_int_equal(f.rules[0].kind, FAULT_VRAM_H2D_EIO);
        assert_int_equal(f.rules[1].kind, FAULT_VRAM_D2H_EIO);
        assert_string_equal(fault_kind_to_string(FAULT_VRAM_D2H_EIO), "vram-d2h-eio");
        assert_int_equal(fault_set_parse("index-kill:after=7,count=1;index-torn:after=2", &f, err, sizeof(err)), 0);
        assert_int_equal(f.rules[0].kind, FAULT_INDEX_KILL);
        assert_int_equal(f.rules[0].after, 7);
        assert_int_equal(f.rules[1].kind, FAULT_INDEX_TORN);
        assert_int_equal(fault_set_parse("index-kill:target=0", &f, err, sizeof(err)), -EINVAL);
        assert_int_equal(fault_set_parse("store-kill:after=3,count=1", &f, err, sizeof(err)), 0);
        assert_int_equal(f.rules[0].kind, FAULT_STORE_KILL);
        assert_int_equal(f.rules[0].after, 3);
        assert_string_equal(fault_kind_to_string(FAULT_STORE_KILL), "store-kill");
        assert_int_equal(fault_set_parse("store-kill:target=1", &f, err, sizeof(err)), -EINVAL);
        assert_int_equal(fault_set_parse("store-table", &f, err, sizeof(err)), 0);
        assert_int_equal(f.rules[0].kind, FAULT_STORE_TABLE);
        assert_string_equal(fault_kind_to_string(FAULT_STORE_TABLE), "store-table");
        assert_int_equal(fault_set_parse("store-table:target=0", &f, err, sizeof(err)), -EINVAL);
}

static void test_refused(void **state) {
        static const char *const bad[] = {
                "nvme-read-eoi", "nvme-read-eio:every=0", "nvme-read-eio:every", "nvme-read-eio:count=-1",
                "nvme-read-eio:count=1x", "nvme-read-eio:target=64", "nvme-delay:ms=60001", "nvme-read-eio:job=",
                "nvme-read-eio:color=red", "vram-h2d-eio:target=0",
                "nvme-read-eio:job=0123456789012345678901234567890123456789012345678901234567890123456789",
                "a;b;c;d;e;f;g;h;i;j;k;l;m;n;o;p;q",
        };
        FaultSet f;
        char err[256];

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                err[0] = 0;
                assert_int_equal(fault_set_parse(bad[i], &f, err, sizeof(err)), -EINVAL);
                assert_true(strlen(err) > 0);
                assert_int_equal(f.n_rules, 0);
        }
        /* 17 valid rules: one too many */
        {
                char spec[17 * 16] = "";

                for (int i = 0; i < 17; i++)
                        strcat(spec, "nvme-delay;");
                assert_int_equal(fault_set_parse(spec, &f, err, sizeof(err)), -EINVAL);
                assert_non_null(strstr(err, "more than"));
        }
}

static void test_fire(void **state) {
        FaultSet f;
        char err[256];
        unsigned fired = 0;
        uint32_t m;

        assert_int_equal(fault_set_parse("nvme-write-eio:every=2,after=1,count=2,target=0,job=a;nvme-vanish:target=3",
                                         &f, err, sizeof(err)), 0);
        m = fault_job_mask(&f, "a");
        assert_int_equal(m, 3);
        assert_int_equal(fault_job_mask(&f, "b"), 2);
        assert_int_equal(fault_job_mask(&f, NULL), 2);
        /* other kinds, targets and jobs do not count */
        assert_null(fault_fire(&f, FAULT_READ_EIO, m, 0));
        assert_null(fault_fire(&f, FAULT_WRITE_EIO, m, 1));
        assert_null(fault_fire(&f, FAULT_WRITE_EIO, fault_job_mask(&f, "b"), 0));
        /* attempts 1..8: the first passes (after=1), then every second fires, twice at most: 3 and 5 */
        for (unsigned i = 1; i <= 8; i++)
                if (fault_fire(&f, FAULT_WRITE_EIO, m, 0)) {
                        assert_true(i == 3 || i == 5);
                        fired++;
                }
        assert_int_equal(fired, 2);
        assert_false(fault_target_gone(&f, 3));
        assert_non_null(fault_fire(&f, FAULT_VANISH, m, 3));
        assert_true(fault_target_gone(&f, 3));
        assert_false(fault_target_gone(&f, 0));
        assert_false(fault_target_gone(NULL, 3));
        assert_null(fault_fire(NULL, FAULT_VANISH, m, 3));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse),
                cmocka_unit_test(test_refused),
                cmocka_unit_test(test_fire),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
