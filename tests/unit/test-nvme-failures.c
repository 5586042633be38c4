/* SPDX-License-Identifier: MIT */
/*
 * test-nvme-failures.c: what the scheduler and the engine do after an NVMe transfer failed for
 * good (a crc32c mismatch, a write the drive refuses): nothing is started again and again.
 */

#include "tests/unit/timeline-fixture.h"

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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_prefetch_failed_for_good_not_retried),
        };

        return fixture_main("nvme-failures", tests, sizeof(tests) / sizeof(tests[0]));
}
