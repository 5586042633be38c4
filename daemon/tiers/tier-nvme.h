/* SPDX-License-Identifier: MIT */
/* tier-nvme.h: NVMe backing targets, extent allocation, striped O_DIRECT I/O. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/tiers/extent.h"
#include "daemon/tiers/smart.h"

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
        int lock_fd;            /* another open of it, flock()ed: tierd's while it runs (not registered
                                 * with io_uring, whose teardown at exit lets go of its files later) */
        bool blockdev;
        uint64_t size;          /* usable bytes (whole extents) */
        ExtentAlloc extents;
        uint64_t bytes_written;
        uint64_t bytes_read;
        uint64_t crc_errors;
        uint64_t io_errors;
        uint64_t wear_base;     /* bytes written before this start (daemon/state/wear.c) */
        /* SMART (smart.c): where it comes from, or why there is none */
        char smart_ctrl[64];    /* "/dev/nvme0"; "" when the target is not on NVMe */
        char smart_na[256];     /* why there is no SMART data; "" while there is */
        SmartLog smart;
        uint64_t smart_usec;    /* monotonic time of the last read; 0: never read */
} NvmeTarget;

struct NvmeTier {
        NvmeTarget *targets;
        unsigned n_targets;
        uint64_t extent_size;
        uint64_t capacity;
        Uring *uring;
};

/*
 * nvme_tier_new() - open (creating files where needed) every configured
 * target with O_DIRECT and register them with @uring.  A regular file is
 * allocated whole (fallocate(), holes included) or refused with the numbers
 * when its filesystem cannot back it; one on tmpfs or ramfs is refused, and
 * so is anything but a regular file or a block device (opened without
 * blocking, so a FIFO cannot hang the start).
 * On failure *ret_error names the target and the reason.
 */
int nvme_tier_new(const Config *c, Uring *uring, NvmeTier **ret, char **ret_error);
NvmeTier *nvme_tier_free(NvmeTier *n);

/*
 * nvme_check_trusted() - is each of @c's targets in a directory nobody but
 * tierd's user can put a name in, reached through no link another user
 * planted (statefile_resolve_trusted(), as target_open() will open it)?
 * Run before anything looks at a target by its path (the capacity check
 * stat()s it, and opens a device, following links): at start, by
 * --check-config and by a reload, on the new configuration.  0; -EPERM or
 * -ELOOP with @why (@size bytes) "Refusing NVMe target PATH: WHY" for the
 * first one refused.  A directory that does not exist, or cannot be looked
 * at, is not refused here (the open says why); @warn_unchecked logs the
 * latter as not checked.
 */
int nvme_check_trusted(const Config *c, bool warn_unchecked, char *why, size_t size);

/*
 * nvme_smart_refresh() - read the SMART log of the NVMe drive under @t
 * (smart.c) unless it was read less than @max_age_usec before @now_usec.
 * A failure is kept in @t->smart_na (and logged when the reason changes).
 */
void nvme_smart_refresh(NvmeTarget *t, uint64_t now_usec, uint64_t max_age_usec);

/*
 * nvme_check_backed() - for each regular-file target whose filesystem blocks
 * no longer cover its size (a hole punched, the file replaced), log an error
 * with the numbers; an fstat() each, nothing allocated (a reload runs it on
 * the event loop; a start allocates in nvme_tier_new()).  The number of such
 * targets.
 */
unsigned nvme_check_backed(const NvmeTier *n);

/* Pace each target to @bytes_per_sec (0: unthrottled), for reproducible benchmarks. */
void nvme_set_bandwidth(NvmeTier *n, uint64_t bytes_per_sec);

/* Allocate the extents of a @size-byte image, striped round-robin from target @first. */
int nvme_alloc(NvmeTier *n, uint64_t size, unsigned first, NvmeExtent **ret, uint32_t *ret_n);
void nvme_free(NvmeTier *n, NvmeExtent *ext, uint32_t n_ext);
