/* SPDX-License-Identifier: MIT */
/* test-share.c: capacity that flows between jobs: lingering jobs yield, jobs above their share give back. */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB ((uint64_t) 1024 * 1024)
#define TSIZE (4 * MiB)
/* 50 x 4 MiB = 200 MiB per job, against a 256 MiB host pool that every job may use whole */
#define N_TENSORS 50

static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 300\n"
        "[limits]\n"
        "max_tensors = 256\n"
        "[host]\n"
        "capacity = 256M\n"
        "segment_size = 4M\n"
        "job_limit = 256M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 16M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:1G\n"
        "target = @DIR@/t1.img:1G\n"
        "extent_size = 1M\n";

static TestDaemon daemon_;

static int setup(void **state) {
        int r = test_daemon_start(&daemon_, CONFIG);

        if (r < 0) {
                fprintf(stderr, "cannot start tierd: %s\n", strerror(-r));
                return -1;
        }
        return 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&daemon_) == 0 ? 0 : -1;
}

static double now_s(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(daemon_.socket, job, 0, &c);

        if (r < 0)
                fprintf(stderr, "connect %s: %s (%s)\n", job, tier_strerror(r), tier_client_last_error(c));
        assert_int_equal(r, 0);
        return c;
}

static uint8_t pattern(unsigned job, unsigned idx, uint64_t off) {
        return (uint8_t) (off * 13 + idx * 7 + job * 101 + (off >> 12));
}

static void fill(tier_client *c, tier_tensor *t, unsigned job, unsigned idx) {
        struct tier_grant g;
        int r = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);

        if (r < 0)
                fprintf(stderr, "pin tensor %u of job %u: %s (%s)\n", idx, job, tier_strerror(r),
                        tier_client_last_error(c));
        assert_int_equal(r, 0);
        for (uint64_t i = 0; i < g.length; i += 512)
                ((uint8_t *) g.ptr)[i] = pattern(job, idx, i);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
}

static void verify(tier_client *c, tier_tensor *t, unsigned job, unsigned idx) {
        struct tier_grant g;
        int r = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);

        if (r < 0)
                fprintf(stderr, "pin tensor %u of job %u: %s (%s)\n", idx, job, tier_strerror(r),
                        tier_client_last_error(c));
        assert_int_equal(r, 0);
        for (uint64_t i = 0; i < g.length; i += 512)
                if (((uint8_t *) g.ptr)[i] != pattern(job, idx, i)) {
                        fprintf(stderr, "job %u tensor %u byte %" PRIu64 ": %u, want %u\n", job, idx, i,
                                ((uint8_t *) g.ptr)[i], pattern(job, idx, i));
                        fail();
                }
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
}

static void create_all(tier_client *c, tier_tensor **t, const char *prefix) {
        char name[32];

        for (unsigned i = 0; i < N_TENSORS; i++) {
                snprintf(name, sizeof(name), "%s%u", prefix, i);
                assert_int_equal(tier_tensor_create(c, name, TSIZE, &t[i]), 0);
        }
}

/* Key @key of job @name's host usage in tierd's status ("used", "share", ...). */
static uint64_t host_usage(const char *name, const char *key) {
        json_t *st = test_daemon_status(&daemon_), *job;
        uint64_t used = UINT64_MAX;
        size_t i;

        assert_non_null(st);
        json_array_foreach(json_object_get(st, "jobs"), i, job)
                if (strcmp(json_string_value(json_object_get(job, "name")), name) == 0)
                        used = (uint64_t) json_integer_value(json_object_get(
                                json_object_get(json_object_get(job, "usage"), "host"), key));
        json_decref(st);
        return used;
}

static uint64_t host_used(const char *name) {
        return host_usage(name, "used");
}

/* Job @name in tierd's status, or NULL; json_decref() it. */
static json_t *job_status(const char *name) {
        json_t *st = test_daemon_status(&daemon_), *job, *found = NULL;
        size_t i;

        assert_non_null(st);
        json_array_foreach(json_object_get(st, "jobs"), i, job)
                if (strcmp(json_string_value(json_object_get(job, "name")), name) == 0)
                        found = json_incref(job);
        json_decref(st);
        return found;
}

/* Bytes tierd moved for job @name over @link ("host->nvme", ...). */
static uint64_t job_moved(const char *name, const char *link) {
        json_t *job = job_status(name);
        uint64_t bytes;

        assert_non_null(job);
        bytes = (uint64_t) json_integer_value(json_object_get(json_object_get(job, "moved"), link));
        json_decref(job);
        return bytes;
}

/* Is job @name there and lingering (no rank connected, its linger not run out)? */
static bool job_lingering(const char *name) {
        json_t *job = job_status(name);
        bool lingering = job && json_is_true(json_object_get(job, "lingering"));

        json_decref(job);
        return lingering;
}

/* The yardstick, in the same run: seconds tierd takes to write 200 MiB of dirty host data down. */
static double writeback_yardstick(void) {
        tier_client *w = connect_job("yardstick");
        tier_tensor *tw[N_TENSORS];
        double t0, s;

        create_all(w, tw, "w");
        for (unsigned i = 0; i < N_TENSORS; i++)
                fill(w, tw[i], 9, i);
        t0 = now_s();
        for (unsigned i = 0; i < N_TENSORS; i++)
                assert_int_equal(tier_evict(tw[i], TIER_NVME), 0);
        s = now_s() - t0;
        for (unsigned i = 0; i < N_TENSORS; i++)
                assert_int_equal(tier_tensor_destroy(tw[i]), 0);
        tier_client_free(w);
        return s;
}

/*
 * A job whose rank exited keeps its 200 MiB of dirty host data while it
 * lingers, but not its claim on the host pool: a live job that needs the
 * room gets it, by the time it takes to write the lingering job's bytes to
 * NVMe, both by explicit pins and through a plan; when the lingering job's
 * rank comes back, its data is all there.  What shows it whatever the
 * timing: every byte the lingering job gave up was written down first, and
 * it still lingers once the live job has its room: the room did not wait
 * for its linger (300 s) to run out.
 */
static void test_lingering_job_yields(void **state) {
        tier_client *l, *n;
        tier_tensor *tl[N_TENSORS], *tn[N_TENSORS];
        tier_plan *plan = NULL;
        double t0, wb_s, pins_s, plan_s, stall_s;

        wb_s = writeback_yardstick();

        l = connect_job("lingering");
        create_all(l, tl, "l");
        for (unsigned i = 0; i < N_TENSORS; i++)
                fill(l, tl[i], 1, i);
        assert_int_equal(host_used("lingering"), N_TENSORS * TSIZE);
        for (unsigned i = 0; i < N_TENSORS; i++)
                tier_tensor_close(tl[i]);
        tier_client_free(l);            /* its rank exits: the job lingers with 200 MiB of dirty host data */
        assert_int_equal(host_usage("lingering", "share"), 0);

        /* half of the live job's tensors by explicit pins: 56 MiB are free, the rest must come from it */
        n = connect_job("live");
        create_all(n, tn, "n");
        t0 = now_s();
        for (unsigned i = 0; i < N_TENSORS / 2; i++)
                fill(n, tn[i], 2, i);
        pins_s = now_s() - t0;

        /* the other half through a plan: five phases of five tensors each, read and written in host */
        t0 = now_s();
        assert_int_equal(tier_plan_new(n, &plan), 0);
        for (unsigned i = N_TENSORS / 2; i < N_TENSORS; i++)
                assert_int_equal(tier_plan_add(plan, (i - N_TENSORS / 2) / 5, tn[i], TIER_HOST, TIER_READ_WRITE), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        for (unsigned ph = 0; ph < 5; ph++) {
                struct tier_grant g;

                assert_int_equal(tier_phase_enter(n, ph), 0);
                for (unsigned i = N_TENSORS / 2 + ph * 5; i < N_TENSORS / 2 + ph * 5 + 5; i++) {
                        assert_int_equal(tier_phase_grant(n, tn[i], TIER_HOST, &g), 0);
                        for (uint64_t o = 0; o < g.length; o += 512)
                                ((uint8_t *) g.ptr)[o] = pattern(2, i, o);
                }
        }
        stall_s = tier_phase_stall(n);         /* the plan's page goes with it */
        assert_int_equal(tier_plan_end(n), 0);
        plan_s = now_s() - t0;
        print_message("write-back of 200 MiB alone %.3f s; the live job's 25 pins took %.3f s, its plan %.3f s "
                      "(stalled %.3f s); the lingering job kept %" PRIu64 " MiB of host\n", wb_s, pins_s, plan_s, stall_s,
                      host_used("lingering") / MiB);
        assert_true(host_used("live") == N_TENSORS * TSIZE);
        assert_true(host_used("lingering") <= 256 * MiB - N_TENSORS * TSIZE);
        /* the room came from writing the lingering job's bytes down, not from its linger running out */
        assert_true(job_lingering("lingering"));
        assert_true(job_moved("lingering", "host->nvme") >= N_TENSORS * TSIZE - host_used("lingering"));

        /* the lingering job's rank comes back: every byte is there */
        l = connect_job("lingering");
        for (unsigned i = 0; i < N_TENSORS; i++) {
                char name[32];

                snprintf(name, sizeof(name), "l%u", i);
                assert_int_equal(tier_tensor_open(l, name, &tl[i]), 0);
                verify(l, tl[i], 1, i);
        }
        for (unsigned i = 0; i < N_TENSORS; i++)
                verify(n, tn[i], 2, i);
        for (unsigned i = 0; i < N_TENSORS; i++) {
                assert_int_equal(tier_tensor_destroy(tl[i]), 0);
                assert_int_equal(tier_tensor_destroy(tn[i]), 0);
        }
        tier_client_free(l);
        tier_client_free(n);
}

/*
 * A job alone grows past its share up to its maximum, with no NVMe traffic
 * once its data fits; a second job that needs its share gets it from the
 * first one's excess (its dirty bytes written down: all that left host),
 * and the first one's data stays intact.
 */
static void test_live_jobs_share(void **state) {
        tier_client *a, *b;
        tier_tensor *ta[N_TENSORS], *tb[N_TENSORS];
        uint64_t moved[TIER_LINK_SLOTS] = {}, moved2[TIER_LINK_SLOTS] = {};
        double wb_s = writeback_yardstick(), t0, b_s;

        a = connect_job("grows");
        create_all(a, ta, "a");
        for (unsigned i = 0; i < N_TENSORS; i++)
                fill(a, ta[i], 3, i);
        assert_int_equal(host_used("grows"), N_TENSORS * TSIZE);   /* 200 MiB: past its share (alone: all) */
        assert_int_equal(tier_client_moved(a, moved), 0);
        for (unsigned i = 0; i < N_TENSORS; i++)
                verify(a, ta[i], 3, i);
        assert_int_equal(tier_client_moved(a, moved2), 0);
        assert_int_equal(moved2[TIER_LINK_NVME_TO_HOST], moved[TIER_LINK_NVME_TO_HOST]);
        assert_int_equal(moved2[TIER_LINK_HOST_TO_NVME], 0);

        /* the second job needs 128 MiB, its share of 256 with equal weights: 72 of them are the first's */
        b = connect_job("arrives");
        create_all(b, tb, "b");
        t0 = now_s();
        for (unsigned i = 0; i < 32; i++)
                fill(b, tb[i], 4, i);
        b_s = now_s() - t0;
        print_message("shares: 'grows' %" PRIu64 " MiB, 'arrives' %" PRIu64 " MiB of host; the second job's "
                      "128 MiB took %.3f s (writing 200 MiB down alone: %.3f s)\n", host_used("grows") / MiB,
                      host_used("arrives") / MiB, b_s, wb_s);
        assert_int_equal(host_used("arrives"), 32 * TSIZE);
        assert_true(host_used("grows") <= 256 * MiB - 32 * TSIZE);
        assert_true(job_moved("grows", "host->nvme") >= N_TENSORS * TSIZE - host_used("grows"));
        assert_int_equal(host_usage("arrives", "share"), 128 * MiB);       /* equal weights: half each */
        assert_int_equal(host_usage("grows", "share"), 128 * MiB);

        /* the first job (now above its share) makes room among its own copies to read everything back */
        for (unsigned i = 0; i < N_TENSORS; i++)
                verify(a, ta[i], 3, i);
        for (unsigned i = 0; i < 32; i++)
                verify(b, tb[i], 4, i);
        /* and the second one does not lose its share to it */
        assert_int_equal(host_used("arrives"), 32 * TSIZE);
        for (unsigned i = 0; i < N_TENSORS; i++) {
                assert_int_equal(tier_tensor_destroy(ta[i]), 0);
                assert_int_equal(tier_tensor_destroy(tb[i]), 0);
        }
        tier_client_free(a);
        tier_client_free(b);
}

/* ---- a guarantee is room no other job pins ---------------------------------------------------------- */

static const char *const CONFIG_GUARANTEE =
        "[daemon]\n"
        "linger_sec = 0\n"
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 16M\n"
        "job_limit = 48M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 32M\n"
        "chunk_size = 8M\n"
        "job_limit = 16M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "extent_size = 1M\n"
        "[quota]\n"
        "job = guaranteed\n"
        "host_min = 32M\n"
        "host = 48M\n"
        "[quota]\n"
        "job = greedy\n"
        "weight = 10\n";

static TestDaemon guarantee_daemon_;

static int setup_guarantee(void **state) {
        return test_daemon_start(&guarantee_daemon_, CONFIG_GUARANTEE) < 0 ? -1 : 0;
}

static int teardown_guarantee(void **state) {
        return test_daemon_stop(&guarantee_daemon_) == 0 ? 0 : -1;
}

/* Is job @name in the status of the guarantee test's tierd? */
static bool guarantee_job_there(const char *name) {
        json_t *st = test_daemon_status(&guarantee_daemon_), *job;
        bool found = false;
        size_t i;

        assert_non_null(st);
        json_array_foreach(json_object_get(st, "jobs"), i, job)
                found = found || strcmp(json_string_value(json_object_get(job, "name")), name) == 0;
        json_decref(st);
        return found;
}

/*
 * What a job pins beyond its guarantee comes out of the room the live jobs' guarantees leave.  A job pinning
 * within its maximum took the room a guaranteed job was promised, for good (reclaim never empties a segment
 * holding a pinned copy): the guaranteed job's pins within its host_min got -EAGAIN for as long as it pinned.
 */
static void test_guarantee_kept_from_pins(void **state) {
        tier_client *g = NULL, *hog = NULL;
        tier_tensor *h[3], *ga, *gb;
        struct tier_grant gr;

        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "guaranteed", 0, &g), 0);
        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "hog", 0, &hog), 0);
        for (unsigned i = 0; i < 3; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "h%u", i);
                assert_int_equal(tier_tensor_create(hog, name, 16 * MiB, &h[i]), 0);
        }
        /* 'hog' may pin 64M less the 32M kept for 'guaranteed', though its own limit is 48M */
        assert_int_equal(tier_pin(h[0], TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(tier_pin(h[1], TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(tier_pin(h[2], TIER_HOST, TIER_WRITE, &gr), -EAGAIN);
        if (!strstr(tier_client_last_error(hog), "kept for the guaranteed minimum of 'guaranteed' (32.0 MiB"))
                fail_msg("%s", tier_client_last_error(hog));
        /* a copy it holds unpinned (a prefetch) is no different */
        assert_int_equal(tier_prefetch(h[2], TIER_HOST), 0);
        assert_int_equal(tier_pin(h[2], TIER_HOST, TIER_READ, &gr), -EAGAIN);
        /* 'guaranteed' gets its 32M (the prefetched copy is taken back for it) */
        assert_int_equal(tier_tensor_create(g, "a", 16 * MiB, &ga), 0);
        assert_int_equal(tier_tensor_create(g, "b", 16 * MiB, &gb), 0);
        assert_int_equal(tier_pin(ga, TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(tier_pin(gb, TIER_HOST, TIER_WRITE, &gr), 0);
        /* unused, the guarantee is kept all the same while its job runs */
        assert_int_equal(tier_unpin(ga, TIER_HOST, 1), 0);
        assert_int_equal(tier_unpin(gb, TIER_HOST, 1), 0);
        assert_int_equal(tier_pin(h[2], TIER_HOST, TIER_WRITE, &gr), -EAGAIN);
        /* once it ends (linger_sec = 0: gone at once), the room is anyone's */
        tier_tensor_close(ga);
        tier_tensor_close(gb);
        tier_client_free(g);
        for (unsigned i = 0; i < 5000 && guarantee_job_there("guaranteed"); i++)
                (void) usleep(1000);
        assert_false(guarantee_job_there("guaranteed"));
        assert_int_equal(tier_pin(h[2], TIER_HOST, TIER_WRITE, &gr), 0);
        for (unsigned i = 0; i < 3; i++) {
                assert_int_equal(tier_unpin(h[i], TIER_HOST, 1), 0);
                tier_tensor_close(h[i]);
        }
        tier_client_free(hog);
}

/* Key "used" of job @name's host usage in the guarantee test tierd's status. */
static uint64_t guarantee_host_used(const char *name) {
        json_t *st = test_daemon_status(&guarantee_daemon_), *job;
        uint64_t used = UINT64_MAX;
        size_t i;

        assert_non_null(st);
        json_array_foreach(json_object_get(st, "jobs"), i, job)
                if (strcmp(json_string_value(json_object_get(job, "name")), name) == 0)
                        used = (uint64_t) json_integer_value(json_object_get(
                                json_object_get(json_object_get(job, "usage"), "host"), "used"));
        json_decref(st);
        return used;
}

/*
 * A pin refused for room kept for a guarantee was refused only once its room was made: with the pool dry,
 * reclaim emptied a segment of a job above its share for it (that job's copy written down or dropped), and
 * again on each retry once that job had its copy back.  Such a pin is refused before any room is made now.
 * 'greedy' (weight 10: a share of 48M, its limit) pins 32M, all 'guaranteed' leaves it; 'cache' (a share of
 * 5.3M) holds the other 32M unpinned.
 */
static void test_refused_pin_evicts_nothing(void **state) {
        tier_client *g = NULL, *cache = NULL, *greedy = NULL;
        tier_tensor *c[2], *h[3];
        struct tier_grant gr;
        uint64_t moved[TIER_LINK_SLOTS] = {};
        unsigned evicted = 0;

        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "guaranteed", 0, &g), 0);
        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "cache", 0, &cache), 0);
        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "greedy", 0, &greedy), 0);
        for (unsigned i = 0; i < 2; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "c%u", i);
                assert_int_equal(tier_tensor_create(cache, name, 16 * MiB, &c[i]), 0);
                assert_int_equal(tier_pin(c[i], TIER_HOST, TIER_WRITE, &gr), 0);
                memset(gr.ptr, 0x5a + (int) i, gr.length);
                assert_int_equal(tier_unpin(c[i], TIER_HOST, 1), 0);
        }
        for (unsigned i = 0; i < 3; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "h%u", i);
                assert_int_equal(tier_tensor_create(greedy, name, 16 * MiB, &h[i]), 0);
        }
        assert_int_equal(tier_pin(h[0], TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(tier_pin(h[1], TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(guarantee_host_used("cache"), 32 * MiB);
        for (unsigned round = 0; round < 3; round++) {
                assert_int_equal(tier_pin(h[2], TIER_HOST, TIER_WRITE, &gr), -EAGAIN);
                if (!strstr(tier_client_last_error(greedy), "kept for the guaranteed minimum of 'guaranteed'"))
                        fail_msg("%s", tier_client_last_error(greedy));
                if (guarantee_host_used("cache") < 32 * MiB)
                        evicted++;
                /* what went comes back (a prefetch: 'cache' is no more to pin into the room kept either) */
                for (unsigned i = 0; i < 2; i++)
                        assert_int_equal(tier_prefetch(c[i], TIER_HOST), 0);
        }
        assert_int_equal(tier_client_moved(cache, moved), 0);
        print_message("the refused pin evicted a copy of 'cache' in %u of 3 tries; 'cache' read %" PRIu64
                      " MiB back\n", evicted, moved[TIER_LINK_NVME_TO_HOST] / MiB);
        assert_int_equal(evicted, 0);
        assert_int_equal(moved[TIER_LINK_NVME_TO_HOST], 0);
        for (unsigned i = 0; i < 2; i++)
                assert_int_equal(tier_unpin(h[i], TIER_HOST, 1), 0);
        for (unsigned i = 0; i < 2; i++) {
                assert_int_equal(tier_pin(c[i], TIER_HOST, TIER_READ, &gr), 0);
                assert_int_equal(((uint8_t *) gr.ptr)[gr.length - 1], 0x5a + i);
                assert_int_equal(tier_unpin(c[i], TIER_HOST, 0), 0);
                tier_tensor_close(c[i]);
        }
        for (unsigned i = 0; i < 3; i++)
                tier_tensor_close(h[i]);
        tier_client_free(greedy);
        tier_client_free(cache);
        tier_client_free(g);
}

/*
 * The same where the pin's own bytes fit the segments its job holds pinned already: 'greedy' holds 'h0' pinned
 * and 'u' unpinned in one segment, 'h1' pinned in another, and pins 'x' (8M) with the pool dry.  Reclaim took
 * a segment of 'cache' for it, and the pin, placed there, was refused; now reclaim is not tried for a segment
 * it could not hold, and 'u' makes the room, in a segment held already: the pin is granted.
 */
static void test_reclaim_not_tried_for_a_kept_pin(void **state) {
        tier_client *g = NULL, *cache = NULL, *greedy = NULL;
        tier_tensor *c[2], *u, *h0, *h1, *x;
        struct tier_grant gr;

        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "guaranteed", 0, &g), 0);
        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "cache", 0, &cache), 0);
        assert_int_equal(tier_client_new(guarantee_daemon_.socket, "greedy", 0, &greedy), 0);
        for (unsigned i = 0; i < 2; i++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "c%u", i);
                assert_int_equal(tier_tensor_create(cache, name, 16 * MiB, &c[i]), 0);
                assert_int_equal(tier_pin(c[i], TIER_HOST, TIER_WRITE, &gr), 0);
                assert_int_equal(tier_unpin(c[i], TIER_HOST, 1), 0);
        }
        assert_int_equal(tier_tensor_create(greedy, "u", 8 * MiB, &u), 0);
        assert_int_equal(tier_tensor_create(greedy, "h0", 8 * MiB, &h0), 0);
        assert_int_equal(tier_tensor_create(greedy, "h1", 16 * MiB, &h1), 0);
        assert_int_equal(tier_tensor_create(greedy, "x", 8 * MiB, &x), 0);
        assert_int_equal(tier_pin(u, TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(tier_unpin(u, TIER_HOST, 1), 0);
        assert_int_equal(tier_pin(h0, TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(tier_pin(h1, TIER_HOST, TIER_WRITE, &gr), 0);
        assert_int_equal(guarantee_host_used("greedy"), 32 * MiB);
        assert_int_equal(guarantee_host_used("cache"), 32 * MiB);
        if (tier_pin(x, TIER_HOST, TIER_WRITE, &gr) < 0)
                fail_msg("%s", tier_client_last_error(greedy));
        assert_int_equal(guarantee_host_used("cache"), 32 * MiB);
        assert_int_equal(guarantee_host_used("greedy"), 32 * MiB);        /* 'u' went */
        assert_int_equal(tier_unpin(x, TIER_HOST, 1), 0);
        assert_int_equal(tier_unpin(h0, TIER_HOST, 1), 0);
        assert_int_equal(tier_unpin(h1, TIER_HOST, 1), 0);
        tier_tensor_close(x);
        tier_tensor_close(h1);
        tier_tensor_close(h0);
        tier_tensor_close(u);
        for (unsigned i = 0; i < 2; i++)
                tier_tensor_close(c[i]);
        tier_client_free(greedy);
        tier_client_free(cache);
        tier_client_free(g);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_lingering_job_yields),
                cmocka_unit_test(test_live_jobs_share),
                cmocka_unit_test_setup_teardown(test_guarantee_kept_from_pins, setup_guarantee, teardown_guarantee),
                cmocka_unit_test_setup_teardown(test_refused_pin_evicts_nothing, setup_guarantee, teardown_guarantee),
                cmocka_unit_test_setup_teardown(test_reclaim_not_tried_for_a_kept_pin, setup_guarantee,
                                                teardown_guarantee),
        };

        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));

        return cmocka_run_group_tests(tests, setup, teardown);
}
