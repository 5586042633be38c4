/* SPDX-License-Identifier: MIT */
/* segpool.c: a pool of equal-sized memory segments, each owned by at most one job. */

/*
 * Theory of operation: the host tier and the VRAM tier both hand memory to
 * jobs in segments: fixed-size blocks that a client maps whole (a memfd, or a
 * CUDA VMM chunk exported as an fd).  A segment belongs to one job at a time,
 * so a client only ever receives fds of its own job's memory.  Inside a
 * segment tensors get SEG_UNIT-aligned ranges from an ExtentAlloc.  A range
 * given back may stay taken a while (the park hook: the cuda pool, while a
 * client's device work may still touch it), so that no new tensor gets it
 * before that work is done.
 *
 * Memory is created by the backend's ops->make() at start-up (so the pool's
 * capacity is reserved, locked and registered once).  When a job gives a
 * segment back, the memory is dropped and made anew rather than zeroed in
 * place: the old job's clients may still have the old pages mapped, and new
 * pages from the kernel are zero by construction.  A pool may first ask
 * the old job's clients to let go (the revoke hook): the segment then waits
 * out of service until segpool_revoked().
 *
 * Making a pool takes time in proportion to its size (about 1.8 s per GiB
 * of host memory, locked and faulted in), past systemd's start timeout for
 * large pools: while it runs, the service manager is asked to wait longer
 * (EXTEND_TIMEOUT_USEC=) before the first segment and then once a second.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "daemon/tiers/renew.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* How much longer the service manager waits each time: many times what one segment (at most 1G) takes. */
#define SEGPOOL_EXTEND_USEC (30 * USEC_PER_SEC)
/* How often it is asked while segments are made. */
#define SEGPOOL_EXTEND_EVERY_USEC USEC_PER_SEC

int segpool_init(SegPool *p, const char *kind, const SegPoolOps *ops, void *userdata,
                 uint64_t capacity, uint64_t seg_size) {
        uint64_t asked = 0;     /* when EXTEND_TIMEOUT_USEC= was sent last */
        int r;

        if (seg_size == 0 || seg_size % SEG_UNIT != 0 || capacity < seg_size)
                return -EINVAL;

        *p = (SegPool) {
                .kind = kind,
                .ops = ops,
                .userdata = userdata,
                .seg_size = seg_size,
                .piece_align = SEG_UNIT,
        };
        p->n_segs = (uint32_t) (capacity / seg_size);
        p->segs = calloc(p->n_segs, sizeof(Segment));
        if (!p->segs)
                return -ENOMEM;

        /* every segment owns nothing before the first is made: a failure drops only those made */
        for (uint32_t i = 0; i < p->n_segs; i++) {
                p->segs[i].pool = p;
                p->segs[i].id = i;
                p->segs[i].fd = -1;
                list_init(&p->segs[i].owner_link);
        }
        for (uint32_t i = 0; i < p->n_segs; i++) {
                Segment *s = &p->segs[i];
                uint64_t now = now_usec();

                if (i == 0 || now - asked >= SEGPOOL_EXTEND_EVERY_USEC) {
                        /* a no-op without $NOTIFY_SOCKET; ignored by systemd once started */
                        (void) sd_notifyf(false, "EXTEND_TIMEOUT_USEC=%" PRIu64, (uint64_t) SEGPOOL_EXTEND_USEC);
                        asked = now;
                }
                r = extent_alloc_init(&s->units, seg_size / SEG_UNIT);
                if (r < 0)
                        goto fail;
                r = ops->make(p, s, seg_size);
                if (r < 0)
                        goto fail;
                p->n_free++;
        }
        return 0;
fail:
        segpool_deinit(p);
        return r;
}

void segpool_deinit(SegPool *p) {
        p->renewer = segrenewer_free(p->renewer);       /* its thread ends first: then the memory goes */
        if (!p->segs)
                return;
        for (uint32_t i = 0; i < p->n_segs; i++) {
                Segment *s = &p->segs[i];

                if (s->fd >= 0 || s->map || s->device_ptr)
                        p->ops->drop(p, s);
                extent_alloc_deinit(&s->units);
        }
        free(p->segs);
        p->segs = NULL;
        p->n_segs = p->n_free = 0;
}

int segpool_assign(SegPool *p, Job *job, List *owner_list, Segment **ret) {
        for (uint32_t i = 0; i < p->n_segs; i++) {
                Segment *s = &p->segs[i];

                if (s->owner || s->revoking || s->renewing || (s->fd < 0 && !s->device_ptr))
                        continue;
                s->owner = job;
                list_add_tail(owner_list, &s->owner_link);
                p->n_free--;
                *ret = s;
                return 0;
        }
        return -ENOSPC;
}

/* A new generation of @s, its room all free (its memory is renewed next). */
static int segment_reset(SegPool *p, Segment *s) {
        s->generation++;
        extent_alloc_deinit(&s->units);
        s->used = 0;
        s->parked = 0;          /* the pool dropped what it parked with the old memory */
        return extent_alloc_init(&s->units, p->seg_size / SEG_UNIT);
}

/* Make new memory for @s, whose old memory is dropped already, and put it back in service. */
static int segment_renew_now(SegPool *p, Segment *s) {
        int r;

        r = segment_reset(p, s);
        if (r < 0)
                return r;
        r = p->ops->make(p, s, p->seg_size);
        if (r < 0)
                return r;       /* the segment stays out of service */
        p->n_free++;
        return 0;
}

/* Replace the memory of a segment nobody owns, and put it back in service. */
static int segment_renew(SegPool *p, Segment *s) {
        int r;

        if (p->renewer) {
                /* off the loop: only the registration goes here, the memory on the renewer's thread */
                if (p->ops->unprepare)
                        p->ops->unprepare(p, s);
                r = segment_reset(p, s);
                if (r < 0)
                        return r;
                return segrenewer_queue(p->renewer, s);
        }
        p->ops->drop(p, s);
        return segment_renew_now(p, s);
}

int segpool_release(SegPool *p, Segment *s) {
        int r = 0;

        if (!s->owner)
                return -EINVAL;
        if (p->revoke)
                r = p->revoke(p, s, p->revoke_userdata);
        list_del(&s->owner_link);
        s->owner = NULL;
        if (r > 0) {
                s->revoking = true;
                p->n_revoking++;
                return 0;
        }
        return segment_renew(p, s);
}

void segpool_forget(SegPool *p, Segment *s) {
        if (!s->owner)
                return;
        list_del(&s->owner_link);
        s->owner = NULL;
}

int segpool_revoked(SegPool *p, Segment *s) {
        if (!s->revoking)
                return -EINVAL;
        s->revoking = false;
        p->n_revoking--;
        return segment_renew(p, s);
}

int segpool_claim(SegPool *p, Segment *s, Job *job, List *owner_list) {
        if (s->owner || s->revoking || s->renewing || (s->fd < 0 && !s->device_ptr))
                return -EBUSY;
        s->owner = job;
        list_add_tail(owner_list, &s->owner_link);
        p->n_free--;
        return 0;
}

int segpool_renew_free(SegPool *p, Segment *s) {
        if (s->owner || s->revoking || s->renewing)
                return -EBUSY;
        if (s->fd >= 0 || s->map || s->device_ptr) {
                p->ops->drop(p, s);
                p->n_free--;
        }
        return segment_renew_now(p, s);
}

int segment_reserve(Segment *seg, uint64_t offset, uint64_t size) {
        int r;

        if (offset % SEG_UNIT != 0)
                return -EINVAL;
        r = extent_alloc_reserve(&seg->units, offset / SEG_UNIT, DIV_ROUND_UP(size, SEG_UNIT));
        if (r < 0)
                return r;
        seg->used += ALIGN_UP(size, SEG_UNIT);
        return 0;
}

int segment_alloc(Segment *seg, uint64_t size, uint64_t align, uint64_t *ret_offset) {
        uint64_t unit;
        int r;

        r = extent_alloc_get_low(&seg->units, DIV_ROUND_UP(size, SEG_UNIT), MAX(align / SEG_UNIT, 1u), &unit);
        if (r < 0)
                return r;
        seg->used += ALIGN_UP(size, SEG_UNIT);
        *ret_offset = unit * SEG_UNIT;
        return 0;
}

uint64_t segment_largest_free(const Segment *seg) {
        return extent_alloc_largest_free(&seg->units) * SEG_UNIT;
}

static void segment_put(Segment *seg, uint64_t offset, uint64_t size) {
        if (extent_alloc_put(&seg->units, offset / SEG_UNIT, DIV_ROUND_UP(size, SEG_UNIT)) >= 0)
                seg->used -= ALIGN_UP(size, SEG_UNIT);
}

void segment_free(Segment *seg, uint64_t offset, uint64_t size) {
        if (seg->pool->ops->park && seg->pool->ops->park(seg->pool, seg, offset, size)) {
                seg->parked += ALIGN_UP(size, SEG_UNIT);
                return;
        }
        segment_put(seg, offset, size);
}

void segpool_settle(SegPool *p) {
        if (p->ops->settle)
                p->ops->settle(p);
}

void segment_free_now(Segment *seg, uint64_t offset, uint64_t size) {
        seg->parked -= MIN(seg->parked, ALIGN_UP(size, SEG_UNIT));
        segment_put(seg, offset, size);
}
