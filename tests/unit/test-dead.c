/* SPDX-License-Identifier: MIT */
/*
 * test-dead.c: copies that hold none of a tensor's bytes and what reads of them get: a write-only
 * pin's room put back after a restart (a ghost) is nobody's data until its rank says Hello.
 */

#include "daemon/engine/engine-private.h"
#include "tests/unit/timeline-fixture.h"

typedef struct PinResult {
        int done;
        int status;
        char error[320];
} PinResult;

static void on_pin_result(Op *op, int status, const char *error) {
        PinResult *r = op->userdata;

        r->done++;
        r->status = status;
        snprintf(r->error, sizeof(r->error), "%s", error ? error : "");
}

/* A plain read pin of @t in @tier (no plan's): its status, its error in @r; a pin taken is let go. */
static int read_pin(Manager *m, Tensor *t, int tier, PinResult *r) {
        memset(r, 0, sizeof(*r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, tier, on_pin_result, NULL, r, NULL), 0);
        FIXTURE_RUN_UNTIL(m, r->done);
        assert_int_equal(r->done, 1);
        if (r->status == 0)
                assert_int_equal(tensor_unpin(t, tier, false), 0);
        return r->status;
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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_ghost_read_waits_for_hello),
        };
        return fixture_main("dead", tests, sizeof(tests) / sizeof(tests[0]));
}
