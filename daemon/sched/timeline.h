/* SPDX-License-Identifier: MIT */
/* timeline.h: the shared scheduling timeline: plans, deadlines, victims, fair share. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/base/list.h"
#include "daemon/state/registry.h"

typedef struct Conn Conn;
typedef struct Op Op;
typedef struct Plan Plan;
typedef struct PlanPage PlanPage;
typedef struct Tier__SubmitPlan Tier__SubmitPlan;
typedef struct Tier__PlanStatus Tier__PlanStatus;

typedef struct PlanAcc {
        Tensor *tensor;
        uint32_t slot;          /* distinct-tensor index */
        uint8_t tier;
        uint8_t mode;           /* PLAN_READ | PLAN_WRITE */
        Op *op;                 /* pin op in flight for this access */
        bool pinned;            /* pinned for the phase it belongs to */
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
} PlanHold;

struct Plan {
        Manager *manager;
        Conn *conn;
        Job *job;
        List link;              /* Manager.plans */
        PlanPhase *phases;
        uint32_t n_phases;
        PlanAcc *acc_storage;
        uint32_t n_acc;
        Tensor **slots;         /* distinct tensors, by slot */
        uint32_t n_slots;
        /* next-use index (CSR): for slot s and tier class c (USE_*), the phases
         * that use it are use_phase[c][use_off[c][s] .. use_off[c][s+1]) */
        uint32_t *use_off[3];
        uint32_t *use_phase[3];
        /* every phase touching slot s, any tier: acc_phase/acc_mode[acc_off[s] .. acc_off[s+1]) */
        uint32_t *acc_off;
        uint32_t *acc_phase;
        uint8_t *acc_mode;

        int page_fd;
        PlanPage *page;
        uint64_t page_size;
        int marker_fd;
        sd_event_source *marker_source;

        uint64_t seq;           /* latest marker seen */
        uint32_t cur;           /* its phase (UINT32_MAX before the first marker) */
        uint64_t cur_mark_ns;
        PlanHold hold[2];       /* [0]: the current marker's phase, [1]: pinned ahead */

        uint64_t iterations;
        uint64_t iter_stall_ns; /* client's stall counter at the last iteration start */
        uint64_t iter_start_ns;
        uint64_t iter_links[4]; /* job link counters at the last iteration start */
        double last_stall_s;
        uint64_t last_step_links[4];
        double last_step_s;
        bool slots_counted;     /* the slot tensors' plan_refs include this plan */
};

/* Links the scheduler keeps a few transfers in flight on. */
enum { SCHED_LINK_NVME, SCHED_LINK_PCIE, _SCHED_LINK_MAX };

/* A transfer the scheduler could start in this pass. */
typedef struct SchedCand {
        Plan *plan;
        Job *job;
        Tensor *tensor;
        int tier;
        int hold;               /* 0: the current phase, 1: the next one, -1: a prefetch */
        uint32_t idx;
        uint64_t deadline;      /* CLOCK_MONOTONIC ns */
        int link;               /* SCHED_LINK_* */
        bool taken;
} SchedCand;

/* The selection rule (EDF, then fair share among colliding deadlines); see timeline.c. */
size_t sched_pick(const SchedCand *c, size_t n, uint64_t now, const unsigned limit[]);
/* Under the timeline policy: is @t's next planned access (after the current phase) write-only? */
bool sched_next_access_overwrites(Tensor *t);
/* Predicted time of @t's next planned use in @tier or above (0: none known). */
uint64_t sched_next_use_ns(Tensor *t, int tier);
/* Charge @j for @bytes of link time (its virtual time advances by bytes / weight). */
void sched_charge(Job *j, uint64_t bytes);
/* Called for every transfer the scheduler starts ("pin", "prefetch", "clean"); for tests and tracing. */
extern void (*sched_trace)(const char *what, const Tensor *t, int tier, uint64_t deadline_ns);

int sched_init(Manager *m);
void sched_deinit(Manager *m);

/*
 * plan_new() - validate @req against @c's job (tensors exist, tiers, modes,
 * limits, and that the phases fit the job's quota: one phase at a time, two
 * consecutive ones under the timeline policy, which pins the next phase
 * while the current one runs).  On failure *ret_error says why.
 */
int plan_new(Conn *c, const Tier__SubmitPlan *req, Plan **ret, char *error, size_t error_size);
void plan_free(Plan *p);

/* Run the scheduler: pins for the next markers, prefetch, write-behind.  Cheap when idle. */
void sched_run(Manager *m);

/*
 * sched_victim_order() - order the candidate copies in @tier for eviction.
 * @cands: tensors whose copy in @tier may be dropped or drained
 * @deadline_ns: when the requester needs its data; under the timeline policy
 *   only copies whose next use is later than that are returned
 * Returns how many of @cands remain, best victim first.
 */
size_t sched_victim_order(Manager *m, int tier, Tensor **cands, size_t n, uint64_t deadline_ns);

/* A transfer of @t ended (for per-job accounting and to re-run the scheduler). */
void sched_transfer_done(Manager *m);

uint64_t mono_ns(void);
void plan_status(Plan *p, Tier__PlanStatus *ps);
