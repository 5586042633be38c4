/* SPDX-License-Identifier: MIT */
/* engine.h: the op engine: bringing copies up, writing them down, making space, the transfers. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base/level.h"
#include "daemon/engine/trace.h"
#include "util/list.h"

typedef struct Engine Engine;
typedef struct Job Job;
typedef struct Csum Csum;
typedef struct NvmeTier NvmeTier;
typedef struct Registry Registry;
typedef struct Tensor Tensor;
typedef struct Uring Uring;
typedef struct VramBackend VramBackend;
typedef struct sd_event sd_event;
typedef struct sd_event_source sd_event_source;

typedef enum OpKind {
        OP_PIN,
        OP_PREFETCH,
        OP_EVICT,
        OP_DRAIN,               /* internal: write a victim down, then drop it */
        OP_CLEAN,               /* internal: write a sole copy down, keep it (write-behind) */
        _OP_KIND_MAX,
        _OP_KIND_INVALID = -22,
} OpKind;

typedef enum OpWait {
        OP_WAIT_NONE,
        OP_WAIT_RUN,            /* in Engine.run_queue */
        OP_WAIT_TENSOR,         /* in Tensor.waiters */
        OP_WAIT_SPACE,          /* in Engine.space_waiters */
        _OP_WAIT_MAX,
        _OP_WAIT_INVALID = -22,
} OpWait;

typedef struct Op Op;
struct Op {
        Engine *engine;
        OpKind kind;
        Tensor *tensor;
        int tier;
        OpWait wait;
        List wait_link;
        List all_link;          /* Engine.ops, for cancellation */
        bool pinned;            /* a pin op that already holds its pin */
        bool reserved_sent;     /* the reserved() callback ran */
        int failed;             /* -errno of a transfer this op waited for */
        uint64_t deadline_ns;   /* when the data is needed (0: now); victims must be needed later */
        bool no_wait;           /* fail with -EAGAIN instead of waiting for space */
        bool discard;           /* pin for a write-only access: reserve, do not bring the old bytes */
        /*
         * A pin that may write: its job's commit needs an image first (tensor_needs_image()), and it is
         * granted only once no transfer of the tensor runs (one reads the copy it would write)
         */
        bool write;
        bool internal;          /* tierd's own (drain, write-behind, a scheduler's prefetch): no client waits */
        uint32_t plan_rank1;    /* a plan hold's pin: its plan's rank + 1 (a dead tensor it reads: zeros); else 0 */
        bool kept;              /* a pin refused -EAGAIN for room kept for others' guarantees (engine_pin_check()) */
        /* Called once when the op ends (status 0 or -errno); the op is freed after. */
        void (*complete)(Op *op, int status, const char *error);
        /* Pin ops only: called once the destination is reserved (the grant is known). */
        void (*reserved)(Op *op);
        /* Called instead of complete() when the op is cancelled (its owner's bookkeeping). */
        void (*cancelled)(Op *op);
        void *userdata;
        char error[512];        /* reason text for a failure */
};

typedef struct LinkStats {
        uint64_t bytes;
        uint64_t ops;
} LinkStats;

/*
 * What the engine asks the scheduler (daemon/sched registers these with
 * engine_set_sched(), so the engine never calls up).  Every member may be
 * NULL: then victims stay least recently used first, nothing is "dead",
 * nothing is charged, and there is no pass.
 */
typedef struct EngineSchedOps {
        /*
         * Order the victim candidates @cands (engine_victims(): least
         * recently used first) in @tier for eviction.  The contract every
         * implementation keeps and every caller relies on: @cands is
         * reordered in place and k, the count returned, splits it:
         * cands[0..k) are the copies that may go, best victim first;
         * cands[k..n) are those needed no later than @deadline_ns (0: none
         * is), which must stay, in any order.  It cannot fail: short of
         * memory to rank them, the victims keep their order (still only
         * those that may go).
         */
        size_t (*victim_order)(void *userdata, int tier, Tensor **cands, size_t n, uint64_t deadline_ns);
        /*
         * The victims victim_order() would return, in its order, passed to
         * @take one at a time until @take returns non-zero (< 0: an error,
         * returned; else 0).  For a caller that takes a few of many: what is
         * not taken need not be ordered (make_space()).  NULL: victim_order().
         */
        int (*victim_take)(void *userdata, int tier, Tensor **cands, size_t n, uint64_t deadline_ns,
                           int (*take)(void *ctx, Tensor *t), void *ctx);
        /*
         * Does victim_order() keep every candidate in its order, whatever the
         * deadline (lru, ondemand)?  Then make_space() walks the job's LRU list
         * and stops once it has the room, instead of listing every candidate.
         * NULL: no.
         */
        bool (*victims_lru)(void *userdata, int tier);
        /* Is @t's next planned access write-only (its bytes need not be kept)?  true: it is dropped as dead */
        bool (*overwrites_next)(void *userdata, Tensor *t);
        /* Charge @j's fair share for @bytes of link time the engine spends for it (drains). */
        void (*charge)(void *userdata, Job *j, uint64_t bytes);
        /* Data moved or space was freed: what the scheduler waited for may be possible now. */
        void (*changed)(void *userdata);
        /* One scheduling pass; runs after the run queue, whenever the engine runs. */
        void (*pass)(void *userdata);
        /* Predicted time of @t's next planned use in @tier or above (0: none known); for the trace. */
        uint64_t (*next_use)(void *userdata, Tensor *t, int tier);
} EngineSchedOps;

/* The VRAM link, per VramDir: at most VramBackend.depth copies with the backend, the rest queued by fair tag. */
typedef struct VramLink {
        List waiting[2];        /* XferStep.vlink, by fair tag */
        unsigned active[2];     /* steps with the backend */
        double vtime[2];        /* virtual time */
} VramLink;

struct Engine {
        sd_event *event;
        sd_event_source *run_source;    /* defer: runs queued ops once the current handler returns */
        Registry *registry;             /* borrowed, like the tiers below */
        Uring *uring;
        Csum *csum;             /* borrowed, set by the manager: NVMe extents' crc32c off the loop; NULL: on it */
        NvmeTier *nvme;
        VramBackend *vram;
        const EngineSchedOps *sched;
        void *sched_userdata;

        List ops;               /* Op.all_link: every op, for cancellation */
        List run_queue;         /* Op.wait_link: ops to advance */
        List space_waiters;     /* Op.wait_link: ops waiting for space */
        List xfers;             /* Xfer.link: transfers in flight (or waiting for the VRAM link) */
        unsigned n_xfers;
        uint64_t runs;          /* engine_run() calls so far (status: an idle tierd does not spin) */
        uint64_t victim_steps;  /* copies looked at choosing victims (victims.c; the tests count the work) */
        LinkStats links[_LINK_MAX];
        VramLink vlink;
        /*
         * Bumped whenever room may have appeared in a tier (a copy freed or
         * unpinned, a limit changed): a victim whose drain found no room below is not
         * drained again before the tier below changes (Tensor.drain_blocked).
         */
        uint64_t space_gen[TIERS];
        char drain_error[TIERS][512];   /* why the last drain out of each tier failed */
        Trace trace;            /* tierctl trace: recorded here and by the scheduler (trace.c) */
        /*
         * Tests only (NULL in tierd): told of each piece of a chained
         * NVMe -> host -> VRAM transfer: @link LINK_NVME_TO_HOST when extent
         * @piece is read and checksummed (@done true), LINK_HOST_TO_VRAM when
         * its VRAM copy starts (@done false) and ends (@done true).
         */
        void (*piece_observer)(void *userdata, const Tensor *t, LinkDir link, uint32_t piece, bool done);
        void *piece_observer_userdata;
};

/*
 * engine_new() - the op engine over @registry and the tiers (all borrowed:
 * they outlive it); it registers itself as the registry's ops.
 */
int engine_new(sd_event *event, Registry *registry, Uring *uring, NvmeTier *nvme, VramBackend *vram, Engine **ret);
/*
 * engine_free() - cancel every op (no callback but cancelled() runs) and
 * free the engine.  Transfers still in flight are abandoned (logged) and
 * freed: call it only once nothing can complete them any more, after
 * vram_backend_stop() and uring_free(), and before the registry goes.
 */
Engine *engine_free(Engine *e);
void engine_set_sched(Engine *e, const EngineSchedOps *ops, void *userdata);

/* Run the engine (and the scheduler's pass) once the current event handler returns. */
void engine_kick(Engine *e);
/* Advance queued ops until none is runnable, run the scheduler's pass, and again (the run source). */
void engine_run(Engine *e);

/* Create and queue an op.  It holds a reference on @t until it completes. */
int op_submit(Engine *e, OpKind kind, Tensor *t, int tier,
              void (*complete)(Op *, int, const char *), void (*reserved)(Op *), void *userdata, Op **ret);
/* Forget an op (its client is gone): complete() does not run, cancelled() does; a pin it took is dropped. */
void op_cancel(Op *op);
/* Cancel every op on a tensor of @j. */
void engine_cancel_job(Engine *e, Job *j);
/*
 * Free @t for its job (tensor_free()): tierd's own ops on it (Op.internal:
 * drains, write-behind, a scheduler's prefetch) are cancelled first; -EBUSY
 * while it is pinned, a client's request on it is in flight or a plan names it.
 */
int engine_tensor_free(Engine *e, Tensor *t);
/*
 * Cancel tierd's own ops (Op.internal) on every tensor of @j, for a
 * rollback: a transfer one of them started runs to its end (Tensor.xfer),
 * and ops that waited for room they would have made look again.
 */
void engine_cancel_internal(Engine *e, Job *j);
/*
 * engine_rollback() - job_rollback() of @j once tierd's own ops on its
 * tensors are cancelled (engine_cancel_internal()); but a rollback refused
 * for a pin or a client's request (-EBUSY) is refused before that, so that
 * it changes nothing, not even tierd's own work.  -EAGAIN as job_rollback()
 * (a transfer is in flight: the caller waits and tries again).
 */
int engine_rollback(Engine *e, Job *j, unsigned *ret_rolled, unsigned *ret_lost, char *why, size_t why_size);
/* Space was freed outside the op engine (a revoked segment is back): let waiting ops retry. */
void engine_wake_space_waiters(Engine *e);
/* Limits or capacities changed (a quota, a reload): ops waiting for space and victims that could not be written down try again. */
void engine_limits_changed(Engine *e);

/*
 * A job's claim on room changed (its last connection went: its guarantees count for no one, the NVMe room
 * kept for its nvme_min too): ops and the scheduler's pins waiting for room, and victims whose write-down
 * was refused, retry.
 */
void engine_claims_changed(Engine *e);

/*
 * engine_pin_check() - may @t's copy in @tier (its pieces placed) be pinned,
 * or would that take room kept for the guarantees of other live jobs
 * (reclaim.c)?  What a job pins beyond its own guarantee comes out of the
 * room the live jobs' guarantees leave: per tier, the sum over them of
 * max(segments holding a pinned copy or one being filled, guarantee) stays
 * within the capacity.  A copy with no room yet counts for the least it can
 * take wherever its room is made (the job's pinned bytes and its own, in
 * whole segments), so that a pin refused anyway is refused before anything is
 * evicted for it.  0 (a pin within the job's guarantee always is), or
 * -EAGAIN with @buf (may be NULL) naming the jobs the room is kept for, or
 * -ENOMEM.
 */
int engine_pin_check(const Engine *e, const Tensor *t, int tier, char *buf, size_t size);
/* The same for room reclaim would take from another job for @t's copy (none placed): a segment more. */
int engine_pin_check_reclaim(const Engine *e, const Tensor *t, int tier, char *buf, size_t size);
/*
 * engine_pins_fit_kept() - can job @j ever hold pins of @bytes in @tier at
 * once (a plan's phase) while the other live jobs' guarantees are kept?  0,
 * or -ENOSPC with @buf (may be NULL) saying why not, naming those jobs: what
 * it pins beyond its own guarantee, in whole segments, and their guarantees
 * exceed the capacity, whatever is unpinned meanwhile (reclaim.c).
 */
int engine_pins_fit_kept(const Engine *e, const Job *j, int tier, uint64_t bytes, char *buf, size_t size);

/*
 * engine_job_share() - @j's share of @tier now (reclaim.c): its weighted part
 * of the capacity among the jobs with a connection, at least its guarantee,
 * at most its limit; 0 for a lingering job.  Above it, its copies may be
 * taken back for a job below its own.
 */
uint64_t engine_job_share(const Engine *e, const Job *j, int tier);

/*
 * Did writing @v's copy in @tier down fail (a drain, a write-behind), with
 * no room freed below since?  Writing it again would fail the same way.
 */
bool engine_drain_blocked(const Engine *e, const Tensor *v, int tier);
/* Can @t's copy in @tier go now: resident, and nothing pins it, moves it or works on it (an op)? */
bool engine_copy_evictable(const Tensor *t, int tier);
/*
 * engine_victims() - the candidate victims of job @j in @tier: its copies
 * there that may go now (engine_copy_evictable()), least recently used
 * first (Job.lru), @except (NULL: none) left out.  The one candidate set of every
 * choice of victims: the engine's make_space() and reclaim, the
 * scheduler's admission and write-behind, which then order it with
 * EngineSchedOps.victim_order.  Returns how many; *@ret is a new array (to
 * free()) with room for one more.  -ENOMEM.
 */
int engine_victims(Engine *e, const Job *j, int tier, const Tensor *except, Tensor ***ret, size_t *ret_n);
