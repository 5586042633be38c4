/* SPDX-License-Identifier: MIT */
/* test-capbound.c: bench/capbound.c's bytes per step on hand-computed plans, and against exhaustive search. */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "bench/capbound-internal.h"
#include "proto/macro.h"

#define V CB_VRAM
#define H CB_HOST
#define R CB_READ
#define W CB_WRITE
#define RW (CB_READ | CB_WRITE)

/* A plan of up to 16 phases of up to 4 accesses, written as a table. */
typedef struct TPlan {
        uint64_t size[8];
        size_t start[17];
        CbAccess acc[64];
        CbPlan p;
} TPlan;

/* @phases rows of {tensor, tier, mode} triples, -1 ending a row. */
static void tplan(TPlan *t, size_t n_tensors, const uint64_t *size, size_t n_phases, const int (*rows)[13]) {
        size_t n = 0;

        memset(t, 0, sizeof(*t));
        for (size_t i = 0; i < n_tensors; i++)
                t->size[i] = size ? size[i] : 1;
        for (size_t k = 0; k < n_phases; k++) {
                t->start[k] = n;
                for (size_t j = 0; rows[k][j] >= 0; j += 3)
                        t->acc[n++] = (CbAccess) { (uint32_t) rows[k][j], (uint8_t) rows[k][j + 1],
                                                   (uint8_t) rows[k][j + 2] };
        }
        t->start[n_phases] = n;
        t->p = (CbPlan) { n_tensors, t->size, n_phases, t->start, t->acc };
}

static void exact2(const CbPlan *p, uint64_t vc, uint64_t hc, double *nvme, double *link) {
        assert_int_equal(capbound_exact(p, vc, hc, 0, 24, nvme), 0);
        assert_int_equal(capbound_exact(p, vc, hc, 1, 24, link), 0);
}

/* 3 tensors, VRAM 2, A B C B in VRAM: B stays, A and C take turns: 2 loads a step; host holds all. */
static void test_three_in_two(void **state) {
        static const int rows[4][13] = {
                { 0, V, R, -1 }, { 1, V, R, -1 }, { 2, V, R, -1 }, { 1, V, R, -1 },
        };
        TPlan t;
        CbBytes n, l;
        double en, el;

        tplan(&t, 3, NULL, 4, rows);
        assert_int_equal(capbound_min(&t.p, 2, 8, &n, &l), 0);
        assert_true(l.link_up == 2 && l.link_down == 0);
        assert_true(n.nvme_read == 0 && n.nvme_write == 0);
        exact2(&t.p, 2, 8, &en, &el);
        assert_true(en == 0 && el == 2);
        /* the proven floor: at C's phase A, B and C all want VRAM's 2 places: 1 comes up again */
        assert_int_equal(capbound_floor(&t.p, 2, 8, &n), 0);
        assert_true(n.link_up == 1 && n.link_down == 0 && n.nvme_read == 0 && n.nvme_write == 0);
        /*
         * host 1: A or C must come from NVMe each step (tierd never demotes the
         * clean VRAM copy to host, nor frees a current NVMe copy): 1 read.
         */
        assert_int_equal(capbound_min(&t.p, 2, 1, &n, &l), 0);
        assert_true(l.link_up + l.link_down == 2);
        assert_true(n.nvme_read == 1 && n.nvme_write == 0);
        exact2(&t.p, 2, 1, &en, &el);
        assert_true(en == 1 && el == 2);
}

/* VRAM 1: A written in VRAM, then B read there: A drains (link down) every step. */
static void test_write_back_link(void **state) {
        static const int rows[2][13] = { { 0, V, RW, -1 }, { 1, V, R, -1 } };
        TPlan t;
        CbBytes n, l;
        double en, el;

        tplan(&t, 2, NULL, 2, rows);
        assert_int_equal(capbound_min(&t.p, 1, 4, &n, &l), 0);
        assert_true(l.link_up == 2 && l.link_down == 1);
        assert_true(n.nvme_read + n.nvme_write == 0);
        exact2(&t.p, 1, 4, &en, &el);
        assert_true(el == 3 && en == 0);
        /* floor: no crossing of tiers, one of the two out of VRAM's one place */
        assert_int_equal(capbound_floor(&t.p, 1, 4, &n), 0);
        assert_true(n.link_up == 1 && n.link_down == 0);
}

/* Host 1, no VRAM use: A read-write, B read: A is written to NVMe and read back, B read. */
static void test_write_back_nvme(void **state) {
        static const int rows[2][13] = { { 0, H, RW, -1 }, { 1, H, R, -1 } };
        TPlan t;
        CbBytes n;
        double en, el;

        tplan(&t, 2, NULL, 2, rows);
        assert_int_equal(capbound_min(&t.p, 0, 1, &n, NULL), 0);
        assert_true(n.nvme_read == 2 && n.nvme_write == 1);
        exact2(&t.p, 0, 1, &en, &el);
        assert_true(en == 3 && el == 0);
        /*
         * floor: one of the two is on NVMe only at each phase; at B's phase it
         * is A, written each step, so it was written there too (B, never
         * written, needs no write)
         */
        assert_int_equal(capbound_floor(&t.p, 0, 1, &n), 0);
        assert_true(n.nvme_read == 1 && n.nvme_write == 1);
}

/*
 * Write-back decides the victim: host 2 holds A (dirty: written every step)
 * and B (clean), C comes in: dropping B is free, dropping A costs a write.
 * Phases: A rw, B r, C r, A rw, B r.  Belady alone would evict the one used
 * farthest away; the least bytes keep A and re-read B and C.
 */
static void test_dirty_victim(void **state) {
        static const int rows[5][13] = {
                { 0, H, RW, -1 }, { 1, H, R, -1 }, { 2, H, R, -1 }, { 0, H, RW, -1 }, { 1, H, R, -1 },
        };
        TPlan t;
        CbBytes n;
        double en, el;

        tplan(&t, 3, NULL, 5, rows);
        exact2(&t.p, 0, 2, &en, &el);
        assert_int_equal(capbound_min(&t.p, 0, 2, &n, NULL), 0);
        assert_true(n.nvme_read + n.nvme_write == en);
        assert_true(en == 2);
}

/* Everything fits: nothing moves in steady state. */
static void test_all_fits(void **state) {
        static const int rows[4][13] = {
                { 0, V, R, -1 }, { 0, V, R, 1, V, W, -1 }, { 1, H, R, 2, H, RW, 0, H, RW, -1 }, { 2, H, R, -1 },
        };
        TPlan t;
        CbBytes n, l;

        tplan(&t, 3, NULL, 4, rows);
        /* VRAM must hold P and G, host G, O and P: P and G cross the link each step */
        assert_int_equal(capbound_min(&t.p, 100, 100, &n, &l), 0);
        assert_true(n.nvme_read + n.nvme_write == 0);
        /* P written in host goes up once, G written in VRAM comes down once */
        assert_true(l.link_up == 1 && l.link_down == 1);
        /* and the floor sees exactly these crossings */
        assert_int_equal(capbound_floor(&t.p, 100, 100, &n), 0);
        assert_true(n.link_up == 1 && n.link_down == 1 && n.nvme_read + n.nvme_write == 0);
        /* a plan that never changes tiers moves nothing at all */
        static const int rows2[2][13] = { { 0, V, RW, 1, V, R, -1 }, { 2, H, RW, -1 } };
        tplan(&t, 3, NULL, 2, rows2);
        assert_int_equal(capbound_min(&t.p, 2, 1, &n, &l), 0);
        assert_true(n.nvme_read + n.nvme_write + l.link_up + l.link_down == 0);
}

/* A phase that pins more than the tier holds has no schedule. */
static void test_too_big(void **state) {
        static const int rows[1][13] = { { 0, V, R, 1, V, R, -1 } };
        TPlan t;
        CbBytes n;
        double e;

        tplan(&t, 2, NULL, 1, rows);
        assert_int_equal(capbound_min(&t.p, 1, 8, &n, NULL), -E2BIG);
        assert_int_equal(capbound_exact(&t.p, 1, 8, 0, 8, &e), -E2BIG);
        t.acc[0].tensor = 7;
        assert_int_equal(capbound_min(&t.p, 4, 8, &n, NULL), -EINVAL);
        t.acc[0].tensor = 0;
        t.acc[0].mode = 0;
        assert_int_equal(capbound_min(&t.p, 4, 8, &n, NULL), -EINVAL);
}

/* The synthetic training plan of bench-timeline (2 layers: P, G, O each), sizes 1. */
static void test_training_plan(void **state) {
        /* tensors: P0 P1 G0 G1 O0 O1 -- more than 3, so no exhaustive search: hand-computed */
        static const int rows[6][13] = {
                { 0, V, R, -1 }, { 1, V, R, -1 },                               /* fwd */
                { 1, V, R, 3, V, W, -1 }, { 0, V, R, 2, V, W, -1 },             /* bwd, reverse */
                { 2, H, R, 4, H, RW, 0, H, RW, -1 }, { 3, H, R, 5, H, RW, 1, H, RW, -1 },   /* opt */
        };
        TPlan t;
        CbBytes n, l;

        tplan(&t, 6, NULL, 6, rows);
        /* room for everything: P up and G down once each per layer */
        assert_int_equal(capbound_min(&t.p, 4, 6, &n, &l), 0);
        assert_true(n.nvme_read + n.nvme_write == 0);
        assert_true(l.link_up == 2 && l.link_down == 2);
        /*
         * host 4: opt_0 pins G0 O0 P0 and G1 arrived from VRAM.  Without moving
         * P0 up ahead of fwd_0, opt_1 finds host holding O0 and P0 (both dirty,
         * P0 read next in VRAM) beside its own three: P1 or O1 is out, a write and
         * a read a step, 2 NVMe bytes, and every rule without upstaging finds 2.
         * Upstaged, P0 leaves host for VRAM (G0 is dead, P1 and G1 served from
         * VRAM before) and the 6 tensors fit the 8 places: no NVMe at all.
         */
        for (unsigned r = 0; r < CB_RULES; r++) {
                assert_int_equal(capbound_simulate(&t.p, 4, 4, (CbRule) r, 1, 0, 64, &n), 0);
                assert_true(n.nvme_read + n.nvme_write == 2);
                assert_int_equal(capbound_simulate(&t.p, 4, 4, (CbRule) (r | CB_RULE_UPSTAGE), 1, 0, 64, &n), 0);
                assert_true(n.nvme_read + n.nvme_write == 0);
                assert_true(n.link_up == 2 && n.link_down == 4);
        }
        assert_int_equal(capbound_min(&t.p, 4, 4, &n, &l), 0);
        assert_true(n.nvme_read + n.nvme_write == 0);
}

/*
 * The time bound, by hand: the training plan of 8 layers as bench-timeline
 * makes it (P, G, O of 1 byte each), VRAM 6 and host 12 bytes, fwd and opt
 * phases 0.5 s, bwd 2 s, NVMe and link 1 byte/s.  From opt_0 (phase 16) to
 * opt_7 (phase 23) every P, G and O is read first: 24 bytes, 18 in memory,
 * so 6 s of reads before opt_7 starts, where the compute of opt_0 .. opt_6 is
 * 3.5 s: the step is at least its compute, 24 s, plus 2.5 s.  No other window
 * waits longer (the forward and backward read 8 P, and write G first).
 */
/* bench-timeline's plan of 8 layers (P_i, G_i, O_i are 3i, 3i + 1, 3i + 2; 1 byte each): fwd, bwd in reverse, opt. */
typedef struct L8Plan {
        uint64_t size[24];
        size_t start[25];
        CbAccess acc[48];
        double compute[24];     /* fwd and opt 0.5 s, bwd 2 s */
        CbPlan p;
} L8Plan;

static void l8_plan(L8Plan *t) {
        size_t n = 0;

        for (size_t i = 0; i < 24; i++)
                t->size[i] = 1;
        for (uint32_t k = 0; k < 24; k++) {
                uint32_t l = k < 8 ? k : k < 16 ? 15 - k : k - 16;

                t->start[k] = n;
                if (k < 8) {
                        t->acc[n++] = (CbAccess) { 3 * l, V, R };
                        t->compute[k] = 0.5;
                } else if (k < 16) {
                        t->acc[n++] = (CbAccess) { 3 * l, V, R };
                        t->acc[n++] = (CbAccess) { 3 * l + 1, V, W };
                        t->compute[k] = 2;
                } else {
                        t->acc[n++] = (CbAccess) { 3 * l + 1, H, R };
                        t->acc[n++] = (CbAccess) { 3 * l + 2, H, RW };
                        t->acc[n++] = (CbAccess) { 3 * l, H, RW };
                        t->compute[k] = 0.5;
                }
        }
        t->start[24] = n;
        t->p = (CbPlan) { 24, t->size, 24, t->start, t->acc };
}

static void test_time_bound(void **state) {
        L8Plan t;
        double *compute = t.compute;
        CbPlan p;
        CbTime tb;

        l8_plan(&t);
        p = t.p;
        assert_int_equal(capbound_time(&p, 6, 12, compute, 1, 1, &tb), 0);
        assert_true(fabs(tb.step_s - 26.5) < 1e-9);
        assert_int_equal(tb.from, 16);
        assert_int_equal(tb.to, 23);
        assert_true(tb.read_bytes == 6);
        /* memory for all of it: the compute alone */
        assert_int_equal(capbound_time(&p, 6, 18, compute, 1, 1, &tb), 0);
        assert_true(tb.step_s == 24 && tb.from == SIZE_MAX);
        /* a slower drive: 6 bytes at 1/2 byte/s wait 12 s over the same 3.5 s */
        assert_int_equal(capbound_time(&p, 6, 12, compute, 0.5, 1, &tb), 0);
        assert_true(fabs(tb.step_s - 32.5) < 1e-9);
        /*
         * no NVMe bound asked, a slow link (0.1 byte/s): the forward reads 8 P in
         * VRAM, 6 fit: 2 bytes, 20 s, before fwd_7, after 3.5 s of compute
         */
        assert_int_equal(capbound_time(&p, 6, 12, compute, 0, 0.1, &tb), 0);
        assert_true(fabs(tb.step_s - 40.5) < 1e-9);
        assert_true(tb.from == 0 && tb.to == 7 && tb.up_bytes == 2 && tb.read_bytes == 0);
        /*
         * The writes' part: A, B, C read and written in host 1, one a phase, then
         * a phase of compute alone; 1 s each, 1 byte/s.  From phase 0 to phase 2:
         * 2 of the 3 bytes read must arrive after phase 0 starts, and of A and B,
         * written by phases 0 and 1 and read again next step, 1 must be written
         * down before phase 2 starts: 3 s where phases 0-1 compute 2 s, so the
         * step is at least 4 + 1 s (phase 3 gives the same: 4 s over 3).  Reads
         * alone would give 4 s.
         */
        {
                static const int rows[4][13] = { { 0, H, RW, -1 }, { 1, H, RW, -1 }, { 2, H, RW, -1 }, { -1 } };
                double c4[4] = { 1, 1, 1, 1 };
                TPlan w;

                tplan(&w, 3, NULL, 4, rows);
                assert_int_equal(capbound_time(&w.p, 0, 1, c4, 1, 0, &tb), 0);
                assert_true(fabs(tb.step_s - 5) < 1e-9);
                assert_true(tb.from == 0 && tb.to == 2 && tb.read_bytes == 2 && tb.write_bytes == 1);
        }
        /* bad input */
        compute[3] = -1;
        assert_int_equal(capbound_time(&p, 6, 12, compute, 1, 1, &tb), -EINVAL);
        compute[3] = 0.5;
        assert_int_equal(capbound_time(&p, 6, 12, NULL, 1, 1, &tb), -EINVAL);
        assert_int_equal(capbound_time(&p, 6, 12, compute, -1, 1, &tb), -EINVAL);
        /* a NaN bandwidth too, as capbound_window() refuses it (the two share cb_time_args()) */
        assert_int_equal(capbound_time(&p, 6, 12, compute, NAN, 1, &tb), -EINVAL);
        assert_int_equal(capbound_time(&p, 6, 12, compute, 1, NAN, &tb), -EINVAL);
}

/*
 * capbound_window() by hand.  A written in VRAM in phase 0 and read in host
 * in phase 1 (1 s each, 1 byte at 0.5 byte/s of link): it crosses after
 * phase 0 ends and before phase 1 starts, 2 s in which no phase runs: 4 s
 * (capbound_time(): the compute, 2 s; with no link bound, 2 s here too).
 * A, B, C read and written in host 1 (test_time_bound()): the reads beyond
 * memory (2) and the write of A or B (1) all wait for phase 0 to end, none
 * of the three having been used before: 3 s before phase 2 starts, over
 * phase 1's 1 s, so 4 + 2 s (capbound_time(): 5).  The 8-layer plan at 1
 * byte/s: G0 comes down between the last backward phase and the first
 * optimizer phase (1 s), and the six reads of the burst start when opt_0
 * ends: 6 s over the 3 s of opt_1 .. opt_6, 24 + 1 + 3 = 28 s
 * (capbound_time(): 26.5; with an instant link, the room alone: 27).  With
 * a slow link alone (0.1 byte/s): from the end of bwd_7 to the start of
 * fwd_7 every G comes down and every updated P goes up (16 crossings),
 * and 2 of the 8 P the backward pass reads beyond VRAM's 6 places, 180 s
 * over 21.5 s of compute after bwd_7: 182.5 s (capbound_time(): 40.5).
 */
static void test_window_bound(void **state) {
        static const int cross[2][13] = { { 0, V, W, -1 }, { 0, H, R, -1 } };
        static const int abc[4][13] = { { 0, H, RW, -1 }, { 1, H, RW, -1 }, { 2, H, RW, -1 }, { -1 } };
        double c2[2] = { 1, 1 }, c4[4] = { 1, 1, 1, 1 }, lower;
        CbWindow wb;
        CbTime tb;
        L8Plan l8;
        TPlan t;

        tplan(&t, 1, NULL, 2, cross);
        assert_int_equal(capbound_window(&t.p, 1, 1, c2, 1, 0.5, &wb), 0);
        assert_true(fabs(wb.step_s - 4) < 1e-9 && fabs(wb.gaps_s - 2) < 1e-9 && wb.from == SIZE_MAX);
        assert_int_equal(capbound_time(&t.p, 1, 1, c2, 1, 0.5, &tb), 0);
        assert_true(fabs(tb.step_s - 2) < 1e-9);
        assert_int_equal(capbound_lower(&t.p, 1, 1, c2, 1, 0.5, 1, &tb, &lower), 0);
        assert_true(fabs(lower - 4) < 1e-9);
        assert_int_equal(capbound_window(&t.p, 1, 1, c2, 1, 0, &wb), 0);
        assert_true(fabs(wb.step_s - 2) < 1e-9);

        tplan(&t, 3, NULL, 4, abc);
        assert_int_equal(capbound_window(&t.p, 0, 1, c4, 1, 0, &wb), 0);
        assert_true(fabs(wb.step_s - 6) < 1e-9 && wb.from == 0 && wb.to == 2 && wb.after_end);
        assert_true(wb.read_bytes == 2 && wb.write_bytes == 1);

        l8_plan(&l8);
        assert_int_equal(capbound_window(&l8.p, 6, 12, l8.compute, 1, 1, &wb), 0);
        assert_true(fabs(wb.step_s - 28) < 1e-9 && wb.from == 16 && wb.to == 23 && wb.after_end);
        assert_true(fabs(wb.gaps_s - 1) < 1e-9 && wb.read_bytes == 6);
        assert_int_equal(capbound_lower(&l8.p, 6, 12, l8.compute, 1, 1, 1, &tb, &lower), 0);
        assert_true(fabs(lower - 28) < 1e-9 && fabs(tb.step_s - 26.5) < 1e-9);
        assert_int_equal(capbound_window(&l8.p, 6, 12, l8.compute, 1, 0, &wb), 0);
        assert_true(fabs(wb.step_s - 27) < 1e-9);
        assert_int_equal(capbound_window(&l8.p, 6, 12, l8.compute, 0, 0.1, &wb), 0);
        assert_true(fabs(wb.step_s - 182.5) < 1e-6 && wb.from == 8 && wb.to == 7 && wb.link_bytes == 18);

        /* bad input */
        assert_int_equal(capbound_window(&l8.p, 6, 12, NULL, 1, 1, &wb), -EINVAL);
        assert_int_equal(capbound_window(&l8.p, 6, 12, l8.compute, -1, 1, &wb), -EINVAL);
        assert_int_equal(capbound_window(&l8.p, 6, 12, l8.compute, 1, NAN, &wb), -EINVAL);
        assert_int_equal(capbound_window(&l8.p, 6, 12, l8.compute, 1, 1, NULL), -EINVAL);
        assert_int_equal(capbound_window(NULL, 6, 12, l8.compute, 1, 1, &wb), -EINVAL);
}

/*
 * Two phases held at a time, by hand.  A B C, one per phase, each read and
 * written in host, host 2: holding one phase, the cycle misses every other
 * access (1.5 reads and 1.5 writes a step, the exhaustive minimum); holding
 * two, the phase and the next one fill host, so every phase writes the one
 * before down and reads the next one: 3 and 3.  The 8-layer training plan
 * under VRAM 6 and host 12 (24 tensors, 18 places): when the optimizer
 * starts, every P, G and O is live, so 6 wait on NVMe, each written and read
 * once a step: 12, the proven floor.  The rules reach it by parking
 * (CB_RULE_PARK): as each optimizer phase brings its G and P down from VRAM,
 * host room goes up to the VRAM place they leave instead of to NVMe.
 * Without parking the best rule streams all 8 O's: 16.  Holding two phases,
 * when the backward pass ends VRAM keeps two older tensors beside its pinned
 * pair and the first two optimizer phases pin 6 in host, so of the other 12
 * P and G four go to NVMe and back: 24 without parking or upstaging; 20
 * when the P's the optimizer updated go up to VRAM ahead of the forward pass
 * and leave their host room (CB_RULE_UPSTAGE); 14 with parking.
 */
static double best_of(const CbPlan *p, unsigned held, CbRule want, CbRule skip) {
        double best = INFINITY;

        for (unsigned r = 0; r < CB_RULE_COMBOS; r++) {
                CbRule ru = cb_rule_nth(r, held);
                CbBytes n;

                if ((ru & want) != want || (ru & skip))
                        continue;
                assert_int_equal(capbound_simulate(p, 6, 12, ru, 1, 0, 256, &n), 0);
                best = fmin(best, n.nvme_read + n.nvme_write);
        }
        return best;
}

static void test_held_pairs(void **state) {
        static const int rows[3][13] = { { 0, H, RW, -1 }, { 1, H, RW, -1 }, { 2, H, RW, -1 } };
        TPlan t;
        L8Plan l8;
        CbBytes n, f;
        double en;

        tplan(&t, 3, NULL, 3, rows);
        assert_int_equal(capbound_min_held(&t.p, 0, 2, 1, &n, NULL), 0);
        assert_true(n.nvme_read == 1.5 && n.nvme_write == 1.5);
        assert_int_equal(capbound_exact(&t.p, 0, 2, 0, 24, &en), 0);
        assert_true(en == 3);
        assert_int_equal(capbound_min_held(&t.p, 0, 2, 2, &n, NULL), 0);
        assert_true(n.nvme_read == 3 && n.nvme_write == 3);
        /* two phases do not fit one place, one does */
        assert_int_equal(capbound_min_held(&t.p, 0, 1, 2, &n, NULL), -E2BIG);
        assert_int_equal(capbound_min_held(&t.p, 0, 1, 1, &n, NULL), 0);
        assert_int_equal(capbound_min_held(&t.p, 0, 2, 3, &n, NULL), -EINVAL);

        l8_plan(&l8);
        assert_int_equal(capbound_min_held(&l8.p, 6, 12, 1, &n, NULL), 0);
        assert_true(n.nvme_read == 6 && n.nvme_write == 6);
        assert_int_equal(capbound_floor(&l8.p, 6, 12, &f), 0);
        assert_true(f.nvme_read + f.nvme_write == 12);
        assert_true(best_of(&l8.p, 1, 0, CB_RULE_PARK) == 16);
        assert_true(best_of(&l8.p, 2, 0, CB_RULE_PARK | CB_RULE_UPSTAGE) == 24);
        assert_true(best_of(&l8.p, 2, CB_RULE_UPSTAGE, CB_RULE_PARK) == 20);
        assert_int_equal(capbound_min_held(&l8.p, 6, 12, 2, &n, NULL), 0);
        assert_true(n.nvme_read + n.nvme_write == 14);
}

/*
 * A random tiny plan of @n_tensors tensors (1 or 2 bytes) and @n_phases
 * phases of 1 or 2 accesses, drawn from *@seed into @t (@rows and @size hold
 * it); with @compute, each phase's compute too (0 to 1.5 s).
 */
static void random_plan(unsigned *seed, TPlan *t, int rows[6][13], uint64_t size[3], size_t n_tensors,
                        size_t n_phases, double *compute) {
        for (size_t i = 0; i < n_tensors; i++)
                size[i] = 1 + (uint64_t) (rand_r(seed) % 2);
        for (size_t k = 0; k < n_phases; k++) {
                size_t m = 0, n_acc = 1 + (size_t) (rand_r(seed) % 2);

                if (compute)
                        compute[k] = (double) (rand_r(seed) % 4) / 2;
                for (size_t a = 0; a < n_acc; a++) {
                        int tn = rand_r(seed) % (int) n_tensors, dup = 0;

                        for (size_t x = 0; x < m; x += 3)
                                dup |= rows[k][x] == tn;
                        if (dup)
                                continue;
                        rows[k][m++] = tn;
                        rows[k][m++] = rand_r(seed) % 2 ? V : H;
                        rows[k][m++] = 1 + rand_r(seed) % 3;
                }
                rows[k][m] = -1;
        }
        tplan(t, n_tensors, size, n_phases, (const int (*)[13]) rows);
}

/*
 * Random tiny plans (2 or 3 tensors of 1 or 2 bytes, 2 to 6 phases): the
 * rules' best is never below the exhaustive minimum (the two implement one
 * model), and equal to it on nearly all.
 */
static void test_random_vs_exact(void **state) {
        unsigned seed = 12345, equal = 0, total = 0, window_equal = 0;
        double floor_sum = 0, exact_sum = 0;

        for (int iter = 0; iter < 300; iter++) {
                int rows[6][13];
                size_t n_phases = 2 + (size_t) (rand_r(&seed) % 5), n_tensors = 2 + (size_t) (rand_r(&seed) % 2);
                uint64_t size[3];
                uint64_t vc = (uint64_t) (rand_r(&seed) % 4), hc = 1 + (uint64_t) (rand_r(&seed) % 4);
                TPlan t;
                CbBytes n, l;
                double en, el;
                int r;

                random_plan(&seed, &t, rows, size, n_tensors, n_phases, NULL);
                r = capbound_min(&t.p, vc, hc, &n, &l);
                if (r == -E2BIG) {
                        assert_int_equal(capbound_exact(&t.p, vc, hc, 0, 24, &en), -E2BIG);
                        continue;
                }
                assert_int_equal(r, 0);
                exact2(&t.p, vc, hc, &en, &el);
                {
                        CbBytes f;

                        /* the floor is proven: never above the exhaustive minimum */
                        assert_int_equal(capbound_floor(&t.p, vc, hc, &f), 0);
                        if (f.nvme_read + f.nvme_write > en + 1e-9 || f.link_up + f.link_down > el + 1e-9)
                                fail_msg("plan %d: the floor (%g, %g) is above the exhaustive minimum (%g, %g)", iter,
                                         f.nvme_read + f.nvme_write, f.link_up + f.link_down, en, el);
                        floor_sum += f.nvme_read + f.nvme_write + f.link_up + f.link_down;
                        exact_sum += en + el;
                }
                {
                        /*
                         * capbound_lower() (bench-timeline's time_bound_s) is a lower bound: never above
                         * what the exhaustive minimum's bytes take on the links, or the time-aware
                         * bound (proven on its own), whichever is larger; with no compute, a bytes
                         * bound from the heuristic's extra bytes shows
                         */
                        static const double zero[6], quarter[6] = { 0.25, 0.25, 0.25, 0.25, 0.25, 0.25 };
                        const double *cs[] = { zero, quarter };

                        for (size_t c = 0; c < 2; c++) {
                                double lower, exact_s = 0.25 * (double) n_phases * (double) c;
                                CbWindow wb;
                                CbTime tb;

                                exact_s = MAX(exact_s, MAX(en / 1.0, el / 2.0));
                                assert_int_equal(capbound_lower(&t.p, vc, hc, cs[c], 1.0, 2.0, 1, &tb, &lower), 0);
                                assert_int_equal(capbound_window(&t.p, vc, hc, cs[c], 1.0, 2.0, &wb), 0);
                                if (lower > MAX(exact_s, wb.step_s) + 1e-9)
                                        fail_msg("plan %d: time_bound_s %g s is above the exhaustive minimum's %g s "
                                                 "(time-aware %g s)", iter, lower, exact_s, wb.step_s);
                                assert_true(lower >= wb.step_s && wb.step_s >= tb.step_s);
                        }
                        /*
                         * the window's link bytes, with no compute and 1 byte/s of link alone, are
                         * distinct crossings within one step: never above the exhaustive minimum
                         */
                        {
                                CbWindow wb;

                                assert_int_equal(capbound_window(&t.p, vc, hc, zero, 0, 1, &wb), 0);
                                if (wb.step_s > el + 1e-9)
                                        fail_msg("plan %d: the window's link bytes %g are above the exhaustive "
                                                 "minimum %g", iter, wb.step_s, el);
                                window_equal += wb.step_s > el - 1e-9;
                        }
                }
                if (fabs(n.nvme_read + n.nvme_write - en) > 1e-9 || fabs(l.link_up + l.link_down - el) > 1e-9) {
                        for (size_t k = 0; k < n_phases; k++) {
                                for (size_t x = 0; rows[k][x] >= 0; x += 3)
                                        print_message("t%d %s %d  ", rows[k][x], rows[k][x + 1] == V ? "V" : "H", rows[k][x + 2]);
                                print_message("\n");
                        }
                        print_message("caps %" PRIu64 " %" PRIu64 " sizes %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", vc, hc, size[0], size[1], size[2]);
                }
                if (n.nvme_read + n.nvme_write < en - 1e-9 || l.link_up + l.link_down < el - 1e-9)
                        fail_msg("plan %d: the simulation found fewer bytes (%g, %g) than the exhaustive minimum "
                                 "(%g, %g): the two models differ", iter, n.nvme_read + n.nvme_write,
                                 l.link_up + l.link_down, en, el);
                total++;
                if (fabs(n.nvme_read + n.nvme_write - en) < 1e-9 && fabs(l.link_up + l.link_down - el) < 1e-9)
                        equal++;
                else
                        print_message("plan %d: simulated nvme %g link %g, exact %g %g\n", iter,
                                      n.nvme_read + n.nvme_write, l.link_up + l.link_down, en, el);
        }
        print_message("%u of %u random plans: the simulation's minimum equals the exhaustive one; the floor "
                      "reaches %.0f%% of the exhaustive bytes; the window's link bytes equal the exhaustive "
                      "minimum on %u\n", equal, total, 100 * floor_sum / exact_sum, window_equal);
        /* 111 of 114 when written: the rules must not get worse */
        assert_true(total > 100);
        assert_true(equal * 100 >= total * 95);
}

/*
 * The plan of waits (cb_place_gaps()) for the 8-layer plan: when the
 * optimizer starts all 24 tensors are live in 18 places, and the O's wait
 * longest for the same two transfers (each is used once a step), so 6 of
 * the 8 O's wait on NVMe and nothing else does (all O waits are as long:
 * which two stay is a tie the flow breaks).  The model following it, with
 * parking, moves the floor's 12 bytes a step.
 */
static void test_place_gaps(void **state) {
        L8Plan l8;
        uint8_t *out = NULL;
        unsigned n_out = 0;
        CbBytes n;
        CbLog log;

        l8_plan(&l8);
        assert_int_equal(cb_place_gaps(&l8.p, 6, 12, 1, &out), 0);
        for (size_t i = 0; i < l8.p.start[24]; i++)
                if (out[i]) {
                        assert_int_equal(l8.acc[i].tensor % 3, 2);      /* an O */
                        n_out++;
                }
        assert_int_equal(n_out, 6);
        assert_int_equal(cb_simulate_log(&l8.p, 6, 12, CB_RULE_FREE_FIRST | CB_RULE_PARK, 1, 0, 0, 0, out, 256, &n,
                                         &log), 0);
        assert_true(n.nvme_read == 6 && n.nvme_write == 6);
        cb_log_free(&log);
        free(out);
        /* bad input; one phase more than memory holds */
        assert_int_equal(cb_place_gaps(&l8.p, 6, 12, 3, &out), -EINVAL);
        assert_int_equal(cb_place_gaps(&l8.p, 6, 12, 1, NULL), -EINVAL);
        assert_int_equal(cb_place_gaps(NULL, 6, 12, 1, &out), -EINVAL);
        assert_int_equal(cb_place_gaps(&l8.p, 0, 2, 1, &out), -E2BIG);
}

/*
 * capbound_planned(), by hand: A and B read and written in host, one place,
 * 1 s of compute a phase, 1 byte at 2 bytes/s.  When phase 0 ends, A is
 * written down (0.5 s), then B read into its place (0.5 s): phase 1 starts
 * at 2 s, and the step is 2 x (1 + 0.5 + 0.5) = 4 s.  With two places
 * nothing moves: the compute, 2 s; so with an instant drive.  The 8-layer
 * plan: a schedule is never faster than the time-aware bound, and the
 * random search only keeps a faster one.
 */
static void test_planned(void **state) {
        static const int rows[2][13] = { { 0, H, RW, -1 }, { 1, H, RW, -1 } };
        double c2[2] = { 1, 1 };
        CbPlanned pl, more;
        CbLog log;
        CbTime tb;
        L8Plan l8;
        TPlan t;

        tplan(&t, 2, NULL, 2, rows);
        assert_int_equal(capbound_planned(&t.p, 0, 1, 1, c2, 2, 0, 0, &pl), 0);
        assert_true(fabs(pl.step_s - 4) < 1e-9);
        assert_true(pl.bytes.nvme_read == 2 && pl.bytes.nvme_write == 2);
        assert_int_equal(capbound_planned(&t.p, 0, 2, 1, c2, 2, 0, 0, &pl), 0);
        assert_true(fabs(pl.step_s - 2) < 1e-9);
        assert_int_equal(capbound_planned(&t.p, 0, 1, 1, c2, 0, 0, 0, &pl), 0);
        assert_true(fabs(pl.step_s - 2) < 1e-9);
        /* two phases held do not fit one place */
        assert_int_equal(capbound_planned(&t.p, 0, 1, 2, c2, 2, 0, 0, &pl), -E2BIG);
        /* bad input */
        assert_int_equal(capbound_planned(&t.p, 0, 1, 3, c2, 2, 0, 0, &pl), -EINVAL);
        assert_int_equal(capbound_planned(&t.p, 0, 1, 1, NULL, 2, 0, 0, &pl), -EINVAL);
        assert_int_equal(capbound_planned(&t.p, 0, 1, 1, c2, -1, 0, 0, &pl), -EINVAL);
        assert_int_equal(capbound_planned(NULL, 0, 1, 1, c2, 2, 0, 0, &pl), -EINVAL);
        assert_int_equal(cb_simulate_log(&t.p, 0, 1, CB_RULE_FARTHEST, 1, 0, 0, 0, NULL, 256, &pl.bytes, NULL),
                         -EINVAL);
        assert_int_equal(cb_simulate_log(&t.p, 0, 1, CB_RULE_FARTHEST, 1, 0, 1, 101, NULL, 256, &pl.bytes, &log),
                         -EINVAL);
        c2[1] = NAN;
        assert_int_equal(capbound_planned(&t.p, 0, 1, 1, c2, 2, 0, 0, &pl), -EINVAL);
        {
                /*
                 * A drained copy gates the phase that reads it: A read and written in host
                 * (1.5 s), B written in host, read in VRAM (0.5 s), then A written in VRAM
                 * while B is read in host, B written in VRAM; one place each, 1 byte/s of
                 * link.  B goes up between phases 1 and 2 (1 s), and A, which phase 4's
                 * place for B drains to host, comes down between phases 3 and 0 (1 s):
                 * 4 s (3 s before that was kept: phase 0 ran while A was still draining).
                 */
                static const int drain[5][13] = { { 0, H, RW, -1 }, { 1, H, W, -1 }, { 1, V, R, -1 },
                                                  { 0, V, W, 1, H, R, -1 }, { 1, V, W, -1 } };
                double c5[5] = { 1.5, 0, 0.5, 0, 0 };

                tplan(&t, 2, NULL, 5, drain);
                assert_int_equal(capbound_planned(&t.p, 1, 1, 1, c5, 3.5, 1, 0, &pl), 0);
                assert_true(fabs(pl.step_s - 4) < 1e-9);
        }

        l8_plan(&l8);
        assert_int_equal(capbound_time(&l8.p, 6, 12, l8.compute, 1, 1, &tb), 0);
        for (unsigned held = 1; held <= 2; held++) {
                assert_int_equal(capbound_planned(&l8.p, 6, 12, held, l8.compute, 1, 1, 0, &pl), 0);
                assert_int_equal(capbound_planned(&l8.p, 6, 12, held, l8.compute, 1, 1, 20, &more), 0);
                print_message("8 layers, %u held: planned %.2f s (%.0f NVMe bytes), with 20 perturbed %.2f s; "
                              "time bound %.2f s\n", held, pl.step_s, pl.bytes.nvme_read + pl.bytes.nvme_write,
                              more.step_s, tb.step_s);
                assert_true(isfinite(pl.step_s) && pl.step_s >= tb.step_s - 1e-9);
                assert_true(more.step_s <= pl.step_s);
                if (held == 1)  /* built for time (test_planned_built()) */
                        assert_true(fabs(pl.step_s - 42) < 1e-9 && pl.built);
        }
}

/*
 * Random tiny plans with random compute and bandwidths: every planned
 * schedule runs (no wait in a cycle) and is never faster than the
 * time-aware bound with room, crossings and gaps (capbound_window(), at or
 * above capbound_time()), which holds for every schedule.
 */
static void test_planned_random(void **state) {
        unsigned seed = 777, timed = 0;

        for (int iter = 0; iter < 400; iter++) {
                int rows[6][13];
                size_t n_phases = 2 + (size_t) (rand_r(&seed) % 5), n_tensors = 2 + (size_t) (rand_r(&seed) % 2);
                uint64_t size[3];
                uint64_t vc = (uint64_t) (rand_r(&seed) % 4), hc = 1 + (uint64_t) (rand_r(&seed) % 4);
                double compute[6], bw = 0.5 + (double) (rand_r(&seed) % 4), lbw = (double) (rand_r(&seed) % 3);
                CbPlanned pl;
                CbWindow wb;
                TPlan t;
                int r;

                random_plan(&seed, &t, rows, size, n_tensors, n_phases, compute);
                for (unsigned held = 1; held <= 2; held++) {
                        r = capbound_planned(&t.p, vc, hc, held, compute, bw, lbw, 4, &pl);
                        if (r == -E2BIG)
                                continue;
                        if (r != 0) {
                                for (size_t k = 0; k < n_phases; k++) {
                                        for (size_t x = 0; rows[k][x] >= 0; x += 3)
                                                print_message("t%d %s %d  ", rows[k][x], rows[k][x + 1] == V ? "V" : "H",
                                                              rows[k][x + 2]);
                                        print_message("(compute %g)\n", compute[k]);
                                }
                                print_message("caps %" PRIu64 " %" PRIu64 " sizes %" PRIu64 " %" PRIu64 " %" PRIu64
                                              ", bandwidths %g %g\n", vc, hc, size[0], size[1], size[2], bw, lbw);
                                fail_msg("plan %d, %u held: capbound_planned() = %d", iter, held, r);
                        }
                        assert_int_equal(capbound_window(&t.p, vc, hc, compute, bw, lbw, &wb), 0);
                        if (pl.step_s < wb.step_s - 1e-9)
                                fail_msg("plan %d, %u held: planned %g s below the time-aware bound %g s", iter, held,
                                         pl.step_s, wb.step_s);
                        timed++;
                }
        }
        print_message("%u random plans timed\n", timed);
        assert_true(timed > 250);
}

/*
 * The plan of waits with a burst: the 8-layer plan, whose burst of reads
 * starts at opt_0 (phase 16).  Six of the eight O's must wait on NVMe, and
 * every O's wait spans a whole step, so the bytes do not choose which:
 * from phase 16 the plan keeps O0 and O1, those the burst uses first, and
 * sends O2 .. O7, whose reads then have the most time (without a burst it
 * keeps O0 and O7).
 */
static void test_place_gaps_burst(void **state) {
        L8Plan l8;
        uint8_t *out = NULL;
        unsigned mask = 0;

        l8_plan(&l8);
        assert_int_equal(cb_place_gaps_from(&l8.p, 6, 12, 1, 16, &out), 0);
        for (size_t i = 0; i < l8.p.start[24]; i++)
                if (out[i]) {
                        assert_int_equal(l8.acc[i].tensor % 3, 2);
                        mask |= 1u << (l8.acc[i].tensor / 3);
                }
        assert_int_equal(mask, 0xfc);
        free(out);
        assert_int_equal(cb_place_gaps_from(&l8.p, 6, 12, 1, SIZE_MAX, &out), 0);
        mask = 0;
        for (size_t i = 0; i < l8.p.start[24]; i++)
                if (out[i])
                        mask |= 1u << (l8.acc[i].tensor / 3);
        assert_int_equal(mask, 0x7e);
        free(out);
}

/*
 * cb_build_log() by hand: A and B read and written in host, one place.
 * Nothing can be kept, so each phase reads its tensor back and the other
 * is written down and leaves: phase 0 READ A, WRITE B, DROP B; phase 1
 * READ B, WRITE A, DROP A; a step starts with B in host and A on NVMe.
 * At 2 bytes/s that is 4 s a step, as the rules' schedule.
 */
static void test_build_by_hand(void **state) {
        static const int rows[2][13] = { { 0, H, RW, -1 }, { 1, H, RW, -1 } };
        static const uint8_t kinds[6] = { CB_EV_READ, CB_EV_WRITE, CB_EV_DROP, CB_EV_READ, CB_EV_WRITE, CB_EV_DROP };
        static const uint32_t tensors[6] = { 0, 1, 1, 1, 0, 0 };
        double c2[2] = { 1, 1 }, step;
        uint8_t out[2] = { 1, 1 };
        CbLog log;
        TPlan t;

        tplan(&t, 2, NULL, 2, rows);
        assert_int_equal(cb_build_log(&t.p, 0, 1, 1, out, 0, &log), 0);
        assert_int_equal(log.n, 6);
        assert_int_equal(log.steps, 1);
        for (size_t i = 0; i < 6; i++) {
                assert_int_equal(log.ev[i].kind, kinds[i]);
                assert_int_equal(log.ev[i].tensor, tensors[i]);
                assert_int_equal(log.ev[i].phase, i / 3);
        }
        assert_int_equal(log.st0[0], 4);        /* B_NVME */
        assert_int_equal(log.st0[1], 2);        /* B_HOST */
        assert_int_equal(cb_timed_log(&t.p, &log, 0, 1, c2, 2, 0, SIZE_MAX, &step), 0);
        assert_true(fabs(step - 4) < 1e-9);
        cb_log_free(&log);
        /* two places: both kept, nothing moves once in place */
        out[0] = out[1] = 0;
        assert_int_equal(cb_build_log(&t.p, 0, 2, 1, out, 0, &log), 0);
        assert_int_equal(log.n, 0);
        cb_log_free(&log);
        /* bad input; a phase that does not fit */
        assert_int_equal(cb_build_log(&t.p, 0, 1, 3, out, 0, &log), -EINVAL);
        assert_int_equal(cb_build_log(&t.p, 0, 1, 1, NULL, 0, &log), -EINVAL);
        assert_int_equal(cb_build_log(&t.p, 0, 1, 1, out, 0, NULL), -EINVAL);
        assert_int_equal(cb_build_log(&t.p, 0, 0, 1, out, 0, &log), -E2BIG);
}

/*
 * A copy moves only once the phase that wrote it has ended, even where no
 * stale copy's departure marks that end (hand-made logs, one tensor of 1
 * byte, VRAM 1, host 1, phases of 1 s, 1 byte/s).  Written in VRAM in
 * phase 0 and read in host in phase 1, it goes down after phase 0 and up
 * again while phase 1 runs: 3 s a step, not 2 (the DOWN overlapping the
 * phase that writes it).  Written in host and read in VRAM, the same with
 * the UP.  Two tensors taking turns in one host place, written to NVMe
 * after their write and read back: 6 s (each phase waits for a write and
 * a read).
 */
static void test_timed_waits_for_write(void **state) {
        static const int down_rows[2][13] = { { 0, V, RW, -1 }, { 0, H, R, -1 } };
        static const int up_rows[2][13] = { { 0, H, RW, -1 }, { 0, V, R, -1 } };
        static const int nvme_rows[2][13] = { { 0, H, RW, -1 }, { 1, H, RW, -1 } };
        CbEvent down_ev[4] = { { 0, 0, CB_EV_UP, V }, { 0, 0, CB_EV_DROP, H }, { 0, 1, CB_EV_DOWN, H },
                               { 0, 1, CB_EV_DROP, V } };
        CbEvent up_ev[4] = { { 0, 0, CB_EV_DOWN, H }, { 0, 0, CB_EV_DROP, V }, { 0, 1, CB_EV_UP, V },
                             { 0, 1, CB_EV_DROP, H } };
        CbEvent nvme_ev[6] = { { 1, 0, CB_EV_WRITE, H }, { 1, 0, CB_EV_DROP, H }, { 0, 0, CB_EV_READ, H },
                               { 0, 1, CB_EV_WRITE, H }, { 0, 1, CB_EV_DROP, H }, { 1, 1, CB_EV_READ, H } };
        uint8_t host0[2] = { B_HOST, 0 }, vram0[2] = { B_VRAM, 0 }, nvme0[2] = { B_NVME, B_HOST };
        CbLog down = { .ev = down_ev, .n = 4, .steps = 1, .st0 = host0 };
        CbLog up = { .ev = up_ev, .n = 4, .steps = 1, .st0 = vram0 };
        CbLog nvme = { .ev = nvme_ev, .n = 6, .steps = 1, .st0 = nvme0 };
        double c2[2] = { 1, 1 }, step[3];
        TPlan t;

        tplan(&t, 1, NULL, 2, down_rows);
        assert_int_equal(cb_timed_log(&t.p, &down, 1, 1, c2, 0, 1, SIZE_MAX, &step[0]), 0);
        tplan(&t, 1, NULL, 2, up_rows);
        assert_int_equal(cb_timed_log(&t.p, &up, 1, 1, c2, 0, 1, SIZE_MAX, &step[1]), 0);
        tplan(&t, 2, NULL, 2, nvme_rows);
        assert_int_equal(cb_timed_log(&t.p, &nvme, 0, 1, c2, 1, 0, SIZE_MAX, &step[2]), 0);
        if (fabs(step[0] - 3) > 1e-9 || fabs(step[1] - 3) > 1e-9 || fabs(step[2] - 6) > 1e-9)
                fail_msg("a step of VRAM write then DOWN %g s (not 3), host write then UP %g s (not 3), "
                         "host write then WRITE to NVMe %g s (not 6)", step[0], step[1], step[2]);
}

/*
 * Built schedules on the 8-layer plan (NVMe 1 byte/s): held one phase,
 * the rules' fastest schedule takes 44 s a step at 1 byte/s of link and
 * 34.95 s at 2.5 (16 and 14 NVMe transfers); the fastest built from a plan
 * of waits moves the floor's 12 and takes 42 s (no place spare) and, the
 * one that keeps O0 and O1 (the burst's first), one place spare, 32.4 s
 * (its writes wait for the burst's reads at 2.5).  Holding two, the rules' schedules stay the
 * fastest (test_planned()).  Every built schedule, with writes deferred or
 * not: never below the time-aware bound (26.5 s).
 */
static void test_planned_built(void **state) {
        static const size_t defers[4] = { SIZE_MAX, 0, 1, 2 };
        CbPlanned pl;
        L8Plan l8;

        l8_plan(&l8);
        /* at 1 byte/s of link: test_planned() */
        assert_int_equal(capbound_planned(&l8.p, 6, 12, 1, l8.compute, 1, 2.5, 0, &pl), 0);
        assert_true(fabs(pl.step_s - 32.4) < 1e-9);
        assert_true(pl.built && pl.slack == 1 && pl.defer == 1);
        assert_true(pl.bytes.nvme_read == 6 && pl.bytes.nvme_write == 6);
        for (unsigned held = 1; held <= 2; held++)
                for (uint64_t slack = 0; slack < 2; slack++) {
                        uint8_t *out = NULL;
                        CbLog log;

                        assert_int_equal(cb_place_gaps_from(&l8.p, 6, 12, held, 16, &out), 0);
                        assert_int_equal(cb_build_log(&l8.p, 6, 12, held, out, slack, &log), 0);
                        for (size_t d = 0; d < ELEMENTSOF(defers); d++) {
                                double step;

                                assert_int_equal(cb_timed_log(&l8.p, &log, 6, 12, l8.compute, 1, 1, defers[d], &step), 0);
                                assert_true(step >= 26.5 - 1e-9);
                        }
                        cb_log_free(&log);
                        free(out);
                }
}

/*
 * Random tiny plans: every built schedule is one of the model's (each use
 * finds its copy: cb_build_log() never answers -EPROTO) and, with writes
 * deferred or not, never faster than the time-aware bound (capbound_window()).
 */
static void test_build_random(void **state) {
        static const size_t defers[2] = { SIZE_MAX, 1 };
        unsigned seed = 4242, built = 0;

        for (int iter = 0; iter < 200; iter++) {
                int rows[6][13];
                size_t n_phases = 2 + (size_t) (rand_r(&seed) % 5), n_tensors = 2 + (size_t) (rand_r(&seed) % 2);
                uint64_t size[3], vc = (uint64_t) (rand_r(&seed) % 4), hc = 1 + (uint64_t) (rand_r(&seed) % 4);
                double compute[6], bw = 0.5 + (double) (rand_r(&seed) % 4), lbw = (double) (rand_r(&seed) % 3);
                CbWindow wb;
                CbTime tb;
                TPlan t;

                random_plan(&seed, &t, rows, size, n_tensors, n_phases, compute);
                assert_int_equal(capbound_time(&t.p, vc, hc, compute, bw, lbw, &tb), 0);
                assert_int_equal(capbound_window(&t.p, vc, hc, compute, bw, lbw, &wb), 0);
                for (unsigned held = 1; held <= 2; held++)
                        for (unsigned g = 0; g < 2; g++) {
                                uint8_t *out = NULL;
                                CbLog log;
                                int r = cb_place_gaps_from(&t.p, vc, hc, held, g ? tb.from : SIZE_MAX, &out);

                                if (r == -E2BIG)
                                        continue;
                                assert_int_equal(r, 0);
                                r = cb_build_log(&t.p, vc, hc, held, out, g, &log);
                                free(out);
                                if (r == -ENOSPC || r == -E2BIG)
                                        continue;
                                if (r != 0)
                                        fail_msg("plan %d, %u held: cb_build_log() = %d", iter, held, r);
                                for (size_t d = 0; d < ELEMENTSOF(defers); d++) {
                                        double step;

                                        assert_int_equal(cb_timed_log(&t.p, &log, vc, hc, compute, bw, lbw, defers[d],
                                                                      &step), 0);
                                        if (step < wb.step_s - 1e-9)
                                                fail_msg("plan %d, %u held: built %g s below the time-aware bound %g s",
                                                         iter, held, step, wb.step_s);
                                }
                                cb_log_free(&log);
                                built++;
                        }
        }
        print_message("%u built schedules timed\n", built);
        assert_true(built > 250);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_three_in_two),
                cmocka_unit_test(test_write_back_link),
                cmocka_unit_test(test_write_back_nvme),
                cmocka_unit_test(test_dirty_victim),
                cmocka_unit_test(test_all_fits),
                cmocka_unit_test(test_too_big),
                cmocka_unit_test(test_training_plan),
                cmocka_unit_test(test_time_bound),
                cmocka_unit_test(test_window_bound),
                cmocka_unit_test(test_held_pairs),
                cmocka_unit_test(test_random_vs_exact),
                cmocka_unit_test(test_place_gaps),
                cmocka_unit_test(test_planned),
                cmocka_unit_test(test_planned_random),
                cmocka_unit_test(test_place_gaps_burst),
                cmocka_unit_test(test_build_by_hand),
                cmocka_unit_test(test_timed_waits_for_write),
                cmocka_unit_test(test_planned_built),
                cmocka_unit_test(test_build_random),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
