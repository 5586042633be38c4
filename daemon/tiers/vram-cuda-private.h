/* SPDX-License-Identifier: MIT */
/* vram-cuda-private.h: the CUDA VRAM backend's state, shared by its files (never installed). */
#pragma once

#if TIERD_HAVE_CUDA
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/tiers/segpool.h"
#include "daemon/tiers/vram.h"
#include "proto/cudrv.h"

/* Streams per direction: an upload and a download always overlap, and two of each. */
#define CUDA_STREAMS_PER_DIR 2
/* Interprocess events for PinReply; a copy finding none free simply has none. */
#define CUDA_IPC_EVENTS 64
/* Client events pending on VRAM ranges (Unpin.ipc_event), all jobs together (VRAM_WAITS_PER_JOB each). */
#define CUDA_WAITS_MAX (4 * VRAM_WAITS_PER_JOB)
/* Client events kept open (VRAM_WAIT_EVENTS_PER_JOB pending each); the least recently used unreferenced
 * one is closed first. */
#define CUDA_OPENED_MAX (4 * VRAM_WAIT_EVENTS_PER_JOB)

typedef struct CudaOp {
        VramCopy *copy;
        CUevent done;           /* recorded after the copy's last piece */
        int ipc;                /* VramCuda.ipc index recorded after it, or -1 */
        CUresult result;        /* of queueing, then of the wait */
        struct CudaOp *next;    /* todo, done and free lists */
        List link;              /* VramCuda.inflight */
} CudaOp;

typedef struct CudaIpcEvent {
        CUevent event;
        CUipcEventHandle handle;
        bool busy;              /* recorded for a copy that has not completed */
} CudaIpcEvent;

typedef struct CudaOpened {
        CUipcEventHandle handle;
        CUevent event;          /* NULL: slot unused */
        unsigned refs;          /* CudaWaits naming it */
        uint64_t last_use;
        uint64_t mark;          /* counted already (waits_of_job()) */
} CudaOpened;

typedef struct CudaWait {
        const Segment *seg;
        uint64_t offset, len;
        CudaOpened *opened;
} CudaWait;

/* A range given back (segment_free()) while a CudaWait on it is pending: kept taken until none is. */
typedef struct CudaParked {
        Segment *seg;
        uint64_t offset, size;
} CudaParked;

typedef struct VramCuda {
        VramBackend base;
        CuDriver *drv;
        CUdevice dev;
        CUcontext ctx;
        bool ctx_retained;
        size_t granularity;
        CUmemAllocationProp prop;
        CUmemGenericAllocationHandle *handles;  /* per segment id; 0: none */
        uint32_t n_handles;

        CUstream h2d[CUDA_STREAMS_PER_DIR], d2h[CUDA_STREAMS_PER_DIR];
        CUstream aux;           /* clearing chunks and tensors */
        unsigned next_h2d, next_d2h;

        CudaIpcEvent ipc[CUDA_IPC_EVENTS];
        unsigned n_ipc, next_ipc;
        CudaOpened opened[CUDA_OPENED_MAX];
        CudaWait waits[CUDA_WAITS_MAX];
        size_t n_waits;
        CudaParked parked[CUDA_WAITS_MAX];      /* each overlaps a wait of its own: no more than waits */
        size_t n_parked;
        uint64_t use_clock;

        bool host_register_failed;      /* warned about it once */

        List inflight;          /* CudaOp.link, on the loop thread only */
        CudaOp *free_ops;       /* loop thread only */

        /* completion thread */
        pthread_t thread;
        bool thread_ok;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        CudaOp *todo_head, **todo_tail;
        CudaOp *done_head, **done_tail;
        bool stop;
        int efd;
        sd_event_source *efd_source;
} VramCuda;

const char *cu_err(VramCuda *v, CUresult r);

/* vram-cuda-wait.c: client events on VRAM ranges. */
void waits_drop_segment(VramCuda *v, const Segment *seg);
bool waits_pending_on(VramCuda *v, const Segment *seg, uint64_t offset, uint64_t len);
void waits_prune(VramCuda *v);
CUresult waits_apply(VramCuda *v, CUstream stream, const Segment *seg, uint64_t offset, uint64_t len);
bool cuda_seg_park(SegPool *p, Segment *seg, uint64_t offset, uint64_t size);
void cuda_seg_settle(SegPool *p);
int cuda_wait_event(VramBackend *b, const VramRange *ranges, size_t n, const void *handle, size_t size,
                    char *ret_why, size_t why_size);

#endif
