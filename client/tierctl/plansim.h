/* SPDX-License-Identifier: MIT */
/* plansim.h: tierctl plan's replay of a training step under job limits, the way tierd's timeline policy moves it; no I/O. */
#pragma once

#include <stdint.h>

/*
 * When the job's VRAM and host budgets are given (--vram-limit, --host-limit),
 * the streaming formulas of planner.h (everything not in VRAM moves every
 * step) overstate the traffic: tierd keeps what fits and moves the rest.  How
 * much is the rest depends on the order of the accesses, so the plan replays
 * the step, layer by layer, the way a planned job (tier.torch, or the timeline
 * benchmark) declares it to tierd:
 *
 *   fwd_i  (i = 0 .. L-1)             W_i in VRAM, read
 *   bwd_i  (b = L-1-i)                W_b in VRAM, read; G_b in VRAM, write only
 *   opt_i  (i = 0 .. L-1)             G_i in host, read; O_i and W_i in host, read-write
 *
 * with rules taken from tierd's timeline policy (docs/ARCHITECTURE.md, sched/):
 *   - a copy is brought to the tier of its access: VRAM from host over the
 *     link; from NVMe through host (NVMe read, then the link); a write-only
 *     access reserves room and moves nothing; a write makes the other copies stale;
 *   - the current phase and the next one are held (never evicted);
 *   - after each phase, copies are prefetched for the phases ahead as far as
 *     their distinct tensors fit (plan_window(): VRAM counts what is touched
 *     there; host what is touched there or staged through it, and everything
 *     touched must fit VRAM and host together), each making room only from
 *     copies needed after it;
 *   - when a tier is over the job's limit, the victim is the unheld copy with
 *     the largest time to next use / cost of dropping it (2 for a sole copy,
 *     1 otherwise); a host copy of a tensor valid in VRAM is next used at its
 *     next host access (VRAM and host act as one exclusive cache), and a copy
 *     that another tier's write makes stale before it is read is not used again;
 *   - a victim that is the only copy is written down one tier (VRAM -> host
 *     over the link, host -> NVMe), any other is dropped; a copy drained from
 *     VRAM makes room in host only from copies needed after it;
 *   - a tensor whose next access is write-only is dead: its copies are dropped
 *     when the phase that used it last ends, and never written back.
 * The time of a phase is its compute (fwd, bwd, opt seconds per layer).
 * Left out: write-behind (tierd also writes dirty copies down ahead of need
 * while NVMe is idle, which changes which copies are cheap to drop), the
 * links' speeds and queue limits (which decide what lands first), and the
 * learned phase times.  Against tierd (docs/PLANNING.md) the replay's link
 * bytes and NVMe writes came within 0-21%, its NVMe reads 5-25% of tierd's
 * counts over four budget pairs; it is a model of the policy, not tierd.
 *
 * Bytes are counted over one step after enough warm-up steps that the
 * pattern repeats.
 */

typedef struct PlanSimInput {
        unsigned layers;                /* 1 .. PLAN_SIM_MAX_LAYERS */
        double weights, grads, opt;     /* bytes per layer of W, G and O (O: master + moments); weights > 0 */
        double vram_limit, host_limit;  /* the job's budgets, bytes; each must hold two phases */
        double fwd_s, bwd_s, opt_s;     /* compute per layer and phase, seconds (all 0: phases count equal) */
} PlanSimInput;

typedef struct PlanSimResult {
        double link_down, link_up;      /* host -> VRAM, VRAM -> host, bytes per step */
        double nvme_read, nvme_write;   /* bytes per step */
} PlanSimResult;

#define PLAN_SIM_MAX_LAYERS 4096
#define PLAN_SIM_MAX_PHASES (3 * PLAN_SIM_MAX_LAYERS)
#define PLAN_SIM_MAX_TENSORS (3 * PLAN_SIM_MAX_LAYERS)

/* Any plan, as tierd is given one (tier_plan_add()): per phase, which tensors, where, how. */
enum { PLAN_SIM_READ = 1, PLAN_SIM_WRITE = 2 };
typedef struct PlanSimAccess {
        uint32_t tensor;                /* index into PlanSimPlan.size */
        uint8_t tier;                   /* 0: VRAM, 1: host */
        uint8_t mode;                   /* PLAN_SIM_READ | PLAN_SIM_WRITE */
} PlanSimAccess;

typedef struct PlanSimPlan {
        size_t n_tensors;
        const double *size;             /* bytes of each tensor */
        size_t n_phases;
        const size_t *start;            /* n_phases + 1: phase p's accesses are acc[start[p] .. start[p + 1]) */
        const PlanSimAccess *acc;
        const double *phase_s;          /* compute of each phase (NULL: all equal) */
        /*
         * Write-downs (NULL: none): the tensors down[down_start[p] .. down_start[p + 1]) the
         * client evicts to NVMe when it enters phase p (tier.torch's placements B and C, after
         * an optimizer phase).  The replay writes each one down (NVMe write, and the link when
         * its only copy is in VRAM) and drops its VRAM and host copies, except where the phase
         * entered or the next one accesses it: tierd holds those, and such an eviction ends
         * with EBUSY.
         */
        const size_t *down_start;
        const uint32_t *down;
} PlanSimPlan;

/*
 * Replay; -EINVAL with a sentence in @err when @in cannot be replayed (no
 * layers, too many, a budget that cannot hold two consecutive phases).
 */
int plan_simulate(const PlanSimInput *in, PlanSimResult *ret, char *err, size_t err_size);

/*
 * plan_simulate_plan() - the same replay of any plan (the rules above, over
 * its own phases) under a VRAM and a host budget; -EINVAL with a sentence in
 * @err for a malformed plan or budgets that cannot hold two consecutive
 * phases (tierd holds the next phase while one runs).
 */
int plan_simulate_plan(const PlanSimPlan *plan, double vram_limit, double host_limit, PlanSimResult *ret, char *err,
                       size_t err_size);
