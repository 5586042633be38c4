/* SPDX-License-Identifier: MIT */
/* test-cuda.c: tierd's cuda VRAM backend end to end: a real tierd, libtier clients, a CUDA driver. */

/*
 * The same program runs in two places:
 *   - under meson test, everywhere: $TIER_FAKE_CUDA names the fake driver
 *     (tests/helpers/fake-cuda.c), which becomes $TIER_LIBCUDA for tierd and
 *     for the clients here.  "Device memory" is then memfds, and the fake's
 *     counters show which driver calls libtier made;
 *   - on a machine with an NVIDIA GPU, from tests/gpu/run.sh, with
 *     TIER_FAKE_CUDA and TIER_LIBCUDA unset: the real driver.  A few checks
 *     only make sense there (a pending kernel really delays a copy).
 * Without any usable CUDA it exits 77 (skipped) and says why.
 *
 * Clients write and read VRAM only through the driver (cuMemcpyHtoD,
 * cuMemsetD8Async...) at the device_ptr of their grants, in the primary
 * context of tierd's GPU, exactly as an application would.  Tests that
 * need separate processes run this program again (its own path) with a
 * role argument, so no process forks after initialising CUDA.
 */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <tier.h>

#include "proto/cudrv.h"
#include "proto/macro.h"
#include "tests/helpers/fake-cuda.h"
#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"
#include "util/time-util.h"

#define MiB ((uint64_t) 1 << 20)

static TestDaemon daemon_;
static bool fake;               /* the fake driver, not a GPU */
static fake_cuda_stats_t fake_stats;
static char self[4096];         /* this program, to run it again (valgrind's /proc/self/exe is valgrind) */
static uint64_t chunk;          /* [vram] chunk_size */
static unsigned n_chunks;       /* [vram] capacity / chunk */

/* ---- CUDA of this process ------------------------------------------------------------------ */

typedef struct Gpu {
        CuDriver *d;
        CUdevice dev;
        CUcontext ctx;
} Gpu;

static Gpu gpu;

/* The driver, current on tierd's GPU (as named by @c). */
static Gpu *gpu_get(tier_client *c) {
        _cleanup_free_ char *why = NULL;

        if (gpu.d)
                return &gpu;
        if (cudrv_open(&gpu.d, &why) < 0)
                fail_msg("cannot load CUDA: %s", why ? why : "?");
        if (gpu.d->cuDeviceGetByPCIBusId(&gpu.dev, tier_client_vram_device(c)) != CUDA_SUCCESS ||
            gpu.d->cuDevicePrimaryCtxRetain(&gpu.ctx, gpu.dev) != CUDA_SUCCESS ||
            gpu.d->cuCtxSetCurrent(gpu.ctx) != CUDA_SUCCESS)
                fail_msg("cannot use tierd's GPU %s", tier_client_vram_device(c));
        return &gpu;
}

/* Write @v over [@dptr, +@len) and wait for it: tierd's copies are not ordered after this process's streams. */
static void gpu_fill(tier_client *c, uint64_t dptr, uint8_t v, uint64_t len) {
        assert_int_equal(gpu_get(c)->d->cuMemsetD8(dptr, v, len), CUDA_SUCCESS);
        assert_int_equal(gpu_get(c)->d->cuStreamSynchronize(NULL), CUDA_SUCCESS);
}

static bool gpu_check(tier_client *c, uint64_t dptr, uint8_t v, uint64_t len) {
        uint8_t *buf = malloc(len);
        bool ok = true;

        assert_non_null(buf);
        assert_int_equal(gpu_get(c)->d->cuMemcpyDtoH(buf, dptr, len), CUDA_SUCCESS);
        for (uint64_t i = 0; i < len && ok; i++)
                if (buf[i] != v) {
                        fprintf(stderr, "device byte %" PRIu64 " is 0x%02x, expected 0x%02x\n", i, buf[i], v);
                        ok = false;
                }
        free(buf);
        return ok;
}

static FakeCudaStats stats(void) {
        FakeCudaStats s = {};

        if (fake_stats)
                fake_stats(&s);
        return s;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

/*
 * The clients a test has open: a test that fails part-way leaves its job
 * connected, and the tests after it would fail waiting for it to end, so
 * the per-test teardown disconnects what is left.
 */
static tier_client *live[8];

static tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(daemon_.socket, job, 0, &c);

        if (r < 0)
                fail_msg("connect as '%s': %s (%s)", job, tier_strerror(r), tier_client_last_error(NULL));
        for (size_t i = 0; i < ELEMENTSOF(live); i++)
                if (!live[i]) {
                        live[i] = c;
                        break;
                }
        return c;
}

static void disconnect(tier_client *c) {
        for (size_t i = 0; i < ELEMENTSOF(live); i++)
                if (live[i] == c)
                        live[i] = NULL;
        tier_client_free(c);
}

static int disconnect_leftovers(void **state) {
        for (size_t i = 0; i < ELEMENTSOF(live); i++)
                if (live[i]) {
                        tier_client_free(live[i]);
                        live[i] = NULL;
                }
        return 0;
}

/* Pin @t in VRAM and check what a cuda grant looks like. */
static struct tier_grant pin_vram(tier_client *c, tier_tensor *t) {
        struct tier_grant g;
        int r = tier_pin(t, TIER_VRAM, TIER_READ_WRITE, &g);

        if (r < 0) {
                fprintf(stderr, "pin '%s' in vram: %s (%s)\n", tier_tensor_name(t), tier_strerror(r),
                        tier_client_last_error(c));
                test_daemon_dump_log(&daemon_);
                fail_msg("pin '%s' in vram: %s", tier_tensor_name(t), tier_strerror(r));
        }
        assert_null(g.ptr);
        assert_true(g.device_ptr != 0);
        assert_int_equal(g.tier, TIER_VRAM);
        assert_int_equal(g.length, tier_tensor_size(t));
        return g;
}

/* The number of jobs in tierd's status. */
static size_t n_jobs(const json_t *status) {
        const json_t *jobs = json_object_get(status, "jobs");

        assert_true(json_is_array(jobs));
        return json_array_size(jobs);
}

/* Jobs of earlier tests linger a second (linger_sec = 1) and hold chunks meanwhile: wait them out. */
static void wait_no_jobs(void) {
        json_t *status = NULL;

        for (int i = 0; i < 100; i++) {
                json_decref(status);
                status = test_daemon_status(&daemon_);
                assert_non_null(status);
                if (n_jobs(status) == 0)
                        break;
                usleep(100 * 1000);
        }
        if (n_jobs(status) != 0) {
                _cleanup_free_ char *text = json_dumps(status, JSON_COMPACT);

                fail_msg("jobs still there: %s", text);
        }
        json_decref(status);
}

/* Run this program again as @role; returns its pid. */
static pid_t spawn(const char *role, const char *a, const char *b, int out_fd) {
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0) {
                if (out_fd >= 0)
                        dup2(out_fd, STDOUT_FILENO);
                execl(self, "test-cuda", role, daemon_.socket, a, b, (char *) NULL);
                _exit(127);
        }
        return pid;
}

static int wait_exit(pid_t pid) {
        int st;

        assert_int_equal(waitpid(pid, &st, 0), pid);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- child roles ---------------------------------------------------------------------------------- */

/*
 * "writer SOCKET JOB PATTERN": three tensors of JOB written with PATTERN
 * through this process's own mappings, evicted to NVMe, brought back, checked.
 */
static int role_writer(const char *socket_path, const char *job, unsigned pattern) {
        const uint64_t sizes[3] = { chunk / 2, chunk / 4 + 4096, 12345 };
        tier_tensor *t[3];
        tier_client *c = NULL;
        char name[32];
        int r;

        r = tier_client_new(socket_path, job, 0, &c);
        if (r < 0) {
                fprintf(stderr, "writer %s: connect: %s\n", job, tier_client_last_error(NULL));
                return 1;
        }
        for (int i = 0; i < 3; i++) {
                struct tier_grant g;

                snprintf(name, sizeof(name), "w%d", i);
                if (tier_tensor_create(c, name, sizes[i], &t[i]) < 0 || tier_pin(t[i], TIER_VRAM, TIER_READ_WRITE, &g) < 0 ||
                    !g.device_ptr) {
                        fprintf(stderr, "writer %s: pin %s: %s\n", job, name, tier_client_last_error(c));
                        return 1;
                }
                gpu_fill(c, g.device_ptr, (uint8_t) (pattern + i), sizes[i]);
                if (tier_unpin(t[i], TIER_VRAM, 1) < 0 || tier_evict(t[i], TIER_NVME) < 0) {
                        fprintf(stderr, "writer %s: evict %s: %s\n", job, name, tier_client_last_error(c));
                        return 1;
                }
        }
        for (int i = 0; i < 3; i++) {
                struct tier_stat st;
                struct tier_grant g;

                if (tier_tensor_stat(t[i], &st) < 0 || st.state[TIER_VRAM] != 0 || st.state[TIER_NVME] != 2) {
                        fprintf(stderr, "writer %s: tensor %d not on NVMe only after evict\n", job, i);
                        return 1;
                }
                if (tier_prefetch(t[i], TIER_VRAM) < 0 || tier_pin(t[i], TIER_VRAM, TIER_READ_WRITE, &g) < 0) {
                        fprintf(stderr, "writer %s: prefetch %d: %s\n", job, i, tier_client_last_error(c));
                        return 1;
                }
                if (!gpu_check(c, g.device_ptr, (uint8_t) (pattern + i), sizes[i])) {
                        fprintf(stderr, "writer %s: tensor %d came back wrong\n", job, i);
                        return 1;
                }
                (void) tier_unpin(t[i], TIER_VRAM, 0);
                (void) tier_tensor_destroy(t[i]);
        }
        tier_client_free(c);
        return 0;
}

/* "holder SOCKET JOB N": pin N chunk-sized tensors of JOB in VRAM, write them, say "ready", wait to be killed. */
static int role_holder(const char *socket_path, const char *job, unsigned n) {
        tier_client *c = NULL;
        char name[32];

        if (tier_client_new(socket_path, job, 0, &c) < 0)
                return 1;
        for (unsigned i = 0; i < n; i++) {
                struct tier_grant g;
                tier_tensor *t;

                snprintf(name, sizeof(name), "h%u", i);
                if (tier_tensor_create(c, name, chunk, &t) < 0 || tier_pin(t, TIER_VRAM, TIER_READ_WRITE, &g) < 0) {
                        fprintf(stderr, "holder: %s\n", tier_client_last_error(c));
                        return 1;
                }
                gpu_fill(c, g.device_ptr, 0xee, chunk);
        }
        printf("ready\n");
        fflush(stdout);
        for (;;)
                pause();
}

/* ---- tests -------------------------------------------------------------------------------------------- */

static void test_backend(void **state) {
        tier_client *c = connect_job("backend");

        assert_string_equal(tier_client_vram_backend(c), "cuda");
        assert_true(strlen(tier_client_vram_device(c)) >= 12);
        if (fake)
                assert_string_equal(tier_client_vram_device(c), FAKE_CUDA_PCI_BUS_ID);
        disconnect(c);
}

/* Two processes of two jobs write VRAM through their own mappings; NVMe and back; each sees its own bytes. */
static void test_two_jobs(void **state) {
        pid_t a = spawn("writer", "job-a", "16", -1);
        pid_t b = spawn("writer", "job-b", "160", -1);

        assert_int_equal(wait_exit(a), 0);
        assert_int_equal(wait_exit(b), 0);
}

/* One import per chunk generation, whatever the number of grants into it; stream-ordered async pin. */
static void test_mapping_cache(void **state) {
        tier_client *c = connect_job("cache");
        FakeCudaStats s0 = stats(), s1;
        struct tier_grant g1, g2, g3;
        tier_tensor *t1, *t2;
        tier_fence f;

        assert_int_equal(tier_tensor_create(c, "t1", chunk / 4, &t1), 0);
        assert_int_equal(tier_tensor_create(c, "t2", chunk / 4, &t2), 0);
        g1 = pin_vram(c, t1);
        g2 = pin_vram(c, t2);
        /* same chunk: one mapping, the grants differ by their offsets */
        assert_int_equal(g1.segment, g2.segment);
        assert_int_equal(g1.device_ptr - g1.offset, g2.device_ptr - g2.offset);
        s1 = stats();
        if (fake)
                assert_int_equal(s1.imports - s0.imports, 1);

        gpu_fill(c, g1.device_ptr, 0x42, chunk / 4);
        assert_int_equal(tier_unpin(t1, TIER_VRAM, 1), 0);
        assert_int_equal(tier_evict(t1, TIER_HOST), 0);         /* now only in host memory */

        /* async pin: the copy up is queued; the stream waits for it on the device */
        assert_int_equal(tier_pin_async(t1, TIER_VRAM, TIER_READ_WRITE, &g3, &f), 0);
        assert_int_equal(g3.device_ptr - g3.offset, g1.device_ptr - g1.offset);
        assert_int_equal(tier_fence_stream_wait(c, f, NULL), 0);
        assert_int_equal(gpu_get(c)->d->cuStreamSynchronize(NULL), CUDA_SUCCESS);
        assert_true(gpu_check(c, g3.device_ptr, 0x42, chunk / 4));
        assert_int_equal(tier_fence_wait(c, f, 10000), 0);
        if (fake)
                assert_int_equal(stats().imports - s0.imports, 1);

        assert_int_equal(tier_unpin(t1, TIER_VRAM, 0), 0);
        assert_int_equal(tier_unpin(t2, TIER_VRAM, 0), 0);
        assert_int_equal(tier_tensor_destroy(t1), 0);
        assert_int_equal(tier_tensor_destroy(t2), 0);
        disconnect(c);
        if (fake)
                assert_int_equal(stats().unmaps - s0.unmaps, 1);
}

/* A tensor over two chunks and a bit: one device range, written by the GPU, down to NVMe, back, the same bytes. */
/*
 * A tensor over three chunks, its tail shorter than a chunk, in a job whose
 * first chunk already holds a small tensor at its start: the GPU maps only
 * whole chunks, so tierd puts the tail at the start of a chunk of its own
 * and libtier maps the three chunks side by side.
 */
static void test_spanning(void **state) {
        tier_client *c = connect_job("span");
        uint64_t size = 2 * chunk + MiB + 4097;
        struct tier_grant g, gs;
        uint8_t expect = 0x5a;
        tier_tensor *t, *small;

        assert_int_equal(tier_tensor_create(c, "small", MiB, &small), 0);
        gs = pin_vram(c, small);
        gpu_fill(c, gs.device_ptr, 0x77, MiB);
        assert_true(tier_client_tensor_max(c, TIER_VRAM) >= size);
        assert_int_equal(tier_client_segment_size(c, TIER_VRAM), chunk);
        assert_int_equal(tier_tensor_create(c, "big", size, &t), 0);
        g = pin_vram(c, t);                /* one range over three chunks */
        gpu_fill(c, g.device_ptr, 0x5a, size);
        assert_true(gpu_check(c, gs.device_ptr, 0x77, MiB));
        {
                /* the job's four chunks are in use: a second one finds no whole chunk, and is told why */
                tier_tensor *t2;
                struct tier_grant g2;

                assert_int_equal(tier_tensor_create(c, "big2", chunk + MiB, &t2), 0);
                assert_int_equal(tier_pin(t2, TIER_VRAM, TIER_READ_WRITE, &g2), -ENOSPC);
                assert_non_null(strstr(tier_client_last_error(c), "its tail at the start of one: a GPU maps only "
                                                                    "whole chunks"));
                assert_int_equal(tier_tensor_destroy(t2), 0);
        }
        assert_int_equal(tier_unpin(small, TIER_VRAM, 0), 0);
        assert_int_equal(tier_tensor_destroy(small), 0);
        assert_int_equal(tier_unpin(t, TIER_VRAM, 1), 0);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);

        /*
         * Through host memory too, where it spans segments as well; valgrind
         * cannot map that range (it does not emulate mremap() with an old size
         * of 0), so under valgrind the bytes come back to VRAM unseen.
         */
        if (!(getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "vgpreload"))) {
                assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
                for (uint64_t i = 0; i < size; i++)
                        if (((uint8_t *) g.ptr)[i] != 0x5a)
                                fail_msg("host byte %" PRIu64 " of %" PRIu64 " is 0x%02x", i, size,
                                         ((uint8_t *) g.ptr)[i]);
                memset(g.ptr, 0xa5, size);
                assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
                expect = 0xa5;
        }

        g = pin_vram(c, t);
        assert_true(gpu_check(c, g.device_ptr, expect, size));
        assert_int_equal(tier_unpin(t, TIER_VRAM, 0), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        disconnect(c);
}

/*
 * The "kernel" of test_unpin_after: on a GPU it holds the stream until the
 * test lets it go (the driver runs it on a thread of its own); the fake
 * driver runs it in the caller's thread, where it can only sleep.
 */
static atomic_int stream_gate;

static void CUDA_CB hold_stream(void *userdata) {
        if (fake) {
                usleep(*(unsigned *) userdata);
                return;
        }
        while (atomic_load(&stream_gate))
                usleep(1000);
}

/* A tensor unpinned with a pending kernel is not copied out before the kernel is done. */
static void test_unpin_after(void **state) {
        static unsigned delay_us = 100 * 1000;  /* the fake's "kernel" */
        tier_client *c = connect_job("after");
        struct tier_grant g;
        tier_tensor *t;
        CUstream stream;
        uint64_t t0;
        tier_fence f;
        Gpu *x;

        assert_int_equal(tier_tensor_create(c, "t", chunk / 2, &t), 0);
        g = pin_vram(c, t);
        x = gpu_get(c);
        gpu_fill(c, g.device_ptr, 0x11, chunk / 2);
        assert_int_equal(x->d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

        /* the "kernel": holds the stream (on a GPU until released below), then writes the tensor */
        atomic_store(&stream_gate, 1);
        t0 = now_ms();
        assert_int_equal(x->d->cuLaunchHostFunc(stream, hold_stream, &delay_us), CUDA_SUCCESS);
        assert_int_equal(x->d->cuMemsetD8Async(g.device_ptr, 0x5a, chunk / 2, stream), CUDA_SUCCESS);
        assert_int_equal(tier_unpin_after(t, TIER_VRAM, 1, stream), 0);
        assert_int_equal(tier_evict_async(t, TIER_HOST, &f), 0);
        if (!fake) {
                /*
                 * The copy out waits on tierd's stream for the client's event: while
                 * the kernel is held it cannot end, however long this takes (a
                 * wrong copy would end within the wait, and hold 0x11 below).
                 */
                assert_int_equal(tier_fence_wait(c, f, 300), -ETIMEDOUT);
                atomic_store(&stream_gate, 0);
        }
        assert_int_equal(tier_fence_wait(c, f, 30000), 0);
        if (fake)
                assert_true(now_ms() - t0 >= delay_us / 1000);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        for (uint64_t i = 0; i < chunk / 2; i += 4093)
                assert_int_equal(((uint8_t *) g.ptr)[i], 0x5a);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);

        assert_int_equal(x->d->cuStreamSynchronize(stream), CUDA_SUCCESS);
        assert_int_equal(x->d->cuStreamDestroy(stream), CUDA_SUCCESS);
        assert_int_equal(tier_tensor_destroy(t), 0);
        disconnect(c);
}

/*
 * The pool is full and job A holds an empty chunk it mapped: taking it back
 * for job B is a revoke.  @cooperate: A answers it (tier_client_process());
 * else A's connection is closed after the timeout and B goes on.
 */
static void run_revoke(bool cooperate) {
        tier_client *a, *b;
        FakeCudaStats s0 = stats();
        tier_tensor *ta, *tb[16];
        struct tier_grant g;
        uint64_t t0;
        tier_fence f;
        int r;

        assert_true(n_chunks <= 16);
        wait_no_jobs();
        a = connect_job(cooperate ? "rev-a" : "rev-a2");
        b = connect_job(cooperate ? "rev-b" : "rev-b2");
        assert_int_equal(tier_tensor_create(a, "a", chunk, &ta), 0);
        g = pin_vram(a, ta);
        assert_int_equal(tier_unpin(ta, TIER_VRAM, 0), 0);
        assert_int_equal(tier_tensor_destroy(ta), 0);   /* A's chunk is empty, still A's, still mapped */

        for (unsigned i = 0; i < n_chunks; i++) {
                char name[16];

                snprintf(name, sizeof(name), "b%u", i);
                assert_int_equal(tier_tensor_create(b, name, chunk, &tb[i]), 0);
        }
        for (unsigned i = 0; i + 1 < n_chunks; i++)
                (void) pin_vram(b, tb[i]);
        /* the last chunk is A's: B waits while A is asked to let go */
        t0 = now_ms();
        assert_int_equal(tier_prefetch_async(tb[n_chunks - 1], TIER_VRAM, &f), 0);
        while ((r = tier_fence_done(b, f)) == 0 && now_ms() - t0 < 20000) {
                struct pollfd p[2] = {
                        { .fd = tier_client_fd(a), .events = POLLIN },
                        { .fd = tier_client_fd(b), .events = POLLIN },
                };

                (void) poll(p, 2, 50);
                if (cooperate && (p[0].revents & POLLIN))
                        assert_int_equal(tier_client_process(a), 0);
                (void) tier_client_process(b);
        }
        assert_int_equal(r, 1);
        if (cooperate) {
                /* A's connection is still open: it answered before the revoke timeout (5 s) closed it */
                assert_int_equal(tier_client_process(a), 0);
                if (fake)
                        assert_true(stats().unmaps - s0.unmaps >= 1);
                /* A goes on */
                assert_int_equal(tier_tensor_create(a, "a2", 4096, &ta), 0);
                assert_int_equal(tier_tensor_destroy(ta), 0);
        } else {
                assert_true(now_ms() - t0 >= 4000);
                /* A did not answer: its connection is gone */
                assert_int_equal(tier_tensor_create(a, "a2", 4096, &ta), -ECONNRESET);
        }
        (void) g;
        for (unsigned i = 0; i < n_chunks; i++)
                (void) tier_tensor_close(tb[i]);
        disconnect(b);
        disconnect(a);
}

static void test_revoke_cooperative(void **state) {
        run_revoke(true);
}

static void test_revoke_timeout(void **state) {
        run_revoke(false);
}

/* A client SIGKILLed while holding VRAM: its chunks come back, and another job can have them all. */
static void test_sigkill(void **state) {
        tier_client *c;
        tier_tensor *t[16];
        char line[16] = "";
        json_t *status = NULL;
        int fds[2];
        pid_t pid;
        FILE *f;

        wait_no_jobs();
        assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
        pid = spawn("holder", "doomed", n_chunks > 1 ? "2" : "1", fds[1]);
        close(fds[1]);
        f = fdopen(fds[0], "re");
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof(line), f));
        fclose(f);
        assert_string_equal(line, "ready\n");
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(wait_exit(pid), 128 + SIGKILL);

        /* linger_sec = 1: the job goes, and its chunks with it */
        for (int i = 0; i < 100; i++) {
                json_decref(status);
                status = test_daemon_status(&daemon_);
                assert_non_null(status);
                if (!test_json_job(status, "doomed"))
                        break;
                usleep(100 * 1000);
        }
        assert_null(test_json_job(status, "doomed"));
        json_decref(status);

        wait_no_jobs();
        c = connect_job("after-kill");
        for (unsigned i = 0; i < n_chunks; i++) {
                char name[16];
                struct tier_grant g;

                snprintf(name, sizeof(name), "k%u", i);
                assert_int_equal(tier_tensor_create(c, name, chunk, &t[i]), 0);
                g = pin_vram(c, t[i]);
                /* fresh chunks: zeros, not what the killed client wrote */
                assert_true(gpu_check(c, g.device_ptr, 0, 4096));
        }
        for (unsigned i = 0; i < n_chunks; i++) {
                assert_int_equal(tier_unpin(t[i], TIER_VRAM, 0), 0);
                assert_int_equal(tier_tensor_destroy(t[i]), 0);
        }
        disconnect(c);
}

static void test_register_host(void **state) {
        tier_client *c = connect_job("host");
        FakeCudaStats s0 = stats();
        struct tier_grant g;
        tier_tensor *t;
        int n;

        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        n = tier_client_cuda_register_host(c);
        assert_true(n >= 1);
        if (fake)
                assert_int_equal(stats().host_registered - s0.host_registered, (uint64_t) n);
        /* registered host memory: an async copy from it */
        memset(g.ptr, 0x33, MiB);
        {
                tier_tensor *v;
                struct tier_grant gv;

                assert_int_equal(tier_tensor_create(c, "v", MiB, &v), 0);
                gv = pin_vram(c, v);
                assert_int_equal(gpu_get(c)->d->cuMemcpyHtoDAsync(gv.device_ptr, g.ptr, MiB, NULL), CUDA_SUCCESS);
                assert_int_equal(gpu_get(c)->d->cuStreamSynchronize(NULL), CUDA_SUCCESS);
                assert_true(gpu_check(c, gv.device_ptr, 0x33, MiB));
                assert_int_equal(tier_unpin(v, TIER_VRAM, 0), 0);
                assert_int_equal(tier_tensor_destroy(v), 0);
        }
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        assert_int_equal(tier_tensor_destroy(t), 0);
        disconnect(c);
        if (fake)
                assert_int_equal(stats().host_registered, s0.host_registered);
}

/*
 * Every fd tierd opened is close-on-exec, the chunks' exported fds included.
 * With a real driver, fds the driver opened itself are only listed: which
 * are its own cannot be told apart, except that tierd's memfds and sockets
 * are tierd's.
 */
static void test_fds_cloexec(void **state) {
        tier_client *c = connect_job("fds");
        char path[64], line[256], target[256];
        unsigned checked = 0;
        struct dirent *de;
        tier_tensor *t;
        DIR *d;

        assert_int_equal(tier_tensor_create(c, "x", MiB, &t), 0);
        (void) pin_vram(c, t);
        assert_int_equal(tier_unpin(t, TIER_VRAM, 1), 0);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);

        snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int) daemon_.pid);
        d = opendir(path);
        assert_non_null(d);
        while ((de = readdir(d))) {
                char fi[400], fd_link[400];
                unsigned long flags = 0;
                ssize_t n;
                FILE *f;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(fi, sizeof(fi), "%s/%s", path, de->d_name);
                f = fopen(fi, "re");
                if (!f)
                        continue;
                while (fgets(line, sizeof(line), f))
                        if (strncmp(line, "flags:", 6) == 0)
                                flags = strtoul(line + 6, NULL, 8);
                fclose(f);
                snprintf(fd_link, sizeof(fd_link), "/proc/%d/fd/%s", (int) daemon_.pid, de->d_name);
                n = readlink(fd_link, target, sizeof(target) - 1);
                target[n > 0 ? n : 0] = 0;
                if (atoi(de->d_name) <= 2)
                        continue;       /* stdio: inherited */
                checked++;
                if (flags & O_CLOEXEC)
                        continue;
                if (!fake && strncmp(target, "memfd:tierd", 11) != 0 && strncmp(target, "socket:", 7) != 0) {
                        fprintf(stderr, "note: fd %s (%s) is not close-on-exec (the driver's?)\n", de->d_name, target);
                        continue;
                }
                fail_msg("tierd fd %s (%s) lacks O_CLOEXEC (flags %lo)", de->d_name, target, flags);
        }
        closedir(d);
        assert_true(checked > 8);
        assert_int_equal(tier_tensor_destroy(t), 0);
        disconnect(c);
}

/* ---- set-up ---------------------------------------------------------------------------------------------- */

static int setup(void **state) {
        char config[1024];
        int r;

        snprintf(config, sizeof(config),
                 "[daemon]\n"
                 "linger_sec = 1\n"
                 "[limits]\n"
                 "max_inflight = 64\n"
                 "[host]\n"
                 "capacity = %" PRIu64 "M\n"
                 "segment_size = %" PRIu64 "M\n"
                 "job_limit = %" PRIu64 "M\n"
                 "[vram]\n"
                 "backend = cuda\n"
                 "capacity = %" PRIu64 "M\n"
                 "chunk_size = %" PRIu64 "M\n"
                 "job_limit = %" PRIu64 "M\n"
                 "[nvme]\n"
                 "target = @DIR@/t0.img:512M\n"
                 "extent_size = 1M\n",
                 chunk * n_chunks * 4 / MiB, chunk / MiB, chunk * n_chunks * 2 / MiB,
                 chunk * n_chunks / MiB, chunk / MiB, chunk * n_chunks / MiB);
        r = test_daemon_start(&daemon_, config);
        if (r < 0) {
                fprintf(stderr, "cannot start tierd: %s\n", strerror(-r));
                return -1;
        }
        return 0;
}

static int teardown(void **state) {
        int r = test_daemon_stop(&daemon_);

        if (gpu.d) {
                (void) gpu.d->cuDevicePrimaryCtxRelease(gpu.dev);
                gpu.d = cudrv_close(gpu.d);
        }
        if (r != 0) {
                fprintf(stderr, "tierd did not exit cleanly (status %d)\n", r);
                return -1;
        }
        return 0;
}

int main(int argc, char *argv[]) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_backend, disconnect_leftovers),
                cmocka_unit_test_teardown(test_two_jobs, disconnect_leftovers),
                cmocka_unit_test_teardown(test_mapping_cache, disconnect_leftovers),
                cmocka_unit_test_teardown(test_spanning, disconnect_leftovers),
                cmocka_unit_test_teardown(test_unpin_after, disconnect_leftovers),
                cmocka_unit_test_teardown(test_revoke_cooperative, disconnect_leftovers),
                cmocka_unit_test_teardown(test_revoke_timeout, disconnect_leftovers),
                cmocka_unit_test_teardown(test_sigkill, disconnect_leftovers),
                cmocka_unit_test_teardown(test_register_host, disconnect_leftovers),
                cmocka_unit_test_teardown(test_fds_cloexec, disconnect_leftovers),
        };
        const char *fake_path = getenv("TIER_FAKE_CUDA");
        _cleanup_free_ char *why = NULL;
        CuDriver *probe = NULL;

        if (readlink("/proc/self/exe", self, sizeof(self) - 1) < 0)
                return 1;
        /* the fake when meson says so; else whatever TIER_LIBCUDA or libcuda.so.1 is */
        if (fake_path && *fake_path && !getenv("TIER_LIBCUDA"))
                setenv("TIER_LIBCUDA", fake_path, 1);
        chunk = 4 * MiB;
        n_chunks = 4;
        {
                void *h = getenv("TIER_LIBCUDA") ? dlopen(getenv("TIER_LIBCUDA"), RTLD_NOW | RTLD_LOCAL) : NULL;

                fake_stats = h ? (fake_cuda_stats_t) dlsym(h, FAKE_CUDA_STATS) : NULL;
                fake = fake_stats != NULL;
        }
        if (!fake)
                chunk = 64 * MiB;       /* a GPU: chunks of a realistic size */

        if (argc == 5 && strcmp(argv[1], "writer") == 0)
                return role_writer(argv[2], argv[3], (unsigned) atoi(argv[4]));
        if (argc == 5 && strcmp(argv[1], "holder") == 0)
                return role_holder(argv[2], argv[3], (unsigned) atoi(argv[4]));

        if (cudrv_open(&probe, &why) < 0) {
                printf("no CUDA device: %s\n", why ? why : "?");
                return TEST_SKIP;
        }
        cudrv_close(probe);
        if (!test_can_lock_memory(chunk * n_chunks * 4))      /* [host] capacity in setup() */
                return TEST_SKIP;
        signal(SIGPIPE, SIG_IGN);
        fprintf(stderr, "test-cuda: %s driver, chunks of %" PRIu64 " MiB\n", fake ? "fake" : "real", chunk / MiB);
        return cmocka_run_group_tests_name("cuda", tests, setup, teardown);
}
