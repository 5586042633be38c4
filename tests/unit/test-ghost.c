/* SPDX-License-Identifier: MIT */
/* test-ghost.c: which ranks a copy held for writing is recorded with, and which a ghost waits for. */

/*
 * A copy held for writing when tierd died comes back pinned for the clients
 * of before the restart (a ghost, Tensor.ghost: memstore.c), and stays so
 * until the Hello of each rank whose pins held it (Tensor.ghost_ranks,
 * job_release_ghosts()).  The record names them (Copy.write_ranks,
 * copy_writers(), copy_write_ranks()).  (From test-registry.c, which is at
 * the 1000 lines a file may have.)
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/held-writes.h"
#include "daemon/state/registry.h"
#include "tests/unit/fixture.h"
#include "tier.pb-c.h"

static Tensor *written_ghost(Manager *m, Job *j, const char *name, RankSet ranks) {
        Tensor *t = fixture_tensor(j, name, 1 * MiB);

        fixture_touch(m, t, LEVEL_HOST, true);
        t->copy[LEVEL_HOST].pins++;
        t->copy[LEVEL_HOST].writer_rank = ranks.rank[0];
        t->ghost_ranks[LEVEL_HOST] = ranks;
        t->ghost |= 1u << LEVEL_HOST;
        tensor_pin_account(t, LEVEL_HOST, +1);
        return t;
}

/*
 * A copy held for writing when tierd died (not a write-only pin's) stays pinned until every rank
 * whose pin held it says Hello: a process of that rank may still write into its room through its
 * mapping of the same memory.  It used to go at the job's first Hello, of any rank: its room could
 * then be moved and given to another tensor, which rank 1's process went on overwriting.  A record
 * of before the ranks were kept (n 0) goes at any rank's Hello, as then; more ranks than a record
 * keeps, at the job's end.  Copy.write_ranks keeps the ranks of its writers.
 */
static void test_ghost_written_waits_for_its_rank(void **state) {
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tensor *w1, *w01, *many, *old;
        uint32_t ranks[RANK_SET_MAX];
        char why[256];
        Job *j, *j2;

        (void) state;
        /* the refusals name the ranks waited for, and say till when */
        assert_int_equal(job_new(m->registry, "jr2", 0, &j2), 0);
        (void) written_ghost(m, j2, "two", (RankSet) { .rank = { 0, 1 }, .n = 2 });
        assert_int_equal(job_commit_refused(j2, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "for the clients of ranks 0, 1 of before tierd restarted, which may have written "
                                    "it: what it holds is known once those ranks have all attached again"));
        assert_int_equal(job_rollback_refused(j2, NULL, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "(released when those ranks have all attached again)"));
        job_destroy(j2);
        assert_int_equal(job_new(m->registry, "jr", 0, &j), 0);
        w1 = written_ghost(m, j, "w1", (RankSet) { .rank = { 1 }, .n = 1 });
        w01 = written_ghost(m, j, "w01", (RankSet) { .rank = { 0, 1 }, .n = 2 });
        many = written_ghost(m, j, "many", (RankSet) { .n = RANK_SET_MANY });
        old = written_ghost(m, j, "old", (RankSet) { .n = 0 });

        job_release_ghosts(j, true, 0, NULL, NULL);
        assert_true(!old->ghost && old->copy[LEVEL_HOST].pins == 0);
        assert_true(w1->ghost && w01->ghost && many->ghost);
        assert_true(w1->copy[LEVEL_HOST].pins == 1 && w01->copy[LEVEL_HOST].pins == 1);
        assert_int_equal(fixture_op(m, OP_EVICT, w1, LEVEL_NVME), -EBUSY);     /* its room does not move */
        assert_true(copy_valid(w1, LEVEL_HOST));
        assert_int_equal(copy_write_ranks(w01, LEVEL_HOST, ranks), 1);         /* (what the record says now) */
        assert_int_equal(ranks[0], 1);
        assert_int_equal(job_commit_refused(j, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "for the client of rank 1 of before tierd restarted, which may have written it: "
                                    "what it holds is known once that rank attaches again (commit then)"));

        job_release_ghosts(j, true, 1, NULL, NULL);
        assert_false(w1->ghost || w01->ghost);
        assert_true(w1->copy[LEVEL_HOST].pins == 0 && w01->copy[LEVEL_HOST].pins == 0);
        assert_int_equal(w1->version, 1);
        assert_true(copy_valid(w1, LEVEL_HOST) && copy_valid(w01, LEVEL_HOST));
        assert_true(many->ghost);
        assert_int_equal(job_commit_refused(j, why, sizeof(why)), -EBUSY);
        /* (it said "once that rank attaches again (commit then)" of more ranks than it knew) */
        assert_non_null(strstr(why, "tensor 'many' is held in host for the clients of more than 4 ranks of before "
                                    "tierd restarted, which may have written it: which ranks is not known, so it is "
                                    "held until the job ends"));
        assert_null(strstr(why, "attaches again"));
        assert_int_equal(job_rollback_refused(j, NULL, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "tensor 'many' is held in host for the clients of more than 4 ranks"));
        assert_null(strstr(why, "attaches again"));

        /* the ranks of a copy's writers, for its record */
        copy_writers(w1, LEVEL_HOST, +1, 2);
        copy_writers(w1, LEVEL_HOST, +1, 5);
        copy_writers(w1, LEVEL_HOST, +1, 5);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), 2);
        assert_true(ranks[0] == 2 && ranks[1] == 5);
        assert_int_equal(w1->copy[LEVEL_HOST].writer_rank, 5);
        /* a rank whose last pin that may write went is not recorded (a ghost would wait for it) */
        copy_writers(w1, LEVEL_HOST, -1, 5);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), 2);
        copy_writers(w1, LEVEL_HOST, -1, 5);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), 1);
        assert_int_equal(ranks[0], 2);
        copy_writers(w1, LEVEL_HOST, -1, 2);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), 0);
        copy_writers(w1, LEVEL_HOST, +1, 7);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), 1);
        assert_int_equal(ranks[0], 7);
        /* more ranks than fit at once: not known which until it has no writer */
        for (uint32_t k = 0; k < RANK_SET_MAX; k++)
                copy_writers(w1, LEVEL_HOST, +1, 10 + k);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), RANK_SET_MANY);
        for (uint32_t k = 0; k < RANK_SET_MAX; k++)
                copy_writers(w1, LEVEL_HOST, -1, 10 + k);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), RANK_SET_MANY);
        copy_writers(w1, LEVEL_HOST, -1, 7);
        assert_int_equal(copy_write_ranks(w1, LEVEL_HOST, ranks), 0);

        job_destroy(j);         /* the job's end: what it still held goes */
        for (int tier = 0; tier < TIERS; tier++)
                assert_int_equal(m->registry->pinned[tier], 0);
        fixture_free(m);
}

/*
 * The first Hello of a rank after a restart decides each write-only copy the rank held by whether it
 * names it (Hello.held_writes): a scan of the Hello's list per copy was copies x held writes of work
 * in one request on the main loop (8 x max_tensors writes may be named).  handle_hello() sorts the list
 * once (held_writes_index()) and looks each copy up: 256 such copies and 8192 writes named, the ones
 * that count last (the scan's worst order), compare at most 16 x 8192 entries (the scan: over 2
 * million).  What is decided is as before: a copy named in its tier counts as written, one named in
 * another tier only goes back to zeros.
 */
static void test_ghost_held_writes_sorted(void **state) {
        enum { K = 256, N = 8192 };
        Manager *m = fixture_new(32 * MiB, NULL, NULL);
        Tier__HeldWrite *w = calloc(N, sizeof(*w)), **held = calloc(N, sizeof(*held));
        char (*names)[16] = calloc(N, 16);
        uint64_t steps = 0;
        HeldWrites hw;
        Tensor *t[K];
        Job *j;

        (void) state;
        assert_true(w && held && names);
        assert_int_equal(job_new(m->registry, "hw", 0, &j), 0);
        for (int i = 0; i < K; i++) {
                snprintf(names[i], 16, "g%d", i);
                t[i] = fixture_tensor(j, names[i], 4096);
                fixture_touch(m, t[i], LEVEL_HOST, true);
                t[i]->copy[LEVEL_HOST].pins++;
                t[i]->ghost_ranks[LEVEL_HOST] = (RankSet) { .rank = { 3 }, .n = 1 };
                t[i]->ghost_rank = 3;
                t[i]->ghost |= 1u << LEVEL_HOST;
                t[i]->ghost_unwritten |= 1u << LEVEL_HOST;
                tensor_pin_account(t[i], LEVEL_HOST, +1);
        }
        /* names of no tensor, the odd ones in VRAM, then the even ones in host */
        for (int i = 0; i < N; i++) {
                int g = i - (N - K);

                tier__held_write__init(&w[i]);
                held[i] = &w[i];
                w[i].tier = g < 0 || g % 2 ? TIER__TIER__TIER_VRAM : TIER__TIER__TIER_HOST;
                w[i].tensor = g < 0 ? names[K + i] : names[g];  /* (K + i < N) */
                if (g < 0)
                        snprintf(names[K + i], 16, "x%d", i);
        }
        assert_int_equal(held_writes_index(held, N, &steps, &hw), 0);
        job_release_ghosts(j, true, 3, held_writes_has, &hw);
        held_writes_free(&hw);
        for (int i = 0; i < K; i++) {
                assert_int_equal(t[i]->ghost, 0);
                assert_int_equal(t[i]->version, i % 2 ? 0 : 1);
                assert_false(t[i]->lost);
        }
        assert_true(steps <= 16 * (uint64_t) N);
        job_destroy(j);
        free(names);
        free(held);
        free(w);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_ghost_written_waits_for_its_rank),
                cmocka_unit_test(test_ghost_held_writes_sorted),
        };
        return fixture_main("ghost", tests, sizeof(tests) / sizeof(tests[0]));
}
