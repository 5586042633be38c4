/* SPDX-License-Identifier: MIT */
/* test-timeline-admit.c: the planner's admission decisions (occupancy, early reads, write-behind by occupancy, lookahead, moves per step), checked exactly. */

#include <errno.h>
#include <signal.h>

#include "daemon/sched/admit.h"
#include "util/uring.h"
#include "tests/unit/timeline-fixture.h"
/* ---- admission by occupancy: a prefetch only if its copy stays until its use ----------------- */

/* A manager under lru (no prefetch: the state stays as the test makes it), host limit @host MiB. */
static Manager *quiet_manager(uint64_t host) {
        return new_manager(SCHED_POLICY_LRU, host * MiB);
}

/* A tensor of 1 MiB whose only copy is on NVMe. */
static Tensor *nvme_tensor(Manager *m, Job *j, const char *name) {
        Tensor *t = tensor(j, name, MiB);

        make_on_nvme(m, t);
        return t;
}

/* Submit @acc (@n_phases phases of 100 ms) and enter phase 0. */
static Plan *start_plan(Manager *m, Rank *c, Acc *acc, size_t n_acc, uint32_t n_phases) {
        Plan *p;
        char err[256];

        assert_int_equal(submit_plan(c, acc, n_acc, n_phases, &p, err, sizeof(err)), 0);
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        return p;
}

static void test_admit_occupancy(void **state) {
        Manager *m = quiet_manager(3);
        Tensor *a, *b, *cc, *d, *x;
        Job *j;
        Rank *c;
        Plan *p;
        char why[160];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = nvme_tensor(m, j, "A");
        b = nvme_tensor(m, j, "B");
        cc = nvme_tensor(m, j, "C");
        x = nvme_tensor(m, j, "X");
        {
                /* A is read again in phase 3; X, in phase 4, is the farthest */
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                        { 2, cc, LEVEL_HOST, PLAN_READ }, { 3, a, LEVEL_HOST, PLAN_READ },
                        { 4, x, LEVEL_HOST, PLAN_READ },
                };
                p = start_plan(m, c, acc, 5, 5);
        }
        set_durations(p, 100);
        plan_predict(p, now_ns());
        assert_true(copy_valid(a, LEVEL_HOST) && a->copy[LEVEL_HOST].pins == 1);
        assert_int_equal(j->used[LEVEL_HOST], MiB);
        /*
         * X now: 2 MiB free, X takes one.  B comes for phase 1 (the last MiB), C for
         * phase 2: A is kept for phase 3, B is pinned while C is pinned ahead, so
         * Belady would evict X, needed last.  Brought now, it would be read twice.
         */
        assert_false(admit_survives(p, x, LEVEL_HOST, 4, why, sizeof(why)));
        assert_string_equal(why, "phase 2 (2 ahead) would be 1048576 bytes short in host without evicting it");
        /* C itself, two phases ahead: only B comes before it, and there is room for both */
        assert_true(admit_survives(p, cc, LEVEL_HOST, 2, why, sizeof(why)));
        /* in vram (no limit set: the fixture's default) there is room for all of it */
        assert_true(admit_survives(p, x, LEVEL_VRAM, 4, why, sizeof(why)));
        sched_plan_free(p);

        /*
         * The window counts every tensor of the phases ahead at once; the simulation
         * knows that A, read only in phase 0, may go once phase 0 is over: D, three
         * phases ahead, is beyond the window but survives (A makes room for C).
         */
        d = x;
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                        { 2, cc, LEVEL_HOST, PLAN_READ }, { 3, d, LEVEL_HOST, PLAN_READ },
                };
                p = start_plan(m, c, acc, 4, 4);
        }
        set_durations(p, 100);
        plan_predict(p, now_ns());
        plan_window(p);
        assert_int_equal(p->window[LEVEL_HOST], 2);
        assert_true(admit_survives(p, d, LEVEL_HOST, 3, why, sizeof(why)));
        /* with B and C there as well, there is no room now: A is still in use */
        touch(m, b, LEVEL_HOST, false);
        touch(m, cc, LEVEL_HOST, false);
        assert_false(admit_survives(p, d, LEVEL_HOST, 3, why, sizeof(why)));
        assert_string_equal(why, "no room in host now without evicting a copy needed sooner");
        finish(m, j, c, p);
}

/*
 * The simulation counts a copy no plan names as room only when the engine
 * could take it now (engine_copy_evictable(), the rule of its own victims):
 * one a client's request is working on (op_refs) stays until that ends.
 */
static void test_admit_untracked_in_use(void **state) {
        Manager *m = quiet_manager(3);
        Tensor *a, *b, *cc, *u;
        Job *j;
        Rank *c;
        Plan *p;
        char why[160];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = nvme_tensor(m, j, "A");
        b = nvme_tensor(m, j, "B");
        cc = nvme_tensor(m, j, "C");
        u = nvme_tensor(m, j, "U");
        touch(m, u, LEVEL_HOST, false);  /* U: in host, named by no plan */
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                        { 2, cc, LEVEL_HOST, PLAN_READ },
                };
                p = start_plan(m, c, acc, 3, 3);
        }
        plan_predict(p, now_ns());
        assert_true(copy_valid(a, LEVEL_HOST) && a->copy[LEVEL_HOST].pins == 1);
        assert_true(copy_valid(u, LEVEL_HOST));
        assert_int_equal(j->used[LEVEL_HOST], 2 * MiB);
        /* A pinned, U in host: B takes the last MiB, and C's room is U's, which may go */
        assert_true(admit_survives(p, cc, LEVEL_HOST, 2, why, sizeof(why)));
        /* a request on U is in flight: the engine cannot take it, so neither may the simulation */
        u->op_refs++;
        assert_false(admit_survives(p, cc, LEVEL_HOST, 2, why, sizeof(why)));
        u->op_refs--;
        assert_true(admit_survives(p, cc, LEVEL_HOST, 2, why, sizeof(why)));
        finish(m, j, c, p);
}

/*
 * Prefetches admitted in one pass reserve their room only when the engine runs
 * their ops, after the pass: each admission counts the bytes of those before it.
 */
static void test_admit_same_pass(void **state) {
        Manager *m = quiet_manager(3);
        Tensor *a, *b, *x, *y;
        Job *j;
        Rank *c;
        Plan *p;
        SchedCand cx, cy;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = nvme_tensor(m, j, "A");
        b = nvme_tensor(m, j, "B");
        x = nvme_tensor(m, j, "X");
        y = nvme_tensor(m, j, "Y");
        {
                /* X and Y are read in the same phase, after B */
                Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                              { 2, x, LEVEL_HOST, PLAN_READ }, { 2, y, LEVEL_HOST, PLAN_READ } };
                p = start_plan(m, c, acc, 4, 3);
        }
        set_durations(p, 100);
        plan_predict(p, now_ns());
        assert_int_equal(j->used[LEVEL_HOST], MiB);      /* A, pinned */
        assert_true(!copy_valid(b, LEVEL_HOST) && !copy_valid(x, LEVEL_HOST) && !copy_valid(y, LEVEL_HOST));
        cx = (SchedCand) { .plan = p, .job = j, .tensor = x, .tier = LEVEL_HOST, .hold = -1, .ahead = 2,
                           .deadline = p->pred[2], .link = SCHED_LINK_NVME };
        cy = cx;
        cy.tensor = y;
        m->sched->pass_no++;
        /* 2 MiB free: X and then B (phase 1) fit */
        assert_true(sched_admit(m->sched, &cx));
        /* Y in the same pass: X's op has not reserved yet, but its MiB is taken: B would find none */
        assert_false(sched_admit(m->sched, &cy));
        assert_int_equal(p->admit_refused, 1);
        /* a later pass counts what is reserved then (X's op failed or never ran here: room again) */
        m->sched->pass_no++;
        y->sched_blocked = 0;
        assert_true(sched_admit(m->sched, &cy));
        finish(m, j, c, p);
}

/* ---- write-behind by occupancy: a dirty copy the plan will evict anyway is written early ------ */

static void test_admit_evicted(void **state) {
        Tensor *a, *b, *cc, *d, *v;
        Manager *m;
        Job *j;
        Rank *c;
        Plan *p;

        for (uint64_t host = 2; host <= 3; host++) {
                m = quiet_manager(host);
                assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
                c = fake_conn(m, j);
                a = nvme_tensor(m, j, "A");
                b = nvme_tensor(m, j, "B");
                cc = nvme_tensor(m, j, "C");
                d = nvme_tensor(m, j, "D");
                v = tensor(j, "V", MiB);
                touch(m, v, LEVEL_HOST, true);   /* V: dirty, its only copy is in host */
                {
                        Acc acc[] = {
                                { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                                { 2, cc, LEVEL_HOST, PLAN_READ }, { 3, d, LEVEL_HOST, PLAN_READ },
                                { 4, v, LEVEL_HOST, PLAN_READ },
                        };
                        p = start_plan(m, c, acc, 5, 5);
                }
                set_durations(p, 100);
                plan_predict(p, now_ns());
                assert_true(copy_is_sole(v, LEVEL_HOST));
                /*
                 * 3 MiB: A goes after phase 0 and B after phase 1, each making room for
                 * the next (they are clean, V would cost a write): V stays until phase 4.
                 * 2 MiB: B finds no room but V's in phase 1 already: it goes.
                 */
                assert_int_equal(admit_evicted(p, v, LEVEL_HOST), host == 2);
                /* A, pinned now and needed again only a cycle later, is no question of eviction here */
                assert_false(admit_evicted(p, a, LEVEL_HOST));
                finish(m, j, c, p);
        }
}

/*
 * Write-behind replays the occupancy (admit_evicted()) for the job's sole
 * host copies in victim order, and stops at the first of the plan's that
 * stays: every one after it is needed sooner and stays too (admit.h).  It
 * used to replay each of them, every pass -- N replays of O(N) each, after
 * every request: a plan of 8192 tensors held a pin for more than 20 s.
 */
static void test_write_behind_stops_at_a_kept_copy(void **state) {
        enum { N = 16 };        /* (the fixture's most phases) */
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *t[N];
        Acc acc[N];
        char name[8];
        uint64_t sims;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                t[i] = tensor(j, name, 64 * 1024);
                touch(m, t[i], LEVEL_HOST, true);       /* dirty: its only copy is in host */
                acc[i] = (Acc) { (unsigned) i, t[i], LEVEL_HOST, PLAN_READ };
        }
        p = start_plan(m, c, acc, N, N);
        run_loop(m, 20);
        assert_false(uring_busy(m->uring));
        sims = m->sched->admit_sims;
        sched_run(m->sched);
        /* all of it fits: the first copy replayed stays, and so do the 13 others after it */
        assert_true(m->sched->admit_sims - sims <= 2);
        for (int i = 0; i < N; i++)
                assert_true(copy_is_sole(t[i], LEVEL_HOST));
        finish(m, j, c, p);
}

/* ---- early reads take only cheap room: not a copy read again before the reads ahead are done -- */

static void test_early_room(void **state) {
        Manager *m = quiet_manager(3);
        Tensor *a, *b, *x, *y;
        Job *j;
        Rank *c;
        Plan *p;
        char why[160];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = nvme_tensor(m, j, "A");
        b = nvme_tensor(m, j, "B");
        x = nvme_tensor(m, j, "X");
        y = tensor(j, "Y", MiB);
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                        { 2, x, LEVEL_HOST, PLAN_READ }, { 3, y, LEVEL_HOST, PLAN_READ },
                };
                p = start_plan(m, c, acc, 4, 4);
        }
        touch(m, b, LEVEL_HOST, false);
        b->copy[LEVEL_HOST].pins = 1;            /* as if pinned ahead */
        touch(m, y, LEVEL_HOST, true);           /* Y: dirty, its only copy in host, read in phase 3 */
        set_durations(p, 100);
        plan_predict(p, now_ns());
        assert_int_equal(j->used[LEVEL_HOST], 3 * MiB);
        /*
         * An early read of X (phase 2) must take Y's room (A is pinned, B is needed
         * first).  When the reads ahead reach phase 3, Y would be read back within
         * them: X's read only trades places with Y's, plus a write.  Refused.
         */
        p->horizon_ns = p->pred[3];
        assert_false(admit_early_room(p, x, p->pred[2], why, sizeof(why)));
        assert_non_null(strstr(why, "an early read would evict 'Y', read again in "));
        /* when the reads ahead end before Y's use, its room may go (it is read back later) */
        p->horizon_ns = p->pred[2];
        assert_true(admit_early_room(p, x, p->pred[2], why, sizeof(why)));
        /* no horizon: the rule does not apply; free room: nothing is evicted */
        p->horizon_ns = 0;
        assert_true(admit_early_room(p, x, p->pred[2], why, sizeof(why)));
        p->horizon_ns = p->pred[3];
        touch(m, y, LEVEL_VRAM, true);
        copy_free(y, LEVEL_HOST);                /* Y only in vram now: host room is free */
        assert_int_equal(j->used[LEVEL_HOST], 2 * MiB);
        assert_true(admit_early_room(p, x, p->pred[2], why, sizeof(why)));
        b->copy[LEVEL_HOST].pins = 0;
        finish(m, j, c, p);
}

/* ---- cross-phase lookahead: reads that take longer than the phases before them start early -- */

static void test_lookahead_horizon(void **state) {
        Manager *m = quiet_manager(14);
        Tensor *t[16];
        Acc acc[16];
        Job *j;
        Rank *c;
        Plan *p;
        char err[256], name[8];
        uint64_t now;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        /*
         * Six phases of 100 ms.  Phases 0, 1, 2, 4 and 5 read one tensor of 1 MiB,
         * phase 3 (an optimizer's, say) reads eleven.
         */
        for (unsigned i = 0; i < 16; i++) {
                snprintf(name, sizeof(name), "t%u", i);
                t[i] = tensor(j, name, MiB);
                make_on_nvme(m, t[i]);
                acc[i] = (Acc) { i < 3 ? i : i < 14 ? 3 : i - 10, t[i], LEVEL_HOST, PLAN_READ };
        }
        assert_int_equal(submit_plan(c, acc, 16, 6, &p, err, sizeof(err)), 0);
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        set_durations(p, 100);
        now = p->cur_mark_ns;   /* as if at the marker: phase k starts k x 100 ms from now */
        plan_predict(p, now);
        assert_true(copy_valid(t[0], LEVEL_HOST));
        /*
         * At 1 MiB per 25 ms the reads up to phase 3 (1 + 1 + 11 MiB) take 325 ms, but
         * phase 3 starts in 300: they must all be under way from now on, three phases
         * ahead.  Phases 4 and 5 (350 and 375 ms of reads, 400 and 500 ms away) can wait.
         */
        assert_int_equal(admit_horizon(p, now, 40 * MiB), 3);
        assert_int_equal(p->horizon, 3);
        assert_true(p->horizon_ns == p->pred[3]);       /* what early reads may not take room from (admit.c) */
        /* twice as fast, nothing is late: the byte windows alone say how far */
        assert_int_equal(admit_horizon(p, now, 80 * MiB), 0);
        assert_true(p->horizon_ns == 0);
        finish(m, j, c, p);
}

/* ---- moves per step: a second move of a tensor into a tier needs a reason ------------------- */

static void test_moves_per_step(void **state) {
        Manager *m = quiet_manager(8);
        Tensor *a, *b;
        Job *j;
        Rank *c;
        Plan *p;
        SchedCand cand;
        uint64_t refused;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = nvme_tensor(m, j, "A");
        b = nvme_tensor(m, j, "B");
        {
                Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                              { 2, b, LEVEL_HOST, PLAN_READ }, { 3, a, LEVEL_HOST, PLAN_READ } };
                p = start_plan(m, c, acc, 4, 4);
        }
        /* A's pin brought it this step and the pin is a use */
        assert_int_equal(moves_check(p, a, LEVEL_HOST, false), MOVE_REUSE);
        assert_int_equal(moves_check(p, b, LEVEL_HOST, false), MOVE_FIRST);
        /* B's prefetch of this step landed, then was evicted before its use: a repeat, counted */
        moves_note(p, b, LEVEL_HOST, false);
        assert_int_equal(moves_check(p, b, LEVEL_HOST, false), MOVE_REFETCH);
        assert_string_equal(move_why_to_string(MOVE_REFETCH), "again this step: its prefetch was evicted before use");
        /* its pin may bring it: the phase needs it now */
        assert_int_equal(moves_check(p, b, LEVEL_HOST, true), MOVE_DEMAND);
        /* the simulation admits it again (8 MiB hold it all); when it lands, the repeat is counted */
        cand = (SchedCand) { .plan = p, .job = j, .tensor = b, .tier = LEVEL_HOST, .hold = -1, .ahead = 2,
                             .deadline = p->pred[2], .link = SCHED_LINK_NVME };
        assert_true(sched_admit(m->sched, &cand));
        assert_int_equal(cand.tier, LEVEL_HOST);
        moves_landed(p, b, LEVEL_HOST);
        assert_int_equal(p->moves_repeated, 1);
        assert_int_equal(p->moves_refetched, 1);
        assert_int_equal(moves_check(p, b, LEVEL_HOST, false), MOVE_REFETCH);
        /*
         * Evicted before its use once more: admitted a last time.  Two refetches in a step
         * and the next is refused (the loop GPT-2 ran into: prefetched, evicted for the next
         * prefetch, prefetched again, thousands of times a step): its pin will bring it.
         */
        assert_true(sched_admit(m->sched, &cand));
        moves_landed(p, b, LEVEL_HOST);
        assert_int_equal(p->moves_refetched, 2);
        refused = p->admit_refused;
        assert_false(sched_admit(m->sched, &cand));
        assert_int_equal(p->admit_refused, refused + 1);
        assert_int_equal(moves_check(p, b, LEVEL_HOST, true), MOVE_DEMAND);     /* the pin may */
        /* a copy that served a use and was evicted after it may be prefetched again */
        moves_used(p, b, LEVEL_HOST);
        assert_true(sched_admit(m->sched, &cand));
        assert_int_equal(moves_check(p, b, LEVEL_HOST, false), MOVE_REUSE);
        /* other tiers are not affected; a new step starts afresh */
        assert_int_equal(moves_check(p, b, LEVEL_VRAM, false), MOVE_FIRST);
        marker(m, p, 1);
        marker(m, p, 2);
        marker(m, p, 3);
        marker(m, p, 0);
        assert_int_equal(moves_check(p, b, LEVEL_HOST, false), MOVE_FIRST);
        moves_note(p, b, LEVEL_HOST, false);
        assert_int_equal(p->move_refetch[2 * (size_t) b->plan_slot + LEVEL_HOST], 0);     /* the count too */
        finish(m, j, c, p);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_admit_occupancy),
                cmocka_unit_test(test_admit_evicted),
                cmocka_unit_test(test_write_behind_stops_at_a_kept_copy),
                cmocka_unit_test(test_lookahead_horizon),
                cmocka_unit_test(test_admit_untracked_in_use),
                cmocka_unit_test(test_admit_same_pass),
                cmocka_unit_test(test_early_room),
                cmocka_unit_test(test_moves_per_step),
        };
        return fixture_main("timeline-admit", tests, sizeof(tests) / sizeof(tests[0]));
}
