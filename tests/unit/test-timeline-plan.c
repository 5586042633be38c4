/* SPDX-License-Identifier: MIT */
/* test-timeline-plan.c: bench-timeline's plans (bench/timeline-plan.c): the synthetic one, and plan files good and bad. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "bench/timeline-plan.h"

static char path[64];

static int setup(void **state) {
        int fd;

        (void) snprintf(path, sizeof(path), "/tmp/test-timeline-plan-XXXXXX");
        fd = mkstemp(path);
        if (fd < 0)
                return -1;
        close(fd);
        return 0;
}

static int teardown(void **state) {
        unlink(path);
        return 0;
}

static int load(const char *text, TlPlan **ret, char *err, size_t size) {
        FILE *f = fopen(path, "we");

        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        err[0] = 0;
        return tl_plan_load(path, ret, err, size);
}

static void test_synthetic(void **state) {
        TlPlan *p = NULL;

        assert_int_equal(tl_plan_synthetic(2, 8, 16, 24, &p), 0);
        assert_int_equal(p->n_tensors, 6);
        assert_int_equal(p->n_phases, 6);
        assert_string_equal(p->names[0], "P0");
        assert_string_equal(p->names[4], "G1");
        assert_string_equal(p->names[5], "O1");
        assert_int_equal(tl_plan_bytes(p), 2 * (8 + 16 + 24));
        /* fwd 0, fwd 1, bwd 1 (reverse), bwd 0, opt 0, opt 1 */
        assert_int_equal(p->kind[0], TL_FWD);
        assert_int_equal(p->kind[2], TL_BWD);
        assert_int_equal(p->kind[5], TL_OPT);
        assert_int_equal(p->start[3] - p->start[2], 2);
        assert_int_equal(p->acc[p->start[2]].tensor, 3);         /* P1 */
        assert_int_equal(p->acc[p->start[2] + 1].tensor, 4);     /* G1, written */
        assert_int_equal(p->acc[p->start[2] + 1].mode, TIER_WRITE);
        assert_int_equal(p->acc[p->start[4] + 2].tier, TIER_HOST);
        assert_int_equal(p->acc[p->start[4] + 2].mode, TIER_READ_WRITE);
        assert_int_equal(p->start[6], 12);
        assert_int_equal(tl_plan_synthetic(0, 8, 8, 8, &p), -EINVAL);
        tl_plan_free(p);
        assert_null(tl_plan_free(NULL));
}

static void test_file(void **state) {
        TlPlan *p = NULL;
        char err[256];

        assert_int_equal(load("{\"name\":\"x\",\"tensors\":[{\"name\":\"a\",\"size\":64},{\"name\":\"b\",\"size\":8}],"
                              "\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"vram\",\"r\"]]},"
                              "{\"kind\":\"o\",\"access\":[[1,\"host\",\"rw\"],[0,\"host\",\"w\"]]}]}", &p, err,
                         sizeof(err)), 0);
        assert_string_equal(p->name, "x");
        assert_int_equal(p->n_tensors, 2);
        assert_int_equal(p->size[0], 64);
        assert_int_equal(p->n_phases, 2);
        assert_int_equal(p->kind[1], TL_OPT);
        assert_int_equal(p->start[1], 1);
        assert_int_equal(p->start[2], 3);
        assert_int_equal(p->acc[1].tensor, 1);
        assert_int_equal(p->acc[1].mode, TIER_READ_WRITE);
        assert_int_equal(p->acc[2].mode, TIER_WRITE);
        assert_int_equal(p->acc[2].tier, TIER_HOST);
        {
                CbPlan cb = tl_plan_cb(p);

                assert_int_equal(cb.n_tensors, 2);
                assert_ptr_equal(cb.acc, p->acc);
        }
        tl_plan_free(p);
}

/* Each malformed file is refused with -EBADMSG and a message naming what is wrong. */
static void test_bad_files(void **state) {
        static const struct {
                const char *text, *says;
        } cases[] = {
                { "not json", "is not JSON" },
                { "{\"tensors\":[],\"phases\":[]}", "non-empty" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}]}", "non-empty" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"f\"}]}", "no \"access\"" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":12}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"vram\",\"r\"]]}]}",
                  "multiple of 8" },
                { "{\"tensors\":[{\"name\":\"\",\"size\":8}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"vram\",\"r\"]]}]}",
                  "1 to 200" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"x\",\"access\":[[0,\"vram\",\"r\"]]}]}",
                  "\"kind\" must be" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"f\",\"access\":[[1,\"vram\",\"r\"]]}]}",
                  "index into" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"nvme\",\"r\"]]}]}",
                  "index into" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"host\",\"x\"]]}]}",
                  "index into" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"host\"]]}]}",
                  "index into" },
                { "{\"tensors\":[{\"name\":\"a\",\"size\":8}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"host\",\"r\"],"
                  "[0,\"host\",\"w\"]]}]}", "twice" },
        };
        char err[256];

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                TlPlan *p = NULL;

                assert_int_equal(load(cases[i].text, &p, err, sizeof(err)), -EBADMSG);
                assert_null(p);
                if (!strstr(err, cases[i].says))
                        fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, cases[i].says);
        }
        /* a file that is not there */
        unlink(path);
        assert_int_equal(tl_plan_load(path, &(TlPlan *) { NULL }, err, sizeof(err)), -EBADMSG);
        assert_non_null(strstr(err, "cannot read"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_synthetic),
                cmocka_unit_test_setup_teardown(test_file, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
