/* SPDX-License-Identifier: MIT */
/* sched.h: the shared scheduling timeline: holds, deadlines (EDF), prefetch, write-behind, victims, fair share. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/macro.h"
#include "util/list.h"

typedef struct Config Config;
typedef struct Engine Engine;
typedef struct Job Job;
typedef struct Plan Plan;
typedef struct Registry Registry;
typedef struct Sched Sched;
typedef struct Tensor Tensor;
typedef struct PlanSpec PlanSpec;
typedef struct Uring Uring;
typedef struct VramBackend VramBackend;
typedef struct sd_event sd_event;

/* Links the scheduler keeps a few transfers in flight on, per job. */
enum { SCHED_LINK_NVME, SCHED_LINK_PCIE, _SCHED_LINK_MAX };

/* Called for every transfer the scheduler starts ("pin", "prefetch", "clean"); for tests and tracing. */
typedef void (*SchedTrace)(void *userdata, const char *what, const Tensor *t, int tier, uint64_t deadline_ns);

struct Sched {
        sd_event *event;
        const Config *config;   /* borrowed: [sched] policy */
        Registry *registry;     /* borrowed, like the rooms below */
        Engine *engine;
        Uring *uring;
        VramBackend *vram;

        List plans;             /* Plan.link */
        bool stopping;          /* sched_stop(): no phase is held or pinned ahead any more */
        bool in_run;
        uint64_t pass_no;
        uint64_t epoch;         /* bumped whenever space may have been freed or data moved */
        uint64_t stamp;         /* the latest Tensor.sched_stamp handed out (selfpin.c) */
        uint64_t admit_sims;    /* occupancy replays admit_survives() ran, in all (for the tests) */
        uint64_t victim_cmps;   /* comparisons of two victims (victim.c), in all (for the tests) */
        uint64_t pending_looks; /* accesses plan_cur_read_pending() looked at (plan.c), in all (for the tests) */
        SchedTrace trace;
        void *trace_userdata;
};

/* The scheduler over @engine (registered as its EngineSchedOps); everything is borrowed. */
int sched_new(sd_event *event, const Config *config, Registry *registry, Engine *engine, Uring *uring,
              VramBackend *vram, Sched **ret);
/* Frees every plan (their pins go, dirty where they write). */
Sched *sched_free(Sched *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(Sched *, sched_free);
void sched_set_trace(Sched *s, SchedTrace trace, void *userdata);

/*
 * sched_plan_new() - validate and start a plan of job @j's rank: see
 * plan_new() for the checks (under the timeline policy two consecutive
 * phases must fit the job's limits, since the next phase is pinned while
 * one runs).  @efd: the write end of the rank's wakeup pipe, borrowed until
 * sched_plan_free().  On failure @error says why.
 */
int sched_plan_new(Sched *s, Job *j, int efd, const PlanSpec *spec, Plan **ret, char *error, size_t error_size);
/* End a plan: its pins go (written accesses dirty), its tensors may be freed again. */
void sched_plan_free(Plan *p);
/*
 * sched_plan_sync() - consume the marker the client wrote to @p's page
 * before its current request, if the marker's eventfd has not been read
 * yet.  tier_phase_enter() returns without a round trip, so the request a client
 * sends after it may reach tierd before the marker's eventfd wakes the
 * loop; the request layer calls this before dispatching every request of
 * a connection that runs a plan, so that a request never sees the previous
 * phase's pins (tier.h: phases and requests of one client keep their order).
 */
void sched_plan_sync(Plan *p);
/*
 * sched_tensor_changed() - a client wrote @t outside its job's plans (its
 * own pin, unpinned dirty), or another plan's hold unpinned it as written
 * (plan_notify_written()): a held phase not entered yet whose pin of
 * another tier's copy of @t now holds older data lets that pin go (the pass
 * brings the new version), its ready taken back until then, so that no
 * phase is said ready on stale data.
 */
void sched_tensor_changed(Sched *s, Tensor *t);
/*
 * Does @p hold a phase its client may be in (one tierd said is ready, or one
 * whose pins are coming)?  While stopping, only a phase said ready is held.
 */
bool sched_plan_holds(const Plan *p);
/*
 * sched_stop() - tierd stops: phases not said ready yet are let go (their
 * clients never wrote there), nothing is pinned ahead or prefetched any
 * more, and a marker lets the phase before go without holding the next: a
 * client leaves its plan at its next phase (libtier with reconnecting), or
 * finds its connection closed there.
 */
void sched_stop(Sched *s);

/* Run the scheduler: pins for the next markers, prefetch, write-behind.  Cheap when idle. */
void sched_run(Sched *s);

/* A transfer the scheduler could start in this pass. */
typedef struct SchedCand {
        Plan *plan;
        Job *job;
        Tensor *tensor;
        int tier;
        int hold;               /* 0: the current phase, 1: the next one, -1: a prefetch */
        uint32_t idx;
        uint64_t deadline;      /* CLOCK_MONOTONIC ns */
        uint32_t ahead;         /* a prefetch: phases from the current one to its use (admit.c) */
        int link;               /* SCHED_LINK_* */
        bool taken;
} SchedCand;

/* The selection rule (EDF, then fair share among colliding deadlines); see sched.c. */
size_t sched_pick(const SchedCand *c, size_t n, uint64_t now, const unsigned limit[]);

/*
 * sched_victim_order() - order the candidate copies in @tier for eviction.
 * @cands: tensors whose copy in @tier may be dropped or drained, least recently used first
 * @deadline_ns: when the requester needs its data; under the timeline policy
 *   only copies whose next use is later than that are returned
 * Returns how many of @cands remain, best victim first.
 */
size_t sched_victim_order(Sched *s, int tier, Tensor **cands, size_t n, uint64_t deadline_ns);
/*
 * sched_victim_take() - the victims sched_victim_order() would return, in its
 * order, passed to @take one at a time until it returns non-zero (< 0: an error,
 * returned); without ordering those never taken.  @cands is reordered.
 */
int sched_victim_take(Sched *s, int tier, Tensor **cands, size_t n, uint64_t deadline_ns,
                      int (*take)(void *ctx, Tensor *t), void *ctx);
/*
 * Write-behind's candidates: may it write @t's sole copy in @tier down now (no op of
 * the scheduler's on it, not cleaned at its version, a drain not blocked, not dead)?
 */
bool sched_may_clean(Sched *s, Tensor *t, int tier);
/*
 * sched_victim_order() with no deadline, for write-behind: 0 (@cands as they were)
 * when none of them is one it may write (sched_may_clean()): then it starts nothing
 * whatever their order, and sorting every copy of the job in each pass was for nothing.
 */
size_t sched_clean_order(Sched *s, int tier, Tensor **cands, size_t n);
/* EngineSchedOps.victim_order, .victim_take and .victims_lru (@userdata: the Sched). */
size_t sched_ops_victim_order(void *userdata, int tier, Tensor **cands, size_t n, uint64_t deadline_ns);
int sched_ops_victim_take(void *userdata, int tier, Tensor **cands, size_t n, uint64_t deadline_ns,
                          int (*take)(void *ctx, Tensor *t), void *ctx);
bool sched_ops_victims_lru(void *userdata, int tier);
/* When @t's copy in @tier is next needed, as the victim order sees it (UINT64_MAX: never). */
uint64_t sched_victim_next_use(Tensor *t, int tier);
/* Under the timeline policy: is @t's next planned access (after the current phase) write-only? */
bool sched_next_access_overwrites(Tensor *t);
/* The same, for the engine about to drop @t's sole copy as dead: the plan's rank is kept (Tensor.dead_rank). */
bool sched_drops_dead(Tensor *t);
/* Predicted time of @t's next planned use in @tier or above (0: none known). */
uint64_t sched_next_use_ns(Tensor *t, int tier);
/* Charge @j for @bytes of link time (its virtual time advances by bytes / weight). */
void sched_charge(Job *j, uint64_t bytes);
