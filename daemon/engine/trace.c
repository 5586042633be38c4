/* SPDX-License-Identifier: MIT */
/* trace.c: the trace recorder: a fixed buffer of binary records, filled only while a trace runs. */

/*
 * Theory of operation: `tierctl trace` asks tierd to record what it does for
 * a while (ipc/trace-rpc.c starts and reads the trace).  The records
 * (proto/trace.h, 160 bytes, names copied in) go into one array allocated
 * when the trace starts, of a size fixed then (TRACE_BUFFER_DEFAULT, at
 * most TRACE_BUFFER_MAX): memory is bounded whatever happens.  When it is
 * full, new records are dropped and counted (Trace.dropped): what is kept
 * is everything from the start up to a point, never a trace with holes.
 *
 * The hooks sit where the facts are: transfers where engine/xfer.c counts
 * a link's bytes (same place, same number, so the trace adds up to the
 * status counters), markers and stalls in sched/sched.c, the scheduler's
 * transfers in sched/sched.c and victims in engine/op.c.  Each is
 * `if (trace_on(tr))`: nothing else runs when no trace is recording, and
 * the functions below run only when one is.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>

#include "daemon/engine/trace.h"
#include "daemon/state/registry.h"

int trace_start(Trace *tr, uint32_t cap, uint64_t now) {
        if (tr->rec)
                return -EBUSY;
        if (cap == 0 || cap > TRACE_BUFFER_MAX)
                return -EINVAL;
        tr->rec = malloc((size_t) cap * sizeof(TraceRecord));
        if (!tr->rec)
                return -ENOMEM;
        tr->cap = cap;
        tr->n = 0;
        tr->dropped = 0;
        tr->start_ns = now;
        tr->stop_ns = 0;
        tr->on = true;
        return 0;
}

void trace_stop(Trace *tr, uint64_t now) {
        if (!tr->on)
                return;
        tr->on = false;
        tr->stop_ns = now;
}

void trace_reset(Trace *tr) {
        sd_event_source_disable_unref(tr->timer);
        free(tr->rec);
        *tr = (Trace) { .next_plan = tr->next_plan };
}

TraceRecord *trace_next(Trace *tr) {
        TraceRecord *r;

        if (tr->n >= tr->cap) {
                tr->dropped++;
                return NULL;
        }
        r = &tr->rec[tr->n++];
        memset(r, 0, sizeof(*r));
        return r;
}

static void copy_name(char dst[TRACE_NAME_MAX], const char *src) {
        size_t n = src ? strnlen(src, TRACE_NAME_MAX - 1) : 0;

        memcpy(dst, src ? src : "", n);
        dst[n] = '\0';
}

static void set_job(TraceRecord *r, const Job *j) {
        r->job_id = j->id;
        copy_name(r->job, j->name);
}

static void set_tensor(TraceRecord *r, const Tensor *t) {
        set_job(r, t->job);
        r->tensor = t->id;
        r->size = t->alloc_size;
        copy_name(r->name, t->name);
}

void trace_xfer(Trace *tr, const Tensor *t, LinkDir link, uint64_t queued, uint64_t started, uint64_t end,
                uint64_t bytes, int error) {
        TraceRecord *r = trace_next(tr);

        if (!r)
                return;
        r->kind = TRACE_XFER;
        set_tensor(r, t);
        r->link = (uint8_t) link;
        r->t0 = queued;
        r->t1 = started;
        r->ts = end;
        r->bytes = bytes;
        r->error = error;
}

void trace_phase(Trace *tr, const Job *j, uint32_t plan, uint64_t seq, uint32_t phase, uint64_t mark) {
        TraceRecord *r = trace_next(tr);

        if (!r)
                return;
        r->kind = TRACE_PHASE;
        set_job(r, j);
        r->plan = plan;
        r->seq = seq;
        r->phase = phase;
        r->ts = mark;
}

void trace_stall(Trace *tr, const Job *j, uint32_t plan, uint64_t seq, uint32_t phase, uint64_t from, uint64_t to) {
        TraceRecord *r = trace_next(tr);

        if (!r)
                return;
        r->kind = TRACE_STALL;
        set_job(r, j);
        r->plan = plan;
        r->seq = seq;
        r->phase = phase;
        r->t0 = from;
        r->ts = to;
}

void trace_decision(Trace *tr, const Tensor *t, int tier, int why, uint64_t deadline, uint32_t flags, uint64_t now) {
        TraceRecord *r = trace_next(tr);

        if (!r)
                return;
        r->kind = TRACE_DECISION;
        set_tensor(r, t);
        r->tier = (uint8_t) tier;
        r->why = (uint8_t) why;
        r->deadline = deadline;
        r->flags = flags;
        r->ts = now;
}
