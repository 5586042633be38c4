/* SPDX-License-Identifier: MIT */
/* trace.h: the binary trace record tierd records (daemon/engine/trace.c) and libtier reads (client/trace.c). */
#pragma once

#include <stdint.h>

/*
 * A trace (TraceStart .. TraceStop) is an array of these 160-byte records,
 * in the order tierd recorded them, sent as a sealed memfd beside the
 * TraceReply.  Times are CLOCK_MONOTONIC nanoseconds.  Names are copied in,
 * truncated and NUL-terminated (the job's and the tensor's ids say which
 * one when two names share their first bytes).
 *
 * TRACE_XFER: one transfer, recorded when it ended (where tierd counts
 * its bytes on the link, engine/xfer.c): @t0 queued, @t1 started (its first
 * extent went to the device, or the VRAM backend got its copies), @ts ended; @link a LinkDir (level.h);
 * @bytes what the link counter counted (the tensor's allocated size, 0 for
 * a failed transfer, @error < 0 then), @size the tensor's allocated size.
 * A transfer queued before the trace began has @t0 = 0 (and @t1 = 0 when
 * it started before too): unknown.
 *
 * TRACE_PHASE: a marker of a plan arrived: @phase entered at @ts (the
 * client's clock reading, clamped), @seq the marker's number, @plan the
 * plan's number (one per rank's plan, from 1).
 *
 * TRACE_STALL: tierd made marker @seq's phase ready after the marker
 * arrived: the rank waited from @t0 (the marker) to @ts.
 *
 * TRACE_DECISION: the scheduler started a transfer (@why TRACE_WHY_PIN_*,
 * _PREFETCH, _CLEAN; @deadline when it is needed, 0: now) or the engine
 * chose a victim copy in @tier (@why TRACE_WHY_DROP_*, _DRAIN, _BLOCKED;
 * @deadline its next planned use, 0: none known; @flags TRACE_F_RECLAIM when
 * the room was taken back for another job).
 */

#define TRACE_NAME_MAX 32

enum {
        TRACE_XFER = 1,
        TRACE_PHASE = 2,
        TRACE_STALL = 3,
        TRACE_DECISION = 4,
};

enum {
        TRACE_WHY_NONE = 0,
        TRACE_WHY_PIN_NOW = 1,          /* the current phase's pin: needed now */
        TRACE_WHY_PIN_NEXT = 2,         /* the next phase's pin (timeline: held ahead) */
        TRACE_WHY_PREFETCH = 3,         /* a later phase's access, by earliest deadline */
        TRACE_WHY_CLEAN = 4,            /* write-behind of a sole copy Belady would evict */
        TRACE_WHY_DROP_CLEAN = 5,       /* victim: another copy is valid, dropped without I/O */
        TRACE_WHY_DROP_DEAD = 6,        /* victim: its plan overwrites it next, dropped */
        TRACE_WHY_DRAIN = 7,            /* victim: sole (dirty) copy, written down first */
        TRACE_WHY_BLOCKED = 8,          /* victim passed over: its last drain failed */
        _TRACE_WHY_MAX,
};

/* TRACE_DECISION flags */
#define TRACE_F_RECLAIM 1u

typedef struct TraceRecord {
        uint64_t ts;                    /* the event (a transfer's, a stall's end) */
        uint64_t t0;                    /* queued / stall start */
        uint64_t t1;                    /* started */
        uint64_t bytes;
        uint64_t size;
        uint64_t tensor;                /* the tensor's id; 0 for none */
        uint64_t seq;                   /* marker number */
        uint64_t deadline;
        uint64_t job_id;                /* the job object's id (HelloReply.job_id) */
        uint32_t plan;
        uint32_t phase;
        int32_t error;
        uint32_t flags;
        uint8_t kind;                   /* TRACE_* */
        uint8_t link;                   /* TRACE_XFER: LinkDir */
        uint8_t tier;                   /* TRACE_DECISION */
        uint8_t why;                    /* TRACE_WHY_* */
        uint32_t pad;
        char job[TRACE_NAME_MAX];
        char name[TRACE_NAME_MAX];
} TraceRecord;

_Static_assert(sizeof(TraceRecord) == 160, "trace records are 160 bytes");
