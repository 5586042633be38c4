/* SPDX-License-Identifier: MIT */
/* test-registry.c: jobs, tensors, copies and the op engine's state machine, driven directly. */

#include <errno.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/fence.h"
#include "tests/unit/fixture.h"

/* ---- calloc() failing on cue: the test links with -Wl,--wrap=calloc -------------------------- */

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static int calloc_fail_in = -1;         /* fail the call this many calls from now (0: the next); -1: never */

void *__wrap_calloc(size_t n, size_t size) {
        if (calloc_fail_in >= 0 && calloc_fail_in-- == 0) {
                errno = ENOMEM;
                return NULL;
        }
        return __real_calloc(n, size);
}

typedef struct Result {
        int done;
        int status;
        int reserved;
} Result;

static char last_error[160];

static void on_complete(Op *op, int status, const char *error) {
        Result *r = op->userdata;

        r->done++;
        r->status = status;
        snprintf(last_error, sizeof(last_error), "%s", error ? error : "");
}

static void on_reserved(Op *op) {
        Result *r = op->userdata;

        r->reserved++;
}

static Manager *new_manager(void) {
        return fixture_new(32 * MiB, NULL, NULL);
}

/* Run the loop until @r completed (or FIXTURE_NEVER_USEC passed). */
static void run_until(Manager *m, Result *r) {
        FIXTURE_RUN_UNTIL(m, r->done);
        assert_int_equal(r->done, 1);
}

static int submit(Manager *m, OpKind k, Tensor *t, int tier, Result *r) {
        memset(r, 0, sizeof(*r));
        return op_submit(m->engine, k, t, tier, on_complete, k == OP_PIN ? on_reserved : NULL, r, NULL);
}

static void write_host(Tensor *t, uint8_t v) {
        Copy *c = &t->copy[LEVEL_HOST];

        memset(copy_addr(c, 0), v, t->size);
}

static uint8_t read_host(Tensor *t, uint64_t off) {
        return fixture_byte(t, LEVEL_HOST, off);
}

/*
 * Pinned bytes (status: each tier's and each job's "pinned") are what pinned copies take: a copy
 * two ranks pin counts once.  Each pin counted its tensor's bytes again: a 1 MiB tensor pinned by
 * two ranks showed 2 MiB pinned beside 1 MiB used.
 */
static void test_pinned_bytes_per_copy(void **state) {
        Manager *m = new_manager();
        Job *j;
        Tensor *t;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        assert_int_equal(tensor_new(j, "t", 5000, &t), 0);
        for (int i = 0; i < 2; i++) {           /* two ranks' pins */
                t->copy[LEVEL_HOST].pins++;
                tensor_pin_account(t, LEVEL_HOST, +1);
        }
        assert_int_equal(j->pinned[LEVEL_HOST], 8192);
        assert_int_equal(m->registry->pinned[LEVEL_HOST], 8192);
        t->copy[LEVEL_HOST].pins--;
        tensor_pin_account(t, LEVEL_HOST, -1);
        assert_int_equal(j->pinned[LEVEL_HOST], 8192);          /* still pinned by the other */
        tensor_pin_account(t, LEVEL_HOST, -1);
        t->copy[LEVEL_HOST].pins--;
        assert_int_equal(j->pinned[LEVEL_HOST], 0);
        assert_int_equal(m->registry->pinned[LEVEL_HOST], 0);
        job_destroy(j);
        fixture_free(m);
}

static void test_zero_then_dirty_then_evict(void **state) {
        Manager *m = new_manager();
        Result r;
        Job *j;
        Tensor *t;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        assert_int_equal(tensor_new(j, "t", 1 * MiB, &t), 0);

        /* a fresh tensor: zero-filled on first pin, no I/O, version 0 */
        assert_int_equal(submit(m, OP_PIN, t, LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(t->copy[LEVEL_HOST].pins, 1);
        assert_int_equal(read_host(t, 12345), 0);
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].ops, 0);

        /* evicting a pinned copy is refused */
        assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EBUSY);

        /* write, unpin dirty: the host copy is now the sole copy */
        write_host(t, 0x5a);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
        assert_int_equal(t->version, 1);
        assert_true(copy_is_sole(t, LEVEL_HOST));

        /* evict to NVMe: written down, host dropped */
        assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(t->copy[LEVEL_NVME].state, COPY_RESIDENT);
        assert_int_equal(t->copy[LEVEL_NVME].version, 1);
        assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, 1 * MiB);
        assert_int_equal(j->used[LEVEL_HOST], 0);

        /* prefetch back: read, crc checked, same bytes; NVMe copy stays (clean) */
        assert_int_equal(submit(m, OP_PREFETCH, t, LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(read_host(t, 777), 0x5a);
        assert_true(copy_valid(t, LEVEL_NVME));
        assert_false(copy_is_sole(t, LEVEL_HOST));

        /* a dirty unpin makes the NVMe copy stale: it is freed at once */
        assert_int_equal(submit(m, OP_PIN, t, LEVEL_HOST, &r), 0);
        run_until(m, &r);
        write_host(t, 0x11);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);
        assert_int_equal(t->copy[LEVEL_NVME].state, COPY_ABSENT);
        assert_int_equal(j->used[LEVEL_NVME], 0);

        /* a clean copy is dropped without I/O when evicting */
        assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
        run_until(m, &r);
        assert_int_equal(submit(m, OP_PREFETCH, t, LEVEL_HOST, &r), 0);
        run_until(m, &r);
        {
                uint64_t written = m->engine->links[LINK_HOST_TO_NVME].bytes;

                assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
                run_until(m, &r);
                assert_int_equal(m->engine->links[LINK_HOST_TO_NVME].bytes, written);
        }

        job_destroy(j);
        fixture_free(m);
}

static void test_lru_victim_and_drain(void **state) {
        Manager *m = new_manager();
        Result r;
        Job *j;
        Tensor *t[5];
        char name[8];

        /* host limit 4 MiB = one segment: four 1 MiB tensors fill it */
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (int i = 0; i < 5; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                assert_int_equal(tensor_new(j, name, 1 * MiB, &t[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
                assert_int_equal(submit(m, OP_PIN, t[i], LEVEL_HOST, &r), 0);
                run_until(m, &r);
                write_host(t[i], (uint8_t) (i + 1));
                assert_int_equal(tensor_unpin(t[i], LEVEL_HOST, true), 0);
        }
        assert_int_equal(j->used[LEVEL_HOST], 4 * MiB);

        /* touch t0 so that t1 is the least recently used */
        assert_int_equal(submit(m, OP_PIN, t[0], LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(tensor_unpin(t[0], LEVEL_HOST, false), 0);
        /* pin t2 so it can never be chosen */
        assert_int_equal(submit(m, OP_PIN, t[2], LEVEL_HOST, &r), 0);
        run_until(m, &r);

        /* a fifth tensor: t1 (LRU, sole copy) is drained to NVMe, then dropped */
        assert_int_equal(submit(m, OP_PIN, t[4], LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(t[1]->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(t[1]->copy[LEVEL_NVME].state, COPY_RESIDENT);
        assert_int_equal(t[0]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(t[2]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(t[3]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_true(j->used[LEVEL_HOST] <= j->limit[LEVEL_HOST]);

        /* t1 comes back intact (another victim goes) */
        assert_int_equal(tensor_unpin(t[4], LEVEL_HOST, false), 0);
        assert_int_equal(submit(m, OP_PIN, t[1], LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(read_host(t[1], 4096), 2);
        assert_int_equal(t[2]->copy[LEVEL_HOST].state, COPY_RESIDENT);   /* still pinned */
        assert_int_equal(tensor_unpin(t[1], LEVEL_HOST, false), 0);

        /* everything pinned: a clear -ENOSPC, not a hang */
        for (int i = 0; i < 4; i++) {
                if (i == 2)
                        continue;
                assert_int_equal(submit(m, OP_PIN, t[i], LEVEL_HOST, &r), 0);
                run_until(m, &r);
                assert_int_equal(r.status, 0);
        }
        assert_int_equal(submit(m, OP_PIN, t[4], LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -ENOSPC);

        job_destroy(j);
        fixture_free(m);
}

static void test_vram_chain_and_async_reserve(void **state) {
        Manager *m = new_manager();
        Result r;
        Job *j;
        Tensor *t;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        assert_int_equal(tensor_new(j, "t", 1 * MiB, &t), 0);
        fixture_host_data(m, t, 0x77);
        assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
        run_until(m, &r);

        /* pin in VRAM from NVMe: the destination is reserved first (the async grant), then nvme -> host -> vram */
        assert_int_equal(submit(m, OP_PIN, t, LEVEL_VRAM, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(r.reserved, 1);
        assert_int_equal(t->copy[LEVEL_VRAM].pins, 1);
        assert_int_equal(copy_addr(&t->copy[LEVEL_VRAM], 0)[100], 0x77);
        assert_int_equal(m->engine->links[LINK_NVME_TO_HOST].ops, 1);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].ops, 1);

        /* dirty in VRAM: host and NVMe copies become stale and are freed */
        copy_addr(&t->copy[LEVEL_VRAM], 0)[100] = 0x78;
        assert_int_equal(tensor_unpin(t, LEVEL_VRAM, true), 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(t->copy[LEVEL_NVME].state, COPY_ABSENT);

        /* evict to NVMe: vram -> host -> nvme */
        assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(t->copy[LEVEL_VRAM].state, COPY_ABSENT);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(m->engine->links[LINK_VRAM_TO_HOST].ops, 1);
        assert_int_equal(submit(m, OP_PREFETCH, t, LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(read_host(t, 100), 0x78);

        job_destroy(j);
        fixture_free(m);
}

/* ---- the VRAM link: copies of jobs wait in fair order, by weight ------------------------- */

static char vram_order[32];
static unsigned n_vram_done;

static void on_vram_pinned(Op *op, int status, const char *error) {
        assert_int_equal(status, 0);
        if (n_vram_done < sizeof(vram_order) - 1)
                vram_order[n_vram_done++] = *(const char *) op->userdata;
}

static void test_vram_link_fair_order(void **state) {
        static const char name_a = 'A', name_b = 'B';
        Manager *m = new_manager();
        Tensor *ta[6], *tb[12];
        Job *a, *b;
        char name[16];

        memset(vram_order, 0, sizeof(vram_order));
        n_vram_done = 0;
        assert_int_equal(job_new(m->registry, "a", 0, &a), 0);
        assert_int_equal(job_new(m->registry, "b", 0, &b), 0);
        a->weight = 1;
        b->weight = 4;
        /* 64 KiB tensors with data in host memory */
        for (int i = 0; i < 18; i++) {
                Tensor **t = i < 6 ? &ta[i] : &tb[i - 6];

                snprintf(name, sizeof(name), "t%d", i);
                assert_int_equal(tensor_new(i < 6 ? a : b, name, 64 * 1024, t), 0);
                fixture_host_data(m, *t, (uint8_t) i);
        }
        /* all at once: A's six, then B's twelve */
        for (int i = 0; i < 6; i++)
                assert_int_equal(op_submit(m->engine, OP_PIN, ta[i], LEVEL_VRAM, on_vram_pinned, NULL, (void *) &name_a, NULL), 0);
        for (int i = 0; i < 12; i++)
                assert_int_equal(op_submit(m->engine, OP_PIN, tb[i], LEVEL_VRAM, on_vram_pinned, NULL, (void *) &name_b, NULL), 0);
        FIXTURE_RUN_UNTIL(m, n_vram_done >= 18);
        /*
         * A0 goes to the (emulated: one copy at a time) backend at once; the rest
         * wait by virtual start time: A's advance by 64 KiB, B's by 16 KiB
         * (weight 4), ties first come, first served.
         */
        assert_int_equal(m->vram->depth, 1);
        assert_string_equal(vram_order, "ABBBBABBBBABBBBAAA");
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 0);
        assert_true(list_empty(&m->engine->vlink.waiting[VRAM_TO_DEVICE]));
        for (int i = 0; i < 6; i++)
                assert_int_equal(tensor_unpin(ta[i], LEVEL_VRAM, false), 0);
        for (int i = 0; i < 12; i++)
                assert_int_equal(tensor_unpin(tb[i], LEVEL_VRAM, false), 0);
        job_destroy(a);
        job_destroy(b);
        fixture_free(m);
}

/* ---- a queued VRAM copy that cannot start fails its op, and the link's books stay right ------ */

static const VramBackendOps *real_ops;
static unsigned copies_allowed;

static int copy_or_fail(VramBackend *b, VramCopy *c) {
        if (copies_allowed == 0)
                return -EIO;
        copies_allowed--;
        return real_ops->copy(b, c);
}

typedef struct Outcome {
        int done, status;
        char error[128];
} Outcome;

static void on_outcome(Op *op, int status, const char *error) {
        Outcome *o = op->userdata;

        o->done++;
        o->status = status;
        snprintf(o->error, sizeof(o->error), "%s", error ? error : "");
}

static void test_vram_link_start_failure(void **state) {
        Manager *m = new_manager();
        VramBackendOps ops;
        Outcome out[4] = {};
        Tensor *t[4];
        Job *j;
        Result r;
        char name[16];
        int done = 0;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (int i = 0; i < 4; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                assert_int_equal(tensor_new(j, name, 64 * 1024, &t[i]), 0);
                fixture_host_data(m, t[i], (uint8_t) (i + 1));
        }
        /* the first copy starts; the backend refuses the three that waited behind it */
        real_ops = m->vram->ops;
        ops = *real_ops;
        ops.copy = copy_or_fail;
        m->vram->ops = &ops;
        copies_allowed = 1;
        assert_int_equal(trace_start(&m->engine->trace, 16, 1), 0);
        for (int i = 0; i < 4; i++)
                assert_int_equal(op_submit(m->engine, OP_PIN, t[i], LEVEL_VRAM, on_outcome, NULL, &out[i], NULL), 0);
        FIXTURE_RUN_UNTIL(m, out[0].done + out[1].done + out[2].done + out[3].done >= 4);
        done = out[0].done + out[1].done + out[2].done + out[3].done;
        assert_int_equal(done, 4);
        assert_int_equal(out[0].status, 0);
        for (int i = 1; i < 4; i++) {
                assert_int_equal(out[i].status, -EIO);
                assert_non_null(strstr(out[i].error, "cannot start VRAM copy"));
                assert_false(copy_valid(t[i], LEVEL_VRAM));
                assert_true(copy_valid(t[i], LEVEL_HOST));       /* the data is still there */
        }
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 0);
        assert_true(list_empty(&m->engine->vlink.waiting[VRAM_TO_DEVICE]));
        assert_int_equal(m->engine->n_xfers, 0);
        /* the trace has every transfer, the failed ones with their error and no bytes (it missed them) */
        assert_int_equal(m->engine->trace.n, 4);
        for (uint32_t i = 0; i < 4; i++)
                assert_int_equal(m->engine->trace.rec[i].bytes, m->engine->trace.rec[i].error < 0 ? 0 : 64 * 1024);
        assert_int_equal(m->engine->links[LINK_HOST_TO_VRAM].bytes, 64 * 1024);
        trace_reset(&m->engine->trace);
        /* the VRAM the failed copies had reserved is free again: they go through now */
        copies_allowed = 3;
        for (int i = 1; i < 4; i++) {
                assert_int_equal(submit(m, OP_PIN, t[i], LEVEL_VRAM, &r), 0);
                run_until(m, &r);
                assert_int_equal(r.status, 0);
                assert_int_equal(copy_addr(&t[i]->copy[LEVEL_VRAM], 0)[7],
                                 i + 1);
        }
        m->vram->ops = real_ops;
        for (int i = 0; i < 4; i++)
                assert_int_equal(tensor_unpin(t[i], LEVEL_VRAM, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/* A crc32c mismatch on read fails the pin; it counts on the target and on the job whose tensor it was, no other. */
static void test_crc_mismatch_is_an_error(void **state) {
        Manager *m = new_manager();
        Result r;
        Job *j, *k;
        Tensor *t, *u;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        assert_int_equal(job_new(m->registry, "k", 0, &k), 0);
        assert_int_equal(tensor_new(j, "t", 1 * MiB, &t), 0);
        assert_int_equal(tensor_new(k, "u", 1 * MiB, &u), 0);
        fixture_host_data(m, t, 0x33);
        fixture_host_data(m, u, 0x44);
        assert_int_equal(submit(m, OP_EVICT, t, LEVEL_NVME, &r), 0);
        run_until(m, &r);
        assert_int_equal(submit(m, OP_EVICT, u, LEVEL_NVME, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(u->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(submit(m, OP_PIN, u, LEVEL_HOST, &r), 0);     /* a good read counts nowhere */
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(tensor_unpin(u, LEVEL_HOST, false), 0);

        /* corrupt the stored crc: the read must fail, not hand out the bytes */
        t->copy[LEVEL_NVME].extents[0].crc ^= 1;
        assert_int_equal(submit(m, OP_PIN, t, LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, -EIO);
        assert_int_equal(t->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(m->nvme->targets[0].crc_errors, 1);
        assert_int_equal(j->nvme_crc_errors, 1);        /* whose tensors fail their checksums */
        assert_int_equal(k->nvme_crc_errors, 0);

        job_destroy(k);
        job_destroy(j);
        fixture_free(m);
}

/* ---- out of memory while making space is -ENOMEM, not "tier full" ------------------------------ */

static void test_enomem_is_not_enospc(void **state) {
        Manager *m = new_manager();
        Result r;
        Job *j;
        Tensor *t[5];
        char name[8];

        /* host limit 4 MiB: four 1 MiB tensors with data fill it; the fifth needs a victim */
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (int i = 0; i < 5; i++) {
                snprintf(name, sizeof(name), "t%d", i);
                t[i] = fixture_tensor(j, name, 1 * MiB);
                if (i < 4)
                        fixture_host_data(m, t[i], (uint8_t) i);
        }
        assert_int_equal(submit(m, OP_PIN, t[4], LEVEL_HOST, &r), 0);
        calloc_fail_in = 0;     /* the victims' list of make_space() */
        run_until(m, &r);
        calloc_fail_in = -1;
        assert_int_equal(r.status, -ENOMEM);
        assert_null(strstr(last_error, "tier full"));
        assert_non_null(strstr(last_error, "cannot make room in host for job 'j'"));
        /* nothing was lost or left reserved: with memory back, the same pin goes through */
        for (int i = 0; i < 4; i++)
                assert_true(copy_valid(t[i], LEVEL_HOST));
        assert_int_equal(t[4]->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_int_equal(submit(m, OP_PIN, t[4], LEVEL_HOST, &r), 0);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(tensor_unpin(t[4], LEVEL_HOST, false), 0);
        job_destroy(j);
        fixture_free(m);
}

/* ---- stopping while copies run: the VRAM backend stops before the host pool goes ----------- */

static void setup_slow_link(Config *c, void *userdata) {
        c->host_capacity = 16 * MiB;
        c->host_segment_size = 8 * MiB;
        c->host_job_limit = 16 * MiB;
        c->vram_capacity = 16 * MiB;
        c->vram_chunk_size = 8 * MiB;
        c->vram_job_limit = 8 * MiB;
        c->vram_bandwidth = 8 * MiB;    /* a 4 MiB piece every half second */
}

static void test_stop_while_copying(void **state) {
        Manager *m = fixture_new(32 * MiB, setup_slow_link, NULL);
        Result r;
        Job *j;
        Tensor *t;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", 8 * MiB);
        fixture_host_data(m, t, 0x42);
        assert_int_equal(submit(m, OP_PIN, t, LEVEL_VRAM, &r), 0);
        FIXTURE_RUN_UNTIL(m, m->engine->vlink.active[VRAM_TO_DEVICE] != 0);
        assert_int_equal(m->engine->vlink.active[VRAM_TO_DEVICE], 1);
        assert_int_equal(r.done, 0);
        /*
         * Stop now, as after the drain timeout or a second SIGTERM: the mover
         * thread is in the middle of the copy (its first piece done, waiting on
         * the throttle).  The host pool is unmapped only after it stopped, so
         * its second piece never reads freed memory.
         */
        manager_free(m);
        assert_int_equal(r.done, 0);    /* abandoned: no callback after the stop */
}

/*
 * What a rollback waits for (ipc/commit.c): a client's pin or request is
 * refused (-EBUSY), a transfer in flight is waited for (-EAGAIN); tierd's
 * own ops are cancelled first (engine_cancel_internal()), and a frozen
 * job's copies are no victims.
 */
static void test_rollback_waits_and_freezes(void **state) {
        Manager *m = new_manager();
        _cleanup_free_ Tensor **v = NULL;
        unsigned rolled = 9, lost = 9;
        char why[256] = "";
        Tensor *t[4], *t4;
        size_t n = 0;
        Result r, r2;
        Job *j;

        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        for (int i = 0; i < 4; i++) {
                char name[8];

                snprintf(name, sizeof(name), "t%d", i);
                t[i] = fixture_tensor(j, name, 1 * MiB);
                fixture_host_data(m, t[i], (uint8_t) (i + 1));
        }
        job_commit(j, 1);

        /* frozen, the job's copies are no victims: a pin that needs room waits for the thaw */
        j->frozen = 1;
        assert_int_equal(engine_victims(m->engine, j, LEVEL_HOST, NULL, &v, &n), 0);
        assert_int_equal(n, 0);
        free(TAKE_PTR(v));
        t4 = fixture_tensor(j, "t4", 1 * MiB);
        assert_int_equal(submit(m, OP_PIN, t4, LEVEL_HOST, &r), 0);
        engine_run(m->engine);
        assert_int_equal(r.done, 0);
        j->frozen = 0;
        assert_int_equal(engine_victims(m->engine, j, LEVEL_HOST, NULL, &v, &n), 0);
        assert_int_equal(n, 4);
        engine_wake_space_waiters(m->engine);
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_int_equal(tensor_unpin(t4, LEVEL_HOST, false), 0);
        assert_int_equal(tensor_free(t4), 0);

        /* tierd's own op, not started: cancelled, nothing left to wait for */
        assert_int_equal(submit(m, OP_CLEAN, t[0], LEVEL_HOST, &r), 0);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "a request on tensor 't0'"));
        engine_cancel_internal(m->engine, j);
        assert_int_equal(t[0]->op_refs, 0);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(rolled, 0);
        assert_int_equal(lost, 0);

        /* refused for a pin: nothing changes, not even tierd's own op (engine_rollback()) */
        assert_int_equal(submit(m, OP_PIN, t[3], LEVEL_HOST, &r2), 0);
        run_until(m, &r2);
        assert_int_equal(r2.status, 0);
        assert_int_equal(submit(m, OP_CLEAN, t[0], LEVEL_HOST, &r), 0);
        assert_int_equal(engine_rollback(m->engine, j, &rolled, &lost, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "tensor 't3' is pinned (in host)"));
        assert_int_equal(t[0]->op_refs, 1);
        assert_int_equal(tensor_unpin(t[3], LEVEL_HOST, false), 0);
        /* nothing in the way: tierd's op goes, the rollback is done */
        assert_int_equal(engine_rollback(m->engine, j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(t[0]->op_refs, 0);
        assert_int_equal(r.done, 0);    /* cancelled: its owner hears nothing */
        assert_int_equal(rolled, 0);
        /* refused for a client's request on one: likewise */
        assert_int_equal(submit(m, OP_CLEAN, t[0], LEVEL_HOST, &r), 0);
        assert_int_equal(submit(m, OP_PIN, t[3], LEVEL_HOST, &r2), 0);
        assert_int_equal(engine_rollback(m->engine, j, &rolled, &lost, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "a request on tensor 't3'"));
        assert_int_equal(t[0]->op_refs, 1);
        engine_cancel_internal(m->engine, j);
        run_until(m, &r2);
        assert_int_equal(tensor_unpin(t[3], LEVEL_HOST, false), 0);

        /* one whose transfer started: the transfer runs on, the rollback waits for it */
        assert_int_equal(submit(m, OP_CLEAN, t[1], LEVEL_HOST, &r), 0);
        engine_run(m->engine);
        assert_non_null(t[1]->xfer);
        engine_cancel_internal(m->engine, j);
        assert_int_equal(t[1]->op_refs, 0);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), -EAGAIN);
        assert_non_null(strstr(why, "tensor 't1' is in a transfer"));
        FIXTURE_RUN_UNTIL(m, !t[1]->xfer);
        assert_int_equal(r.done, 0);    /* cancelled: its owner hears nothing */
        assert_int_equal(t[1]->copy[LEVEL_NVME].state, COPY_RESIDENT);
        assert_int_equal(t[1]->copy[LEVEL_HOST].state, COPY_RESIDENT);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);

        /* a client's request, then its pin: the caller's to end */
        assert_int_equal(submit(m, OP_PIN, t[2], LEVEL_HOST, &r), 0);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "a request on tensor 't2'"));
        run_until(m, &r);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), -EBUSY);
        assert_non_null(strstr(why, "tensor 't2' is pinned (in host)"));
        write_host(t[2], 0x77);
        assert_int_equal(tensor_unpin(t[2], LEVEL_HOST, true), 0);

        /* written since the commit, whose data lay in host only: nothing to go back to */
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(rolled, 0);
        assert_int_equal(lost, 1);
        assert_true(t[2]->lost);

        job_destroy(j);
        fixture_free(m);
}

/* ---- the memory store's ghosts: a write-only pin's copy across a restart ---------------------- */

/*
 * @name, as the memory store puts it back after tierd died: a host copy a
 * write-only pin reserved (unwritten) for rank @rank, held for writing (a
 * ghost pin), the tensor at that write's version; @on_nvme: it had data
 * (version 1) on NVMe before the pin, else it was never written.
 */
static Tensor *ghost_of(Manager *m, Tensor *t, uint32_t rank) {
        Copy *c = &t->copy[LEVEL_HOST];
        Result r;
        Op *op;

        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_complete, NULL, &r, &op), 0);
        op->discard = true;
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_true(c->unwritten);
        /* memstore_restore(): the copy is the write's version, pinned for its writer */
        t->version++;
        c->version = t->version;
        c->writer_rank = rank;
        t->ghost_rank = rank;
        t->ghost_ranks[LEVEL_HOST] = (RankSet) { .rank = { rank }, .n = 1 };
        t->ghost |= 1u << LEVEL_HOST;
        t->ghost_unwritten |= 1u << LEVEL_HOST;
        tensor_pin_account(t, LEVEL_HOST, +1);
        return t;
}

static Tensor *ghost(Manager *m, Job *j, const char *name, bool on_nvme, uint32_t rank) {
        Tensor *t = fixture_tensor(j, name, 1 * MiB);

        if (on_nvme)
                fixture_on_nvme(m, t);
        return ghost_of(m, t, rank);
}

static bool held_b(const Tensor *t, int tier, void *userdata) {
        (void) userdata;
        return tier == LEVEL_HOST && strcmp(t->name, "b") == 0;
}

/*
 * job_release_ghosts(): of the rank that says Hello, a named copy counts as
 * written; one not named goes back to the version before (NVMe, or zeros),
 * or is lost where nothing holds it; one another client pinned meanwhile
 * stays as written.  Another rank's stays held; a Hello that does not say
 * (an older libtier) keeps them all as written.
 */
static void test_ghost_write_only(void **state) {
        Manager *m = new_manager();
        Tensor *a, *b, *c, *d, *e, *f, *g, *h, *k;
        Job *j, *j2, *j3;

        (void) state;
        /* (four per job: the fixture's host limit is 4 MiB) */
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        a = ghost(m, j, "a", true, 3);
        b = ghost(m, j, "b", true, 0);
        c = ghost(m, j, "c", false, 0);
        d = ghost(m, j, "d", true, 0);
        copy_free(d, LEVEL_NVME);               /* nothing holds its version before */

        job_release_ghosts(j, true, 0, held_b, NULL);
        assert_true(a->ghost && a->copy[LEVEL_HOST].pins == 1);         /* rank 3's: still held */
        assert_int_equal(b->version, 2);                                /* named: written */
        assert_true(copy_valid(b, LEVEL_HOST) && !b->ghost && b->copy[LEVEL_HOST].pins == 0);
        assert_int_equal(b->copy[LEVEL_NVME].state, COPY_ABSENT);       /* the version before, stale, went */
        assert_int_equal(c->version, 0);                                /* not named, never written: zeros */
        assert_int_equal(c->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_false(c->lost);
        assert_true(d->lost);                                           /* nothing to go back to */
        assert_int_equal(d->copy[LEVEL_HOST].state, COPY_ABSENT);

        {
                unsigned rolled, lost;
                char why[256];

                /* a rollback waits for rank 3 to come back, and says so */
                assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), -EBUSY);
                assert_non_null(strstr(why, "tensor 'a' is held in host for the client of rank 3 of before tierd "
                                            "restarted"));
                /*
                 * so does a commit: it took a's version 2 as the one to keep, rank 3's Hello then set a
                 * back to 1, and rank 3's next write made it 2 again, equal to what the commit recorded:
                 * a rollback then kept the bytes written after the commit (found by a review; the
                 * commit was not refused)
                 */
                assert_int_equal(job_commit_refused(j, why, sizeof(why)), -EBUSY);
                assert_non_null(strstr(why, "tensor 'a' is held in host for the client of rank 3 of before tierd "
                                            "restarted"));
        }
        job_release_ghosts(j, true, 3, held_b, NULL);
        assert_int_equal(a->version, 1);                                /* back at its NVMe copy */
        assert_true(copy_valid(a, LEVEL_NVME));
        assert_int_equal(a->copy[LEVEL_HOST].state, COPY_ABSENT);
        assert_false(a->lost || a->ghost || a->ghost_unwritten);
        {
                char why[256];

                assert_int_equal(job_commit_refused(j, why, sizeof(why)), 0);   /* every rank is back */
        }

        assert_int_equal(job_new(m->registry, "j2", 0, &j2), 0);
        e = ghost(m, j2, "e", true, 0);
        job_release_ghosts(j2, false, 0, NULL, NULL);                  /* an older client: written */
        assert_int_equal(e->version, 2);
        assert_true(copy_valid(e, LEVEL_HOST) && !e->ghost);

        assert_int_equal(job_new(m->registry, "j3", 0, &j3), 0);
        f = ghost(m, j3, "f", true, 0);
        f->copy[LEVEL_HOST].pins++;             /* another client's pin, before rank 0 came back */
        g = ghost(m, j3, "g", true, 0);
        copy_free(g, LEVEL_NVME);
        g->ghost_dead_before = true;            /* its bytes were not wanted before the pin */
        g->dead_rank = 1;                       /* (rank 0's plan made it dead: memstore_restore() keeps that) */
        k = ghost(m, j3, "k", true, 0);         /* the same, from a table of before the rank was kept */
        copy_free(k, LEVEL_NVME);
        k->ghost_dead_before = true;
        h = fixture_tensor(j3, "h", 1 * MiB);  /* its copy of before is in VRAM only */
        fixture_on_nvme(m, h);
        fixture_touch(m, h, LEVEL_VRAM, false);
        copy_free(h, LEVEL_HOST);
        copy_free(h, LEVEL_NVME);
        ghost_of(m, h, 0);                      /* (the restore kept the VRAM copy, stale until the Hello) */
        job_release_ghosts(j3, true, 0, held_b, NULL);
        assert_int_equal(f->version, 2);                                /* the other client has those bytes */
        assert_true(copy_valid(f, LEVEL_HOST));
        f->copy[LEVEL_HOST].pins--;
        assert_true(g->dead && !g->lost);                               /* dead again */
        assert_int_equal(g->version, 1);
        assert_true(k->dead && k->lost);        /* dead again, but no plan's own: its reads fail (op.c) */
        {
                Result res;
                Op *op;

                memset(&res, 0, sizeof(res));
                assert_int_equal(op_submit(m->engine, OP_PIN, k, LEVEL_HOST, on_complete, NULL, &res, &op), 0);
                run_until(m, &res);
                assert_int_equal(res.status, -ENODATA);
                assert_non_null(strstr(last_error, "it was dead when tierd stopped"));
        }
        assert_int_equal(h->version, 1);                                /* back at its copy in VRAM */
        assert_true(copy_valid(h, LEVEL_VRAM) && !h->lost);

        /* written since the restart by another client: the newer version stands; written-to by one: its */
        {
                Job *j4;
                Tensor *w, *x;

                assert_int_equal(job_new(m->registry, "j4", 0, &j4), 0);
                w = ghost(m, j4, "w", true, 0);
                x = ghost(m, j4, "x", true, 0);
                w->version++;                   /* (another client's write elsewhere: the ghost copy is stale) */
                x->copy[LEVEL_HOST].pins++;     /* another client pins the ghost copy to write it */
                copy_writers(x, LEVEL_HOST, +1, 1);
                /* nothing goes back; but rank 0 of before may still write through its mapping: held */
                assert_true(x->ghost && !x->ghost_unwritten);
                assert_int_equal(x->copy[LEVEL_HOST].pins, 2);
                /* its room is that writer's to write whole: no read's data until it has (it was valid) */
                assert_true(x->copy[LEVEL_HOST].unwritten);
                job_release_ghosts(j4, true, 0, held_b, NULL);
                assert_int_equal(w->version, 3);
                assert_false(w->lost || w->ghost);
                assert_int_equal(w->copy[LEVEL_HOST].state, COPY_ABSENT);       /* stale, gone */
                assert_false(x->ghost);
                assert_int_equal(x->copy[LEVEL_HOST].pins, 1);
                assert_true(x->copy[LEVEL_HOST].unwritten);     /* still the writer's to write */
                assert_int_equal(x->version, 2);
                assert_int_equal(tensor_unpin(x, LEVEL_HOST, true), 0);
                copy_writers(x, LEVEL_HOST, -1, 1);
                assert_int_equal(x->version, 3);
                assert_true(copy_valid(x, LEVEL_HOST));
                job_destroy(j4);
        }

        /* a rank that never comes back: its ghost is held until the job ends, then goes */
        {
                Job *j5;

                assert_int_equal(job_new(m->registry, "j5", 0, &j5), 0);
                assert_int_equal(ghost(m, j5, "gone", true, 7)->copy[LEVEL_HOST].pins, 1);
                assert_int_equal(m->registry->pinned[LEVEL_HOST], 1 * MiB);
                job_destroy(j5);
        }
        job_destroy(j3);
        job_destroy(j2);
        job_destroy(j);
        /* the ghosts still held (another rank's) go with their jobs, and so do their pinned bytes */
        for (int tier = 0; tier < TIERS; tier++)
                assert_int_equal(m->registry->pinned[tier], 0);
        fixture_free(m);
}

/* @name, written (version 1 in host) and put back held for writing for the ranks @ranks (a ghost). */
/*
 * A write-only pin (TIER_WRITE; a plan's PLAN_WRITE access) of a tensor at the version its job
 * committed makes that version's NVMe image first, from host: where host held no copy (reclaim
 * drops one that VRAM holds too), the pin's own reservation, which skips the old bytes, was taken
 * for that source, and the image held garbage; the rollback after a crash brought the garbage
 * back (tier.torch resume=True, a bfloat16 model: its parameters are written whole in each
 * optimizer phase).  The image's source is filled from VRAM now.
 */
static void test_write_only_pin_images_the_committed_version(void **state) {
        Manager *m = new_manager();
        unsigned rolled = 9, lost = 9;
        char why[256] = "";
        const uint8_t *room;
        Tensor *t, *x;
        Result r;
        Op *op;
        Job *j;

        (void) state;
        assert_int_equal(job_new(m->registry, "j", 0, &j), 0);
        t = fixture_tensor(j, "t", 1 * MiB);
        fixture_host_data(m, t, 0x5a);
        fixture_touch(m, t, LEVEL_VRAM, false);
        assert_true(copy_valid(t, LEVEL_VRAM));
        /* reclaim drops the host copy (not the sole one); other bytes take its room */
        room = copy_addr(&t->copy[LEVEL_HOST], 0);
        copy_free(t, LEVEL_HOST);
        x = fixture_tensor(j, "x", 1 * MiB);
        fixture_host_data(m, x, 0xee);
        assert_ptr_equal(copy_addr(&x->copy[LEVEL_HOST], 0), room);
        job_commit(j, 1);

        /* the write-only pin: the committed version goes to NVMe first, from VRAM through host */
        memset(&r, 0, sizeof(r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, LEVEL_HOST, on_complete, NULL, &r, &op), 0);
        op->discard = true;
        op->write = true;
        run_until(m, &r);
        assert_int_equal(r.status, 0);
        assert_true(copy_valid(t, LEVEL_NVME));
        write_host(t, 0x77);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, true), 0);

        /* the process dies; the next one rolls the job back: the committed bytes, from the image */
        FIXTURE_RUN_UNTIL(m, !t->xfer);
        assert_int_equal(job_rollback(j, &rolled, &lost, why, sizeof(why)), 0);
        assert_int_equal(rolled, 1);
        assert_int_equal(lost, 0);
        assert_int_equal(t->version, 1);
        assert_int_equal(fixture_op(m, OP_PIN, t, LEVEL_HOST), 0);
        assert_int_equal(read_host(t, 0), 0x5a);
        assert_int_equal(read_host(t, t->size - 1), 0x5a);
        assert_int_equal(tensor_unpin(t, LEVEL_HOST, false), 0);
        job_destroy(j);
        fixture_free(m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_pinned_bytes_per_copy),
                cmocka_unit_test(test_zero_then_dirty_then_evict),
                cmocka_unit_test(test_lru_victim_and_drain),
                cmocka_unit_test(test_vram_chain_and_async_reserve),
                cmocka_unit_test(test_vram_link_fair_order),
                cmocka_unit_test(test_vram_link_start_failure),
                cmocka_unit_test(test_crc_mismatch_is_an_error),
                cmocka_unit_test(test_enomem_is_not_enospc),
                cmocka_unit_test(test_stop_while_copying),
                cmocka_unit_test(test_rollback_waits_and_freezes),
                cmocka_unit_test(test_ghost_write_only),
                cmocka_unit_test(test_write_only_pin_images_the_committed_version),
        };
        return fixture_main("registry", tests, sizeof(tests) / sizeof(tests[0]));
}
