/* SPDX-License-Identifier: MIT */
/* test-pipe.c: chained NVMe -> host -> VRAM transfers, piece by piece: order, bytes, counters, failures. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "tests/unit/fixture.h"

#define KiB (1024ull)
#define PIECE (512 * KiB)       /* [nvme] extent_size here: a piece */
#define PIECES 4

/* ---- what the pieces did, in order ------------------------------------------------------- */

static char events[64][16];
static unsigned n_events;

/* "N<k>": extent k read and checked; "V<k>": its VRAM copy started; "v<k>": that copy done. */
static void observe(void *userdata, const Tensor *t, LinkDir link, uint32_t piece, bool done) {
        (void) userdata;
        (void) t;
        if (n_events < 64)
                snprintf(events[n_events++], sizeof(events[0]), "%c%u",
                         link == LINK_NVME_TO_HOST ? 'N' : done ? 'v' : 'V', piece);
}

/* Index of event @what, or -1. */
static int event_at(const char *what) {
        for (unsigned i = 0; i < n_events; i++)
                if (strcmp(events[i], what) == 0)
                        return (int) i;
        return -1;
}

typedef struct Result {
        int done;
        int status;
        char error[160];
} Result;

static void on_complete(Op *op, int status, const char *error) {
        Result *r = op->userdata;

        r->done++;
        r->status = status;
        snprintf(r->error, sizeof(r->error), "%s", error ? error : "");
}

static void run_until(Manager *m, Result *r) {
        for (int i = 0; i < 1000 && !r->done; i++)
                assert_true(sd_event_run(m->event, 1000) >= 0);
        assert_int_equal(r->done, 1);
}

/* ---- fixtures ---------------------------------------------------------------------------- */

/* NVMe paced at 8 MB/s (a 512K extent every ~65 ms), the emulated link unthrottled (~0.1 ms a piece). */
static void setup(Config *c, void *userdata) {
        (void) userdata;
        c->nvme_extent_size = PIECE;
        c->nvme_bandwidth = 8000000;
        c->vram_bandwidth = 0;
}

static Manager *new_manager(void) {
        Manager *m = fixture_new(64 * MiB, setup, NULL);

        m->engine->piece_observer = observe;
        n_events = 0;
        return m;
}

static uint8_t pattern(uint64_t off) {
        return (uint8_t) (off * 7 + off / 4096);
}

/* @t (2 MiB) holds pattern() and lives only on NVMe. */
static void on_nvme_with_pattern(Manager *m, Tensor *t) {
        assert_int_equal(fixture_op(m, OP_PIN, t, TIER_HOST), 0);
        for (uint64_t off = 0; off < t->size; off++)
                *copy_addr(&t->copy[TIER_HOST], off) = pattern(off);
        assert_int_equal(tensor_unpin(t, TIER_HOST, true), 0);
        assert_int_equal(fixture_op(m, OP_EVICT, t, TIER_NVME), 0);
        assert_false(copy_valid(t, TIER_HOST));
        assert_true(copy_valid(t, TIER_NVME));
        assert_int_equal(t->copy[TIER_NVME].n_extents, PIECES);
        n_events = 0;
}

/* Only the VRAM starts, named by tensor: "A0" is A's piece 0 going to the link. */
static void observe_named(void *userdata, const Tensor *t, LinkDir link, uint32_t piece, bool done) {
        (void) userdata;
        if (link != LINK_HOST_TO_VRAM || done || n_events >= 64)
                return;
        snprintf(events[n_events++], sizeof(events[0]), "%s%u", t->name, piece);
}

/* NVMe unthrottled, the emulated link slow (4 MB/s: ~130 ms a piece): the pieces wait for the link. */
static void setup_slow_link(Config *c, void *userdata) {
        (void) userdata;
        c->nvme_extent_size = PIECE;
        c->nvme_bandwidth = 0;
        c->vram_bandwidth = 4000000;
}

/* ---- the interleaving ---------------------------------------------------------------------- */

static void test_piece_order(void **state) {
        Manager *m = new_manager();
        uint64_t nh = m->engine->links[LINK_NVME_TO_HOST].bytes, hv = m->engine->links[LINK_HOST_TO_VRAM].bytes;
        Result r = {};
        Job *j;
        Tensor *t;

        (void) state;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", PIECES * PIECE);
        on_nvme_with_pattern(m, t);

        assert_int_equal(op_submit(m->engine, OP_PIN, t, TIER_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);

        /*
         * Each piece's VRAM copy starts once its extent is read, and ends long
         * before the next extent arrives (the link is ~600x faster here than
         * the paced NVMe): N0 V0 N1 V1 ..., i.e. V(k) runs while N(k+1) is
         * still being read.  (The ends, v(k), are checked apart: they are
         * the emulated link's thread's.)
         */
        {
                static const char *want[] = { "N0", "V0", "N1", "V1", "N2", "V2", "N3", "V3" };
                unsigned n = 0;

                assert_int_equal(n_events, 12);
                for (unsigned i = 0; i < n_events; i++)
                        if (events[i][0] != 'v') {
                                assert_true(n < 8);
                                assert_string_equal(events[i], want[n++]);
                        }
                assert_int_equal(n, 8);
                for (unsigned k = 0; k < PIECES; k++) {
                        char v[8], d[8];

                        snprintf(v, sizeof(v), "V%u", k);
                        snprintf(d, sizeof(d), "v%u", k);
                        assert_true(event_at(v) < event_at(d));
                }
        }
        /* what makes it a pipeline, whatever the timing: no VRAM copy before its extent, V0 before the last read */
        for (unsigned k = 0; k < PIECES; k++) {
                char n[8], v[8];

                snprintf(n, sizeof(n), "N%u", k);
                snprintf(v, sizeof(v), "V%u", k);
                assert_true(event_at(n) >= 0 && event_at(n) < event_at(v));
        }
        assert_true(event_at("V0") < event_at("N3"));

        /* both copies resident and byte for byte right; each hop counted once, whole */
        assert_true(copy_valid(t, TIER_HOST));
        assert_true(copy_valid(t, TIER_VRAM));
        assert_int_equal(t->copy[TIER_VRAM].pins, 1);
        for (uint64_t off = 0; off < t->size; off++)
                if (fixture_byte(t, TIER_VRAM, off) != pattern(off))
                        fail_msg("VRAM byte %llu is %u, not %u", (unsigned long long) off,
                                 fixture_byte(t, TIER_VRAM, off), pattern(off));
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].bytes - nh, t->alloc_size);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes - hv, t->alloc_size);
        assert_int_equal(j->link_bytes[LINK_HOST_TO_VRAM], t->alloc_size);
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 0);
        assert_int_equal(m->engine->n_xfers, 0);

        assert_int_equal(tensor_unpin(t, TIER_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * Two jobs of equal weight each pin a tensor from NVMe into VRAM: each
 * piece waits on the link by its own fair tag, so the jobs' pieces take
 * turns (A0 B0 A1 B1 ...) instead of A's whole tensor going first.
 */
static void test_fair_pieces(void **state) {
        Manager *m = fixture_new(64 * MiB, setup_slow_link, NULL);
        Result ra = {}, rb = {};
        Job *ja, *jb;
        Tensor *a, *b;

        (void) state;
        assert_int_equal(job_new(m->registry, "ja", 0, &ja), 0);
        assert_int_equal(job_new(m->registry, "jb", 0, &jb), 0);
        assert_int_equal(ja->weight, jb->weight);
        a = fixture_tensor(ja, "A", PIECES * PIECE);
        b = fixture_tensor(jb, "B", PIECES * PIECE);
        on_nvme_with_pattern(m, a);
        on_nvme_with_pattern(m, b);
        m->engine->piece_observer = observe_named;
        n_events = 0;

        assert_int_equal(op_submit(m->engine, OP_PIN, a, TIER_VRAM, on_complete, NULL, &ra, NULL), 0);
        assert_int_equal(op_submit(m->engine, OP_PIN, b, TIER_VRAM, on_complete, NULL, &rb, NULL), 0);
        run_until(m, &ra);
        run_until(m, &rb);
        assert_int_equal(ra.status, 0);
        assert_int_equal(rb.status, 0);
        {
                static const char *want[] = { "A0", "B0", "A1", "B1", "A2", "B2", "A3", "B3" };

                assert_int_equal(n_events, 8);
                for (unsigned i = 0; i < 8; i++)
                        assert_string_equal(events[i], want[i]);
        }
        assert_int_equal(ja->link_bytes[LINK_HOST_TO_VRAM], a->alloc_size);
        assert_int_equal(jb->link_bytes[LINK_HOST_TO_VRAM], b->alloc_size);
        assert_int_equal(fixture_byte(b, TIER_VRAM, 3 * PIECE + 77), pattern(3 * PIECE + 77));

        assert_int_equal(tensor_unpin(a, TIER_VRAM, false), 0);
        assert_int_equal(tensor_unpin(b, TIER_VRAM, false), 0);
        job_destroy(ja);
        job_destroy(jb);
        fixture_free(m);
}

/* A scheduler's prefetch (no_wait: host is staged first) is chained too, when VRAM has room. */
static void test_prefetch_chained(void **state) {
        Manager *m = new_manager();
        Result r = {};
        Op *op;
        Job *j;
        Tensor *t;

        (void) state;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", PIECES * PIECE);
        on_nvme_with_pattern(m, t);

        assert_int_equal(op_submit(m->engine, OP_PREFETCH, t, TIER_VRAM, on_complete, NULL, &r, &op), 0);
        op->no_wait = true;
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(n_events, 12);
        assert_true(event_at("V0") < event_at("N3"));
        assert_true(copy_valid(t, TIER_VRAM));
        assert_true(copy_valid(t, TIER_HOST));
        assert_int_equal(fixture_byte(t, TIER_VRAM, t->size - 1), pattern(t->size - 1));

        job_destroy(j);
        fixture_free(m);
}

/* A prefetch that finds no VRAM room stages into host alone, as before, and fails holding only that. */
static void test_prefetch_no_vram_room_stages(void **state) {
        Manager *m = new_manager();
        Result r = {};
        Op *op;
        Job *j;
        Tensor *t, *big;

        (void) state;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", PIECES * PIECE);
        big = fixture_tensor(j, "big", 2 * MiB);
        on_nvme_with_pattern(m, t);
        assert_int_equal(fixture_op(m, OP_PIN, big, TIER_VRAM), 0);    /* the job's whole VRAM, pinned */
        n_events = 0;

        assert_int_equal(op_submit(m->engine, OP_PREFETCH, t, TIER_VRAM, on_complete, NULL, &r, &op), 0);
        op->no_wait = true;
        run_until(m, &r);
        assert_true(r.status < 0);
        assert_int_equal(n_events, 0);          /* not chained */
        assert_true(copy_valid(t, TIER_HOST));  /* staged */
        assert_int_equal(t->copy[TIER_VRAM].state, COPY_ABSENT);
        assert_int_equal(fixture_byte(t, TIER_HOST, 12345), pattern(12345));

        assert_int_equal(tensor_unpin(big, TIER_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/* ---- failures ------------------------------------------------------------------------------- */

/* The third extent's checksum fails: the pieces before it went to VRAM, yet no copy is valid and all room is back. */
static void test_bad_extent_mid_tensor(void **state) {
        Manager *m = new_manager();
        uint64_t nh = m->engine->links[LINK_NVME_TO_HOST].bytes, hv = m->engine->links[LINK_HOST_TO_VRAM].bytes;
        uint64_t vram_used, host_used;
        Result r = {};
        Job *j;
        Tensor *t;

        (void) state;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", PIECES * PIECE);
        on_nvme_with_pattern(m, t);
        vram_used = j->used[TIER_VRAM];
        host_used = j->used[TIER_HOST];

        t->copy[TIER_NVME].extents[2].crc ^= 1;
        assert_int_equal(op_submit(m->engine, OP_PIN, t, TIER_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EBADMSG);
        assert_non_null(strstr(r.error, "crc32c mismatch in extent 2"));
        /* pieces 0 and 1 were copied on, nothing after the bad one */
        assert_true(event_at("V0") >= 0 && event_at("V1") >= 0);
        assert_int_equal(event_at("N2"), -1);
        assert_int_equal(event_at("V2"), -1);
        assert_int_equal(event_at("V3"), -1);
        /* neither copy is valid, both reservations are gone, nothing is counted */
        assert_int_equal(t->copy[TIER_VRAM].state, COPY_ABSENT);
        assert_int_equal(t->copy[TIER_HOST].state, COPY_ABSENT);
        assert_true(copy_valid(t, TIER_NVME));
        assert_int_equal(j->used[TIER_VRAM], vram_used);
        assert_int_equal(j->used[TIER_HOST], host_used);
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].bytes, nh);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes, hv);
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 0);
        assert_true(list_empty(&m->engine->vlink.waiting[VRAM_TO_DEVICE]));
        assert_int_equal(m->engine->n_xfers, 0);

        /* repaired, the same pin goes through */
        t->copy[TIER_NVME].extents[2].crc ^= 1;
        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, TIER_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(fixture_byte(t, TIER_VRAM, 2 * PIECE + 5), pattern(2 * PIECE + 5));
        assert_int_equal(tensor_unpin(t, TIER_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

static void on_reserved(Op *op) {
        (void) op;
}

/* An async pin holds the VRAM copy while it fills: a failed read leaves it to the op, which frees it. */
static void test_bad_extent_async_pin(void **state) {
        Manager *m = new_manager();
        Result r = {};
        Job *j;
        Tensor *t;

        (void) state;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", PIECES * PIECE);
        on_nvme_with_pattern(m, t);

        t->copy[TIER_NVME].extents[0].crc ^= 1;
        assert_int_equal(op_submit(m->engine, OP_PIN, t, TIER_VRAM, on_complete, on_reserved, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EBADMSG);
        for (unsigned i = 0; i < n_events; i++)
                assert_int_equal(events[i][0], 'N');    /* later extents were read, none went on */
        assert_int_equal(t->copy[TIER_VRAM].state, COPY_ABSENT);
        assert_int_equal(t->copy[TIER_VRAM].pins, 0);
        assert_int_equal(t->copy[TIER_HOST].state, COPY_ABSENT);
        assert_int_equal(j->used[TIER_VRAM], 0);

        job_destroy(j);
        fixture_free(m);
}

/* The second piece's VRAM copy fails: the read was good, so host keeps its copy; VRAM has none, its room is back. */
static void test_vram_piece_fails(void **state) {
        Manager *m;
        uint64_t nh, hv;
        Result r = {};
        Job *j;
        Tensor *t;

        (void) state;
        assert_int_equal(setenv("TIERD_TEST_FAULTS", "vram-h2d-eio:after=1,count=1", 1), 0);
        m = new_manager();
        assert_int_equal(unsetenv("TIERD_TEST_FAULTS"), 0);
        nh = m->engine->links[LINK_NVME_TO_HOST].bytes;
        hv = m->engine->links[LINK_HOST_TO_VRAM].bytes;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", PIECES * PIECE);
        on_nvme_with_pattern(m, t);

        assert_int_equal(op_submit(m->engine, OP_PIN, t, TIER_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EIO);
        assert_non_null(strstr(r.error, "VRAM copy failed"));
        assert_true(event_at("v1") >= 0);
        assert_int_equal(event_at("V2"), -1);  /* nothing more went after the failure */
        assert_int_equal(t->copy[TIER_VRAM].state, COPY_ABSENT);
        assert_int_equal(j->used[TIER_VRAM], 0);
        assert_true(copy_valid(t, TIER_HOST));
        assert_int_equal(fixture_byte(t, TIER_HOST, 3 * PIECE + 1), pattern(3 * PIECE + 1));
        /* the NVMe hop counts, the VRAM one does not */
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].bytes - nh, t->alloc_size);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes, hv);
        assert_int_equal(m->engine->n_xfers, 0);

        /* the fault fired once: again, from host now */
        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, TIER_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(fixture_byte(t, TIER_VRAM, PIECE + 9), pattern(PIECE + 9));
        assert_int_equal(tensor_unpin(t, TIER_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_piece_order),
                cmocka_unit_test(test_fair_pieces),
                cmocka_unit_test(test_prefetch_chained),
                cmocka_unit_test(test_prefetch_no_vram_room_stages),
                cmocka_unit_test(test_bad_extent_mid_tensor),
                cmocka_unit_test(test_bad_extent_async_pin),
                cmocka_unit_test(test_vram_piece_fails),
        };

        return fixture_main("pipe", tests, sizeof(tests) / sizeof(tests[0]));
}
