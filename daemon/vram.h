/* SPDX-License-Identifier: MIT */
/* vram.h: the VRAM tier's backend interface (emulated or CUDA). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "daemon/segpool.h"

typedef struct Config Config;
typedef struct VramBackend VramBackend;
typedef struct VramCopy VramCopy;

typedef enum VramDir {
        VRAM_TO_DEVICE,         /* host -> vram */
        VRAM_TO_HOST,           /* vram -> host */
} VramDir;

/* One asynchronous copy between a host address and a VRAM segment range. */
struct VramCopy {
        VramDir dir;
        void *host;
        Segment *seg;
        uint64_t offset;
        uint64_t len;
        int result;             /* 0 or -errno, set before @done runs */
        void (*done)(VramCopy *c);      /* called on the event loop thread */
        VramCopy *next;         /* backend's queues */
};

typedef struct VramBackendOps {
        const char *name;       /* "emulated" or "cuda" */
        /* Start an asynchronous copy; @c stays owned by the caller until done() runs. */
        int (*copy)(VramBackend *b, VramCopy *c);
        /* Zero a range synchronously (fresh tensors). */
        int (*zero)(VramBackend *b, Segment *seg, uint64_t offset, uint64_t len);
        void (*free)(VramBackend *b);
} VramBackendOps;

struct VramBackend {
        const VramBackendOps *ops;
        SegPool pool;           /* chunks handed to jobs */
        bool emulated;
        char description[128];  /* for status and logs */
};

/*
 * vram_backend_new() - pick and start the backend the config asks for.
 * backend=auto: cuda when a device works, else emulated (the reason is
 * logged once); backend=cuda without a device: -ENODEV with the reason in
 * *ret_error.
 */
int vram_backend_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error);
VramBackend *vram_backend_free(VramBackend *b);

int vram_emul_new(const Config *c, sd_event *event, VramBackend **ret);
/*
 * vram_set_bandwidth() - change the emulated host<->VRAM link's throttle
 * ([vram] bandwidth, bytes/s, 0 unthrottled) while copies run: the mover
 * thread paces its next piece at the new rate.  -EOPNOTSUPP for the cuda
 * backend, whose link is the real one.
 */
int vram_set_bandwidth(VramBackend *b, uint64_t bandwidth);
/* Returns -ENODEV (reason in *ret_error) when no CUDA device can be used. */
int vram_cuda_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error);
