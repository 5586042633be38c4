/* SPDX-License-Identifier: MIT */
/* test-vram-cuda.c: the CUDA VRAM backend and libtier's CUDA code, on the fake driver. */

/*
 * No GPU needed: $TIER_FAKE_CUDA (set by meson) is tests/helpers/fake-cuda.c
 * built as a library, and each test points $TIER_LIBCUDA at it, so the real
 * loader (proto/cudrv.c), the real backend (daemon/vram-cuda.c) and the
 * real client import code (client/client-cuda.c) run against "device
 * memory" that is a memfd.  A device address is then a host address of
 * this process, so the tests read and write chunks directly.
 */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/client-cuda.h"
#include "daemon/base/config.h"
#include "daemon/tiers/memfd-seg.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/vram-cuda.h"
#include "daemon/tiers/vram.h"
#include "proto/cudrv.h"
#include "proto/macro.h"
#include "tests/helpers/fake-cuda.h"

#define MiB (1ull << 20)

static void *fake_lib;
static fake_cuda_stats_t fake_stats;
static fake_cuda_hold_t fake_hold;
static fake_cuda_release_t fake_release;
static fake_cuda_hold_event_t fake_hold_event;
static fake_cuda_release_event_t fake_release_event;
static fake_cuda_fail_t fake_fail;

static int setup(void **state) {
        const char *path = getenv("TIER_FAKE_CUDA");

        if (!path) {
                fprintf(stderr, "TIER_FAKE_CUDA is not set (run through meson test)\n");
                return -1;
        }
        /* the same instance the code under test will dlopen() */
        fake_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!fake_lib)
                return -1;
        fake_stats = (fake_cuda_stats_t) dlsym(fake_lib, FAKE_CUDA_STATS);
        fake_hold = (fake_cuda_hold_t) dlsym(fake_lib, FAKE_CUDA_HOLD);
        fake_release = (fake_cuda_release_t) dlsym(fake_lib, FAKE_CUDA_RELEASE);
        fake_fail = (fake_cuda_fail_t) dlsym(fake_lib, FAKE_CUDA_FAIL);
        fake_hold_event = (fake_cuda_hold_event_t) dlsym(fake_lib, FAKE_CUDA_HOLD_EVENT);
        fake_release_event = (fake_cuda_release_event_t) dlsym(fake_lib, FAKE_CUDA_RELEASE_EVENT);
        if (!fake_stats || !fake_hold || !fake_release || !fake_fail || !fake_hold_event || !fake_release_event)
                return -1;
        setenv("TIER_LIBCUDA", path, 1);
        return 0;
}

static int teardown(void **state) {
        if (fake_lib)
                dlclose(fake_lib);
        return 0;
}

/* Before each test: the fake's defaults. */
static int reset(void **state) {
        setenv("TIER_LIBCUDA", getenv("TIER_FAKE_CUDA"), 1);
        unsetenv("FAKE_CUDA_MEM");
        unsetenv("FAKE_CUDA_DEVICES");
        unsetenv("FAKE_CUDA_NO_FD");
        unsetenv("FAKE_CUDA_INIT_ERROR");
        return 0;
}

/* vram_wait_event() for one range. */
static int wait1(VramBackend *b, Segment *seg, uint64_t offset, uint64_t len, const void *handle, size_t size) {
        VramRange g = { seg, offset, len };

        return vram_wait_event(b, &g, 1, handle, size, NULL, 0);
}

static FakeCudaStats stats(void) {
        FakeCudaStats s;

        fake_stats(&s);
        return s;
}

static void config(Config *c, uint64_t capacity, uint64_t chunk) {
        config_init(c);
        c->vram_backend = VRAM_BACKEND_CUDA;
        c->vram_capacity = capacity;
        c->vram_chunk_size = chunk;
}

/* ---- no device ---------------------------------------------------------------------------- */

static void expect_no_device(const char *reason) {
        _cleanup_free_ char *why = NULL;
        VramBackend *b = NULL;
        sd_event *e = NULL;
        Config c;

        config(&c, 64 * MiB, 4 * MiB);
        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(vram_cuda_new(&c, e, &b, &why), -ENODEV);
        assert_null(b);
        assert_non_null(why);
        if (!strstr(why, reason))
                fail_msg("reason \"%s\" does not mention \"%s\"", why, reason);
        config_deinit(&c);
        sd_event_unref(e);
}

static void test_no_device(void **state) {
        /* no driver at all: the library cannot be loaded */
        setenv("TIER_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        expect_no_device("/nonexistent/libcuda.so.1 cannot be loaded");
        reset(state);

        setenv("FAKE_CUDA_INIT_ERROR", "100", 1);       /* CUDA_ERROR_NO_DEVICE */
        expect_no_device("cuInit failed: CUDA_ERROR_NO_DEVICE");
        reset(state);

        setenv("FAKE_CUDA_NO_FD", "1", 1);
        expect_no_device("cannot export memory as POSIX file descriptors");
        reset(state);

        setenv("FAKE_CUDA_MEM", "1048576", 1);          /* 1 MiB: not one chunk */
        {
                _cleanup_free_ char *why = NULL;
                VramBackend *b = NULL;
                sd_event *e = NULL;
                Config c;

                config(&c, 64 * MiB, 4 * MiB);
                assert_int_equal(sd_event_new(&e), 0);
                assert_int_equal(vram_cuda_new(&c, e, &b, &why), -ENOMEM);
                assert_non_null(strstr(why, "not enough for one VRAM chunk"));
                config_deinit(&c);
                sd_event_unref(e);
        }
}

static void test_fallback(void **state) {
        _cleanup_free_ char *why = NULL;
        VramBackend *b = NULL;
        sd_event *e = NULL;
        Config c;

        setenv("TIER_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        assert_int_equal(sd_event_new(&e), 0);

        /* auto: the emulated backend, labelled as such */
        config(&c, 8 * MiB, 4 * MiB);
        c.vram_backend = VRAM_BACKEND_AUTO;
        assert_int_equal(vram_backend_new(&c, e, &b, &why), 0);
        assert_true(b->emulated);
        assert_string_equal(b->ops->name, "emulated");
        assert_int_equal(vram_numa_node(b), -1);
        assert_string_equal(b->device, "");
        assert_int_equal(wait1(b, &b->pool.segs[0], 0, 4096, "x", 1), -EOPNOTSUPP);
        b = vram_backend_free(b);

        /* cuda: a start-up error with the reason */
        c.vram_backend = VRAM_BACKEND_CUDA;
        assert_int_equal(vram_backend_new(&c, e, &b, &why), -ENODEV);
        assert_null(b);
        assert_non_null(why);
        assert_non_null(strstr(why, "[vram] backend = cuda, but no CUDA device: "));
        assert_non_null(strstr(why, "cannot be loaded"));

        config_deinit(&c);
        sd_event_unref(e);
}

/* A chunk that cannot be made at start: the chunks not reached yet own no fd (fd 0 stays open), and
 * backend = auto goes on emulated. */
static void test_chunk_fails_at_start(void **state) {
        _cleanup_free_ char *why = NULL;
        VramBackend *b = NULL;
        sd_event *e = NULL;
        struct stat st0, st1;
        Config c;

        if (fcntl(0, F_GETFD) < 0)
                assert_int_equal(open("/dev/null", O_RDONLY | O_CLOEXEC), 0);
        assert_int_equal(fstat(0, &st0), 0);
        setenv("FAKE_CUDA_MEM", "41943040", 1);
        assert_int_equal(sd_event_new(&e), 0);
        config(&c, 16 * MiB, 4 * MiB);                  /* 4 chunks: the second fails */
        fake_fail("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 1, 1);
        assert_int_equal(vram_cuda_new(&c, e, &b, &why), -ENOMEM);
        assert_null(b);
        assert_int_equal(fstat(0, &st1), 0);
        assert_true(st0.st_dev == st1.st_dev && st0.st_ino == st1.st_ino);

        c.vram_backend = VRAM_BACKEND_AUTO;
        fake_fail("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 2, 1);
        assert_int_equal(vram_backend_new(&c, e, &b, &why), 0);
        assert_true(b->emulated);
        b = vram_backend_free(b);
        assert_int_equal(fstat(0, &st1), 0);
        assert_true(st0.st_dev == st1.st_dev && st0.st_ino == st1.st_ino);
        assert_int_equal(stats().live_allocs, 0);
        config_deinit(&c);
        sd_event_unref(e);
}

/* ---- pure helpers ---------------------------------------------------------------------------- */

/* [vram] capacity = 0 is accepted: "as much as the device has" (emulated: 1G). */
static void test_capacity_zero(void **state) {
        _cleanup_free_ char *why = NULL;
        VramBackend *b = NULL;
        sd_event *e = NULL;
        Config c;

        config_init(&c);
        assert_int_equal(config_parse_text(&c, "[vram]\ncapacity = 0\nchunk_size = 64M\n", "t.conf", &why), 0);
        assert_int_equal(config_finish(&c, &why), 0);
        assert_int_equal(c.vram_capacity, 0);

        assert_int_equal(sd_event_new(&e), 0);
        c.vram_backend = VRAM_BACKEND_EMULATED;
        assert_int_equal(vram_backend_new(&c, e, &b, &why), 0);
        assert_int_equal((uint64_t) b->pool.n_segs * b->pool.seg_size, 1ull << 30);
        b = vram_backend_free(b);

        setenv("FAKE_CUDA_MEM", "209715200", 1);       /* 200 MiB: 90% is 180 MiB, two chunks */
        c.vram_backend = VRAM_BACKEND_CUDA;
        assert_int_equal(vram_backend_new(&c, e, &b, &why), 0);
        assert_int_equal(b->pool.n_segs, 2);
        b = vram_backend_free(b);
        config_deinit(&c);
        sd_event_unref(e);
}

static void test_arena(void **state) {
        uint64_t chunk, cap;
        int clamped;

        /* chunk rounded up to the granularity, capacity in whole chunks */
        assert_int_equal(vram_cuda_arena(3 * MiB, 64 * MiB, 2 * MiB, 1024 * MiB, &chunk, &cap, &clamped), 0);
        assert_int_equal(chunk, 4 * MiB);
        assert_int_equal(cap, 64 * MiB);
        assert_false(clamped);
        assert_int_equal(vram_cuda_arena(64 * MiB, 100 * MiB, 2 * MiB, 1024 * MiB, &chunk, &cap, &clamped), 0);
        assert_int_equal(chunk, 64 * MiB);
        assert_int_equal(cap, 64 * MiB);

        /* more than the device has: 90% of the free memory */
        assert_int_equal(vram_cuda_arena(4 * MiB, 1ull << 40, 2 * MiB, 100 * MiB, &chunk, &cap, &clamped), 0);
        assert_true(clamped);
        assert_int_equal(cap, 88 * MiB);        /* 90 MiB, in 4 MiB chunks */

        /* 0: as much as the device has */
        assert_int_equal(vram_cuda_arena(4 * MiB, 0, 2 * MiB, 100 * MiB, &chunk, &cap, &clamped), 0);
        assert_false(clamped);
        assert_int_equal(cap, 88 * MiB);

        assert_int_equal(vram_cuda_arena(64 * MiB, 1ull << 40, 2 * MiB, 64 * MiB, &chunk, &cap, &clamped), -ENOMEM);
        assert_int_equal(vram_cuda_arena(64 * MiB, 64 * MiB, 0, 1ull << 30, &chunk, &cap, &clamped), -EINVAL);
}

static void test_pci_numa(void **state) {
        char name[32], root[] = "/tmp/test-vram-cuda.XXXXXX", path[256];
        FILE *f;

        assert_int_equal(cudrv_pci_sysfs_name("0000:3B:00.0", name, sizeof(name)), 0);
        assert_string_equal(name, "0000:3b:00.0");
        assert_int_equal(cudrv_pci_sysfs_name("00000000:C1:1F.7", name, sizeof(name)), 0);
        assert_string_equal(name, "0000:c1:1f.7");
        assert_int_equal(cudrv_pci_sysfs_name("10000:01:00.0", name, sizeof(name)), 0);
        assert_string_equal(name, "10000:01:00.0");
        assert_int_equal(cudrv_pci_sysfs_name("0000:3b:00", name, sizeof(name)), -EINVAL);
        assert_int_equal(cudrv_pci_sysfs_name("0000:3b:00.0 ", name, sizeof(name)), -EINVAL);
        assert_int_equal(cudrv_pci_sysfs_name("0000:3b:20.0", name, sizeof(name)), -EINVAL);
        assert_int_equal(cudrv_pci_sysfs_name(NULL, name, sizeof(name)), -EINVAL);
        assert_int_equal(cudrv_pci_sysfs_name("0000:3b:00.0", name, 8), -ENOBUFS);

        assert_non_null(mkdtemp(root));
        snprintf(path, sizeof(path), "%s/0000:3b:00.0", root);
        assert_int_equal(mkdir(path, 0755), 0);
        snprintf(path, sizeof(path), "%s/0000:3b:00.0/numa_node", root);
        f = fopen(path, "we");
        assert_non_null(f);
        fputs("1\n", f);
        fclose(f);
        assert_int_equal(vram_cuda_numa_node_of(root, "0000:3B:00.0"), 1);
        f = fopen(path, "we");
        fputs("-1\n", f);
        fclose(f);
        assert_int_equal(vram_cuda_numa_node_of(root, "0000:3B:00.0"), -1);     /* no NUMA */
        assert_int_equal(vram_cuda_numa_node_of(root, "0000:3c:00.0"), -1);     /* no such device */
        assert_int_equal(vram_cuda_numa_node_of(root, "garbage"), -1);
        unlink(path);
        snprintf(path, sizeof(path), "%s/0000:3b:00.0", root);
        rmdir(path);
        rmdir(root);
}

/* ---- the arena ------------------------------------------------------------------------------------- */

static VramBackend *new_backend(sd_event *e, uint64_t capacity, uint64_t chunk) {
        _cleanup_free_ char *why = NULL;
        VramBackend *b = NULL;
        Config c;

        config(&c, capacity, chunk);
        if (vram_cuda_new(&c, e, &b, &why) < 0)
                fail_msg("vram_cuda_new: %s", why ? why : "?");
        config_deinit(&c);
        return b;
}

static bool all_bytes(const void *p, uint8_t v, size_t n) {
        const uint8_t *q = p;

        for (size_t i = 0; i < n; i++)
                if (q[i] != v)
                        return false;
        return true;
}

static void test_arena_chunks(void **state) {
        FakeCudaStats s0 = stats(), s1;
        sd_event *e = NULL;
        VramBackend *b;
        SegPool *p;
        List owner;
        Segment *seg;
        struct stat st0, st1;
        uint32_t gen;
        int flags;

        setenv("FAKE_CUDA_MEM", "41943040", 1);         /* 40 MiB: 90% is 36 MiB */
        assert_int_equal(sd_event_new(&e), 0);
        b = new_backend(e, 1ull << 30, 3 * MiB);
        p = &b->pool;

        assert_false(b->emulated);
        assert_string_equal(b->ops->name, "cuda");
        assert_string_equal(p->kind, "cuda");
        assert_int_equal(p->seg_size, 4 * MiB);         /* 3 MiB rounded up to the 2 MiB granularity */
        assert_int_equal(p->n_segs, 9);                 /* 36 MiB */
        assert_int_equal(p->n_free, 9);
        assert_string_equal(b->device, FAKE_CUDA_PCI_BUS_ID);
        assert_non_null(strstr(b->description, "Fake CUDA Device 0"));

        s1 = stats();
        assert_int_equal(s1.creates - s0.creates, 9);
        assert_int_equal(s1.exports - s0.exports, 9);
        assert_int_equal(s1.maps - s0.maps, 9);
        for (uint32_t i = 0; i < p->n_segs; i++) {
                Segment *x = &p->segs[i];

                assert_true(x->fd >= 0);
                flags = fcntl(x->fd, F_GETFD);
                assert_true(flags >= 0 && (flags & FD_CLOEXEC));
                assert_true(x->device_ptr != 0);
                assert_null(x->map);
                /* zeroed before first use */
                assert_true(all_bytes((void *) (uintptr_t) x->device_ptr, 0, p->seg_size));
        }

        /* a chunk a job gives back is a new allocation: new memory, new fd, new generation */
        list_init(&owner);
        assert_int_equal(segpool_assign(p, (Job *) &owner, &owner, &seg), 0);
        gen = seg->generation;
        assert_int_equal(fstat(seg->fd, &st0), 0);
        memset((void *) (uintptr_t) seg->device_ptr, 0xab, p->seg_size);
        s0 = stats();
        assert_int_equal(segpool_release(p, seg), 0);
        s1 = stats();
        assert_int_equal(seg->generation, gen + 1);
        assert_int_equal(s1.releases - s0.releases, 1);
        assert_int_equal(s1.creates - s0.creates, 1);
        assert_int_equal(s1.live_allocs, s0.live_allocs);
        assert_int_equal(fstat(seg->fd, &st1), 0);
        assert_int_not_equal(st0.st_ino, st1.st_ino);
        assert_true(all_bytes((void *) (uintptr_t) seg->device_ptr, 0, p->seg_size));
        assert_int_equal(p->n_free, 9);

        /* the replacement cannot be made: the segment stays out of service */
        assert_int_equal(segpool_assign(p, (Job *) &owner, &owner, &seg), 0);
        fake_fail("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 0, 1);
        assert_int_equal(segpool_release(p, seg), -ENOMEM);
        assert_int_equal(p->n_free, 8);
        assert_int_equal(seg->fd, -1);
        assert_int_equal(seg->device_ptr, 0);

        /* zeroing a range */
        seg = &p->segs[(seg->id + 1) % p->n_segs];
        memset((void *) (uintptr_t) seg->device_ptr, 0x77, 3 * 4096);
        assert_int_equal(b->ops->zero(b, seg, 4096, 4096), 0);
        assert_true(all_bytes((void *) (uintptr_t) seg->device_ptr, 0x77, 4096));
        assert_true(all_bytes((void *) (uintptr_t) (seg->device_ptr + 4096), 0, 4096));
        assert_true(all_bytes((void *) (uintptr_t) (seg->device_ptr + 8192), 0x77, 4096));
        assert_int_equal(b->ops->zero(b, seg, p->seg_size - 4096, 8192), -EINVAL);

        s0 = stats();
        vram_backend_free(b);
        s1 = stats();
        assert_int_equal(s0.live_allocs - s1.live_allocs, 8);   /* one was out of service already */
        assert_int_equal(s1.streams, 0);
        assert_int_equal(s1.events, 0);
        sd_event_unref(e);
}

/* ---- copies ------------------------------------------------------------------------------------------ */

typedef struct Done {
        VramCopy copy;
        bool done;
} Done;

static void on_done(VramCopy *c) {
        container_of(c, Done, copy)->done = true;
}

static void run_until_done(sd_event *e, Done *d) {
        for (int i = 0; i < 1000 && !d->done; i++)
                assert_true(sd_event_run(e, 10 * 1000) >= 0);
        assert_true(d->done);
}

static void test_copies(void **state) {
        const uint64_t len = 20 * MiB + 4096;          /* three pieces, the last one short */
        FakeCudaStats s0, s1;
        sd_event *e = NULL;
        VramBackend *b;
        Segment *seg;
        uint8_t *host;
        Done d;

        assert_int_equal(sd_event_new(&e), 0);
        b = new_backend(e, 64 * MiB, 32 * MiB);
        seg = &b->pool.segs[1];
        host = malloc(len);
        assert_non_null(host);
        for (uint64_t i = 0; i < len; i++)
                host[i] = (uint8_t) (i * 7 + 3);

        /* host -> VRAM, in VRAM_CUDA_PIECE pieces, done() on the loop */
        s0 = stats();
        d = (Done) { .copy = { .dir = VRAM_TO_DEVICE, .host = host, .seg = seg, .offset = 8192, .len = len,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        run_until_done(e, &d);
        assert_int_equal(d.copy.result, 0);
        s1 = stats();
        assert_int_equal(s1.htod_calls - s0.htod_calls, 3);
        assert_int_equal(s1.htod_bytes - s0.htod_bytes, len);
        assert_memory_equal((void *) (uintptr_t) (seg->device_ptr + 8192), host, len);

        /* VRAM -> host */
        memset(host, 0, len);
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 8192, .len = len,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        run_until_done(e, &d);
        assert_int_equal(d.copy.result, 0);
        assert_memory_equal((void *) (uintptr_t) (seg->device_ptr + 8192), host, len);

        /* out of the chunk, or no chunk */
        d.copy.offset = b->pool.seg_size - 4096;
        assert_int_equal(b->ops->copy(b, &d.copy), -EINVAL);
        d.copy.offset = 0;
        d.copy.seg = NULL;
        assert_int_equal(b->ops->copy(b, &d.copy), -EINVAL);

        /* the first piece cannot be queued: an error at once */
        fake_fail("cuMemcpyHtoDAsync", CUDA_ERROR_ILLEGAL_ADDRESS, 0, 1);
        d = (Done) { .copy = { .dir = VRAM_TO_DEVICE, .host = host, .seg = seg, .offset = 0, .len = len,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), -EIO);
        assert_false(d.done);

        /* a later piece fails: reported by done() once what was queued before it is over */
        fake_fail("cuMemcpyDtoHAsync", CUDA_ERROR_ILLEGAL_ADDRESS, 1, 1);
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 0, .len = len,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        run_until_done(e, &d);
        assert_int_equal(d.copy.result, -EIO);

        /* no event to wait on: its lane's thread waits for the stream (never the caller), then failed */
        fake_fail("cuEventRecord", CUDA_ERROR_ILLEGAL_ADDRESS, 0, 1);
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 0, .len = len,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        run_until_done(e, &d);
        assert_int_equal(d.copy.result, -EIO);

        free(host);
        vram_backend_free(b);
        sd_event_unref(e);
}

/* The copy's interprocess event: handed out while the copy runs, a pool event reused only after. */
static void test_copy_event(void **state) {
        uint8_t ev[VRAM_IPC_EVENT_SIZE], ev2[VRAM_IPC_EVENT_SIZE];
        _cleanup_free_ char *why = NULL;
        CuDriver *drv = NULL;
        CUipcEventHandle h;
        CUevent opened;
        sd_event *e = NULL;
        VramBackend *b;
        Segment *seg;
        uint8_t *host;
        Done d, d2;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        b = new_backend(e, 16 * MiB, 4 * MiB);
        seg = &b->pool.segs[0];
        host = calloc(1, 4 * MiB);
        assert_non_null(host);

        assert_int_equal(vram_copy_event(b, seg, 0, 65536, ev), 0);     /* nothing queued */
        fake_hold();
        d = (Done) { .copy = { .dir = VRAM_TO_DEVICE, .host = host, .seg = seg, .offset = 0, .len = 65536,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        assert_int_equal(vram_copy_event(b, seg, 0, 65536, ev), 1);
        assert_int_equal(vram_copy_event(b, seg, 65536, 4096, ev2), 0); /* another range */
        assert_int_equal(vram_copy_event(b, seg, 0, 131072, ev2), 0);   /* more than that copy: none */

        /* a second copy in flight gets another event */
        d2 = (Done) { .copy = { .dir = VRAM_TO_DEVICE, .host = host, .seg = seg, .offset = 65536, .len = 4096,
                                .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d2.copy), 0);
        assert_int_equal(vram_copy_event(b, seg, 65536, 4096, ev2), 1);
        assert_memory_not_equal(ev, ev2, sizeof(ev));

        /* what a client gets: an event that completes with the copy */
        memcpy(&h, ev, sizeof(h));
        assert_int_equal(drv->cuIpcOpenEventHandle(&opened, h), CUDA_SUCCESS);
        assert_int_equal(drv->cuEventQuery(opened), CUDA_ERROR_NOT_READY);
        assert_false(d.done);
        fake_release();
        run_until_done(e, &d);
        run_until_done(e, &d2);
        assert_int_equal(drv->cuEventQuery(opened), CUDA_SUCCESS);
        assert_int_equal(vram_copy_event(b, seg, 0, 65536, ev), 0);     /* done: none any more */

        /* downloads carry none */
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 0, .len = 4096,
                               .done = on_done } };
        fake_hold();
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        assert_int_equal(vram_copy_event(b, seg, 0, 4096, ev), 0);
        fake_release();
        run_until_done(e, &d);

        assert_int_equal(drv->cuEventDestroy(opened), CUDA_SUCCESS);
        free(host);
        vram_backend_free(b);
        cudrv_close(drv);
        sd_event_unref(e);
}

/* A client's kernel still writes the tensor when it unpins: nothing copies it out before it ends. */
static void test_wait_event(void **state) {
        _cleanup_free_ char *why = NULL;
        CuDriver *drv = NULL;
        CUevent client_ev;
        CUipcEventHandle h;
        FakeCudaStats s0, s1;
        sd_event *e = NULL;
        VramBackend *b;
        Segment *seg;
        uint8_t *host;
        Done d;
        int r;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        b = new_backend(e, 16 * MiB, 4 * MiB);
        seg = &b->pool.segs[2];
        host = calloc(1, MiB);
        assert_non_null(host);
        memset((void *) (uintptr_t) seg->device_ptr, 0x11, MiB);       /* before the kernel */

        /* the client's event, recorded after its kernel, which still runs */
        assert_int_equal(drv->cuEventCreate(&client_ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
                         CUDA_SUCCESS);
        fake_hold_event(client_ev);
        assert_int_equal(drv->cuEventRecord(client_ev, NULL), CUDA_SUCCESS);
        assert_int_equal(drv->cuIpcGetEventHandle(&h, client_ev), CUDA_SUCCESS);
        assert_int_equal(wait1(b, seg, 0, MiB, &h, sizeof(h)), 0);

        /* the copy out is queued behind the kernel's event (the stream waits, the caller does not)... */
        s0 = stats();
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 0, .len = MiB,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        s1 = stats();
        assert_int_equal(s1.stream_waits - s0.stream_waits, 1);
        assert_true(sd_event_run(e, 0) >= 0);
        assert_false(d.done);
        assert_true(all_bytes(host, 0, MiB));           /* not copied yet */
        /* ...until the kernel has written and its event completed */
        memset((void *) (uintptr_t) seg->device_ptr, 0x5a, MiB);
        fake_release_event(client_ev);
        run_until_done(e, &d);
        assert_true(all_bytes(host, 0x5a, MiB));        /* the kernel's bytes, not the old 0x11 */

        /* the event has completed: later copies do not wait any more */
        s0 = stats();
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 0, .len = MiB,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        run_until_done(e, &d);
        assert_int_equal(stats().stream_waits, s0.stream_waits);

        /* waits apply to overlapping ranges only, in both directions and to fills */
        fake_hold();
        assert_int_equal(drv->cuEventRecord(client_ev, NULL), CUDA_SUCCESS);
        assert_int_equal(wait1(b, seg, 0, 8192, &h, sizeof(h)), 0);
        fake_release();         /* completed, but the backend has not looked yet */
        s0 = stats();
        d = (Done) { .copy = { .dir = VRAM_TO_DEVICE, .host = host, .seg = seg, .offset = 8192, .len = 4096,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);          /* no overlap */
        run_until_done(e, &d);
        assert_int_equal(stats().stream_waits, s0.stream_waits);

        /* bad handles and sizes */
        assert_int_equal(wait1(b, seg, 0, 4096, &h, 12), -EINVAL);
        memset(&h, 0, sizeof(h));
        assert_int_equal(wait1(b, seg, 0, 4096, &h, sizeof(h)), -EINVAL);
        assert_int_equal(wait1(b, seg, b->pool.seg_size, 4096, &h, sizeof(h)), -EINVAL);

        /* bounded: pending events of all jobs together */
        assert_int_equal(drv->cuIpcGetEventHandle(&h, client_ev), CUDA_SUCCESS);
        fake_hold();
        assert_int_equal(drv->cuEventRecord(client_ev, NULL), CUDA_SUCCESS);
        for (r = 0; r < 5000; r++) {
                int k2 = wait1(b, seg, 0, 4096, &h, sizeof(h));

                if (k2 < 0) {
                        assert_int_equal(k2, -ENOBUFS);
                        break;
                }
        }
        assert_true(r > 0 && r < 5000);
        fake_release();
        /* the segment going drops its waits */
        assert_int_equal(wait1(b, seg, 0, 4096, &h, sizeof(h)), 0);

        assert_int_equal(drv->cuEventDestroy(client_ev), CUDA_SUCCESS);
        free(host);
        vram_backend_free(b);
        cudrv_close(drv);
        sd_event_unref(e);
}

/*
 * One job's client events that never complete fill only its own share: another
 * job's unpin with an event is still served, in ranges and in distinct events.
 */
#define N_EVENTS (VRAM_WAIT_EVENTS_PER_JOB + 4)   /* the last two for the first part only */

static void test_wait_event_per_job(void **state) {
        _cleanup_free_ char *why = NULL;
        CuDriver *drv = NULL;
        CUevent ev[N_EVENTS];
        CUipcEventHandle h[N_EVENTS];
        VramRange many[VRAM_WAITS_PER_JOB];
        List list_a, list_b;
        int job_a, job_b, r;
        char msg[256];
        Segment *a, *b2;
        sd_event *e = NULL;
        VramBackend *b;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        b = new_backend(e, 16 * MiB, 4 * MiB);
        list_init(&list_a);
        list_init(&list_b);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job_a, &list_a, &a), 0);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job_b, &list_b, &b2), 0);
        for (int i = 0; i < N_EVENTS; i++) {
                assert_int_equal(drv->cuEventCreate(&ev[i], CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
                                 CUDA_SUCCESS);
                assert_int_equal(drv->cuIpcGetEventHandle(&h[i], ev[i]), CUDA_SUCCESS);
        }
        /* events that never complete (until the end of the test) */
        fake_hold();
        for (int i = 0; i < N_EVENTS; i++)
                assert_int_equal(drv->cuEventRecord(ev[i], NULL), CUDA_SUCCESS);

        /* ranges: job a, one event, until refused, at its own bound */
        for (r = 0; r < 5000; r++)
                if (wait1(b, a, 0, 4096, &h[N_EVENTS - 2], sizeof(h[0])) < 0)
                        break;
        assert_int_equal(r, VRAM_WAITS_PER_JOB);
        {
                VramRange g = { a, 0, 4096 };

                assert_int_equal(vram_wait_event(b, &g, 1, &h[N_EVENTS - 2], sizeof(h[0]), msg, sizeof(msg)), -ENOBUFS);
                if (!strstr(msg, "the job has 256 VRAM ranges") || !strstr(msg, "its bound is 256 ranges"))
                        fail_msg("refusal \"%s\" does not name the job's bound", msg);
        }
        /* job b is still served */
        assert_int_equal(wait1(b, b2, 0, 4096, &h[N_EVENTS - 1], sizeof(h[0])), 0);
        /* all or nothing: b's 255 more in one go are too many by one, then one by one they fit */
        for (size_t i = 0; i < VRAM_WAITS_PER_JOB; i++)
                many[i] = (VramRange) { b2, 4096 * (i % 16), 4096 };
        assert_int_equal(vram_wait_event(b, many, VRAM_WAITS_PER_JOB, &h[N_EVENTS - 1], sizeof(h[0]), NULL, 0),
                         -ENOBUFS);
        assert_int_equal(vram_wait_event(b, many, VRAM_WAITS_PER_JOB - 1, &h[N_EVENTS - 1], sizeof(h[0]), NULL,
                                         0), 0);
        /* ranges of two jobs in one request */
        many[1].seg = a;
        assert_int_equal(vram_wait_event(b, many, 2, &h[N_EVENTS - 1], sizeof(h[0]), NULL, 0), -EINVAL);

        /* distinct events: those complete (and are forgotten), then job a sends others that never do */
        fake_release();
        fake_hold();
        for (int i = 0; i < N_EVENTS - 2; i++)
                assert_int_equal(drv->cuEventRecord(ev[i], NULL), CUDA_SUCCESS);
        for (r = 0; r < N_EVENTS - 3; r++)
                if (wait1(b, a, 0, 4096, &h[r], sizeof(h[r])) < 0)
                        break;
        assert_int_equal(r, VRAM_WAIT_EVENTS_PER_JOB);
        assert_int_equal(wait1(b, a, 4096, 4096, &h[0], sizeof(h[0])), 0);     /* one it has already: fine */
        assert_int_equal(wait1(b, b2, 0, 4096, &h[N_EVENTS - 3], sizeof(h[0])), 0);

        fake_release();
        for (int i = 0; i < N_EVENTS; i++)
                assert_int_equal(drv->cuEventDestroy(ev[i]), CUDA_SUCCESS);
        assert_int_equal(segpool_release(&b->pool, a), 0);
        assert_int_equal(segpool_release(&b->pool, b2), 0);
        vram_backend_free(b);
        cudrv_close(drv);
        sd_event_unref(e);
}

static void test_host_register(void **state) {
        MemfdSegConfig mc = { .name = "test-host", .numa_node = -1 };
        FakeCudaStats s0, s1;
        sd_event *e = NULL;
        VramBackend *b;
        SegPool host;

        assert_int_equal(sd_event_new(&e), 0);
        b = new_backend(e, 8 * MiB, 4 * MiB);
        assert_int_equal(segpool_init(&host, "memfd", &memfd_seg_ops, &mc, 8 * MiB, 2 * MiB), 0);
        s0 = stats();
        for (uint32_t i = 0; i < host.n_segs; i++)
                assert_int_equal(vram_host_register(b, &host.segs[i]), 0);
        s1 = stats();
        assert_int_equal(s1.host_registered - s0.host_registered, 4);
        assert_int_equal(s1.host_registered_bytes - s0.host_registered_bytes, 8 * MiB);
        assert_int_equal(vram_host_register(b, &host.segs[0]), -EEXIST);
        for (uint32_t i = 0; i < host.n_segs; i++)
                vram_host_unregister(b, &host.segs[i]);
        assert_int_equal(stats().host_registered, s0.host_registered);
        segpool_deinit(&host);
        vram_backend_free(b);
        sd_event_unref(e);
}

/* ---- segpool's revoke hook --------------------------------------------------------------------- */

static int revoke_calls;

static int revoke_later(SegPool *p, Segment *seg, void *userdata) {
        revoke_calls++;
        assert_non_null(seg->owner);            /* still known: whose clients to ask */
        return *(int *) userdata;
}

static void test_revoke_hook(void **state) {
        MemfdSegConfig mc = { .name = "test-revoke", .numa_node = -1 };
        int answer = 1;
        SegPool p;
        Segment *a, *b, *c;
        List owner;

        list_init(&owner);
        assert_int_equal(segpool_init(&p, "memfd", &memfd_seg_ops, &mc, 8 * 4096, 4 * 4096), 0);
        p.revoke = revoke_later;
        p.revoke_userdata = &answer;
        assert_int_equal(segpool_assign(&p, (Job *) &owner, &owner, &a), 0);
        assert_int_equal(segpool_assign(&p, (Job *) &owner, &owner, &b), 0);
        assert_int_equal(p.n_free, 0);

        /* revoking: out of service until the clients let go */
        assert_int_equal(segpool_release(&p, a), 0);
        assert_int_equal(revoke_calls, 1);
        assert_true(a->revoking);
        assert_null(a->owner);
        assert_int_equal(p.n_revoking, 1);
        assert_int_equal(p.n_free, 0);
        assert_int_equal(segpool_assign(&p, (Job *) &owner, &owner, &c), -ENOSPC);
        assert_int_equal(segpool_revoked(&p, a), 0);
        assert_false(a->revoking);
        assert_int_equal(a->generation, 1);
        assert_int_equal(p.n_revoking, 0);
        assert_int_equal(p.n_free, 1);
        assert_int_equal(segpool_revoked(&p, a), -EINVAL);
        assert_int_equal(segpool_assign(&p, (Job *) &owner, &owner, &c), 0);
        assert_ptr_equal(c, a);

        /* nobody to ask: dropped at once */
        answer = 0;
        assert_int_equal(segpool_release(&p, b), 0);
        assert_false(b->revoking);
        assert_int_equal(b->generation, 1);
        assert_int_equal(p.n_free, 1);
        segpool_deinit(&p);
}

/* ---- libtier's side: import, map, events, host registration --------------------------------------------- */

static void test_client_import(void **state) {
        uint8_t handle[CLIENT_CUDA_EVENT_SIZE];
        char error[256] = "";
        FakeCudaStats s0, s1;
        ClientCuda *cc = NULL;
        sd_event *e = NULL;
        VramBackend *b;
        Segment *seg, *seg2;
        uint64_t va = 0, va2 = 0, h = 0, h2 = 0, view = 0, view_size = 0;
        uint8_t *host;
        Done d;

        assert_int_equal(sd_event_new(&e), 0);
        b = new_backend(e, 16 * MiB, 4 * MiB);
        seg = &b->pool.segs[3];

        /* tierd's GPU by PCI bus id, as HelloReply names it; a GPU this process cannot see fails */
        assert_int_equal(client_cuda_new(&cc, "0000:99:00.0", error, sizeof(error)), -ENODEV);
        assert_non_null(strstr(error, "not visible to this process"));
        setenv("TIER_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        assert_int_equal(client_cuda_new(&cc, b->device, error, sizeof(error)), -ENODEV);
        assert_non_null(strstr(error, "cannot be loaded"));
        reset(state);
        assert_int_equal(client_cuda_new(&cc, b->device, error, sizeof(error)), 0);

        /* import the fd tierd would send: a second mapping of the same memory */
        s0 = stats();
        assert_int_equal(client_cuda_map(cc, seg->fd, b->pool.seg_size, &va, &h), 0);
        s1 = stats();
        assert_int_equal(s1.imports - s0.imports, 1);
        assert_int_equal(s1.releases - s0.releases, 0);         /* the handle is kept, for views */
        assert_true(va != 0 && va != seg->device_ptr && h != 0);
        memset((void *) (uintptr_t) (va + 4096), 0xc3, 4096);
        assert_true(all_bytes((void *) (uintptr_t) (seg->device_ptr + 4096), 0xc3, 4096));
        assert_int_equal(client_cuda_map(cc, seg->fd, 4096, &va2, &h2), -EPROTO);   /* not whole granules */
        assert_int_equal(client_cuda_map(cc, -1, b->pool.seg_size, &va2, &h2), -EINVAL);

        assert_non_null(strstr(client_cuda_error(cc), "cannot import"));

        /*
         * A view (a tensor that spans chunks): two chunks, whole, side by
         * side.  Part of a chunk is refused, as the real driver does
         * (CUDA_ERROR_NOT_SUPPORTED, tests/gpu/vmm-probe.c).
         */
        seg2 = &b->pool.segs[2];
        assert_int_equal(client_cuda_map(cc, seg2->fd, b->pool.seg_size, &va2, &h2), 0);
        assert_int_equal(client_cuda_view_new(cc, 2 * b->pool.seg_size - 4096, &view, &view_size), 0);
        assert_int_equal(view_size, 2 * b->pool.seg_size);     /* whole granules */
        assert_int_equal(client_cuda_view_map(cc, view, h, 0, b->pool.seg_size), 0);
        assert_int_equal(client_cuda_view_map(cc, view + b->pool.seg_size, h2, 0, b->pool.seg_size), 0);
        assert_int_equal(client_cuda_view_map(cc, view, h, 4096, 4096), -EPROTO);      /* off the granularity */
        memset((void *) (uintptr_t) (seg->device_ptr + b->pool.seg_size - 4096), 0x5e, 4096);
        memset((void *) (uintptr_t) (seg2->device_ptr), 0x6f, 4096);
        assert_true(all_bytes((void *) (uintptr_t) (view + b->pool.seg_size - 4096), 0x5e, 4096));
        assert_true(all_bytes((void *) (uintptr_t) (view + b->pool.seg_size), 0x6f, 4096));
        client_cuda_view_unmap(cc, view, b->pool.seg_size);
        client_cuda_view_unmap(cc, view + b->pool.seg_size, b->pool.seg_size);
        client_cuda_view_free(cc, view, view_size);
        assert_int_equal(client_cuda_view_new(cc, 2 * MiB, &view, &view_size), 0);
        assert_int_equal(client_cuda_view_map(cc, view, h, 2 * MiB, 2 * MiB), -EOPNOTSUPP);
        assert_non_null(strstr(client_cuda_error(cc), "CUDA_ERROR_NOT_SUPPORTED"));
        client_cuda_view_free(cc, view, view_size);
        client_cuda_unmap(cc, va2, b->pool.seg_size, h2);
        va2 = h2 = 0;

        /* stream-ordered wait on tierd's copy event */
        host = calloc(1, 4096);
        assert_non_null(host);
        fake_hold();
        d = (Done) { .copy = { .dir = VRAM_TO_DEVICE, .host = host, .seg = seg, .offset = 0, .len = 4096,
                               .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d.copy), 0);
        assert_int_equal(vram_copy_event(b, seg, 0, 4096, handle), 1);
        fake_release();
        s0 = stats();
        assert_int_equal(client_cuda_stream_wait(cc, handle, NULL), 0);
        assert_int_equal(client_cuda_stream_wait(cc, handle, NULL), 0);
        s1 = stats();
        assert_int_equal(s1.ipc_opens - s0.ipc_opens, 1);      /* opened once, cached */
        assert_int_equal(s1.stream_waits - s0.stream_waits, 2);
        run_until_done(e, &d);

        /* an event for Unpin.ipc_event, which tierd can open */
        assert_int_equal(client_cuda_record(cc, NULL, handle), 0);
        assert_int_equal(wait1(b, seg, 0, 4096, handle, sizeof(handle)), 0);
        /* completed events of the pool are reused */
        s0 = stats();
        for (int i = 0; i < 10; i++)
                assert_int_equal(client_cuda_record(cc, NULL, handle), 0);
        assert_int_equal(stats().events, s0.events);

        /* host registration of a host-tier mapping */
        s0 = stats();
        assert_int_equal(client_cuda_host_register(cc, host, 4096), 0);
        assert_int_equal(client_cuda_host_register(cc, host, 4096), -EEXIST);
        assert_int_equal(stats().host_registered - s0.host_registered, 1);
        client_cuda_host_unregister(cc, host);
        assert_int_equal(stats().host_registered, s0.host_registered);

        s0 = stats();
        client_cuda_unmap(cc, va, b->pool.seg_size, h);
        assert_int_equal(stats().unmaps - s0.unmaps, 1);
        assert_int_equal(stats().releases - s0.releases, 1);
        cc = client_cuda_free(cc);
        free(host);
        vram_backend_free(b);
        sd_event_unref(e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup(test_no_device, reset),
                cmocka_unit_test_setup(test_fallback, reset),
                cmocka_unit_test_setup(test_chunk_fails_at_start, reset),
                cmocka_unit_test(test_arena),
                cmocka_unit_test_setup(test_capacity_zero, reset),
                cmocka_unit_test(test_pci_numa),
                cmocka_unit_test_setup(test_arena_chunks, reset),
                cmocka_unit_test_setup(test_copies, reset),
                cmocka_unit_test_setup(test_copy_event, reset),
                cmocka_unit_test_setup(test_wait_event, reset),
                cmocka_unit_test_setup(test_wait_event_per_job, reset),
                cmocka_unit_test_setup(test_host_register, reset),
                cmocka_unit_test(test_revoke_hook),
                cmocka_unit_test_setup(test_client_import, reset),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
