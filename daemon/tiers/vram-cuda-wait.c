/* SPDX-License-Identifier: MIT */
/* vram-cuda-wait.c: client events (Unpin.ipc_event) on VRAM ranges, and the ranges they park. */

/*
 * Theory of operation.
 *
 * Client events.  An Unpin may carry a client's interprocess event,
 * recorded after kernels that still write the tensor.  tierd opens it
 * (cuIpcOpenEventHandle, cached by handle) and remembers it for that VRAM
 * range; every later copy, in either direction, of an overlapping range
 * first makes its stream wait for it (cuStreamWaitEvent), so the tensor is
 * never copied out before those kernels finish (a fill never waits: below).  Entries
 * are dropped once the event has completed.  Each job (the owner of the
 * ranges' chunks) has at most VRAM_WAITS_PER_JOB ranges on
 * VRAM_WAIT_EVENTS_PER_JOB events pending, a quarter of the room of all, so
 * a job whose events never complete cannot refuse other jobs theirs.
 *
 * The loop thread never waits for a client's event.  A range given back
 * (segment_free(): its tensor destroyed, its copy dropped) while one is
 * pending on it stays taken, parked (SegPoolOps.park), until the event has
 * completed: no new tensor gets it before, so a fill (cuda_zero(), which
 * synchronizes on the loop thread) or a write-only pin never meets one.
 * Parked ranges go back when waits are pruned, and before each placement
 * (segpool_settle()).  A fill that still finds one (a copy refilled in
 * place) is refused with -EBUSY rather than waited for.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/base/log.h"
#include "daemon/tiers/vram-cuda-private.h"
#include "proto/macro.h"

#if TIERD_HAVE_CUDA

static bool ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
        return a < b + blen && b < a + alen;
}

static void wait_remove(VramCuda *v, size_t i) {
        v->waits[i].opened->refs--;
        v->waits[i] = v->waits[--v->n_waits];
}

/* Its memory goes (the segment's room is reset with it): its waits and parked ranges with it. */
void waits_drop_segment(VramCuda *v, const Segment *seg) {
        for (size_t i = v->n_waits; i > 0; i--)
                if (v->waits[i - 1].seg == seg)
                        wait_remove(v, i - 1);
        for (size_t i = v->n_parked; i > 0; i--)
                if (v->parked[i - 1].seg == seg)
                        v->parked[i - 1] = v->parked[--v->n_parked];
}

bool waits_pending_on(VramCuda *v, const Segment *seg, uint64_t offset, uint64_t len) {
        for (size_t i = 0; i < v->n_waits; i++)
                if (v->waits[i].seg == seg && ranges_overlap(v->waits[i].offset, v->waits[i].len, offset, len))
                        return true;
        return false;
}

/* Forget waits whose event has completed (or can no longer be asked about); give back what they parked. */
void waits_prune(VramCuda *v) {
        for (size_t i = v->n_waits; i > 0; i--)
                if (v->drv->cuEventQuery(v->waits[i - 1].opened->event) != CUDA_ERROR_NOT_READY)
                        wait_remove(v, i - 1);
        for (size_t i = v->n_parked; i > 0; i--) {
                CudaParked *k = &v->parked[i - 1];

                if (!waits_pending_on(v, k->seg, k->offset, k->size)) {
                        segment_free_now(k->seg, k->offset, k->size);
                        *k = v->parked[--v->n_parked];
                }
        }
}

/* SegPoolOps.park: a range given back that a client's event is still pending on stays taken. */
bool cuda_seg_park(SegPool *p, Segment *seg, uint64_t offset, uint64_t size) {
        VramCuda *v = p->userdata;

        if (v->n_waits == 0)
                return false;
        waits_prune(v);
        if (!waits_pending_on(v, seg, offset, size))
                return false;
        if (v->n_parked >= CUDA_WAITS_MAX)
                return false;   /* cannot be (each overlaps a wait of its own); a fill is refused */
        v->parked[v->n_parked++] = (CudaParked) { seg, offset, size };
        return true;
}

void cuda_seg_settle(SegPool *p) {
        waits_prune(p->userdata);
}

/* Make @stream wait for every client event pending on [@offset, +@len) of @seg (*@ret_waited: any). */
CUresult waits_apply(VramCuda *v, CUstream stream, const Segment *seg, uint64_t offset, uint64_t len,
                     bool *ret_waited) {
        *ret_waited = false;
        if (v->n_waits == 0)
                return CUDA_SUCCESS;
        waits_prune(v);
        for (size_t i = 0; i < v->n_waits; i++) {
                CudaWait *w = &v->waits[i];
                CUresult r;

                if (w->seg != seg || !ranges_overlap(w->offset, w->len, offset, len))
                        continue;
                r = v->drv->cuStreamWaitEvent(stream, w->opened->event, 0);
                if (r != CUDA_SUCCESS)
                        return r;
                *ret_waited = true;
        }
        return CUDA_SUCCESS;
}

static CudaOpened *opened_get(VramCuda *v, const CUipcEventHandle *handle, CUresult *ret) {
        CudaOpened *slot = NULL;

        for (size_t i = 0; i < CUDA_OPENED_MAX; i++) {
                CudaOpened *o = &v->opened[i];

                if (o->event && memcmp(&o->handle, handle, sizeof(*handle)) == 0) {
                        o->last_use = ++v->use_clock;
                        return o;
                }
                /* an unused slot, else the least recently used one nothing refers to */
                if (o->refs == 0 && (!slot || (slot->event && (!o->event || o->last_use < slot->last_use))))
                        slot = o;
        }
        if (!slot) {
                *ret = CUDA_ERROR_OUT_OF_MEMORY;
                return NULL;
        }
        if (slot->event) {
                (void) v->drv->cuEventDestroy(slot->event);
                slot->event = NULL;
        }
        *ret = v->drv->cuIpcOpenEventHandle(&slot->event, *handle);
        if (*ret != CUDA_SUCCESS) {
                slot->event = NULL;
                return NULL;
        }
        slot->handle = *handle;
        slot->last_use = ++v->use_clock;
        return slot;
}

/* The job's pending waits, and the distinct events they name (@handle's among them: *@ret_named). */
static void waits_of_job(VramCuda *v, const Job *job, const CUipcEventHandle *handle, size_t *ret_waits,
                         size_t *ret_events, bool *ret_named) {
        uint64_t stamp = ++v->use_clock;

        *ret_waits = *ret_events = 0;
        *ret_named = false;
        for (size_t i = 0; i < v->n_waits; i++) {
                CudaOpened *o = v->waits[i].opened;

                if (v->waits[i].seg->owner != job)
                        continue;
                (*ret_waits)++;
                if (o->mark != stamp) {
                        o->mark = stamp;
                        (*ret_events)++;
                        *ret_named |= memcmp(&o->handle, handle, sizeof(*handle)) == 0;
                }
        }
}

int cuda_wait_event(VramBackend *b, const VramRange *ranges, size_t n, const void *handle, size_t size,
                           char *ret_why, size_t why_size) {
        VramCuda *v = container_of(b, VramCuda, base);
        size_t job_waits, job_events;
        CUipcEventHandle h;
        CudaOpened *o;
        bool named;
        CUresult r;

        if (size != sizeof(h))
                return -EINVAL;
        memcpy(&h, handle, sizeof(h));
        waits_prune(v);
        /* the job's own bounds first, so that one job cannot take the room of all */
        waits_of_job(v, ranges[0].seg->owner, &h, &job_waits, &job_events, &named);
        if (job_waits + n > VRAM_WAITS_PER_JOB || (!named && job_events >= VRAM_WAIT_EVENTS_PER_JOB)) {
                if (ret_why)
                        snprintf(ret_why, why_size, "the job has %zu VRAM ranges waiting on %zu client events "
                                 "that have not completed, its bound is %u ranges and %u events (this unpin "
                                 "adds %zu): synchronize the stream and unpin without an event",
                                 job_waits, job_events, VRAM_WAITS_PER_JOB, VRAM_WAIT_EVENTS_PER_JOB, n);
                return -ENOBUFS;
        }
        if (v->n_waits + n > CUDA_WAITS_MAX) {
                if (ret_why)
                        snprintf(ret_why, why_size, "all jobs together have %zu VRAM ranges waiting on client "
                                 "events, tierd keeps %u: synchronize the stream and unpin without an event",
                                 v->n_waits, CUDA_WAITS_MAX);
                return -ENOBUFS;
        }
        o = opened_get(v, &h, &r);
        if (!o) {
                log_debug("Cannot open a client's interprocess event: %s", cu_err(v, r));
                if (r != CUDA_ERROR_OUT_OF_MEMORY)
                        return -EINVAL;
                if (ret_why)
                        snprintf(ret_why, why_size, "all jobs together have %u client events pending, tierd "
                                 "keeps that many open: synchronize the stream and unpin without an event",
                                 CUDA_OPENED_MAX);
                return -ENOBUFS;
        }
        for (size_t i = 0; i < n; i++) {
                o->refs++;
                v->waits[v->n_waits++] = (CudaWait) {
                        .seg = ranges[i].seg,
                        .offset = ranges[i].offset,
                        .len = ranges[i].len,
                        .opened = o,
                };
        }
        return 0;
}

#endif
