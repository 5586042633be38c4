/* SPDX-License-Identifier: MIT */
/* test-reclaim.c: room made for a copy: taken back from other jobs (engine/reclaim.c), or among the job's own (victims.c). */

#include <errno.h>
#include <stdbool.h>
#include <setjmp.h>
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
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/renew.h"
#include "daemon/tiers/segpool.h"
#include "proto/plan.h"
#include "tests/unit/fixture.h"
#include "util/time-util.h"

/* A host pool of four 4 MiB segments, all of it for one job. */
static void setup(Config *c, void *userdata) {
        c->host_capacity = 16 * MiB;
        c->host_segment_size = 4 * MiB;
        c->host_job_limit = 16 * MiB;
}

typedef struct Done {
        int done;
        int status;
} Done;

static void on_done(Op *op, int status, const char *error) {
        Done *d = op->userdata;

        d->done = 1;
        d->status = status;
}

/* @n tensors of 4 MiB (a segment each) of @j named PREFIX0.., written in host (their sole copy). */
static void fill(Manager *m, Job *j, const char *prefix, Tensor **t, unsigned n) {
        for (unsigned i = 0; i < n; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "%s%u", prefix, i);
                t[i] = fixture_tensor(j, name, 4 * MiB);
                fixture_host_data(m, t[i], (uint8_t) (0x10 + i));
        }
}

/*
 * A segment reclaim emptied for a requester goes to the renewer (its memory is replaced) before the pool
 * hands it over: the requester waits for it.  Its retry found the pool still dry and no drain in flight,
 * and emptied another segment of the victim: a 4 MiB pin took 8 MiB from 'a', which went below what it had
 * above its share for nothing.  The renewer is held, so the order is explicit: the retry that finds the
 * segment renewing runs before it comes back.
 */
static void test_renewing_segment_is_coming(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        SegPool *pool = &m->host.pool;
        Tensor *ta[4], *tb;
        Job *a, *b;
        Done d = {};

        assert_non_null(pool->renewer);
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        assert_int_equal(job_new(m->registry, "b", 0, &b), 0);
        a->n_conns = b->n_conns = 1;    /* both live: shares of 8 MiB each */
        fill(m, a, "a", ta, 4);
        assert_int_equal(pool->n_free, 0);
        assert_int_equal(engine_job_share(m->engine, a, LEVEL_HOST), 8 * MiB);

        segrenewer_hold(pool->renewer, true);
        tb = fixture_tensor(b, "b", 4 * MiB);
        assert_int_equal(op_submit(m->engine, OP_PIN, tb, LEVEL_HOST, on_done, NULL, &d, NULL), 0);
        /* a segment of 'a' is written down and emptied for 'b', and goes to the renewer */
        FIXTURE_RUN_UNTIL(m, pool->n_renewing == 1);
        assert_int_equal(pool->n_renewing, 1);
        assert_int_equal(d.done, 0);
        assert_int_equal(a->used[LEVEL_HOST], 12 * MiB);
        for (unsigned i = 0; i < 4; i++)
                assert_int_not_equal(ta[i]->copy[LEVEL_HOST].state, COPY_DRAINING);
        /* once it is back, 'b' has it; 'a' gave one segment, no more */
        segrenewer_hold(pool->renewer, false);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_int_equal(d.status, 0);
        assert_int_equal(b->used[LEVEL_HOST], 4 * MiB);
        assert_int_equal(a->used[LEVEL_HOST], 12 * MiB);
        assert_int_equal(tensor_unpin(tb, LEVEL_HOST, false), 0);
        a->n_conns = b->n_conns = 0;
        job_destroy(a);
        job_destroy(b);
        fixture_free(m);
}

/*
 * Room within a guarantee is owed to its job: one below its minimum takes it back from a live job above its
 * own minimum, even one within its weighted share.  'greedy' (weight 10: a share of 12 MiB, its limit) held
 * 12 MiB unpinned and 'guaranteed' (host_min 8 MiB) 4 MiB, the pool dry; 'guaranteed' asked for 4 MiB more.
 * Reclaim took from no job within its share (shares are parts of the capacity by weight: 12 + 8 > 16), so
 * 'guaranteed' made the room among its own copies, evicting 'g0', and stayed at 4 MiB, half its minimum.
 */
static void test_guarantee_is_owed(void **state) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);
        Tensor *tg[3], *tq[2];
        Job *greedy, *g;

        assert_int_equal(job_new(m->registry, "greedy", 0, &greedy), 0);
        assert_int_equal(job_new(m->registry, "guaranteed", 0, &g), 0);
        greedy->n_conns = g->n_conns = 1;
        greedy->weight = 10;
        greedy->limit[LEVEL_HOST] = 12 * MiB;
        g->guarantee[LEVEL_HOST] = 8 * MiB;
        fill(m, greedy, "h", tg, 3);
        fill(m, g, "g", tq, 1);
        assert_int_equal(m->host.pool.n_free, 0);
        assert_int_equal(engine_job_share(m->engine, greedy, LEVEL_HOST), 12 * MiB);
        assert_int_equal(engine_job_share(m->engine, g, LEVEL_HOST), 8 * MiB);

        tq[1] = fixture_tensor(g, "g1", 4 * MiB);
        assert_int_equal(fixture_op(m, OP_PIN, tq[1], LEVEL_HOST), 0);
        assert_int_equal(tensor_unpin(tq[1], LEVEL_HOST, false), 0);
        assert_true(copy_valid(tq[0], LEVEL_HOST));
        assert_int_equal(g->used[LEVEL_HOST], 8 * MiB);
        assert_int_equal(greedy->used[LEVEL_HOST], 8 * MiB);
        /* what 'greedy' gave was written down first */
        for (unsigned i = 0; i < 3; i++)
                assert_true(copy_valid(tg[i], LEVEL_HOST) || copy_valid(tg[i], LEVEL_NVME));
        /* past its guarantee, 'guaranteed' takes nothing from a job within its share: its own copies go */
        {
                Tensor *more = fixture_tensor(g, "g2", 4 * MiB);

                assert_int_equal(fixture_op(m, OP_PIN, more, LEVEL_HOST), 0);
                assert_int_equal(tensor_unpin(more, LEVEL_HOST, false), 0);
                assert_int_equal(greedy->used[LEVEL_HOST], 8 * MiB);
                assert_int_equal(g->used[LEVEL_HOST], 8 * MiB);
        }
        greedy->n_conns = g->n_conns = 0;
        job_destroy(greedy);
        job_destroy(g);
        fixture_free(m);
}

static void setup_small(Config *c, void *userdata) {
        c->host_capacity = 8 * MiB;
        c->host_segment_size = 4 * MiB;
        c->host_job_limit = 8 * MiB;
        c->nvme_extent_size = 64 * 1024;
}

/*
 * A quota lowered below what a job uses: its unpinned copies make way as it needs room (tierctl(1) quota
 * set).  Each try to make room freed the size of the new copy, not what the job had above its limit, and
 * after RESERVE_ATTEMPTS_MAX (64) tries the pin failed -ENOSPC, "at its host limit ... 0 B of it pinned",
 * with everything unpinned and clean: 96 tensors of 32 KiB held 3 MiB against a new limit of 1 MiB.
 */
static void lowered_makes_room(bool total) {
        Manager *m = fixture_new(64 * MiB, setup_small, NULL);
        Tensor *t[96], *n;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        j->n_conns = 1;
        for (unsigned i = 0; i < ELEMENTSOF(t); i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "t%u", i);
                t[i] = fixture_tensor(j, name, 32 * 1024);
                fixture_on_nvme(m, t[i]);
                fixture_touch(m, t[i], LEVEL_HOST, false);      /* clean in host: dropped, not written */
        }
        assert_int_equal(j->used[LEVEL_HOST], 3 * MiB);
        if (total) {
                /* its uid's total, lowered: as quota_apply_all() resolves it */
                j->totals = calloc(1, sizeof(JobTotal));
                assert_non_null(j->totals);
                j->totals[0] = (JobTotal) { .kind = QUOTA_UID, .id = 0, .total = { [LEVEL_HOST] = 1 * MiB } };
                j->n_totals = 1;
        } else
                j->limit[LEVEL_HOST] = 1 * MiB;                 /* as quota_apply_all() lowers it */
        engine_limits_changed(m->engine);
        n = fixture_tensor(j, "new", 32 * 1024);
        assert_int_equal(fixture_op(m, OP_PIN, n, LEVEL_HOST), 0);
        assert_true(j->used[LEVEL_HOST] <= 1 * MiB);
        assert_int_equal(tensor_unpin(n, LEVEL_HOST, false), 0);
        for (unsigned i = 0; i < ELEMENTSOF(t); i++)
                assert_true(copy_valid(t[i], LEVEL_NVME));
        j->n_conns = 0;
        job_destroy(j);
        fixture_free(m);
}

static void test_lowered_limit_makes_room(void **state) {
        lowered_makes_room(false);
}

/* The same for a total of its uid lowered below what its jobs use (tierctl quota set --uid U --host-total). */
static void test_lowered_total_makes_room(void **state) {
        lowered_makes_room(true);
}

typedef struct Said {
        int done;
        int status;
        char error[1024];
} Said;

static void on_said(Op *op, int status, const char *error) {
        Said *d = op->userdata;

        d->done = 1;
        d->status = status;
        (void) snprintf(d->error, sizeof(d->error), "%s", error ? error : "");
}

/*
 * An NVMe guarantee is room kept free: NVMe copies are never taken back from a job (nothing lies below), so
 * one job's copies must not take the unused part of another's nvme_min.  'a' (nvme_min 4 MiB of an 8 MiB
 * target) had nothing there yet; 'b' wrote its whole 8 MiB, and 'a''s first eviction to NVMe then failed
 * "no room left".  Now 'b''s fifth 1 MiB is refused, naming 'a', while 'a' gets its 4 MiB; a lingering
 * 'a' keeps nothing.
 */
static void test_nvme_guarantee_is_kept(void **state) {
        Manager *m = fixture_new(8 * MiB, NULL, NULL);
        Registry *r = m->registry;
        Tensor *ta[4], *tb[5];
        SpaceShort why = SPACE_OK;
        Job *a, *b;
        Said d = {};

        assert_int_equal(job_new(r, "a", 0, &a), 0);
        assert_int_equal(job_new(r, "b", 0, &b), 0);
        a->n_conns = b->n_conns = 1;
        a->guarantee[LEVEL_NVME] = 4 * MiB;
        assert_int_equal(nvme_kept(r, b, NULL, 0), 4 * MiB);
        for (unsigned i = 0; i < 5; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "b%u", i);
                tb[i] = fixture_tensor(b, name, MiB);
                if (i < 4)
                        fixture_on_nvme(m, tb[i]);
        }
        /* what is left is 'a''s: refused at once, the message naming whose guarantee it is kept for */
        fixture_touch(m, tb[4], LEVEL_HOST, true);
        assert_int_equal(op_submit(m->engine, OP_EVICT, tb[4], LEVEL_NVME, on_said, NULL, &d, NULL), 0);
        FIXTURE_RUN_UNTIL(m, d.done);
        assert_int_equal(d.done, 1);
        assert_int_equal(d.status, -ENOSPC);
        if (!strstr(d.error, "the NVMe room left (4.0 MiB free of 8.0 MiB) is kept, 4.0 MiB of it, for the "
                             "guaranteed minimum (nvme_min) of 'a' (4.0 MiB, 0 B of it used)") ||
            !strstr(d.error, "tensor 'b4' of job 'b'"))
                fail_msg("error: %s", d.error);
        assert_true(copy_valid(tb[4], LEVEL_HOST));
        assert_int_equal(b->used[LEVEL_NVME], 4 * MiB);

        /* 'a' always gets its own */
        for (unsigned i = 0; i < 4; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "a%u", i);
                ta[i] = fixture_tensor(a, name, MiB);
                fixture_on_nvme(m, ta[i]);
        }
        assert_int_equal(a->used[LEVEL_NVME], 4 * MiB);
        assert_int_equal(nvme_kept(r, b, NULL, 0), 0);

        /* a lingering job keeps its data, not its claim on the room (nor its own, while it lingers) */
        copy_free(ta[3], LEVEL_NVME);
        a->linger_until = 1;
        assert_int_equal(nvme_kept(r, b, NULL, 0), 0);
        assert_int_equal(copy_alloc(tb[4], LEVEL_NVME, &why), 0);
        copy_release(tb[4], LEVEL_NVME);
        a->linger_until = 0;
        assert_int_equal(nvme_kept(r, b, NULL, 0), MiB);
        assert_int_equal(copy_alloc(tb[4], LEVEL_NVME, &why), -ENOSPC);
        assert_int_equal(why, SPACE_NVME_KEPT);

        a->n_conns = b->n_conns = 0;
        job_destroy(a);
        job_destroy(b);
        fixture_free(m);
}

/*
 * When a job's last connection goes, the room kept on NVMe for its nvme_min is free to the others: a host
 * copy whose write-down to NVMe was refused for it is written down on the next try.  It was not: the copy
 * stayed blocked until NVMe space was freed, and the job's pins kept failing for room it could have made.
 */
static void test_nvme_claim_gone_drains(void **state) {
        Manager *m = fixture_new(8 * MiB, NULL, NULL);
        Registry *r = m->registry;
        Tensor *tb[4], *th[4], *big;
        Job *a, *b;

        assert_int_equal(job_new(r, "a", 0, &a), 0);
        assert_int_equal(job_new(r, "b", 0, &b), 0);
        a->n_conns = b->n_conns = 1;
        a->guarantee[LEVEL_NVME] = 4 * MiB;
        for (unsigned i = 0; i < 4; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "b%u", i);
                tb[i] = fixture_tensor(b, name, MiB);
                fixture_on_nvme(m, tb[i]);
                (void) snprintf(name, sizeof(name), "h%u", i);
                th[i] = fixture_tensor(b, name, MiB);
                fixture_touch(m, th[i], LEVEL_HOST, true);      /* b's host limit (4 MiB) is full, sole copies */
        }
        /* making host room means writing down to NVMe, whose free room is 'a''s */
        big = fixture_tensor(b, "big", MiB);
        assert_int_not_equal(fixture_op(m, OP_PIN, big, LEVEL_HOST), 0);
        assert_int_equal(b->used[LEVEL_NVME], 4 * MiB);

        /* 'a' lingers: its claim is gone, and the write-down goes */
        a->n_conns = 0;
        a->linger_until = 1;
        engine_claims_changed(m->engine);
        assert_int_equal(fixture_op(m, OP_PIN, big, LEVEL_HOST), 0);
        assert_int_equal(b->used[LEVEL_NVME], 5 * MiB);
        assert_int_equal(tensor_unpin(big, LEVEL_HOST, false), 0);

        job_destroy(a);
        b->n_conns = 0;
        job_destroy(b);
        fixture_free(m);
}

/* As setup(), under lru, the job held to 8 MiB: 2048 copies of 4 KiB fill it. */
static void setup_lru(Config *c, void *userdata) {
        setup(c, userdata);
        c->sched_policy = SCHED_POLICY_LRU;
        c->host_job_limit = 8 * MiB;
}

/*
 * Under lru a reservation that finds its job at its limit takes the least recently used copies and
 * stops once it has the room (engine/victims.c).  It looked at every copy in the tier twice for each
 * choice (the room coming, then every candidate): an eviction storm was quadratic work.  The work is
 * counted (Engine.victim_steps), not timed; the victims are the same.
 */
static void test_lru_victims_stop_early(void **state) {
        enum { N = 2048, MORE = 64 };
        Manager *m = fixture_new(32 * MiB, setup_lru, NULL);
        Tensor *t[N + MORE];
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (unsigned i = 0; i < N + MORE; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "t%u", i);
                t[i] = fixture_tensor(j, name, 4096);
        }
        for (unsigned i = 0; i < N; i++)
                fixture_touch(m, t[i], LEVEL_HOST, false);      /* never written: a drop frees it */
        assert_int_equal(j->used[LEVEL_HOST], 8 * MiB);
        assert_int_equal(fixture_op(m, OP_PIN, t[0], LEVEL_HOST), 0);  /* pinned: passed over, t1 goes first */

        m->engine->victim_steps = 0;
        for (unsigned i = N; i < N + MORE; i++)
                fixture_touch(m, t[i], LEVEL_HOST, false);
        /* (a walk of every copy per choice: about 2 * MORE * N) */
        assert_true(m->engine->victim_steps <= 4 * MORE);
        assert_int_equal(t[0]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        for (unsigned i = 1; i <= MORE; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(t[MORE + 1]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(j->used[LEVEL_HOST], 8 * MiB);
        assert_int_equal(j->draining[LEVEL_HOST], 0);
        assert_int_equal(tensor_unpin(t[0], LEVEL_HOST, false), 0);

        job_destroy(j);
        fixture_free(m);
}

/* As setup(), under timeline, the job held to 8 MiB: 2048 copies of 4 KiB fill it. */
static void setup_timeline(Config *c, void *userdata) {
        setup(c, userdata);
        c->sched_policy = SCHED_POLICY_TIMELINE;
        c->host_job_limit = 8 * MiB;
}

enum { TL_N = 2048, TL_MORE = 64, TL_PLANNED = 8 };

/*
 * Under timeline: a job of TL_N + TL_MORE copies of 4 KiB, its first TL_PLANNED read by a plan
 * (two a phase, a second a phase), the first TL_N in host (never written: nothing to write
 * down), the victim comparisons counted from then on (Sched.victim_cmps).
 */
static Manager *timeline_full(Tensor **t, Job **jp, Plan **pp) {
        Manager *m = fixture_new(32 * MiB, setup_timeline, NULL);
        PlanSpecAccess a[TL_PLANNED];
        PlanSpec spec = { .n_phases = TL_PLANNED / 2, .acc = a, .n_acc = TL_PLANNED };
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, jp), 0);
        for (unsigned i = 0; i < TL_N + TL_MORE; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "t%u", i);
                t[i] = fixture_tensor(*jp, name, 4096);
        }
        for (unsigned i = 0; i < TL_PLANNED; i++)
                a[i] = (PlanSpecAccess) { .phase = i / 2, .tensor = t[i]->id, .tier = LEVEL_HOST, .mode = PLAN_READ };
        if (sched_plan_new(m->sched, *jp, -1, &spec, pp, err, sizeof(err)) < 0)
                fail_msg("plan: %s", err);
        for (uint32_t k = 0; k < (*pp)->n_phases; k++) {
                (*pp)->phases[k].ema_ns = 1000000000ull;
                (*pp)->phases[k].samples = 1;
        }
        m->sched->victim_cmps = 0;
        for (unsigned i = 0; i < TL_N; i++)
                fixture_touch(m, t[i], LEVEL_HOST, false);
        assert_int_equal((*jp)->used[LEVEL_HOST], 8 * MiB);
        return m;
}

/*
 * Each scheduler pass's write-behind ordered every host copy of the job (sched_victim_order(), a
 * sort) only to look for a sole copy it could write down: with none (copies never written, or
 * cleaned already) that was n log n comparisons a pass for nothing, and the pass runs after
 * every op (at 40960 copies most of a pin's time).  Counted, not timed.
 */
static void test_timeline_write_behind_sorts_nothing_clean(void **state) {
        Tensor *t[TL_N + TL_MORE];
        Job *j;
        Plan *p;
        Manager *m = timeline_full(t, &j, &p);

        /* (before: about 2048 * 11 comparisons a pass, a few passes an op) */
        assert_int_equal(m->sched->victim_cmps, 0);
        sched_plan_free(p);
        job_destroy(j);
        fixture_free(m);
}

/*
 * Under timeline a reservation that finds its job at its limit took its victims from the
 * whole order of the job's copies (a sort of every candidate, for each choice), though it
 * takes as few as make the room: now a heap, built in linear time, gives them one at a
 * time (EngineSchedOps.victim_take).  The comparisons are counted, not timed; the victims
 * are the same: the copies without a planned use, least recently used first (t0..t7, read
 * by the plan, stay).
 */
static void test_timeline_victims_take_few(void **state) {
        Tensor *t[TL_N + TL_MORE];
        Job *j;
        Plan *p;
        Manager *m = timeline_full(t, &j, &p);

        m->sched->victim_cmps = 0;
        for (unsigned i = TL_N; i < TL_N + TL_MORE; i++)
                fixture_touch(m, t[i], LEVEL_HOST, false);
        /* (a sort of every candidate per choice: about TL_MORE * TL_N * 6, here; the heap about TL_MORE * TL_N) */
        assert_true(m->sched->victim_cmps <= 2 * TL_MORE * TL_N);
        for (unsigned i = 0; i < TL_PLANNED; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        for (unsigned i = TL_PLANNED; i < TL_PLANNED + TL_MORE; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_ABSENT);
        for (unsigned i = TL_PLANNED + TL_MORE; i < TL_N + TL_MORE; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(j->used[LEVEL_HOST], 8 * MiB);
        sched_plan_free(p);
        job_destroy(j);
        fixture_free(m);
}

enum { TL_PHASE = 512 };

/*
 * Under timeline, with the plan in a phase: whether a read of a candidate is still to be pinned
 * in the current phase (plan_cur_read_pending(), asked of every planned candidate in each choice)
 * walked all of that phase's accesses, so a choice cost its candidates times the phase's accesses
 * (40960 copies, a phase of 2048: 34 ms a pin, measured).  Now only the candidate's own accesses
 * there are looked at.  A plan of three phases of TL_PHASE reads, the job's host full, phase 0
 * entered (its reads pinned, phase 1 pinned ahead): each of TL_MORE pins takes one victim; the
 * accesses looked at are counted, not timed (before: about TL_MORE * TL_PHASE * TL_PHASE).  The
 * victims are the same: the unplanned copies, least recently used first.
 */
static void test_timeline_pending_reads_looked_up(void **state) {
        static Tensor *t[TL_N + TL_MORE];
        static PlanSpecAccess a[3 * TL_PHASE];
        PlanSpec spec = { .n_phases = 3, .acc = a, .n_acc = 3 * TL_PHASE };
        Manager *m = fixture_new(32 * MiB, setup_timeline, NULL);
        uint64_t one = 1, seq;
        char err[256];
        Job *j;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (unsigned i = 0; i < TL_N + TL_MORE; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "t%u", i);
                t[i] = fixture_tensor(j, name, 4096);
        }
        for (unsigned i = 0; i < 3 * TL_PHASE; i++)
                a[i] = (PlanSpecAccess) { .phase = i / TL_PHASE, .tensor = t[i]->id, .tier = LEVEL_HOST,
                                          .mode = PLAN_READ };
        if (sched_plan_new(m->sched, j, -1, &spec, &p, err, sizeof(err)) < 0)
                fail_msg("plan: %s", err);
        for (uint32_t k = 0; k < p->n_phases; k++) {
                p->phases[k].ema_ns = 1000000000ull;
                p->phases[k].samples = 1;
        }
        for (unsigned i = 0; i < TL_N; i++)
                fixture_touch(m, t[i], LEVEL_HOST, false);
        assert_int_equal(j->used[LEVEL_HOST], 8 * MiB);

        /* the rank enters phase 0 (what tier_phase_enter() stores, and its wakeup) */
        seq = p->page->client.marker_seq + 1;
        p->page->client.phase = 0;
        p->page->client.mark_ns = now_ns();
        __atomic_store_n(&p->page->client.marker, PLAN_READY(seq, 0), __ATOMIC_RELEASE);
        __atomic_store_n(&p->page->client.marker_seq, seq, __ATOMIC_RELEASE);
        assert_int_equal(write(p->marker_fd, &one, sizeof(one)), sizeof(one));
        FIXTURE_RUN_UNTIL(m, p->seq == seq);
        assert_int_equal(p->seq, seq);
        assert_int_equal(p->cur, 0);

        m->sched->pending_looks = 0;
        for (unsigned i = TL_N; i < TL_N + TL_MORE; i++)
                fixture_touch(m, t[i], LEVEL_HOST, false);
        /* (before: about TL_MORE * TL_PHASE * TL_PHASE, 16.8 million) */
        assert_true(m->sched->pending_looks <= 2 * TL_MORE * TL_N);
        for (unsigned i = 0; i < 3 * TL_PHASE; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        for (unsigned i = 3 * TL_PHASE; i < 3 * TL_PHASE + TL_MORE; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_ABSENT);
        for (unsigned i = 3 * TL_PHASE + TL_MORE; i < TL_N + TL_MORE; i++)
                assert_int_equal(t[i]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(j->used[LEVEL_HOST], 8 * MiB);
        sched_plan_free(p);
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_renewing_segment_is_coming),
                cmocka_unit_test(test_guarantee_is_owed),
                cmocka_unit_test(test_lowered_limit_makes_room),
                cmocka_unit_test(test_lowered_total_makes_room),
                cmocka_unit_test(test_nvme_guarantee_is_kept),
                cmocka_unit_test(test_nvme_claim_gone_drains),
                cmocka_unit_test(test_lru_victims_stop_early),
                cmocka_unit_test(test_timeline_write_behind_sorts_nothing_clean),
                cmocka_unit_test(test_timeline_victims_take_few),
                cmocka_unit_test(test_timeline_pending_reads_looked_up),
        };

        return fixture_main("reclaim", tests, ELEMENTSOF(tests));
}
