/* SPDX-License-Identifier: MIT */
/* planner.h: the arithmetic of tierctl plan (will it fit, how fast, where is the bottleneck); no I/O. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The model (docs/PLANNING.md has the background and the worked examples):
 *
 *   parameters P   --params, or from the shape: L * (4 h^2 + 2 h ffn) + vocab h
 *                  (attention Q, K, V, O; the two MLP matrices; one embedding
 *                  matrix, tied; biases and norms left out)
 *   model state    P * (weights + grads + master + moments) bytes; mixed-precision
 *                  AdamW is 2 + 2 + 4 + 8 = 16 B per parameter
 *   activations    (shape only) per layer s b h (34 + 5 a s / h) bytes without
 *                  checkpointing; with it 2 s b h per layer plus one layer in full
 *   tokens / step  micro-batch tokens (seq * micro_batch) * accumulation steps
 *   t_compute      6 P T / FLOP/s, 8 P T / FLOP/s with checkpointing (one more forward)
 *
 * Traffic per optimizer step with A micro-batches, the GPU holding only
 * activations and streaming buffers (the ZeRO-Infinity worst case):
 *
 *   link down      A * 2 * P * weights   (weights for the forward and the backward)
 *   link up        A * P * grads         (gradients out after each backward)
 *   A (host)       NVMe: nothing
 *   B (optimizer)  NVMe read P * (master + moments), write the same (the CPU step)
 *   C (+ params)   B's traffic, plus NVMe read A * 2 * P * weights and write
 *                  P * weights (the updated fp16 copy)
 *
 *   t_link = max(down, up) / link    (full duplex)
 *   t_nvme = read / (drives * read GB/s) + write / (drives * write GB/s)
 *            (reads and writes share the drives)
 *   overlapped = max(t_compute, t_link, t_nvme); serial = their sum.
 */

typedef enum PlanPlacement {
        PLAN_PLACEMENT_A,               /* all state in host RAM */
        PLAN_PLACEMENT_B,               /* optimizer state (master + moments) on NVMe */
        PLAN_PLACEMENT_C,               /* weights and optimizer state on NVMe; grads in host RAM */
        _PLAN_PLACEMENT_MAX,
} PlanPlacement;

typedef enum PlanTier {
        PLAN_TIER_HOST,
        PLAN_TIER_NVME,
} PlanTier;

typedef enum PlanClass {
        PLAN_CLASS_WEIGHTS,
        PLAN_CLASS_GRADS,
        PLAN_CLASS_MASTER,
        PLAN_CLASS_MOMENTS,
        _PLAN_CLASS_MAX,
} PlanClass;

typedef enum PlanBottleneck {
        PLAN_BOTTLENECK_COMPUTE,
        PLAN_BOTTLENECK_LINK,
        PLAN_BOTTLENECK_NVME,
} PlanBottleneck;

typedef enum PlanVerdict {
        PLAN_VERDICT_GPU,               /* state and activations fit in VRAM: no offload */
        PLAN_VERDICT_PLACEMENT,         /* the placement in PlanResult.chosen */
        PLAN_VERDICT_NO_FIT_VRAM,       /* the activations alone do not fit in VRAM */
        PLAN_VERDICT_NO_FIT_HOST,       /* not even C's host share fits in host RAM */
        PLAN_VERDICT_NO_DRIVES,         /* A does not fit in host RAM and there is no drive */
} PlanVerdict;

typedef struct PlanInput {
        /* the model: either params > 0, or the shape (layers, hidden, ffn, vocab, heads all > 0) */
        double params;
        uint64_t layers, hidden, ffn, vocab, heads;
        double bytes[_PLAN_CLASS_MAX];  /* per parameter; default 2, 2, 4, 8 */
        uint64_t seq, micro_batch, accumulation;
        bool checkpointing;
        /* hardware */
        uint64_t vram, host_ram;        /* bytes */
        unsigned drives;
        double drive_read_gbs, drive_write_gbs;  /* per drive, GB/s (10^9) */
        double link_gbs;
        double tflops;                  /* achieved, 10^12 FLOP/s */
        double compute_s;               /* > 0: compute per step given, tflops not needed */
        bool link_shared;               /* both directions share the link (tierd's emulated [vram] bandwidth) */
        /* the job's budgets: both > 0 replays the step under them (plansim.h) */
        uint64_t vram_limit, host_limit;
        uint64_t blocks;                /* layers the state is split into for the replay; 0: --layers */
        const struct PlanSimPlan *plan; /* --plan FILE: replay this plan instead of the layer-by-layer one */
        const uint8_t *plan_kind;       /* its phases' kinds (planfile.h: fwd, bwd, opt) */
        double fwd_share, bwd_share, opt_share;   /* phase times per layer, relative; all 0: 1, 2, 1 */
        double tbw;                     /* endurance per drive, TB (10^12) written; 0: not given */
        int placement;                  /* -1: choose by the decision tree, else a PlanPlacement */
} PlanInput;

typedef struct PlanPlacementResult {
        PlanTier tier[_PLAN_CLASS_MAX];
        double host_bytes, nvme_bytes;
        bool fits_host;
        bool possible;                  /* fits_host and (drives > 0 or it needs none) */
        double link_down_bytes, link_up_bytes, nvme_read_bytes, nvme_write_bytes;
        double t_link, t_nvme;
        double step_overlapped, step_serial;
        PlanBottleneck bottleneck;
        bool io_hidden;                 /* t_link and t_nvme <= t_compute */
        double tokens_per_s, gpu_busy;
        /* smallest changes that hide the I/O; 0 when none is needed, -1 when that change cannot */
        int64_t drives_needed;          /* drives of this speed for t_nvme <= t_compute */
        int64_t accumulation_needed;    /* micro-batches per step, same micro-batch */
        /* wear at this rate */
        double write_bytes_per_day_per_drive;
        double days_to_tbw;             /* 0 when no TBW or no writes */
} PlanPlacementResult;

/* Under the job's budgets (PlanInput.vram_limit, host_limit): what tierd moves, by replay. */
typedef struct PlanLimitsResult {
        bool given;
        double link_down_bytes, link_up_bytes, nvme_read_bytes, nvme_write_bytes;
        double t_link, t_nvme, step_overlapped, step_serial;
        PlanBottleneck bottleneck;
} PlanLimitsResult;

typedef struct PlanResult {
        double params;
        double model_state_bytes;
        double class_bytes[_PLAN_CLASS_MAX];
        bool activations_known;
        double activation_bytes;
        double tokens_per_step;
        double flops_per_step;
        double t_compute;
        bool fits_vram;                 /* state + activations in VRAM */
        PlanPlacementResult placements[_PLAN_PLACEMENT_MAX];
        PlanVerdict verdict;
        PlanPlacement chosen;           /* with PLAN_VERDICT_PLACEMENT */
        PlanLimitsResult limits;
} PlanResult;

/* Defaults: mixed-precision AdamW, seq 2048, micro-batch 1, accumulation 1, no drives, placement -1. */
void plan_input_init(PlanInput *in);

/*
 * Check @in; on a problem return -EINVAL and a sentence in @err saying what
 * is wrong and what to do.
 */
int plan_validate(const PlanInput *in, char *err, size_t err_size);

/* Compute everything; @in must have passed plan_validate(). */
void plan_compute(const PlanInput *in, PlanResult *ret);

/* The replay under limits (plansim.c); plan_validate() checks its inputs too. */
int plan_compute_limits(const PlanInput *in, PlanResult *r, char *err, size_t err_size);

/*
 * A count of parameters or tokens as people write it: "13B", "1T", "350M",
 * "1.5B", "7000000000", "6.7e9"; K, M, B (or G), T are 10^3 .. 10^12.
 * -EINVAL for anything else, negative numbers and non-finite values.
 */
int plan_parse_count(const char *s, double *ret);

/* A non-negative decimal ("3.5"); -EINVAL otherwise. */
int plan_parse_number(const char *s, double *ret);

const char *plan_placement_name(PlanPlacement p);
const char *plan_tier_name(PlanTier t);
const char *plan_class_name(PlanClass c);
const char *plan_bottleneck_name(PlanBottleneck b);
const char *plan_verdict_name(PlanVerdict v);
