/* SPDX-License-Identifier: MIT */
/* planhw.h: tierctl plan's hardware figures from `tierctl bench` results and from a running tierd's status JSON. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* From the JSON `tierctl bench` saves (docs/PLANNING.md: schema version 1). */
typedef struct PlanBenchFigures {
        unsigned targets;               /* targets the bench measured */
        double read_gbs, write_gbs;     /* per drive: the best striped (or lone-target) non-suspect cell / targets */
        bool write_sustained;           /* write_gbs is the sustained phase's last rate (/ targets when striped) */
} PlanBenchFigures;

/* From tier_client_status() JSON. */
typedef struct PlanTierdFigures {
        uint64_t vram_bytes, host_bytes;
        unsigned targets;
        uint64_t nvme_bandwidth, vram_bandwidth;        /* bytes/s, 0: not configured */
        bool vram_emulated;
} PlanTierdFigures;

/* -EINVAL with a sentence in @err when @doc is not a bench result this reads. */
int planhw_bench(const char *doc, PlanBenchFigures *ret, char *err, size_t err_size);
int planhw_tierd(const char *doc, PlanTierdFigures *ret, char *err, size_t err_size);

/* The default bench results: $XDG_CACHE_HOME/tierd/bench.json, else ~/.cache/tierd/bench.json; NULL: no home. */
char *planhw_bench_default_path(void);
