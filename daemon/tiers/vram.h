/* SPDX-License-Identifier: MIT */
/* vram.h: the VRAM tier's backend interface (emulated or CUDA). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "daemon/tiers/segpool.h"

typedef struct MemfdSegConfig MemfdSegConfig;

typedef struct FaultSet FaultSet;

typedef struct Config Config;
typedef struct VramBackend VramBackend;
typedef struct VramCopy VramCopy;

/* Bytes of an interprocess CUDA event handle (CU_IPC_HANDLE_SIZE) on the wire. */
#define VRAM_IPC_EVENT_SIZE 64
/*
 * Client events pending on VRAM ranges (vram_wait_event()), per job: at most
 * this many ranges, naming at most VRAM_WAIT_EVENTS_PER_JOB distinct events.
 * A quarter of the cuda backend's room for all jobs, so one job never takes it all.
 */
#define VRAM_WAITS_PER_JOB 256
#define VRAM_WAIT_EVENTS_PER_JOB 64

/* A range of a VRAM segment. */
typedef struct VramRange {
        Segment *seg;
        uint64_t offset, len;
} VramRange;

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
        const char *job;        /* whose copy (injected faults select by it); read when it is started only */
        uint32_t fault_mask;    /* the fault rules that may fire for it (fault.h), set when it is started */
        void (*done)(VramCopy *c);      /* called on the event loop thread */
        VramCopy *next;         /* backend's queues */
};

typedef struct VramBackendOps {
        const char *name;       /* "emulated" or "cuda" */
        /* Start an asynchronous copy; @c stays owned by the caller until done() runs. */
        int (*copy)(VramBackend *b, VramCopy *c);
        /*
         * Zero a range synchronously (fresh tensors).  Never waits for a client's
         * event (vram_wait_event()): -EBUSY while one is pending on the range
         * (vram_zero_why() says it to the client).
         */
        int (*zero)(VramBackend *b, Segment *seg, uint64_t offset, uint64_t len);
        void (*free)(VramBackend *b);
        /*
         * Stop all work (optional): once it returns true, no copy touches host
         * memory any more and no done() callback runs.  false: the device is
         * still at it (host memory must stay mapped).
         */
        bool (*stop)(VramBackend *b);

        /* Optional; the vram_*() wrappers below say what NULL means. */
        int (*set_bandwidth)(VramBackend *b, uint64_t bandwidth);       /* emulated only */
        int (*host_register)(VramBackend *b, void *p, uint64_t size);
        void (*host_unregister)(VramBackend *b, void *p);
        int (*copy_event)(VramBackend *b, const Segment *seg, uint64_t offset, uint64_t len,
                          uint8_t ret[VRAM_IPC_EVENT_SIZE]);
        int (*wait_event)(VramBackend *b, const VramRange *ranges, size_t n, const void *handle, size_t size,
                          char *ret_why, size_t why_size);
} VramBackendOps;

struct VramBackend {
        const VramBackendOps *ops;
        SegPool pool;           /* chunks handed to jobs */
        bool emulated;
        unsigned depth;         /* copies per direction it runs at once (more only queue behind them) */
        int numa_node;          /* NUMA node of the device, -1: unknown or none */
        char device[32];        /* PCI bus id of the device ("" when emulated), told to clients */
        char description[192];  /* for status and logs */
        FaultSet *faults;       /* injected faults (tests only, fault.h; the emulated backend only); NULL: none */
};

/*
 * vram_backend_new() - pick and start the backend the config asks for.
 * backend=auto: cuda when a device works, else emulated (the reason is
 * logged once); backend=cuda without a device: -ENODEV with the reason in
 * *ret_error.
 */
int vram_backend_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error);
/*
 * vram_backend_device_new() - vram_backend_new() up to the emulated
 * backend: 1 with the cuda backend in *@ret; 0 with *@ret NULL when the
 * backend is to be emulated (backend = emulated, or auto without a usable
 * device: the reason is logged), nothing made yet; -errno as
 * vram_backend_new().  Whoever gets 0 calls vram_emul_new(), and can check
 * first that the emulated pool, which is host memory, fits (the manager).
 */
int vram_backend_device_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error);
VramBackend *vram_backend_free(VramBackend *b);
/*
 * vram_backend_stop() - stop the backend's copies before the host pool
 * goes (tierd's stop): a copy in flight is abandoned, its done() never
 * runs.  true when no copy can touch host memory any more; false when one
 * still may (a device that does not finish): then the host pool must not
 * be unmapped.
 */
bool vram_backend_stop(VramBackend *b);

int vram_emul_new(const Config *c, sd_event *event, VramBackend **ret);
/* The same, its pool's segments adopted from and handed to the memory store (@store's hooks; NULL: none). */
int vram_emul_new_stored(const Config *c, sd_event *event, const MemfdSegConfig *store, VramBackend **ret);
/* The capacity vram_emul_new() makes for @c: [vram] capacity, 0 meaning the built-in default (1G). */
uint64_t vram_emul_capacity(const Config *c);
/*
 * vram_set_bandwidth() - change the emulated host<->VRAM link's throttle
 * ([vram] bandwidth, bytes/s, 0 unthrottled) while copies run: the mover
 * thread paces its next piece at the new rate.  -EOPNOTSUPP for the cuda
 * backend, whose link is the real one.
 */
int vram_set_bandwidth(VramBackend *b, uint64_t bandwidth);
/* Returns -ENODEV (reason in *ret_error) when no CUDA device can be used. */
int vram_cuda_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error);

/* What a client is told of VramBackendOps.zero's failure @r (-errno). */
const char *vram_zero_why(int r);

/* NUMA node of the backend's device, or -1 (emulated, unknown, not a NUMA machine). */
int vram_numa_node(const VramBackend *b);

/*
 * vram_host_register() - make a host-tier segment DMA-capable for the device
 * (cuMemHostRegister), so that copies from and to it run asynchronously at
 * full speed.  0 when the backend needs nothing (emulated).  The host pool's
 * make hook calls it after mapping a segment, and vram_host_unregister()
 * before the mapping goes.
 */
int vram_host_register(VramBackend *b, Segment *seg);
void vram_host_unregister(VramBackend *b, Segment *seg);

/*
 * vram_copy_event() - the interprocess CUDA event that completes with the
 * copy into [@offset, @offset + @len) of @seg now queued on the device, for a
 * client's stream to wait on (PinReply.ipc_event).  Returns 1 with @ret
 * filled, 0 when no one copy of that whole range is queued (none, or the range
 * goes in several copies: a chained transfer's, or one split over host
 * pieces, whose first copy's event would say nothing of the others), or the
 * backend has no events: the fence is the only completion signal then.
 */
int vram_copy_event(VramBackend *b, const Segment *seg, uint64_t offset, uint64_t len,
                    uint8_t ret[VRAM_IPC_EVENT_SIZE]);

/*
 * vram_wait_event() - a client unpinned the @n ranges @ranges (a tensor's
 * pieces, all in segments of one job) with work still queued on its own
 * stream that writes them, and recorded the interprocess event @handle after
 * that work (Unpin.ipc_event): every later copy or fill of those ranges waits
 * for the event on the device first.  All or nothing.  -EOPNOTSUPP for the
 * emulated backend, -EINVAL for a handle that cannot be opened or ranges of
 * several jobs, -ENOBUFS when the job already has VRAM_WAITS_PER_JOB ranges or
 * VRAM_WAIT_EVENTS_PER_JOB events pending, or all jobs together as many as
 * the backend keeps; then @ret_why (@why_size bytes, may be NULL) says which.
 */
int vram_wait_event(VramBackend *b, const VramRange *ranges, size_t n, const void *handle, size_t size,
                    char *ret_why, size_t why_size);
