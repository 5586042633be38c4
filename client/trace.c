/* SPDX-License-Identifier: MIT */
/* trace.c: tier_trace_*: start and stop a trace of tierd, and write it as Chrome Trace Event JSON. */

/*
 * Theory of operation
 *
 * tier_trace_start() and tier_trace_stop() are one request each
 * (TraceStart, TraceStop); tierd decides who may and answers -EBUSY while
 * another trace exists.  TraceStop's reply carries the records as tierd
 * holds them (proto/trace.h, TraceRecord) in a sealed memfd: they are
 * checked (size, kinds, links, NUL-terminated names) and copied into the
 * tier_trace, which owns them.
 *
 * tier_trace_write_json() is the one writer of the Chrome Trace Event
 * Format (tierctl trace uses it, the tests parse what it writes):
 *   pid 1 "tierd links": one thread per link and lane; a transfer is a
 *     complete event ("X") from its start to its end, on the first lane of
 *     its link free at its start, so that transfers in flight together
 *     never overlap on one track (Perfetto wants slices nested);
 *   pid 100 + k, one per job ("job NAME"): thread 1 "decisions" (instant
 *     events, "i", args.why), per plan (a rank) one thread of phases (an
 *     "X" from each marker to the next, the last one to the trace's end)
 *     and one of stalls (an "X" per phase made ready after its marker),
 *     and the job's transfers again, in lanes of their own (cat "job-io",
 *     where the links' are cat "transfer"), under its phases;
 *   metadata events ("M": process_name, thread_name, thread_sort_index).
 * Times are microseconds since the trace started.  Events are written
 * sorted by (pid, tid, ts), so each track's timestamps are monotonic.
 * otherData holds the byte totals per link as tierd's counters saw them
 * and as the transfer records add up, and the records dropped.  A reader
 * gone raises no SIGPIPE: it is blocked while writing, and one raised is
 * taken off again (tier_trace_write_json()).
 */

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"
#include "proto/trace.h"
#include "util/json.h"

/* Records a trace may bring back: tierd's TRACE_BUFFER_MAX. */
#define CLIENT_TRACE_RECORDS_MAX (1024u * 1024u)
/* Lanes per link: transfers in flight together on one link beyond this share the last lane. */
#define TRACE_LANES 64u

/* The JSON is written out in pieces of about this size. */
#define JSON_DRAIN_BYTES (64u * 1024u)
/* Lanes of a job's I/O track. */
#define JOB_IO_LANES 16u

#define PID_LINKS 1
#define PID_JOB0 100
/* A job's tracks: decisions, then per plan phases and stalls, then its transfers' lanes. */
#define TID_DECISIONS 1
#define TID_PLAN0 10
#define TID_IO0 1000

struct tier_trace {
        TraceRecord *rec;
        size_t n;
        uint64_t dropped;
        uint64_t start_ns, stop_ns;
        uint32_t buffer;
        uint64_t link_bytes[TIER_LINKS];
        uint64_t traced[TIER_LINKS];
};

_public_ int tier_trace_start(tier_client *c, unsigned seconds, unsigned buffer) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__TraceStart q = TIER__TRACE_START__INIT;
        Packet p = PACKET_NULL;
        int r;

        if (!c)
                return -EINVAL;
        q.seconds = seconds;
        q.buffer = buffer;
        req.op_case = TIER__REQUEST__OP_TRACE_START;
        req.trace_start = &q;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_TRACE, "the trace start");
        if (r < 0)
                return r;
        packet_done(&p);
        return 0;
}

/* Check and copy the @n records of the memfd @fd into @t. */
static int trace_read_fd(tier_client *c, int fd, size_t n, tier_trace *t) {
        struct stat st;
        void *map;

        if (fstat(fd, &st) < 0)
                return client_error(c, negative_errno(), "cannot read the trace tierd sent: %m");
        if (st.st_size < 0 || (uint64_t) st.st_size != (uint64_t) n * sizeof(TraceRecord))
                return client_error(c, -EPROTO, "the trace holds %lld bytes, not %zu records of %zu",
                                    (long long) st.st_size, n, sizeof(TraceRecord));
        map = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED)
                return client_error(c, negative_errno(), "cannot map the trace tierd sent: %m");
        t->rec = malloc((size_t) st.st_size);
        if (!t->rec) {
                munmap(map, (size_t) st.st_size);
                return client_error(c, -ENOMEM, "out of memory taking the trace tierd sent (%zu records)", n);
        }
        memcpy(t->rec, map, (size_t) st.st_size);
        munmap(map, (size_t) st.st_size);
        t->n = n;
        for (size_t i = 0; i < n; i++) {
                TraceRecord *r = &t->rec[i];

                if (r->kind < TRACE_XFER || r->kind > TRACE_DECISION || r->link >= TIER_LINKS ||
                    r->why >= _TRACE_WHY_MAX)
                        return client_error(c, -EPROTO, "trace record %zu is malformed (kind %u)", i, r->kind);
                r->job[TRACE_NAME_MAX - 1] = '\0';
                r->name[TRACE_NAME_MAX - 1] = '\0';
                if (r->kind == TRACE_XFER)
                        t->traced[r->link] += r->bytes;
        }
        return 0;
}

_public_ int tier_trace_stop(tier_client *c, tier_trace **ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__TraceStop q = TIER__TRACE_STOP__INIT;
        const Tier__TraceReply *tr;
        Packet p = PACKET_NULL;
        tier_trace *t = NULL;
        int r;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the trace");
        req.op_case = TIER__REQUEST__OP_TRACE_STOP;
        req.trace_stop = &q;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        r = transport_expect(c, &p, TIER__RESPONSE__RESULT_TRACE, "the trace stop");
        if (r < 0)
                return r;
        tr = p.reply->response->trace;
        t = calloc(1, sizeof(*t));
        if (!t) {
                r = client_error(c, -ENOMEM, "out of memory taking the trace tierd sent");
                goto done;
        }
        t->dropped = tr->dropped;
        t->start_ns = tr->start_ns;
        t->stop_ns = tr->stop_ns;
        t->buffer = tr->buffer;
        for (size_t i = 0; i < tr->n_link_bytes && i < TIER_LINKS; i++)
                t->link_bytes[i] = tr->link_bytes[i];
        if (tr->records > 0) {
                _cleanup_close_ int fd = -1;

                if (tr->records > CLIENT_TRACE_RECORDS_MAX || tr->record_size != sizeof(TraceRecord)) {
                        r = client_error(c, -EPROTO, "tierd sent %" PRIu64 " trace records of %u bytes; this "
                                         "libtier reads at most %u of %zu", tr->records, tr->record_size,
                                         CLIENT_TRACE_RECORDS_MAX, sizeof(TraceRecord));
                        goto done;
                }
                fd = packet_take_fd(&p, tr->fd);
                if (fd < 0) {
                        r = client_error(c, fd, "the trace names fd %d, which the packet lacks", tr->fd);
                        goto done;
                }
                r = trace_read_fd(c, fd, (size_t) tr->records, t);
                if (r < 0)
                        goto done;
        }
        *ret = TAKE_PTR(t);
        r = 0;
done:
        tier_trace_free(t);
        packet_done(&p);
        return r;
}

_public_ size_t tier_trace_records(const tier_trace *t) {
        return t ? t->n : 0;
}

_public_ uint64_t tier_trace_dropped(const tier_trace *t) {
        return t ? t->dropped : 0;
}

_public_ uint64_t tier_trace_link_bytes(const tier_trace *t, int link) {
        return t && link >= 0 && link < TIER_LINKS ? t->link_bytes[link] : 0;
}

_public_ uint64_t tier_trace_traced_bytes(const tier_trace *t, int link) {
        return t && link >= 0 && link < TIER_LINKS ? t->traced[link] : 0;
}

_public_ tier_trace *tier_trace_free(tier_trace *t) {
        if (t) {
                free(t->rec);
                free(t);
        }
        return NULL;
}

/* ---- Chrome Trace Event Format ------------------------------------------------------------ */

/* One event to write: a record, or the phase that starts at a record, placed on a track. */
typedef struct Ev {
        uint32_t pid, tid;
        uint64_t ts, end;       /* ns */
        const TraceRecord *r;
        bool job_io;            /* a transfer's copy on its job's I/O track */
} Ev;

typedef struct JobTrack {
        uint64_t id;
        const char *name;
        uint32_t plans[64];     /* plan numbers seen, by index; more plans share the last tracks */
        unsigned n_plans;
        uint64_t lane_end[JOB_IO_LANES];        /* its I/O track's lanes: busy until */
        unsigned n_lanes;
} JobTrack;

static int ev_cmp(const void *a, const void *b) {
        const Ev *x = a, *y = b;

        if (x->pid != y->pid)
                return x->pid < y->pid ? -1 : 1;
        if (x->tid != y->tid)
                return x->tid < y->tid ? -1 : 1;
        if (x->ts != y->ts)
                return x->ts < y->ts ? -1 : 1;
        return x->r < y->r ? -1 : x->r > y->r;
}

static const char *const why_names[_TRACE_WHY_MAX] = {
        [TRACE_WHY_NONE] = "none",
        [TRACE_WHY_PIN_NOW] = "pin: the current phase needs it now",
        [TRACE_WHY_PIN_NEXT] = "pin: the next phase, held ahead",
        [TRACE_WHY_PREFETCH] = "prefetch: a later phase's access, earliest deadline first",
        [TRACE_WHY_CLEAN] = "write-behind: sole copy that would be evicted for the prefetch window",
        [TRACE_WHY_DROP_CLEAN] = "victim dropped: another copy is valid (clean)",
        [TRACE_WHY_DROP_DEAD] = "victim dropped: its plan overwrites it before reading it (dead)",
        [TRACE_WHY_DRAIN] = "victim written down first: sole (dirty) copy",
        [TRACE_WHY_BLOCKED] = "victim passed over: its last write-down failed",
};

static const char *const why_short[_TRACE_WHY_MAX] = {
        [TRACE_WHY_NONE] = "decision",
        [TRACE_WHY_PIN_NOW] = "pin now",
        [TRACE_WHY_PIN_NEXT] = "pin next",
        [TRACE_WHY_PREFETCH] = "prefetch",
        [TRACE_WHY_CLEAN] = "write-behind",
        [TRACE_WHY_DROP_CLEAN] = "victim: drop",
        [TRACE_WHY_DROP_DEAD] = "victim: dead",
        [TRACE_WHY_DRAIN] = "victim: drain",
        [TRACE_WHY_BLOCKED] = "victim: blocked",
};

/* The first of @lane_end[0 .. @max) free at @ts (the last if none), taken until @end; *@used grows to cover it. */
static unsigned lane_take(uint64_t *lane_end, unsigned max, unsigned *used, uint64_t ts, uint64_t end) {
        unsigned lane = 0;

        while (lane < max - 1 && lane_end[lane] > ts)
                lane++;
        lane_end[lane] = MAX(lane_end[lane], end);
        *used = MAX(*used, lane + 1);
        return lane;
}

static unsigned job_index(JobTrack *jobs, unsigned *n, const TraceRecord *r) {
        for (unsigned i = 0; i < *n; i++)
                if (jobs[i].id == r->job_id)
                        return i;
        jobs[*n] = (JobTrack) { .id = r->job_id, .name = r->job };
        return (*n)++;
}

static unsigned plan_index(JobTrack *j, uint32_t plan) {
        for (unsigned i = 0; i < j->n_plans; i++)
                if (j->plans[i] == plan)
                        return i;
        if (j->n_plans == ELEMENTSOF(j->plans))
                return j->n_plans - 1;
        j->plans[j->n_plans] = plan;
        return j->n_plans++;
}

static void json_us(JsonWriter *w, const char *key, uint64_t ns) {
        json_key(w, key);
        json_double_fixed(w, (double) ns / 1000.0, 3);
}

static void meta(JsonWriter *w, uint32_t pid, uint32_t tid, const char *what, const char *name, int64_t sort) {
        json_object_begin(w);
        json_key(w, "ph");
        json_string(w, "M");
        json_key(w, "ts");
        json_uint(w, 0);
        json_key(w, "pid");
        json_uint(w, pid);
        json_key(w, "tid");
        json_uint(w, tid);
        json_key(w, "name");
        json_string(w, what);
        json_key(w, "args");
        json_object_begin(w);
        if (name) {
                json_key(w, "name");
                json_string(w, name);
        } else {
                json_key(w, "sort_index");
                json_int(w, sort);
        }
        json_object_end(w);
        json_object_end(w);
}

static void write_event(JsonWriter *w, const tier_trace *t, const Ev *e) {
        const TraceRecord *r = e->r;
        char name[96];

        json_object_begin(w);
        json_key(w, "pid");
        json_uint(w, e->pid);
        json_key(w, "tid");
        json_uint(w, e->tid);
        json_us(w, "ts", e->ts - t->start_ns);
        json_key(w, "ph");
        switch (r->kind) {
        case TRACE_XFER:
                json_string(w, "X");
                json_us(w, "dur", e->end - e->ts);
                json_key(w, "name");
                json_string(w, r->name);
                json_key(w, "cat");
                json_string(w, e->job_io ? "job-io" : "transfer");
                json_key(w, "args");
                json_object_begin(w);
                json_key(w, "job");
                json_string(w, r->job);
                json_key(w, "tensor");
                json_string(w, r->name);
                json_key(w, "tensor_id");
                json_uint(w, r->tensor);
                json_key(w, "link");
                json_string(w, tier_link_name(r->link));
                json_key(w, "bytes");
                json_uint(w, r->bytes);
                json_key(w, "size");
                json_uint(w, r->size);
                if (r->t0 && r->t1) {
                        json_us(w, "queued_us", r->t1 - r->t0);
                } else {
                        json_key(w, "queued_before_trace");
                        json_bool(w, true);
                }
                if (r->error) {
                        json_key(w, "error");
                        json_string(w, tier_strerror(r->error));       /* thread-safe; INT_MIN too */
                }
                json_object_end(w);
                break;
        case TRACE_PHASE:
        case TRACE_STALL:
                json_string(w, "X");
                json_us(w, "dur", e->end - e->ts);
                snprintf(name, sizeof(name), "%sphase %" PRIu32, r->kind == TRACE_STALL ? "stall: " : "", r->phase);
                json_key(w, "name");
                json_string(w, name);
                json_key(w, "cat");
                json_string(w, r->kind == TRACE_STALL ? "stall" : "phase");
                json_key(w, "args");
                json_object_begin(w);
                json_key(w, "plan");
                json_uint(w, r->plan);
                json_key(w, "marker");
                json_uint(w, r->seq);
                json_key(w, "phase");
                json_uint(w, r->phase);
                json_object_end(w);
                break;
        default:
                json_string(w, "i");
                json_key(w, "s");
                json_string(w, "t");
                snprintf(name, sizeof(name), "%s %s", why_short[r->why], r->name);
                json_key(w, "name");
                json_string(w, name);
                json_key(w, "cat");
                json_string(w, "decision");
                json_key(w, "args");
                json_object_begin(w);
                json_key(w, "why");
                json_string(w, why_names[r->why]);
                json_key(w, "tensor");
                json_string(w, r->name);
                json_key(w, "tensor_id");
                json_uint(w, r->tensor);
                json_key(w, "tier");
                json_string(w, tier_level_name(r->tier) ? tier_level_name(r->tier) : "?");
                json_key(w, "bytes");
                json_uint(w, r->size);
                if (r->why >= TRACE_WHY_DROP_CLEAN) {
                        json_key(w, "reclaim");
                        json_bool(w, r->flags & TRACE_F_RECLAIM);
                        json_key(w, "next_use_in_ms");
                } else
                        json_key(w, "deadline_in_ms");
                if (r->deadline)
                        json_double_fixed(w, ((double) r->deadline - (double) r->ts) / 1e6, 3);
                else
                        json_null(w);
                json_object_end(w);
                break;
        }
        json_object_end(w);
}

static int write_all(int fd, const char *buf, size_t len) {
        while (len > 0) {
                ssize_t n = write(fd, buf, len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return negative_errno();
                buf += n;
                len -= (size_t) n;
        }
        return 0;
}

/*
 * Write what @w holds so far to @fd once it is @min bytes or more, and empty
 * it: the writer only appends, its state (nesting, commas) is kept apart from
 * the text, so a large trace never sits in memory as one string.
 */
static int json_drain(JsonWriter *w, int fd, size_t min) {
        int r;

        if (w->error < 0)
                return w->error;
        if (!w->buf || w->len < min)
                return 0;
        r = write_all(fd, w->buf, w->len);
        w->len = 0;
        w->buf[0] = '\0';
        return r;
}

static int trace_write_json(const tier_trace *t, int fd) {
        _cleanup_(json_writer_deinit) JsonWriter w = JSON_WRITER_NULL;
        _cleanup_free_ Ev *ev = NULL;
        _cleanup_free_ JobTrack *jobs = NULL;
        _cleanup_free_ char *text = NULL;
        uint64_t lane_end[TIER_LINKS][TRACE_LANES] = {};
        unsigned lanes_used[TIER_LINKS] = {}, n_jobs = 0;
        uint64_t end = t ? (t->stop_ns ? t->stop_ns : t->start_ns) : 0;
        size_t n = 0, n_x, len;
        int r;

        if (!t || fd < 0)
                return -EINVAL;
        ev = calloc(2 * t->n + 1, sizeof(Ev));
        jobs = calloc(t->n + 1, sizeof(JobTrack));
        if (!ev || !jobs)
                return -ENOMEM;
        for (size_t i = 0; i < t->n; i++)
                if (t->rec[i].ts > end)
                        end = t->rec[i].ts;

        /* transfers, in order of their start, each on the first lane of its link free by then */
        for (size_t i = 0; i < t->n; i++) {
                const TraceRecord *x = &t->rec[i];

                if (x->kind != TRACE_XFER)
                        continue;
                ev[n] = (Ev) { .pid = PID_LINKS, .r = x, .end = x->ts };
                ev[n].ts = x->t1 ? x->t1 : x->t0 ? x->t0 : t->start_ns;
                if (ev[n].ts < t->start_ns)
                        ev[n].ts = t->start_ns;
                if (ev[n].ts > ev[n].end)
                        ev[n].ts = ev[n].end;
                n++;
        }
        qsort(ev, n, sizeof(Ev), ev_cmp);
        n_x = n;
        for (size_t i = 0; i < n_x; i++) {
                unsigned link = ev[i].r->link;
                unsigned lane = lane_take(lane_end[link], TRACE_LANES, &lanes_used[link], ev[i].ts, ev[i].end);
                unsigned k = job_index(jobs, &n_jobs, ev[i].r);

                ev[i].tid = 1 + link * TRACE_LANES + lane;
                /* and a copy on its job's I/O track, beside the job's phases */
                lane = lane_take(jobs[k].lane_end, JOB_IO_LANES, &jobs[k].n_lanes, ev[i].ts, ev[i].end);
                ev[n++] = (Ev) { .pid = PID_JOB0 + k, .tid = TID_IO0 + lane, .ts = ev[i].ts, .end = ev[i].end,
                                 .r = ev[i].r, .job_io = true };
        }

        /* phases (to the plan's next marker), stalls and decisions on their job's tracks */
        for (size_t i = 0; i < t->n; i++) {
                const TraceRecord *x = &t->rec[i];
                unsigned k, p;

                if (x->kind == TRACE_XFER)
                        continue;
                k = job_index(jobs, &n_jobs, x);
                ev[n] = (Ev) { .pid = PID_JOB0 + k, .r = x, .ts = x->ts, .end = x->ts };
                if (x->kind == TRACE_DECISION) {
                        ev[n].tid = TID_DECISIONS;
                } else {
                        p = plan_index(&jobs[k], x->plan);
                        ev[n].tid = TID_PLAN0 + 2 * p + (x->kind == TRACE_STALL);
                        if (x->kind == TRACE_STALL)
                                ev[n].ts = MAX(x->t0, t->start_ns);
                        if (ev[n].ts > ev[n].end)
                                ev[n].ts = ev[n].end;
                        if (x->kind == TRACE_PHASE)
                                ev[n].end = end;        /* or the plan's next marker: below */
                }
                n++;
        }
        qsort(ev, n, sizeof(Ev), ev_cmp);
        /* a phase lasts until the next marker on its track (its plan's) */
        for (size_t i = 0; i + 1 < n; i++)
                if (ev[i].r->kind == TRACE_PHASE && ev[i + 1].pid == ev[i].pid && ev[i + 1].tid == ev[i].tid)
                        ev[i].end = ev[i + 1].ts;

        json_object_begin(&w);
        json_key(&w, "displayTimeUnit");
        json_string(&w, "ms");
        json_key(&w, "traceEvents");
        json_array_begin(&w);
        meta(&w, PID_LINKS, 0, "process_name", "tierd links", 0);
        meta(&w, PID_LINKS, 0, "process_sort_index", NULL, 0);
        for (int l = 0; l < TIER_LINKS; l++)
                for (unsigned lane = 0; lane < lanes_used[l]; lane++) {
                        char name[64];

                        snprintf(name, sizeof(name), "%s #%u", tier_link_name(l), lane);
                        meta(&w, PID_LINKS, 1 + (unsigned) l * TRACE_LANES + lane, "thread_name", name, 0);
                        meta(&w, PID_LINKS, 1 + (unsigned) l * TRACE_LANES + lane, "thread_sort_index", NULL,
                             (int64_t) (l * TRACE_LANES + lane));
                }
        for (unsigned k = 0; k < n_jobs; k++) {
                char name[96];

                snprintf(name, sizeof(name), "job %s (id %" PRIu64 ")", jobs[k].name, jobs[k].id);
                meta(&w, PID_JOB0 + k, 0, "process_name", name, 0);
                meta(&w, PID_JOB0 + k, 0, "process_sort_index", NULL, 1 + k);
                meta(&w, PID_JOB0 + k, TID_DECISIONS, "thread_name", "decisions", 0);
                meta(&w, PID_JOB0 + k, TID_DECISIONS, "thread_sort_index", NULL, TID_DECISIONS);
                for (unsigned p = 0; p < jobs[k].n_plans; p++) {
                        snprintf(name, sizeof(name), "plan %" PRIu32 " phases", jobs[k].plans[p]);
                        meta(&w, PID_JOB0 + k, TID_PLAN0 + 2 * p, "thread_name", name, 0);
                        meta(&w, PID_JOB0 + k, TID_PLAN0 + 2 * p, "thread_sort_index", NULL, TID_PLAN0 + 2 * p);
                        snprintf(name, sizeof(name), "plan %" PRIu32 " stalls", jobs[k].plans[p]);
                        meta(&w, PID_JOB0 + k, TID_PLAN0 + 2 * p + 1, "thread_name", name, 0);
                        meta(&w, PID_JOB0 + k, TID_PLAN0 + 2 * p + 1, "thread_sort_index", NULL,
                             TID_PLAN0 + 2 * p + 1);
                }
                for (unsigned l = 0; l < jobs[k].n_lanes; l++) {
                        snprintf(name, sizeof(name), "transfers #%u", l);
                        meta(&w, PID_JOB0 + k, TID_IO0 + l, "thread_name", name, 0);
                        meta(&w, PID_JOB0 + k, TID_IO0 + l, "thread_sort_index", NULL, TID_IO0 + l);
                }
        }
        for (size_t i = 0; i < n; i++) {
                write_event(&w, t, &ev[i]);
                r = json_drain(&w, fd, JSON_DRAIN_BYTES);
                if (r < 0)
                        return r;
        }
        json_array_end(&w);

        json_key(&w, "otherData");
        json_object_begin(&w);
        json_key(&w, "producer");
        json_string(&w, "tierd (tierctl trace)");
        json_key(&w, "start_ns");
        json_uint(&w, t->start_ns);
        json_key(&w, "stop_ns");
        json_uint(&w, t->stop_ns);
        json_key(&w, "buffer_records");
        json_uint(&w, t->buffer);
        json_key(&w, "records");
        json_uint(&w, t->n);
        json_key(&w, "dropped_records");
        json_uint(&w, t->dropped);
        json_key(&w, "link_bytes_counted");
        json_object_begin(&w);
        for (int l = 0; l < TIER_LINKS; l++) {
                json_key(&w, tier_link_name(l));
                json_uint(&w, t->link_bytes[l]);
        }
        json_object_end(&w);
        json_key(&w, "link_bytes_traced");
        json_object_begin(&w);
        for (int l = 0; l < TIER_LINKS; l++) {
                json_key(&w, tier_link_name(l));
                json_uint(&w, t->traced[l]);
        }
        json_object_end(&w);
        json_object_end(&w);
        json_object_end(&w);

        r = json_writer_finish(&w, &text, &len);
        if (r < 0)
                return r;
        return write_all(fd, text, len);
}

_public_ int tier_trace_write_json(const tier_trace *t, int fd) {
        sigset_t pipe_set, old_mask, pending;
        bool was_pending;
        int r;

        if (!t || fd < 0)
                return -EINVAL;
        /*
         * libtier never raises SIGPIPE (libtier(3)): a reader gone is -EPIPE.
         * SIGPIPE is blocked in this thread while writing; one the writes raise
         * is taken off again, unless one was pending already (the caller's).
         */
        (void) sigemptyset(&pipe_set);
        (void) sigaddset(&pipe_set, SIGPIPE);
        r = pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
        if (r != 0)
                return -r;
        was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;

        r = trace_write_json(t, fd);

        if (r == -EPIPE && !was_pending) {
                static const struct timespec zero = {};

                while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
                        ;
        }
        (void) pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
        return r;
}
