/* SPDX-License-Identifier: MIT */
/* test-timeline.c: jobs with iteration plans, through a real tierd. */

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
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB (1024ull * 1024ull)
#define KiB 1024ull

/*
 * Each job: L layers; per layer a parameter tensor P (needed in VRAM for
 * forward and backward, updated in host by the optimizer), a gradient G
 * (written in VRAM by backward, read in host by the optimizer) and an
 * optimizer state O (read-write in host).  Per job: 6 x 512 KiB x L bytes;
 * with L = 6: 18 MiB, against a VRAM limit of 3 MiB and a host limit of 6 MiB.
 */
#define LAYERS 6
#define TSIZE (512 * KiB)
#define STEPS 10
/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (32 * MiB)

static const char *const CONFIG =
        "[daemon]\n"
        "linger_sec = 1\n"
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 2M\n"
        "job_limit = 6M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 8M\n"
        "chunk_size = 1M\n"
        "job_limit = 3M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "target = @DIR@/t1.img:256M\n"
        "extent_size = 256K\n"
        "[sched]\n"
        "policy = ";

static const char *policy_name = "timeline";

static TestDaemon daemon_;

/*
 * Job "moving" (test_pin_waits_for_transfers()) writes its 12 tensors down
 * (24 extents), then reads them back: the completions of those 24 reads are
 * held back 2 s, so the prefetches are still in flight when its pin comes.
 */
static const char *const FAULTS = "nvme-delay:ms=2000,job=moving,after=24,count=24";

static int setup(void **state) {
        char config[2048];
        int r;

        snprintf(config, sizeof(config), "%s%s\n", CONFIG, policy_name);
        if (setenv("TIERD_TEST_FAULTS", FAULTS, 1) < 0)
                return -1;
        r = test_daemon_start(&daemon_, config);
        unsetenv("TIERD_TEST_FAULTS");
        return r < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&daemon_) == 0 ? 0 : -1;
}

static uint8_t pat(unsigned tensor, unsigned version, uint64_t off) {
        return (uint8_t) (tensor * 37 + version * 101 + off * 7 + (off >> 9));
}

/* Check @g holds version @v of @tensor; returns the first bad offset or -1. */
static int64_t check(const struct tier_grant *g, unsigned tensor, unsigned v) {
        const uint8_t *p = g->ptr;

        for (uint64_t i = 0; i < g->length; i++) {
                uint8_t want = v == 0 ? 0 : pat(tensor, v, i);
                if (p[i] != want)
                        return (int64_t) i;
        }
        return -1;
}

static void fill(const struct tier_grant *g, unsigned tensor, unsigned v) {
        uint8_t *p = g->ptr;

        for (uint64_t i = 0; i < g->length; i++)
                p[i] = pat(tensor, v, i);
}

enum { PH_FWD = 0, PH_BWD = LAYERS, PH_OPT = 2 * LAYERS, N_PHASES = 3 * LAYERS };

/* Run one job: returns 0 when every byte checked out. */
static int run_job(const char *job, int steps, bool *quota_seen_ok) {
        tier_client *c = NULL;
        tier_tensor *P[LAYERS], *G[LAYERS], *O[LAYERS];
        unsigned vp[LAYERS] = {}, vg[LAYERS] = {}, vo[LAYERS] = {};
        tier_plan *plan = NULL;
        struct tier_grant g;
        char name[16];
        int r;

        r = tier_client_new(daemon_.socket, job, 0, &c);
        if (r < 0) {
                fprintf(stderr, "%s: connect: %s\n", job, tier_client_last_error(NULL));
                return r;
        }
        for (int i = 0; i < LAYERS; i++) {
                snprintf(name, sizeof(name), "P%d", i);
                if (tier_tensor_create(c, name, TSIZE, &P[i]) < 0)
                        return -1;
                snprintf(name, sizeof(name), "G%d", i);
                if (tier_tensor_create(c, name, TSIZE, &G[i]) < 0)
                        return -1;
                snprintf(name, sizeof(name), "O%d", i);
                if (tier_tensor_create(c, name, TSIZE, &O[i]) < 0)
                        return -1;
        }
        if (tier_plan_new(c, &plan) < 0)
                return -1;
        for (int i = 0; i < LAYERS; i++) {
                int b = LAYERS - 1 - i;         /* backward runs the layers in reverse */

                tier_plan_add(plan, PH_FWD + i, P[i], TIER_VRAM, TIER_READ);
                tier_plan_add(plan, PH_BWD + i, P[b], TIER_VRAM, TIER_READ);
                tier_plan_add(plan, PH_BWD + i, G[b], TIER_VRAM, TIER_WRITE);
                tier_plan_add(plan, PH_OPT + i, G[i], TIER_HOST, TIER_READ);
                tier_plan_add(plan, PH_OPT + i, O[i], TIER_HOST, TIER_READ_WRITE);
                tier_plan_add(plan, PH_OPT + i, P[i], TIER_HOST, TIER_READ_WRITE);
        }
        r = tier_plan_submit(plan);
        if (r < 0) {
                fprintf(stderr, "%s: plan: %s\n", job, tier_client_last_error(c));
                tier_plan_free(plan);
                return r;
        }

        for (int step = 1; step <= steps; step++) {
                for (int i = 0; i < LAYERS; i++) {
                        if (tier_phase_enter(c, PH_FWD + i) < 0 || tier_phase_grant(c, P[i], TIER_VRAM, &g) < 0)
                                return -1;
                        if (check(&g, (unsigned) i, vp[i]) >= 0) {
                                fprintf(stderr, "%s step %d fwd %d: P wrong\n", job, step, i);
                                return -EIO;
                        }
                }
                for (int i = 0; i < LAYERS; i++) {
                        int b = LAYERS - 1 - i;

                        if (tier_phase_enter(c, PH_BWD + i) < 0 || tier_phase_grant(c, P[b], TIER_VRAM, &g) < 0)
                                return -1;
                        if (check(&g, (unsigned) b, vp[b]) >= 0) {
                                int64_t off = check(&g, (unsigned) b, vp[b]);
                                fprintf(stderr, "%s step %d bwd %d: P wrong at %" PRId64 ": %u, want v%u (seg %u off %" PRIu64 ")\n",
                                        job, step, b, off, ((uint8_t *) g.ptr)[off], vp[b], g.segment, g.offset);
                                return -EIO;
                        }
                        if (tier_phase_grant(c, G[b], TIER_VRAM, &g) < 0)
                                return -1;
                        fill(&g, 100 + (unsigned) b, ++vg[b]);
                }
                for (int i = 0; i < LAYERS; i++) {
                        if (tier_phase_enter(c, PH_OPT + i) < 0)
                                return -1;
                        if (tier_phase_grant(c, G[i], TIER_HOST, &g) < 0 || check(&g, 100 + (unsigned) i, vg[i]) >= 0) {
                                int64_t off = check(&g, 100 + (unsigned) i, vg[i]);
                                fprintf(stderr, "%s step %d opt %d: G wrong at %" PRId64 ": %u, want %u (v%u; v0 would be 0, v-1 %u) seg %u off %" PRIu64 "\n",
                                        job, step, i, off, ((uint8_t *) g.ptr)[off], pat(100 + (unsigned) i, vg[i], (uint64_t) off), vg[i],
                                        vg[i] > 1 ? pat(100 + (unsigned) i, vg[i] - 1, (uint64_t) off) : 0, g.segment, g.offset);
                                return -EIO;
                        }
                        if (tier_phase_grant(c, O[i], TIER_HOST, &g) < 0 || check(&g, 200 + (unsigned) i, vo[i]) >= 0) {
                                fprintf(stderr, "%s step %d opt %d: O wrong\n", job, step, i);
                                return -EIO;
                        }
                        fill(&g, 200 + (unsigned) i, ++vo[i]);
                        if (tier_phase_grant(c, P[i], TIER_HOST, &g) < 0 || check(&g, (unsigned) i, vp[i]) >= 0) {
                                fprintf(stderr, "%s step %d opt %d: P (host) wrong\n", job, step, i);
                                return -EIO;
                        }
                        fill(&g, (unsigned) i, ++vp[i]);
                }
        }
        /* the last phase's writes are released by one more marker */
        if (tier_phase_enter(c, PH_FWD) < 0)
                return -1;
        if (quota_seen_ok)
                *quota_seen_ok = true;
        tier_client_free(c);
        for (int i = 0; i < LAYERS; i++) {
                tier_tensor_close(P[i]);
                tier_tensor_close(G[i]);
                tier_tensor_close(O[i]);
        }
        return 0;
}

/* No job's "used" of any tier in status JSON exceeds its "limit". */
static bool within_quota(const json_t *status) {
        json_t *job, *usage;
        const char *tier;
        size_t i;

        json_array_foreach(json_object_get(status, "jobs"), i, job)
                json_object_foreach(json_object_get(job, "usage"), tier, usage) {
                        json_t *used = json_object_get(usage, "used"), *limit = json_object_get(usage, "limit");

                        if (!json_is_integer(used) || !json_is_integer(limit)) {
                                fprintf(stderr, "job %s: no used/limit for %s\n",
                                        json_string_value(json_object_get(job, "name")), tier);
                                return false;
                        }
                        if (json_integer_value(used) > json_integer_value(limit)) {
                                fprintf(stderr, "job %s: quota exceeded in %s: %" JSON_INTEGER_FORMAT " > %"
                                        JSON_INTEGER_FORMAT "\n", json_string_value(json_object_get(job, "name")),
                                        tier, json_integer_value(used), json_integer_value(limit));
                                return false;
                        }
                }
        return true;
}

static void test_two_jobs_verified(void **state) {
        pid_t pids[2];
        int st, samples = 0;
        bool running = true;

        for (int k = 0; k < 2; k++) {
                pids[k] = fork();
                assert_true(pids[k] >= 0);
                if (pids[k] == 0)
                        _exit(run_job(k ? "timeline-b" : "timeline-a", STEPS, NULL) == 0 ? 0 : 1);
        }
        /* sample status while they run: no quota is ever exceeded */
        while (running) {
                json_t *status = test_daemon_status(&daemon_);

                assert_non_null(status);
                assert_true(within_quota(status));
                json_decref(status);
                samples++;
                running = false;
                for (int k = 0; k < 2; k++)
                        if (pids[k] > 0) {
                                if (waitpid(pids[k], &st, WNOHANG) == pids[k]) {
                                        assert_true(WIFEXITED(st));
                                        assert_int_equal(WEXITSTATUS(st), 0);
                                        pids[k] = 0;
                                } else
                                        running = true;
                        }
                usleep(20000);
        }
        assert_true(samples > 0);
}

static void test_plan_over_quota_refused(void **state) {
        tier_client *c = NULL;
        tier_tensor *t[8];
        tier_plan *plan = NULL;
        char name[8];

        assert_int_equal(tier_client_new(daemon_.socket, "too-big", 0, &c), 0);
        for (int i = 0; i < 8; i++) {
                snprintf(name, sizeof(name), "x%d", i);
                assert_int_equal(tier_tensor_create(c, name, TSIZE, &t[i]), 0);
        }
        /* one phase needs 8 x 512 KiB = 4 MiB of VRAM; the job may use 3 MiB */
        assert_int_equal(tier_plan_new(c, &plan), 0);
        for (int i = 0; i < 8; i++)
                assert_int_equal(tier_plan_add(plan, 0, t[i], TIER_VRAM, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), -ENOSPC);
        assert_non_null(strstr(tier_client_last_error(c), "vram"));
        tier_plan_free(plan);

        /* no plan: markers are refused */
        assert_int_equal(tier_phase_enter(c, 0), -EINVAL);

        /* a handle closed between tier_plan_add() and the submit: refused by the client, nothing sent */
        {
                tier_tensor *again = NULL;

                assert_int_equal(tier_tensor_open(c, "x7", &again), 0);
                assert_int_equal(tier_plan_new(c, &plan), 0);
                assert_int_equal(tier_plan_add(plan, 0, t[6], TIER_HOST, TIER_READ), 0);
                assert_int_equal(tier_plan_add(plan, 1, again, TIER_HOST, TIER_READ), 0);
                tier_tensor_close(again);
                assert_int_equal(tier_plan_submit(plan), -EINVAL);
                assert_non_null(strstr(tier_client_last_error(c), "access 1 (phase 1) names a tensor whose handle "
                                       "was closed"));
                tier_plan_free(plan);
                assert_int_equal(tier_phase_enter(c, 0), -EINVAL);      /* no plan runs */
        }

        /* a tensor named by a running plan cannot be destroyed */
        assert_int_equal(tier_plan_new(c, &plan), 0);
        assert_int_equal(tier_plan_add(plan, 0, t[0], TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        assert_int_equal(tier_tensor_destroy(t[1]), 0);
        assert_int_equal(tier_tensor_destroy(t[0]), -EBUSY);
        assert_non_null(strstr(tier_client_last_error(c), "plan"));
        t[1] = NULL;

        /* ended: its pins go, its tensors may go, another plan may come */
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_plan_end(c), -ENOENT);
        assert_int_equal(tier_phase_enter(c, 0), -EINVAL);
        assert_int_equal(tier_plan_new(c, &plan), 0);
        assert_int_equal(tier_plan_add(plan, 0, t[2], TIER_HOST, TIER_WRITE), 0);
        assert_int_equal(tier_plan_add(plan, 1, t[2], TIER_VRAM, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_tensor_destroy(t[0]), 0);
        assert_int_equal(tier_tensor_destroy(t[2]), 0);
        t[0] = t[2] = NULL;
        for (int i = 0; i < 8; i++)
                tier_tensor_close(t[i]);
        tier_client_free(c);
}

/* How often tierd has run its op engine and scheduler pass so far (status "sched"."engine_runs"). */
static uint64_t engine_runs(void) {
        json_t *st = test_daemon_status(&daemon_), *v;
        uint64_t n;

        assert_non_null(st);
        v = json_object_get(json_object_get(st, "sched"), "engine_runs");
        assert_true(json_is_integer(v));
        n = (uint64_t) json_integer_value(v);
        json_decref(st);
        return n;
}

/*
 * The next phase needs a tensor in VRAM that is on NVMe: it must be staged in
 * host memory, where the current phase holds the job's whole limit.  The pin
 * for the next phase fails until the phase changes; it used to free its own
 * VRAM reservation on the way out, which looked like space appearing, which
 * retried it at once: tierd spun at a full CPU and answered nothing.
 */
static void test_staging_waits_quietly(void **state) {
        tier_client *c = NULL;
        tier_tensor *a[12], *x;
        tier_plan *plan = NULL;
        struct tier_grant g;
        char name[8];
        uint64_t runs0, runs1;

        assert_int_equal(tier_client_new(daemon_.socket, "staging", 0, &c), 0);
        for (int i = 0; i < 12; i++) {                  /* 12 x 512 KiB = the job's 6 MiB of host */
                snprintf(name, sizeof(name), "a%d", i);
                assert_int_equal(tier_tensor_create(c, name, TSIZE, &a[i]), 0);
        }
        assert_int_equal(tier_tensor_create(c, "x", TSIZE, &x), 0);
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ_WRITE, &g), 0);
        fill(&g, 99, 1);
        assert_int_equal(tier_unpin(x, TIER_HOST, 1), 0);
        assert_int_equal(tier_evict(x, TIER_NVME), 0);

        assert_int_equal(tier_plan_new(c, &plan), 0);
        for (int i = 0; i < 12; i++)
                assert_int_equal(tier_plan_add(plan, 0, a[i], TIER_HOST, TIER_READ_WRITE), 0);
        assert_int_equal(tier_plan_add(plan, 1, x, TIER_VRAM, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);

        assert_int_equal(tier_phase_enter(c, 0), 0);
        /*
         * Phase 1's pin waits for room that nothing will free: tierd must not run
         * its engine over and over meanwhile.  Counted in engine runs (status), not
         * CPU time, which a loaded machine or a sanitizer stretches: an idle tierd
         * runs a fixed few times for the status requests and its timers, however
         * long it waits; a spinning one, thousands of times in 500 ms.
         */
        runs0 = engine_runs();
        usleep(500 * 1000);
        runs1 = engine_runs();
        print_message("tierd ran its engine %" PRIu64 " times in 500 ms with phase 1's pin waiting for room\n",
                      runs1 - runs0);
        assert_true(runs1 - runs0 <= 20);

        /* the phase changes: phase 0's pins go, x comes up through host memory */
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_phase_grant(c, x, TIER_VRAM, &g), 0);
        assert_int_equal(check(&g, 99, 1), -1);
        assert_int_equal(tier_plan_end(c), 0);
        for (int i = 0; i < 12; i++)
                assert_int_equal(tier_tensor_destroy(a[i]), 0);
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(c);
}

/*
 * A pin that finds all its job's room taken by copies in transfers (here
 * prefetches from NVMe, held in flight by FAULTS) waits for them to end,
 * then makes room among them; it used to fail with ENOSPC at once.
 */
static void test_pin_waits_for_transfers(void **state) {
        tier_client *c = NULL;
        tier_tensor *a[12], *x;
        tier_fence f[12];
        struct tier_grant g;
        char name[8];
        json_int_t transfers;
        json_t *st;

        assert_int_equal(tier_client_new(daemon_.socket, "moving", 0, &c), 0);
        for (int i = 0; i < 12; i++) {                  /* 12 x 512 KiB = the job's 6 MiB of host */
                snprintf(name, sizeof(name), "a%d", i);
                assert_int_equal(tier_tensor_create(c, name, TSIZE, &a[i]), 0);
                assert_int_equal(tier_pin(a[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
                fill(&g, (unsigned) i, 1);
                assert_int_equal(tier_unpin(a[i], TIER_HOST, 1), 0);
                assert_int_equal(tier_evict(a[i], TIER_NVME), 0);
        }
        assert_int_equal(tier_tensor_create(c, "x", TSIZE, &x), 0);
        for (int i = 0; i < 12; i++)
                assert_int_equal(tier_prefetch_async(a[i], TIER_HOST, &f[i]), 0);
        /* their reads are held back: still in flight */
        st = test_daemon_status(&daemon_);
        assert_non_null(st);
        transfers = json_integer_value(json_object_get(json_object_get(st, "sched"), "transfers"));
        json_decref(st);
        print_message("%lld transfer(s) in flight before the pin\n", (long long) transfers);
        assert_true(transfers > 0);
        assert_int_equal(tier_fence_done(c, f[0]), 0);
        /* sent behind the prefetches: the job's host room is all in transfers when it runs */
        assert_int_equal(tier_pin(x, TIER_HOST, TIER_READ_WRITE, &g), 0);
        fill(&g, 99, 1);
        assert_int_equal(tier_unpin(x, TIER_HOST, 1), 0);
        for (int i = 0; i < 12; i++)
                assert_int_equal(tier_fence_wait(c, f[i], 10000), 0);
        for (int i = 0; i < 12; i++) {
                assert_int_equal(tier_pin(a[i], TIER_HOST, TIER_READ_WRITE, &g), 0);
                assert_int_equal(check(&g, (unsigned) i, 1), -1);
                assert_int_equal(tier_unpin(a[i], TIER_HOST, 0), 0);
                assert_int_equal(tier_tensor_destroy(a[i]), 0);
        }
        assert_int_equal(tier_tensor_destroy(x), 0);
        tier_client_free(c);
}

/*
 * A write outside the plan (the client's own pin, unpinned dirty) of a tensor
 * whose copy in another tier a held phase pins already: that phase must not
 * be said ready on the older copy; it reads what was written.
 */
static void test_write_outside_the_plan(void **state) {
        tier_client *c = NULL;
        tier_tensor *t, *u;
        tier_plan *p = NULL;
        struct tier_grant g;
        unsigned v = 1;
        bool ahead = strcmp(policy_name, "timeline") == 0;

        assert_int_equal(tier_client_new(daemon_.socket, "outside", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "t", TSIZE, &t), 0);
        assert_int_equal(tier_tensor_create(c, "u", TSIZE, &u), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        fill(&g, 1, v);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, t, TIER_VRAM, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, u, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        for (int round = 0; round < 3; round++) {
                struct tier_stat st = {};

                assert_int_equal(tier_phase_enter(c, 0), 0);
                assert_int_equal(tier_phase_grant(c, t, TIER_VRAM, &g), 0);
                if (check(&g, 1, v) != -1)
                        fail_msg("round %d: phase 0 reads an older version of t than %u (byte %" PRId64 ")",
                                 round, v, check(&g, 1, v));
                assert_int_equal(tier_phase_enter(c, 1), 0);
                /*
                 * tierd holds phase 0 again, ahead: t pinned in VRAM for it (an order, whatever the time);
                 * lru and ondemand pin nothing ahead
                 */
                for (int i = 0; i < 10000 && st.pins[TIER_VRAM] == 0 && ahead; i++) {
                        assert_int_equal(tier_tensor_stat(t, &st), 0);
                        if (st.pins[TIER_VRAM] == 0)
                                usleep(1000);
                }
                if (!ahead)
                        assert_int_equal(tier_tensor_stat(t, &st), 0);
                assert_int_equal(st.pins[TIER_VRAM], ahead ? 1 : 0);
                /* now written in host, outside the plan */
                assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
                fill(&g, 1, ++v);
                assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        }
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        assert_int_equal(tier_tensor_destroy(u), 0);
        tier_client_free(c);
}

/*
 * A tensor dropped as dead (its next planned access writes it whole) when the
 * job commits, then written: a rollback makes it dead again, nothing lost
 * (it had no copy, hence no image, at the commit; it came back lost before).
 */
static void test_rollback_of_a_dead_tensor(void **state) {
        tier_client *c = NULL;
        tier_tensor *t, *u;
        tier_plan *p = NULL;
        struct tier_commit cm = {};
        struct tier_grant g;
        struct tier_stat st = {};

        if (strcmp(policy_name, "timeline") != 0)
                return;         /* dead copies are dropped under timeline only */
        assert_int_equal(tier_client_new(daemon_.socket, "dead-commit", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "t", TSIZE, &t), 0);
        assert_int_equal(tier_tensor_create(c, "u", TSIZE, &u), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        fill(&g, 1, 1);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);  /* clean: no write-behind of it in flight later */
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, u, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 2, t, TIER_HOST, TIER_WRITE), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        /* t: read, next written whole: dead, its copies dropped (phase 2's hold may reserve host room again) */
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_tensor_stat(t, &st), 0);
        assert_int_equal(st.state[TIER_NVME], 0);
        assert_int_equal(tier_job_commit(c, 1), 0);
        assert_int_equal(tier_phase_enter(c, 2), 0);
        assert_int_equal(tier_phase_grant(c, t, TIER_HOST, &g), 0);
        fill(&g, 1, 2);
        assert_int_equal(tier_phase_enter(c, 0), 0);          /* phase 2's write lands: t written since the commit */
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_job_rollback(c, &cm), 0);
        assert_int_equal(cm.lost, 0);
        assert_true(cm.rolled_back >= 1);
        assert_int_equal(tier_tensor_destroy(t), 0);
        assert_int_equal(tier_tensor_destroy(u), 0);
        tier_client_free(c);
}

/*
 * A commit while the plan's hold pins a tensor for a phase that writes it whole (tier.torch's
 * activations, once the next step's first phase is entered) goes under every policy, and the
 * tensor is kept as dead: timeline drops such a tensor as dead anyway, the others kept it and
 * refused the commit (-EBUSY, "in memory only").  The rollback makes it dead again, nothing lost.
 */
static void test_commit_while_plan_overwrites(void **state) {
        tier_client *c = NULL;
        tier_tensor *t;
        tier_plan *p = NULL;
        struct tier_commit cm = {};
        struct tier_grant g;

        assert_int_equal(tier_client_new(daemon_.socket, "commit-overwrite", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "t", TSIZE, &t), 0);
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, t, TIER_HOST, TIER_WRITE), 0);
        assert_int_equal(tier_plan_add(p, 1, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_grant(c, t, TIER_HOST, &g), 0);
        fill(&g, 1, 1);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_phase_grant(c, t, TIER_HOST, &g), 0);
        assert_int_equal(check(&g, 1, 1), -1);
        assert_int_equal(tier_phase_enter(c, 0), 0);          /* t pinned again, to be written whole */
        assert_int_equal(tier_job_commit(c, 1), 0);
        assert_int_equal(tier_phase_grant(c, t, TIER_HOST, &g), 0);
        fill(&g, 1, 2);
        assert_int_equal(tier_phase_enter(c, 1), 0);          /* phase 0's write lands: t written since the commit */
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_job_rollback(c, &cm), 0);
        assert_int_equal(cm.lost, 0);
        assert_int_equal(cm.rolled_back, 1);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

/* tier_phase_grant() of another client's tensor is refused, as tier_plan_add() refuses it (it used to map
 * the other tensor's slot of this client's page, and to keep a handle of the other client after it closed). */
static void test_phase_grant_other_client(void **state) {
        tier_client *c[2] = {};
        tier_tensor *t[2];
        tier_plan *plan = NULL;
        struct tier_grant g;

        for (int i = 0; i < 2; i++) {
                char job[16];

                snprintf(job, sizeof(job), "grant-%d", i);
                assert_int_equal(tier_client_new(daemon_.socket, job, 0, &c[i]), 0);
                assert_int_equal(tier_tensor_create(c[i], "w", TSIZE, &t[i]), 0);
                assert_int_equal(tier_plan_new(c[i], &plan), 0);
                assert_int_equal(tier_plan_add(plan, 0, t[i], TIER_HOST, TIER_WRITE), 0);
                assert_int_equal(tier_plan_submit(plan), 0);
                assert_int_equal(tier_phase_enter(c[i], 0), 0);
        }
        assert_int_equal(tier_phase_grant(c[0], t[0], TIER_HOST, &g), 0);
        assert_int_equal(tier_phase_grant(c[0], t[1], TIER_HOST, &g), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(c[0]), "belongs to another client"));
        for (int i = 0; i < 2; i++) {
                tier_tensor_close(t[i]);
                tier_client_free(c[i]);
        }
}

/*
 * A handle opened after the plan was submitted has its tensor's slot too, also once the handle the plan
 * was made with is closed (tier_phase_grant() failed with -ENOENT: only the handles open at the submit
 * knew their slot).
 */
static void test_phase_grant_later_handle(void **state) {
        tier_client *c = NULL;
        tier_tensor *t, *u;
        tier_plan *plan = NULL;
        struct tier_grant g;

        assert_int_equal(tier_client_new(daemon_.socket, "later-handle", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "t", TSIZE, &t), 0);
        assert_int_equal(tier_plan_new(c, &plan), 0);
        assert_int_equal(tier_plan_add(plan, 0, t, TIER_HOST, TIER_WRITE), 0);
        assert_int_equal(tier_plan_add(plan, 1, t, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        assert_int_equal(tier_tensor_open(c, "t", &u), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_grant(c, u, TIER_HOST, &g), 0);
        fill(&g, 1, 1);
        tier_tensor_close(t);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_phase_grant(c, u, TIER_HOST, &g), 0);
        assert_int_equal(check(&g, 1, 1), -1);
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_tensor_destroy(u), 0);
        tier_client_free(c);
}

/*
 * A commit while a pin may write a tensor whose current version is in memory only is refused: that copy is
 * being overwritten (a write-only pin hands out the valid copy itself), and the commit kept no image of it,
 * so the rollback found nothing to go back to.  With the version on NVMe too, the commit goes, and the
 * rollback brings it back.
 */
static void test_commit_during_write_only_pin(void **state) {
        tier_client *c = NULL;
        tier_tensor *t;
        struct tier_commit cm = {};
        struct tier_grant g;

        assert_int_equal(tier_client_new(daemon_.socket, "commit-wo", 0, &c), 0);
        assert_int_equal(tier_tensor_create(c, "t", TSIZE, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        fill(&g, 1, 1);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);      /* version 1, in host only */
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        assert_int_equal(tier_job_commit(c, 1), -EBUSY);
        assert_non_null(strstr(tier_client_last_error(c), "tensor 't' is pinned for writing and what it holds now "
                                                           "is in memory only"));
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        /* on NVMe too: the commit goes, the pin overwrites the host copy, the rollback brings version 1 back */
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
        assert_int_equal(tier_job_commit(c, 1), 0);
        fill(&g, 1, 2);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_job_rollback(c, &cm), 0);
        assert_int_equal(cm.lost, 0);
        assert_int_equal(cm.rolled_back, 1);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ, &g), 0);
        assert_int_equal(check(&g, 1, 1), -1);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        tier_client_free(c);
}

/*
 * A phase whose room only the client's own pin could give: tier_phase_enter() waited for it forever (the
 * client, the only one who could unpin, waited there).  It fails -ENOSPC naming the pin, as a plain pin in
 * its place does, and holds nothing; the plan lives on: after the unpin the phase is entered, its grant
 * written, and the next phase reads it.  (SIGALRM only as a safety net: the refusal is what is awaited.)
 */
static void test_own_pin_refuses_the_phase(void **state) {
        tier_client *c = NULL;
        tier_tensor *x[3], *y;
        tier_plan *plan = NULL;
        struct tier_grant g, gx;
        char name[8];

        alarm(120);
        assert_int_equal(tier_client_new(daemon_.socket, "own-pin", 0, &c), 0);
        /* the job's whole VRAM limit, in tensors of one chunk each (valgrind maps none over two) */
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "x%d", i);
                assert_int_equal(tier_tensor_create(c, name, MiB, &x[i]), 0);
        }
        assert_int_equal(tier_tensor_create(c, "y", TSIZE, &y), 0);
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_pin(x[i], TIER_VRAM, TIER_READ, &gx), 0);
        assert_int_equal(tier_pin(y, TIER_VRAM, TIER_READ, &g), -ENOSPC);      /* as a plain pin is */
        assert_int_equal(tier_plan_new(c, &plan), 0);
        assert_int_equal(tier_plan_add(plan, 0, y, TIER_VRAM, TIER_WRITE), 0);
        assert_int_equal(tier_plan_add(plan, 1, y, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        assert_int_equal(tier_phase_enter(c, 0), -ENOSPC);
        assert_non_null(strstr(tier_client_last_error(c), "tier_phase_enter(0) refused: phase 0 of job 'own-pin' "
                                                           "can never be pinned in vram while this client's own pins"));
        assert_non_null(strstr(tier_client_last_error(c), "'x0' (1.0 MiB), 'x1' (1.0 MiB), 'x2' (1.0 MiB)"));
        assert_non_null(strstr(tier_client_last_error(c), "unpin them before entering the phase"));
        assert_int_equal(tier_phase_grant(c, y, TIER_VRAM, &g), -EINVAL);     /* no phase entered */
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_unpin(x[i], TIER_VRAM, 0), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_grant(c, y, TIER_VRAM, &g), 0);
        fill(&g, 2, 1);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_phase_grant(c, y, TIER_HOST, &g), 0);
        assert_int_equal(check(&g, 2, 1), -1);
        assert_int_equal(tier_plan_end(c), 0);
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_tensor_destroy(x[i]), 0);
        assert_int_equal(tier_tensor_destroy(y), 0);
        tier_client_free(c);
        alarm(0);
}

/*
 * The same when the bytes fit but not the place: the client's own pins (768K each) hold the job's three VRAM
 * chunks (its 3M limit), a 256K run left in each, and y (512K) needs one run of 512K: 2.75M fit the limit,
 * so the phase waited forever.  It fails -ENOSPC, the room named fragmented; after one unpin it is entered.
 */
static void test_own_pins_fragment_the_phase(void **state) {
        tier_client *c = NULL;
        tier_tensor *x[3], *y;
        tier_plan *plan = NULL;
        struct tier_grant g, gx;
        char name[8];

        alarm(120);
        assert_int_equal(tier_client_new(daemon_.socket, "own-frag", 0, &c), 0);
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "x%d", i);
                assert_int_equal(tier_tensor_create(c, name, 768 * KiB, &x[i]), 0);
        }
        assert_int_equal(tier_tensor_create(c, "y", TSIZE, &y), 0);
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_pin(x[i], TIER_VRAM, TIER_READ, &gx), 0);
        assert_int_equal(tier_pin(y, TIER_VRAM, TIER_READ, &g), -ENOSPC);      /* as a plain pin is */
        assert_non_null(strstr(tier_client_last_error(c), "fragmented"));
        assert_int_equal(tier_plan_new(c, &plan), 0);
        assert_int_equal(tier_plan_add(plan, 0, y, TIER_VRAM, TIER_WRITE), 0);
        assert_int_equal(tier_plan_add(plan, 1, y, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(plan), 0);
        assert_int_equal(tier_phase_enter(c, 0), -ENOSPC);
        assert_non_null(strstr(tier_client_last_error(c), "tier_phase_enter(0) refused: phase 0 of job 'own-frag' "
                                                           "can never be pinned in vram while this client's own pins"));
        assert_non_null(strstr(tier_client_last_error(c), "hold 3 of the 3 vram chunks (1.0 MiB each) the job "
                                                           "may have, and leave no free run there for tensor 'y' "
                                                           "(512.0 KiB): the room is fragmented"));
        assert_int_equal(tier_unpin(x[1], TIER_VRAM, 0), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        assert_int_equal(tier_phase_grant(c, y, TIER_VRAM, &g), 0);
        fill(&g, 3, 1);
        assert_int_equal(tier_phase_enter(c, 1), 0);
        assert_int_equal(tier_phase_grant(c, y, TIER_HOST, &g), 0);
        assert_int_equal(check(&g, 3, 1), -1);
        assert_int_equal(tier_plan_end(c), 0);
        assert_int_equal(tier_unpin(x[0], TIER_VRAM, 0), 0);
        assert_int_equal(tier_unpin(x[2], TIER_VRAM, 0), 0);
        for (int i = 0; i < 3; i++)
                assert_int_equal(tier_tensor_destroy(x[i]), 0);
        assert_int_equal(tier_tensor_destroy(y), 0);
        tier_client_free(c);
        alarm(0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_own_pin_refuses_the_phase),
                cmocka_unit_test(test_own_pins_fragment_the_phase),
                cmocka_unit_test(test_commit_during_write_only_pin),
                cmocka_unit_test(test_commit_while_plan_overwrites),
                cmocka_unit_test(test_phase_grant_other_client),
                cmocka_unit_test(test_phase_grant_later_handle),
                cmocka_unit_test(test_plan_over_quota_refused),
                cmocka_unit_test(test_staging_waits_quietly),
                cmocka_unit_test(test_pin_waits_for_transfers),
                cmocka_unit_test(test_write_outside_the_plan),
                cmocka_unit_test(test_rollback_of_a_dead_tensor),
                cmocka_unit_test(test_two_jobs_verified),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        /* the same job, verified byte for byte, under every policy */
        {
                static const char *const policies[] = { "timeline", "lru", "ondemand" };
                int failed = 0;

                for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++) {
                        char name[64];

                        policy_name = policies[i];
                        snprintf(name, sizeof(name), "timeline-policy-%s", policy_name);
                        failed += cmocka_run_group_tests_name(name, tests, setup, teardown);
                }
                return failed;
        }
}
