/* SPDX-License-Identifier: MIT */
/* test-vram-cuda-reclaim.c: reclaim on the cuda pool, where ranges a client's pending event is on are parked. */

/*
 * An in-process tierd core (fixture.c) on the CUDA backend and the fake
 * driver (as test-vram-cuda-park.c): a client's interprocess event held
 * with fake_cuda_hold_event() stays pending until the test releases it, so
 * the range of a tensor destroyed meanwhile stays parked (SegPoolOps.park)
 * in its chunk, which nothing can empty before the event completes.
 */

#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "daemon/tiers/segpool.h"
#include "daemon/tiers/vram.h"
#include "proto/cudrv.h"
#include "proto/macro.h"
#include "tests/helpers/fake-cuda.h"
#include "tests/unit/fixture.h"

static fake_cuda_hold_event_t fake_hold_event;
static fake_cuda_release_event_t fake_release_event;

/* VRAM on the CUDA backend: two 2 MiB chunks, a job may hold both. */
static void cuda_setup(Config *c, void *userdata) {
        (void) userdata;
        c->vram_backend = VRAM_BACKEND_CUDA;
        c->vram_capacity = 4 * MiB;
        c->vram_chunk_size = 2 * MiB;
        c->vram_job_limit = 4 * MiB;
}

/* The VRAM chunk @t's copy is in (it is in one). */
static Segment *chunk_of(const Tensor *t) {
        assert_int_equal(t->copy[LEVEL_VRAM].n_pieces, 1);
        return t->copy[LEVEL_VRAM].pieces[0].seg;
}

/* @t is pinned in VRAM: its client unpins it after a kernel that does not end (@ev held), and destroys it. */
static void park(Manager *m, CuDriver *drv, CUevent ev, Tensor *t) {
        const CopyPiece *piece = &t->copy[LEVEL_VRAM].pieces[0];
        VramRange g = { chunk_of(t), piece->offset, piece->len };
        CUipcEventHandle h;

        fake_hold_event(ev);
        assert_int_equal(drv->cuEventRecord(ev, NULL), CUDA_SUCCESS);
        assert_int_equal(drv->cuIpcGetEventHandle(&h, ev), CUDA_SUCCESS);
        assert_int_equal(vram_wait_event(m->vram, &g, 1, &h, sizeof(h), NULL, 0), 0);
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, true), 0);
        assert_int_equal(tensor_free(t), 0);
}

/*
 * Lingering job A holds both chunks: S1 only a range a client's event that never completes (until the
 * test releases it) is on, its tensor destroyed (parked), S2 a clean copy.  Live job B pins a tensor in
 * VRAM: reclaim must empty S2 for it (S1 cannot be emptied), not pick S1, free nothing and give up.
 * Once the event completes, S1 comes back as any empty chunk.
 */
static void test_parked_chunk_not_chosen(void **state) {
        Manager *m = fixture_new(16 * MiB, cuda_setup, NULL);
        _cleanup_free_ char *why = NULL;
        CuDriver *drv = NULL;
        Tensor *x, *y, *z;
        Segment *s1, *s2;
        Job *a, *b;
        CUevent ev;

        (void) state;
        assert_false(m->vram->emulated);
        assert_int_equal(m->vram->pool.n_segs, 2);
        assert_int_equal(cudrv_open(&drv, &why), 0);
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        assert_int_equal(job_new(m->registry, "b", 0, &b), 0);
        b->n_conns = 1;         /* B is live; A lingers (no connection): its room is the first to go */

        /* A's X fills chunk S1; its client unpins it after a kernel that does not end; X is destroyed */
        x = fixture_tensor(a, "x", 2 * MiB);
        assert_int_equal(fixture_op(m, OP_PIN, x, LEVEL_VRAM), 0);
        s1 = chunk_of(x);
        assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        park(m, drv, ev, x);
        assert_int_equal(s1->used, 2 * MiB);   /* parked: taken until the event completes */
        assert_int_equal(s1->parked, 2 * MiB);
        assert_int_equal(a->used[LEVEL_VRAM], 0);

        /* A's Y, clean in VRAM (its host copy valid), fills chunk S2: the pool is dry */
        y = fixture_tensor(a, "y", 2 * MiB);
        fixture_host_data(m, y, 0x5a);
        fixture_touch(m, y, LEVEL_VRAM, false);
        s2 = chunk_of(y);
        assert_ptr_not_equal(s1, s2);
        assert_int_equal(m->vram->pool.n_free, 0);

        /* B's Z gets its room from S2, the chunk of A's that can be emptied */
        z = fixture_tensor(b, "z", 2 * MiB);
        assert_int_equal(fixture_op(m, OP_PIN, z, LEVEL_VRAM), 0);
        assert_true(copy_valid(z, LEVEL_VRAM));
        assert_ptr_equal(chunk_of(z), s2);
        assert_false(copy_valid(y, LEVEL_VRAM));
        assert_true(copy_valid(y, LEVEL_HOST));
        assert_ptr_equal(s1->owner, a);
        assert_int_equal(s1->used, 2 * MiB);   /* still parked */
        assert_int_equal(tensor_unpin(z, LEVEL_VRAM, false), 0);

        /* the event completes: S1's range comes back at the next placement, and S1 with it */
        fake_release_event(ev);
        x = fixture_tensor(b, "w", 2 * MiB);
        assert_int_equal(fixture_op(m, OP_PIN, x, LEVEL_VRAM), 0);
        assert_ptr_equal(chunk_of(x), s1);
        assert_int_equal(s1->parked, 0);
        assert_int_equal(tensor_unpin(x, LEVEL_VRAM, false), 0);

        b->n_conns = 0;
        assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
        cudrv_close(drv);
        fixture_free(m);
}

/*
 * Lingering job A: chunk S1 holds a parked range and clean Y1, its least recently used copy; chunk S2
 * clean Y2.  Live job B pins a tensor in VRAM: the room comes from S2, which emptied comes back at
 * once; Y1 stays (emptying S1 would free nothing before the event completes).
 */
static void test_parked_chunk_last(void **state) {
        Manager *m = fixture_new(16 * MiB, cuda_setup, NULL);
        _cleanup_free_ char *why = NULL;
        CuDriver *drv = NULL;
        Tensor *x, *y1, *y2, *z;
        Job *a, *b;
        CUevent ev;

        (void) state;
        assert_int_equal(cudrv_open(&drv, &why), 0);
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        assert_int_equal(job_new(m->registry, "b", 0, &b), 0);
        b->n_conns = 1;
        x = fixture_tensor(a, "x", MiB);
        y1 = fixture_tensor(a, "y1", MiB);
        y2 = fixture_tensor(a, "y2", 2 * MiB);
        fixture_host_data(m, y1, 0x11);
        fixture_host_data(m, y2, 0x22);

        /* S1: X at [0, 1 MiB), parked, and Y1; then S2: Y2, used more recently than Y1 */
        assert_int_equal(fixture_op(m, OP_PIN, x, LEVEL_VRAM), 0);
        fixture_touch(m, y1, LEVEL_VRAM, false);
        assert_ptr_equal(chunk_of(y1), chunk_of(x));
        assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        park(m, drv, ev, x);
        fixture_touch(m, y2, LEVEL_VRAM, false);
        assert_ptr_not_equal(chunk_of(y2), chunk_of(y1));
        assert_int_equal(chunk_of(y1)->parked, MiB);
        assert_int_equal(m->vram->pool.n_free, 0);

        z = fixture_tensor(b, "z", 2 * MiB);
        assert_int_equal(fixture_op(m, OP_PIN, z, LEVEL_VRAM), 0);
        assert_false(copy_valid(y2, LEVEL_VRAM));
        assert_true(copy_valid(y1, LEVEL_VRAM));        /* not evicted for room its chunk cannot give */
        assert_int_equal(tensor_unpin(z, LEVEL_VRAM, false), 0);

        fake_release_event(ev);
        b->n_conns = 0;
        assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
        cudrv_close(drv);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parked_chunk_not_chosen),
                cmocka_unit_test(test_parked_chunk_last),
        };
        const char *path = getenv("TIER_FAKE_CUDA");
        void *lib;
        int r;

        if (!path) {
                fprintf(stderr, "TIER_FAKE_CUDA is not set (run through meson test)\n");
                return 1;
        }
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);     /* the instance the backend dlopen()s */
        if (!lib)
                return 1;
        fake_hold_event = (fake_cuda_hold_event_t) dlsym(lib, FAKE_CUDA_HOLD_EVENT);
        fake_release_event = (fake_cuda_release_event_t) dlsym(lib, FAKE_CUDA_RELEASE_EVENT);
        if (!fake_hold_event || !fake_release_event)
                return 1;
        setenv("TIER_LIBCUDA", path, 1);
        r = fixture_main("vram-cuda-reclaim", tests, ELEMENTSOF(tests));
        dlclose(lib);
        return r;
}
