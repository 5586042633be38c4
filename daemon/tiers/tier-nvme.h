/* SPDX-License-Identifier: MIT */
/* tier-nvme.h: NVMe backing targets, extent allocation, striped O_DIRECT I/O. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/tiers/extent.h"

typedef struct Config Config;
typedef struct Uring Uring;
typedef struct NvmeTier NvmeTier;

/* One extent of a tensor's NVMe image. */
typedef struct NvmeExtent {
        uint32_t target;
        uint32_t crc;           /* crc32c of the extent's bytes as written */
        uint64_t unit;          /* extent index inside the target */
} NvmeExtent;

typedef struct NvmeTarget {
        char *path;
        int fd;                 /* O_DIRECT, CLOEXEC; registered as fixed file @index */
        bool blockdev;
        uint64_t size;          /* usable bytes (whole extents) */
        ExtentAlloc extents;
        uint64_t bytes_written;
        uint64_t bytes_read;
        uint64_t crc_errors;
        uint64_t io_errors;
} NvmeTarget;

struct NvmeTier {
        NvmeTarget *targets;
        unsigned n_targets;
        uint64_t extent_size;
        uint64_t capacity;
        uint64_t used;
        Uring *uring;
};

/*
 * nvme_tier_new() - open (creating and preallocating files where needed)
 * every configured target with O_DIRECT and register them with @uring.
 * On failure *ret_error names the target and the reason.
 */
int nvme_tier_new(const Config *c, Uring *uring, NvmeTier **ret, char **ret_error);
NvmeTier *nvme_tier_free(NvmeTier *n);

/* Pace each target to @bytes_per_sec (0: unthrottled), for reproducible benchmarks. */
void nvme_set_bandwidth(NvmeTier *n, uint64_t bytes_per_sec);

/* Allocate the extents of a @size-byte image, striped round-robin from target @first. */
int nvme_alloc(NvmeTier *n, uint64_t size, unsigned first, NvmeExtent **ret, uint32_t *ret_n);
void nvme_free(NvmeTier *n, NvmeExtent *ext, uint32_t n_ext);
