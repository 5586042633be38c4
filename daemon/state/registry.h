/* SPDX-License-Identifier: MIT */
/* registry.h: jobs, tensors, their copies in each tier, pins. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <tier.h>

#include "daemon/tiers/fairq.h"
#include "daemon/base/list.h"

typedef struct Conn Conn;
typedef struct Job Job;
typedef struct Manager Manager;
typedef struct Segment Segment;
typedef struct Op Op;
typedef struct Xfer Xfer;
typedef struct FencePage FencePage;
typedef struct sd_event_source sd_event_source;
typedef struct Plan Plan;

#define TIERS TIER_LEVEL_MAX

typedef enum CopyState {
        COPY_ABSENT,
        COPY_FILLING,           /* space reserved; data not there yet */
        COPY_RESIDENT,
        COPY_DRAINING,          /* resident, being written down to be dropped */
        _COPY_STATE_MAX,
} CopyState;

typedef struct NvmeExtent {
        uint32_t target;
        uint32_t crc;           /* crc32c of the extent's bytes as written */
        uint64_t unit;          /* extent index inside the target */
} NvmeExtent;

/*
 * One tier's copy of a tensor.  A copy holds data version @version; it is
 * valid while that equals the tensor's version.  Stale copies are freed as
 * soon as nothing pins them.
 */
typedef struct Copy {
        CopyState state;
        unsigned pins;
        uint64_t version;
        uint64_t last_use;      /* monotonic usec, for victim choice */
        List lru;               /* in Manager.lru[tier] while allocated */
        /* host / vram */
        Segment *seg;
        uint64_t offset;
        /* nvme */
        NvmeExtent *extents;
        uint32_t n_extents;
} Copy;

typedef struct Tensor {
        Job *job;
        uint64_t id;
        char *name;
        uint64_t size;
        uint64_t alloc_size;    /* size rounded up to SEG_UNIT */
        uint64_t version;       /* 0: never written, contents are zeros */
        bool dead;              /* contents will be overwritten before they are read: no copy need keep them */
        Copy copy[TIERS];
        Xfer *xfer;             /* transfer in progress, at most one */
        unsigned op_refs;       /* ops working on it: not a victim meanwhile */
        List waiters;           /* Op.wait_link: ops waiting for the transfer */
        bool doomed;            /* freed by its job while a transfer ran */
        List job_link;
        Plan *plan;             /* the first plan that names it (for next-use predictions) */
        unsigned plan_refs;     /* plans that name it: it cannot be freed meanwhile */
        uint32_t plan_slot;
        Op *sched_op;           /* the scheduler's prefetch or write-behind in flight */
        uint64_t sched_pass;    /* scheduler pass that computed sched_written */
        uint8_t sched_written;  /* tiers (bits) a held phase writes it in */
        uint64_t sched_blocked; /* epoch in which a prefetch found no space (retry after it changes) */
} Tensor;

struct Job {
        Manager *manager;
        uint64_t id;
        char *name;
        uid_t uid;
        List link;              /* Manager.jobs */
        List conns;             /* Conn.job_link */
        unsigned n_conns;
        List tensors;           /* Tensor.job_link */
        unsigned n_tensors;
        Tensor **by_id;         /* index: low 32 bits of the id */
        uint32_t by_id_cap;
        uint32_t next_gen;
        struct TensorMap *by_name;
        uint64_t limit[TIERS];  /* byte limits; from config defaults for now */
        uint64_t used[TIERS];
        uint64_t pinned[TIERS];
        List segments[TIERS];   /* Segment.owner_link (host, vram) */
        int fence_fd;           /* memfd of the FencePage */
        FencePage *fences;
        uint64_t fence_slots[4]; /* bitmap of FENCE_SLOTS */
        sd_event_source *linger;
        uint64_t linger_until;  /* monotonic usec, 0 while connected */
        bool dying;
        unsigned weight;        /* bandwidth weight (fair share of the links) */
        uint8_t limit_set;      /* tiers (bits) whose limit a quota set: a reload leaves them alone */
        double vtime;           /* fair-share virtual time: bytes served / weight */
        FairFlow nvme_flow;     /* its place in the NVMe queue (uring.c) */
        FairFlow vram_flow[2];  /* and in the VRAM link's, per VramDir (mover.c) */
        unsigned sched_inflight[2]; /* transfers the scheduler started for it, per SCHED_LINK_* */
        uint64_t link_bytes[4]; /* bytes moved for this job, per LinkDir */
};

int job_new(Manager *m, const char *name, uid_t uid, Job **ret);
/* Frees every tensor (those in transfer when it completes) and the job. */
void job_destroy(Job *j);
Job *job_find(Manager *m, const char *name);

int job_fence_slot_get(Job *j, unsigned *ret);
void job_fence_slot_put(Job *j, unsigned slot);

int tensor_new(Job *j, const char *name, uint64_t size, Tensor **ret);
Tensor *tensor_find(Job *j, uint64_t id);
Tensor *tensor_find_name(Job *j, const char *name);
/* -EBUSY when pinned or in use by an op. */
int tensor_free(Tensor *t);

/* A copy is valid when it holds the newest data. */
static inline bool copy_valid(const Tensor *t, int tier) {
        const Copy *c = &t->copy[tier];
        return (c->state == COPY_RESIDENT || c->state == COPY_DRAINING) && c->version == t->version;
}

/* No copy needs to hold anything: never written (zeros), or dead (to be overwritten). */
static inline bool tensor_is_blank(const Tensor *t);

/* Nothing but this copy holds the newest data (it must be written down before it is dropped). */
bool copy_is_sole(const Tensor *t, int tier);
/* Lowest-numbered-tier valid copy, or -1. */
int tensor_valid_tier(const Tensor *t, int below_or_at);

static inline bool tensor_is_blank(const Tensor *t) {
        if (t->version != 0 && !t->dead)
                return false;
        for (int i = 0; i < TIERS; i++)
                if (copy_valid(t, i))
                        return false;
        return true;
}

const char *copy_state_to_string(CopyState s);
const char *tier_to_string(int tier);
/* Count (delta > 0) or uncount a pin of @t in @tier in the job's and the daemon's "pinned" bytes. */
void tensor_pin_account(Tensor *t, int tier, int delta);
