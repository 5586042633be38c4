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
 * state at a step's start, so it settles too.  -ETIME (no cycle) leaves
 * *@log empty.
 */
int cb_simulate_log(const CbPlan *p, uint64_t vram_cap, uint64_t host_cap, CbRule rule, double w_nvme,
                    double w_link, uint32_t seed, uint32_t pct, unsigned max_steps, CbBytes *ret, CbLog *log);
void cb_log_free(CbLog *log);

/* -EINVAL for a malformed plan (bad tensors, tiers, modes or phase bounds), else 0. */
int cb_plan_check(const CbPlan *p);
