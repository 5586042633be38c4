/* SPDX-License-Identifier: MIT */
/* planfile.h: tierctl plan --plan FILE: an iteration plan as bench/torch_plan.py writes it, for the replay. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "client/tierctl/plansim.h"

/* What stands for a phase's compute: --phase-times F, B or O. */
enum { PLAN_FILE_FWD, PLAN_FILE_BWD, PLAN_FILE_OPT };

/* The largest plan file read (bytes). */
#define PLAN_FILE_MAX_BYTES (16u << 20)

typedef struct PlanFile {
        PlanSimPlan plan;               /* its arrays are owned by the PlanFile */
        uint8_t *kind;                  /* per phase: PLAN_FILE_* */
        char name[128];
} PlanFile;

/*
 * plan_file_parse() - @doc (NUL-terminated JSON):
 *   {"name":S, "tensors":[{"name":S,"size":N},...],
 *    "phases":[{"kind":"f"|"b"|"o","access":[[TENSOR,"vram"|"host","r"|"w"|"rw"],...],
 *               "write_down":[TENSOR,...] (optional: evicted to NVMe on entering the phase)},...]}
 * -EINVAL with a sentence in @err naming what is wrong where; -ENOMEM.
 */
int plan_file_parse(const char *doc, PlanFile *ret, char *err, size_t err_size);
/* plan_file_load() - read @path (at most PLAN_FILE_MAX_BYTES) and parse it; -errno with @err on failure. */
int plan_file_load(const char *path, PlanFile *ret, char *err, size_t err_size);
void plan_file_done(PlanFile *f);
