/* SPDX-License-Identifier: MIT */
/* memfd-seg.h: segments backed by sealed memfds (host tier, emulated VRAM). */
#pragma once

#include "daemon/tiers/segpool.h"

typedef struct MemfdSegConfig {
        const char *name;       /* memfd name, shows in /proc/PID/maps */
        int numa_node;          /* -1: no binding */
        bool lock;              /* mlock the pages */
        /* called after the mapping exists / before it goes (fixed-buffer and DMA registration) */
        int (*on_make)(Segment *seg, void *userdata);
        void (*on_drop)(Segment *seg, void *userdata);
        void *userdata;
        bool lock_failed;       /* set when mlock failed (logged once) */
        int lock_errno;         /* the errno of a failed mlock (atomic: set on the renewer's thread too) */
} MemfdSegConfig;

/* SegPoolOps whose userdata is a MemfdSegConfig. */
extern const SegPoolOps memfd_seg_ops;
