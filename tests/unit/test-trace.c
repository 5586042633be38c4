/* SPDX-License-Identifier: MIT */
/* test-trace.c: the trace recorder (daemon/engine/trace.c): bounded buffer, drops counted, records filled. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/trace.h"
#include "daemon/state/registry.h"

static void test_off_until_started(void **state) {
        Trace tr = {};

        assert_false(trace_on(&tr));
        assert_int_equal(trace_start(&tr, 0, 1), -EINVAL);
        assert_int_equal(trace_start(&tr, TRACE_BUFFER_MAX + 1, 1), -EINVAL);
        assert_null(tr.rec);
        assert_int_equal(trace_start(&tr, 8, 100), 0);
        assert_true(trace_on(&tr));
        assert_int_equal(tr.start_ns, 100);
        /* one trace at a time */
        assert_int_equal(trace_start(&tr, 8, 200), -EBUSY);
        trace_stop(&tr, 300);
        assert_false(trace_on(&tr));
        assert_int_equal(tr.stop_ns, 300);
        /* stopped, the records stay until reset; a second stop changes nothing */
        trace_stop(&tr, 400);
        assert_int_equal(tr.stop_ns, 300);
        assert_int_equal(trace_start(&tr, 8, 500), -EBUSY);
        trace_reset(&tr);
        assert_null(tr.rec);
        assert_int_equal(trace_start(&tr, 8, 600), 0);
        trace_reset(&tr);
}

static void test_full_buffer_drops_new_records(void **state) {
        Trace tr = {};

        assert_int_equal(trace_start(&tr, 3, 1), 0);
        for (int i = 0; i < 10; i++) {
                TraceRecord *r = trace_next(&tr);

                if (i < 3) {
                        assert_non_null(r);
                        r->seq = (uint64_t) i;
                } else
                        assert_null(r);
        }
        assert_int_equal(tr.n, 3);
        assert_int_equal(tr.dropped, 7);
        /* what is kept is the beginning, in order */
        for (uint64_t i = 0; i < 3; i++)
                assert_int_equal(tr.rec[i].seq, i);
        trace_reset(&tr);
        assert_int_equal(tr.dropped, 0);
        assert_int_equal(tr.n, 0);
}

static void test_records(void **state) {
        char long_name[100];
        Job j = { .id = 7, .name = (char *) "job-with-a-name-longer-than-thirty-two-bytes" };
        Tensor t = { .job = &j, .id = 42, .alloc_size = 1 << 20 };
        Trace tr = {};
        const TraceRecord *r;

        memset(long_name, 'x', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = '\0';
        t.name = long_name;
        tr.next_plan = 5;
        assert_int_equal(trace_start(&tr, 16, 1000), 0);
        trace_xfer(&tr, &t, LINK_HOST_TO_VRAM, 1100, 1200, 1300, t.alloc_size, 0);
        trace_xfer(&tr, &t, LINK_HOST_TO_NVME, 0, 0, 1400, 0, -EIO);
        trace_phase(&tr, &j, 3, 9, 2, 1500);
        trace_stall(&tr, &j, 3, 9, 2, 1500, 1600);
        trace_decision(&tr, &t, LEVEL_VRAM, TRACE_WHY_DRAIN, 5000, TRACE_F_RECLAIM, 1700);
        assert_int_equal(tr.n, 5);

        r = &tr.rec[0];
        assert_int_equal(r->kind, TRACE_XFER);
        assert_int_equal(r->link, LINK_HOST_TO_VRAM);
        assert_int_equal(r->t0, 1100);
        assert_int_equal(r->t1, 1200);
        assert_int_equal(r->ts, 1300);
        assert_int_equal(r->bytes, 1 << 20);
        assert_int_equal(r->size, 1 << 20);
        assert_int_equal(r->tensor, 42);
        assert_int_equal(r->job_id, 7);
        /* names are cut, and always terminated */
        assert_int_equal(strlen(r->name), TRACE_NAME_MAX - 1);
        assert_int_equal(strlen(r->job), TRACE_NAME_MAX - 1);
        assert_memory_equal(r->job, j.name, TRACE_NAME_MAX - 1);

        r = &tr.rec[1];
        assert_int_equal(r->bytes, 0);
        assert_int_equal(r->error, -EIO);
        assert_int_equal(r->size, 1 << 20);

        r = &tr.rec[2];
        assert_int_equal(r->kind, TRACE_PHASE);
        assert_int_equal(r->plan, 3);
        assert_int_equal(r->seq, 9);
        assert_int_equal(r->phase, 2);
        assert_int_equal(r->ts, 1500);

        r = &tr.rec[3];
        assert_int_equal(r->kind, TRACE_STALL);
        assert_int_equal(r->t0, 1500);
        assert_int_equal(r->ts, 1600);

        r = &tr.rec[4];
        assert_int_equal(r->kind, TRACE_DECISION);
        assert_int_equal(r->tier, LEVEL_VRAM);
        assert_int_equal(r->why, TRACE_WHY_DRAIN);
        assert_int_equal(r->deadline, 5000);
        assert_int_equal(r->flags, TRACE_F_RECLAIM);

        /* plan numbers go on across traces */
        trace_reset(&tr);
        assert_int_equal(tr.next_plan, 5);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_off_until_started),
                cmocka_unit_test(test_full_buffer_drops_new_records),
                cmocka_unit_test(test_records),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
