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

/* Index of event "<@kind><@piece>", or -1. */
static int piece_at(char kind, unsigned piece) {
        char what[16];

        snprintf(what, sizeof(what), "%c%u", kind, piece);
        return event_at(what);
}

/*
 * What the pieces of one chained transfer (the only one on the link) do
 * whatever the timing: each is read (N), started (V) and ended (v) once; a
 * copy starts only once its extent and every one before it are read, after
 * the copy before it ended (the emulated link takes one at a time), and it
 * starts as soon as both are so: in the same turn of the loop as the last
 * of those, so right after it in the record.  That is the pipeline: a copy
 * never waits for the rest of the tensor.  (Whether V(k) comes before
 * N(k+1) depends on how fast the copy is against the paced reads.)
 */
static void check_pieces(void) {
        assert_int_equal(n_events, 3 * PIECES);
        for (unsigned k = 0; k < PIECES; k++) {
                int v = piece_at('V', k), last = -1;

                assert_true(v >= 0);
                assert_true(piece_at('v', k) > v);
                for (unsigned i = 0; i <= k; i++) {
                        assert_true(piece_at('N', i) >= 0 && piece_at('N', i) < v);
                        last = MAX(last, piece_at('N', i));
                }
                if (k > 0) {
                        assert_true(piece_at('v', k - 1) < v);
                        last = MAX(last, piece_at('v', k - 1));
                }
                if (v != last + 1)
                        fail_msg("V%u is event %d, not right after event %d (%s)", k, v, last, events[last]);
        }
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
        FIXTURE_RUN_UNTIL(m, r->done);
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
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        for (uint64_t off = 0; off < t->size; off++)
                *copy_addr(&t->copy[LEVEL_HOST], off) = pattern(off);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
        assert_int_equal(fixture_op(m, OP_EVICT, t, LEVEL_NVME), 0);
        assert_false(copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_int_equal(t->copy[LEVEL_NVME].n_extents, PIECES);
        n_events = 0;
}

/* The reads and the VRAM starts, named by tensor: "NA0": A's extent 0 read, "VA0": its piece 0 going to the link. */
static void observe_named(void *userdata, const Tensor *t, LinkDir link, uint32_t piece, bool done) {
        (void) userdata;
        if ((link == LINK_HOST_TO_VRAM && done) || n_events >= 64)
                return;
        snprintf(events[n_events++], sizeof(events[0]), "%c%s%u", link == LINK_NVME_TO_HOST ? 'N' : 'V', t->name,
                 piece);
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

        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);

        /*
         * Here the link is ~600x faster than the paced NVMe, so the record is
         * mostly N0 V0 v0 N1 V1 v1 ...; what is checked holds however late a
         * copy ends.
         */
        check_pieces();

        /* both copies resident and byte for byte right; each hop counted once, whole */
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_true(copy_valid(t, LEVEL_VRAM));
        assert_int_equal(t->copy[LEVEL_VRAM].pins, 1);
        for (uint64_t off = 0; off < t->size; off++)
                if (fixture_byte(t, LEVEL_VRAM, off) != pattern(off))
                        fail_msg("VRAM byte %llu is %u, not %u", (unsigned long long) off,
                                 fixture_byte(t, LEVEL_VRAM, off), pattern(off));
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].bytes - nh, t->alloc_size);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes - hv, t->alloc_size);
        assert_int_equal(j->link_bytes[LINK_HOST_TO_VRAM], t->alloc_size);
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 0);
        assert_int_equal(m->engine->n_xfers, 0);

        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/*
 * Two jobs of equal weight each pin a tensor from NVMe into VRAM: each
 * piece waits on the link by its own fair tag, so the jobs' pieces take
 * turns (A0 B0 A1 B1 ...) instead of A's whole tensor going first.
 *
 * Checked from the record whatever the timing: both jobs are new and their
 * pieces of one size, so piece k of either has the tag k x PIECE (fairq.h;
 * the credit is far larger than these tensors), and the link starts the
 * smallest tag waiting, equal ones first come first served.  So a job's
 * piece never starts while the other job has a piece of a lower index
 * waiting (read, with all before it, and not started): neither job gets two
 * pieces in a row while the other has one of an earlier turn queued.  Which
 * of two equal tags came first depends on when the reads ended.
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

        assert_int_equal(op_submit(m->engine, OP_PIN, a, LEVEL_VRAM, on_complete, NULL, &ra, NULL), 0);
        assert_int_equal(op_submit(m->engine, OP_PIN, b, LEVEL_VRAM, on_complete, NULL, &rb, NULL), 0);
        run_until(m, &ra);
        run_until(m, &rb);
        assert_int_equal(ra.status, 0);
        assert_int_equal(rb.status, 0);
        {
                bool read[2][PIECES] = { { false } };
                unsigned started[2] = { 0, 0 }, contested = 0;

                assert_int_equal(n_events, 4 * PIECES);
                for (unsigned i = 0; i < n_events; i++) {
                        unsigned x = events[i][1] == 'A' ? 0 : 1, y = 1 - x, k = (unsigned) atoi(events[i] + 2);
                        unsigned waits = 0;     /* y's pieces read (all before them too) and not started */

                        assert_true(events[i][1] == 'A' || events[i][1] == 'B');
                        assert_true(k < PIECES);
                        if (events[i][0] == 'N') {
                                read[x][k] = true;
                                continue;
                        }
                        /* x's pieces go in order, each once its extent and all before it are read */
                        assert_int_equal(k, started[x]);
                        for (unsigned p = 0; p <= k; p++)
                                assert_true(read[x][p]);
                        while (started[y] + waits < PIECES && read[y][started[y] + waits])
                                waits++;
                        if (waits > 0) {
                                contested++;
                                if (started[y] < k)
                                        fail_msg("event %u: %s started while piece %u of the other job waited",
                                                 i, events[i], started[y]);
                        }
                        started[x]++;
                }
                assert_int_equal(started[0], PIECES);
                assert_int_equal(started[1], PIECES);
                /* the reads (unthrottled) end long before the link (~130 ms a piece) is through: the jobs met */
                assert_true(contested > 0);
        }
        assert_int_equal(ja->link_bytes[LINK_HOST_TO_VRAM], a->alloc_size);
        assert_int_equal(jb->link_bytes[LINK_HOST_TO_VRAM], b->alloc_size);
        assert_int_equal(fixture_byte(b, LEVEL_VRAM, 3 * PIECE + 77), pattern(3 * PIECE + 77));

        assert_int_equal(tensor_unpin(a, LEVEL_VRAM, false), 0);
        assert_int_equal(tensor_unpin(b, LEVEL_VRAM, false), 0);
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

        assert_int_equal(op_submit(m->engine, OP_PREFETCH, t, LEVEL_VRAM, on_complete, NULL, &r, &op), 0);
        op->no_wait = true;
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        check_pieces();
        assert_true(copy_valid(t, LEVEL_VRAM));
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_int_equal(fixture_byte(t, LEVEL_VRAM, t->size - 1), pattern(t->size - 1));

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
        assert_int_equal(fixture_op(m, OP_PIN, big, LEVEL_VRAM), 0);    /* the job's whole VRAM, pinned */
        n_events = 0;

        assert_int_equal(op_submit(m->engine, OP_PREFETCH, t, LEVEL_VRAM, on_complete, NULL, &r, &op), 0);
        op->no_wait = true;
        run_until(m, &r);
        assert_true(r.status < 0);
        assert_int_equal(n_events, 0);          /* not chained */
        assert_true(copy_valid(t, LEVEL_HOST));  /* staged */
        assert_int_equal(t->copy[LEVEL_VRAM].state, COPY_ABSENT);
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 12345), pattern(12345));

        assert_int_equal(tensor_unpin(big, LEVEL_VRAM, false), 0);
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
        vram_used = j->used[LEVEL_VRAM];
        host_used = j->used[LEVEL_HOST];

        t->copy[LEVEL_NVME].extents[2].crc ^= 1;
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EIO);
        assert_non_null(strstr(r.error, "crc32c mismatch in extent 2"));
        /* pieces 0 and 1 were copied on, nothing after the bad one */
        assert_true(event_at("V0") >= 0 && event_at("V1") >= 0);
        assert_int_equal(event_at("N2"), -1);
        assert_int_equal(event_at("V2"), -1);
        assert_int_equal(event_at("V3"), -1);
        /* neither copy is valid, both reservations are gone, nothing is counted */
        assert_int_equal(t->copy[LEVEL_VRAM].state, COPY_ABSENT);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_int_equal(j->used[LEVEL_VRAM], vram_used);
        assert_int_equal(j->used[LEVEL_HOST], host_used);
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].bytes, nh);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes, hv);
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 0);
        assert_true(list_empty(&m->engine->vlink.waiting[VRAM_TO_DEVICE]));
        assert_int_equal(m->engine->n_xfers, 0);

        /* repaired, the same pin goes through */
        t->copy[LEVEL_NVME].extents[2].crc ^= 1;
        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(fixture_byte(t, LEVEL_VRAM, 2 * PIECE + 5), pattern(2 * PIECE + 5));
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, false), 0);
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

        t->copy[LEVEL_NVME].extents[0].crc ^= 1;
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_complete, on_reserved, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EIO);
        for (unsigned i = 0; i < n_events; i++)
                assert_int_equal(events[i][0], 'N');    /* later extents were read, none went on */
        assert_int_equal(t->copy[LEVEL_VRAM].state, COPY_ABSENT);
        assert_int_equal(t->copy[LEVEL_VRAM].pins, 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(j->used[LEVEL_VRAM], 0);

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

        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EIO);
        assert_non_null(strstr(r.error, "VRAM copy failed"));
        assert_true(event_at("v1") >= 0);
        assert_int_equal(event_at("V2"), -1);  /* nothing more went after the failure */
        assert_int_equal(t->copy[LEVEL_VRAM].state, COPY_ABSENT);
        assert_int_equal(j->used[LEVEL_VRAM], 0);
        assert_true(copy_valid(t, LEVEL_HOST));
        assert_int_equal(fixture_byte(t, LEVEL_HOST, 3 * PIECE + 1), pattern(3 * PIECE + 1));
        /* the NVMe hop counts, the VRAM one does not */
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].bytes - nh, t->alloc_size);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes, hv);
        assert_int_equal(m->engine->n_xfers, 0);

        /* the fault fired once: again, from host now */
        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_VRAM, on_complete, NULL, &r, NULL), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(fixture_byte(t, LEVEL_VRAM, PIECE + 9), pattern(PIECE + 9));
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, false), 0);
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
