/* SPDX-License-Identifier: MIT */
/* trace.h: tierd's trace recorder: transfers, phases, stalls and decisions into a bounded buffer. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/base/level.h"
#include "proto/trace.h"

typedef struct Job Job;
typedef struct Tensor Tensor;
typedef struct sd_event_source sd_event_source;

/* Records a trace holds unless TraceStart asks otherwise (160 bytes each: 10 MiB). */
#define TRACE_BUFFER_DEFAULT (64u * 1024u)
/* The most a trace may hold, whoever asks (160 MiB). */
#define TRACE_BUFFER_MAX (1024u * 1024u)
/* The longest a trace may record: it stops on its own after that. */
#define TRACE_SECONDS_MAX 3600u

/*
 * One trace at a time, embedded in the Engine (Engine.trace), reachable
 * from the rooms that record into it (engine, sched) and the one that
 * starts and reads it (ipc).  Every hook is `if (trace_on(tr)) trace_x(...)`:
 * when no trace runs, that one well-predicted branch is all it costs.
 */
typedef struct Trace {
        bool on;                        /* recording */
        TraceRecord *rec;               /* @cap records, NULL when no trace exists */
        uint32_t cap;
        uint32_t n;                     /* records kept */
        uint64_t dropped;               /* records that found the buffer full */
        uint64_t start_ns, stop_ns;     /* stop_ns: 0 while recording */
        uint64_t links_start[_LINK_MAX];        /* the engine's link counters when it started, and stopped */
        uint64_t links_stop[_LINK_MAX];
        uint32_t next_plan;             /* plans are numbered from 1 */
        /* the ipc room's: who holds the trace, and its stop timer */
        const void *owner;
        uid_t uid;
        pid_t pid;
        sd_event_source *timer;
} Trace;

#define trace_on(tr) __builtin_expect(!!(tr)->on, 0)

/* Make room for @cap records (1 .. TRACE_BUFFER_MAX) and start recording at @now.  -EBUSY if a trace exists. */
int trace_start(Trace *tr, uint32_t cap, uint64_t now);
/* Stop recording at @now (the records stay until trace_reset()). */
void trace_stop(Trace *tr, uint64_t now);
/* Drop the trace and its records (the owner fields too); a new one may start. */
void trace_reset(Trace *tr);

/* The next free record, zeroed, or NULL (counted as dropped) when the buffer is full. */
TraceRecord *trace_next(Trace *tr);

/* A transfer of @t over @link ended at @end: @bytes as counted on the link (0 if it failed with @error). */
void trace_xfer(Trace *tr, const Tensor *t, LinkDir link, uint64_t queued, uint64_t started, uint64_t end,
                uint64_t bytes, int error);
/* Marker @seq of plan @plan of @j: @phase entered at @mark. */
void trace_phase(Trace *tr, const Job *j, uint32_t plan, uint64_t seq, uint32_t phase, uint64_t mark);
/* Marker @seq's @phase was made ready at @to, after the rank reached it at @from. */
void trace_stall(Trace *tr, const Job *j, uint32_t plan, uint64_t seq, uint32_t phase, uint64_t from, uint64_t to);
/* A decision about @t's copy in @tier (@why TRACE_WHY_*), at @now. */
void trace_decision(Trace *tr, const Tensor *t, int tier, int why, uint64_t deadline, uint32_t flags, uint64_t now);
