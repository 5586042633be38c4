/* SPDX-License-Identifier: MIT */
/* test-plan.c: plan submission: duplicates merged, indexes, and work linear in the size of the request. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/tiers/vram.h"
#include "proto/plan.h"
#include "tests/unit/fixture.h"
#include "util/time-util.h"

/* A request of one phase (what rpc.c makes of a SubmitPlan). */
typedef struct Req {
        PlanSpec spec;
} Req;

static void req_init(Req *r, size_t n) {
        r->spec = (PlanSpec) { .n_phases = 1, .acc = calloc(n, sizeof(PlanSpecAccess)) };
        assert_non_null(r->spec.acc);
}

static void req_add(Req *r, const Tensor *t, int tier, unsigned mode) {
        r->spec.acc[r->spec.n_acc++] = (PlanSpecAccess) { .phase = 0, .tensor = t->id, .tier = tier, .mode = mode };
}

static void req_done(Req *r) {
        free(r->spec.acc);
}

static void setup_big(Config *c, void *userdata) {
        c->host_job_limit = 1024 * MiB;
        c->vram_job_limit = 1024 * MiB;
}

static void test_duplicates_merged(void **state) {
        Manager *m = fixture_new(32 * MiB, setup_big, NULL);
        Tensor *a, *b;
        Plan *p = NULL;
        Job *j;
        Req r;
        char err[256] = "";

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        a = fixture_tensor(j, "a", 4096);
        b = fixture_tensor(j, "b", 4096);
        req_init(&r, 8);
        req_add(&r, a, LEVEL_HOST, PLAN_READ);
        req_add(&r, b, LEVEL_VRAM, PLAN_READ);
        req_add(&r, a, LEVEL_HOST, PLAN_WRITE);  /* merges with the first */
        req_add(&r, a, LEVEL_VRAM, PLAN_READ);   /* another tier: an access of its own */
        req_add(&r, b, LEVEL_VRAM, PLAN_READ);   /* merges, nothing new */
        assert_int_equal(plan_new(m->sched, j, -1, &r.spec, true, &p, err, sizeof(err)), 0);
        assert_int_equal(p->n_slots, 2);
        assert_int_equal(p->phases[0].n_acc, 3);
        assert_ptr_equal(p->phases[0].acc[0].tensor, a);
        assert_int_equal(p->phases[0].acc[0].mode, PLAN_READ | PLAN_WRITE);
        assert_int_equal(p->phases[0].acc[0].tier, LEVEL_HOST);
        assert_ptr_equal(p->phases[0].acc[1].tensor, b);
        assert_int_equal(p->phases[0].acc[1].mode, PLAN_READ);
        assert_ptr_equal(p->phases[0].acc[2].tensor, a);
        assert_int_equal(p->phases[0].acc[2].tier, LEVEL_VRAM);
        /* the access index sees a's modes of the phase together */
        assert_int_equal(plan_next_access_mode(p, a, 0, true), PLAN_READ | PLAN_WRITE);
        plan_free(p);
        req_done(&r);
        job_destroy(j);
        fixture_free(m);
}

/* CPU time of this thread: what other processes do to the machine does not count. */
static uint64_t cpu_ns(void) {
        struct timespec ts;

        assert_int_equal(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts), 0);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/*
 * CPU seconds plan_new() takes on one phase of @n accesses: @n / 4 tensors,
 * each named twice in host and twice in vram (so half are duplicates to
 * merge); the best of five.
 */
static double time_plan(Manager *m, Job *j, Tensor **t, size_t n) {
        double best = 1e9;
        Req r;

        req_init(&r, n);
        for (size_t i = 0; i < n; i++)
                req_add(&r, t[(i / 2) % (n / 4)], (i / (n / 2)) ? LEVEL_VRAM : LEVEL_HOST,
                        i % 2 ? PLAN_WRITE : PLAN_READ);
        for (int k = 0; k < 5; k++) {
                char err[256] = "";
                Plan *p = NULL;
                uint64_t t0 = cpu_ns();

                assert_int_equal(plan_new(m->sched, j, -1, &r.spec, true, &p, err,
                                          sizeof(err)), 0);
                best = MIN(best, (double) (cpu_ns() - t0) / 1e9);
                assert_int_equal(p->n_slots, n / 4);
                assert_int_equal(p->phases[0].n_acc, n / 2);
                plan_free(p);
        }
        req_done(&r);
        return best;
}

/*
 * A plan is checked in the event loop, so its work must grow with its size
 * and no faster: merging duplicates by searching the phase (as before) made a
 * phase of n accesses cost n^2 / 2 comparisons, seconds for the largest
 * plan [limits] allow.  Four times the accesses must cost about four times
 * as much, not sixteen.  (A ratio of CPU times, the best of five each, not a
 * time: the bound holds under valgrind and on a loaded machine alike.)
 */
static void test_work_is_linear(void **state) {
        enum { SMALL = 8192, LARGE = 32768 };
        Manager *m = fixture_new(32 * MiB, setup_big, NULL);
        Tensor **t = calloc(LARGE / 4, sizeof(Tensor *));
        double small, large;
        Job *j;

        assert_non_null(t);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (size_t i = 0; i < LARGE / 4; i++) {
                char name[32];

                snprintf(name, sizeof(name), "t%zu", i);
                t[i] = fixture_tensor(j, name, 4096);
        }
        small = time_plan(m, j, t, SMALL);
        large = time_plan(m, j, t, LARGE);
        print_message("plan of %d accesses: %.4f s, of %d: %.4f s (ratio %.1f)\n", SMALL, small, LARGE, large,
                      large / small);
        assert_true(large < 9 * small + 0.002);
        free(t);
        job_destroy(j);
        fixture_free(m);
}

/*
 * plan_cur_read_pending() looks a tensor's accesses in the current phase up
 * (Plan.acc_where) instead of walking the phase: on random plans (duplicates,
 * both tiers, reads and writes), every phase current in turn, hold 0 on it or
 * not with random accesses pinned, it answers as the walk did, for every
 * tensor of the plan, one of no plan, and one whose slot is another's.
 */
static void test_cur_read_pending_lookup(void **state) {
        enum { TENSORS = 24, ROUNDS = 300 };
        Manager *m = fixture_new(32 * MiB, setup_big, NULL);
        Tensor *t[TENSORS];
        unsigned seed = 12345;
        uint64_t checked = 0;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (unsigned i = 0; i < TENSORS; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "t%u", i);
                t[i] = fixture_tensor(j, name, 4096);
        }
        for (unsigned round = 0; round < ROUNDS; round++) {
                PlanSpecAccess a[4 * TENSORS * 6];
                PlanSpec spec = { .n_phases = 1 + rand_r(&seed) % 6, .acc = a };
                char err[256] = "";
                Plan *p = NULL;

                for (unsigned ph = 0; ph < spec.n_phases; ph++)
                        for (unsigned k = rand_r(&seed) % (2 * TENSORS); k > 0; k--)
                                a[spec.n_acc++] = (PlanSpecAccess) {
                                        .phase = ph, .tensor = t[rand_r(&seed) % (TENSORS - 2)]->id,
                                        .tier = rand_r(&seed) % 2 ? LEVEL_HOST : LEVEL_VRAM,
                                        .mode = 1 + rand_r(&seed) % 3,
                                };
                assert_int_equal(plan_new(m->sched, j, -1, &spec, false, &p, err, sizeof(err)), 0);
                for (uint32_t s = 0; s < p->n_slots; s++)
                        p->slots[s]->plan_slot = s;             /* as sched_plan_new() does */
                t[TENSORS - 2]->plan_slot = UINT32_MAX;         /* named by no plan */
                t[TENSORS - 1]->plan_slot = 0;                  /* named by another plan, slot 0 there */
                for (uint32_t cur = 0; cur <= p->n_phases; cur++) {
                        p->cur = cur < p->n_phases ? cur : UINT32_MAX;
                        p->hold[0].active = rand_r(&seed) % 4 != 0;
                        p->hold[0].phase = rand_r(&seed) % 4 != 0 ? p->cur : (cur + 1) % p->n_phases;
                        for (uint32_t i = 0; i < p->max_acc; i++)
                                p->hs[0].pinned[i] = rand_r(&seed) % 2;
                        for (unsigned i = 0; i < TENSORS; i++)
                                for (int c = 0; c < _USE_MAX; c++) {
                                        assert_int_equal(plan_cur_read_pending(p, t[i], c),
                                                         plan_cur_read_pending_walk(p, t[i], c));
                                        checked += plan_cur_read_pending_walk(p, t[i], c);
                                }
                }
                plan_free(p);
        }
        assert_true(checked > 1000);    /* (the answers were not all "no") */
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_duplicates_merged),
                cmocka_unit_test(test_work_is_linear),
                cmocka_unit_test(test_cur_read_pending_lookup),
        };

        return fixture_main("plan", tests, sizeof(tests) / sizeof(tests[0]));
}
