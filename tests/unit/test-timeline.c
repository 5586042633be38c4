/* SPDX-License-Identifier: MIT */
/* test-timeline.c: the planner's decisions on hand-built timelines, checked exactly (admission: test-timeline-admit.c). */

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/sched/admit.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "proto/plan.h"
#include "tests/unit/fixture.h"
#include "tier.pb-c.h"
#include "util/time-util.h"

#include "tests/unit/timeline-fixture.h"

/* ---- calloc() failing on cue: the test links with -Wl,--wrap=calloc ---------------------------- */

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static int calloc_fail_in = -1;         /* fail the call this many calls from now (0: the next); -1: never */

void *__wrap_calloc(size_t n, size_t size) {
        if (calloc_fail_in >= 0 && calloc_fail_in-- == 0) {
                errno = ENOMEM;
                return NULL;
        }
        return __real_calloc(n, size);
}

/* ---- Belady: the copy used farthest in the future goes first ------------------------------ */

static void test_belady_choice(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Job *j;
        Rank *c;
        Plan *p;
        Tensor *a, *b, *cc, *d, *x, *v[5];
        char err[256];
        uint64_t deadline;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        cc = tensor(j, "C", MiB);
        d = tensor(j, "D", MiB);
        x = tensor(j, "X", MiB);        /* in no plan: no known next use */
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_READ },
                        { 2, cc, LEVEL_HOST, PLAN_READ }, { 3, d, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 4, 4, &p, err, sizeof(err)), 0);
        }
        /* a second a phase: the order below holds unless this test stalls that long between two calls */
        set_durations(p, 1000);
        sched_run(m->sched);   /* predictions: A in ~1 s, B ~2 s, C ~3 s, D ~4 s (before the first marker) */
        /* a request due between A's next use and B's, however late sched_run() ran */
        assert_true(sched_next_use_ns(a, LEVEL_HOST) < sched_next_use_ns(b, LEVEL_HOST));
        deadline = sched_next_use_ns(a, LEVEL_HOST) / 2 + sched_next_use_ns(b, LEVEL_HOST) / 2;

        v[0] = a; v[1] = b; v[2] = cc; v[3] = d; v[4] = x;
        assert_int_equal(sched_victim_order(m->sched, LEVEL_HOST, v, 5, 0), 5);
        assert_ptr_equal(v[0], x);
        assert_ptr_equal(v[1], d);
        assert_ptr_equal(v[2], cc);
        assert_ptr_equal(v[3], b);
        assert_ptr_equal(v[4], a);

        /* a request due before B's next use may only take copies needed after it: never A */
        v[0] = a; v[1] = b; v[2] = cc; v[3] = d; v[4] = x;
        assert_int_equal(sched_victim_order(m->sched, LEVEL_HOST, v, 5, deadline), 4);
        assert_ptr_equal(v[0], x);
        assert_ptr_equal(v[1], d);
        assert_ptr_equal(v[2], cc);
        assert_ptr_equal(v[3], b);
        assert_ptr_equal(v[4], a);      /* the contract: what must stay is behind the victims */

        /* short of memory to rank them, still only what may go (in the order given) */
        v[0] = a; v[1] = b; v[2] = cc; v[3] = d; v[4] = x;
        calloc_fail_in = 0;
        assert_int_equal(sched_victim_order(m->sched, LEVEL_HOST, v, 5, deadline), 4);
        assert_int_equal(calloc_fail_in, -1);   /* the allocation did fail */
        assert_ptr_equal(v[0], b);
        assert_ptr_equal(v[1], cc);
        assert_ptr_equal(v[2], d);
        assert_ptr_equal(v[3], x);
        assert_ptr_equal(v[4], a);

        /* after the marker of phase 1, A (phase 0) is the farthest away, B the nearest */
        marker(m, p, 0);
        marker(m, p, 1);
        set_durations(p, 1000);
        sched_run(m->sched);
        v[0] = a; v[1] = b; v[2] = cc; v[3] = d;
        assert_int_equal(sched_victim_order(m->sched, LEVEL_HOST, v, 4, 0), 4);
        assert_ptr_equal(v[0], b);      /* in use now: its next use is a whole cycle away */
        assert_ptr_equal(v[1], a);
        assert_ptr_equal(v[2], d);
        assert_ptr_equal(v[3], cc);

        /* lru keeps the order it is given */
        m->config.sched_policy = SCHED_POLICY_LRU;
        v[0] = a; v[1] = b; v[2] = cc; v[3] = d;
        assert_int_equal(sched_victim_order(m->sched, LEVEL_HOST, v, 4, deadline), 4);
        assert_ptr_equal(v[0], a);
        assert_ptr_equal(v[3], d);
        finish(m, j, c, p);
}

/* ---- victims weighed by cost: a sole copy costs a write and a read, another copy a read ------ */

static void test_victim_cost(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *a, *b, *v, *cand[3];
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        v = tensor(j, "V", MiB);
        make_on_nvme(m, a);
        touch(m, a, LEVEL_HOST, false);          /* A: host copy, also on NVMe (clean) */
        touch(m, b, LEVEL_HOST, true);           /* B: its only copy is in host (dirty) */
        make_on_nvme(m, v);
        touch(m, v, LEVEL_VRAM, false);          /* V: in vram and host (staged), and NVMe */
        assert_true(copy_valid(v, LEVEL_HOST) && copy_valid(v, LEVEL_VRAM));
        assert_true(copy_is_sole(b, LEVEL_HOST));
        assert_false(copy_is_sole(a, LEVEL_HOST));
        {
                Acc acc[] = {
                        { 0, x, LEVEL_HOST, PLAN_READ }, { 1, v, LEVEL_VRAM, PLAN_READ },
                        { 2, a, LEVEL_HOST, PLAN_READ }, { 3, b, LEVEL_HOST, PLAN_READ },
                        { 5, v, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 5, 6, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        set_durations(p, 100);
        sched_run(m->sched);   /* predictions from now */
        /*
         * Next uses: V in vram in ~100 ms, A ~200, B ~300, V in host ~500.  Pure Belady
         * would take B before A; B costs a write and a read, A only a read, so A goes
         * first (200 > 300 / 2).  V's host copy is first of all: the vram access is
         * served from vram, and the host copy is next needed at phase 5.
         */
        cand[0] = a; cand[1] = b; cand[2] = v;
        assert_int_equal(sched_victim_order(m->sched, LEVEL_HOST, cand, 3, 0), 3);
        assert_ptr_equal(cand[0], v);
        assert_ptr_equal(cand[1], a);
        assert_ptr_equal(cand[2], b);
        finish(m, j, c, p);
}

/* ---- deadline order: earliest first, a few per link ------------------------------------------ */

static void test_deadline_order(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
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
        n_trace = 0;
        assert_int_equal(submit_plan(c, acc, 6, 6, &p, err, sizeof(err)), 0);
        set_durations(p, 100);
        sched_run(m->sched);
        /* phase 0 is pinned ahead, then phases 1 and 2 prefetched: three on the NVMe link, no more */
        assert_int_equal(n_trace, 3);
        assert_string_equal(trace[0], "pin t0 host");
        assert_string_equal(trace[1], "prefetch t1 host");
        assert_string_equal(trace[2], "prefetch t2 host");
        /* as they land, the next deadlines follow, in order (one cycle ahead: up to phase 4,
         * as phase 5 is the one before the first marker) */
        FIXTURE_RUN_UNTIL(m, n_trace >= 5);
        run_loop(m, 10);
        assert_int_equal(n_trace, 5);
        assert_string_equal(trace[3], "prefetch t3 host");
        assert_string_equal(trace[4], "prefetch t4 host");
        /* phase 0 became ready for the first marker */
        assert_int_equal(PLAN_READY_SEQ(p->page->daemon.ready), 1);
        assert_int_equal(PLAN_READY_PHASE(p->page->daemon.ready), 0);
        finish(m, j, c, p);
}

/* ---- the prefetch window: nothing is brought in that would be evicted before its use ------- */

static void test_prefetch_window(void **state) {
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
        n_trace = 0;
        assert_int_equal(submit_plan(c, acc, 6, 6, &p, err, sizeof(err)), 0);
        set_durations(p, 100);
        sched_run(m->sched);
        FIXTURE_RUN_UNTIL(m, copy_valid(t[2], LEVEL_HOST));
        run_loop(m, 20);
        /* 3 MiB hold phases 0..2; t3 would have to evict one of them: it waits */
        assert_int_equal(n_trace, 3);
        assert_string_equal(trace[0], "pin t0 host");
        assert_string_equal(trace[1], "prefetch t1 host");
        assert_string_equal(trace[2], "prefetch t2 host");
        assert_false(copy_valid(t[3], LEVEL_HOST));
        /* phase 0 over: its copy is the farthest use now, and t3 comes into the window */
        marker(m, p, 0);
        marker(m, p, 1);
        FIXTURE_RUN_UNTIL(m, copy_valid(t[3], LEVEL_HOST));
        assert_true(copy_valid(t[3], LEVEL_HOST));
        assert_false(copy_valid(t[0], LEVEL_HOST));
        assert_true(copy_valid(t[2], LEVEL_HOST));
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].ops, 4);   /* t0..t3, each read once */
        finish(m, j, c, p);
}

/* ---- reclaim: a segment whose copy is needed before the requester's deadline stays ---------- */

/*
 * Job V is above its share of a full host pool and holds N (next used in
 * ~20 s), F (~50 s) and G (pinned by its plan's holds), one 4 MiB segment
 * each, N least recently used.  Job R, below its share, pins T with a
 * deadline 30 s away: the segment to empty for it is F's, never N's (needed
 * before R's deadline).  Before, reclaim read cands[k..n) after the victim
 * order as "filtered out" while it held leftovers of the old order: F's
 * segment was kept and N's emptied.
 */
static void test_reclaim_deadline(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        Tensor *n, *f, *g, *u, *t;
        Job *v, *r;
        Rank *cv;
        Plan *p;
        Op *op;
        char err[256];

        assert_int_equal(job_new(m->registry, "v", 0, &v), 0);
        assert_int_equal(job_new(m->registry, "r", 0, &r), 0);
        v->n_conns = r->n_conns = 1;    /* both live: shares of 8 MiB each */
        cv = fake_conn(m, v);
        n = tensor(v, "N", 4 * MiB);
        f = tensor(v, "F", 4 * MiB);
        g = tensor(v, "G", 4 * MiB);
        u = tensor(r, "U", 4 * MiB);
        t = tensor(r, "T", 4 * MiB);
        /* clean host copies (also on NVMe), least recently used first: N, F, G; then R's U fills the pool */
        for (Tensor **x = (Tensor *[]) { n, f, g, u, NULL }; *x; x++) {
                make_on_nvme(m, *x);
                touch(m, *x, LEVEL_HOST, false);
        }
        assert_int_equal(m->registry->pools[LEVEL_HOST]->n_free, 0);
        {
                Acc acc[] = {
                        { 0, g, LEVEL_HOST, PLAN_READ }, { 1, g, LEVEL_HOST, PLAN_READ },
                        { 2, n, LEVEL_HOST, PLAN_READ }, { 5, f, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(cv, acc, 4, 6, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 10000);
        marker(m, p, 0);
        set_durations(p, 10000);
        sched_run(m->sched);            /* N next in ~20 s, F in ~50 s; G held by phases 0 and 1 */
        assert_true(g->copy[LEVEL_HOST].pins > 0);

        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, NULL, NULL, NULL, &op), 0);
        op->deadline_ns = now_ns() + 30000 * MS;
        FIXTURE_RUN_UNTIL(m, copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(n, LEVEL_HOST));          /* needed before the deadline: kept */
        assert_false(copy_valid(f, LEVEL_HOST));         /* its segment went to R */
        assert_true(copy_valid(g, LEVEL_HOST));
        assert_true(copy_valid(u, LEVEL_HOST));
        t->copy[LEVEL_HOST].pins--;
        v->n_conns = r->n_conns = 0;
        job_destroy(r);
        finish(m, v, cv, p);
}

/*
 * Job V fills the host pool, above its share; it is frozen (its rollback
 * waits for its transfers, ipc/commit.c).  Job R, which holds nothing else
 * there, pins T: the room V owes it comes once V thaws, so the pin waits
 * for that instead of failing with ENOSPC (as it did: reclaim found no
 * segment it could empty, and R had no copy of its own to let go).
 */
static void on_pin_status(Op *op, int status, const char *error) {
        (void) error;
        *(int *) op->userdata = status;
}

static void test_reclaim_waits_for_frozen(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 16 * MiB);
        Tensor *x[4], *t;
        int status = 1;
        unsigned kept = 0;
        Job *v, *r;

        (void) state;
        assert_int_equal(job_new(m->registry, "v", 0, &v), 0);
        assert_int_equal(job_new(m->registry, "r", 0, &r), 0);
        v->n_conns = r->n_conns = 1;    /* both live: shares of 8 MiB each */
        for (int i = 0; i < 4; i++) {
                char name[4] = { 'X', (char) ('0' + i), 0 };

                x[i] = tensor(v, name, 4 * MiB);
                make_on_nvme(m, x[i]);
                touch(m, x[i], LEVEL_HOST, false);
        }
        t = tensor(r, "T", 4 * MiB);
        assert_int_equal(m->registry->pools[LEVEL_HOST]->n_free, 0);

        v->frozen = 1;
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_pin_status, NULL, &status, NULL), 0);
        engine_run(m->engine);
        assert_int_equal(status, 1);                    /* waiting, not -ENOSPC */
        assert_false(copy_valid(t, LEVEL_HOST));

        v->frozen = 0;
        engine_wake_space_waiters(m->engine);
        FIXTURE_RUN_UNTIL(m, status != 1);
        assert_int_equal(status, 0);
        assert_true(copy_valid(t, LEVEL_HOST));
        for (int i = 0; i < 4; i++)
                kept += copy_valid(x[i], LEVEL_HOST);
        assert_true(kept < 4);                          /* V's room went to R */
        t->copy[LEVEL_HOST].pins--;
        v->n_conns = r->n_conns = 0;
        job_destroy(r);
        job_destroy(v);
        fixture_free(m);
}

/* ---- write-behind: what will be evicted is written down early; what stays is not ---------- */

static void test_write_behind(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 3 * MiB);
        Tensor *a, *b, *d, *e, *cc;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        d = tensor(j, "D", MiB);
        e = tensor(j, "E", MiB);
        cc = tensor(j, "C", MiB);
        make_on_nvme(m, cc);
        {
                /*
                 * 5 MiB per cycle against a 3 MiB host limit.  B, D and E are new (zeros:
                 * nothing to read), so the only NVMe transfer the window asks for is C's.
                 */
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 1, b, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 2, d, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 3, e, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 4, cc, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 5, 5, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);        /* A pinned for writing, B pinned ahead */
        run_loop(m, 20);
        n_trace = 0;
        /*
         * A released dirty, its sole copy in host; D pinned ahead.  B, D and E fill the
         * limit, C (phase 4) lies beyond: room must be made for it, and A (next used a
         * cycle later) is Belady's victim.  NVMe is idle: A is written down now.
         */
        marker(m, p, 1);
        FIXTURE_RUN_UNTIL(m, copy_valid(a, LEVEL_NVME));
        assert_int_equal(n_trace, 2);
        assert_string_equal(trace[0], "pin D host");    /* zeros: no transfer */
        assert_string_equal(trace[1], "clean A host");
        assert_true(copy_valid(a, LEVEL_NVME));
        assert_true(copy_valid(a, LEVEL_HOST));
        /*
         * A is clean now: its host copy may go for free, and the occupancy
         * simulation admits C at once (A makes room for it now, B, released
         * after phase 1, for E), before the window reaches it.  Then E is pinned
         * ahead; nothing more is written early.
         */
        marker(m, p, 2);
        FIXTURE_RUN_UNTIL(m, copy_valid(e, LEVEL_HOST) && copy_valid(cc, LEVEL_HOST));
        run_loop(m, 20);
        assert_false(copy_valid(a, LEVEL_HOST));
        assert_true(copy_valid(e, LEVEL_HOST));
        assert_true(copy_valid(cc, LEVEL_HOST));
        assert_true(copy_valid(a, LEVEL_NVME));
        assert_int_equal(n_trace, 4);
        assert_string_equal(trace[2], "prefetch C host");
        assert_string_equal(trace[3], "pin E host");
        assert_true(j->used[LEVEL_HOST] <= j->limit[LEVEL_HOST]);
        finish(m, j, c, p);

        /* with room for everything, nothing is written early */
        m = new_manager(SCHED_POLICY_TIMELINE, 4 * MiB);
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        cc = tensor(j, "C", MiB);
        make_on_nvme(m, b);
        make_on_nvme(m, cc);
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 1, b, LEVEL_HOST, PLAN_READ },
                        { 2, cc, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 3, 3, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        n_trace = 0;
        marker(m, p, 1);
        run_loop(m, 30);
        for (unsigned i = 0; i < n_trace; i++)
                assert_null(strstr(trace[i], "clean"));
        assert_false(copy_valid(a, LEVEL_NVME));
        finish(m, j, c, p);
}

/*
 * Write-behind counts the room it can get from the engine's own candidates
 * (engine_victims()), as make_space(), reclaim and admission do.  X, in no
 * plan and so the first victim by next use, has a request of its client in
 * flight (an op on it): the engine cannot take it, so the room C needs must
 * come from A, which is written down early.  Before, write-behind collected
 * its own candidates, X among them, counted X's megabyte as room and wrote
 * nothing: the room then came from a drain in C's way.
 */
static void test_write_behind_same_victims(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 4 * MiB);
        Tensor *a, *b, *d, *e, *cc, *x;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        d = tensor(j, "D", MiB);
        e = tensor(j, "E", MiB);
        cc = tensor(j, "C", MiB);
        make_on_nvme(m, cc);
        touch(m, x, LEVEL_HOST, true);   /* X: 1 MiB of the 4 MiB limit, its sole copy in host */
        x->op_refs++;                   /* a client's request on it is in flight */
        {
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 1, b, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 2, d, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 3, e, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 4, cc, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 5, 5, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        n_trace = 0;
        marker(m, p, 1);
        FIXTURE_RUN_UNTIL(m, copy_valid(a, LEVEL_NVME));
        assert_true(n_trace >= 2);
        assert_string_equal(trace[0], "pin D host");
        assert_string_equal(trace[1], "clean A host");
        assert_true(copy_valid(a, LEVEL_NVME));
        assert_true(copy_valid(x, LEVEL_HOST));  /* untouched: its request is still in flight */
        assert_false(copy_valid(x, LEVEL_NVME));
        x->op_refs--;
        finish(m, j, c, p);
}

/* ---- dead bytes: what the plan overwrites before reading is dropped without write-back ------- */

static void test_dead_bytes(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 2 * MiB);
        Tensor *a, *b, *cc;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];
        uint64_t written;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        cc = tensor(j, "C", MiB);
        make_on_nvme(m, b);
        make_on_nvme(m, cc);
        {
                /* A is produced in phase 0, read in phase 1, and overwritten in phase 0 of the next step */
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_WRITE },
                        { 1, a, LEVEL_HOST, PLAN_READ },
                        { 2, b, LEVEL_HOST, PLAN_READ },
                        { 3, cc, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 4, 4, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        marker(m, p, 1);        /* A released dirty: its sole copy is in host */
        run_loop(m, 20);
        assert_true(copy_is_sole(a, LEVEL_HOST));
        /* phase 1 (running) reads it, so it is pinned; after it, the next access overwrites */
        assert_true(sched_next_access_overwrites(a));
        assert_true(a->copy[LEVEL_HOST].pins > 0);
        written = m->engine->links[LINK_HOST_TO_NVME].bytes;
        marker(m, p, 2);        /* now A's next access (phase 0) overwrites it; C (phase 3) needs room */
        assert_true(sched_next_access_overwrites(a));
        /* dropped as soon as phase 1 let it go, before anything asked for room */
        assert_true(a->dead);
        assert_false(copy_valid(a, LEVEL_HOST));
        FIXTURE_RUN_UNTIL(m, copy_valid(cc, LEVEL_HOST));
        /* C needed the room: A went without a byte written */
        assert_true(copy_valid(cc, LEVEL_HOST));
        assert_false(copy_valid(a, LEVEL_HOST));
        assert_false(copy_valid(a, LEVEL_NVME));
        assert_true(a->dead);
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, written);
        /* and phase 0 gets its (write-only) A without any read: reserved, no copy of A until written */
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, a->copy[LEVEL_HOST].pins > 0);
        assert_true(a->copy[LEVEL_HOST].unwritten);
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, written);
        finish(m, j, c, p);
}

/*
 * ---- a phase pinned ahead and gone through before tierd read its marker --------------------
 *
 * The client may enter a phase pinned ahead (ready already) and the next one
 * before tierd reads the first marker: it then reads only the second.  The
 * phase it went through is over all the same, and what it leaves dead (its
 * next access writes it whole) is dropped as after any other phase.  Before,
 * only the phase of the last marker read counted: T kept its copies, found
 * by test-timeline (integration) under load, whose check that T's NVMe copy
 * went failed once in the unprivileged pass.
 */
static void test_marker_skipped_drops_dead(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 4 * MiB);
        Tensor *t, *u;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];
        uint64_t seq;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        t = tensor(j, "T", MiB);
        u = tensor(j, "U", MiB);
        make_on_nvme(m, t);
        {
                Acc acc[] = {
                        { 0, t, LEVEL_HOST, PLAN_READ },
                        { 1, u, LEVEL_HOST, PLAN_READ },
                        { 2, t, LEVEL_HOST, PLAN_WRITE },
                };
                assert_int_equal(submit_plan(c, acc, 3, 3, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        /* phase 0 pinned ahead: ready before its marker */
        FIXTURE_RUN_UNTIL(m, t->copy[LEVEL_HOST].pins > 0 && copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(t, LEVEL_NVME));
        /* the client enters phase 0 and phase 1 before tierd reads a marker: it reads the second only */
        (void) marker_write(p, 0);
        seq = marker_write(p, 1);
        sched_plan_sync(p);
        assert_int_equal(p->seq, seq);
        assert_int_equal(p->cur, 1);
        /* phase 0 is over: T's next access writes it whole, its copies go without a byte written */
        assert_true(t->dead);
        assert_false(copy_valid(t, LEVEL_HOST));
        assert_false(copy_valid(t, LEVEL_NVME));
        assert_int_equal(t->copy[LEVEL_NVME].state, COPY_ABSENT);
        finish(m, j, c, p);
}

/*
 * ---- a read the current phase still has to pin is not "overwritten next" --------------------
 *
 * G is written in vram by phase 0 and read in host by phase 1, so phase 1's
 * pin of G waits for phase 0 to end (it would pin a copy about to go stale).
 * Once marker 1 is read, the ops already queued run before the pass that pins
 * phase 1: one of them that makes room in vram must not take G's sole copy
 * for dead (its next access after phase 1 is a write), or phase 1 reads
 * zeros.  Found while trying parking (bench/README.md), whose drains ran there.
 */
static void test_deferred_read_not_dead(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 4 * MiB);
        Tensor *g, *x, *y;
        Job *j;
        Rank *c;
        Plan *p;
        Op *op;
        char err[256];
        uint64_t down;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        g = tensor(j, "G", MiB);
        x = tensor(j, "X", MiB);
        y = tensor(j, "Y", MiB);
        make_on_nvme(m, y);
        {
                Acc acc[] = {
                        { 0, g, LEVEL_VRAM, PLAN_WRITE },
                        { 0, x, LEVEL_VRAM, PLAN_READ },
                        { 1, g, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 3, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, g->copy[LEVEL_VRAM].pins > 0 && x->copy[LEVEL_VRAM].pins > 0);
        assert_int_equal(g->copy[LEVEL_HOST].state, COPY_ABSENT);       /* phase 1's read: not pinned ahead */

        /* marker 1, read before anything else runs: G's phase-0 write lands, its only copy in vram */
        (void) marker_write(p, 1);
        sched_plan_sync(p);
        assert_int_equal(p->cur, 1);
        assert_true(copy_is_sole(g, LEVEL_VRAM));
        assert_int_equal(g->copy[LEVEL_VRAM].pins, 0);
        assert_false(sched_next_access_overwrites(g));

        /* an op queued before the pass (Y is in no plan) makes room in vram, full with G and X */
        down = m->engine->links[LINK_VRAM_TO_HOST].bytes;
        assert_int_equal(op_submit(m->engine, OP_PREFETCH, y, LEVEL_VRAM, NULL, NULL, NULL, &op), 0);
        FIXTURE_RUN_UNTIL(m, copy_valid(g, LEVEL_HOST));
        assert_true(copy_valid(g, LEVEL_HOST));
        assert_false(g->dead);
        assert_int_equal(g->copy[LEVEL_HOST].version, 1);
        /* its bytes came down from vram: not zeros made up for a dead tensor */
        assert_true(m->engine->links[LINK_VRAM_TO_HOST].bytes >= down + MiB);
        finish(m, j, c, p);
}

/*
 * ---- a read the current phase still has to pin is needed now, not a cycle later ------------
 *
 * X is written in host by phase 0 and read in vram by phase 1, so phase 1's
 * pin of X waits for phase 0 to end.  Once marker 1 is read, X's host copy
 * (the only one) is the source of that pin, which the ops already queued
 * precede.  The victim order used to skip the current phase's uses and so
 * ranked X as needed at phase 0 of the next cycle: one of those ops that
 * makes room in host wrote X down to NVMe (to be read back for the pin)
 * instead of dropping Y, clean and needed only at phase 2.
 */
static void test_pending_read_needed_now(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 2 * MiB);
        Tensor *x, *y, *z;
        Job *j;
        Rank *c;
        Plan *p;
        Op *op;
        char err[256];
        uint64_t written;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        y = tensor(j, "Y", MiB);
        z = tensor(j, "Z", MiB);
        {
                Acc acc[] = {
                        { 0, x, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 1, x, LEVEL_VRAM, PLAN_READ },
                        { 2, y, LEVEL_HOST, PLAN_READ },
                        { 3, y, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 4, 4, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        make_on_nvme(m, y);
        touch(m, y, LEVEL_HOST, false);         /* Y: in host, clean (its NVMe copy stays) */
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, x->copy[LEVEL_HOST].pins > 0);
        assert_int_equal(x->copy[LEVEL_VRAM].state, COPY_ABSENT);       /* phase 1's read: not pinned ahead */

        /* marker 1, read before anything else runs: X's phase-0 write lands, its only copy in host */
        (void) marker_write(p, 1);
        sched_plan_sync(p);
        assert_int_equal(p->cur, 1);
        assert_true(copy_is_sole(x, LEVEL_HOST));
        assert_true(plan_cur_read_pending(p, x, USE_ANY));
        assert_true(sched_victim_next_use(x, LEVEL_HOST) < sched_victim_next_use(y, LEVEL_HOST));

        /* an op queued before the pass (Z is in no plan) makes room in host, full with X and Y */
        written = m->engine->links[LINK_HOST_TO_NVME].bytes;
        assert_int_equal(op_submit(m->engine, OP_PIN, z, LEVEL_HOST, NULL, NULL, NULL, &op), 0);
        FIXTURE_RUN_UNTIL(m, z->copy[LEVEL_HOST].pins > 0);
        assert_int_equal(z->copy[LEVEL_HOST].pins, 1);
        assert_false(copy_valid(y, LEVEL_HOST));        /* Y went, for free */
        assert_true(copy_valid(y, LEVEL_NVME));
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, written);  /* X was not written down */
        assert_int_equal(x->copy[LEVEL_NVME].state, COPY_ABSENT);
        assert_int_equal(tensor_unpin(z, LEVEL_HOST, false), 0);
        finish(m, j, c, p);
}

/*
 * ---- a phase pinned ahead that the client never entered wrote nothing ----------------------
 *
 * The next phase is pinned ahead; a write-only access there reserves its copy
 * without bringing the old bytes.  A client that goes to another phase instead
 * (it starts in the middle of its cycle, as after tierd restarted) never
 * wrote there: the old data stays the newest.
 */
static void test_skipped_write_phase(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 4 * MiB);
        Tensor *a;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];
        uint64_t version;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        make_on_nvme(m, a);
        version = a->version;
        {
                /* phase 0 writes A whole, phase 1 reads it */
                Acc acc[] = {
                        { 0, a, LEVEL_HOST, PLAN_WRITE },
                        { 1, a, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 2, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        /* before any marker, phase 0 (the first) is pinned ahead: A reserved in host, not read */
        FIXTURE_RUN_UNTIL(m, p->hold[1].active && p->hold[1].ready_sent);
        assert_true(p->hold[1].ready_sent);
        assert_int_equal(p->hold[1].phase, 0);
        marker(m, p, 1);        /* the client starts at phase 1: it never wrote A */
        assert_int_equal(a->version, version);
        assert_true(copy_valid(a, LEVEL_NVME));
        FIXTURE_RUN_UNTIL(m, copy_valid(a, LEVEL_HOST));
        assert_true(copy_valid(a, LEVEL_HOST));          /* read from NVMe for phase 1 */
        assert_int_equal(a->version, version);
        /* phase 0 entered, then left: that wrote A */
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, p->hold[0].ready_sent);
        assert_true(p->hold[0].ready_sent);
        marker(m, p, 1);
        assert_true(a->version > version);
        finish(m, j, c, p);
}

/* ---- a tensor two plans name is never dead: the other plan may read it --------------------- */

static void test_shared_not_dead(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *a, *sh;
        Job *j;
        Rank *c1, *c2;
        Plan *p1, *p2;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        sh = tensor(j, "S", MiB);
        make_on_nvme(m, sh);
        {
                /* rank 1 overwrites S in its phase 1; rank 2 reads it */
                Acc acc1[] = { { 0, a, LEVEL_HOST, PLAN_READ }, { 1, sh, LEVEL_HOST, PLAN_WRITE } };
                Acc acc2[] = { { 0, sh, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acc1, 2, 2, &p1, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, acc2, 1, 1, &p2, err, sizeof(err)), 0);
        }
        assert_int_equal(sh->plan_refs, 2);
        set_durations(p1, 100);
        marker(m, p1, 0);
        /* rank 1's next access writes S, but rank 2 reads it: it is not dead */
        assert_false(sched_next_access_overwrites(sh));
        marker(m, p1, 1);
        marker(m, p1, 0);       /* S released by rank 1's phase 1 */
        assert_false(sh->dead);
        assert_true(tensor_valid_tier(sh, LEVEL_NVME) >= 0);
        sched_plan_free(p2);
        free(c2);
        finish(m, j, c1, p1);
}

/* ---- quotas: a plan that cannot run within them is refused up front ------------------------- */

static void test_quota_respect(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 2 * MiB);
        Tensor *a, *b, *cc;
        Job *j;
        Rank *c;
        Plan *p = NULL;
        char err[256];
        Acc pair[] = { { 0, NULL, LEVEL_HOST, PLAN_READ }, { 1, NULL, LEVEL_HOST, PLAN_READ },
                       { 1, NULL, LEVEL_HOST, PLAN_READ } };
        Acc big[] = { { 0, NULL, LEVEL_VRAM, PLAN_READ }, { 0, NULL, LEVEL_VRAM, PLAN_READ },
                      { 0, NULL, LEVEL_VRAM, PLAN_READ } };

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        cc = tensor(j, "C", MiB);
        pair[0].t = a;
        pair[1].t = b;
        pair[2].t = cc;
        /* each phase fits 2 MiB, two consecutive ones (pinned together by timeline) do not */
        assert_int_equal(submit_plan(c, pair, 3, 2, &p, err, sizeof(err)), -ENOSPC);
        assert_non_null(strstr(err, "phases 0 and 1 together pin 3145728 bytes of host"));
        assert_null(p);
        /* under lru one phase at a time is pinned: accepted */
        m->config.sched_policy = SCHED_POLICY_LRU;
        assert_int_equal(submit_plan(c, pair, 3, 2, &p, err, sizeof(err)), 0);
        sched_plan_free(p);
        p = NULL;
        /* one phase needing more VRAM than the job may use: refused whatever the policy */
        big[0].t = a;
        big[1].t = b;
        big[2].t = cc;
        assert_int_equal(submit_plan(c, big, 3, 1, &p, err, sizeof(err)), -ENOSPC);
        assert_non_null(strstr(err, "phase 0 pins 3145728 bytes of vram"));
        /* names a tensor the job lacks; a bad mode */
        {
                PlanSpecAccess acc = { .phase = 0, .tensor = 0xffffffffull, .tier = LEVEL_HOST, .mode = PLAN_READ };
                PlanSpec sp = { .n_phases = 1, .acc = &acc, .n_acc = 1 };

                assert_int_equal(sched_plan_new(m->sched, j, -1, &sp, &p, err, sizeof(err)), -ENOENT);
                acc.tensor = a->id;
                acc.mode = 9;
                assert_int_equal(sched_plan_new(m->sched, j, -1, &sp, &p, err, sizeof(err)), -EINVAL);
                acc.mode = PLAN_READ;
                acc.tier = LEVEL_NVME;
                assert_int_equal(sched_plan_new(m->sched, j, -1, &sp, &p, err, sizeof(err)), -EINVAL);
                sp.n_phases = 0;
                assert_int_equal(sched_plan_new(m->sched, j, -1, &sp, &p, err, sizeof(err)), -EINVAL);
        }
        finish(m, j, c, NULL);
}

/* ---- fair share: colliding deadlines are served by weight ------------------------------------ */

static void test_weighted_sharing(void **state) {
        Job j1 = { .weight = 1 }, j2 = { .weight = 3 };
        SchedCand c[40];
        unsigned limit[_SCHED_LINK_MAX] = { 100, 100 };
        uint64_t now = 1000 * MS;
        char order[9] = "";

        /* overdue work of both jobs, interleaved, deadlines a microsecond apart: all collide */
        for (int i = 0; i < 40; i++)
                c[i] = (SchedCand) { .job = i % 2 ? &j2 : &j1, .hold = -1, .deadline = now - 10 * MS + (uint64_t) i * 1000,
                                     .link = SCHED_LINK_NVME };
        for (int k = 0; k < 8; k++) {
                size_t i = sched_pick(c, 40, now, limit);

                assert_true(i != SIZE_MAX);
                c[i].taken = true;
                order[k] = c[i].job == &j1 ? '1' : '2';
                sched_charge(c[i].job, MiB);
        }
        assert_string_equal(order, "12221222");        /* 1:3, as the weights say */

        /* a deadline clearly earlier than the rest wins whatever the virtual times */
        j1.vtime = 1000;
        j2.vtime = 0;
        c[0] = (SchedCand) { .job = &j1, .hold = -1, .deadline = now + 1 * MS, .link = SCHED_LINK_NVME };
        c[1] = (SchedCand) { .job = &j2, .hold = -1, .deadline = now + 50 * MS, .link = SCHED_LINK_NVME };
        assert_int_equal(sched_pick(c, 2, now, limit), 0);

        /* a job whose link is full holds its work back; another link's goes first */
        j1.sched_inflight[SCHED_LINK_NVME] = 100;
        c[1].link = SCHED_LINK_PCIE;
        assert_int_equal(sched_pick(c, 2, now, limit), 1);
        c[1].taken = true;
        assert_int_equal(sched_pick(c, 2, now, limit), SIZE_MAX);
        j1.sched_inflight[SCHED_LINK_NVME] = 99;
        assert_int_equal(sched_pick(c, 2, now, limit), 0);
        /* slots are per job: another job's full link does not hold j1 back */
        c[0] = (SchedCand) { .job = &j2, .hold = -1, .deadline = now, .link = SCHED_LINK_NVME };
        c[1] = (SchedCand) { .job = &j1, .hold = -1, .deadline = now + 1 * MS, .link = SCHED_LINK_NVME };
        j2.sched_inflight[SCHED_LINK_NVME] = 100;
        assert_int_equal(sched_pick(c, 2, now, limit), 1);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_belady_choice),
                cmocka_unit_test(test_victim_cost),
                cmocka_unit_test(test_deadline_order),
                cmocka_unit_test(test_prefetch_window),
                cmocka_unit_test(test_reclaim_deadline),
                cmocka_unit_test(test_reclaim_waits_for_frozen),
                cmocka_unit_test(test_write_behind),
                cmocka_unit_test(test_write_behind_same_victims),
                cmocka_unit_test(test_dead_bytes),
                cmocka_unit_test(test_deferred_read_not_dead),
                cmocka_unit_test(test_pending_read_needed_now),
                cmocka_unit_test(test_marker_skipped_drops_dead),
                cmocka_unit_test(test_skipped_write_phase),
                cmocka_unit_test(test_shared_not_dead),
                cmocka_unit_test(test_quota_respect),
                cmocka_unit_test(test_weighted_sharing),
        };
        return fixture_main("timeline", tests, sizeof(tests) / sizeof(tests[0]));
}
