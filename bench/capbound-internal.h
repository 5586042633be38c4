/* SPDX-License-Identifier: MIT */
/* capbound-internal.h: what capbound.c and capbound-exact.c share: a tensor's copy bits and the plan checks. */
#pragma once

#include <stdint.h>

#include "bench/capbound.h"

/* Copy bits of a tensor's state. */
#define B_VRAM 1u
#define B_HOST 2u
#define B_NVME 4u

static inline uint8_t tier_bit(unsigned tier) {
        return tier == CB_VRAM ? B_VRAM : B_HOST;
}

/*
 * One move of a schedule of the model, in the order the model makes them:
 * a copy arrives for an access (PLACE: a place with no bytes; READ: NVMe ->
 * host; UP: host -> VRAM; DOWN: VRAM -> host) or leaves a tier (DROP;
 * STALE: a write of the phase made it stale, so it leaves when the phase
 * ends); or, before its copy leaves, the sole host copy is written to NVMe
 * (WRITE) or the sole VRAM copy drained to host (DRAIN, which takes host
 * room).  @tier is the tier a copy arrives in or
 * leaves; @phase counts from the start of the log (step * n_phases + k).
 */
enum {
        CB_EV_PLACE,
        CB_EV_READ,
        CB_EV_UP,
        CB_EV_DOWN,
        CB_EV_WRITE,
        CB_EV_DRAIN,
        CB_EV_DROP,
        CB_EV_STALE,
};

typedef struct CbEvent {
        uint32_t tensor;
        uint32_t phase;
        uint8_t kind, tier;
} CbEvent;

/* The moves of one cycle of a settled schedule (it may span several steps), from the state @st0 (B_* bits). */
typedef struct CbLog {
        CbEvent *ev;
        size_t n, cap;
        unsigned steps;
        uint8_t *st0;
} CbLog;

/*
 * cb_simulate_log() - capbound_simulate(), and the moves of one cycle of the
 * schedule it settles in, in *@log (free it with cb_log_free()).  With @pct
 * > 0, that many in a hundred victims are not the rule's but the one with the
 * highest hash of (@seed, phase, tensor), the dice thrown by (@seed, phase,
 * victims so far in the phase): a perturbed schedule, still a function of the
 * state at a step's start, so it settles too.  With @out (per access of
 * the plan, cb_place_gaps()), a tensor planned to wait on NVMe after its
 * last access goes before every other victim.  -ETIME (no cycle) leaves
 * *@log empty.
 */
int cb_simulate_log(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule rule, double w_nvme,
                    double w_link, uint32_t seed, uint32_t pct, const uint8_t *out, unsigned max_steps, CbBytes *ret,
                    CbLog *log);

/*
 * cb_place_gaps() - for every access of @p, whether its tensor waits on NVMe
 * until its next access (1) or in memory (0), planned for the whole cycle
 * under @vram_cap + @host_cap bytes with @held phases pinned at a time
 * (capbound-place.c); *@ret_out is malloc'ed, one byte per access.  -EINVAL,
 * -E2BIG (the pinned bytes do not fit), -ENOMEM.
 */
int cb_place_gaps(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, uint8_t **ret_out);
/*
 * cb_place_gaps_from() - cb_place_gaps(), and among gaps that save as much
 * and span as many phases, those whose next access comes first from phase
 * @burst on stay in memory (SIZE_MAX: no such preference): the reads of a
 * burst that starts there are then those needed last in it.
 */
int cb_place_gaps_from(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, size_t burst,
                       uint8_t **ret_out);
void cb_log_free(CbLog *log);

/*
 * cb_build_log() - a schedule laid out for time from the plan of waits @out
 * (cb_place_gaps()), not by eviction rules (capbound-build.c): one step of
 * moves in *@log from its start state, @held phases pinned at a time,
 * @slack bytes of memory left for reads ahead.  -EINVAL, -E2BIG (a phase
 * does not fit, or the plan is too large), -ENOSPC (no tier assignment
 * found), -ENOMEM; -EPROTO is a bug here.
 */
int cb_build_log(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, unsigned held, const uint8_t *out,
                 uint64_t slack, CbLog *log);

/*
 * cb_timed_log() - the step time of the schedule in @log, executed as
 * capbound-timed.c's theory says, a write to NVMe waiting while a phase runs
 * and a read from NVMe is due within @defer phases (SIZE_MAX: never waits;
 * capbound_planned() defers only the writes of built schedules).  -EINVAL,
 * -ENOMEM.
 */
int cb_timed_log(const CbPlan *p, const CbLog *log, uint64_t vram_cap, uint64_t host_cap, const double *compute,
                 double nvme_bw, double link_bw, size_t defer, double *ret);

/* One access of a tensor: cb_occ_build() lists every tensor's in step order. */
typedef struct CbOcc {
        size_t phase;
        size_t acc;                     /* its index in the plan's accesses */
        uint8_t tier, mode;
} CbOcc;

/*
 * cb_occ_build() - every tensor's accesses in step order: tensor t's are
 * (*@ret_occ)[(*@ret_start)[t] .. (*@ret_start)[t + 1]) (both malloc'ed).
 * -ENOMEM.
 */
int cb_occ_build(const CbPlan *p, CbOcc **ret_occ, size_t **ret_start);

/* The modes (CB_READ, CB_WRITE) of phase @k's accesses of tensor @t; 0: none. */
static inline uint8_t cb_modes_in(const CbPlan *p, uint32_t t, size_t k) {
        uint8_t m = 0;

        for (size_t i = p->start[k]; i < p->start[k + 1]; i++)
                if (p->acc[i].tensor == t)
                        m |= p->acc[i].mode;
        return m;
}

/* The weights of NVMe against link bytes the rules are tried with (capbound_min_held(), capbound_planned()). */
#define CB_WEIGHTS 4u
static const double cb_weights[CB_WEIGHTS][2] = { { 1, 0 }, { 0, 1 }, { 1, 1 }, { 2.5, 1 } };

/* Every rule with and without each of its options: the schedules capbound_min_held() and capbound_planned() try. */
#define CB_RULE_COMBOS (8u * CB_RULES)

static inline CbRule cb_rule_nth(unsigned i, unsigned held) {
        return (CbRule) ((i % CB_RULES) | (i / CB_RULES % 2 ? CB_RULE_INCLUSIVE : 0) |
                         (i / CB_RULES / 2 % 2 ? CB_RULE_UPSTAGE : 0) | (i / CB_RULES / 4 % 2 ? CB_RULE_PARK : 0) |
                         (held == 2 ? CB_RULE_HELD2 : 0));
}

/* -EINVAL for a malformed plan (bad tensors, tiers, modes or phase bounds), else 0. */
int cb_plan_check(const CbPlan *p);
/*
 * cb_time_args() - what capbound_time() and capbound_window() check before
 * anything else: the plan (cb_plan_check()), bandwidths >= 0 (NaN refused),
 * every phase's compute >= 0; -EINVAL, or -E2BIG for a plan too large to
 * scan.  *@ret_total: the step's compute; *@ret_writes: whether the writes'
 * part (a rescan of what a window wrote, at every phase) stays small enough.
 */
int cb_time_args(const CbPlan *p, const double *compute, double nvme_bw, double link_bw, double *ret_total,
                 bool *ret_writes);
