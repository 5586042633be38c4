/* SPDX-License-Identifier: MIT */
/* timeline-plan.h: bench-timeline's iteration plan: the synthetic one, or one read from a file (--plan). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "bench/capbound.h"

/* Most bytes of one tensor of a plan file (bounded, as the pools here are small). */
#define TL_MAX_TENSOR_SIZE (UINT64_C(1) << 34)
/* Most phases of a plan file. */
#define TL_MAX_PHASES 4096u

/* What stands for a phase's compute: --fwd-us, --bwd-us or --opt-us. */
typedef enum TlKind {
        TL_FWD,
        TL_BWD,
        TL_OPT,
} TlKind;

typedef struct TlPlan {
        char *name;                     /* "synthetic" or the file's "name" */
        size_t n_tensors;
        char **names;
        uint64_t *size;
        size_t n_phases;
        TlKind *kind;
        size_t *start;                  /* n_phases + 1: phase k's accesses are acc[start[k]..start[k + 1]) */
        CbAccess *acc;                  /* tiers and modes have tier.h's values (TIER_VRAM, TIER_READ, ...) */
} TlPlan;

/*
 * tl_plan_synthetic() - the plan of timeline-job.c's theory of operation:
 * @layers layers of P_i, G_i and O_i (@p, @g, @o bytes), fwd, bwd (layers in
 * reverse), opt.  Tensors P_i, G_i, O_i are 3i, 3i + 1, 3i + 2.
 */
int tl_plan_synthetic(size_t layers, uint64_t p, uint64_t g, uint64_t o, TlPlan **ret);

/*
 * tl_plan_load() - a plan file (JSON, written by bench/torch_plan.py):
 *   {"name":S, "tensors":[{"name":S,"size":N},...],
 *    "phases":[{"kind":"f"|"b"|"o","access":[[TENSOR,"vram"|"host","r"|"w"|"rw"],...]},...]}
 * -EBADMSG with a message in @err when it is not such a plan, -errno when
 * it cannot be read.
 */
int tl_plan_load(const char *path, TlPlan **ret, char *err, size_t err_size);

/* Takes NULL, returns NULL. */
TlPlan *tl_plan_free(TlPlan *p);

/* The plan as capbound.c reads it (borrows @p's arrays). */
CbPlan tl_plan_cb(const TlPlan *p);

/* Bytes of all tensors. */
uint64_t tl_plan_bytes(const TlPlan *p);
