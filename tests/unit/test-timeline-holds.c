/* SPDX-License-Identifier: MIT */
/*
 * test-timeline-holds.c: what a plan's holds pin, publish and let go, with other plans and
 * connections beside them (a second plan naming a tensor, a plan ended or its client gone before
 * a phase it holds, a stale copy still pinned, a pin blocked for room, reclaim against a share).
 */

#include "daemon/engine/engine-private.h"
#include "tests/unit/timeline-fixture.h"

/*
 * A plan ended in phase 0 lets its hold ahead (phase 1, which writes T whole, reserved without T's
 * bytes) go unwritten: T keeps its data.  It used to be released as written, T's version moved on
 * to the reserved garbage and its NVMe copy went.
 */
static void test_end_plan_before_a_held_write(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *t, *y;
        Job *j;
        Rank *c1, *c2;
        Plan *p1, *p2;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        t = tensor(j, "T", MiB);
        y = tensor(j, "Y", MiB);
        fixture_host_data(m, t, 0x5a);
        assert_int_equal(fixture_op(m, OP_EVICT, t, LEVEL_NVME), 0);
        assert_int_equal(t->version, 1);
        {
                Acc acc1[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_WRITE } };
                Acc acc2[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_VRAM, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acc1, 2, 2, &p1, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, acc2, 2, 2, &p2, err, sizeof(err)), 0);
        }
        set_durations(p1, 100);
        set_durations(p2, 100);
        marker(m, p1, 0);
        FIXTURE_RUN_UNTIL(m, t->copy[LEVEL_HOST].pins > 0);     /* phase 1's write-only pin, ahead */
        sched_plan_sync(p1);
        sched_plan_free(p1);                                    /* EndPlan in phase 0 */
        free(c1);
        assert_int_equal(t->version, 1);
        assert_true(copy_valid(t, LEVEL_NVME));
        sched_plan_free(p2);
        free(c2);
        FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0);
        job_destroy(j);
        fixture_free(m);
}

/* The client goes while the phase it entered waits to be said ready: that phase wrote nothing. */
static void test_gone_before_ready(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 2 * MiB);
        Tensor *t, *u, *w;
        Job *j;
        Rank *c1;
        Plan *p1;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        t = tensor(j, "T", MiB);
        u = tensor(j, "U", MiB);
        w = tensor(j, "W", MiB);
        fixture_host_data(m, t, 0x5a);
        assert_int_equal(fixture_op(m, OP_EVICT, t, LEVEL_NVME), 0);
        make_on_nvme(m, u);
        assert_int_equal(fixture_op(m, OP_PIN, w, LEVEL_HOST), 0);     /* another client holds 1 MiB of 2 */
        {
                Acc acc1[] = { { 0, t, LEVEL_HOST, PLAN_WRITE }, { 0, u, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acc1, 2, 1, &p1, err, sizeof(err)), 0);
        }
        marker(m, p1, 0);
        run_loop(m, 50);
        assert_false(p1->hold[0].ready_sent);                  /* U finds no room */
        sched_plan_free(p1);
        free(c1);
        assert_int_equal(t->version, 1);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_int_equal(tensor_unpin(w, LEVEL_HOST, false), 0);
        FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * Two plans name S: the second plan's page gets S's location too (it used to be left at segment 0,
 * offset 0, where another tensor lay: that rank read and wrote the other tensor's bytes), and once
 * the first plan ends, S is the second plan's for next-use predictions.
 */
static void test_second_plan_grant(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *a, *b, *sh;
        Job *j;
        Rank *c1, *c2;
        Plan *p1, *p2;
        char err[256];
        const PlanSlot *ps;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        a = tensor(j, "A", MiB);
        b = tensor(j, "B", MiB);
        sh = tensor(j, "S", MiB);
        fixture_host_data(m, a, 1);
        fixture_host_data(m, b, 2);
        fixture_host_data(m, sh, 3);
        {
                Acc acc1[] = { { 0, a, LEVEL_HOST, PLAN_READ }, { 0, sh, LEVEL_HOST, PLAN_READ } };
                Acc acc2[] = { { 0, b, LEVEL_HOST, PLAN_READ }, { 0, sh, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acc1, 2, 1, &p1, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, acc2, 2, 1, &p2, err, sizeof(err)), 0);
        }
        assert_ptr_equal(sh->plan, p1);
        marker(m, p2, 0);
        FIXTURE_RUN_UNTIL(m, PLAN_READY_SEQ(p2->page->daemon.ready) == 1);
        ps = &p2->page->slots[2 * 1 + LEVEL_HOST];             /* rank 2's slot 1 is S */
        assert_int_equal(ps->offset, sh->copy[LEVEL_HOST].pieces[0].offset);
        assert_int_equal(ps->segment, sh->copy[LEVEL_HOST].pieces[0].seg->pool->id_base +
                                      sh->copy[LEVEL_HOST].pieces[0].seg->id);
        assert_int_equal(ps->generation, sh->copy[LEVEL_HOST].pieces[0].seg->generation);
        sched_plan_free(p1);
        free(c1);
        assert_ptr_equal(sh->plan, p2);
        assert_int_equal(sh->plan_slot, 1);
        assert_int_equal(sh->plan_refs, 1);
        finish(m, j, c2, p2);
}

/*
 * A stale copy a client still has pinned for writing (T written in VRAM since) is not refilled under
 * its pin: another pin of it in host is refused (-EBUSY) and changes nothing.  The pinner's dirty
 * unpin then stands (it used to be taken back when the refill ended, and T was left with no copy at
 * all).  Pinned again, T reads what the pinner wrote.
 */
static void test_stale_pinned_copy_not_refilled(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *t;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x11);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);      /* client A holds it, to write */
        copy_writers(t, LEVEL_HOST, +1, 0);                                /* (as rpc.c's pin_record()) */
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);      /* client B writes VRAM */
        fixture_fill(t, LEVEL_VRAM, 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, true), 0);
        assert_false(copy_valid(t, LEVEL_HOST));
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), -EBUSY);  /* client C */
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(t->copy[LEVEL_HOST].pins, 1);
        assert_null(t->xfer);
        fixture_fill(t, LEVEL_HOST, 0x33);                              /* A writes, unpins dirty */
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
        copy_writers(t, LEVEL_HOST, -1, 0);
        assert_int_equal(t->version, 3);
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_false(copy_valid(t, LEVEL_VRAM));
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);
        assert_int_equal(fixture_byte(t, LEVEL_VRAM, 0), 0x33);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * A stale copy a client has pinned for reading is refilled in place (the reader sees the newest
 * bytes, as it always did); when that refill fails, the copy stays while the reader holds it (it was
 * freed under the pin: a use after free at the unpin) and goes, stale, with the unpin.
 */
static void test_stale_read_pin_refill_fails(void **state) {
        Manager *m;
        Tensor *t;
        Job *j;

        setenv("TIERD_TEST_FAULTS", "vram-d2h-eio:count=1", 1);
        m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        unsetenv("TIERD_TEST_FAULTS");
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x11);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);      /* client A reads it */
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);      /* client B writes VRAM */
        fixture_fill(t, LEVEL_VRAM, 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, true), 0);
        assert_true(fixture_op(m, OP_PIN, t, LEVEL_HOST) < 0);          /* C: the VRAM -> host copy fails */
        assert_int_equal(t->copy[LEVEL_HOST].pins, 1);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_RESIDENT);     /* A's, still there */
        assert_false(copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(t, LEVEL_VRAM));
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        assert_int_equal(engine_tensor_free(m->engine, t), 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * The same, chained: a stale VRAM copy a client has pinned for reading, refilled in place from
 * NVMe through host, whose NVMe read fails.  The copy stays while the reader holds it and goes,
 * stale, with the unpin.  It used to stay filling, which nothing frees once unpinned: its VRAM
 * was held until T was pinned again.
 */
static void test_stale_read_pin_chained_refill_fails(void **state) {
        Manager *m;
        Tensor *t;
        Job *j;

        setenv("TIERD_TEST_FAULTS", "nvme-read-eio:count=2", 1);   /* the read and its retry */
        m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        unsetenv("TIERD_TEST_FAULTS");
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x11);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);      /* client A reads it in VRAM */
        fixture_host_data(m, t, 0x22);                                  /* client B writes host */
        assert_false(copy_valid(t, LEVEL_VRAM));
        assert_int_equal(fixture_op(m, OP_CLEAN, t, LEVEL_HOST), 0);    /* written down to NVMe */
        assert_true(copy_valid(t, LEVEL_NVME));
        copy_set_state(t, LEVEL_HOST, COPY_DRAINING);                 /* and dropped from host */
        assert_int_equal(fixture_op(m, OP_DRAIN, t, LEVEL_HOST), 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_true(fixture_op(m, OP_PIN, t, LEVEL_VRAM) < 0);          /* C: NVMe -> host -> VRAM fails */
        assert_null(t->xfer);
        assert_int_equal(t->copy[LEVEL_VRAM].pins, 1);                  /* A's, still there */
        assert_false(copy_valid(t, LEVEL_VRAM));
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, false), 0);
        assert_int_equal(t->copy[LEVEL_VRAM].state, COPY_ABSENT);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);
        assert_int_equal(fixture_byte(t, LEVEL_VRAM, 0), 0x22);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, false), 0);
        assert_int_equal(engine_tensor_free(m->engine, t), 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * A phase's pin that found no room is tried again when room can be taken: a clean unpin (another
 * connection lets its VRAM go) makes it evictable.  It used to wait for a marker or a free, and the
 * rank waited in tier_phase_enter() for good.
 */
static void test_blocked_pin_retried_after_clean_unpin(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *t, *y, *p1, *p2;
        Job *j;
        Rank *c1;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        t = tensor(j, "T", MiB);
        y = tensor(j, "Y", MiB);
        p1 = tensor(j, "P1", MiB);
        p2 = tensor(j, "P2", MiB);
        fixture_host_data(m, t, 1);
        fixture_host_data(m, y, 2);
        /* another connection of the job holds VRAM full (its 2 MiB limit) with explicit pins */
        assert_int_equal(fixture_op(m, OP_PIN, p1, LEVEL_VRAM), 0);
        assert_int_equal(fixture_op(m, OP_PIN, p2, LEVEL_VRAM), 0);
        {
                Acc acc[] = { { 0, t, LEVEL_VRAM, PLAN_READ }, { 1, y, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acc, 2, 2, &p, err, sizeof(err)), 0);
        }
        marker(m, p, 0);
        run_loop(m, 50);
        assert_false(p->hold[0].ready_sent);
        tensor_pin_account(p1, LEVEL_VRAM, -1);                 /* as handle_unpin() does it */
        assert_int_equal(tensor_unpin(p1, LEVEL_VRAM, false), 0);
        FIXTURE_RUN_UNTIL(m, p->hold[0].ready_sent);
        assert_true(copy_valid(t, LEVEL_VRAM));
        tensor_pin_account(p2, LEVEL_VRAM, -1);
        assert_int_equal(tensor_unpin(p2, LEVEL_VRAM, false), 0);
        finish(m, j, c1, p);
}

/*
 * Reclaim takes room from a live job above its share only down to that share: a segment holding
 * more than the job has above it is not emptied (a whole 4 MiB segment of a job 1 MiB above its
 * share used to go, leaving it below its guarantee).
 */
static void test_reclaim_keeps_the_share(void **state) {
        Manager *m = new_manager(SCHED_POLICY_LRU, 16 * MiB);
        Job *v, *r;
        Tensor *vt[9], *rt[5];
        char name[16];

        assert_int_equal(job_new(m->registry, "v", 0, &v), 0);
        assert_int_equal(job_new(m->registry, "r", 0, &r), 0);
        v->n_conns = 1;
        r->n_conns = 1;
        v->guarantee[LEVEL_HOST] = 8 * MiB;
        for (int i = 0; i < 9; i++) {
                snprintf(name, sizeof(name), "v%d", i);
                vt[i] = tensor(v, name, MiB);
                fixture_host_data(m, vt[i], (uint8_t) i);
        }
        for (int i = 0; i < 5; i++) {
                snprintf(name, sizeof(name), "r%d", i);
                rt[i] = tensor(r, name, MiB);
        }
        for (int i = 0; i < 4; i++)
                fixture_host_data(m, rt[i], 0x40);
        assert_int_equal(engine_job_share(m->engine, v, LEVEL_HOST), 8 * MiB);
        assert_int_equal(v->used[LEVEL_HOST], 9 * MiB);
        (void) fixture_op(m, OP_PIN, rt[4], LEVEL_HOST);        /* room from v, or none */
        assert_true(v->used[LEVEL_HOST] >= v->guarantee[LEVEL_HOST]);
        v->n_conns = 0;
        r->n_conns = 0;
        job_destroy(v);
        job_destroy(r);
        fixture_free(m);
}

/*
 * A write-only pin ahead reserves T's copy without T's bytes: that copy is no valid copy of T until
 * it is written.  Another connection's read of T in that tier is refused while the writer holds it
 * (it used to get the garbage), and T's only real copy is not dropped for room as if the garbage
 * were a second copy (it was, and T was left with the garbage); the hold let go unwritten leaves T
 * as it was.
 */
static void test_write_only_pin_ahead_is_no_copy(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *t, *y, *z;
        Job *j;
        Rank *c1, *c2;
        Plan *p1, *p2;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        t = tensor(j, "T", MiB);
        y = tensor(j, "Y", 2 * MiB);
        z = tensor(j, "Z", MiB);
        fixture_host_data(m, t, 0xab);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_VRAM), 0);
        fixture_fill(t, LEVEL_VRAM, 0xcd);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, true), 0);
        FIXTURE_RUN_UNTIL(m, !copy_valid(t, LEVEL_HOST));
        assert_true(copy_is_sole(t, LEVEL_VRAM));               /* T's bytes: VRAM only */
        fixture_host_data(m, y, 0x11);
        {
                Acc acc1[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_WRITE },
                               { 2, x, LEVEL_HOST, PLAN_READ } };
                Acc acc2[] = { { 0, z, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_VRAM, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acc1, 3, 3, &p1, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, acc2, 2, 2, &p2, err, sizeof(err)), 0);
        }
        set_durations(p1, 100);
        marker(m, p1, 0);
        FIXTURE_RUN_UNTIL(m, t->copy[LEVEL_HOST].pins > 0);     /* phase 1's write-only pin, ahead */
        assert_true(t->copy[LEVEL_HOST].unwritten);
        assert_false(copy_valid(t, LEVEL_HOST));
        assert_true(copy_is_sole(t, LEVEL_VRAM));
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), -EBUSY);  /* another reader */
        /* VRAM room for Y: T would have to go down, but its host room is the writer's: no room now */
        assert_int_equal(fixture_op(m, OP_PREFETCH, y, LEVEL_VRAM), -ENOSPC);
        assert_true(copy_is_sole(t, LEVEL_VRAM));
        marker(m, p1, 2);                                       /* phase 1 never entered */
        run_loop(m, 20);
        assert_int_equal(t->version, 2);
        assert_int_equal(t->copy[LEVEL_HOST].pins, 0);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0xcd);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        sched_plan_free(p2);
        free(c2);
        finish(m, j, c1, p1);
}

/*
 * A marker read while the client writes the next one: the client was ready for phase 1 (pinned
 * ahead), entered it, wrote T there, and is storing the marker of phase 2 when tierd reads marker
 * 2: the phase field already says 2, the seq still says 2.  tierd read (seq 2, phase 2), took it
 * for a client that went elsewhere instead of the phase pinned ahead for seq 2, and released that
 * phase's write pin clean: T's new bytes were lost, the old ones stayed the newest (found by
 * tier.torch's accumulation test under ASan, once in about 100 runs: one block's gradient of a
 * micro-batch lost).  The packed marker word holds seq and phase together.
 */
static void test_marker_read_while_the_next_is_written(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *t, *y;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];
        uint64_t seq;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        t = tensor(j, "T", MiB);
        y = tensor(j, "Y", MiB);
        fixture_host_data(m, t, 0x5a);
        assert_int_equal(t->version, 1);
        {
                Acc acc[] = {
                        { 0, x, LEVEL_HOST, PLAN_READ },
                        { 1, t, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                        { 2, y, LEVEL_HOST, PLAN_READ },
                };
                assert_int_equal(submit_plan(c, acc, 3, 3, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, p->hold[1].active && p->hold[1].ready_sent);
        assert_int_equal(p->hold[1].phase, 1);
        assert_int_equal(t->copy[LEVEL_HOST].pins, 1);
        /* the client enters phase 1 (ready already) and writes T; tierd has not read marker 2 */
        seq = marker_write(p, 1);
        fixture_fill(t, LEVEL_HOST, 0xa5);
        /* ...and is half-way through storing marker 3 (phase 2): its phase and packed word, not its seq */
        p->page->client.phase = 2;
        __atomic_store_n(&p->page->client.marker, PLAN_READY(seq + 1, 2), __ATOMIC_RELEASE);
        sched_plan_sync(p);
        assert_int_equal(t->version, 2);                        /* phase 1 wrote T */
        assert_int_equal(t->copy[LEVEL_HOST].pins, 0);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0xa5);
        assert_int_equal(p->seq, seq + 1);
        assert_int_equal(p->cur, 2);
        /* the seq store ends the marker: nothing new to read */
        __atomic_store_n(&p->page->client.marker_seq, seq + 1, __ATOMIC_RELEASE);
        sched_plan_sync(p);
        assert_int_equal(p->seq, seq + 1);
        assert_int_equal(t->version, 2);
        /* a client that does not write the packed word (0) gets the two fields read */
        p->page->client.marker = 0;
        p->page->client.phase = 0;
        __atomic_store_n(&p->page->client.marker_seq, seq + 2, __ATOMIC_RELEASE);
        sched_plan_sync(p);
        assert_int_equal(p->seq, seq + 2);
        assert_int_equal(p->cur, 0);
        finish(m, j, c, p);
}

/*
 * The client is ready for phase 1 (pinned ahead: T's write-only reservation, no bytes), goes
 * elsewhere instead (marker 2 names phase 2), and its connection goes before tierd reads that
 * marker (rpc_conn_gone() frees the plan without reading it).  sched_plan_free() released the
 * hold ahead as written because marker_seq >= its seq, without looking at the marker's phase:
 * T's version moved on to the reserved garbage and its NVMe copy went.  plan_consume_marker()
 * releases it unwritten (seq == hold seq, other phase); so does the plan's end now.
 */
static void test_gone_after_marker_elsewhere(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *t;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x5a);
        assert_int_equal(fixture_op(m, OP_EVICT, t, LEVEL_NVME), 0);
        assert_int_equal(t->version, 1);
        {
                Acc acc[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_WRITE },
                              { 2, x, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 3, 3, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, p->hold[1].active && p->hold[1].ready_sent);
        assert_int_equal(p->hold[1].phase, 1);
        assert_true(t->copy[LEVEL_HOST].unwritten);
        (void) marker_write(p, 2);              /* marker 2: phase 2, not the phase 1 held ahead */
        sched_plan_free(p);                     /* its connection goes before the marker is read */
        free(c);
        assert_int_equal(t->version, 1);        /* phase 1 never ran: T is as it was */
        assert_true(copy_valid(t, LEVEL_NVME));
        FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * Phase 0 is never said ready (U is lost: its pin fails and the plan fails), so
 * tier_phase_enter(0) returns the error and the client wrote nothing; a client that goes on and
 * enters phase 1 had its marker consumed and hold 0 released as written though it was never
 * ready: W's write-only reservation (garbage) became W's newest version, which phase 1 then
 * reads.  A hold is released as written only if its phase was said ready, as at the plan's end.
 */
static void test_marker_after_failed_phase(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *w, *u;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        w = tensor(j, "W", MiB);
        u = tensor(j, "U", MiB);
        fixture_host_data(m, w, 0x5a);
        assert_int_equal(fixture_op(m, OP_EVICT, w, LEVEL_NVME), 0);
        assert_int_equal(w->version, 1);
        u->version = 1;                         /* as a restart leaves it: newest data gone */
        u->lost = true;
        {
                Acc acc[] = { { 0, w, LEVEL_HOST, PLAN_WRITE }, { 0, u, LEVEL_HOST, PLAN_READ },
                              { 1, x, LEVEL_HOST, PLAN_READ }, { 1, w, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c, acc, 4, 2, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        FIXTURE_RUN_UNTIL(m, p->page->daemon.error != 0 && w->copy[LEVEL_HOST].pins > 0);
        assert_false(p->hold[0].ready_sent);    /* tier_phase_enter(0) returned the error */
        assert_true(w->copy[LEVEL_HOST].unwritten);
        assert_int_equal(w->version, 1);
        marker(m, p, 1);                        /* the client goes on to the next phase */
        assert_int_equal(w->version, 1);        /* phase 0 never ran: W is as it was */
        assert_true(copy_valid(w, LEVEL_NVME));
        finish(m, j, c, p);
}

/*
 * A tensor whose next access writes it whole is dead and its copies go, but not while its job has
 * committed that very version (tier.torch's resume=True commits at every step's end): the
 * rollback after a crash found the tensor at its committed version, left it dead, and its reads
 * gave zeros (a bfloat16 model resumed with zeroed parameters: tier.torch writes them whole from
 * the master weights in each optimizer phase).  Kept now, it goes to NVMe as an image before the
 * write, as any committed tensor written again.
 */
static void test_dead_keeps_the_committed_version(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *t;
        Job *j;
        Rank *c;
        Plan *p;
        char err[256], why[256];
        unsigned rolled, lost;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x5a);
        job_commit(j, 1);
        {
                Acc acc[] = {
                        { 0, t, LEVEL_HOST, PLAN_READ },
                        { 1, x, LEVEL_HOST, PLAN_READ },
                        { 2, x, LEVEL_HOST, PLAN_READ },
                        { 3, t, LEVEL_HOST, PLAN_WRITE },
                };
                assert_int_equal(submit_plan(c, acc, 4, 4, &p, err, sizeof(err)), 0);
        }
        set_durations(p, 100);
        marker(m, p, 0);
        marker(m, p, 1);                        /* phase 0 over: T's next access writes it whole */
        assert_false(t->dead);
        assert_true(copy_valid(t, LEVEL_HOST) || copy_valid(t, LEVEL_NVME));
        /* nor is it dropped as a victim: its sole copy is written down (a review found that path too) */
        if (copy_is_sole(t, LEVEL_HOST)) {
                uint64_t freed = 0, draining = 0;
                unsigned blocked = 0;

                assert_int_equal(victim_evict(m->engine, t, LEVEL_HOST, 0, &freed, &draining, &blocked), 0);
                assert_false(t->dead);
                FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0 && t->copy[LEVEL_HOST].state != COPY_DRAINING);
                assert_true(copy_valid(t, LEVEL_NVME));
        }
        /* the process dies here; the next one rolls the job back to its commit */
        sched_plan_free(p);
        FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(lost, 0);
        assert_false(t->dead);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x5a);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        job_destroy(j);
        fixture_free(m);
        free(c);
}

/*
 * Rank A's hold ahead pins T in host for reading (phase 1, said ready); rank B's phase then writes
 * T in VRAM (write-only), and its marker (or, with @gone, its connection going) releases that hold
 * as written: T's newest bytes are in VRAM.  A's hold, on the older host copy, takes its ready back
 * and pins again (plan_notify_written(), as for a client's write): A reads B's bytes (invariant 1).
 */
static void other_plans_write(bool gone) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *y, *t;
        Job *j;
        Rank *c1, *c2;
        Plan *pa, *pb;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        y = tensor(j, "Y", MiB);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x11);
        {
                Acc acca[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_READ },
                               { 2, x, LEVEL_HOST, PLAN_READ } };
                Acc accb[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_VRAM, PLAN_WRITE } };

                assert_int_equal(submit_plan(c1, acca, 3, 3, &pa, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, accb, 2, 2, &pb, err, sizeof(err)), 0);
        }
        set_durations(pa, 100);
        set_durations(pb, 100);
        marker(m, pa, 0);
        FIXTURE_RUN_UNTIL(m, pa->hold[1].active && pa->hold[1].ready_sent);
        assert_int_equal(pa->hold[1].phase, 1);                 /* A: T in host, pinned ahead, ready */
        marker(m, pb, 0);
        FIXTURE_RUN_UNTIL(m, pb->hold[1].active && pb->hold[1].ready_sent);
        assert_int_equal(pb->hold[1].phase, 1);                 /* B: T in VRAM, write-only, ready */
        marker(m, pb, 1);                                       /* B enters phase 1, writes T */
        FIXTURE_RUN_UNTIL(m, pb->hold[0].ready_sent);
        assert_true(pb->hold[0].ready_sent);
        fixture_fill(t, LEVEL_VRAM, 0x22);
        if (gone) {                                             /* ...and its connection goes */
                sched_plan_free(pb);
                pb = NULL;
        } else
                marker(m, pb, 0);                               /* ...and goes on: T's newest is 0x22 */
        run_loop(m, 20);
        assert_int_equal(t->version, 2);
        assert_true(copy_valid(t, LEVEL_VRAM));
        /* invariant: a phase is said ready only when every access is pinned on current data */
        assert_false(pa->hold[1].ready_sent && !copy_valid(t, LEVEL_HOST));
        marker(m, pa, 1);                                       /* A enters phase 1 and reads T in host */
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x22);
        sched_plan_free(pb);            /* (NULL: nothing) */
        free(c2);
        finish(m, j, c1, pa);
}

static void test_other_plans_write_keeps_stale_ready(void **state) {
        other_plans_write(false);
}

static void test_other_plan_gone_keeps_stale_ready(void **state) {
        other_plans_write(true);
}

/*
 * The same with A's phase 1 reading and writing T in host (an accumulation): A's hold, on the older
 * host copy, must not add to the old bytes and unpin dirty over B's write: it pins B's bytes again.
 */
static void test_other_plans_write_lost_by_rmw(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *y, *t;
        Job *j;
        Rank *c1, *c2;
        Plan *pa, *pb;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        y = tensor(j, "Y", MiB);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x10);
        {
                Acc acca[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_READ | PLAN_WRITE },
                               { 2, x, LEVEL_HOST, PLAN_READ } };
                Acc accb[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_VRAM, PLAN_WRITE } };

                assert_int_equal(submit_plan(c1, acca, 3, 3, &pa, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, accb, 2, 2, &pb, err, sizeof(err)), 0);
        }
        set_durations(pa, 100);
        set_durations(pb, 100);
        marker(m, pa, 0);
        FIXTURE_RUN_UNTIL(m, pa->hold[1].active && pa->hold[1].ready_sent);
        marker(m, pb, 0);         /* (B's hold ahead, write-only, waits for A's read of T's host copy) */
        marker(m, pb, 1);                                       /* B writes T = 0x20 */
        FIXTURE_RUN_UNTIL(m, pb->hold[0].ready_sent);
        assert_true(pb->hold[0].ready_sent);
        fixture_fill(t, LEVEL_VRAM, 0x20);
        marker(m, pb, 0);
        run_loop(m, 20);
        marker(m, pa, 1);                                       /* then A: T += 1 */
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        fixture_fill(t, LEVEL_HOST, (uint8_t) (fixture_byte(t, LEVEL_HOST, 0) + 1));
        marker(m, pa, 2);
        run_loop(m, 20);
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x21);        /* B's write plus A's */
        sched_plan_free(pb);
        free(c2);
        finish(m, j, c1, pa);
}

/* Invariant 1 for @p's holds the client has not entered: said ready, every access pinned on a current copy. */
static void assert_ahead_ready_current(const Plan *p) {
        for (int h = 0; h < 2; h++) {
                const PlanPhase *ph;

                if (!p->hold[h].active || p->hold[h].seq <= p->seq || !p->hold[h].ready_sent)
                        continue;
                ph = &p->phases[p->hold[h].phase];
                for (uint32_t i = 0; i < ph->n_acc; i++) {
                        const Tensor *t = ph->acc[i].tensor;

                        assert_true(p->hs[h].pinned[i]);
                        if (ph->acc[i].mode & PLAN_READ)
                                assert_int_equal(t->copy[ph->acc[i].tier].version, t->version);
                }
        }
}

/*
 * Rank A's hold ahead (phase 1) pins T in host for reading, said ready; a client writes T in VRAM
 * and sched_tensor_changed(T) finds A's pin stale.  A's client has meanwhile left phase 0, which
 * wrote T2 in VRAM: the marker consumed there (for phase 1 with @enter, else phase 2) releases that
 * hold as written, and plan_notify_written() calls sched_tensor_changed(T2) inside the first one.
 * Rank B's hold ahead reads T and T2 in host.  No hold ahead may be left said ready on a stale pin.
 */
static void nested_tensor_changed(bool enter) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *y, *t, *t2;
        Job *j;
        Rank *c1, *c2;
        Plan *pa, *pb;
        char err[256];

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        y = tensor(j, "Y", MiB);
        t = tensor(j, "T", MiB);
        t2 = tensor(j, "T2", MiB);
        fixture_host_data(m, t, 0x11);
        fixture_host_data(m, t2, 0x33);
        {
                Acc acca[] = { { 0, t2, LEVEL_VRAM, PLAN_WRITE }, { 1, t, LEVEL_HOST, PLAN_READ },
                               { 2, x, LEVEL_HOST, PLAN_READ } };
                Acc accb[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_READ },
                               { 1, t2, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acca, 3, 3, &pa, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, accb, 3, 2, &pb, err, sizeof(err)), 0);
        }
        set_durations(pa, 100);
        set_durations(pb, 100);
        marker(m, pb, 0);
        run_loop(m, 20);        /* (B's hold ahead is not said ready: A's phase 0 is about to write T2) */
        marker(m, pa, 0);
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent && pa->hold[1].active && pa->hold[1].ready_sent);
        assert_int_equal(pa->hold[1].phase, 1);                 /* A: T in host, pinned ahead, ready */
        fprintf(stderr, "# B ahead ready %d\n", pb->hold[1].ready_sent);
        fixture_fill(t2, LEVEL_VRAM, 0x44);                     /* A's phase 0 writes T2 */
        fixture_touch(m, t, LEVEL_VRAM, true);                  /* a client writes T in VRAM */
        assert_int_equal(t->version, 2);
        assert_int_equal(t2->version, 1);
        marker_write(pa, enter ? 1 : 2);                        /* A leaves phase 0; not read yet */
        sched_tensor_changed(m->sched, t);                      /* what the client's dirty unpin calls */
        assert_int_equal(pa->seq, 2);                           /* the marker was consumed in there */
        assert_int_equal(t2->version, 2);                       /* ...releasing phase 0 as written */
        assert_ahead_ready_current(pa);
        assert_ahead_ready_current(pb);
        run_loop(m, 20);
        assert_ahead_ready_current(pa);
        assert_ahead_ready_current(pb);
        sched_plan_free(pb);
        free(c2);
        finish(m, j, c1, pa);
}

static void test_nested_tensor_changed_entered(void **state) {
        nested_tensor_changed(true);
}

static void test_nested_tensor_changed_elsewhere(void **state) {
        nested_tensor_changed(false);
}

/* commit_request()'s checks and marks (daemon/ipc/commit.c), without a connection. */
static int commit_checked(Job *j, uint64_t step) {
        list_for_each_safe(n, tmp, &j->tensors) {
                const Tensor *t = list_entry(n, Tensor, job_link);

                if (t->rw_pins > 0)
                        return -EBUSY;
                if (tensor_writers(t) > 0 && t->version > 0 && !t->dead && !t->lost && !copy_valid(t, LEVEL_NVME) &&
                    !plan_holds_overwrite(t))
                        return -EBUSY;
        }
        job_commit(j, step);
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                if (tensor_writers(t) > 0 && !t->dead && plan_holds_overwrite(t))
                        t->commit_dead = true;
        }
        return 0;
}

/*
 * Rank A's hold ahead pins T (in host memory only) for phase 1, which writes it whole; rank B's plan
 * reads T.  A commit now must be refused -EBUSY (T's committed bytes are in memory only and being
 * overwritten): T is dead by A's word only while A alone names it (invariant 7); taken and T marked
 * commit_dead, a rollback after A's write would make T dead, and B would read zeros, not 0x5a.
 */
static void test_commit_overwrite_read_by_other_plan(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *t;
        Job *j;
        Rank *c1, *c2;
        Plan *pa, *pb;
        char err[256];
        int r;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        c1 = fake_conn(m, j);
        c2 = fake_conn(m, j);
        x = tensor(j, "X", MiB);
        t = tensor(j, "T", MiB);
        fixture_host_data(m, t, 0x5a);                          /* T: version 1, host only */
        {
                Acc acca[] = { { 0, x, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_WRITE },
                               { 2, x, LEVEL_HOST, PLAN_READ } };
                Acc accb[] = { { 0, t, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c1, acca, 3, 3, &pa, err, sizeof(err)), 0);
                assert_int_equal(submit_plan(c2, accb, 1, 1, &pb, err, sizeof(err)), 0);
        }
        assert_ptr_equal(t->plan, pa);
        assert_int_equal(t->plan_refs, 2);
        set_durations(pa, 100);
        set_durations(pb, 100);
        marker(m, pa, 0);
        FIXTURE_RUN_UNTIL(m, pa->hold[1].active && pa->hold[1].ready_sent);
        assert_int_equal(tensor_writers(t), 1);                 /* A's phase 1 write-only pin */
        assert_false(copy_valid(t, LEVEL_NVME));
        r = commit_checked(j, 1);
        assert_int_equal(r, -EBUSY);
        assert_false(t->commit_dead);
        sched_plan_free(pb);                                    /* A alone names T now: dead by its word */
        free(c2);
        assert_int_equal(t->plan_refs, 1);
        assert_int_equal(commit_checked(j, 1), 0);
        assert_true(t->commit_dead);
        finish(m, j, c1, pa);
}

/*
 * Rank A's plan alone names T while rank B's plan is not submitted yet (B reconnecting, or
 * resubmitting after a tierd restart later than A): A's phase 0 reads T, phase 1 writes it whole,
 * so once phase 0 is over plan_drop_dead() drops T's only copy.  tierd cannot keep bytes for a plan
 * it does not know of, but a read of them must not get zeros as if they were T's data: a plain read
 * pin, and B's plan reading T, fail -ENODATA (B's plan with the error, its phase never said ready),
 * while A's own write still reserves T without data, after which T reads as A wrote it.
 */
static void test_dead_then_other_plan_reads(void **state) {
        Manager *m = new_manager(SCHED_POLICY_TIMELINE, 8 * MiB);
        Tensor *x, *y, *t;
        Job *j;
        Rank *c1, *c2;
        Plan *pa, *pb;
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
                               { 2, x, LEVEL_HOST, PLAN_READ }, { 3, t, LEVEL_HOST, PLAN_WRITE } };

                assert_int_equal(submit_plan(c1, acca, 4, 4, &pa, err, sizeof(err)), 0);
        }
        pa->rank = 3;
        set_durations(pa, 100);
        marker(m, pa, 0);
        run_loop(m, 20);
        marker(m, pa, 1);                                       /* A's last read of T is over */
        run_loop(m, 20);
        assert_true(t->dead);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), -ENODATA);      /* a plain read pin */
        assert_false(copy_valid(t, LEVEL_HOST));
        {
                Acc accb[] = { { 0, y, LEVEL_HOST, PLAN_READ }, { 1, t, LEVEL_HOST, PLAN_READ } };

                assert_int_equal(submit_plan(c2, accb, 2, 2, &pb, err, sizeof(err)), 0);
        }
        set_durations(pb, 100);
        marker(m, pb, 0);
        FIXTURE_RUN_UNTIL(m, pb->page->daemon.error != 0 || (pb->hold[1].active && pb->hold[1].ready_sent));
        assert_int_equal(pb->page->daemon.error, -ENODATA);    /* B's read of T: no zeros said ready */
        assert_false(pb->hold[1].ready_sent);
        assert_false(copy_valid(t, LEVEL_HOST));
        sched_plan_free(pb);
        free(c2);
        marker(m, pa, 2);
        marker(m, pa, 3);                                       /* A's write: room, no data */
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        {
                /*
                 * Until A writes, a read of T gets none of that room as data: a plain pin there is told
                 * to wait for A's unpin (it used to be told the copy was older than the tensor, written
                 * in another tier), one elsewhere finds T dead; A's own hold ahead waits (below).
                 */
                PinResult r;

                fixture_fill(t, LEVEL_HOST, 0x77);              /* (A writing it, halfway) */
                assert_int_equal(read_pin(m, t, LEVEL_HOST, &r), -EBUSY);
                assert_non_null(strstr(r.error, "reserved for a write-only pin (TIER_WRITE) of rank 3 that has "
                                                "not written it yet"));
                assert_int_equal(t->copy[LEVEL_HOST].pins, 1);  /* A's alone */
                assert_int_equal(read_pin(m, t, LEVEL_VRAM, &r), -ENODATA);
                assert_non_null(strstr(r.error, "the plan of rank 3 overwrites it whole next"));
        }
        fixture_fill(t, LEVEL_HOST, 0x66);
        marker(m, pa, 0);                                       /* written: A reads it back */
        FIXTURE_RUN_UNTIL(m, pa->hold[0].ready_sent);
        assert_true(pa->hold[0].ready_sent);
        assert_false(t->dead);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 0), 0x66);
        finish(m, j, c1, pa);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_end_plan_before_a_held_write),
                cmocka_unit_test(test_gone_before_ready),
                cmocka_unit_test(test_second_plan_grant),
                cmocka_unit_test(test_stale_pinned_copy_not_refilled),
                cmocka_unit_test(test_stale_read_pin_refill_fails),
                cmocka_unit_test(test_stale_read_pin_chained_refill_fails),
                cmocka_unit_test(test_blocked_pin_retried_after_clean_unpin),
                cmocka_unit_test(test_reclaim_keeps_the_share),
                cmocka_unit_test(test_write_only_pin_ahead_is_no_copy),
                cmocka_unit_test(test_marker_read_while_the_next_is_written),
                cmocka_unit_test(test_gone_after_marker_elsewhere),
                cmocka_unit_test(test_marker_after_failed_phase),
                cmocka_unit_test(test_dead_keeps_the_committed_version),
                cmocka_unit_test(test_other_plans_write_keeps_stale_ready),
                cmocka_unit_test(test_other_plan_gone_keeps_stale_ready),
                cmocka_unit_test(test_other_plans_write_lost_by_rmw),
                cmocka_unit_test(test_nested_tensor_changed_entered),
                cmocka_unit_test(test_nested_tensor_changed_elsewhere),
                cmocka_unit_test(test_commit_overwrite_read_by_other_plan),
                cmocka_unit_test(test_dead_then_other_plan_reads),
        };
        return fixture_main("timeline-holds", tests, sizeof(tests) / sizeof(tests[0]));
}
