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
        /*
         * The memory store (state/memstore.c, wired by core/manager.c): while
         * @adopting (the pool made at start), @adopt returns the memfd the last
         * run had for the segment (kept, contents and all) or -1 for a fresh
         * one; @made hears of every segment made or renewed, on the loop.
         */
        int (*adopt)(Segment *seg, uint64_t size, void *userdata);
        void (*made)(Segment *seg, void *userdata);
        void *store_userdata;
        bool adopting;
        unsigned adopted;       /* segments whose memory came from the last run */
        bool lock_failed;       /* set when mlock failed (logged once) */
        int lock_errno;         /* the errno of a failed mlock (atomic: set on the renewer's thread too) */
} MemfdSegConfig;

/* SegPoolOps whose userdata is a MemfdSegConfig. */
extern const SegPoolOps memfd_seg_ops;
