/* SPDX-License-Identifier: MIT */
/* test-large.c: tensors larger than a segment, write-only pins, each "no space" cause, churn. */

/*
 * Each test starts its own tierd: the large tensors need a large pool, the
 * "no space" causes a small one whose state the test controls.  Under
 * valgrind, which does not emulate mremap() with an old size of 0 (how
 * libtier maps a piece of a segment it holds a second time, in place), no
 * tensor may span segments: test_large_tensors is skipped and the churn's
 * tensors stop at one segment; the plain and ASan passes run all of it.
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

static TestDaemon daemon_;

static bool under_valgrind(void) {
        const char *p = getenv("LD_PRELOAD");

        return p && strstr(p, "vgpreload");
}

static void start(const char *config) {
        int r = test_daemon_start(&daemon_, config);

        if (r < 0)
                fail_msg("cannot start tierd: %s", strerror(-r));
}

static int stop(void **state) {
        int r;

        if (daemon_.pid == 0)
                return 0;               /* the test was skipped before it started one */
        r = test_daemon_stop(&daemon_);

        if (r != 0) {
                fprintf(stderr, "tierd did not exit cleanly (status %d)\n", r);
                return -1;
        }
        return 0;
}

static tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(daemon_.socket, job, 0, &c);

        if (r < 0)
                fail_msg("connect: %s (%s)", tier_strerror(r), tier_client_last_error(c));
        return c;
}

static tier_tensor *create(tier_client *c, const char *name, uint64_t size) {
        tier_tensor *t = NULL;
        int r = tier_tensor_create(c, name, size, &t);

        if (r < 0)
                fail_msg("create '%s' (%" PRIu64 " bytes): %s (%s)", name, size, tier_strerror(r),
                         tier_client_last_error(c));
        return t;
}

/* The word at byte @off of tensor @id's pattern: every 8 bytes differ, and differ between tensors. */
static uint64_t word(uint64_t id, uint64_t off) {
        return (id << 48) ^ (off * 0x9e3779b97f4a7c15ull) ^ off;
}

/* Write the pattern through @tier's grant (pinned write-only: the old bytes are not wanted), unpin dirty. */
static void write_pattern(tier_tensor *t, uint64_t id, int tier) {
        struct tier_grant g;
        uint64_t n = tier_tensor_size(t);

        assert_int_equal(tier_pin(t, tier, TIER_WRITE, &g), 0);
        assert_non_null(g.ptr);
        assert_int_equal(g.length, n);
        for (uint64_t off = 0; off + 8 <= n; off += 8)
                ((uint64_t *) g.ptr)[off / 8] = word(id, off);
        for (uint64_t off = n & ~7ull; off < n; off++)
                ((uint8_t *) g.ptr)[off] = (uint8_t) id;
        assert_int_equal(tier_unpin(t, tier, 1), 0);
}

/* Pin @t in @tier and check every byte against the pattern. */
static void check_pattern(tier_tensor *t, uint64_t id, int tier) {
        struct tier_grant g;
        uint64_t n = tier_tensor_size(t);

        assert_int_equal(tier_pin(t, tier, TIER_READ_WRITE, &g), 0);
        assert_non_null(g.ptr);
        for (uint64_t off = 0; off + 8 <= n; off += 8)
                if (((uint64_t *) g.ptr)[off / 8] != word(id, off))
                        fail_msg("tensor '%s' in %s: bytes at %" PRIu64 " differ", tier_tensor_name(t),
                                 tier_level_name(tier), off);
        for (uint64_t off = n & ~7ull; off < n; off++)
                assert_int_equal(((uint8_t *) g.ptr)[off], (uint8_t) id);
        assert_int_equal(tier_unpin(t, tier, 0), 0);
}

static long long link_bytes(const json_t *status, const char *name) {
        const json_t *links = json_object_get(status, "links"), *l;
        size_t i;

        json_array_foreach(links, i, l)
                if (strcmp(json_string_value(json_object_get(l, "name")), name) == 0)
                        return json_integer_value(json_object_get(l, "bytes"));
        fail_msg("no link '%s' in the status", name);
        return -1;
}

/* ---- tensors larger than a segment: one range for the client, striped on NVMe, in VRAM ---------- */

/*
 * A tensor of more segments than one answer brings (WIRE_MAX_FDS, 16), pinned
 * by a client that has seen none of them: its 17th segment is fetched while
 * the grant is resolved, which grows the client's table of segments.  The
 * pieces resolved before pointed into the table as it was: with ASan, a
 * use after free; else a grant refused (-EPROTO) or mapped wrong.
 */
static const char MANY_SEGMENTS_CONFIG[] =
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 2M\n"
        "job_limit = 64M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 8M\n"
        "chunk_size = 2M\n"
        "job_limit = 8M\n";

static void test_more_segments_than_one_answer(void **state) {
        const uint64_t size = 17 * 2 * MiB;
        tier_client *c;
        tier_tensor *t;

        if (under_valgrind()) {
                print_message("skipped: valgrind cannot map a tensor that spans segments (mremap, old size 0)\n");
                skip();
        }
        start(MANY_SEGMENTS_CONFIG);
        c = connect_job("many");
        t = create(c, "t", size);
        write_pattern(t, 5, TIER_HOST);
        check_pattern(t, 5, TIER_HOST);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

static const char LARGE_CONFIG[] =
        "[host]\n"
        "capacity = 1280M\n"
        "segment_size = 64M\n"
        "job_limit = 1280M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 1280M\n"
        "chunk_size = 64M\n"
        "job_limit = 1280M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:1G\n"
        "target = @DIR@/t1.img:1G\n"
        "extent_size = 1M\n";

static void test_large_tensors(void **state) {
        const uint64_t big_size = 1 * GiB, odd_size = 3 * 64 * MiB + 1;
        tier_client *c;
        tier_tensor *big, *odd;
        struct tier_grant g;
        json_t *st;

        if (under_valgrind()) {
                print_message("skipped: valgrind cannot map a tensor that spans segments (mremap, old size 0)\n");
                skip();
        }

        start(LARGE_CONFIG);
        c = connect_job("large");
        assert_int_equal(tier_client_segment_size(c, TIER_HOST), 64 * MiB);
        assert_int_equal(tier_client_segment_size(c, TIER_VRAM), 64 * MiB);
        assert_int_equal(tier_client_segment_size(c, TIER_NVME), 1 * MiB);
        assert_int_equal(tier_client_tensor_max(c, TIER_HOST), 1280 * MiB);
        big = create(c, "big", big_size);
        odd = create(c, "odd", odd_size);

        /* written through one contiguous mapping each, spanning 16 (or 3) segments and 4 for the odd one */
        write_pattern(big, 1, TIER_HOST);
        write_pattern(odd, 2, TIER_HOST);
        check_pattern(big, 1, TIER_HOST);
        check_pattern(odd, 2, TIER_HOST);

        /* down to NVMe, striped over both targets */
        assert_int_equal(tier_evict(big, TIER_NVME), 0);
        assert_int_equal(tier_evict(odd, TIER_NVME), 0);
        st = test_daemon_status(&daemon_);
        assert_non_null(st);
        assert_int_equal(test_json_job_tier(st, "large", "host", "used"), 0);
        assert_true(test_json_job_tier(st, "large", "nvme", "used") >= (long long) (big_size + odd_size));
        {
                const json_t *targets = json_object_get(st, "targets"), *tg;
                size_t i;

                assert_int_equal(json_array_size(targets), 2);
                json_array_foreach(targets, i, tg)
                        assert_true(json_integer_value(json_object_get(tg, "bytes_written")) >=
                                    (long long) ((big_size + odd_size) / 2 - 2 * MiB));
        }
        json_decref(st);

        /* back to host (every extent's crc checked), every byte verified */
        assert_int_equal(tier_prefetch(big, TIER_HOST), 0);
        check_pattern(big, 1, TIER_HOST);

        /* the odd one to (emulated) VRAM from NVMe, and held there while the big one moves */
        assert_int_equal(tier_pin(odd, TIER_VRAM, TIER_READ_WRITE, &g), 0);
        assert_non_null(g.ptr);
        assert_int_equal(tier_evict(big, TIER_NVME), 0);
        assert_int_equal(tier_prefetch(big, TIER_HOST), 0);
        check_pattern(big, 1, TIER_VRAM);
        for (uint64_t off = 0; off + 8 <= odd_size; off += 8)
                if (((uint64_t *) g.ptr)[off / 8] != word(2, off))
                        fail_msg("odd in vram: bytes at %" PRIu64 " differ", off);
        assert_int_equal(((uint8_t *) g.ptr)[odd_size - 1], 2);
        assert_int_equal(tier_unpin(odd, TIER_VRAM, 0), 0);

        /* and the other way: written in VRAM, read back in host */
        write_pattern(odd, 3, TIER_VRAM);
        check_pattern(odd, 3, TIER_HOST);

        assert_int_equal(tier_tensor_destroy(big), 0);
        assert_int_equal(tier_tensor_destroy(odd), 0);
        tier_client_free(c);
}

/* ---- the small pool: each "no space" cause has its own status and text ------------------------ */

static const char SMALL_CONFIG[] =
        "[daemon]\n"
        "linger_sec = 30\n"
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 16M\n"
        "job_limit = 48M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 128M\n"
        "chunk_size = 16M\n"
        "job_limit = 128M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "extent_size = 1M\n";

static void expect_pin_fails(tier_client *c, tier_tensor *t, int tier, int status, const char *text) {
        struct tier_grant g;
        int r = tier_pin(t, tier, TIER_READ_WRITE, &g);

        if (r != status || !strstr(tier_client_last_error(c), text))
                fail_msg("pin of '%s' in %s: %d (%s), expected %d with \"%s\"", tier_tensor_name(t),
                         tier_level_name(tier), r, tier_client_last_error(c), status, text);
}

static void test_no_space_causes(void **state) {
        tier_client *x, *a, *b;
        tier_tensor *t[4], *u;
        struct tier_grant g;
        char name[16];

        start(SMALL_CONFIG);
        x = connect_job("x");

        /* larger than the whole host tier (64M): never fits */
        u = create(x, "huge", 100 * MiB);
        expect_pin_fails(x, u, TIER_HOST, -EFBIG, "is larger than the whole host tier");
        assert_int_equal(tier_tensor_destroy(u), 0);

        /* larger than what the job may use in host (48M): raise the limit */
        u = create(x, "over", 56 * MiB);
        expect_pin_fails(x, u, TIER_HOST, -EDQUOT, "is larger than job 'x' may use in host");
        assert_int_equal(tier_tensor_destroy(u), 0);

        /* the job's limit reached, all of it pinned: unpin or raise */
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "s%d", i);
                t[i] = create(x, name, 16 * MiB);
                assert_int_equal(tier_pin(t[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
        }
        u = create(x, "more", 4 * MiB);
        expect_pin_fails(x, u, TIER_HOST, -ENOSPC, "job 'x' is at its host limit: 48.0 MiB of 48.0 MiB in use, "
                         "48.0 MiB of it pinned");
        for (int i = 0; i < 3; i++) {
                assert_int_equal(tier_unpin(t[i], TIER_HOST, 0), 0);
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        }
        assert_int_equal(tier_tensor_destroy(u), 0);

        /* room within the limit, but not in one run: fragmented */
        for (int i = 0; i < 4; i++) {
                snprintf(name, sizeof(name), "f%d", i);
                t[i] = create(x, name, 10 * MiB);
        }
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_pin(t[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
        expect_pin_fails(x, t[3], TIER_HOST, -ENOSPC, "its longest free run is 6.0 MiB");
        assert_non_null(strstr(tier_client_last_error(x), "the space is fragmented"));
        for (int i = 0; i < 4; i++) {
                if (i < 3)
                        assert_int_equal(tier_unpin(t[i], TIER_HOST, 0), 0);
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        }
        tier_client_free(x);

        /*
         * the pool (4 segments) held by another job that has it all pinned: nothing can be taken
         * back, retry later.  x's empty segments are taken back first; a's hold data.
         */
        a = connect_job("a");
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "a%d", i);
                t[i] = create(a, name, 16 * MiB);
                write_pattern(t[i], (uint64_t) i, TIER_HOST);
                assert_int_equal(tier_pin(t[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
        }
        b = connect_job("b");
        u = create(b, "b0", 16 * MiB);
        t[3] = create(b, "b1", 16 * MiB);
        assert_int_equal(tier_pin(u, TIER_HOST, TIER_READ_WRITE, &g), 0);
        expect_pin_fails(b, t[3], TIER_HOST, -EAGAIN, "the host pool (64.0 MiB) has no segment left for job 'b'");
        assert_non_null(strstr(tier_client_last_error(b), "'a' 48.0 MiB in 3 segment(s)"));

        /* once a's rank is gone, its job lingers with the data but yields the room (written down first) */
        for (int i = 0; i < 3; i++) {
                assert_int_equal(tier_unpin(t[i], TIER_HOST, 0), 0);
                tier_tensor_close(t[i]);        /* the tensor stays, held by job 'a' */
        }
        tier_client_free(a);
        assert_int_equal(tier_pin(t[3], TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t[3], TIER_HOST, 0), 0);
        assert_int_equal(tier_unpin(u, TIER_HOST, 0), 0);
        a = connect_job("a");
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "a%d", i);
                assert_int_equal(tier_tensor_open(a, name, &t[i]), 0);
                check_pattern(t[i], (uint64_t) i, TIER_HOST);
                tier_tensor_close(t[i]);
        }
        tier_client_free(a);
        tier_client_free(b);
        tier_tensor_close(u);
        tier_tensor_close(t[3]);
}

/* ---- a write-only pin brings no old bytes ------------------------------------------------------------ */

static void test_write_only_pin(void **state) {
        tier_client *c;
        tier_tensor *t;
        struct tier_grant g;
        long long before;
        uint64_t moved[TIER_LINK_SLOTS], moved2[TIER_LINK_SLOTS];
        json_t *st;

        start(SMALL_CONFIG);
        c = connect_job("w");
        t = create(c, "t", 8 * MiB);
        write_pattern(t, 5, TIER_HOST);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        st = test_daemon_status(&daemon_);
        before = link_bytes(st, "nvme->host");
        json_decref(st);

        /* overwritten whole: nothing is read from NVMe (tierd's counters, and the job's own) */
        assert_int_equal(tier_client_moved(c, moved), 0);
        assert_int_equal(moved[TIER_LINK_HOST_TO_NVME], 8 * MiB);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        memset(g.ptr, 0x77, 8 * MiB);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);      /* dirty all the same: it was write-only */
        st = test_daemon_status(&daemon_);
        assert_int_equal(link_bytes(st, "nvme->host"), before);
        json_decref(st);
        assert_int_equal(tier_client_moved(c, moved2), 0);
        assert_memory_equal(moved, moved2, sizeof(moved));
        assert_string_equal(tier_link_name(TIER_LINK_NVME_TO_HOST), "nvme->host");
        assert_null(tier_link_name(TIER_LINKS));
        assert_int_equal(tier_client_moved(c, NULL), -EINVAL);

        /* what was written is what the tensor holds, on NVMe and back */
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < 8 * MiB; i++)
                if (((uint8_t *) g.ptr)[i] != 0x77)
                        fail_msg("byte %" PRIu64 " is 0x%02x", i, ((uint8_t *) g.ptr)[i]);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        st = test_daemon_status(&daemon_);
        assert_int_equal(link_bytes(st, "nvme->host"), before + (long long) (8 * MiB));
        json_decref(st);

        /* a mode that is none of read and write is refused */
        assert_int_equal(tier_pin(t, TIER_HOST, 0, &g), -EINVAL);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

/* ---- full below: a victim that cannot be written down fails the pin, once, and is tried again later ---- */

static const char FULL_BELOW_CONFIG[] =
        "[host]\n"
        "capacity = 128M\n"
        "segment_size = 64M\n"
        "job_limit = 64M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 64M\n"
        "chunk_size = 64M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:1G\n"
        "job_limit = 64M\n"
        "extent_size = 1M\n";

static void test_full_below(void **state) {
        tier_client *c;
        tier_tensor *a, *b, *d;
        struct tier_grant g;
        struct tier_stat st;

        start(FULL_BELOW_CONFIG);
        c = connect_job("full");
        a = create(c, "a", 48 * MiB);
        b = create(c, "b", 48 * MiB);
        d = create(c, "d", 48 * MiB);
        write_pattern(a, 1, TIER_HOST);
        write_pattern(b, 2, TIER_HOST);         /* a goes down to NVMe to make room */

        /*
         * d needs b's room; b can only go to NVMe, where a already takes the
         * job's whole limit: the pin fails and says why (it used to write b
         * down over and over, never returning to the event loop).
         */
        assert_int_equal(tier_pin(d, TIER_HOST, TIER_WRITE, &g), -ENOSPC);
        assert_non_null(strstr(tier_client_last_error(c), "cannot be written down to nvme"));
        assert_non_null(strstr(tier_client_last_error(c), "nvme limit"));
        assert_int_equal(tier_pin(d, TIER_HOST, TIER_WRITE, &g), -ENOSPC);   /* still, and at once */

        /* room below again (a is gone): b goes down, d fits */
        assert_int_equal(tier_tensor_destroy(a), 0);
        assert_int_equal(tier_pin(d, TIER_HOST, TIER_WRITE, &g), 0);
        assert_int_equal(tier_unpin(d, TIER_HOST, 1), 0);
        assert_int_equal(tier_tensor_stat(b, &st), 0);
        assert_int_equal(st.state[TIER_HOST], 0);
        assert_int_not_equal(st.state[TIER_NVME], 0);
        assert_int_equal(tier_tensor_destroy(d), 0);
        check_pattern(b, 2, TIER_HOST);         /* what went down is what comes back */
        assert_int_equal(tier_tensor_destroy(b), 0);
        tier_client_free(c);
}

/* ---- churn: tensors of mixed sizes come and go; the books stay right ------------------------------- */

static const char CHURN_CONFIG[] =
        "[host]\n"
        "capacity = 1G\n"
        "segment_size = 64M\n"
        "job_limit = 1G\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 64M\n"
        "chunk_size = 64M\n"
        "job_limit = 64M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:1G\n"
        "target = @DIR@/t1.img:1G\n"
        "extent_size = 1M\n";

#define CHURN_MAX 64

typedef struct Live {
        tier_tensor *t;
        uint64_t id;
} Live;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

/*
 * 4 KiB .. 512 MiB, evenly spread over the powers of two, not a multiple of a
 * page for a third of them (under valgrind at most one segment, 64 MiB).
 */
static uint64_t churn_size(void) {
        uint64_t size = 4 * KiB << (rng() % 18), max = under_valgrind() ? 64 * MiB : 512 * MiB;

        if (rng() % 3 == 0)
                size += rng() % size;
        return size < max ? size : max;
}

/* Bytes @t takes in @tier by its stat (4 KiB pages in host, 1 MiB extents on NVMe); 0 when absent. */
static uint64_t taken(tier_tensor *t, int tier) {
        struct tier_stat st;
        uint64_t size = tier_tensor_size(t);

        assert_int_equal(tier_tensor_stat(t, &st), 0);
        if (st.state[tier] == 0)
                return 0;
        return tier == TIER_NVME ? (size + MiB - 1) / MiB * MiB : (size + 4 * KiB - 1) / (4 * KiB) * (4 * KiB);
}

static void test_churn(void **state) {
        const char *env = getenv("TIER_TEST_CHURN_ROUNDS");
        unsigned rounds = env ? (unsigned) atoi(env) : under_valgrind() ? 60 : 400, created = 0, refused = 0,
                 fragmented = 0;
        uint64_t host = 0, nvme = 0;
        Live live[CHURN_MAX] = {};
        unsigned n_live = 0;
        tier_client *c;
        json_t *st;

        start(CHURN_CONFIG);
        c = connect_job("churn");
        for (unsigned round = 0; round < rounds; round++) {
                unsigned k = (unsigned) (rng() % 10);

                if (getenv("TIER_TEST_VERBOSE") && round % 20 == 0)
                        fprintf(stderr, "round %u: %u live\n", round, n_live);

                if (k < 5 && n_live < CHURN_MAX) {
                        /* a new tensor, written in host (its first and last words carry its id) */
                        uint64_t size = churn_size(), id = ++created;
                        char name[32];
                        struct tier_grant g;
                        tier_tensor *t;
                        int r;

                        snprintf(name, sizeof(name), "c%" PRIu64, id);
                        t = create(c, name, size);
                        r = tier_pin(t, TIER_HOST, TIER_WRITE, &g);
                        if (r < 0) {
                                refused++;
                                fragmented += strstr(tier_client_last_error(c), "fragmented") != NULL;
                                if (getenv("TIER_TEST_VERBOSE"))
                                        fprintf(stderr, "refused: %s\n", tier_client_last_error(c));
                                assert_true(r == -ENOSPC || r == -EAGAIN);
                                assert_int_equal(tier_tensor_destroy(t), 0);
                                continue;
                        }
                        *(uint64_t *) g.ptr = id;
                        if (size >= 16)
                                ((uint64_t *) g.ptr)[(size & ~7ull) / 8 - 1] = ~id;
                        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
                        live[n_live++] = (Live) { t, id };
                } else if (k < 8 && n_live > 0) {
                        /* one goes */
                        unsigned i = (unsigned) (rng() % n_live);

                        if (tier_tensor_destroy(live[i].t) < 0)
                                fail_msg("destroy: %s", tier_client_last_error(c));
                        live[i] = live[--n_live];
                } else if (n_live > 0) {
                        /* one comes back to host (from NVMe when it was pushed there): still its bytes */
                        unsigned i = (unsigned) (rng() % n_live);
                        uint64_t size = tier_tensor_size(live[i].t);
                        struct tier_grant g;
                        int r = tier_pin(live[i].t, TIER_HOST, TIER_READ_WRITE, &g);

                        if (r < 0) {
                                refused++;
                                if (getenv("TIER_TEST_VERBOSE"))
                                        fprintf(stderr, "refused: %s\n", tier_client_last_error(c));
                                continue;
                        }
                        assert_int_equal(*(uint64_t *) g.ptr, live[i].id);
                        if (size >= 16)
                                assert_int_equal(((uint64_t *) g.ptr)[(size & ~7ull) / 8 - 1], ~live[i].id);
                        r = tier_unpin(live[i].t, TIER_HOST, 0);
                        if (r < 0)
                                fail_msg("unpin: %s", tier_client_last_error(c));
                }
        }

        /* the books: what the job uses in each tier is what its live tensors take there */
        for (unsigned i = 0; i < n_live; i++) {
                host += taken(live[i].t, TIER_HOST);
                nvme += taken(live[i].t, TIER_NVME);
        }
        st = test_daemon_status(&daemon_);
        assert_non_null(st);
        assert_int_equal(test_json_job_tier(st, "churn", "host", "used"), (long long) host);
        assert_int_equal(test_json_job_tier(st, "churn", "nvme", "used"), (long long) nvme);
        assert_int_equal(test_json_tier(st, "host", "used"), (long long) host);
        print_message("churn: %u rounds, %u tensors made, %u live (%.1f MiB in host, %.1f MiB on NVMe); "
                      "%u pins refused, %u of them as fragmented; host segments held %.1f MiB for %.1f MiB "
                      "used (%.1f%% unused)\n", rounds, created, n_live, (double) host / MiB, (double) nvme / MiB,
                      refused, fragmented, (double) test_json_tier(st, "host", "held") / MiB,
                      (double) host / MiB, test_json_tier(st, "host", "held") ?
                      100.0 * (1.0 - (double) host / (double) test_json_tier(st, "host", "held")) : 0.0);
        json_decref(st);

        /* all gone: nothing is left used, nothing leaked (tierd exits cleanly under ASan too) */
        for (unsigned i = 0; i < n_live; i++)
                assert_int_equal(tier_tensor_destroy(live[i].t), 0);
        st = test_daemon_status(&daemon_);
        assert_int_equal(test_json_job_tier(st, "churn", "host", "used"), 0);
        assert_int_equal(test_json_job_tier(st, "churn", "nvme", "used"), 0);
        assert_int_equal(test_json_tier(st, "nvme", "used"), 0);
        json_decref(st);
        tier_client_free(c);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_large_tensors, stop),
                cmocka_unit_test_teardown(test_more_segments_than_one_answer, stop),
                cmocka_unit_test_teardown(test_no_space_causes, stop),
                cmocka_unit_test_teardown(test_write_only_pin, stop),
                cmocka_unit_test_teardown(test_full_below, stop),
                cmocka_unit_test_teardown(test_churn, stop),
        };

        if (!test_can_lock_memory(1280 * MiB))
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        return cmocka_run_group_tests_name("large", tests, NULL, NULL);
}
