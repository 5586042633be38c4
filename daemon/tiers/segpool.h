/* SPDX-License-Identifier: MIT */
/* segpool.h: a pool of equal-sized memory segments, each owned by at most one job. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/tiers/extent.h"
#include "util/list.h"

typedef struct Job Job;
typedef struct SegPool SegPool;
typedef struct SegRenewer SegRenewer;

/* Sub-allocation unit inside a segment: O_DIRECT needs 4 KiB alignment. */
#define SEG_UNIT 4096u

typedef struct Segment {
        SegPool *pool;
        uint32_t id;            /* global, stable: index in the pool */
        uint32_t generation;    /* bumped each time the memory is replaced */
        int fd;                 /* memfd (or exported handle), CLOEXEC */
        void *map;              /* daemon's mapping (NULL for device memory) */
        uint64_t device_ptr;    /* device address for cuda segments */
        Job *owner;
        List owner_link;        /* in Job.segments[tier] */
        ExtentAlloc units;      /* SEG_UNIT-sized units */
        uint64_t used;          /* bytes allocated */
        uint64_t parked;        /* of them, given back but kept taken by the park hook (not emptiable) */
        bool revoking;          /* released, waiting for the old job's clients to let go */
        bool renewing;          /* released, its memory being replaced on the renewer's thread */
} Segment;

/* What a backend provides to make and drop the memory behind a segment. */
typedef struct SegPoolOps {
        /* Fill seg->fd / seg->map / seg->device_ptr with @size fresh zeroed bytes. */
        int (*make)(SegPool *p, Segment *seg, uint64_t size);
        void (*drop)(SegPool *p, Segment *seg);
        /*
         * Optional, to renew segments off the event loop (renew.c): make and
         * drop in two halves each.  drop_memory and make_memory run on the
         * renewer's thread: system calls on the segment's own fd and mapping
         * only, no logging, nothing of tierd's state; unprepare (before) and
         * prepare (after) run on the loop: what registers the memory elsewhere.
         * make = make_memory + prepare, drop = unprepare + drop_memory.
         */
        void (*unprepare)(SegPool *p, Segment *seg);
        void (*drop_memory)(SegPool *p, Segment *seg);
        int (*make_memory)(SegPool *p, Segment *seg, uint64_t size);
        int (*prepare)(SegPool *p, Segment *seg);
        /*
         * Optional: a range segment_free() gives back that device work a client
         * queued may still touch (cuda: an event given at an unpin, pending on
         * it).  true: the pool keeps it taken for now, to give it back itself
         * (segment_free_now()) once that work is done, so that no new tensor
         * gets it meanwhile; Segment.parked counts it until then.  Loop
         * thread only, as settle.
         */
        bool (*park)(SegPool *p, Segment *seg, uint64_t offset, uint64_t size);
        /* Optional: give back the parked ranges whose work is done (segpool_settle()). */
        void (*settle)(SegPool *p);
} SegPoolOps;

struct SegPool {
        const char *kind;       /* "memfd" or "cuda": what a client must do to map */
        const SegPoolOps *ops;
        void *userdata;
        uint32_t id_base;       /* added to segment ids on the wire (unique across pools) */
        int tier;               /* enum tier_level this pool serves */
        uint64_t seg_size;
        uint64_t piece_align;   /* alignment (bytes) of the pieces of a tensor that spans segments */
        bool map_whole;         /* clients map a segment only whole (cuda): a spanning copy's pieces start at 0 */
        uint32_t n_segs;
        uint32_t n_free;
        uint32_t n_revoking;    /* segments waiting for segpool_revoked() */
        uint32_t n_renewing;    /* segments with the renewer */
        SegRenewer *renewer;    /* set by segrenewer_new(): releases renew there (NULL: at once, here) */
        Segment *segs;
        /*
         * Optional: called by segpool_release() while seg->owner is still set.
         * Returns 0 to drop the memory at once, > 0 when it has asked the
         * owner's clients to unmap it first and will call segpool_revoked()
         * once they have (daemon/revoke.c, for device memory that stays
         * allocated while any process maps it).
         */
        int (*revoke)(SegPool *p, Segment *seg, void *userdata);
        void *revoke_userdata;
};

int segpool_init(SegPool *p, const char *kind, const SegPoolOps *ops, void *userdata,
                 uint64_t capacity, uint64_t seg_size);
void segpool_deinit(SegPool *p);

/* Hand a free segment to @job (appended to @owner_list).  -ENOSPC when none is free. */
int segpool_assign(SegPool *p, Job *job, List *owner_list, Segment **ret);
/*
 * Take a segment back from its job.  Its memory is replaced by fresh, zeroed
 * memory (a departed client may still map the old pages, so they are never
 * handed to another job): with a renewer on its thread (the segment out of
 * service until then), else here.  Everything in it must have been freed.
 * With a revoke hook the segment may instead wait, out of service, for
 * segpool_revoked().
 */
int segpool_release(SegPool *p, Segment *seg);
/*
 * segpool_forget() - the owner is going and so is the pool (tierd's exit):
 * the segment only stops belonging to it; its memory is not replaced
 * (segpool_deinit() drops it), and it is not put back in service.
 */
void segpool_forget(SegPool *p, Segment *seg);
/* The clients let go of a revoking segment: replace its memory and put it back in service. */
int segpool_revoked(SegPool *p, Segment *seg);
/*
 * At start, for the memory store (state/memstore.c): hand free segment @seg
 * itself to @job, as segpool_assign() would (-EBUSY: it is not free); and
 * replace the memory of a free segment that the last run left (not zeros),
 * at once.
 */
int segpool_claim(SegPool *p, Segment *seg, Job *job, List *owner_list);
int segpool_renew_free(SegPool *p, Segment *seg);

/*
 * Allocate @size bytes inside @seg at an offset that is a multiple of
 * @align (a multiple of SEG_UNIT), as low as they fit; -ENOSPC.
 */
int segment_alloc(Segment *seg, uint64_t size, uint64_t align, uint64_t *ret_offset);
/* Take exactly [@offset, @offset + @size) of @seg (SEG_UNIT-aligned); -EBUSY when part of it is taken. */
int segment_reserve(Segment *seg, uint64_t offset, uint64_t size);
/* The longest free run of @seg, in bytes. */
uint64_t segment_largest_free(const Segment *seg);
/* Give back a range: at once, or once the pool's park hook lets it go. */
void segment_free(Segment *seg, uint64_t offset, uint64_t size);
/* Give back a range the park hook kept, at once (the park hook's own). */
void segment_free_now(Segment *seg, uint64_t offset, uint64_t size);
/* Before placing a copy: the pool gives back the parked ranges it can (SegPoolOps.settle). */
void segpool_settle(SegPool *p);
