/* SPDX-License-Identifier: MIT */
/* plan.h: a rank's iteration plan: phases, accesses, next-use indexes, the shared page, predictions. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base/level.h"
#include "util/list.h"

typedef struct Job Job;
typedef struct Op Op;
typedef struct Plan Plan;
typedef struct PlanPage PlanPage;
typedef struct Sched Sched;
typedef struct Tensor Tensor;
typedef struct sd_event_source sd_event_source;

/*
 * A plan as a rank asked for it, before plan_new() checks it: the accesses
 * of phase 0, then of phase 1, ... (daemon/ipc/rpc.c translates the wire's
 * SubmitPlan into this; the scheduler never sees wire types).
 */
typedef struct PlanSpecAccess {
        uint32_t phase;         /* < PlanSpec.n_phases, never less than the access's before it */
        uint64_t tensor;        /* the tensor's id in the job */
        int tier;               /* a Level: plan_new() accepts LEVEL_VRAM and LEVEL_HOST */
        uint32_t mode;          /* PLAN_READ | PLAN_WRITE */
} PlanSpecAccess;

typedef struct PlanSpec {
        size_t n_phases;
        PlanSpecAccess *acc;
        size_t n_acc;
} PlanSpec;

/* What tierctl status shows of a plan. */
typedef struct PlanStats {
        uint32_t phase;         /* of the latest marker (0 before the first) */
        uint32_t phases;
        uint64_t iterations;
        double step_s;          /* predicted step: the sum of the phases' averages */
        double stall_s;         /* the client's stall in the last step */
        double last_step_s;
        double stall_total_s;   /* the client's own counter (its page): shown, never trusted */
} PlanStats;

typedef struct PlanAcc {
        Tensor *tensor;
        uint32_t slot;          /* distinct-tensor index */
        uint8_t tier;
        uint8_t mode;           /* PLAN_READ | PLAN_WRITE */
} PlanAcc;

typedef struct PlanPhase {
        PlanAcc *acc;
        uint32_t n_acc;
        uint64_t ema_ns;        /* learned duration */
        uint32_t samples;
} PlanPhase;

/* A set of phase pins: what one marker's phase holds. */
typedef struct PlanHold {
        bool active;
        uint64_t seq;           /* the marker this hold is for */
        uint32_t phase;
        uint32_t n_pinned;
        bool ready_sent;
        bool kept_said;         /* its wait for room kept for other jobs' guarantees was logged */
        int refused;            /* -errno: its marker is refused in the pass (plan_self_pinned()), */
        bool refused_told;      /* and was (its pins let go): it holds nothing until the next marker */
} PlanHold;

/* Who a hold's pin op is for (its userdata). */
typedef struct PinCtx {
        Plan *plan;
        int hold;
        uint32_t idx;
        int link;
} PinCtx;

/* Per-hold bookkeeping, one entry per access of the held phase (sized by the plan's largest phase). */
typedef struct HoldState {
        bool *pinned;
        Op **ops;
        PinCtx *ctx;
        uint64_t *blocked;      /* epoch in which the pin found no space */
} HoldState;

/*
 * What a plan asks of its connection (ipc/fence.c), which the scheduler does
 * not see: the pins it holds outside the plan, and telling its client that
 * the phase of a marker is refused.
 */
typedef struct PlanOwnerOps {
        /* The @i-th pin slot of the connection (a tensor may come twice; a free slot: NULL in tier -1); false past the last. */
        bool (*pin)(void *owner, size_t i, Tensor **ret_tensor, int *ret_tier);
        /* The phase of marker @seq is refused with @status (-errno), @error saying why. */
        void (*refused)(void *owner, uint64_t seq, uint32_t phase, int status, const char *error);
} PlanOwnerOps;

/* Classes of the next-use index: accesses in vram, in vram or host (a vram access stages through host), in host. */
enum { USE_VRAM, USE_ANY, USE_HOST, _USE_MAX };

struct Plan {
        Sched *sched;
        Job *job;
        int efd;                /* the rank's wakeup pipe (write end); borrowed: its connection frees the plan first */
        uint32_t rank;          /* its connection's Hello's (the memory store records who may write a copy) */
        uint64_t conn_id;       /* its connection's id: names the plan in the metrics when rank_shared */
        bool rank_shared;       /* another plan of its job had the rank when it was submitted (plan_set_owner()) */
        List link;              /* Sched.plans */
        List job_link;          /* Job.plans */
        PlanPhase *phases;
        uint32_t n_phases;
        PlanAcc *acc_storage;
        uint32_t n_acc;
        Tensor **slots;         /* distinct tensors, by slot */
        uint32_t n_slots;
        /* next-use index (CSR): for slot s and tier class c (USE_*), the phases
         * that use it are use_phase[c][use_off[c][s] .. use_off[c][s+1]) */
        uint32_t *use_off[_USE_MAX];
        uint32_t *use_phase[_USE_MAX];
        /* every phase touching slot s, any tier: acc_phase/acc_mode[acc_off[s] .. acc_off[s+1]) */
        uint32_t *acc_off;
        uint32_t *acc_phase;
        uint8_t *acc_mode;
        /* for entry i of acc_phase, the slot's access there in vram and in host: acc_where[2 * i + (tier ==
         * LEVEL_HOST)] indexes that phase's acc[] (UINT32_MAX: none; a phase has one per slot and tier) */
        uint32_t *acc_where;

        int page_fd;
        PlanPage *page;         /* shared with the client, who may write all of it: nothing read back but its area */
        uint64_t page_size;
        uint32_t *first_piece;  /* per slot and tier (2 * slot + tier): its stretch of the page's pieces */
        int error;              /* != 0: the plan failed (plan_set_error(); the page's copy is the client's to write) */
        int marker_fd;
        sd_event_source *marker_source;

        uint64_t seq;           /* latest marker seen */
        uint32_t cur;           /* its phase (UINT32_MAX before the first marker) */
        uint64_t cur_mark_ns;
        PlanHold hold[2];       /* [0]: the current marker's phase, [1]: pinned ahead */
        HoldState hs[2];
        uint32_t max_acc;       /* accesses of the largest phase (HoldState sizes) */
        uint64_t *pred;         /* predicted start of phase cur+n, n = 0..n_phases */
        uint8_t *wmark;         /* per slot: counted in the vram (bit 0) / host (bit 1) / both together (bit 2) window */
        uint32_t window[2];     /* phases ahead whose working set fits vram / host (admit.c plan_window()) */
        uint64_t need[2];       /* bytes those phases and the one after bring into vram / host */
        uint32_t horizon;       /* phases ahead the reads must reach (admit_horizon()) */
        uint64_t horizon_ns;    /* predicted start of that phase (0: none) */
        /* admission (admit.c): scratch of one simulation */
        uint64_t *sim_avail;    /* per relative phase: bytes that become victims before the candidate */
        uint32_t *sim_stamp;    /* per slot: counted in simulation sim_gen */
        uint32_t sim_gen;
        uint64_t sim_now_pass[2];       /* per tier: the pass in which a prefetch found no room now, */
        uint32_t sim_now_ahead[2];      /* for a use this many phases ahead */
        uint64_t sim_now_size[2];       /* and of this size */
        uint64_t admitted_pass;         /* the pass whose admitted prefetches admitted[] counts: */
        uint64_t admitted[2];           /* per tier, bytes they will take, not reserved yet (op_submit() queues) */
        /* moves per step (admit.c), per slot and tier (2 * slot + tier) */
        uint64_t *move_step;    /* iter_start_ns + 1 of the step it last moved there in */
        bool *move_used;        /* that copy served a pin since */
        uint16_t *move_refetch; /* prefetches of it there this step whose copy went before its use */
        uint64_t moves_repeated; /* moves again in one step, with their reason (a pin, a use between) */
        uint64_t moves_refetched; /* of them, prefetches whose copy of the step was evicted before use */
        uint64_t admit_refused; /* prefetches the occupancy simulation did not admit */

        uint64_t iterations;
        uint64_t iter_stall_ns; /* client's stall counter at the last iteration start */
        uint64_t iter_start_ns;
        uint64_t iter_links[_LINK_MAX]; /* job link counters at the last iteration start */
        double last_stall_s;
        uint64_t last_step_links[_LINK_MAX];
        double last_step_s;
        char waiting[640];      /* why a pin of hold waiting_seq's phase waits (plan_pin_waits()), for status */
        char refused_why[768];  /* why hold 0's marker is refused (PlanHold.refused) */
        const PlanOwnerOps *owner_ops;  /* its connection's (plan_set_owner_ops()), or NULL: no pins of its own */
        void *owner;
        uint64_t waiting_seq;
        bool attached;          /* counted in the slots' plan_refs, in Sched.plans and Job.plans */
        uint32_t trace_id;      /* its number in traces (Trace.next_plan) */
};

/*
 * plan_new() - validate @spec against job @j (tensors exist, tiers, modes,
 * sizes, limits, and that the phases fit the job's quota: one phase at a
 * time, two consecutive ones when @pairs, as the timeline policy pins the
 * next phase while the current one runs), build its indexes, its shared
 * page and its marker eventfd.  Linear in the size of @spec.  On failure
 * @error says why.  The plan is not attached to anything yet (sched.c
 * does that).
 */
int plan_new(Sched *s, Job *j, int efd, const PlanSpec *spec, bool pairs, Plan **ret, char *error,
             size_t error_size);
/* Free a plan that is detached (sched_plan_free() detaches first). */
void plan_free(Plan *p);

/* The phase of the latest marker, or the last one before the first marker (so that phase 0 is next). */
static inline uint32_t plan_cur(const Plan *p) {
        return p->cur == UINT32_MAX ? p->n_phases - 1 : p->cur;
}
/* Learned duration of phase @ph (a default until it has been timed). */
uint64_t plan_phase_ns(const Plan *p, uint32_t ph);
/* Fill pred[]: the predicted start of each phase from the current one on. */
void plan_predict(Plan *p, uint64_t now);
/*
 * The queries below are about a tensor of @p's own (t->plan == p: t->plan_slot is its slot there);
 * any other tensor reads past the indexes.
 * Predicted time of the next use of @t in class @c (USE_*) by @p after its current phase; UINT64_MAX: none.
 */
uint64_t plan_next_use_class(const Plan *p, const Tensor *t, int c);
/*
 * Does the current phase still have to pin a read of @t in class @c (not
 * pinned yet: a read deferred because the phase before wrote @t in the other
 * tier, one whose pin waits for room or a link, or one not granted yet after
 * the marker)?  Such a use is now, not a cycle later.
 */
bool plan_cur_read_pending(const Plan *p, const Tensor *t, int c);
/*
 * The same by a walk of the whole current phase: for a tensor not of @p's own, and the reference the
 * tests (unit plan, fuzz plan) hold the lookup to.
 */
bool plan_cur_read_pending_walk(const Plan *p, const Tensor *t, int c);
/* Predicted next use of @t's copy in @tier (vram, or host and what stages through it). */
uint64_t plan_next_use(const Plan *p, const Tensor *t, int tier);
/* Does phase @phase alone fit its job's limit in @tier and every total the job is held to (a -EDQUOT may pass)? */
bool plan_phase_fits_totals(const Plan *p, uint32_t phase, int tier);
/*
 * A pin of hold @h's access @a failed with @status (@error: the engine's
 * reason): does it wait (true: retried once something is freed, unpinned or
 * moves), or did the plan fail (false: plan_set_error() done)?  A pin refused
 * for room kept for other jobs' guarantees (@kept) fails the plan when its
 * phase can never be pinned while those jobs run (engine_pins_fit_kept()),
 * and its wait is logged once per hold, at warning level, otherwise.
 */
bool plan_pin_waits(Plan *p, int h, const PlanAcc *a, int status, const char *error, bool kept);
/* Why the phase @p's rank entered (its latest marker's, not ready) waits for room now, for tierctl status; or NULL. */
const char *plan_waiting(const Plan *p);
/* Mode of the first access of @t in the phases after @from (and in @from too if @inclusive); 0: none. */
uint8_t plan_next_access_mode(const Plan *p, const Tensor *t, uint32_t from, bool inclusive);

/* The page: tell the rank that marker @seq's phase may run, that the plan failed, where a slot's copy is. */
/* ondemand: after @done_phase, what it used and @next_phase does not goes back down to NVMe. */
void plan_release_after_use(Plan *p, uint32_t done_phase, uint32_t next_phase);
/* After @done_phase, drop the copies of its tensors whose next planned access overwrites them whole. */
void plan_drop_dead(Plan *p, uint32_t done_phase);
/* Tell the other plans (sched_tensor_changed()) what @p's holds unpinned as written: after a release. */
void plan_notify_written(Plan *p);
/*
 * Is every pin that may write @t one of its plan's holds, for a phase that
 * writes it whole (PLAN_WRITE alone), and is that plan the only one naming
 * it?  Then its bytes are being replaced as the plan said, and a commit keeps
 * it as dead (commit.c); another plan may read them meanwhile.
 */
bool plan_holds_overwrite(const Tensor *t);
/*
 * At debug level: which of the plan's tensors have a current copy in each
 * tier as its phase starts ('*': the only current copy), on one line of at
 * most 1 KiB.
 */
void plan_log_residency(const Plan *p);
void plan_set_ready(Plan *p, uint64_t seq, uint32_t phase);
void plan_set_error(Plan *p, int error, const char *what);
void plan_slot_publish(Plan *p, const PlanAcc *a);
/* The client's newest marker as written (not consumed, not range-checked): its seq and phase, never torn. */
void plan_peek_marker(const Plan *p, uint64_t *ret_seq, uint32_t *ret_phase);
/* Read the client area after a marker: 0 with the new marker, -EAGAIN for nothing new, -EINVAL for a bad one. */
int plan_read_marker(Plan *p, uint64_t now, uint64_t *ret_seq, uint32_t *ret_phase, uint64_t *ret_mark);
/* A marker of @phase arrived at @mark: learn the duration of the phase that ended, count iterations. */
void plan_learn(Plan *p, uint64_t seq, uint32_t phase, uint64_t mark);

/*
 * Record whose plan @p is: the @rank and id @conn_id of its connection.  Its
 * job's plans are one per connection, not one per rank (two clients may say
 * the same rank): rank_shared tells whether another plan of the job had
 * @rank at this moment, for good, so that a plan's name in the metrics never
 * changes while it lives.  After sched_plan_new() attached it.
 */
void plan_set_owner(Plan *p, uint32_t rank, uint64_t conn_id);
/* Record what @p asks of its connection: @ops with @owner (both borrowed until plan_free()). */
void plan_set_owner_ops(Plan *p, const PlanOwnerOps *ops, void *owner);
/*
 * plan_self_pinned() - a pin of hold @h's access @a found no room: is that
 * hold's phase, one its client entered (@h 0), one that can never be pinned
 * while the pins its own connection holds outside the plan stay (they with
 * the phase's pins in that tier exceed the job's limit, a total, or what the
 * tier leaves beside the other live jobs' guarantees; or their copies leave
 * the phase's no place in the segments the job may have: fragmented; or,
 * @a read in VRAM with its data only on NVMe, they leave it no room in
 * host to come up through, by the same rules)?  Waiting would hang
 * the client, the only one who can unpin them, in tier_phase_enter(): then
 * the hold is marked refused (-ENOSPC, why in refused_why, the pins named),
 * logged, and the engine kicked for the pass that refuses it
 * (plan_refuse()).  Pins of other connections, ranks of the job or not, are
 * waited for.  (daemon/sched/selfpin.c)
 */
bool plan_self_pinned(Plan *p, int h, const PlanAcc *a);
/*
 * The pass let hold 0's refused pins go: tell the client that its marker
 * @seq of @phase is refused.  The plan lives on; the client may unpin and
 * enter a phase again.
 */
void plan_refuse(Plan *p, uint64_t seq, uint32_t phase, int status);
/* What tierctl status shows of @p. */
void plan_stats(const Plan *p, PlanStats *ret);
