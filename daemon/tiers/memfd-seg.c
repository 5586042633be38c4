/* SPDX-License-Identifier: MIT */
/* memfd-seg.c: segments backed by sealed memfds (host tier, emulated VRAM). */

/*
 * Theory of operation: a segment is one memfd of exactly seg_size bytes,
 * sealed against shrinking and growing (so a client's mapping can never hit
 * SIGBUS and the daemon's I/O never races a resize), mapped once by the
 * daemon, bound to a NUMA node (mbind before first touch), populated and
 * mlocked.  Clients receive the fd and map it MAP_SHARED.  With the memory
 * store, a segment made at start may be the last run's memfd instead, its
 * contents kept (MemfdSegConfig.adopt), and every segment made is handed to
 * the store (MemfdSegConfig.made).
 */

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/tiers/memfd-seg.h"
#include "proto/macro.h"

/*
 * The memory: a sealed memfd of @size, mapped, NUMA-bound, locked and faulted
 * in.  Runs on the renewer's thread too (renew.c): no logging here (a failed
 * lock is noted in the config, the caller on the loop says it).
 */
static int memfd_seg_make_memory(SegPool *p, Segment *seg, uint64_t size) {
        MemfdSegConfig *mc = p->userdata;
        void *map = MAP_FAILED;
        int fd = -1, r;

        if (mc->adopting && mc->adopt)
                fd = mc->adopt(seg, size, mc->store_userdata);
        if (fd >= 0) {
                int seals = fcntl(fd, F_GET_SEALS);

                /* the last run's memory: sealed as ours are, or not used */
                if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
                        fd = safe_close(fd);
                else
                        mc->adopted++;
        }
        if (fd < 0) {
                fd = memfd_create(mc->name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
                if (fd < 0)
                        return negative_errno();
                if (ftruncate(fd, (off_t) size) < 0) {
                        r = negative_errno();
                        goto fail;
                }
                if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                        r = negative_errno();
                        goto fail;
                }
        }
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
                r = negative_errno();
                goto fail;
        }
        if (mc->numa_node >= 0 && numa_available() >= 0) {
                unsigned long mask[16] = {};

                if (mc->numa_node < (int) (sizeof(mask) * 8)) {
                        mask[mc->numa_node / (8 * sizeof(long))] |= 1UL << (mc->numa_node % (8 * sizeof(long)));
                        (void) mbind(map, size, MPOL_BIND, mask, sizeof(mask) * 8, 0);  /* best effort */
                }
        }
        if (mc->lock && mlock(map, size) < 0)
                __atomic_store_n(&mc->lock_errno, errno, __ATOMIC_RELAXED);
        /* fault the pages in now, not on the first transfer */
        (void) madvise(map, size, MADV_POPULATE_WRITE);
        seg->fd = fd;
        seg->map = map;
        return 0;
fail:
        if (map != MAP_FAILED)
                munmap(map, size);
        safe_close(fd);
        return r;
}

/* On the loop, after the memory exists: a failed lock said once, the registration (io_uring, DMA). */
static int memfd_seg_prepare(SegPool *p, Segment *seg) {
        MemfdSegConfig *mc = p->userdata;
        int e = __atomic_load_n(&mc->lock_errno, __ATOMIC_RELAXED);
        int r;

        if (e && !mc->lock_failed) {
                log_warning_errno(-e, "Cannot lock %s memory (needs CAP_IPC_LOCK or LimitMEMLOCK=infinity), "
                                  "continuing unlocked: %m", mc->name);
                mc->lock_failed = true;
        }
        if (mc->on_make) {
                r = mc->on_make(seg, mc->userdata);
                if (r < 0) {
                        p->ops->drop_memory(p, seg);
                        return r;
                }
        }
        if (mc->made)
                mc->made(seg, mc->store_userdata);
        return 0;
}

static int memfd_seg_make(SegPool *p, Segment *seg, uint64_t size) {
        int r = memfd_seg_make_memory(p, seg, size);

        return r < 0 ? r : memfd_seg_prepare(p, seg);
}

static void memfd_seg_unprepare(SegPool *p, Segment *seg) {
        MemfdSegConfig *mc = p->userdata;

        if (seg->map && mc->on_drop)
                mc->on_drop(seg, mc->userdata);
}

static void memfd_seg_drop_memory(SegPool *p, Segment *seg) {
        if (seg->map)
                munmap(seg->map, p->seg_size);
        seg->map = NULL;
        seg->fd = safe_close(seg->fd);
}

static void memfd_seg_drop(SegPool *p, Segment *seg) {
        memfd_seg_unprepare(p, seg);
        memfd_seg_drop_memory(p, seg);
}

const SegPoolOps memfd_seg_ops = {
        .make = memfd_seg_make,
        .drop = memfd_seg_drop,
        .unprepare = memfd_seg_unprepare,
        .drop_memory = memfd_seg_drop_memory,
        .make_memory = memfd_seg_make_memory,
        .prepare = memfd_seg_prepare,
};
