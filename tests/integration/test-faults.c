/* SPDX-License-Identifier: MIT */
/* test-faults.c: injected faults (TIERD_TEST_FAULTS): the affected request fails or is retried, nothing else. */

/*
 * Each test starts its own tierd with one set of fault rules, selected by
 * job ("victim"), so a second job ("bystander") on the same target shows
 * that a fault reaches only the request it hit.  Each checks: the victim's
 * request fails with a clear message (or succeeds after a retry, where
 * tierd retries), the copy that failed to fill is not reported valid, the
 * copy it came from is still valid (read back), the bystander's bytes are
 * intact, and the target's counters in the status count the failure.
 */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB ((uint64_t) 1024 * 1024)

/* one target, so the bystander's extents lie on the same file as the victim's */
static const char *const CONFIG =
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 4M\n"
        "job_limit = 32M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 8M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "extent_size = 1M\n";

/* the same with a second target: extents go round-robin over both */
static const char *const CONFIG2 =
        "[host]\n"
        "capacity = 64M\n"
        "segment_size = 4M\n"
        "job_limit = 32M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 8M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:256M\n"
        "target = @DIR@/t1.img:256M\n"
        "extent_size = 1M\n";

typedef struct World {
        TestDaemon d;
        tier_client *vc, *bc;   /* the victim's and the bystander's jobs */
        tier_tensor *v, *b;     /* victim: 1 MiB (one extent); bystander: 4 MiB */
} World;

static uint8_t pattern(uint64_t tensor, uint64_t off) {
        return (uint8_t) ((off * 31 + tensor * 7 + (off >> 12)) ^ (tensor << 3));
}

static void fill(tier_tensor *t, uint64_t idx) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < g.length; i++)
                ((uint8_t *) g.ptr)[i] = pattern(idx, i);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
}

/* Pin @t in host memory and compare; returns the pin's result (0: pinned and every byte right). */
static int verify(tier_tensor *t, uint64_t idx) {
        struct tier_grant g;
        int r = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);

        if (r < 0)
                return r;
        for (uint64_t i = 0; i < g.length; i++)
                if (((uint8_t *) g.ptr)[i] != pattern(idx, i)) {
                        fprintf(stderr, "tensor %" PRIu64 " byte %" PRIu64 ": %u != %u\n", idx, i,
                                ((uint8_t *) g.ptr)[i], pattern(idx, i));
                        fail();
                }
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        return 0;
}

static int state_of(tier_tensor *t, int tier) {
        struct tier_stat st;

        assert_int_equal(tier_tensor_stat(t, &st), 0);
        return st.state[tier];
}

static tier_client *connect_job(World *w, const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(w->d.socket, job, 0, &c);

        if (r < 0)
                fprintf(stderr, "connect %s: %s (%s)\n", job, tier_strerror(r), tier_client_last_error(c));
        assert_int_equal(r, 0);
        return c;
}

/*
 * Start tierd with TIERD_TEST_FAULTS=@faults, make both jobs' tensors and
 * fill them; the bystander's goes down to NVMe unless @bystander_on_host.
 */
static void world_start_config(World *w, const char *config, const char *faults, bool bystander_on_host) {
        int r;

        if (!test_can_lock_memory(64 * MiB))
                skip();
        memset(w, 0, sizeof(*w));
        assert_int_equal(setenv("TIERD_TEST_FAULTS", faults, 1), 0);
        r = test_daemon_start(&w->d, config);
        unsetenv("TIERD_TEST_FAULTS");
        if (r < 0)
                fprintf(stderr, "cannot start tierd: %s\n", strerror(-r));
        assert_int_equal(r, 0);
        assert_true(test_daemon_log_contains(&w->d, "TIERD_TEST_FAULTS is set"));

        w->vc = connect_job(w, "victim");
        w->bc = connect_job(w, "bystander");
        assert_int_equal(tier_tensor_create(w->vc, "v", 1 * MiB, &w->v), 0);
        assert_int_equal(tier_tensor_create(w->bc, "b", 4 * MiB, &w->b), 0);
        fill(w->v, 1);
        fill(w->b, 2);
        if (!bystander_on_host) {
                assert_int_equal(tier_evict(w->b, TIER_NVME), 0);
                assert_int_equal(state_of(w->b, TIER_HOST), 0);
        }
}

static void world_start(World *w, const char *faults, bool bystander_on_host) {
        world_start_config(w, CONFIG, faults, bystander_on_host);
}

/* The bystander's bytes are intact (read back from NVMe when they were there), then tierd stops cleanly. */
static void world_stop(World *w) {
        assert_int_equal(verify(w->b, 2), 0);
        assert_int_equal(tier_tensor_destroy(w->b), 0);
        tier_client_free(w->bc);
        tier_tensor_close(w->v);
        tier_client_free(w->vc);
        assert_int_equal(test_daemon_stop(&w->d), 0);
}

static long long target_counter(World *w, const char *key) {
        json_t *status = test_daemon_status(&w->d);
        long long n;

        assert_non_null(status);
        n = (long long) test_json_sum(json_object_get(status, "targets"), key);
        json_decref(status);
        return n;
}

/* @job's counter @key in tierd's status ("nvme_crc_errors"). */
static long long job_counter(World *w, const char *job, const char *key) {
        json_t *status = test_daemon_status(&w->d), *j;
        long long n;

        assert_non_null(status);
        j = test_json_job(status, job);
        assert_non_null(j);
        assert_true(json_is_integer(json_object_get(j, key)));
        n = (long long) json_integer_value(json_object_get(j, key));
        json_decref(status);
        return n;
}

/* How often @needle occurs in tierd's log so far. */
static unsigned log_count(const World *w, const char *needle) {
        FILE *f = fopen(w->d.log, "re");
        char line[1024];
        unsigned n = 0;

        assert_non_null(f);
        while (fgets(line, sizeof(line), f))
                if (strstr(line, needle))
                        n++;
        fclose(f);
        return n;
}

static void assert_error_contains(tier_client *c, const char *needle) {
        const char *e = tier_client_last_error(c);

        if (!e || !strstr(e, needle)) {
                fprintf(stderr, "error message '%s' does not contain '%s'\n", e ? e : "(none)", needle);
                fail();
        }
}

/* ---- reads ---------------------------------------------------------------------------------- */

/* One failed attempt: tierd retries it, the pin succeeds with the right bytes. */
static void test_read_eio_retried(void **state) {
        World w;

        world_start(&w, "nvme-read-eio:job=victim,count=1", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(verify(w.v, 1), 0);
        assert_true(test_daemon_log_contains(&w.d, "Injected fault nvme-read-eio"));
        assert_int_equal(target_counter(&w, "io_errors"), 0);
        world_stop(&w);
}

/* The attempt and its retry fail: the pin fails, the host copy is not valid, the NVMe copy still is. */
static void test_read_eio_fails(void **state) {
        World w;

        world_start(&w, "nvme-read-eio:job=victim,count=2", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(verify(w.v, 1), -EIO);
        assert_error_contains(w.vc, "I/O error");
        assert_error_contains(w.vc, "Input/output error");
        assert_int_equal(state_of(w.v, TIER_HOST), 0);
        assert_int_equal(state_of(w.v, TIER_NVME), 2);
        assert_int_equal(target_counter(&w, "io_errors"), 1);
        /* the rule is spent: the NVMe copy reads back whole */
        assert_int_equal(verify(w.v, 1), 0);
        world_stop(&w);
}

/* A plan's read fails: that plan alone fails with the error, the bystander's plan runs on. */
static void test_read_eio_plan(void **state) {
        tier_plan *vp = NULL, *bp = NULL;
        struct tier_grant g;
        World w;

        world_start(&w, "nvme-read-eio:job=victim,count=2", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(tier_plan_new(w.vc, &vp), 0);
        assert_int_equal(tier_plan_add(vp, 0, w.v, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(vp), 0);
        assert_int_equal(tier_plan_new(w.bc, &bp), 0);
        assert_int_equal(tier_plan_add(bp, 0, w.b, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(bp), 0);

        assert_int_equal(tier_phase_enter(w.vc, 0), -EIO);
        assert_error_contains(w.vc, "the plan failed");
        assert_true(test_daemon_log_contains(&w.d, "Plan of job 'victim' failed: cannot bring tensor 'v' to host: "
                                                   "I/O error on"));
        assert_int_equal(target_counter(&w, "io_errors"), 1);

        assert_int_equal(tier_phase_enter(w.bc, 0), 0);
        assert_int_equal(tier_phase_grant(w.bc, w.b, TIER_HOST, &g), 0);
        for (uint64_t i = 0; i < g.length; i++)
                assert_int_equal(((uint8_t *) g.ptr)[i], pattern(2, i));
        assert_int_equal(tier_plan_end(w.bc), 0);
        assert_int_equal(tier_plan_end(w.vc), 0);
        /* the victim's NVMe copy stayed valid */
        assert_int_equal(state_of(w.v, TIER_NVME), 2);
        assert_int_equal(verify(w.v, 1), 0);
        world_stop(&w);
}

/* io_errors of target @i. */
static long long target_errors(World *w, size_t i) {
        json_t *status = test_daemon_status(&w->d);
        long long n;

        assert_non_null(status);
        n = (long long) json_integer_value(json_object_get(json_array_get(json_object_get(status, "targets"), i),
                                                           "io_errors"));
        json_decref(status);
        return n;
}

/* A rule for one target: only the extent there fails, and only that target counts it. */
static void test_read_eio_one_target(void **state) {
        tier_tensor *t;
        World w;

        world_start_config(&w, CONFIG2, "nvme-read-eio:job=victim,target=1,count=2", false);
        /* two extents: one on each target */
        assert_int_equal(tier_tensor_create(w.vc, "two", 2 * MiB, &t), 0);
        fill(t, 5);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        assert_int_equal(verify(t, 5), -EIO);
        assert_error_contains(w.vc, "t1.img");
        assert_int_equal(target_errors(&w, 0), 0);
        assert_int_equal(target_errors(&w, 1), 1);
        assert_int_equal(state_of(t, TIER_NVME), 2);
        assert_int_equal(verify(t, 5), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        world_stop(&w);
}

/* ---- writes --------------------------------------------------------------------------------- */

/* A drain that fails twice: the evict fails, nothing is on NVMe, the host copy stays and is right. */
static void write_fails(const char *faults, int err, const char *message) {
        World w;

        world_start(&w, faults, false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), err);
        assert_error_contains(w.vc, message);
        assert_int_equal(state_of(w.v, TIER_NVME), 0);
        assert_int_equal(state_of(w.v, TIER_HOST), 2);
        assert_int_equal(verify(w.v, 1), 0);
        assert_int_equal(target_counter(&w, "io_errors"), 1);
        /* the rule is spent: the next drain writes it, and it reads back from NVMe */
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(state_of(w.v, TIER_HOST), 0);
        assert_int_equal(verify(w.v, 1), 0);
        world_stop(&w);
}

/*
 * Drains tierd starts by itself to make room (the victim at its host limit)
 * all fail: the pin that needed the room fails and says why; every copy
 * that was to be written down is still resident and right.
 */
static void test_write_eio_spill(void **state) {
        enum { N = 8 };
        tier_tensor *t[N];
        struct tier_grant g;
        char name[16];
        World w;
        int r;

        world_start(&w, "nvme-write-eio:job=victim", false);
        /* 1 + 7 x 4 MiB = 29 MiB of the victim's 32 MiB host limit, all sole copies */
        for (unsigned i = 0; i < N - 1; i++) {
                snprintf(name, sizeof(name), "s%u", i);
                assert_int_equal(tier_tensor_create(w.vc, name, 4 * MiB, &t[i]), 0);
                fill(t[i], 10 + i);
        }
        assert_int_equal(tier_tensor_create(w.vc, "s7", 4 * MiB, &t[N - 1]), 0);
        r = tier_pin(t[N - 1], TIER_HOST, TIER_READ_WRITE, &g);
        assert_true(r < 0);
        assert_error_contains(w.vc, "Input/output error");
        assert_true(target_counter(&w, "io_errors") >= 1);
        for (unsigned i = 0; i < N - 1; i++) {
                assert_int_equal(state_of(t[i], TIER_HOST), 2);
                assert_int_equal(state_of(t[i], TIER_NVME), 0);
                assert_int_equal(verify(t[i], 10 + i), 0);
        }
        assert_int_equal(verify(w.v, 1), 0);
        /*
         * Each failed drain is tried once: the room a failed one gives back
         * must not unblock the others (before the fix in xfer_finish() they
         * drained each other in a loop, millions of log lines a minute).
         */
        assert_int_equal(log_count(&w, "Cannot write tensor 's0' of job 'victim'"), 1);
        assert_int_equal(log_count(&w, "Cannot write tensor 's1' of job 'victim'"), 1);
        for (unsigned i = 0; i < N; i++)
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        world_stop(&w);
}

static void test_write_eio(void **state) {
        write_fails("nvme-write-eio:job=victim,count=2", -EIO, "Input/output error");
}

static void test_write_enospc(void **state) {
        write_fails("nvme-write-enospc:job=victim,count=2", -ENOSPC, "No space left on device");
}

/* ---- short transfers, late completions: resumed and waited for, no error ------------------- */

static void test_short_io(void **state) {
        World w;

        world_start(&w, "nvme-read-short:job=victim;nvme-write-short:job=victim", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(verify(w.v, 1), 0);
        assert_true(test_daemon_log_contains(&w.d, "Injected fault nvme-write-short"));
        assert_true(test_daemon_log_contains(&w.d, "Injected fault nvme-read-short"));
        assert_int_equal(target_counter(&w, "io_errors"), 0);
        assert_int_equal(target_counter(&w, "crc_errors"), 0);
        world_stop(&w);
}

static void test_delay(void **state) {
        World w;

        world_start(&w, "nvme-delay:job=victim,ms=200", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(verify(w.v, 1), 0);
        assert_true(test_daemon_log_contains(&w.d, "Injected fault nvme-delay"));
        assert_int_equal(target_counter(&w, "io_errors"), 0);
        world_stop(&w);
}

/*
 * A stop whose write-down of a lingering job's tensor is still on its way when the job's linger ends
 * (the job and its tensor go): the stop waits for the transfer only, not for its 10 s bound, and calls
 * nothing lost.  The write-down's op was cancelled with no one told, and the stop waited for it.
 */
static void test_stop_while_a_job_lingers_out(void **state) {
        char config[1024];
        World w;

        (void) snprintf(config, sizeof(config), "%s[daemon]\nlinger_sec = 1\n", CONFIG);
        world_start_config(&w, config, "nvme-delay:job=victim,ms=6000", true);
        assert_int_equal(tier_tensor_destroy(w.b), 0);
        tier_client_free(w.bc);
        tier_tensor_close(w.v);
        tier_client_free(w.vc);                         /* 'victim' lingers for 1 s, its tensor in host only */
        assert_int_equal(test_daemon_kill(&w.d, SIGTERM, 30000), 0);
        assert_true(test_daemon_log_contains(&w.d, "Stopping: writing 1 tensor(s)"));
        assert_false(test_daemon_log_contains(&w.d, "were not written down to NVMe"));
        test_daemon_cleanup(&w.d);
}

/* ---- the medium ----------------------------------------------------------------------------- */

/*
 * A bit flipped on the medium after the write: the crc32c catches it on every read, no bad byte is
 * served, and the client gets -EIO saying "crc32c mismatch" (-EBADMSG, as it was, means "the
 * connection is unusable" to libtier's users).  Each counts on the target and on the job whose
 * tensor it was (an operator sees which job's tensors fail), not on the bystander.
 */
static void test_bitflip(void **state) {
        World w;

        world_start(&w, "nvme-bitflip:job=victim,count=1", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);
        assert_int_equal(verify(w.v, 1), -EIO);
        assert_error_contains(w.vc, "crc32c mismatch");
        assert_int_equal(state_of(w.v, TIER_HOST), 0);
        assert_int_equal(target_counter(&w, "crc_errors"), 1);
        assert_int_equal(job_counter(&w, "victim", "nvme_crc_errors"), 1);
        assert_int_equal(verify(w.v, 1), -EIO);
        assert_int_equal(target_counter(&w, "crc_errors"), 2);
        assert_int_equal(job_counter(&w, "victim", "nvme_crc_errors"), 2);
        assert_int_equal(target_counter(&w, "io_errors"), 0);
        assert_int_equal(verify(w.b, 2), 0);            /* the bystander's read back from NVMe counts nothing */
        assert_int_equal(job_counter(&w, "bystander", "nvme_crc_errors"), 0);
        world_stop(&w);
}

/*
 * The target disappears: every request to it fails from then on, with -EIO (the drive's ENODEV
 * means another thing to libtier's users) saying "No such device"; host copies stay valid, every
 * job's.
 */
static void test_vanish(void **state) {
        World w;

        world_start(&w, "nvme-vanish:job=victim", true);
        assert_int_equal(tier_evict(w.v, TIER_NVME), -EIO);
        assert_error_contains(w.vc, "No such device");
        assert_int_equal(state_of(w.v, TIER_NVME), 0);
        assert_int_equal(verify(w.v, 1), 0);
        assert_true(target_counter(&w, "io_errors") >= 1);
        /* the drive is gone for the bystander too, but its request fails alone and its bytes stay */
        assert_int_equal(tier_evict(w.b, TIER_NVME), -EIO);
        assert_error_contains(w.bc, "No such device");
        assert_int_equal(state_of(w.b, TIER_HOST), 2);
        world_stop(&w);
}

/* ---- the VRAM link (emulated backend) -------------------------------------------------------- */

static void pin_write_vram(tier_tensor *t, uint64_t idx) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_VRAM, TIER_READ_WRITE, &g), 0);
        assert_non_null(g.ptr);
        for (uint64_t i = 0; i < g.length; i++)
                ((uint8_t *) g.ptr)[i] = pattern(idx, i);
        assert_int_equal(tier_unpin(t, TIER_VRAM, 1), 0);
}

static void verify_vram(tier_tensor *t, uint64_t idx) {
        struct tier_grant g;

        assert_int_equal(tier_pin(t, TIER_VRAM, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < g.length; i++)
                assert_int_equal(((uint8_t *) g.ptr)[i], pattern(idx, i));
        assert_int_equal(tier_unpin(t, TIER_VRAM, 0), 0);
}

/* host -> VRAM fails (no retry on the link): the pin fails, the host copy stays; the bystander's copy goes through. */
static void test_vram_h2d_eio(void **state) {
        struct tier_grant g;
        World w;

        world_start(&w, "vram-h2d-eio:job=victim,count=1", false);
        assert_int_equal(tier_pin(w.v, TIER_VRAM, TIER_READ_WRITE, &g), -EIO);
        assert_error_contains(w.vc, "VRAM copy failed: Input/output error");
        assert_int_equal(state_of(w.v, TIER_VRAM), 0);
        assert_int_equal(state_of(w.v, TIER_HOST), 2);
        assert_int_equal(verify(w.v, 1), 0);
        verify_vram(w.b, 2);
        /* the rule is spent */
        verify_vram(w.v, 1);
        assert_true(test_daemon_log_contains(&w.d, "Injected fault vram-h2d-eio"));
        world_stop(&w);
}

/* @job's use of @tier now, by tierd's status. */
static long long job_used(World *w, const char *job, const char *tier) {
        json_t *status = test_daemon_status(&w->d);
        long long n;

        assert_non_null(status);
        n = test_json_job_tier(status, job, tier, "used");
        json_decref(status);
        return n;
}

/*
 * NVMe -> VRAM goes piece by piece (chained): extents 0 and 1 of the
 * bystander's 4 MiB are read and copied on, the reads of extents 2 and 3
 * fail (and their retries): the pin fails, neither host nor VRAM holds a copy, all their room
 * is back, and the NVMe copy still reads back whole, straight into VRAM.
 */
static void test_read_eio_mid_tensor_to_vram(void **state) {
        struct tier_grant g;
        World w;

        world_start(&w, "nvme-read-eio:job=bystander,after=2,count=4", false);
        assert_int_equal(job_used(&w, "bystander", "vram"), 0);
        assert_int_equal(job_used(&w, "bystander", "host"), 0);
        assert_int_equal(tier_pin(w.b, TIER_VRAM, TIER_READ_WRITE, &g), -EIO);
        assert_error_contains(w.bc, "I/O error");
        assert_int_equal(state_of(w.b, TIER_VRAM), 0);
        assert_int_equal(state_of(w.b, TIER_HOST), 0);
        assert_int_equal(state_of(w.b, TIER_NVME), 2);
        assert_int_equal(job_used(&w, "bystander", "vram"), 0);
        assert_int_equal(job_used(&w, "bystander", "host"), 0);
        assert_int_equal(target_counter(&w, "io_errors"), 2);
        /* one chained transfer failed, not a read into host followed by a copy */
        assert_true(test_daemon_log_contains(&w.d, "Transfer of tensor 'b' of job 'bystander' nvme->vram failed"));
        /* the rule is spent */
        verify_vram(w.b, 2);
        assert_int_equal(state_of(w.b, TIER_HOST), 2);
        world_stop(&w);
}

/* VRAM -> host fails: the evict fails, the VRAM copy (the only valid one) stays and is right. */
static void test_vram_d2h_eio(void **state) {
        World w;

        world_start(&w, "vram-d2h-eio:job=victim,count=1", false);
        pin_write_vram(w.v, 3);
        assert_int_equal(tier_evict(w.v, TIER_HOST), -EIO);
        assert_error_contains(w.vc, "VRAM copy failed");
        assert_int_equal(state_of(w.v, TIER_VRAM), 2);
        assert_int_equal(state_of(w.v, TIER_HOST), 0);
        verify_vram(w.v, 3);
        assert_int_equal(tier_evict(w.v, TIER_HOST), 0);
        assert_int_equal(state_of(w.v, TIER_VRAM), 0);
        assert_int_equal(verify(w.v, 3), 0);
        world_stop(&w);
}

/* ---- a bad value stops tierd at start, saying why --------------------------------------------- */

/* ---- a rollback while tierd moves the job's tensors ----------------------------------------- */

/* Wait up to @ms for tierd's log to hold @needle more than @n times; fails the test after. */
static void wait_log_count(const World *w, const char *needle, unsigned n, int ms) {
        for (int i = 0; i < ms / 10 && log_count(w, needle) <= n; i++)
                (void) usleep(10 * 1000);
        if (log_count(w, needle) <= n) {
                fprintf(stderr, "tierd's log does not hold '%s' more than %u times after %d ms\n", needle, n, ms);
                test_daemon_dump_log(&w->d);
                fail();
        }
}

/* A child: tierctl evict of job @job down to NVMe, from a control connection; exits 0 when it was answered. */
static pid_t evict_child(const World *w, const char *job) {
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0) {
                struct tier_evict_result res;
                tier_client *ctl = NULL;
                int r = tier_client_new(w->d.socket, NULL, 0, &ctl);

                if (r == 0)
                        r = tier_job_evict(ctl, job, TIER_NVME, &res);
                tier_client_free(ctl);
                _exit(r == 0 ? 0 : 1);
        }
        return pid;
}

static int wait_child(pid_t pid) {
        int st = 0;

        assert_int_equal(waitpid(pid, &st, 0), pid);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/*
 * An operator's evict writes the job's tensor down, its completion held
 * back 1.5 s, when the job rolls back: the rollback cancels tierd's own
 * op, waits for the transfer to end and then brings the committed bytes
 * back (it used to answer EBUSY while the transfer ran).  Whatever the
 * timing, the rollback succeeds with the commit's data; afterwards the
 * job's tensors may move again (the evict takes them).
 */
static void test_rollback_waits_for_transfers(void **state) {
        struct tier_evict_result res;
        struct tier_commit cm = {};
        tier_client *ctl = NULL;
        unsigned delays;
        World w;
        pid_t pid;

        (void) state;
        world_start(&w, "nvme-delay:job=victim,ms=1500", false);
        assert_int_equal(tier_job_commit(w.vc, 7), 0);
        fill(w.v, 3);           /* its committed bytes lay in host only: written down first */
        delays = log_count(&w, "Injected fault nvme-delay");
        pid = evict_child(&w, "victim");
        /* the evict's write is done, its completion held back from here */
        wait_log_count(&w, "Injected fault nvme-delay", delays, 30000);
        if (tier_job_rollback(w.vc, &cm) < 0)
                fprintf(stderr, "rollback: %s\n", tier_client_last_error(w.vc));
        assert_int_equal(cm.committed, 1);
        assert_int_equal(cm.step, 7);
        assert_int_equal(cm.rolled_back, 1);
        assert_int_equal(cm.lost, 0);
        assert_int_equal(wait_child(pid), 0);
        assert_int_equal(verify(w.v, 1), 0);
        /* thawed: tierd moves the job's tensors again */
        assert_int_equal(tier_client_new(w.d.socket, NULL, 0, &ctl), 0);
        assert_int_equal(tier_job_evict(ctl, "victim", TIER_NVME, &res), 0);
        assert_int_equal(res.pinned, 0);
        assert_int_equal(res.failed, 0);
        assert_int_equal(res.evicted, 1);
        tier_client_free(ctl);
        assert_int_equal(state_of(w.v, TIER_HOST), 0);
        assert_int_equal(verify(w.v, 1), 0);
        world_stop(&w);
}

/* A pin, or a client's request, is the caller's to end: the rollback says so at once and changes nothing. */
static void test_rollback_refused_while_pinned(void **state) {
        struct tier_commit cm = {};
        struct tier_grant g;
        tier_client *c2;
        tier_tensor *v2;
        World w;

        (void) state;
        world_start(&w, "nvme-delay:job=nobody,ms=1", false);
        assert_int_equal(tier_job_commit(w.vc, 3), 0);
        fill(w.v, 4);
        assert_int_equal(tier_client_new(w.d.socket, "victim", 1, &c2), 0);
        assert_int_equal(tier_tensor_open(c2, "v", &v2), 0);
        assert_int_equal(tier_pin(v2, TIER_HOST, TIER_READ, &g), 0);
        assert_int_equal(tier_job_rollback(w.vc, &cm), -EBUSY);
        assert_error_contains(w.vc, "tensor 'v' is pinned (in host)");
        assert_int_equal(verify(w.v, 4), 0);       /* nothing changed */
        assert_int_equal(tier_unpin(v2, TIER_HOST, 0), 0);
        assert_int_equal(tier_job_rollback(w.vc, &cm), 0);
        assert_int_equal(cm.rolled_back, 1);
        assert_int_equal(verify(w.v, 1), 0);
        tier_tensor_close(v2);
        tier_client_free(c2);
        world_stop(&w);
}

/*
 * The connection of a waiting rollback goes (its process is killed): the
 * wait ends unanswered and the job thaws; tierd goes on (the transfer it
 * waited for is held back a minute, so the rollback surely waits).
 */
static void test_rollback_connection_gone_while_waiting(void **state) {
        World w;
        pid_t evict, roll;

        (void) state;
        world_start(&w, "nvme-delay:job=victim,ms=60000,after=1,count=1", false);
        assert_int_equal(tier_job_commit(w.vc, 5), 0);
        fill(w.v, 6);           /* its committed bytes are written down first: the one write not held */
        evict = evict_child(&w, "victim");
        wait_log_count(&w, "Injected fault nvme-delay", 0, 30000);
        roll = fork();
        assert_true(roll >= 0);
        if (roll == 0) {
                struct tier_commit cm;
                tier_client *c = NULL;

                if (tier_client_new(w.d.socket, "victim", 1, &c) == 0)
                        (void) tier_job_rollback(c, &cm);
                _exit(0);
        }
        wait_log_count(&w, "its rollback waits for the transfers", 0, 30000);
        assert_int_equal(kill(roll, SIGKILL), 0);
        assert_int_equal(wait_child(roll), 128 + SIGKILL);
        wait_log_count(&w, "its rollback ended unanswered", 0, 30000);
        json_decref(test_daemon_status(&w.d));  /* tierd goes on */
        tier_tensor_close(w.v);
        tier_client_free(w.vc);
        tier_tensor_close(w.b);
        tier_client_free(w.bc);
        /* the held-back transfer would keep a clean stop a minute */
        (void) test_daemon_kill(&w.d, SIGKILL, 10000);
        test_daemon_cleanup(&w.d);
        /* the rollback cancelled the evict's op, so the evict was answered */
        assert_int_equal(wait_child(evict), 0);
}

/*
 * An unpin while the bytes of the connection's async pin are still coming
 * (the read held back a minute) is refused, and changes nothing: the pin
 * the op holds is the op's until the bytes are there.  It used to drop that
 * pin, and the op dropped it again when it ended (here: its connection
 * went), so the count of pins wrapped below zero and the tensor could never
 * be freed; with another connection's pin in between, its copy counted as
 * unpinned while that one wrote into it.
 */
static void test_unpin_before_async_pin_refused(void **state) {
        struct tier_grant g;
        struct tier_stat st;
        tier_fence f;
        tier_client *c2;
        tier_tensor *v2;
        World w;

        (void) state;
        world_start(&w, "nvme-delay:job=victim,ms=60000,after=1,count=1", false);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);        /* the one write not held */
        assert_int_equal(state_of(w.v, TIER_HOST), 0);
        assert_int_equal(tier_pin_async(w.v, TIER_HOST, TIER_READ, &g, &f), 0);
        wait_log_count(&w, "Injected fault nvme-delay", 0, 30000);
        assert_int_equal(tier_unpin(w.v, TIER_HOST, 0), -EBUSY);
        assert_error_contains(w.vc, "the bytes of its async pin are still coming");
        assert_int_equal(tier_tensor_stat(w.v, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 1);
        /* its connection goes: the op's pin goes with it, once */
        tier_tensor_close(w.v);
        tier_client_free(w.vc);
        assert_int_equal(tier_client_new(w.d.socket, "victim", 1, &c2), 0);
        assert_int_equal(tier_tensor_open(c2, "v", &v2), 0);
        assert_int_equal(tier_tensor_stat(v2, &st), 0);
        assert_int_equal(st.pins[TIER_HOST], 0);
        assert_int_equal(tier_tensor_destroy(v2), 0);
        tier_client_free(c2);
        tier_tensor_close(w.b);
        tier_client_free(w.bc);
        /* the held-back transfer would keep a clean stop a minute */
        (void) test_daemon_kill(&w.d, SIGKILL, 10000);
        test_daemon_cleanup(&w.d);
}

static void test_invalid_spec(void **state) {
        TestDaemon d;
        TestDaemonOptions o = { .wait_ready = true };
        int r;

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(setenv("TIERD_TEST_FAULTS", "nvme-read-eio:every=0", 1), 0);
        r = test_daemon_spawn(&d, &o);
        unsetenv("TIERD_TEST_FAULTS");
        assert_true(r < 0);
        assert_true(test_daemon_log_contains(&d, "Invalid TIERD_TEST_FAULTS"));
        test_daemon_cleanup(&d);
}

/*
 * A job's wear (the bytes written to NVMe under its name in all: status's wear_written,
 * tierd_job_wear_written_bytes_total) counts those of the earlier job of its name that is still
 * ending: detached while its write-down is held back a minute, that job goes only when the write
 * ends.  The new job of that name started from the book as it was, without the bytes of a job not
 * yet gone, and never got them: 0 here instead of the 1 MiB its name wrote.
 */
static void test_wear_counts_a_job_still_ending(void **state) {
        struct tier_detach_result res;
        tier_client *ctl = NULL, *again;
        tier_tensor *u = NULL;
        tier_fence f;
        json_t *st;
        World w;

        (void) state;
        world_start(&w, "nvme-delay:job=victim,ms=60000,after=1,count=1", true);
        assert_int_equal(tier_evict(w.v, TIER_NVME), 0);        /* the one write not held: 1 MiB */
        assert_int_equal(tier_tensor_create(w.vc, "u", MiB, &u), 0);
        fill(u, 3);
        assert_int_equal(tier_evict_async(u, TIER_NVME, &f), 0);
        wait_log_count(&w, "Injected fault nvme-delay", 0, 30000);
        assert_int_equal(tier_client_new(w.d.socket, NULL, 0, &ctl), 0);
        assert_int_equal(tier_job_detach(ctl, "victim", &res), 0);
        tier_tensor_close(u);
        tier_tensor_close(w.v);
        tier_client_free(w.vc);
        again = connect_job(&w, "victim");      /* a new job of the name, the old one still ending */
        st = test_daemon_status(&w.d);
        assert_non_null(st);
        assert_int_equal(json_integer_value(json_object_get(test_json_job(st, "victim"), "nvme_written")), 0);
        assert_int_equal(json_integer_value(json_object_get(test_json_job(st, "victim"), "wear_written")), MiB);
        json_decref(st);
        tier_client_free(again);
        tier_client_free(ctl);
        tier_tensor_close(w.b);
        tier_client_free(w.bc);
        /* the held-back transfer would keep a clean stop a minute */
        (void) test_daemon_kill(&w.d, SIGKILL, 10000);
        test_daemon_cleanup(&w.d);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_read_eio_retried),
                cmocka_unit_test(test_read_eio_fails),
                cmocka_unit_test(test_read_eio_plan),
                cmocka_unit_test(test_read_eio_one_target),
                cmocka_unit_test(test_write_eio),
                cmocka_unit_test(test_write_eio_spill),
                cmocka_unit_test(test_write_enospc),
                cmocka_unit_test(test_short_io),
                cmocka_unit_test(test_delay),
                cmocka_unit_test(test_bitflip),
                cmocka_unit_test(test_vanish),
                cmocka_unit_test(test_vram_h2d_eio),
                cmocka_unit_test(test_vram_d2h_eio),
                cmocka_unit_test(test_read_eio_mid_tensor_to_vram),
                cmocka_unit_test(test_rollback_waits_for_transfers),
                cmocka_unit_test(test_rollback_refused_while_pinned),
                cmocka_unit_test(test_rollback_connection_gone_while_waiting),
                cmocka_unit_test(test_unpin_before_async_pin_refused),
                cmocka_unit_test(test_wear_counts_a_job_still_ending),
                cmocka_unit_test(test_stop_while_a_job_lingers_out),
                cmocka_unit_test(test_invalid_spec),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
