/* SPDX-License-Identifier: MIT */
/* test-timeline-selfpin.c: a phase whose room its own connection pins is refused; room others pin is waited for. */

#include "tests/unit/timeline-fixture.h"

#include <errno.h>

/* The connection of a plan, as sched/selfpin.c sees it: the pins it holds, the refusals it was told. */
typedef struct Owner {
        Tensor *pin_t[4];
        int pin_tier[4];
        size_t n_pins;
        unsigned refused;
        uint64_t seq;
        uint32_t phase;
        int status;
        char error[1024];
} Owner;

static bool owner_pin(void *owner, size_t i, Tensor **ret_tensor, int *ret_tier) {
        Owner *o = owner;

        if (i >= o->n_pins)
                return false;
        *ret_tensor = o->pin_t[i];
        *ret_tier = o->pin_tier[i];
        return true;
}

static void owner_refused(void *owner, uint64_t seq, uint32_t phase, int status, const char *error) {
        Owner *o = owner;

        o->refused++;
        o->seq = seq;
        o->phase = phase;
        o->status = status;
        snprintf(o->error, sizeof(o->error), "%s", error);
}

static const PlanOwnerOps owner_ops = { .pin = owner_pin, .refused = owner_refused };

/* @o's client pins @t in host (a plain pin, outside its plan). */
static void own_pin(Manager *m, Owner *o, Tensor *t) {
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        o->pin_t[o->n_pins] = t;
        o->pin_tier[o->n_pins++] = LEVEL_HOST;
}

static void own_unpin(Owner *o, Tensor *t) {
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        for (size_t i = 0; i < o->n_pins; i++)
                if (o->pin_t[i] == t)
                        o->pin_t[i] = o->pin_t[--o->n_pins];
}

/* Would tier_phase_enter() of marker @seq, @phase return (a phase pinned ahead may be ready too)? */
static bool ready_for(const Plan *p, uint64_t seq, uint32_t phase) {
        uint64_t ready = __atomic_load_n(&p->page->daemon.ready, __ATOMIC_ACQUIRE);

        return PLAN_READY_SEQ(ready) > seq || ready == PLAN_READY(seq, phase);
}

/* Phase 0 reads @a in host, phase 1 @b in @b_tier. */
static Plan *two_phases(Manager *m, Job *j, Rank *c, Tensor *a, Tensor *b, int b_tier, Owner *o) {
        Acc acc[] = { { 0, a, LEVEL_HOST, PLAN_READ }, { 1, b, b_tier, PLAN_READ } };
        char err[256];
        Plan *p;

        assert_int_equal(submit_plan(c, acc, 2, 2, &p, err, sizeof(err)), 0);
        set_durations(p, 100);
        plan_set_owner_ops(p, &owner_ops, o);
        return p;
}

/*
 * The connection pins X, most of the job's host limit, then enters a phase
 * that reads Y there, which does not fit beside X: only that connection can
 * unpin X, and it waits in tier_phase_enter(), so the phase waited forever.
 * It is refused (-ENOSPC, X named), its pins let go, and nothing after it is
 * said ready (the next phase's Z, resident in VRAM, is not pinned ahead: the
 * client would take that ready for its refused marker's); the plan lives on:
 * after the unpin the phase is entered again, and is ready.
 */
static void test_own_pin_refuses_the_phase(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 6 * MiB);
        y = tensor(j, "Y", 4 * MiB);
        z = tensor(j, "Z", MiB);
        assert_int_equal(fixture_op(m, OP_PIN, z, LEVEL_VRAM), 0);
        assert_int_equal(tensor_unpin(z, LEVEL_VRAM, true), 0);
        own_pin(m, &o, x);
        p = two_phases(m, j, c, y, z, LEVEL_VRAM, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0);
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.status, -ENOSPC);
        assert_int_equal(o.seq, seq);
        assert_int_equal(o.phase, 0);
        assert_non_null(strstr(o.error, "phase 0 of job 'j' can never be pinned in host while this client's own "
                                        "pins there stay"));
        assert_non_null(strstr(o.error, "the phase needs 4.0 MiB (tensor 'Y' found no room)"));
        assert_non_null(strstr(o.error, "'X' (6.0 MiB)"));
        assert_non_null(strstr(o.error, "beyond the job's host limit (8.0 MiB)"));
        assert_non_null(strstr(o.error, "unpin them before entering the phase, or add them to the plan"));
        assert_int_equal(p->error, 0);                          /* the plan lives on */
        assert_int_equal(p->hold[0].n_pinned, 0);               /* the refused marker holds nothing */
        assert_int_equal(y->copy[LEVEL_HOST].pins, 0);
        assert_false(ready_for(p, seq, 0));                     /* nor does a ready come after it */
        assert_int_equal(p->hold[1].n_pinned, 0);
        assert_int_equal(z->copy[LEVEL_VRAM].pins, 0);
        assert_true(copy_valid(z, LEVEL_VRAM));

        own_unpin(&o, x);
        seq = marker_write(p, 0);                               /* entered again */
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0));
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 1);
        assert_int_equal(y->copy[LEVEL_HOST].pins, 1);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * The same pin held by another connection (a rank of the job) may go: the
 * phase waits for it, not refused, and is ready after that unpin.  So does a
 * phase whose room the connection's own pin leaves with the phase's pins
 * within the limit, another's pin taking the rest.
 */
static void test_others_pins_are_waited_for(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 4 * MiB);
        w = tensor(j, "W", 2 * MiB);
        y = tensor(j, "Y", 4 * MiB);
        z = tensor(j, "Z", MiB);
        assert_int_equal(fixture_op(m, OP_PIN, x, LEVEL_HOST), 0);      /* another connection's */
        own_pin(m, &o, w);                                      /* 2M of its own + 4M of the phase: 6M fit 8M */
        p = two_phases(m, j, c, y, z, LEVEL_HOST, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, plan_waiting(p) != NULL);
        assert_non_null(plan_waiting(p));
        assert_int_equal(p->hold[0].refused, 0);                /* (set where the pin is blocked) */
        assert_int_equal(o.refused, 0);
        assert_int_equal(p->error, 0);

        assert_int_equal(tensor_unpin(x, LEVEL_HOST, false), 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0));
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 0);
        own_unpin(&o, w);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * A phase pinned ahead whose room the connection's own pin takes waits: the
 * client may unpin before it enters it (and then enters it, ready); entered
 * with the pin still there, it is refused, the plan living on.
 */
static void test_own_pin_ahead_waits_until_entered(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 4 * MiB);
        y = tensor(j, "Y", MiB);
        z = tensor(j, "Z", 6 * MiB);
        own_pin(m, &o, x);                                      /* 4M + Y 1M in phase 0; phase 1 needs Z 6M */
        p = two_phases(m, j, c, y, z, LEVEL_HOST, &o);
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, 1, 0) && p->hold[1].active && p->hold[1].phase == 1 &&
                             p->hs[1].blocked[0] != 0);
        assert_true(ready_for(p, 1, 0));
        assert_int_not_equal(p->hs[1].blocked[0], 0);           /* Z's pin ahead found no room */
        assert_int_equal(o.refused, 0);                         /* ahead: not refused */
        assert_int_equal(p->hold[1].refused, 0);

        seq = marker_write(p, 1);                               /* entered with the pin: refused */
        FIXTURE_RUN_UNTIL(m, o.refused > 0);
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.seq, seq);
        assert_int_equal(o.phase, 1);
        assert_non_null(strstr(o.error, "'X' (4.0 MiB)"));
        assert_int_equal(p->error, 0);

        own_unpin(&o, x);
        seq = marker_write(p, 1);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 1));
        assert_true(ready_for(p, seq, 1));
        assert_int_equal(o.refused, 1);
        marker(m, p, 0);
        finish(m, j, c, p);
}

/*
 * The totals fit, but not the place: the connection's own pins X and W
 * (3 MiB each) hold both host segments (4 MiB) the job's limit (8 MiB)
 * gives it, one each, leaving 1 MiB free in each; Y (2 MiB) needs one run
 * of 2 MiB in one segment, so the phase waited forever, 8 MiB being within
 * the limit.  It is refused, the room named fragmented, and entered again
 * after W's unpin, ready.
 */
static void test_own_pins_fragment_the_room(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        assert_int_equal(fixture_op(m, OP_PIN, z, LEVEL_VRAM), 0);
        assert_int_equal(tensor_unpin(z, LEVEL_VRAM, true), 0);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        assert_ptr_not_equal(x->copy[LEVEL_HOST].pieces[0].seg, w->copy[LEVEL_HOST].pieces[0].seg);
        p = two_phases(m, j, c, y, z, LEVEL_VRAM, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_null(plan_waiting(p));
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.status, -ENOSPC);
        assert_int_equal(o.seq, seq);
        assert_int_equal(o.phase, 0);
        assert_non_null(strstr(o.error, "phase 0 of job 'j' can never be pinned in host while this client's own "
                                        "pins there stay"));
        assert_non_null(strstr(o.error, "'X' (3.0 MiB), 'W' (3.0 MiB)"));
        assert_non_null(strstr(o.error, "hold 2 of the 2 host segments (4.0 MiB each) the job may have, and leave "
                                        "no free run there for tensor 'Y' (2.0 MiB): the room is fragmented"));
        assert_non_null(strstr(o.error, "unpin them before entering the phase"));
        assert_int_equal(p->error, 0);
        assert_int_equal(p->hold[0].n_pinned, 0);
        assert_false(ready_for(p, seq, 0));

        own_unpin(&o, w);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0));
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 1);
        assert_int_equal(y->copy[LEVEL_HOST].pins, 1);
        own_unpin(&o, x);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * Each of the phase's tensors has a place beside the own pins, but not both:
 * X and W (3 MiB each, own) hold two of the three segments the job's 12 MiB
 * give it, 1 MiB free in each; Y and U (3 MiB each) need 6 MiB outside them,
 * in one segment of 4 MiB.  Refused; with U of 1 MiB both fit the third
 * segment (and a 1 MiB run), and the phase is ready.
 */
static void test_own_pins_leave_no_room_for_the_whole_phase(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 12 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *u, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 3 * MiB);
        u = tensor(j, "U", 3 * MiB);
        z = tensor(j, "Z", MiB);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        {
                Acc acc[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 0, u, LEVEL_HOST, PLAN_READ },
                              { 1, z, LEVEL_VRAM, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 3, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        plan_set_owner_ops(p, &owner_ops, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_null(plan_waiting(p));
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.seq, seq);
        assert_non_null(strstr(o.error, "hold 2 of the 3 host segments (4.0 MiB each) the job may have, and leave "
                                        "the phase's tensors too little room outside them: 6.0 MiB of them fit no "
                                        "free run there, 4.0 MiB is left"));
        assert_int_equal(p->error, 0);
        sched_plan_free(p);

        u = tensor(j, "U1", MiB);
        {
                Acc acc[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 0, u, LEVEL_HOST, PLAN_READ },
                              { 1, z, LEVEL_VRAM, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 3, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        plan_set_owner_ops(p, &owner_ops, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 1);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 1);
        own_unpin(&o, x);
        own_unpin(&o, w);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * Room fragmented by the own pin X and what may go is not refused: W pinned
 * by another connection is waited for (ready after its unpin); V, resident
 * and unpinned, is evicted for Y.
 */
static void test_fragments_others_may_free_are_not_refused(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *w, *v, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        v = tensor(j, "V", 3 * MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        assert_int_equal(fixture_op(m, OP_PIN, z, LEVEL_VRAM), 0);
        assert_int_equal(tensor_unpin(z, LEVEL_VRAM, true), 0);
        own_pin(m, &o, x);
        assert_int_equal(fixture_op(m, OP_PIN, w, LEVEL_HOST), 0);      /* another connection's */
        p = two_phases(m, j, c, y, z, LEVEL_VRAM, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_non_null(plan_waiting(p));
        assert_int_equal(o.refused, 0);
        assert_int_equal(p->hold[0].refused, 0);
        assert_int_equal(tensor_unpin(w, LEVEL_HOST, false), 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 0);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 0);
        marker(m, p, 1);
        sched_plan_free(p);

        touch(m, v, LEVEL_HOST, true);                          /* V resident, unpinned, beside X */
        assert_ptr_not_equal(v->copy[LEVEL_HOST].pieces[0].seg, x->copy[LEVEL_HOST].pieces[0].seg);
        y = tensor(j, "Y2", 2 * MiB);
        p = two_phases(m, j, c, y, z, LEVEL_VRAM, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 0);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 0);
        assert_false(copy_valid(v, LEVEL_HOST));                /* evicted for Y2 */
        own_unpin(&o, x);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * The segments the job may have are those the other live jobs' guarantees leave it pinned, too: its
 * 12 MiB limit gives it three, but K's 8 MiB guarantee in the 16 MiB tier leaves it two, both holding
 * the own pins X and W, 1 MiB free in each, and Y (2 MiB) never fits while K runs: refused.  With K's
 * guarantee 4 MiB a third segment is the job's, and the phase entered again is ready.
 */
static void test_guarantees_leave_only_the_pinned_segments(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 12 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *z;
        uint64_t seq;
        Job *j, *k;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        assert_int_equal(job_new(m->registry, "k", 0, &k), 0);
        k->n_conns = 1;
        k->guarantee[LEVEL_HOST] = 8 * MiB;
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        assert_int_equal(fixture_op(m, OP_PIN, z, LEVEL_VRAM), 0);
        assert_int_equal(tensor_unpin(z, LEVEL_VRAM, true), 0);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        p = two_phases(m, j, c, y, z, LEVEL_VRAM, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_null(plan_waiting(p));
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.seq, seq);
        assert_non_null(strstr(o.error, "hold 2 of the 2 host segments (4.0 MiB each) the job may have beside the "
                                        "guaranteed minimums of the other live jobs, and leave no free run there "
                                        "for tensor 'Y' (2.0 MiB)"));
        assert_int_equal(p->error, 0);

        k->guarantee[LEVEL_HOST] = 4 * MiB;
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 1);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 1);
        own_unpin(&o, x);
        own_unpin(&o, w);
        marker(m, p, 1);
        k->n_conns = 0;
        job_destroy(k);
        finish(m, j, c, p);
}

/* Phase 0 reads @y in VRAM, phase 1 @z in host. */
static Plan *vram_phases(Rank *c, Tensor *y, Tensor *z, Owner *o) {
        Acc acc[] = { { 0, y, LEVEL_VRAM, PLAN_READ }, { 1, z, LEVEL_HOST, PLAN_READ } };
        char err[256];
        Plan *p;

        assert_int_equal(submit_plan(c, acc, 2, 2, &p, err, sizeof(err)), 0);
        set_durations(p, 100);
        plan_set_owner_ops(p, &owner_ops, o);
        return p;
}

/*
 * A VRAM access whose tensor is only on NVMe comes up through host: its
 * staging needs room there.  The connection's own host pins X and W (3 MiB
 * each, outside the plan) hold both host segments (4 MiB) the job's 8 MiB
 * give it, 1 MiB free in each, and Y (2 MiB, on NVMe) read in VRAM needs a
 * run of 2 MiB in host on its way: VRAM has room, so the phase waited
 * forever.  It is refused, the room in host named fragmented; after W's
 * unpin it is entered again, and ready.
 */
static void test_own_pins_fragment_the_staging_room(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        make_on_nvme(m, y);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        assert_ptr_not_equal(x->copy[LEVEL_HOST].pieces[0].seg, w->copy[LEVEL_HOST].pieces[0].seg);
        p = vram_phases(c, y, z, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_null(plan_waiting(p));
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.status, -ENOSPC);
        assert_int_equal(o.seq, seq);
        assert_int_equal(o.phase, 0);
        assert_non_null(strstr(o.error, "phase 0 of job 'j' can never be pinned in vram while this client's own "
                                        "pins in host stay: tensor 'Y' (2.0 MiB), on NVMe only, needs room in host "
                                        "to be brought up to vram"));
        assert_non_null(strstr(o.error, "'X' (3.0 MiB), 'W' (3.0 MiB)"));
        assert_non_null(strstr(o.error, "hold 2 of the 2 host segments (4.0 MiB each) the job may have, and leave "
                                        "no free run there for tensor 'Y' (2.0 MiB): the room is fragmented"));
        assert_non_null(strstr(o.error, "unpin them before entering the phase"));
        assert_int_equal(p->error, 0);
        assert_int_equal(p->hold[0].n_pinned, 0);
        assert_false(ready_for(p, seq, 0));

        own_unpin(&o, w);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 1);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 1);
        assert_int_equal(y->copy[LEVEL_VRAM].pins, 1);
        own_unpin(&o, x);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * The same in bytes: X (4 MiB) and W (3 MiB), the connection's own host
 * pins, leave 1 MiB of the job's 8 MiB, and Y (2 MiB, on NVMe) read in VRAM
 * needs 2 MiB in host on its way.  Refused, beyond the limit; ready after
 * W's unpin.
 */
static void test_own_pins_fill_the_staging_room(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 4 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        make_on_nvme(m, y);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        p = vram_phases(c, y, z, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_null(plan_waiting(p));
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.status, -ENOSPC);
        assert_int_equal(o.seq, seq);
        assert_non_null(strstr(o.error, "tensor 'Y' (2.0 MiB), on NVMe only, needs room in host to be brought up "
                                        "to vram"));
        assert_non_null(strstr(o.error, "'X' (4.0 MiB), 'W' (3.0 MiB)"));
        assert_non_null(strstr(o.error, "beyond the job's host limit (8.0 MiB) together"));
        assert_int_equal(p->error, 0);
        assert_int_equal(p->hold[0].n_pinned, 0);

        own_unpin(&o, w);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 1);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 1);
        own_unpin(&o, x);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * Staging room that can come is no reason to refuse: the own pin X (3 MiB)
 * leaves the job the other host segment, where V (3 MiB, resident and
 * unpinned) lies; Y (2 MiB, on NVMe) read in VRAM is staged there once V
 * is evicted: ready, not refused.  With W (3 MiB) there, pinned by another
 * connection, Y2 waits for W's unpin, not refused, and is ready after it.
 */
static void test_staging_room_that_can_come_is_not_refused(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *v, *w, *y, *z;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        v = tensor(j, "V", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        make_on_nvme(m, y);
        own_pin(m, &o, x);
        touch(m, v, LEVEL_HOST, true);                          /* V resident, unpinned, beside X */
        assert_ptr_not_equal(v->copy[LEVEL_HOST].pieces[0].seg, x->copy[LEVEL_HOST].pieces[0].seg);
        p = vram_phases(c, y, z, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 0);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 0);
        assert_false(copy_valid(v, LEVEL_HOST));                /* evicted for Y's staging */
        assert_true(copy_valid(y, LEVEL_VRAM));
        marker(m, p, 1);
        sched_plan_free(p);

        y = tensor(j, "Y2", 2 * MiB);
        make_on_nvme(m, y);
        assert_int_equal(fixture_op(m, OP_PIN, w, LEVEL_HOST), 0);      /* another connection's */
        assert_ptr_not_equal(w->copy[LEVEL_HOST].pieces[0].seg, x->copy[LEVEL_HOST].pieces[0].seg);
        p = vram_phases(c, y, z, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_non_null(plan_waiting(p));
        assert_int_equal(o.refused, 0);
        assert_int_equal(tensor_unpin(w, LEVEL_HOST, false), 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 0);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 0);
        own_unpin(&o, x);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * Staging room is needed for one tensor at a time: a host copy staged for
 * VRAM may go once VRAM holds the tensor.  The own pins X (4 MiB) and W
 * (3 MiB) leave 1 MiB of the job's 8 MiB; Y and U (1 MiB each, on NVMe)
 * read in VRAM find no room there while Q (the job's 2 MiB there) is
 * pinned in VRAM by another connection: they wait, not refused (2 MiB of
 * staging together would not fit beside X and W, each alone does), and
 * after Q's unpin pass through host one after the other: ready.
 */
static void test_staging_room_is_needed_one_at_a_time(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *u, *q;
        uint64_t seq;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", 4 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", MiB);
        u = tensor(j, "U", MiB);
        q = tensor(j, "Q", 2 * MiB);
        make_on_nvme(m, y);
        make_on_nvme(m, u);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        assert_int_equal(fixture_op(m, OP_PIN, q, LEVEL_VRAM), 0);      /* another connection's */
        {
                Acc acc[] = { { 0, y, LEVEL_VRAM, PLAN_READ }, { 0, u, LEVEL_VRAM, PLAN_READ },
                              { 1, y, LEVEL_VRAM, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 3, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        plan_set_owner_ops(p, &owner_ops, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_non_null(plan_waiting(p));
        assert_int_equal(o.refused, 0);
        assert_int_equal(tensor_unpin(q, LEVEL_VRAM, false), 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 0);
        assert_true(ready_for(p, seq, 0));
        assert_int_equal(o.refused, 0);
        assert_true(copy_valid(y, LEVEL_VRAM));
        assert_true(copy_valid(u, LEVEL_VRAM));
        own_unpin(&o, x);
        own_unpin(&o, w);
        marker(m, p, 1);
        finish(m, j, c, p);
}

/*
 * A staging copy is no pin: the room in host kept for the other live jobs'
 * guarantees binds what a job pins, not the host copy a VRAM read passes
 * through.  K's 8 MiB guarantee in the 16 MiB tier leaves the job two host
 * segments to pin, both held by its own pins X and W (3 MiB each); Y (3 MiB,
 * on NVMe) read in VRAM waits for Q (another connection's VRAM pin, the
 * job's VRAM limit): it waits, not refused, and after Q's unpin comes up
 * through a third host segment: ready.
 */
static void test_guarantees_do_not_bind_the_staging_room(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 12 * MiB);
        Owner o = {};
        Tensor *x, *w, *y, *z, *q;
        uint64_t seq;
        Job *j, *k;
        Rank *c;
        Plan *p;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        assert_int_equal(job_new(m->registry, "k", 0, &k), 0);
        k->n_conns = 1;
        k->guarantee[LEVEL_HOST] = 8 * MiB;
        j->limit[LEVEL_VRAM] = 3 * MiB;
        c = fake_conn(m, j);
        x = tensor(j, "X", 3 * MiB);
        w = tensor(j, "W", 3 * MiB);
        y = tensor(j, "Y", 3 * MiB);
        z = tensor(j, "Z", MiB);
        q = tensor(j, "Q", 3 * MiB);
        make_on_nvme(m, y);
        own_pin(m, &o, x);
        own_pin(m, &o, w);
        assert_ptr_not_equal(x->copy[LEVEL_HOST].pieces[0].seg, w->copy[LEVEL_HOST].pieces[0].seg);
        assert_int_equal(fixture_op(m, OP_PIN, q, LEVEL_VRAM), 0);      /* another connection's */
        p = vram_phases(c, y, z, &o);
        seq = marker_write(p, 0);
        FIXTURE_RUN_UNTIL(m, o.refused > 0 || plan_waiting(p) != NULL);
        assert_int_equal(o.refused, 0);
        assert_non_null(plan_waiting(p));
        assert_int_equal(tensor_unpin(q, LEVEL_VRAM, false), 0);
        FIXTURE_RUN_UNTIL(m, ready_for(p, seq, 0) || o.refused > 0);
        assert_int_equal(o.refused, 0);
        assert_true(ready_for(p, seq, 0));
        assert_true(copy_valid(y, LEVEL_VRAM));
        own_unpin(&o, x);
        own_unpin(&o, w);
        marker(m, p, 1);
        k->n_conns = 0;
        job_destroy(k);
        finish(m, j, c, p);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_own_pin_refuses_the_phase),
                cmocka_unit_test(test_others_pins_are_waited_for),
                cmocka_unit_test(test_own_pin_ahead_waits_until_entered),
                cmocka_unit_test(test_own_pins_fragment_the_room),
                cmocka_unit_test(test_own_pins_leave_no_room_for_the_whole_phase),
                cmocka_unit_test(test_fragments_others_may_free_are_not_refused),
                cmocka_unit_test(test_guarantees_leave_only_the_pinned_segments),
                cmocka_unit_test(test_own_pins_fragment_the_staging_room),
                cmocka_unit_test(test_own_pins_fill_the_staging_room),
                cmocka_unit_test(test_staging_room_that_can_come_is_not_refused),
                cmocka_unit_test(test_staging_room_is_needed_one_at_a_time),
                cmocka_unit_test(test_guarantees_do_not_bind_the_staging_room),
        };

        return fixture_main("timeline-selfpin", tests, sizeof(tests) / sizeof(tests[0]));
}
