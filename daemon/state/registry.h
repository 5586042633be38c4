/* SPDX-License-Identifier: MIT */
/* registry.h: the books: jobs, tensors, their copies in each tier, pins, space used. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/base/level.h"
#include "daemon/base/quota-rule.h"
#include "daemon/tiers/tier-nvme.h"
#include "util/fairq.h"
#include "util/list.h"

typedef struct Book Book;
typedef struct Config Config;
typedef struct FencePage FencePage;
typedef struct Job Job;
typedef struct MemStore MemStore;
typedef struct NvmeTier NvmeTier;
typedef struct Op Op;
typedef struct Plan Plan;
typedef struct Registry Registry;
typedef struct SegPool SegPool;
typedef struct Segment Segment;
typedef struct TensorMap TensorMap;
typedef struct Wear Wear;
typedef struct Xfer Xfer;
typedef struct sd_event sd_event;
typedef struct sd_event_source sd_event_source;

typedef enum CopyState {
        COPY_ABSENT,
        COPY_FILLING,           /* space reserved; data not there yet */
        COPY_RESIDENT,
        COPY_DRAINING,          /* resident, being written down to be dropped */
        _COPY_STATE_MAX,
        _COPY_STATE_INVALID = -22,
} CopyState;

/*
 * Where part of a host or VRAM copy lies: a range of one segment.  A tensor
 * that fits a segment has one piece; a larger one has whole segments and a
 * tail, in the tensor's order.  Pieces start on SEG_UNIT boundaries (the
 * pool's piece_align when there are several) and hold whole pages, so that
 * a client can map them one after the other into one contiguous range.
 */
typedef struct CopyPiece {
        Segment *seg;
        uint64_t offset;        /* in the segment */
        uint64_t len;           /* bytes of the tensor (of its alloc_size) this piece holds */
        uint64_t span;          /* bytes taken in the segment: len rounded up to the pool's piece_align */
} CopyPiece;

/*
 * Ranks of a job: those whose pins hold a copy for writing (Copy.write_ranks),
 * or whose Hello a copy held for the clients of before tierd's restart waits
 * for (Tensor.ghost_ranks).  More than RANK_SET_MAX: RANK_SET_MANY, which
 * ranks not known.
 */
#define RANK_SET_MAX 4
#define RANK_SET_MANY 0xff
typedef struct RankSet {
        uint32_t rank[RANK_SET_MAX];
        uint8_t n;              /* 0..RANK_SET_MAX, or RANK_SET_MANY */
} RankSet;

/*
 * One tier's copy of a tensor.  A copy holds data version @version; it is
 * valid while that equals the tensor's version.  Stale copies are freed as
 * soon as nothing pins them.
 */
typedef struct Copy {
        CopyState state;
        unsigned pins;
        unsigned pins_counted;  /* pins in the pinned bytes (tensor_pin_account()): its bytes count once while > 0 */
        unsigned writers;       /* pins that may write it (a client's, a plan's): the memory store records them */
        bool unwritten;         /* reserved for a pin that writes it whole: garbage until that pin wrote it */
        uint32_t writer_rank;   /* the rank whose pin may write it, last noted (the memory store records it) */
        RankSet write_ranks;    /* the ranks whose pins may write it now (the memory store records them) */
        unsigned write_pins[RANK_SET_MAX]; /* per write_ranks.rank[i]: its pins that may write it */
        uint64_t version;
        uint64_t last_use;      /* monotonic usec, for victim choice */
        List lru;               /* in Registry.lru[tier] while allocated */
        List job_lru;           /* and in its job's Job.lru[tier], in the same order */
        /* host / vram */
        CopyPiece *pieces;      /* &one, or an array for a tensor that spans segments; NULL while absent */
        uint32_t n_pieces;
        CopyPiece one;
        /* nvme */
        NvmeExtent *extents;
        uint32_t n_extents;
} Copy;

/* What the NVMe index (state/book.c) says of a tensor. */
typedef enum BookTensorState {
        BOOK_T_NONE,            /* not in it (no index, or not recorded) */
        BOOK_T_BLANK,           /* never written */
        BOOK_T_NVME,            /* its newest data is its NVMe copy, version Tensor.book_version */
        BOOK_T_NEWER,           /* its newest data is not on NVMe */
        BOOK_T_DEAD,            /* NEWER, and that version is dead (a DEAD record): its next write says NEWER */
} BookTensorState;

/* Why a tensor is lost (Tensor.lost_why): the reads it fails say it (tensor_lost_reason()). */
typedef enum TensorLost {
        TENSOR_LOST_STOPPED,            /* its newest data was only in memory when tierd stopped */
        TENSOR_LOST_TARGET,             /* its extents lie on an NVMe target that changed, or are claimed twice */
        TENSOR_LOST_DAMAGED,            /* the NVMe index was damaged */
        TENSOR_LOST_ROLLBACK,           /* a rollback found nothing of its committed version */
        TENSOR_LOST_WRITE_ONLY,         /* its write-only pin never reached its client; nothing held the version before */
} TensorLost;

/*
 * A tensor.  The fields after "the rooms above" belong to the engine and the
 * scheduler (daemon/engine, daemon/sched): the registry keeps them with the
 * tensor and never looks inside.
 */
typedef struct Tensor {
        Job *job;
        uint64_t id;
        char *name;
        uint64_t size;
        uint64_t alloc_size;    /* size rounded up to SEG_UNIT */
        uint64_t version;       /* 0: never written, contents are zeros */
        bool dead;              /* contents will be overwritten before they are read: no copy need keep them */
        uint32_t dead_rank;     /* 1 + the rank whose plan's overwrite made it dead (0: not known): no read */
        bool lost;              /* its newest data is gone (state/book.c): reads fail until it is written whole */
        uint8_t lost_why;       /* TensorLost: why, for the message of the reads it fails */
        bool doomed;            /* freed by its job while a transfer ran */
        Copy copy[TIERS];
        List job_link;          /* Job.tensors */
        uint64_t book_key;      /* its key in the NVMe index (0: not in it) */
        uint64_t book_version;  /* the version the index says its NVMe copy holds (BOOK_T_NVME), or its newest (NEWER) */
        uint8_t book_state;     /* BookTensorState: what the index says of it */
        /*
         * Commits (job_commit(), for a job that has made one: Job.committing):
         * the version its last commit took, and, once a newer one was
         * written, the NVMe image of that version (kept for job_rollback()).
         */
        uint64_t commit_version;
        bool commit_dead;       /* it was dead at the commit: a rollback makes it dead again, nothing lost */
        uint32_t commit_dead_rank; /* its dead_rank then (1 + the rank whose plan overwrites it; 0: not known) */
        NvmeExtent *base;
        uint32_t n_base;
        unsigned rw_pins;       /* pins that may read and write it (a commit waits for none) */
        uint32_t mem_slot;      /* its record in the memory store's table + 1 (0: none; state/memstore.c) */
        uint8_t ghost;          /* tiers (bits) pinned for the client of before a restart (job_release_ghosts()) */
        uint8_t ghost_unwritten; /* of those, tiers whose copy a write-only pin reserved: garbage unless it wrote */
        uint8_t ghost_room;     /* of those, tiers whose copy is only room (not the newest): no data, freed at release */
        bool ghost_dead_before; /* and it was dead before that pin: it goes back to dead if that came to nothing */
        uint32_t ghost_rank;    /* the rank whose Hello decides such a copy (its write-only pin's) */
        RankSet ghost_ranks[LEVEL_NVME]; /* per memory tier: the ranks a ghost waits for (n 0: any rank) */

        /* the rooms above */
        Xfer *xfer;             /* engine: transfer in progress, at most one */
        unsigned op_refs;       /* engine: ops working on it: not a victim meanwhile */
        List waiters;           /* engine: Op.wait_link, ops waiting for the transfer */
        Plan *plan;             /* sched: the first plan that names it (for next-use predictions) */
        unsigned plan_refs;     /* sched: plans that name it: it cannot be freed meanwhile */
        uint32_t plan_slot;
        Op *sched_op;           /* sched: its prefetch or write-behind in flight */
        uint64_t sched_pass;    /* sched: pass that computed sched_written */
        uint8_t sched_written;  /* sched: tiers (bits) a held phase writes it in */
        uint64_t sched_blocked; /* sched: epoch in which a prefetch found no space (retry after it changes) */
        uint64_t sched_failed;  /* sched: 1 + the version whose prefetch failed for good (EIO, a crc mismatch) */
        uint64_t sched_failed_src; /* sched: and the NVMe copy it had then: no prefetch before either changes */
        uint64_t sched_cleaned[TIERS]; /* sched: the version write-behind last copied down from each tier */
        bool sched_changed;     /* sched: a plan's hold unpinned it as written, the other plans not told yet */
        uint64_t sched_stamp;   /* sched: scratch mark of one walk (Sched.stamp, selfpin.c) */
        uint64_t drain_blocked[TIERS]; /* engine: 1 + Engine.space_gen of the tier below when its drain failed */
        Op *stop_op;            /* manager: a stop's write-down of it in flight (core/stop.c) */
        uint64_t stop_version;  /* manager: 1 + the version a stop's write-down was last asked for */
} Tensor;

/*
 * A total a job is held to together with other jobs: all the jobs of a uid,
 * or of the members of a group, may use at most total[tier] bytes of a tier
 * between them (0: no total there).  Resolved by quota.c (a [quota]
 * section's host_total..., else for a uid [host] uid_share... of the
 * capacity unless its creator is an admin); checked by copy_alloc().
 */
/* A write-down from a tier that found no room below (engine/blocked.c). */
typedef struct DrainShort {
        uint64_t gen;           /* 1 + Engine.space_gen of the tier below then (0: none) */
        uint64_t size;          /* the smallest copy whose write-down failed at that gen */
} DrainShort;

typedef struct JobTotal {
        QuotaKind kind;         /* QUOTA_UID or QUOTA_GROUP */
        uint32_t id;
        uint64_t total[TIERS];
        uint8_t from_share;     /* tiers (bits) whose total is [tier] uid_share, not a rule */
} JobTotal;

struct Job {
        Registry *registry;
        uint64_t id;
        char *name;
        uid_t uid;
        gid_t *gids;            /* its creator's groups, primary first (quota.c: group quotas); may be NULL */
        uint32_t n_gids;
        List link;              /* Registry.jobs, or Registry.dying_jobs */
        List tensors;           /* Tensor.job_link */
        unsigned n_tensors;
        Tensor **by_id;         /* index: low 32 bits of the id */
        uint32_t by_id_cap;
        uint32_t by_id_free;    /* every slot below it is taken: tensor_new() looks from there */
        uint64_t by_id_looks;   /* slots tensor_new() looked at, ever (work counted by tests) */
        uint32_t next_gen;
        TensorMap *by_name;
        uint64_t limit[TIERS];  /* byte limits (maxima): the config's defaults, or a quota */
        uint64_t guarantee[TIERS]; /* bytes no other job may take from it (a quota's minimum; 0: none) */
        uint8_t limit_set;      /* tiers (bits) whose limit a quota set: a reload leaves them alone */
        bool admin;             /* its creator is root, in group tier-admin or tierd's uid: no uid_share */
        bool not_owner;         /* its name's quota rule has an owner, not its uid: the rule governs it not (quota.c) */
        JobTotal *totals;       /* the totals it is held to with others (quota.c: its uid's, its groups'); owned */
        unsigned n_totals;
        unsigned weight;        /* bandwidth weight (fair share of the links) */
        uint64_t used[TIERS];
        uint64_t pinned[TIERS];
        List segments[TIERS];   /* Segment.owner_link (host, vram) */
        List lru[TIERS];        /* Copy.job_lru: its copies, least recently used first (Registry.lru's order) */
        uint64_t draining[TIERS]; /* bytes of its copies in COPY_DRAINING (copy_set_state()) */
        int fence_fd;           /* memfd of the FencePage */
        FencePage *fences;
        uint64_t fence_slots[4]; /* bitmap of FENCE_SLOTS */
        sd_event_source *linger;
        uint64_t linger_until;  /* monotonic usec, 0 while connected */
        bool dying;
        uint64_t link_bytes[_LINK_MAX]; /* bytes moved for this job, per link */
        uint64_t nvme_written;  /* bytes written to NVMe for it (every completed write, wear.c) */
        uint64_t nvme_host_changed; /* extents whose host copy it changed while written to NVMe (xfer.c) */
        uint64_t nvme_crc_errors; /* its extents read back from NVMe with a crc32c mismatch (xfer.c) */
        uint64_t plan_iterations; /* steps its ranks' plans completed, all its plans, ended ones included */
        uint64_t plan_stall_ns; /* and the time they waited for data in those steps (sched/plan.c plan_iteration()) */
        uint64_t book_key;      /* its key in the NVMe index (0: not in it) */
        bool committing;        /* it made a commit: its tensors keep the committed version's image */
        uint64_t commit_step;   /* the client's number of its last commit */
        unsigned frozen;        /* rollbacks waiting for its transfers: tierd starts no move of its own meanwhile */
        /* engine: a write-down from each tier failed for want of room below (blocked.c) */
        DrainShort drain_short[TIERS];

        /* the rooms above */
        List conns;             /* ipc: Conn.job_link, its ranks' connections */
        unsigned n_conns;
        List plans;             /* sched: Plan.job_link */
        double vtime;           /* sched: fair-share virtual time, bytes served / weight */
        unsigned sched_inflight[2]; /* sched: transfers it started for the job, per SCHED_LINK_* */
        FairFlow nvme_flow;     /* tiers: its place in the NVMe queue (uring.c) */
        FairFlow vram_flow[2];  /* engine: and in the VRAM link's, per VramDir */
};

/*
 * What the registry tells the room above (the engine registers these), so
 * that it never calls up: the engine owns ops and transfers, the registry
 * only the books.
 */
typedef struct RegistryOps {
        /* @j is ending: forget every op on its tensors (nothing may call back into them). */
        void (*job_ending)(void *userdata, Job *j);
        /* Space was given back in @tier: whoever waits for space may try again. */
        void (*space_freed)(void *userdata, int tier);
        /* A copy in @tier lost its last pin: its room may be taken now (evicted), so whoever waits for
         * room may try again. */
        void (*unpinned)(void *userdata, int tier);
} RegistryOps;

struct Registry {
        const Config *config;   /* borrowed: the running config (limits, defaults, linger) */
        sd_event *event;        /* linger timers */
        SegPool *pools[TIERS];  /* host and vram pools; NULL for nvme */
        NvmeTier *nvme;
        const RegistryOps *ops;
        void *ops_userdata;
        Wear *wear;             /* borrowed, may be NULL: the drive wear book (wear.c) */
        Book *book;             /* borrowed, may be NULL ([nvme] persist = no): the NVMe index (book.c) */
        MemStore *memstore;     /* borrowed, may be NULL: memory kept in the service manager's fd store */

        List jobs;              /* Job.link */
        List dying_jobs;        /* ended, waiting for transfers before being freed */
        uint64_t next_job_id;
        unsigned n_jobs;
        bool stopping;          /* tierd is stopping: jobs no longer linger */
        uint64_t unpins;        /* pins let go so far, and pins that may write: a stop looks again (core/stop.c) */
        bool freeing;           /* registry_free(): segments are not renewed for the next job */

        List lru[TIERS];        /* Copy.lru, least recently used first */
        uint64_t capacity[TIERS];
        uint64_t used[TIERS];
        uint64_t pinned[TIERS];
};

/*
 * registry_new() - the books over the pools @host and @vram and the NVMe
 * tier @nvme (all borrowed, outliving the registry); @config is borrowed
 * too and read at each use, so a reload's changes apply.
 */
int registry_new(const Config *config, sd_event *event, SegPool *host, SegPool *vram, NvmeTier *nvme,
                 Registry **ret);
/*
 * registry_free() - free every job and tensor, those waiting for a transfer
 * too: call it after the engine, once no transfer can complete.
 */
Registry *registry_free(Registry *r);
void registry_set_ops(Registry *r, const RegistryOps *ops, void *userdata);

/* ---- jobs (registry.c) ---- */

int job_new(Registry *r, const char *name, uid_t uid, Job **ret);
/* Cancels the job's ops, frees every tensor (those in transfer when it completes) and the job. */
void job_destroy(Job *j);
Job *job_find(Registry *r, const char *name);
/* No connection is left: keep the job for [daemon] linger_sec, then job_destroy() it. */
void job_linger_start(Job *j);
/* A connection joined: stop the linger timer. */
void job_linger_stop(Job *j);

/* The largest tensor @j may have in @tier: its limit there, or the tier's capacity when smaller. */
uint64_t job_tensor_max(const Job *j, int tier);

/* A dying job goes once its last tensor has (tensor.c calls this after freeing one). */
void job_maybe_finish(Job *j);

int job_fence_slot_get(Job *j, unsigned *ret);
void job_fence_slot_put(Job *j, unsigned slot);

/* ---- tensors and copies (tensor.c) ---- */

int tensor_new(Job *j, const char *name, uint64_t size, Tensor **ret);
Tensor *tensor_find(Job *j, uint64_t id);
Tensor *tensor_find_name(Job *j, const char *name);
/* -EBUSY when pinned, in use by an op or named by a plan. */
int tensor_free(Tensor *t);
/*
 * tensor_release_copies() - free a tensor's copies, unless a transfer is
 * running (t->xfer): the engine calls this again when it ends.  A doomed
 * tensor (tensor_free()d) is then freed itself, and its job too when that
 * was the last tensor of a job that ended.
 */
void tensor_release_copies(Tensor *t);

/* A copy is valid when it holds the newest data. */
/* (a copy reserved for a pin that writes it whole holds garbage until then: not the tensor's bytes) */
static inline bool copy_valid(const Tensor *t, int tier) {
        const Copy *c = &t->copy[tier];
        return (c->state == COPY_RESIDENT || c->state == COPY_DRAINING) && c->version == t->version &&
               !c->unwritten;
}

/* No copy needs to hold anything: never written (zeros), or dead (to be overwritten). */
static inline bool tensor_is_blank(const Tensor *t) {
        if (t->version != 0 && !t->dead)
                return false;
        for (int i = 0; i < TIERS; i++)
                if (copy_valid(t, i))
                        return false;
        return true;
}

/* Nothing but this copy holds the newest data (it must be written down before it is dropped). */
bool copy_is_sole(const Tensor *t, int tier);
/*
 * This copy above NVMe holds the newest data and NVMe does not (an evict
 * writes it down before it drops it): what clients and tierctl call dirty.
 * A tensor never written, dead or lost has nothing to write.  Unlike
 * copy_is_sole(), a tensor valid in VRAM and host alike is dirty in both.
 */
bool copy_unsaved(const Tensor *t, int tier);
/* Lowest-numbered-tier valid copy at or below @below_or_at, or -1. */
int tensor_valid_tier(const Tensor *t, int below_or_at);
const char *copy_state_to_string(CopyState s);

/* ---- space (space.c) ---- */

/* Why a copy got no space (copy_alloc()); space_explain() says it to the client. */
typedef enum SpaceShort {
        SPACE_OK,
        SPACE_TOO_LARGE,        /* larger than the tier's whole capacity: never fits */
        SPACE_OVER_QUOTA,       /* larger than the job's limit in the tier */
        SPACE_LIMIT,            /* the job's limit is reached (what is left of it is pinned or in use) */
        SPACE_FRAGMENTED,       /* the job's segments have the room, not in one run, and it may take no more */
        SPACE_POOL,             /* the pool has no free segment: other jobs hold them */
        SPACE_TARGETS,          /* the NVMe targets are full */
        SPACE_TOTAL,            /* a total of the job's uid or group (JobTotal) is reached */
        SPACE_TOTAL_OVER,       /* larger than a total of the job's uid or group: never fits */
        SPACE_NVME_KEPT,        /* the free NVMe room is kept for other jobs' unused nvme_min (nvme_kept()) */
        _SPACE_SHORT_MAX,
        _SPACE_SHORT_INVALID = -22,
} SpaceShort;

/* Bytes of @tier the jobs under @jt use now, lingering and ending ones too; their number in *@ret_jobs (may be NULL). */
uint64_t total_used(const Registry *r, const JobTotal *jt, int tier, unsigned *ret_jobs);
/* Is job @o under total @jt (of its uid, or of one of its creator's groups)? */
bool total_covers(const JobTotal *jt, const Job *o);
/* The first of @j's totals in @tier that @need more bytes would exceed (*@ret_over: @need alone does), or NULL. */
const JobTotal *total_exceeded(const Registry *r, const Job *j, int tier, uint64_t need, bool *ret_over);

/*
 * A job claims its guarantees (Job.guarantee) while it has not ended and does
 * not linger: a lingering job keeps its data but not its claim on capacity.
 * (A job just made, before its first rank is counted, claims them.)
 */
static inline bool job_claims_room(const Job *j) {
        return !j->dying && j->linger_until == 0;
}

/* The part of @j's NVMe guarantee it does not use: room kept free for it while it claims it. */
static inline uint64_t nvme_unused_guarantee(const Job *j) {
        return j->guarantee[LEVEL_NVME] > j->used[LEVEL_NVME] ? j->guarantee[LEVEL_NVME] - j->used[LEVEL_NVME] : 0;
}

/*
 * nvme_kept() - the NVMe bytes kept free for the guarantees of the jobs of
 * @r other than @except (may be NULL) that claim them: the sum of their
 * nvme_unused_guarantee().  NVMe is the last tier, so its copies are never
 * taken back from a job: a guarantee there is a reservation.  @who (may be
 * NULL) gets "'a' (128.0 MiB, 16.0 MiB of it used), ...".
 */
uint64_t nvme_kept(const Registry *r, const Job *except, char *who, size_t size);

/*
 * copy_alloc() - give @t's copy in @tier its space (pieces of the job's
 * segments, or NVMe extents) and count it.  -ENOSPC with *@ret_why set
 * when it does not fit; the caller may make room and try again.  An NVMe
 * copy beyond its job's unused guarantee must leave nvme_kept() free
 * (SPACE_NVME_KEPT); one within it (a job that claims it) always may.
 */
int copy_alloc(Tensor *t, int tier, SpaceShort *ret_why);
/*
 * The bytes @t's job must free in @tier before @t's copy fits its limit
 * there: the copy's size, or more while the job uses more than its limit,
 * or its uid's or a group's jobs more than their total (a quota lowered
 * below their use: tierctl quota set, a reload).
 */
uint64_t copy_room_needed(const Tensor *t, int tier);
/* Give the space back (no I/O, no state change). */
void copy_release(Tensor *t, int tier);
/*
 * copy_restore_nvme() - @t's NVMe copy is @ext (@n extents, reserved in
 * the targets' allocators, crc32c set; taken over), holding t->version:
 * resident and counted, as the NVMe index found it at start.
 */
int copy_restore_nvme(Tensor *t, NvmeExtent *ext, uint32_t n);
/*
 * space_explain() - the sentence for @why, with the figures, in @buf, and
 * the status the client gets: -EFBIG (never fits), -EDQUOT (over the job's
 * limit: raise it), -ENOSPC (the job's own space: free or unpin), -EAGAIN
 * (held by other jobs: retry later).
 */
int space_explain(const Tensor *t, int tier, SpaceShort why, char *buf, size_t size);

/* Count space the copy of @t in @tier takes (@delta > 0) or gives back, for its job and in all. */
void copy_account(Tensor *t, int tier, int64_t delta);
/* The copy was used now: most recently used in its tier's LRU list, and in its job's. */
void copy_touch(Tensor *t, int tier);
/* Set the state of @t's copy in @tier: the one way to, so that Job.draining stays true. */
void copy_set_state(Tensor *t, int tier, CopyState state);
/* Release a copy's space (no I/O); tells the ops' space_freed(). */
void copy_free(Tensor *t, int tier);
/* Free the copies that no longer hold the newest data and are not in use. */
void tensor_free_stale(Tensor *t);
/*
 * copy_locate() - the piece of @c that holds byte @pos of the tensor, and
 * in *@ret_off the offset of that byte in the piece's segment; *@ret_len:
 * how many bytes from there on lie in the same piece.
 */
const CopyPiece *copy_locate(const Copy *c, uint64_t pos, uint64_t *ret_off, uint64_t *ret_len);
/* Address of byte @pos of a host (or emulated VRAM) copy in tierd's own mapping of its segment. */
uint8_t *copy_addr(const Copy *c, uint64_t pos);

/*
 * A commit (the rooms above check that nothing is pinned for writing):
 * what each tensor of @j holds now is what job_rollback() brings back,
 * until the next commit.  The images kept of the last one go.  @step is
 * the client's number for it (job_commit() keeps it, the NVMe index too).
 */
void job_commit(Job *j, uint64_t step);
/*
 * tensor_commit_dead() - @t, which job_commit() committed as it is, counts as dead at that commit
 * (Tensor.commit_dead), made so by the plan of rank @rank - 1, whose hold writes it whole next: a
 * rollback makes it dead again, after a restart too (the NVMe index is told, book_commit_dead()).
 */
void tensor_commit_dead(Tensor *t, uint32_t rank);
/*
 * job_rollback() - every tensor of @j written since its last commit gets
 * that commit's data back (its kept NVMe image; zeros for one never
 * written then); *@ret_rolled: how many; *@ret_lost: how many had none
 * to go back to (lost).  Nothing changes when it fails: -EBUSY when one is
 * pinned or a request is on one (@why says which), -EAGAIN when none is
 * but one is in a transfer (it ends on its own: try again then).
 */
int job_rollback(Job *j, unsigned *ret_rolled, unsigned *ret_lost, char *why, size_t why_size);
/*
 * job_commit_refused() - -EBUSY (@why says which) when a tensor of @j is held
 * for a client of before tierd restarted (Tensor.ghost): that copy was being
 * written, and a write-only one may yet go back to the version before
 * (job_release_ghosts()), below what a commit would record.  Else 0.
 */
int job_commit_refused(const Job *j, char *why, size_t why_size);
/*
 * job_rollback_refused() - -EBUSY (@why says which) when a tensor of @j is
 * pinned, or @busy (a tensor of @j a request is on; NULL: none) is given:
 * job_rollback()'s refusals, for a caller that must know them before it
 * changes anything (engine_rollback()).  Else 0.
 */
int job_rollback_refused(const Job *j, const Tensor *busy, char *why, size_t why_size);
/*
 * Before @t is written (a pin that may write it): true when its committed
 * data would then be gone, because it lies in memory only; the engine
 * writes it to NVMe first.
 */
bool tensor_needs_image(const Tensor *t);
/* Pins that may write @t now, in all its tiers (Copy.writers). */
unsigned tensor_writers(const Tensor *t);
const char *tensor_lost_reason(const Tensor *t);

/* Drop one pin; @dirty: the client wrote this copy (copies below become stale).  -ENOENT: not pinned. */
int tensor_unpin(Tensor *t, int tier, bool dirty);
/*
 * Count (delta > 0) or uncount a pin of @t in @tier; the job's and the daemon's "pinned" bytes have
 * the copy's bytes once while at least one counted pin holds it (Copy.pins_counted).
 */
void tensor_pin_account(Tensor *t, int tier, int delta);
/*
 * A pin of rank @rank that may write @t's copy in @tier is taken (@delta > 0) or let go: the memory store
 * records it first.  A rank whose last such pin went is no longer one of Copy.write_ranks (once more ranks
 * than fit held it at once, RANK_SET_MANY, until it has no writer).
 */
void copy_writers(Tensor *t, int tier, int delta, uint32_t rank);
/* Add @rank to @s (RANK_SET_MANY once more than fit). */
void rank_set_add(RankSet *s, uint32_t rank);
/*
 * The ranks whose processes may write @t's copy in @tier, its writers' (Copy.write_ranks) and its
 * ghost's, into @rank; their RankSet.n.
 */
uint8_t copy_write_ranks(const Tensor *t, int tier, uint32_t rank[RANK_SET_MAX]);
/* @t's memory copies changed (state, version, pieces): the memory store's record follows now. */
void tensor_note(Tensor *t);
/*
 * job_release_ghosts() - a client of @j, rank @rank, said Hello: the pins
 * kept for the clients of before tierd's restart (Tensor.ghost, memstore.c)
 * that waited for that rank only go, and their copies count as written: a
 * process of another rank of before may still be writing into the room
 * through its mapping, so a copy stays pinned until every rank that held it
 * for writing (Tensor.ghost_ranks) said Hello, or the job ends.  A copy a
 * write-only pin reserved (Tensor.ghost_unwritten) holds garbage unless a
 * writer got the grant: a Hello that says which writes its client holds
 * (@says) and whose @held(t, tier, @userdata) names it makes it written, one
 * that does not say too; once its ranks are all back and none did, it goes
 * and the tensor is back at the version before, where its NVMe copy holds it
 * (or it was never written: zeros), else lost.  A ghost of a table of before
 * the ranks were kept (ghost_ranks n 0) goes at any rank's Hello (a
 * write-only pin's: at Tensor.ghost_rank's, or any without @says).
 */
void job_release_ghosts(Job *j, bool says, uint32_t rank, bool (*held)(const Tensor *t, int tier, void *userdata),
                        void *userdata);
