/* SPDX-License-Identifier: MIT */
/* capacity.h: can this machine give what the configuration asks?  At start, reload and --check-config. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/base/config.h"

/*
 * The host pool, and the emulated VRAM pool with it, may take this share (%)
 * of the memory that is available (MemAvailable, and what the memory cgroup
 * leaves unused).  The rest is for tierd itself (its books, the ring, a CUDA
 * driver's own host allocations), for the training jobs' processes and for
 * the page cache of everything else on the machine: the pools are locked or
 * populated shmem and are never reclaimed, so taking it all invites the OOM
 * killer, which would pick tierd.
 */
#define CAPACITY_MEMORY_PERCENT 90u

/*
 * Fixed buffers one io_uring takes at most: the kernel's IORING_MAX_REG_BUFFERS
 * (1 << 14), in every kernel that has the sparse registration tierd uses
 * (io_uring_register_buffers_sparse(), 5.19); one more is -EINVAL.
 */
#define CAPACITY_URING_MAX_BUFFERS 16384u

/* capacity_check()'s outcome besides 0 and -errno: the machine cannot give it; the message says what to set. */
#define CAPACITY_REFUSED 1

typedef enum CapacityTargetKind {
        CAPACITY_TARGET_UNKNOWN,        /* could not be looked at: opening it will say why */
        CAPACITY_TARGET_NEW,            /* a file that does not exist yet: created and preallocated */
        CAPACITY_TARGET_FILE,           /* an existing regular file */
        CAPACITY_TARGET_BLOCK,          /* a block device */
        _CAPACITY_TARGET_KIND_MAX,
        _CAPACITY_TARGET_KIND_INVALID = -22,
} CapacityTargetKind;

/* What the machine has for one [nvme] target. */
typedef struct CapacityTarget {
        CapacityTargetKind kind;
        uint64_t fs_id;                 /* st_dev of the filesystem that holds the file (targets on one share it) */
        uint64_t fs_free;               /* its f_bavail * f_frsize: what may still be allocated there */
        uint64_t file_size;             /* an existing file's st_size */
        uint64_t file_allocated;        /* its st_blocks * 512: space it holds already */
        uint64_t device_size;           /* a block device's BLKGETSIZE64 */
} CapacityTarget;

/* Everything the checks look at, read by capacity_facts_read() or made up by a test. */
typedef struct CapacityFacts {
        uint64_t mem_total;             /* /proc/meminfo MemTotal, bytes; 0: unknown */
        uint64_t mem_available;         /* MemAvailable; 0: unknown (the rule is skipped) */
        uint64_t cgroup_limit;          /* the tightest memory limit over tierd's cgroup and its parents; UINT64_MAX: none */
        uint64_t cgroup_usage;          /* what that cgroup uses now */
        char cgroup_file[1280];         /* the file that sets the limit, for messages */
        uint64_t memlock_limit;         /* RLIMIT_MEMLOCK (soft), bytes; UINT64_MAX: unlimited */
        bool cap_ipc_lock;              /* CAP_IPC_LOCK is effective: neither mlock nor io_uring is limited */
        bool vram_emulated;             /* the VRAM tier is host memory (memfd, populated, not locked) */
        uint64_t held;                  /* host memory tierd holds: its running pools (reload), or the last run's in
                                         * the fd store (start): what it gets back */
        CapacityTarget targets[CONFIG_MAX_TARGETS];     /* in the order of [nvme] target */
} CapacityFacts;

/*
 * capacity_facts_read() - read what the checks need for @c from this
 * machine and this process: /proc/meminfo, the memory cgroup named in
 * /proc/self/cgroup (v1 memory.limit_in_bytes, v2 memory.max, up to the
 * root), RLIMIT_MEMLOCK, CAP_IPC_LOCK, and for each target its filesystem
 * (statvfs) or device size.  Makes nothing, allocates nothing, logs
 * nothing; a fact that cannot be read is left unknown and its rule skipped.
 * @vram_emulated: 1 or 0 when the caller knows whether the VRAM tier will
 *                 be emulated; -1: from [vram] backend, where auto asks the
 *                 CUDA driver whether it has a device (what
 *                 vram_backend_new() would find, unless that device turns
 *                 out unusable).
 * @ret:           filled; .held is 0.
 */
int capacity_facts_read(const Config *c, int vram_emulated, CapacityFacts *ret);

/*
 * capacity_read_cgroup() - capacity_facts_read()'s memory cgroup part:
 * where @proc_cgroup (/proc/self/cgroup) puts this process, under the
 * cgroup file systems at @root (/sys/fs/cgroup): cgroup v1's memory
 * hierarchy (@root/memory) when it has one, else v2 (@root).  Sets
 * cgroup_limit, cgroup_usage (inactive page cache aside) and cgroup_file of
 * the cgroup, its own or a parent, whose limit leaves least unused; leaves
 * them be when there is no limit.  Separate so tests can give other paths.
 */
void capacity_read_cgroup(const char *proc_cgroup, const char *root, CapacityFacts *f);

/*
 * capacity_check() - does the machine described by @f have what @c (a
 * Config config_finish() accepted) asks?  Pure: the same @c and @f always
 * give the same answer.  Returns 0 when it
 * does, CAPACITY_REFUSED with *@ret_message (malloc'ed, one line) naming
 * the key, the asked size, what the machine has and a value to set when
 * it does not, -ENOMEM.  Rules (tierd.conf(5), CAPACITY CHECKS):
 *
 *   - [host] capacity / segment_size fixed buffers fit one io_uring;
 *   - without CAP_IPC_LOCK, [host] capacity fits RLIMIT_MEMLOCK;
 *   - [host] capacity, plus [vram] capacity when emulated, fits
 *     CAPACITY_MEMORY_PERCENT of what the memory cgroup leaves unused and
 *     of MemAvailable (each plus @f->held);
 *   - each [nvme] target fits the free space of its filesystem (after the
 *     targets listed before it on the same one; a file counts what it
 *     holds already), or the size of its block device.
 */
int capacity_check(const Config *c, const CapacityFacts *f, char **ret_message);

/* Host memory @c's pools take: [host] capacity, plus the emulated VRAM pool when @vram_emulated. */
uint64_t capacity_host_bytes(const Config *c, bool vram_emulated);
