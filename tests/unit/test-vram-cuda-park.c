/* SPDX-License-Identifier: MIT */
/* test-vram-cuda-park.c: a client's pending event holds up nothing but what is on its VRAM range. */

/*
 * On the fake CUDA driver (as test-vram-cuda.c): a client's interprocess
 * event recorded while fake_hold() is on stays pending until
 * fake_release(); the fake's cuStreamWaitEvent() returns at once, as the
 * driver's, and what the stream runs after it waits, so a fill, which
 * synchronizes on its stream, that waited for such an event would block
 * the caller, on tierd the loop thread.  Fills run on a thread of
 * their own here; the test fails if one has not returned while the event
 * is still held.  The deadline of that join is a safety net only, hit by
 * a broken backend: a correct one returns at once.
 */

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/vram.h"
#include "proto/cudrv.h"
#include "proto/macro.h"
#include "tests/helpers/fake-cuda.h"

#define MiB (1ull << 20)
/* How long a fill or a copy may take before the test gives up on it (it then fails): a safety net, not a
 * timing. */
#define FILL_DEADLINE_SEC 3

static void *fake_lib;
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
        fake_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);        /* the instance the backend dlopen()s */
        if (!fake_lib)
                return -1;
        fake_hold = (fake_cuda_hold_t) dlsym(fake_lib, FAKE_CUDA_HOLD);
        fake_release = (fake_cuda_release_t) dlsym(fake_lib, FAKE_CUDA_RELEASE);
        fake_hold_event = (fake_cuda_hold_event_t) dlsym(fake_lib, FAKE_CUDA_HOLD_EVENT);
        fake_release_event = (fake_cuda_release_event_t) dlsym(fake_lib, FAKE_CUDA_RELEASE_EVENT);
        fake_fail = (fake_cuda_fail_t) dlsym(fake_lib, FAKE_CUDA_FAIL);
        if (!fake_hold || !fake_release || !fake_hold_event || !fake_release_event || !fake_fail)
                return -1;
        setenv("TIER_LIBCUDA", path, 1);
        return 0;
}

static int teardown(void **state) {
        if (fake_lib)
                dlclose(fake_lib);
        return 0;
}

static bool all_bytes(uint64_t device_ptr, uint8_t v, size_t n) {
        const uint8_t *q = (const uint8_t *) (uintptr_t) device_ptr;

        for (size_t i = 0; i < n; i++)
                if (q[i] != v)
                        return false;
        return true;
}

typedef struct Fill {
        VramBackend *b;
        Segment *seg;
        uint64_t offset, len;
        int result;
} Fill;

static void *fill_thread(void *userdata) {
        Fill *f = userdata;

        f->result = f->b->ops->zero(f->b, f->seg, f->offset, f->len);
        return NULL;
}

/* b->ops->zero() as the loop thread would call it, which must return while @ev is still pending. */
static int fill(VramBackend *b, CuDriver *drv, CUevent ev, Segment *seg, uint64_t offset, uint64_t len) {
        Fill f = { b, seg, offset, len, 0 };
        struct timespec until;
        pthread_t th;

        assert_int_equal(pthread_create(&th, NULL, fill_thread, &f), 0);
        assert_int_equal(clock_gettime(CLOCK_REALTIME, &until), 0);
        until.tv_sec += FILL_DEADLINE_SEC;
        if (pthread_timedjoin_np(th, NULL, &until) != 0) {
                fake_release();         /* let it end, then fail */
                pthread_join(th, NULL);
                fail_msg("the fill of [%" PRIu64 ", +%" PRIu64 ") waited for a client's event", offset, len);
        }
        assert_int_equal(drv->cuEventQuery(ev), CUDA_ERROR_NOT_READY);  /* it returned before the event */
        return f.result;
}

/* A client's pending event on [@offset, +@len) of @seg, as an Unpin with ipc_event leaves it. */
static void client_event(VramBackend *b, CuDriver *drv, CUevent ev, Segment *seg, uint64_t offset, uint64_t len) {
        VramRange g = { seg, offset, len };
        CUipcEventHandle h;

        fake_hold();
        assert_int_equal(drv->cuEventRecord(ev, NULL), CUDA_SUCCESS);
        assert_int_equal(drv->cuIpcGetEventHandle(&h, ev), CUDA_SUCCESS);
        assert_int_equal(vram_wait_event(b, &g, 1, &h, sizeof(h), NULL, 0), 0);
}

static VramBackend *new_backend(sd_event *e) {
        _cleanup_free_ char *why = NULL;
        VramBackend *b = NULL;
        Config c;

        config_init(&c);
        c.vram_backend = VRAM_BACKEND_CUDA;
        c.vram_capacity = 16 * MiB;
        c.vram_chunk_size = 4 * MiB;
        if (vram_cuda_new(&c, e, &b, &why) < 0)
                fail_msg("vram_cuda_new: %s", why ? why : "?");
        config_deinit(&c);
        return b;
}

/*
 * A job frees a tensor (its range given back) while its client's event on it is pending: the next
 * tensor does not get that range, and its fill returns at once; the range comes back once the
 * event has completed.  A fill of a range with the event on it is refused, not waited for.
 */
static void test_freed_range_parked(void **state) {
        _cleanup_free_ char *why = NULL;
        CuDriver *drv = NULL;
        sd_event *e = NULL;
        VramBackend *b;
        uint64_t off;
        Segment *seg;
        CUevent ev;
        List owned;
        int job;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        b = new_backend(e);
        list_init(&owned);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job, &owned, &seg), 0);
        assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);

        /* tensor x at [0, 1 MiB), written by a kernel still running at its unpin; then destroyed */
        assert_int_equal(segment_alloc(seg, MiB, SEG_UNIT, &off), 0);
        assert_int_equal(off, 0);
        memset((void *) (uintptr_t) seg->device_ptr, 0x5a, 2 * MiB);
        client_event(b, drv, ev, seg, 0, MiB);
        segment_free(seg, 0, MiB);

        /* tensor y: placed elsewhere, and zeroed without waiting for x's kernel */
        segpool_settle(&b->pool);
        assert_int_equal(segment_alloc(seg, MiB, SEG_UNIT, &off), 0);
        assert_int_equal(fill(b, drv, ev, seg, off, MiB), 0);
        assert_int_equal(off, MiB);
        assert_true(all_bytes(seg->device_ptr + off, 0, MiB));
        assert_true(all_bytes(seg->device_ptr, 0x5a, MiB));    /* x's range untouched under its kernel */
        assert_int_equal(seg->used, 2 * MiB);

        /* a fill of the range the event is on (a copy refilled in place) is refused */
        assert_int_equal(fill(b, drv, ev, seg, 0, 4096), -EBUSY);
        assert_true(all_bytes(seg->device_ptr, 0x5a, MiB));
        assert_true(strstr(vram_zero_why(-EBUSY), "tier_unpin_after()"));

        /* the event completes: the range comes back at the next placement */
        fake_release();
        segpool_settle(&b->pool);
        assert_int_equal(seg->used, MiB);
        assert_int_equal(segment_alloc(seg, MiB, SEG_UNIT, &off), 0);
        assert_int_equal(off, 0);
        segment_free(seg, 0, MiB);      /* no event pending: at once */
        assert_int_equal(seg->used, MiB);
        segment_free(seg, MiB, MiB);

        /* a chunk given back drops what was parked in it: nothing is freed twice in its new memory */
        assert_int_equal(segment_alloc(seg, MiB, SEG_UNIT, &off), 0);
        client_event(b, drv, ev, seg, off, MiB);
        segment_free(seg, off, MiB);
        assert_int_equal(seg->used, MiB);
        assert_int_equal(segpool_release(&b->pool, seg), 0);
        assert_int_equal(seg->used, 0);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job, &owned, &seg), 0);
        assert_int_equal(segment_alloc(seg, MiB, SEG_UNIT, &off), 0);
        fake_release();
        segpool_settle(&b->pool);
        for (uint32_t i = 0; i < b->pool.n_segs; i++)
                if (b->pool.segs[i].owner)
                        assert_int_equal(b->pool.segs[i].used, MiB);
        segment_free(seg, off, MiB);

        assert_int_equal(segpool_release(&b->pool, seg), 0);
        assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
        vram_backend_free(b);
        cudrv_close(drv);
        sd_event_unref(e);
}

typedef struct Done {
        VramCopy copy;
        bool done;
} Done;

static void on_done(VramCopy *c) {
        container_of(c, Done, copy)->done = true;
}

/* Run the loop until @d's copy is handed back; the deadline is a safety net (the test then fails). */
static void run_until_done(sd_event *e, Done *d, const char *what) {
        for (int i = 0; i < FILL_DEADLINE_SEC * 100 && !d->done; i++)
                assert_true(sd_event_run(e, 10 * 1000) >= 0);
        if (!d->done)
                fail_msg("%s was not handed back", what);
}

/* Queue a copy of [@offset, +@len) of @seg out to @host. */
static void copy_out(VramBackend *b, Done *d, Segment *seg, uint64_t offset, uint64_t len, void *host) {
        *d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = offset, .len = len,
                                .done = on_done } };
        assert_int_equal(b->ops->copy(b, &d->copy), 0);
}

/*
 * Job A's copy waits on a stream for its client's event, which has not completed: job B's copies are
 * handed back meanwhile, the one on the other stream of the direction, and those queued after it (two
 * at once, as the stretches of one transfer: on the stream that waits for no client's event, not
 * behind A's); once A's event completes, A's copy is handed back too.
 */
static void test_copy_behind_event(void **state) {
        _cleanup_free_ char *why = NULL;
        uint8_t *host_a, *host_b;
        CuDriver *drv = NULL;
        Segment *sa, *sb;
        sd_event *e = NULL;
        List owned_a, owned_b;
        int job_a, job_b;
        CUipcEventHandle h;
        VramBackend *b;
        Done da, db, dc, dd;
        VramRange g;
        CUevent ev;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        b = new_backend(e);
        list_init(&owned_a);
        list_init(&owned_b);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job_a, &owned_a, &sa), 0);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job_b, &owned_b, &sb), 0);
        memset((void *) (uintptr_t) sa->device_ptr, 0x5a, MiB);
        memset((void *) (uintptr_t) sb->device_ptr, 0x6b, 3 * MiB);
        host_a = calloc(1, MiB);
        host_b = calloc(1, 3 * MiB);
        assert_non_null(host_a);
        assert_non_null(host_b);

        /* A's client unpinned [0, 1 MiB) after a kernel that never ends (until released below) */
        assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        fake_hold_event(ev);
        assert_int_equal(drv->cuEventRecord(ev, NULL), CUDA_SUCCESS);
        assert_int_equal(drv->cuIpcGetEventHandle(&h, ev), CUDA_SUCCESS);
        g = (VramRange) { sa, 0, MiB };
        assert_int_equal(vram_wait_event(b, &g, 1, &h, sizeof(h), NULL, 0), 0);

        /* A's copy out waits on its stream; B's goes on the other and is handed back */
        copy_out(b, &da, sa, 0, MiB, host_a);
        copy_out(b, &db, sb, 0, MiB, host_b);
        run_until_done(e, &db, "job B's copy, on another stream than job A's stuck one,");
        assert_int_equal(db.copy.result, 0);
        assert_true(all_bytes((uintptr_t) host_b, 0x6b, MiB));
        /* B's next two copies, queued together, both go on the stream that waits for no event */
        copy_out(b, &dc, sb, MiB, MiB, host_b + MiB);
        copy_out(b, &dd, sb, 2 * MiB, MiB, host_b + 2 * MiB);
        run_until_done(e, &dc, "job B's next copy, with a stream of its direction free,");
        run_until_done(e, &dd, "job B's copy queued with it, beside a stream that waits for an event,");
        assert_true(all_bytes((uintptr_t) host_b + MiB, 0x6b, 2 * MiB));
        assert_false(da.done);
        assert_true(all_bytes((uintptr_t) host_a, 0, MiB));     /* not copied before the kernel ends */
        assert_int_equal(drv->cuEventQuery(ev), CUDA_ERROR_NOT_READY);

        /* the kernel ends: A's copy runs and is handed back */
        fake_release_event(ev);
        run_until_done(e, &da, "job A's copy, its event completed,");
        assert_int_equal(da.copy.result, 0);
        assert_true(all_bytes((uintptr_t) host_a, 0x5a, MiB));

        assert_int_equal(segpool_release(&b->pool, sa), 0);
        assert_int_equal(segpool_release(&b->pool, sb), 0);
        assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
        free(host_a);
        free(host_b);
        vram_backend_free(b);
        cudrv_close(drv);
        sd_event_unref(e);
}

typedef struct Queue {
        VramBackend *b;
        VramCopy *copy;
        int result;
} Queue;

static void *queue_thread(void *userdata) {
        Queue *q = userdata;

        q->result = q->b->ops->copy(q->b, q->copy);
        return NULL;
}

/*
 * A copy's completion event cannot be recorded (cuEventRecord fails) after its pieces went on a stream
 * that waits for a client's event: queueing it returns while the event is pending (nothing on the loop
 * thread waits for the stream), and the copy is handed back, failed, once its pieces are done.
 */
static void test_record_failure_no_wait(void **state) {
        _cleanup_free_ char *why = NULL;
        struct timespec until;
        CuDriver *drv = NULL;
        sd_event *e = NULL;
        CUipcEventHandle h;
        VramBackend *b;
        uint8_t *host;
        Segment *seg;
        pthread_t th;
        VramRange g;
        CUevent ev;
        List owned;
        Queue q;
        Done d;
        int job;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        b = new_backend(e);
        list_init(&owned);
        assert_int_equal(segpool_assign(&b->pool, (Job *) &job, &owned, &seg), 0);
        memset((void *) (uintptr_t) seg->device_ptr, 0x5a, MiB);
        host = calloc(1, MiB);
        assert_non_null(host);

        assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        fake_hold_event(ev);
        assert_int_equal(drv->cuEventRecord(ev, NULL), CUDA_SUCCESS);
        assert_int_equal(drv->cuIpcGetEventHandle(&h, ev), CUDA_SUCCESS);
        g = (VramRange) { seg, 0, MiB };
        assert_int_equal(vram_wait_event(b, &g, 1, &h, sizeof(h), NULL, 0), 0);

        /* the copy's own event is not recorded: queued as the loop thread would, on a thread here */
        d = (Done) { .copy = { .dir = VRAM_TO_HOST, .host = host, .seg = seg, .offset = 0, .len = MiB,
                               .done = on_done } };
        q = (Queue) { b, &d.copy, 1 };
        fake_fail("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED, 0, 1);
        assert_int_equal(pthread_create(&th, NULL, queue_thread, &q), 0);
        assert_int_equal(clock_gettime(CLOCK_REALTIME, &until), 0);
        until.tv_sec += FILL_DEADLINE_SEC;
        if (pthread_timedjoin_np(th, NULL, &until) != 0) {
                fake_release_event(ev);         /* let it end, then fail */
                pthread_join(th, NULL);
                fail_msg("queueing a copy whose event could not be recorded waited for a client's event");
        }
        assert_int_equal(q.result, 0);
        assert_int_equal(drv->cuEventQuery(ev), CUDA_ERROR_NOT_READY);
        assert_false(d.done);

        /* the client's kernel ends: the pieces run, then the copy is handed back with the failure */
        fake_release_event(ev);
        run_until_done(e, &d, "the copy whose event could not be recorded");
        assert_true(d.copy.result < 0);
        assert_true(all_bytes((uintptr_t) host, 0x5a, MiB));   /* its pieces ran before it was handed back */

        assert_int_equal(segpool_release(&b->pool, seg), 0);
        assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
        free(host);
        vram_backend_free(b);
        cudrv_close(drv);
        sd_event_unref(e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_freed_range_parked),
                cmocka_unit_test(test_copy_behind_event),
                cmocka_unit_test(test_record_failure_no_wait),
        };

        return cmocka_run_group_tests(tests, setup, teardown);
}
