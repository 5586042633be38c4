/* SPDX-License-Identifier: MIT */
/* fuzz-plan.c: fuzz target: plan submission (plan_new's validation and indexes) and a client scribbling on the plan page. */

/*
 * Theory of operation: each input makes a fresh daemon core (core.c), a
 * job with 1..8 tensors of fuzzed sizes, and a SubmitPlan, then starts it
 * with rpc_plan_spec() and sched_plan_new() as rpc.c does for a rank.  The plan is either
 * built from the input (a structured decoding, so that the fuzzer reaches
 * the checks behind well-formed plans: tensors by index, or any id;
 * tiers and modes raw) or, when the first byte is odd, unpacked from the
 * input's protobuf bytes as tierd would receive it.  A plan that is
 * accepted is then driven as a client could drive it, with commands until
 * the end of the input:
 *
 *   0  a marker: u32 phase and u64 marker_seq (bit 3 of the command: the
 *      next seq instead) and u64 mark_ns into the client area (bit 4: the
 *      packed word too, seq << 16 | phase, as libtier writes it; bit 5: a
 *      fuzzed packed word), then 1 into the marker eventfd, and one pass
 *      of the loop
 *   1  a scribble: u16 offset, u8 length, bytes, anywhere in the page
 *      (the daemon area and the slots too: tierd must not trust any of it)
 *   2  let transfers finish
 *   3  plan_stats() and the next-use queries of every tensor of the plan, and
 *      whether a read of it is still to pin in the current phase, checked
 *      against a walk of the phase (the lookup must answer the same)
 *
 * The plan is freed (sched_plan_free()), the core too, and no fd may leak.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/base/level.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/rpc.h"
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "proto/plan.h"
#include "tests/fuzz/core.h"
#include "tests/fuzz/fuzz.h"
#include "tier.pb-c.h"

#define MAX_TENSORS 8
#define MAX_PHASES 64
#define MAX_ACC 16

typedef struct Built {
        Tier__SubmitPlan sp;
        Tier__PlanPhase phases[MAX_PHASES], *phasep[MAX_PHASES];
        Tier__PlanAccess acc[MAX_PHASES][MAX_ACC], *accp[MAX_PHASES][MAX_ACC];
} Built;

static Built B;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        return 0;
}

static void build(FuzzIn *in, Tensor **t, unsigned n_t) {
        unsigned n_phases = fin_u8(in) % (MAX_PHASES + 1);

        tier__submit_plan__init(&B.sp);
        for (unsigned k = 0; k < n_phases; k++) {
                unsigned n_acc = fin_u8(in) % (MAX_ACC + 1);

                tier__plan_phase__init(&B.phases[k]);
                for (unsigned a = 0; a < n_acc; a++) {
                        Tier__PlanAccess *x = &B.acc[k][a];
                        uint8_t idx = fin_u8(in);

                        tier__plan_access__init(x);
                        x->tensor = idx == 0xff ? fin_u64(in) : t[idx % n_t]->id;
                        x->tier = (Tier__Tier) (int8_t) fin_u8(in);
                        x->mode = fin_u8(in);
                        B.accp[k][a] = x;
                }
                B.phases[k].accesses = B.accp[k];
                B.phases[k].n_accesses = n_acc;
                B.phasep[k] = &B.phases[k];
        }
        B.sp.phases = B.phasep;
        B.sp.n_phases = n_phases;
}

static void marker(Manager *m, Plan *p, FuzzIn *in, uint8_t cmd) {
        uint32_t phase = fin_u32(in);
        uint64_t seq = (cmd & 8) ? p->page->client.marker_seq + 1 : fin_u64(in);
        uint64_t mark = fin_u64(in), one = 1;

        p->page->client.phase = phase;
        p->page->client.mark_ns = mark;
        if (cmd & 16)
                __atomic_store_n(&p->page->client.marker, PLAN_READY(seq, phase), __ATOMIC_RELEASE);
        else if (cmd & 32)
                __atomic_store_n(&p->page->client.marker, fin_u64(in), __ATOMIC_RELEASE);
        __atomic_store_n(&p->page->client.marker_seq, seq, __ATOMIC_RELEASE);
        FUZZ_CHECK(write(p->marker_fd, &one, sizeof(one)) == sizeof(one));
        core_run(m, 0);
}

static void scribble(Plan *p, FuzzIn *in) {
        uint64_t off = fin_u16(in);
        const uint8_t *b;
        size_t len = fin_bytes(in, fin_u8(in), &b);

        if (p->page_size == 0)
                return;
        off %= p->page_size;
        if (len > p->page_size - off)
                len = p->page_size - off;
        memcpy((uint8_t *) p->page + off, b, len);
}

static void query(Plan *p, Tensor **t, unsigned n_t) {
        PlanStats st;

        plan_stats(p, &st);
        /* the queries are for tensors of this plan (t->plan, t->plan_slot), as the scheduler asks them */
        for (unsigned i = 0; i < n_t; i++)
                for (int tier = 0; tier < 2 && t[i]->plan == p; tier++) {
                        (void) plan_next_use(p, t[i], tier);
                        (void) plan_next_access_mode(p, t[i], plan_cur(p), tier);
                }
        /* a read still to pin in the current phase (reclaim's "dead" test): the lookup answers as the walk */
        for (unsigned i = 0; i < n_t; i++)
                for (int c = 0; c < _USE_MAX; c++)
                        FUZZ_CHECK(plan_cur_read_pending(p, t[i], c) == plan_cur_read_pending_walk(p, t[i], c));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        FuzzIn in = { data, size };
        uint8_t first = fin_u8(&in);
        int fds_before = fuzz_count_fds();
        Tier__SubmitPlan *unpacked = NULL;
        const Tier__SubmitPlan *sp;
        PlanSpec spec = {};
        Tensor *t[MAX_TENSORS];
        unsigned n_t = 1 + (first >> 1) % MAX_TENSORS;
        char error[512] = "";
        Plan *p = NULL;
        Manager *m;
        Job *j;
        int efd;

        m = core_new((first >> 4) % _SCHED_POLICY_MAX);
        FUZZ_CHECK(job_new(m->registry, "job", 0, &j) == 0);
        for (unsigned i = 0; i < n_t; i++) {
                char name[16];

                snprintf(name, sizeof(name), "t%u", i);
                FUZZ_CHECK(tensor_new(j, name, 1 + fin_u32(&in) % (1u << 20), &t[i]) == 0);
        }
        if (first & 1) {
                const uint8_t *b;
                size_t len = fin_bytes(&in, fin_u16(&in), &b);

                unpacked = tier__submit_plan__unpack(NULL, len, b);
                sp = unpacked;
        } else {
                build(&in, t, n_t);
                sp = &B.sp;
        }
        efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        FUZZ_CHECK(efd >= 0);

        /* translated as rpc.c does */
        if (sp)
                FUZZ_CHECK(rpc_plan_spec(sp, &spec) == 0);
        if (sp && sched_plan_new(m->sched, j, efd, &spec, &p, error, sizeof(error)) >= 0) {
                if (getenv("TIER_FUZZ_LOG"))
                        fprintf(stderr, "plan of %u phases over %u tensors accepted\n", p->n_phases, p->n_slots);
                FUZZ_CHECK(p && p->page && p->n_phases == sp->n_phases);
                while (in.n > 0) {
                        uint8_t cmd = fin_u8(&in);

                        switch (cmd % 4) {
                        case 0:
                                marker(m, p, &in, cmd);
                                break;
                        case 1:
                                scribble(p, &in);
                                break;
                        case 2:
                                core_settle(m);
                                break;
                        case 3:
                                query(p, t, n_t);
                                break;
                        }
                }
                core_settle(m);
                if (getenv("TIER_FUZZ_LOG"))
                        fprintf(stderr, "after the input: %" PRIu64 " iterations, error %" PRId64 "\n", p->iterations,
                                p->page->daemon.error);
                sched_plan_free(p);
        } else if (sp) {
                FUZZ_CHECK(error[0] != '\0');   /* a refusal says why */
                if (getenv("TIER_FUZZ_LOG"))
                        fprintf(stderr, "refused: %s\n", error);
        }

        free(spec.acc);
        if (unpacked)
                tier__submit_plan__free_unpacked(unpacked, NULL);
        core_free(m);
        close(efd);
        if (fuzz_count_fds() != fds_before) {
                fprintf(stderr, "fds leaked: %d open before the input, %d after\n", fds_before, fuzz_count_fds());
                abort();
        }
        return 0;
}

/* ---- seeds ----------------------------------------------------------------------------------------- */

static void put_acc(FuzzOut *o, uint8_t idx, uint8_t tier, uint8_t mode) {
        fout_u8(o, idx);
        fout_u8(o, tier);
        fout_u8(o, mode);
}

static void put_marker(FuzzOut *o, uint32_t phase) {
        fout_u8(o, 0 | 8);              /* the next seq */
        fout_u32(o, phase);
        fout_u64(o, 0);
        fout_u8(o, 2);                  /* settle */
        fout_u8(o, 3);                  /* query */
}

int fuzz_write_seeds(const char *dir) {
        FuzzOut *o = calloc(1, sizeof(FuzzOut));
        int r = 0;

        if (!o)
                return -ENOMEM;

        /* policy timeline, 4 tensors, 3 phases (forward, backward, step), markers around twice */
        for (int policy = 0; policy < 3; policy++) {
                char name[32];

                o->n = 0;
                fout_u8(o, (uint8_t) (policy << 4 | 3 << 1));
                for (int i = 0; i < 4; i++)
                        fout_u32(o, 100000 * (uint32_t) (i + 1));
                fout_u8(o, 3);
                fout_u8(o, 2);
                put_acc(o, 0, 0, PLAN_READ);
                put_acc(o, 1, 1, PLAN_READ);
                fout_u8(o, 3);
                put_acc(o, 0, 0, PLAN_READ);
                put_acc(o, 2, 0, PLAN_WRITE);
                put_acc(o, 1, 1, PLAN_READ | PLAN_WRITE);
                fout_u8(o, 2);
                put_acc(o, 3, 1, PLAN_READ | PLAN_WRITE);
                put_acc(o, 0, 1, PLAN_WRITE);
                for (int it = 0; it < 2; it++)
                        for (uint32_t ph = 0; ph < 3; ph++)
                                put_marker(o, ph);
                snprintf(name, sizeof(name), "seed-steps-%d", policy);
                r = r ?: fuzz_write_file(dir, name, o->buf, o->n);
        }

        /*
         * one tensor in every phase and in both tiers of some (plan_cur_read_pending()'s lookup,
         * Plan.acc_where), with duplicate accesses that plan_new() merges; 3 tensors, 5 phases, twice round
         */
        for (int policy = 0; policy < 2; policy++) {
                char name[32];

                o->n = 0;
                fout_u8(o, (uint8_t) (policy << 4 | 2 << 1));
                for (int i = 0; i < 3; i++)
                        fout_u32(o, 60000 * (uint32_t) (i + 1));
                fout_u8(o, 5);
                fout_u8(o, 3);
                put_acc(o, 0, 0, PLAN_READ);
                put_acc(o, 0, 1, PLAN_READ);
                put_acc(o, 1, 1, PLAN_WRITE);
                fout_u8(o, 4);
                put_acc(o, 1, 1, PLAN_READ);
                put_acc(o, 0, 1, PLAN_WRITE);
                put_acc(o, 0, 1, PLAN_READ);
                put_acc(o, 2, 0, PLAN_READ);
                fout_u8(o, 2);
                put_acc(o, 0, 0, PLAN_WRITE);
                put_acc(o, 2, 1, PLAN_READ | PLAN_WRITE);
                fout_u8(o, 5);
                put_acc(o, 2, 0, PLAN_READ);
                put_acc(o, 0, 1, PLAN_READ);
                put_acc(o, 0, 0, PLAN_READ);
                put_acc(o, 1, 0, PLAN_READ);
                put_acc(o, 0, 0, PLAN_WRITE);
                fout_u8(o, 1);
                put_acc(o, 0, 0, PLAN_READ | PLAN_WRITE);
                for (int it = 0; it < 2; it++)
                        for (uint32_t ph = 0; ph < 5; ph++)
                                put_marker(o, ph);
                snprintf(name, sizeof(name), "seed-shared-%d", policy);
                r = r ?: fuzz_write_file(dir, name, o->buf, o->n);
        }

        /* a client that scribbles: a marker of a phase the plan lacks, the daemon area overwritten, seq backwards */
        o->n = 0;
        fout_u8(o, 1 << 1);
        fout_u32(o, 5000);
        fout_u32(o, 70000);
        fout_u8(o, 2);
        fout_u8(o, 1);
        put_acc(o, 0, 1, PLAN_READ);
        fout_u8(o, 1);
        put_acc(o, 1, 0, PLAN_WRITE);
        put_marker(o, 0);
        put_marker(o, 9);
        fout_u8(o, 1);
        fout_u16(o, 64);
        fout_u8(o, 16);
        for (int i = 0; i < 16; i++)
                fout_u8(o, 0xff);
        fout_u8(o, 0);
        fout_u32(o, 1);
        fout_u64(o, 0);                 /* seq 0: older than what tierd saw */
        fout_u64(o, UINT64_MAX);
        put_marker(o, 1);
        r = r ?: fuzz_write_file(dir, "seed-scribble", o->buf, o->n);

        /* plans tierd must refuse: no phases, an unknown tensor, tier nvme, mode 0, too big for the quota */
        o->n = 0;
        fout_u8(o, 0);
        fout_u32(o, 4096);
        fout_u8(o, 0);
        r = r ?: fuzz_write_file(dir, "seed-empty", o->buf, o->n);
        o->n = 0;
        fout_u8(o, 1 << 1);
        fout_u32(o, 1u << 20);
        fout_u32(o, 1u << 20);
        fout_u8(o, 1);
        fout_u8(o, 4);
        put_acc(o, 0, 0, PLAN_READ);
        put_acc(o, 1, 0, PLAN_READ);
        fout_u8(o, 0xff);
        fout_u64(o, 12345);
        fout_u8(o, 1);
        fout_u8(o, 1);
        put_acc(o, 0, 2, 0);
        r = r ?: fuzz_write_file(dir, "seed-refused", o->buf, o->n);

        /* the same kind of plan as protobuf bytes */
        {
                Tier__SubmitPlan sp = TIER__SUBMIT_PLAN__INIT;
                Tier__PlanPhase ph = TIER__PLAN_PHASE__INIT, *php = &ph;
                Tier__PlanAccess a = TIER__PLAN_ACCESS__INIT, *ap = &a;
                uint8_t buf[256];
                size_t n;

                a.tensor = 1ull << 32;  /* the first tensor's id */
                a.tier = TIER__TIER__TIER_HOST;
                a.mode = PLAN_READ;
                ph.accesses = &ap;
                ph.n_accesses = 1;
                sp.phases = &php;
                sp.n_phases = 1;
                n = tier__submit_plan__pack(&sp, buf);
                o->n = 0;
                fout_u8(o, 1);
                fout_u32(o, 65536);
                fout_u16(o, (uint16_t) n);
                fout_bytes(o, buf, n);
                put_marker(o, 0);
                put_marker(o, 0);
                r = r ?: fuzz_write_file(dir, "seed-packed", o->buf, o->n);
        }

        free(o);
        return r;
}
