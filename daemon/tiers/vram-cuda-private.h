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
/* Copy streams, each with its completion thread: uploads on the first CUDA_STREAMS_PER_DIR, downloads after. */
#define CUDA_LANES (2 * CUDA_STREAMS_PER_DIR)
/* Interprocess events for PinReply; a copy finding none free simply has none. */
#define CUDA_IPC_EVENTS 64
/* Client events pending on VRAM ranges (Unpin.ipc_event), all jobs together (VRAM_WAITS_PER_JOB each). */
#define CUDA_WAITS_MAX (4 * VRAM_WAITS_PER_JOB)
/* Client events kept open (VRAM_WAIT_EVENTS_PER_JOB pending each); the least recently used unreferenced
 * one is closed first. */
#define CUDA_OPENED_MAX (4 * VRAM_WAIT_EVENTS_PER_JOB)

struct VramCuda;

typedef struct CudaOp {
        VramCopy *copy;
        struct CudaLane *lane;  /* whose stream it is queued on */
        bool waited;            /* its stream waits for a client's event before it */
        CUevent done;           /* recorded after the copy's last piece */
        bool sync_stream;       /* done could not be recorded: its lane's thread waits for the stream */
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

/* A copy stream and the thread that waits for its copies, which complete in the order queued. */
typedef struct CudaLane {
        struct VramCuda *v;
        CUstream stream;
        unsigned load;          /* copies queued on it not handed back yet (loop thread) */
        unsigned waiting;       /* of those, copies its stream waits for a client's event before */
        pthread_t thread;
        bool thread_ok;
        pthread_cond_t cond;    /* with VramCuda.lock: a copy queued, or stopping */
        CudaOp *todo_head, **todo_tail;         /* under VramCuda.lock */
} CudaLane;

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

        CudaLane lanes[CUDA_LANES];
        CUstream aux;           /* clearing chunks and tensors */
        unsigned next_h2d, next_d2h;    /* where the search for the least loaded lane starts */

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

        /* completion threads (CudaLane) */
        pthread_mutex_t lock;
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
CUresult waits_apply(VramCuda *v, CUstream stream, const Segment *seg, uint64_t offset, uint64_t len,
                     bool *ret_waited);
bool cuda_seg_park(SegPool *p, Segment *seg, uint64_t offset, uint64_t size);
void cuda_seg_settle(SegPool *p);
int cuda_wait_event(VramBackend *b, const VramRange *ranges, size_t n, const void *handle, size_t size,
                    char *ret_why, size_t why_size);

#endif
