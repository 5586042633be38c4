/* SPDX-License-Identifier: MIT */
/* timeline-fixture.h: hand-built timelines for the planner's unit tests (test-timeline*.c): plans, markers, what the scheduler started. */
#pragma once

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
#include "daemon/sched/plan.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "proto/plan.h"
#include "tests/unit/fixture.h"
#include "util/time-util.h"
#define MS (1000000ull)

/* ---- what the scheduler started, in order ---------------------------------------------- */

static char trace[64][48];
static unsigned n_trace;

static inline void record(void *userdata, const char *what, const Tensor *t, int tier, uint64_t deadline) {
        if (n_trace < 64)
                snprintf(trace[n_trace++], sizeof(trace[0]), "%s %s %s", what, t->name, level_to_string(tier));
}

/* ---- fixtures ---------------------------------------------------------------------------- */

typedef struct Setup {
        SchedPolicyKind policy;
        uint64_t host_limit;
} Setup;

static inline void setup(Config *c, void *userdata) {
        const Setup *s = userdata;

        c->host_capacity = 16 * MiB;
        c->host_job_limit = s->host_limit;
        c->nvme_job_limit = 64 * MiB;
        c->sched_policy = s->policy;
}

static inline Manager *new_manager(SchedPolicyKind policy, uint64_t host_limit) {
        Setup s = { policy, host_limit };
        Manager *m = fixture_new(64 * MiB, setup, &s);

        n_trace = 0;
        sched_set_trace(m->sched, record, NULL);
        return m;
}

static inline void run_loop(Manager *m, unsigned rounds) {
        fixture_run(m, rounds);
}

static inline void make_on_nvme(Manager *m, Tensor *t) {
        fixture_on_nvme(m, t);
}

typedef struct Acc {
        unsigned phase;
        Tensor *t;
        int tier;
        unsigned mode;
} Acc;

/* One rank of a job, as far as plans are concerned. */
typedef struct Rank {
        Manager *m;
        Job *job;
} Rank;

static inline Rank *fake_conn(Manager *m, Job *j) {
        Rank *c = calloc(1, sizeof(Rank));

        assert_non_null(c);
        c->m = m;
        c->job = j;
        return c;
}

static inline int submit_plan(Rank *c, const Acc *acc, size_t n, unsigned n_phases, Plan **ret, char *err, size_t esize) {
        PlanSpecAccess a[32];
        PlanSpec spec = { .n_phases = n_phases, .acc = a };

        assert_true(n_phases <= 16 && n <= 32);
        for (unsigned ph = 0; ph < n_phases; ph++)
                for (size_t i = 0; i < n; i++)
                        if (acc[i].phase == ph)
                                a[spec.n_acc++] = (PlanSpecAccess) {
                                        .phase = ph, .tensor = acc[i].t->id, .tier = acc[i].tier, .mode = acc[i].mode,
                                };
        return sched_plan_new(c->m->sched, c->job, -1, &spec, ret, err, esize);
}

/* Every phase takes @ms (as if learned), so predictions are far apart and stable. */
static inline void set_durations(Plan *p, uint64_t ms) {
        for (uint32_t k = 0; k < p->n_phases; k++) {
                p->phases[k].ema_ns = ms * MS;
                p->phases[k].samples = 1;
        }
}

/* What tier_phase_enter() stores for @phase, and its wakeup; nothing runs.  Returns the marker's seq. */
static inline uint64_t marker_write(Plan *p, unsigned phase) {
        uint64_t one = 1, seq = p->page->client.marker_seq + 1;

        p->page->client.phase = phase;
        p->page->client.mark_ns = now_ns();
        __atomic_store_n(&p->page->client.marker, PLAN_READY(seq, phase), __ATOMIC_RELEASE);
        __atomic_store_n(&p->page->client.marker_seq, seq, __ATOMIC_RELEASE);
        assert_int_equal(write(p->marker_fd, &one, sizeof(one)), sizeof(one));
        return seq;
}

static inline void marker(Manager *m, Plan *p, unsigned phase) {
        uint64_t seq = marker_write(p, phase);

        FIXTURE_RUN_UNTIL(m, p->seq == seq);
        assert_int_equal(p->seq, seq);
}

static inline Tensor *tensor(Job *j, const char *name, uint64_t size) {
        return fixture_tensor(j, name, size);
}

static inline void finish(Manager *m, Job *j, Rank *c, Plan *p) {
        sched_plan_free(p);
        /* transfers still running finish first, as tierd's stop does */
        FIXTURE_RUN_UNTIL(m, m->engine->n_xfers == 0);
        job_destroy(j);
        fixture_free(m);
        free(c);
}

static inline void touch(Manager *m, Tensor *t, int tier, bool dirty) {
        fixture_touch(m, t, tier, dirty);
}

/* What a plain pin (no plan's) got. */
typedef struct PinResult {
        int done;
        int status;
        char error[320];
} PinResult;

static inline void on_pin_result(Op *op, int status, const char *error) {
        PinResult *r = op->userdata;

        r->done++;
        r->status = status;
        snprintf(r->error, sizeof(r->error), "%s", error ? error : "");
}

/* A plain read pin of @t in @tier (no plan's): its status, its error in @r; a pin taken is let go. */
static inline int read_pin(Manager *m, Tensor *t, int tier, PinResult *r) {
        memset(r, 0, sizeof(*r));
        assert_int_equal(op_submit(m->engine, OP_PIN, t, tier, on_pin_result, NULL, r, NULL), 0);
        FIXTURE_RUN_UNTIL(m, r->done);
        assert_int_equal(r->done, 1);
        if (r->status == 0)
                assert_int_equal(tensor_unpin(t, tier, false), 0);
        return r->status;
}

