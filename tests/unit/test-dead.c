/* SPDX-License-Identifier: MIT */
/*
 * test-dead.c: what reads get of a tensor whose bytes a copy does not hold: the zeros a dead
 * tensor's own plan reads are nobody else's data (-ENODATA), a write-only pin's room put back
 * after a restart (a ghost) is nobody's data until its rank says Hello, and a rollback of a tensor
 * committed dead gives back its image where it has one.
 */

#include "daemon/engine/engine-private.h"
#include "tests/unit/timeline-fixture.h"

/*
 * Rank 3's plan reads T in phase 0, writes it whole in phase 2 and reads it in phase 3; its
 * client goes from phase 1 to phase 3, past the write (tier.torch's optimizer phase of a block
 * the backward did not reach), so that hold reads the dead T as zeros (Op.plan_rank1).  Those
 * zeros are not T's bytes: a plain read pin of T, in that tier or another, and another plan's
 * hold reading it still fail -ENODATA naming rank 3.
 */
static void test_own_zeros_not_data(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *y, *t;
        Job *j;
        Rank *c1, *c2;
        Plan *pa, *pb;
        PinResult r;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        y = tensor(j, "Y", MiB);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x5a);
        {
                Acc acca[] = { { 0, t, LEVEL_HOST, PLAN_READ }, { 1, x, LEVEL_HOST, PLAN_READ },
                               { 2, t, LEVEL_HOST, PLAN_WRITE }, { 3, t, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acca, 4, 4, &pa, err, sizeof(err)), 0);
        }
        pa->rank = 3;
        set_durations(pa, 100);
        marker(m, pa, 0);
        run_loop(m, 20);
        marker(m, pa, 1);                                       /* A's last read of T is over */
        run_loop(m, 20);
        assert_true(t->dead);
        marker(m, pa, 3);                                       /* past the write: A's own read */
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        assert_true(t->dead);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0);   /* zeros, for A alone */
        /* they used to be served as T's data: the copy was valid, the read took the fast path */
        assert_false(copy_valid(t, LEVEL_HOST));
        assert_int_equal(read_pin(m, t, LEVEL_HOST, &r), -ENODATA);
        assert_non_null(strstr(r.error, "the plan of rank 3 overwrites it whole next"));
        assert_int_equal(read_pin(m, t, LEVEL_VRAM, &r), -ENODATA);    /* (not copied from those zeros) */
        assert_int_equal(t->copy[LEVEL_HOST].pins, 2);                  /* A's holds alone (phases 3, 0) */
        {
                Acc accb[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c2, accb, 2, 2, &pb, err, sizeof(err)), 0);
        }
        set_durations(pb, 100);
        marker(m, pb, 0);
        FIXTURE_RUN_UNTIL(m, pb->page->daemon.error != 0 || (pb->hold[1].active && pb->hold[1].ready_sent));
        assert_int_equal(pb->page->daemon.error, -ENODATA);    /* B's read of T: no zeros said ready */
        assert_false(pb->hold[1].ready_sent);
        sched_plan_free(pb);
        free(c2);
        /* A goes round to its write: T holds what A wrote, for every read */
        marker(m, pa, 0);                                       /* (its own read: zeros again) */
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        marker(m, pa, 1);
        marker(m, pa, 2);
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        fixture_fill(t, LEVEL_HOST, 0x66);
        marker(m, pa, 3);
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_false(t->dead);
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_int_equal(read_pin(m, t, LEVEL_VRAM, &r), 0);
        assert_int_equal(fixture_byte(t, LEVEL_VRAM, 0), 0x66);
        finish(m, j, c1, pa);
}

/*
 * A plan that writes B whole in phase 1 and never reads it: B is scratch to tierd (tier.torch's
 * shared block's gradient is such a tensor), dropped once phase 1 is over, and stays so after the
 * plan ends (tier_plan_new(3)).  A read then says that plan is not running (it said only that the
 * plan "overwrites it whole next", as if it still ran).
 */
static void test_scratch_after_the_plan_ended(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *b;
        PinResult r;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        b = tensor(j, "B", MiB);
        fixture_host_data(m, x, 0x11);
        {
                Acc acc[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, b, LEVEL_HOST, PLAN_WRITE } };

                assert_int_equal(submit_plan(c, acc, 2, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        marker(m, p, 1);
        FIXTURE_RUN_UNTIL(m, p->hold[0].ready_sent);
        fixture_fill(b, LEVEL_HOST, 0x42);
        marker(m, p, 0);                                        /* phase 1 is over */
        FIXTURE_RUN_UNTIL(m, p->hold[0].ready_sent);
        run_loop(m, 20);
        assert_true(b->dead);                                   /* (phase 1, pinned ahead, reserves it again) */
        sched_plan_free(p);                                     /* tier_plan_end() */
        run_loop(m, 20);
        assert_int_equal(read_pin(m, b, LEVEL_HOST, &r), -ENODATA);
        assert_non_null(strstr(r.error, "that plan is not running now"));
        free(c);
        job_destroy(j);
        fixture_free(m);
}

static bool held_all(const Tensor *t, int tier, void *userdata) {
        (void) t, (void) tier, (void) userdata;
        return true;
}

/*
 * T as the memory store puts it back after tierd died while a write-only pin of rank 3 held its
 * VRAM copy, T never written before (memstore_restore()): that copy reserved (unwritten, garbage
 * unless the pin wrote), held for rank 3 (a ghost), T at that write's version.  A plain read pin
 * and another plan's hold of T get none of it: they wait for rank 3's Hello (-EBUSY), which says
 * the pin wrote it; the hold is retried then (the ghost's pin goes: nothing else moved) and reads
 * what rank 3 wrote.
 */
static void test_ghost_read_waits_for_hello(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *y, *t;
        Job *j;
        Rank *c;
        Plan *p;
        PinResult r;
        Op *op;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        y = tensor(j, "Y", MiB);
        t = tensor(j, "T", MiB);
        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_pin_result, NULL, &r, &op), 0);
        op->discard = true;
        FIXTURE_RUN_UNTIL(m, r.done);
        assert_int_equal(r.status, 0);
        t->version++;
        t->copy[LEVEL_VRAM].version = t->version;
        t->copy[LEVEL_VRAM].writer_rank = 3;
        t->ghost_rank = 3;
        t->ghost = t->ghost_unwritten = 1u << LEVEL_VRAM;
        tensor_pin_account(t, LEVEL_VRAM, +1);
        fixture_fill(t, LEVEL_VRAM, 0x99);                      /* (rank 3 writing it, before the kill) */

        assert_int_equal(read_pin(m, t, LEVEL_VRAM, &r), -EBUSY);
        assert_non_null(strstr(r.error, "write-only pin (TIER_WRITE) of rank 3 when tierd stopped"));
        assert_int_equal(read_pin(m, t, LEVEL_HOST, &r), -EBUSY);
        {
                Acc acc[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 2, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        run_loop(m, 20);
        assert_true(p->hold[1].active);
        assert_false(p->hold[1].ready_sent);                    /* T: waits */
        assert_int_equal(p->page->daemon.error, 0);
        run_loop(m, 50);
        assert_false(p->hold[1].ready_sent);                    /* (nothing else moves) */
        fixture_fill(t, LEVEL_VRAM, 0x77);                      /* rank 3's pin wrote it whole */
        job_release_ghosts(j, true, 3, held_all, NULL);         /* and its Hello says so */
        FIXTURE_RUN_UNTIL(m, p->hold[1].ready_sent);
        assert_true(p->hold[1].ready_sent);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x77);
        finish(m, j, c, p);
}

/* Write @v over the whole of @t in host through a write-only pin (no old bytes brought: TIER_WRITE). */
static void write_only_pin(Manager *m, Tensor *t, uint8_t v) {
        PinResult r = {};
        Op *op;

        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_pin_result, NULL, &r, &op), 0);
        op->write = true;
        op->discard = true;
        FIXTURE_RUN_UNTIL(m, r.done);
        assert_int_equal(r.status, 0);
        fixture_fill(t, LEVEL_HOST, v);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
}

/*
 * W committed dead (its plan's write-only hold overwrote it at the commit: Tensor.commit_dead)
 * while NVMe held its committed version, 0x51: the hold's write made that copy its image
 * (copy_free()).  A rollback brings those bytes back, as it does after a restart of tierd
 * (test-book.c test_commit_dead_after_restart, where commit_dead is not known): it used to drop
 * the image and make W dead again, whose reads then gave zeros as its data.
 */
static void test_rollback_commit_dead_with_image(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        unsigned rolled, lost;
        char why[128];
        Tensor *w;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        w = tensor(j, "W", MiB);
        fixture_host_data(m, w, 0x51);
        assert_int_equal(fixture_op(m, OP_EVICT, w, LEVEL_NVME), 0);
        assert_true(copy_valid(w, LEVEL_NVME));
        job_commit(j, 3);
        w->commit_dead = true;                  /* as ipc/commit.c for a tensor its plan's hold overwrites */
        write_only_pin(m, w, 0x52);
        assert_non_null(w->base);               /* the committed version's NVMe copy: its image */
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(rolled, 1);
        assert_int_equal(lost, 0);
        assert_false(w->dead || w->lost);
        assert_int_equal(w->version, w->commit_version);
        assert_true(copy_valid(w, LEVEL_NVME));
        assert_int_equal(fixture_op(m, OP_PIN, w, LEVEL_HOST), 0);
        assert_int_equal(fixture_byte(w, LEVEL_HOST, 0), 0x51);
        assert_int_equal(fixture_byte(w, LEVEL_HOST, MiB - 1), 0x51);
        assert_int_equal(tensor_unpin(w, LEVEL_HOST, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * D dead at the commit, with no copy and so no image (rank 3's plan overwrites it next: its bytes
 * dropped, as plan_drop_dead() does), then written since.  A rollback makes it dead again as the
 * commit had it, whose plan is rank 3's: another read fails -ENODATA naming rank 3, as before the
 * commit.  The rollback used to forget the rank (dead_rank 0), and every read then got zeros as
 * D's data.
 */
static void test_rollback_commit_dead_keeps_its_rank(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        unsigned rolled, lost;
        char why[128];
        PinResult r;
        Tensor *d;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        d = tensor(j, "D", MiB);
        fixture_host_data(m, d, 0x41);
        d->dead = true;
        d->dead_rank = 4;
        for (int tier = 0; tier < TIERS; tier++)
                copy_free(d, tier);
        job_commit(j, 3);
        assert_true(d->commit_dead);
        write_only_pin(m, d, 0x42);
        assert_false(d->dead);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(rolled, 1);
        assert_true(d->dead);
        assert_false(d->lost);
        assert_int_equal(d->dead_rank, 4);
        assert_int_equal(read_pin(m, d, LEVEL_HOST, &r), -ENODATA);
        assert_non_null(strstr(r.error, "rank 3"));
        job_destroy(j);
        fixture_free(m);
}

/*
 * D dead and lost with no rank at the commit (a memory store table of before the rank was kept),
 * then written: the rollback makes it so again, reads fail -ENODATA; they got zeros as its data.
 */
static void test_rollback_commit_dead_rank_not_known(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        unsigned rolled, lost;
        char why[128];
        PinResult r;
        Tensor *d;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        d = tensor(j, "D", MiB);
        fixture_host_data(m, d, 0x41);
        for (int tier = 0; tier < TIERS; tier++)
                copy_free(d, tier);
        d->dead = d->lost = true;                               /* as book_restore() with an older table */
        d->dead_rank = 0;
        job_commit(j, 3);
        write_only_pin(m, d, 0x42);
        assert_false(d->dead || d->lost);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_true(d->dead && d->lost);
        /* counted lost (tier_job_rollback()'s lost: reads fail -ENODATA), not brought back */
        assert_int_equal(rolled, 0);
        assert_int_equal(lost, 1);
        assert_int_equal(read_pin(m, d, LEVEL_HOST, &r), -ENODATA);
        assert_non_null(strstr(r.error, "dead when tierd stopped"));
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_own_zeros_not_data),
                cmocka_unit_test(test_scratch_after_the_plan_ended),
                cmocka_unit_test(test_ghost_read_waits_for_hello),
                cmocka_unit_test(test_rollback_commit_dead_with_image),
                cmocka_unit_test(test_rollback_commit_dead_keeps_its_rank),
                cmocka_unit_test(test_rollback_commit_dead_rank_not_known),
        };
        return fixture_main("dead", tests, sizeof(tests) / sizeof(tests[0]));
}
