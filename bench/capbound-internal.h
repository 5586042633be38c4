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

/* -EINVAL for a malformed plan (bad tensors, tiers, modes or phase bounds), else 0. */
int cb_plan_check(const CbPlan *p);
