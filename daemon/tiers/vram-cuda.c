/* SPDX-License-Identifier: MIT */
/* vram-cuda.c: the CUDA VRAM backend: VMM chunks shared by fd, copies on tierd's streams. */

/*
 * Theory of operation.
 *
 * No link dependency: the driver API comes from libcuda.so.1 through
 * dlopen() (proto/cudrv.c).  Where it cannot be loaded, or finds no device
 * that supports VMM allocations exportable as POSIX fds, vram_cuda_new()
 * returns -ENODEV with the reason, and vram.c either falls back to the
 * emulated backend (backend = auto) or refuses to start (backend = cuda).
 * tierd uses device 0 of those visible to it (CUDA_VISIBLE_DEVICES picks).
 *
 * Arena.  The pool's segments are physical chunks from cuMemCreate
 * (pinned device memory, requested with POSIX-fd shareable handles), all
 * made at start-up like the host pool's memfds.  Chunk size: [vram]
 * chunk_size rounded up to the device's recommended granularity.
 * Capacity: [vram] capacity, cut to VRAM_CUDA_FREE_PERCENT of the device
 * memory free at start-up when it asks for more (a notice says so), or that
 * share when it is 0, in whole chunks.  Each chunk is
 *   - exported once (cuMemExportToShareableHandle) to an fd that tierd
 *     keeps, CLOEXEC, in Segment.fd: conn.c sends that fd (SCM_RIGHTS) to the
 *     connections of the one job that owns the chunk, like a memfd.  One fd
 *     per chunk for the chunk's life costs one descriptor each (LimitNOFILE
 *     must exceed the chunk count) and no export per send;
 *   - mapped by tierd too (cuMemAddressReserve + cuMemMap + cuMemSetAccess,
 *     Segment.device_ptr), so its own streams copy into it and clear it;
 *   - zeroed before first use (cuMemsetD8): the driver does not promise
 *     zeroed memory from cuMemCreate, and inside one process it may hand
 *     back what another job's chunk held.
 * When a job gives a chunk back, segpool_release() drops it (unmap, close
 * the exported fd, cuMemRelease) and makes a new one rather than clearing
 * the old: a client of the old job may still map the old physical memory,
 * which the driver keeps alive until that mapping goes, so it must never
 * become another job's memory.  That memory is only freed once the old
 * clients let go, hence the cooperative revoke of daemon/revoke.c before
 * the drop.
 *
 * Copies.  Host<->VRAM copies run on tierd's own non-blocking streams, two
 * per direction (so an upload and a download, and two tensors in one
 * direction, overlap on the copy engines), each a lane (CudaLane) with a
 * completion thread of its own.  A copy goes on a lane of its direction
 * where no copy still waits for a client's event (below) if there is one,
 * and of those on the one with the fewest copies not handed back yet,
 * equals taking turns (lane_pick()); it is queued as VRAM_CUDA_PIECE
 * pieces, then an event is recorded after it (when that fails, the lane's
 * thread synchronizes on the stream instead and hands the copy back failed:
 * the loop thread never does, the stream may wait for a client's event).
 * A stream runs its work in order, so each lane's thread takes its copies in
 * the order queued and waits on each event (cuEventSynchronize; the events
 * use blocking sync, so it sleeps: no polling, and a copy is handed back as
 * soon as it and those before it on its stream are done, as with one
 * thread), then hands the copy back through a queue and an eventfd that
 * sd-event watches: done() runs on the loop thread, which never waits for
 * the device.  A copy held up on one stream holds up no other stream.  The
 * host side of a copy is a host-tier segment, which manager.c registers
 * with cuMemHostRegister (vram_host_register()) so copies are true DMA.
 *
 * Stream-ordered completion.  After an upload tierd also records one of a
 * pool of interprocess events (CU_EVENT_INTERPROCESS, handle taken once
 * with cuIpcGetEventHandle).  While the copy is in flight,
 * vram_copy_event() returns that handle, which rpc.c puts in PinReply: the
 * client's stream can wait on it instead of the client waiting on the
 * fence.  An event of the pool is used again only after its copy has
 * completed, so a client that waits on a handle late waits at worst for
 * an unrelated later copy, never for less than its own.
 *
 * Client events (Unpin.ipc_event) pending on VRAM ranges, and the ranges
 * they park: vram-cuda-wait.c.
 *
 * What a client event that never completes stalls (a known limitation, not
 * the intent): the copy made to wait for it never completes, nor does what
 * its stream runs after it, and its range stays parked.  The other stream
 * of its direction, and the streams of the other direction, go on: new
 * copies avoid a stream that waits for a client's event while the other
 * does not.  But the stuck copy keeps one of the engine's places with the
 * backend (VramBackend.depth, CUDA_STREAMS_PER_DIR per direction), so
 * meanwhile that direction has one place left; with a copy stuck on each
 * stream of a direction, that direction stops.  Only cuda_free() gives up,
 * after CUDA_STOP_TIMEOUT_SEC.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/tiers/vram-cuda-private.h"
#include "daemon/tiers/vram-cuda.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#if TIERD_HAVE_CUDA
#include "proto/cudrv.h"
#endif

static int fail(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int fail(char **ret_error, int r, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        return r;
}

#if TIERD_HAVE_CUDA

/* How long freeing the backend waits for copies still on the device. */
#define CUDA_STOP_TIMEOUT_SEC 5
/* Descriptors kept free for everything but the chunks' exported fds (connections, targets, ...). */
#define CUDA_NOFILE_SPARE 1024

const char *cu_err(VramCuda *v, CUresult r) {
        static _Thread_local char buf[160];

        return cudrv_strerror(v->drv, r, buf, sizeof(buf));
}

/* ---- chunks ------------------------------------------------------------------------------- */

static int cuda_seg_make(SegPool *p, Segment *seg, uint64_t size) {
        VramCuda *v = p->userdata;
        const CuDriver *d = v->drv;
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        int fd = -1, r;
        CUresult cr;

        cr = d->cuMemCreate(&h, size, &v->prop, 0);
        if (cr != CUDA_SUCCESS)
                goto fail;
        cr = d->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (cr != CUDA_SUCCESS)
                goto release;
        /* the driver's fd is not close-on-exec; ours all are */
        if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
                r = negative_errno();
                safe_close(fd);
                (void) d->cuMemRelease(h);
                return r;
        }
        cr = cudrv_map(d, h, size, v->granularity, v->dev, &va);
        if (cr != CUDA_SUCCESS)
                goto close_fd;
        cr = d->cuMemsetD8Async(va, 0, size, v->aux);
        if (cr == CUDA_SUCCESS)
                cr = d->cuStreamSynchronize(v->aux);
        if (cr != CUDA_SUCCESS)
                goto unmap;

        seg->fd = fd;
        seg->device_ptr = va;
        seg->map = NULL;
        v->handles[seg->id] = h;
        return 0;
unmap:
        cudrv_unmap(d, va, size);
close_fd:
        safe_close(fd);
release:
        (void) d->cuMemRelease(h);
fail:
        log_debug("Cannot make VRAM chunk %u: %s", seg->id, cu_err(v, cr));
        return cudrv_errno(cr);
}

static void cuda_seg_drop(SegPool *p, Segment *seg) {
        VramCuda *v = p->userdata;

        waits_drop_segment(v, seg);
        cudrv_unmap(v->drv, seg->device_ptr, p->seg_size);
        seg->device_ptr = 0;
        seg->fd = safe_close(seg->fd);
        if (v->handles[seg->id]) {
                (void) v->drv->cuMemRelease(v->handles[seg->id]);
                v->handles[seg->id] = 0;
        }
}

static const SegPoolOps cuda_seg_ops = {
        .make = cuda_seg_make,
        .drop = cuda_seg_drop,
        .park = cuda_seg_park,
        .settle = cuda_seg_settle,
};

/* ---- copies ---------------------------------------------------------------------------------- */

/* A lane's completion thread: waits for its stream's copies in order, hands each back as it completes. */
static void *lane_thread(void *userdata) {
        CudaLane *l = userdata;
        VramCuda *v = l->v;

        (void) v->drv->cuCtxSetCurrent(v->ctx);
        pthread_mutex_lock(&v->lock);
        for (;;) {
                CudaOp *op;
                CUresult r;

                while (!l->todo_head && !v->stop)
                        pthread_cond_wait(&l->cond, &v->lock);
                if (!l->todo_head)
                        break;          /* stopping, and nothing left on the stream */
                op = l->todo_head;
                l->todo_head = op->next;
                if (!l->todo_head)
                        l->todo_tail = &l->todo_head;
                pthread_mutex_unlock(&v->lock);

                r = op->sync_stream ? v->drv->cuStreamSynchronize(l->stream) : v->drv->cuEventSynchronize(op->done);
                if (op->result == CUDA_SUCCESS)
                        op->result = r;

                pthread_mutex_lock(&v->lock);
                op->next = NULL;
                *v->done_tail = op;
                v->done_tail = &op->next;
                {
                        uint64_t one = 1;
                        (void) !write(v->efd, &one, sizeof(one));
                }
        }
        pthread_mutex_unlock(&v->lock);
        return NULL;
}

/*
 * The lane of @dir for a new copy: one whose stream waits for no client's event if there is one (such
 * an event may never complete, and all the stream runs after it waits too), then the one with the
 * fewest copies not handed back; the search starts after the lane taken last, so equals take turns.
 */
static CudaLane *lane_pick(VramCuda *v, VramDir dir) {
        unsigned *next = dir == VRAM_TO_DEVICE ? &v->next_h2d : &v->next_d2h;
        CudaLane *lanes = &v->lanes[dir == VRAM_TO_DEVICE ? 0 : CUDA_STREAMS_PER_DIR], *best = NULL;
        unsigned k = 0;

        for (unsigned i = 0; i < CUDA_STREAMS_PER_DIR; i++) {
                unsigned j = (*next + i) % CUDA_STREAMS_PER_DIR;

                if (!best || (lanes[j].waiting == 0 && best->waiting > 0) ||
                    ((lanes[j].waiting == 0) == (best->waiting == 0) && lanes[j].load < best->load)) {
                        best = &lanes[j];
                        k = j;
                }
        }
        *next = k + 1;
        return best;
}

static void op_put(VramCuda *v, CudaOp *op) {
        op->copy = NULL;
        op->next = v->free_ops;
        v->free_ops = op;
}

static CudaOp *op_get(VramCuda *v, CUresult *ret) {
        CudaOp *op = v->free_ops;

        if (op) {
                v->free_ops = op->next;
        } else {
                op = calloc(1, sizeof(*op));
                if (!op) {
                        *ret = CUDA_ERROR_OUT_OF_MEMORY;
                        return NULL;
                }
                *ret = v->drv->cuEventCreate(&op->done, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
                if (*ret != CUDA_SUCCESS) {
                        free(op);
                        return NULL;
                }
        }
        op->next = NULL;
        op->ipc = -1;
        op->lane = NULL;
        op->waited = false;
        op->sync_stream = false;
        op->result = CUDA_SUCCESS;
        list_init(&op->link);
        return op;
}

static void ops_free(VramCuda *v) {
        while (v->free_ops) {
                CudaOp *op = v->free_ops;

                v->free_ops = op->next;
                (void) v->drv->cuEventDestroy(op->done);
                free(op);
        }
}

static int on_cuda_done(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VramCuda *v = userdata;
        CudaOp *list;
        uint64_t n;

        (void) !read(v->efd, &n, sizeof(n));
        pthread_mutex_lock(&v->lock);
        list = v->done_head;
        v->done_head = NULL;
        v->done_tail = &v->done_head;
        pthread_mutex_unlock(&v->lock);

        while (list) {
                CudaOp *op = list;
                VramCopy *c = op->copy;

                list = op->next;
                list_del(&op->link);
                op->lane->load--;
                op->lane->waiting -= op->waited;
                if (op->ipc >= 0)
                        v->ipc[op->ipc].busy = false;
                c->result = cudrv_errno(op->result);
                if (op->result != CUDA_SUCCESS)
                        log_warning("VRAM copy of %" PRIu64 " bytes %s chunk %u failed: %s", c->len,
                                    c->dir == VRAM_TO_DEVICE ? "into" : "out of", c->seg->id, cu_err(v, op->result));
                op_put(v, op);
                c->next = NULL;
                c->done(c);
        }
        return 0;
}

static int cuda_copy(VramBackend *b, VramCopy *c) {
        VramCuda *v = container_of(b, VramCuda, base);
        const CuDriver *d = v->drv;
        CudaLane *lane;
        CUstream stream;
        CudaOp *op;
        CUresult r;
        uint64_t off;

        if (!c->seg || !c->seg->device_ptr || c->len == 0 || c->offset + c->len > c->seg->pool->seg_size)
                return -EINVAL;
        op = op_get(v, &r);
        if (!op)
                return cudrv_errno(r);
        op->copy = c;
        lane = lane_pick(v, c->dir);
        stream = lane->stream;

        r = waits_apply(v, stream, c->seg, c->offset, c->len, &op->waited);
        if (r != CUDA_SUCCESS) {
                op_put(v, op);
                return cudrv_errno(r);
        }
        for (off = 0; off < c->len; off += VRAM_CUDA_PIECE) {
                uint64_t n = MIN((uint64_t) VRAM_CUDA_PIECE, c->len - off);
                CUdeviceptr dev = c->seg->device_ptr + c->offset + off;
                uint8_t *host = (uint8_t *) c->host + off;

                if (c->dir == VRAM_TO_DEVICE)
                        r = d->cuMemcpyHtoDAsync(dev, host, n, stream);
                else
                        r = d->cuMemcpyDtoHAsync(host, dev, n, stream);
                if (r != CUDA_SUCCESS)
                        break;
        }
        if (r != CUDA_SUCCESS && off == 0) {
                op_put(v, op);          /* nothing was queued */
                log_warning("Cannot queue a VRAM copy of %" PRIu64 " bytes: %s", c->len, cu_err(v, r));
                return cudrv_errno(r);
        }
        op->result = r;
        /* even after a failed piece: the done event orders after the pieces already queued */
        r = d->cuEventRecord(op->done, stream);
        if (r != CUDA_SUCCESS) {
                /*
                 * Nothing to wait on: the lane's thread waits for the whole stream instead, and hands
                 * the copy back failed once no piece still reads or writes the memory.  Never here:
                 * the stream may wait for a client's event, which the loop thread must not.
                 */
                log_warning("Cannot record a VRAM copy's event: %s", cu_err(v, r));
                if (op->result == CUDA_SUCCESS)
                        op->result = r;
                op->sync_stream = true;
        } else if (c->dir == VRAM_TO_DEVICE && op->result == CUDA_SUCCESS) {
                for (unsigned i = 0; i < v->n_ipc; i++) {
                        unsigned k = (v->next_ipc + i) % v->n_ipc;

                        if (v->ipc[k].busy)
                                continue;
                        if (d->cuEventRecord(v->ipc[k].event, stream) == CUDA_SUCCESS) {
                                v->ipc[k].busy = true;
                                op->ipc = (int) k;
                                v->next_ipc = k + 1;
                        }
                        break;
                }
        }

        list_add_tail(&v->inflight, &op->link);
        op->lane = lane;
        lane->load++;
        lane->waiting += op->waited;
        pthread_mutex_lock(&v->lock);
        *lane->todo_tail = op;
        lane->todo_tail = &op->next;
        pthread_cond_signal(&lane->cond);
        pthread_mutex_unlock(&v->lock);
        return 0;
}

static int cuda_zero(VramBackend *b, Segment *seg, uint64_t offset, uint64_t len) {
        VramCuda *v = container_of(b, VramCuda, base);
        CUresult r;

        if (!seg->device_ptr || offset + len > seg->pool->seg_size)
                return -EINVAL;
        /*
         * Never wait on the loop thread for a client's event: a range given back with one pending
         * is parked until it completes, so only a copy refilled in place can meet one here.
         */
        waits_prune(v);
        if (waits_pending_on(v, seg, offset, len))
                return -EBUSY;
        r = v->drv->cuMemsetD8Async(seg->device_ptr + offset, 0, len, v->aux);
        if (r == CUDA_SUCCESS)
                r = v->drv->cuStreamSynchronize(v->aux);
        if (r != CUDA_SUCCESS)
                log_warning("Cannot clear %" PRIu64 " bytes of VRAM chunk %u: %s", len, seg->id, cu_err(v, r));
        return cudrv_errno(r);
}

static int cuda_copy_event(VramBackend *b, const Segment *seg, uint64_t offset, uint64_t len,
                           uint8_t ret[VRAM_IPC_EVENT_SIZE]) {
        VramCuda *v = container_of(b, VramCuda, base);

        list_for_each_safe(n, tmp, &v->inflight) {
                CudaOp *op = list_entry(n, CudaOp, link);

                if (op->ipc >= 0 && op->copy->seg == seg && op->copy->offset == offset && op->copy->len == len &&
                    op->copy->dir == VRAM_TO_DEVICE) {
                        memcpy(ret, &v->ipc[op->ipc].handle, VRAM_IPC_EVENT_SIZE);
                        return 1;
                }
        }
        return 0;
}

/* ---- host memory ------------------------------------------------------------------------------ */

static int cuda_host_register(VramBackend *b, void *p, uint64_t size) {
        VramCuda *v = container_of(b, VramCuda, base);
        CUresult r;

        r = v->drv->cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE);
        if (r != CUDA_SUCCESS && !v->host_register_failed)
                log_warning("Cannot register %" PRIu64 " bytes of host memory with CUDA, copies from and to it "
                            "will be staged and slower (logged once): %s", size, cu_err(v, r));
        v->host_register_failed |= r != CUDA_SUCCESS;
        return cudrv_errno(r);
}

static void cuda_host_unregister(VramBackend *b, void *p) {
        VramCuda *v = container_of(b, VramCuda, base);

        (void) v->drv->cuMemHostUnregister(p);
}

/* ---- life cycle --------------------------------------------------------------------------------- */

/* Stop the lanes' threads once their streams have run dry; false if one has not by the deadline. */
static bool thread_stop(VramCuda *v) {
        struct timespec until;
        bool ok = true;

        pthread_mutex_lock(&v->lock);
        v->stop = true;
        for (int i = 0; i < CUDA_LANES; i++)
                pthread_cond_signal(&v->lanes[i].cond);
        pthread_mutex_unlock(&v->lock);
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += CUDA_STOP_TIMEOUT_SEC;
        for (int i = 0; i < CUDA_LANES; i++) {
                CudaLane *l = &v->lanes[i];

                if (!l->thread_ok)
                        continue;
                if (pthread_timedjoin_np(l->thread, NULL, &until) != 0)
                        ok = false;
                else
                        l->thread_ok = false;
        }
        return ok;
}

/* The device finishes what it was given (bounded by CUDA_STOP_TIMEOUT_SEC); no done() runs after. */
static bool cuda_stop(VramBackend *b) {
        return thread_stop(container_of(b, VramCuda, base));
}

static void cuda_free(VramBackend *b) {
        VramCuda *v = container_of(b, VramCuda, base);
        const CuDriver *d = v->drv;

        if (!thread_stop(v)) {
                /* a copy never completes (a client's event that never fires?): leave it all be */
                log_warning("A VRAM copy is still running on the GPU after %d s; not freeing the CUDA backend",
                            CUDA_STOP_TIMEOUT_SEC);
                return;
        }
        v->efd_source = sd_event_source_disable_unref(v->efd_source);
        v->efd = safe_close(v->efd);
        if (d) {
                segpool_deinit(&v->base.pool);
                for (size_t i = 0; i < CUDA_OPENED_MAX; i++)
                        if (v->opened[i].event)
                                (void) d->cuEventDestroy(v->opened[i].event);
                for (unsigned i = 0; i < v->n_ipc; i++)
                        (void) d->cuEventDestroy(v->ipc[i].event);
                /* ops handed back by the thread after the loop stopped listening */
                while (v->done_head) {
                        CudaOp *op = v->done_head;

                        v->done_head = op->next;
                        list_del(&op->link);
                        op_put(v, op);
                }
                ops_free(v);
                for (int i = 0; i < CUDA_LANES; i++)
                        if (v->lanes[i].stream)
                                (void) d->cuStreamDestroy(v->lanes[i].stream);
                if (v->aux)
                        (void) d->cuStreamDestroy(v->aux);
                if (v->ctx_retained)
                        (void) d->cuDevicePrimaryCtxRelease(v->dev);
        }
        free(v->handles);
        pthread_mutex_destroy(&v->lock);
        for (int i = 0; i < CUDA_LANES; i++)
                pthread_cond_destroy(&v->lanes[i].cond);
        v->drv = cudrv_close(v->drv);
        free(v);
}

static const VramBackendOps cuda_ops = {
        .name = "cuda",
        .copy = cuda_copy,
        .zero = cuda_zero,
        .free = cuda_free,
        .stop = cuda_stop,
        .host_register = cuda_host_register,
        .host_unregister = cuda_host_unregister,
        .copy_event = cuda_copy_event,
        .wait_event = cuda_wait_event,
};

/* Make the interprocess events of PinReply; without them clients wait on fences only. */
static void ipc_events_new(VramCuda *v) {
        const CuDriver *d = v->drv;
        CUresult r = CUDA_SUCCESS;

        for (v->n_ipc = 0; v->n_ipc < CUDA_IPC_EVENTS; v->n_ipc++) {
                CudaIpcEvent *e = &v->ipc[v->n_ipc];

                r = d->cuEventCreate(&e->event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
                if (r != CUDA_SUCCESS)
                        break;
                r = d->cuIpcGetEventHandle(&e->handle, e->event);
                if (r != CUDA_SUCCESS) {
                        (void) d->cuEventDestroy(e->event);
                        break;
                }
        }
        if (r != CUDA_SUCCESS)
                log_notice("Cannot make interprocess CUDA events (%s): clients wait for copies on fences only",
                           cu_err(v, r));
}

static int cuda_new(VramCuda *v, const Config *c, sd_event *event, char **ret_error) {
        const CuDriver *d = v->drv;
        char name[128] = "";
        uint64_t chunk, capacity;
        size_t free_bytes = 0, total = 0;
        int n = 0, vmm = 0, fd_ok = 0, clamped, r;
        CUresult cr;

        cr = d->cuDeviceGetCount(&n);
        if (cr != CUDA_SUCCESS || n <= 0)
                return fail(ret_error, -ENODEV, "the driver reports no CUDA device%s%s",
                            cr != CUDA_SUCCESS ? ": " : "", cr != CUDA_SUCCESS ? cu_err(v, cr) : "");
        cr = d->cuDeviceGet(&v->dev, 0);
        if (cr == CUDA_SUCCESS)
                cr = d->cuDeviceGetName(name, sizeof(name), v->dev);
        if (cr == CUDA_SUCCESS)
                cr = d->cuDeviceGetPCIBusId(v->base.device, sizeof(v->base.device), v->dev);
        if (cr == CUDA_SUCCESS)
                cr = d->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, v->dev);
        if (cr == CUDA_SUCCESS)
                cr = d->cuDeviceGetAttribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                             v->dev);
        if (cr != CUDA_SUCCESS)
                return fail(ret_error, -ENODEV, "cannot query CUDA device 0: %s", cu_err(v, cr));
        if (!vmm)
                return fail(ret_error, -ENODEV, "CUDA device 0 (%s) does not support virtual memory management",
                            name);
        if (!fd_ok)
                return fail(ret_error, -ENODEV, "CUDA device 0 (%s) cannot export memory as POSIX file descriptors",
                            name);
        v->base.numa_node = vram_cuda_numa_node_of(NULL, v->base.device);

        cr = d->cuDevicePrimaryCtxRetain(&v->ctx, v->dev);
        if (cr != CUDA_SUCCESS)
                return fail(ret_error, -ENODEV, "cannot use CUDA device 0 (%s): %s", name, cu_err(v, cr));
        v->ctx_retained = true;
        cr = d->cuCtxSetCurrent(v->ctx);
        if (cr != CUDA_SUCCESS)
                return fail(ret_error, -ENODEV, "cannot use CUDA device 0 (%s): %s", name, cu_err(v, cr));

        v->prop = (CUmemAllocationProp) {
                .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = v->dev },
        };
        cr = d->cuMemGetAllocationGranularity(&v->granularity, &v->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        if (cr == CUDA_SUCCESS)
                cr = d->cuMemGetInfo(&free_bytes, &total);
        if (cr != CUDA_SUCCESS)
                return fail(ret_error, -ENODEV, "cannot query CUDA device 0 (%s): %s", name, cu_err(v, cr));
        r = vram_cuda_arena(c->vram_chunk_size, c->vram_capacity, v->granularity, free_bytes, &chunk, &capacity,
                            &clamped);
        if (r < 0)
                return fail(ret_error, r, "CUDA device 0 (%s) has %zu bytes free, not enough for one VRAM chunk "
                            "of %" PRIu64 " bytes", name, free_bytes, ALIGN_UP(c->vram_chunk_size, v->granularity));
        if (clamped)
                log_notice("[vram] capacity of %" PRIu64 " bytes is more than %u%% of the free memory of %s "
                           "(%zu bytes): using %" PRIu64 " bytes", c->vram_capacity, VRAM_CUDA_FREE_PERCENT, name,
                           free_bytes, capacity);
        if (chunk != c->vram_chunk_size)
                log_info("[vram] chunk_size rounded up to %" PRIu64 " bytes (the device's granularity is %zu)",
                         chunk, v->granularity);

        for (int i = 0; i < CUDA_LANES; i++) {
                cr = d->cuStreamCreate(&v->lanes[i].stream, CU_STREAM_NON_BLOCKING);
                if (cr != CUDA_SUCCESS)
                        return fail(ret_error, cudrv_errno(cr), "cannot create CUDA streams: %s", cu_err(v, cr));
        }
        cr = d->cuStreamCreate(&v->aux, CU_STREAM_NON_BLOCKING);
        if (cr != CUDA_SUCCESS)
                return fail(ret_error, cudrv_errno(cr), "cannot create CUDA streams: %s", cu_err(v, cr));
        ipc_events_new(v);

        v->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (v->efd < 0)
                return fail(ret_error, negative_errno(), "cannot create an eventfd: %m");
        r = sd_event_add_io(event, &v->efd_source, v->efd, EPOLLIN, on_cuda_done, v);
        if (r < 0)
                return fail(ret_error, r, "cannot watch the copy eventfd: %s", strerror(-r));
        (void) sd_event_source_set_description(v->efd_source, "vram-cuda-done");
        for (int i = 0; i < CUDA_LANES; i++) {
                CudaLane *l = &v->lanes[i];

                r = -pthread_create(&l->thread, NULL, lane_thread, l);
                if (r < 0)
                        return fail(ret_error, r, "cannot start a copy completion thread: %s", strerror(-r));
                l->thread_ok = true;
                (void) pthread_setname_np(l->thread, "tierd-cuda");
        }

        v->n_handles = (uint32_t) (capacity / chunk);
        /* one exported fd per chunk, kept: raise the soft limit (systemd's default is 1024) if need be */
        {
                struct rlimit rl;
                rlim_t want = (rlim_t) v->n_handles + CUDA_NOFILE_SPARE;

                if (getrlimit(RLIMIT_NOFILE, &rl) >= 0 && rl.rlim_cur < want) {
                        rl.rlim_cur = MIN(want, rl.rlim_max);
                        if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < want)
                                log_warning("%u VRAM chunks need %llu file descriptors, RLIMIT_NOFILE allows %llu "
                                            "(raise LimitNOFILE= or [vram] chunk_size), continuing",
                                            v->n_handles, (unsigned long long) want, (unsigned long long) rl.rlim_cur);
                }
        }
        v->handles = calloc(v->n_handles, sizeof(*v->handles));
        if (!v->handles)
                return -ENOMEM;
        r = segpool_init(&v->base.pool, "cuda", &cuda_seg_ops, v, capacity, chunk);
        if (r < 0)
                return fail(ret_error, r, "cannot allocate %" PRIu64 " bytes of VRAM on %s in chunks of %" PRIu64
                            " bytes: %s", capacity, name, chunk, strerror(-r));
        /*
         * A client maps a tensor that spans chunks as its chunks, whole, side
         * by side (the driver maps no part of an allocation: CUDA 13 on an
         * H200 answers CUDA_ERROR_NOT_SUPPORTED): so every piece of such a
         * copy starts at offset 0 of its chunk, the tail too.
         */
        v->base.pool.piece_align = MAX((uint64_t) v->granularity, (uint64_t) SEG_UNIT);
        v->base.pool.map_whole = true;

        snprintf(v->base.description, sizeof(v->base.description),
                 "cuda (%.64s at %s, NUMA node %d; %u chunks of %" PRIu64 " MiB)", name, v->base.device,
                 v->base.numa_node, v->base.pool.n_segs, chunk >> 20);
        return 0;
}

int vram_cuda_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error) {
        VramCuda *v;
        int r;

        v = calloc(1, sizeof(*v));
        if (!v)
                return -ENOMEM;
        v->base.ops = &cuda_ops;
        v->base.depth = CUDA_STREAMS_PER_DIR;
        v->base.numa_node = -1;
        v->efd = -1;
        v->done_tail = &v->done_head;
        list_init(&v->inflight);
        pthread_mutex_init(&v->lock, NULL);
        for (int i = 0; i < CUDA_LANES; i++) {
                v->lanes[i].v = v;
                v->lanes[i].todo_tail = &v->lanes[i].todo_head;
                pthread_cond_init(&v->lanes[i].cond, NULL);
        }

        r = cudrv_open(&v->drv, ret_error);
        if (r >= 0)
                r = cuda_new(v, c, event, ret_error);
        if (r < 0) {
                cuda_free(&v->base);
                return r;
        }
        *ret = &v->base;
        return 0;
}

#else /* !TIERD_HAVE_CUDA */

int vram_cuda_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error) {
        return fail(ret_error, -ENODEV, "this tierd was built without the CUDA backend (no cuda.h at build time)");
}

#endif
