/* SPDX-License-Identifier: MIT */
/* client-cuda.c: libtier's use of the CUDA driver: mapping "cuda" segments, events, host registration. */

/*
 * Theory of operation: libtier never links libcuda.  The first time a
 * client needs CUDA (a grant into a "cuda" segment, a stream wait, host
 * registration) client.c calls client_cuda_new(), which dlopen()s the
 * driver (proto/cudrv.c) and retains the primary context of tierd's GPU,
 * found by the PCI bus id tierd announced, so the ordinal this process
 * sees (CUDA_VISIBLE_DEVICES) does not matter.  That is the context the
 * CUDA runtime (PyTorch, ...) uses too, so device addresses handed out
 * here are valid in the application's kernels.  Every call pushes that
 * context and pops it again, leaving the caller's current context alone.
 *
 * A chunk is imported from the fd tierd sent (cuMemImportFromShareableHandle),
 * mapped at a fresh reservation and made read/write for the device; the
 * allocation handle is released at once (the mapping keeps the memory).
 * client.c caches the mapping by (segment id, generation).
 *
 * Events: tierd's copy events (PinReply.ipc_event) are opened once per
 * handle and cached (tierd reuses a small pool of them).  For Unpin.ipc_event
 * the client records events of its own pool, reusing one only once its last
 * recording has completed: should tierd look at an event after it was
 * recorded again, it waits for more work than it was told about, never for
 * less.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client-cuda.h"
#include "proto/macro.h"

#if TIERD_HAVE_CUDA

#include "proto/cudrv.h"

/* tierd's copy events kept open; it has a pool of 64. */
#define CLIENT_CUDA_OPENED_MAX 64
/* Events of our own for Unpin.ipc_event; when all are busy the oldest is waited for. */
#define CLIENT_CUDA_OWN_MAX 64

typedef struct OpenedEvent {
        CUipcEventHandle handle;
        CUevent event;          /* NULL: unused */
        uint64_t last_use;
} OpenedEvent;

typedef struct OwnEvent {
        CUevent event;
        CUipcEventHandle handle;
        uint64_t recorded;      /* use clock of the last record, 0: never */
} OwnEvent;

struct ClientCuda {
        CuDriver *drv;
        CUdevice dev;
        CUcontext ctx;
        size_t granularity;
        uint64_t clock;
        OpenedEvent opened[CLIENT_CUDA_OPENED_MAX];
        OwnEvent own[CLIENT_CUDA_OWN_MAX];
        unsigned n_own;
        char error[256];
};

_printf_(3, 4)
static int cc_fail(ClientCuda *cc, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(cc->error, sizeof(cc->error), fmt, ap);
        va_end(ap);
        return r;
}

static const char *cu_err(ClientCuda *cc, CUresult r) {
        static _Thread_local char buf[160];

        return cudrv_strerror(cc->drv, r, buf, sizeof(buf));
}

static CUresult push(ClientCuda *cc) {
        return cc->drv->cuCtxPushCurrent(cc->ctx);
}

static void pop(ClientCuda *cc) {
        CUcontext unused;

        (void) cc->drv->cuCtxPopCurrent(&unused);
}

const char *client_cuda_error(const ClientCuda *cc) {
        return cc ? cc->error : "CUDA is not loaded";
}

int client_cuda_new(ClientCuda **ret, const char *device, char *error, size_t size) {
        ClientCuda *cc;
        char *why = NULL;
        CUmemAllocationProp prop = {
                .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE },
        };
        CUresult r;
        int k;

        cc = calloc(1, sizeof(*cc));
        if (!cc) {
                snprintf(error, size, "out of memory");
                return -ENOMEM;
        }
        k = cudrv_open(&cc->drv, &why);
        if (k < 0) {
                snprintf(error, size, "%s", why ? why : "cannot load the CUDA driver");
                free(why);
                free(cc);
                return k;
        }
        if (device && *device)
                r = cc->drv->cuDeviceGetByPCIBusId(&cc->dev, device);
        else
                r = cc->drv->cuDeviceGet(&cc->dev, 0);
        if (r != CUDA_SUCCESS) {
                snprintf(error, size, "tierd's GPU %s is not visible to this process (CUDA_VISIBLE_DEVICES?): %s",
                         device && *device ? device : "0", cu_err(cc, r));
                goto fail;
        }
        r = cc->drv->cuDevicePrimaryCtxRetain(&cc->ctx, cc->dev);
        if (r != CUDA_SUCCESS) {
                snprintf(error, size, "cannot use tierd's GPU %s: %s", device && *device ? device : "0",
                         cu_err(cc, r));
                k = r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -ENODEV;  /* the GPU's memory: it may pass */
                goto fail_k;
        }
        prop.location.id = cc->dev;
        r = cc->drv->cuMemGetAllocationGranularity(&cc->granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != CUDA_SUCCESS || cc->granularity == 0) {
                snprintf(error, size, "cannot query tierd's GPU: %s", cu_err(cc, r));
                (void) cc->drv->cuDevicePrimaryCtxRelease(cc->dev);
                goto fail;
        }
        *ret = cc;
        return 0;
fail:
        k = -ENODEV;
fail_k:
        cudrv_close(cc->drv);
        free(cc);
        return k;
}

ClientCuda *client_cuda_free(ClientCuda *cc) {
        if (!cc)
                return NULL;
        if (push(cc) == CUDA_SUCCESS) {
                for (size_t i = 0; i < CLIENT_CUDA_OPENED_MAX; i++)
                        if (cc->opened[i].event)
                                (void) cc->drv->cuEventDestroy(cc->opened[i].event);
                for (unsigned i = 0; i < cc->n_own; i++)
                        (void) cc->drv->cuEventDestroy(cc->own[i].event);
                pop(cc);
        }
        (void) cc->drv->cuDevicePrimaryCtxRelease(cc->dev);
        cudrv_close(cc->drv);
        free(cc);
        return NULL;
}

int client_cuda_map(ClientCuda *cc, int fd, uint64_t size, uint64_t *ret_va, uint64_t *ret_handle) {
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        CUresult r;

        if (size == 0 || size % cc->granularity != 0)
                return cc_fail(cc, -EPROTO, "segment size %llu is not a multiple of the GPU's granularity %zu",
                               (unsigned long long) size, cc->granularity);
        r = push(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot make tierd's GPU current: %s", cu_err(cc, r));
        r = cc->drv->cuMemImportFromShareableHandle(&h, (void *) (intptr_t) fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS) {
                pop(cc);
                return cc_fail(cc, cudrv_errno(r), "cannot import a VRAM chunk: %s", cu_err(cc, r));
        }
        r = cudrv_map(cc->drv, h, size, cc->granularity, cc->dev, &va);
        if (r != CUDA_SUCCESS) {
                (void) cc->drv->cuMemRelease(h);
                pop(cc);
                return cc_fail(cc, cudrv_errno(r), "cannot map a VRAM chunk: %s", cu_err(cc, r));
        }
        pop(cc);
        /* the handle is kept: pieces of the chunk are mapped again into views of tensors that span chunks */
        *ret_va = va;
        *ret_handle = (uint64_t) h;
        return 0;
}

void client_cuda_unmap(ClientCuda *cc, uint64_t va, uint64_t size, uint64_t handle) {
        if (!cc || push(cc) != CUDA_SUCCESS)
                return;
        if (va)
                cudrv_unmap(cc->drv, va, size);
        if (handle)
                (void) cc->drv->cuMemRelease((CUmemGenericAllocationHandle) handle);
        pop(cc);
}

int client_cuda_view_new(ClientCuda *cc, uint64_t size, uint64_t *ret_va, uint64_t *ret_size) {
        CUdeviceptr va = 0;
        uint64_t total = ALIGN_UP(size, (uint64_t) cc->granularity);
        CUresult r;

        r = push(cc);
        if (r == CUDA_SUCCESS) {
                r = cc->drv->cuMemAddressReserve(&va, total, cc->granularity, 0, 0);
                pop(cc);
        }
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot reserve %llu bytes of device address space: %s",
                               (unsigned long long) total, cu_err(cc, r));
        *ret_va = va;
        *ret_size = total;
        return 0;
}

int client_cuda_view_map(ClientCuda *cc, uint64_t va, uint64_t handle, uint64_t offset, uint64_t len) {
        CUmemAccessDesc access = {
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cc->dev },
                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        uint64_t size = ALIGN_UP(len, (uint64_t) cc->granularity);
        CUresult r;

        if (offset % cc->granularity != 0 || va % cc->granularity != 0)
                return cc_fail(cc, -EPROTO, "a piece at %llu of a chunk is not on the GPU's granularity %zu",
                               (unsigned long long) offset, cc->granularity);
        r = push(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot make tierd's GPU current: %s", cu_err(cc, r));
        r = cc->drv->cuMemMap(va, size, offset, (CUmemGenericAllocationHandle) handle, 0);
        if (r == CUDA_SUCCESS) {
                r = cc->drv->cuMemSetAccess(va, size, &access, 1);
                if (r != CUDA_SUCCESS)
                        (void) cc->drv->cuMemUnmap(va, size);
        }
        pop(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot map a piece of a VRAM chunk: %s", cu_err(cc, r));
        return 0;
}

void client_cuda_view_unmap(ClientCuda *cc, uint64_t va, uint64_t len) {
        if (!cc || push(cc) != CUDA_SUCCESS)
                return;
        (void) cc->drv->cuMemUnmap(va, ALIGN_UP(len, (uint64_t) cc->granularity));
        pop(cc);
}

void client_cuda_view_free(ClientCuda *cc, uint64_t va, uint64_t size) {
        if (!cc || !va || push(cc) != CUDA_SUCCESS)
                return;
        (void) cc->drv->cuMemAddressFree(va, size);
        pop(cc);
}

int client_cuda_host_register(ClientCuda *cc, void *p, uint64_t size) {
        CUresult r;

        r = push(cc);
        if (r == CUDA_SUCCESS) {
                r = cc->drv->cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE);
                pop(cc);
        }
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot register host memory with CUDA: %s", cu_err(cc, r));
        return 0;
}

void client_cuda_host_unregister(ClientCuda *cc, void *p) {
        if (!cc || push(cc) != CUDA_SUCCESS)
                return;
        (void) cc->drv->cuMemHostUnregister(p);
        pop(cc);
}

static CUresult opened_get(ClientCuda *cc, const CUipcEventHandle *handle, CUevent *ret) {
        OpenedEvent *slot = NULL;
        CUresult r;

        for (size_t i = 0; i < CLIENT_CUDA_OPENED_MAX; i++) {
                OpenedEvent *o = &cc->opened[i];

                if (o->event && memcmp(&o->handle, handle, sizeof(*handle)) == 0) {
                        o->last_use = ++cc->clock;
                        *ret = o->event;
                        return CUDA_SUCCESS;
                }
                if (!slot || (slot->event && (!o->event || o->last_use < slot->last_use)))
                        slot = o;
        }
        if (slot->event) {
                (void) cc->drv->cuEventDestroy(slot->event);
                slot->event = NULL;
        }
        r = cc->drv->cuIpcOpenEventHandle(&slot->event, *handle);
        if (r != CUDA_SUCCESS) {
                slot->event = NULL;
                return r;
        }
        slot->handle = *handle;
        slot->last_use = ++cc->clock;
        *ret = slot->event;
        return CUDA_SUCCESS;
}

int client_cuda_stream_wait(ClientCuda *cc, const uint8_t handle[CLIENT_CUDA_EVENT_SIZE], void *stream) {
        CUipcEventHandle h;
        CUevent ev;
        CUresult r;

        memcpy(&h, handle, sizeof(h));
        r = push(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot make tierd's GPU current: %s", cu_err(cc, r));
        r = opened_get(cc, &h, &ev);
        if (r == CUDA_SUCCESS)
                r = cc->drv->cuStreamWaitEvent((CUstream) stream, ev, 0);
        pop(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot make the stream wait for tierd's copy: %s", cu_err(cc, r));
        return 0;
}

/* An event of our pool nothing waits for any more, made if need be; NULL with *@ret on failure. */
static OwnEvent *own_get(ClientCuda *cc, CUresult *ret) {
        OwnEvent *oldest = NULL;

        for (unsigned i = 0; i < cc->n_own; i++) {
                OwnEvent *e = &cc->own[i];

                if (cc->drv->cuEventQuery(e->event) == CUDA_SUCCESS)
                        return e;
                if (!oldest || e->recorded < oldest->recorded)
                        oldest = e;
        }
        if (cc->n_own < CLIENT_CUDA_OWN_MAX) {
                OwnEvent *e = &cc->own[cc->n_own];

                *ret = cc->drv->cuEventCreate(&e->event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
                if (*ret != CUDA_SUCCESS)
                        return NULL;
                *ret = cc->drv->cuIpcGetEventHandle(&e->handle, e->event);
                if (*ret != CUDA_SUCCESS) {
                        (void) cc->drv->cuEventDestroy(e->event);
                        return NULL;
                }
                cc->n_own++;
                return e;
        }
        /* all busy: the oldest is the first to finish, wait for it */
        *ret = cc->drv->cuEventSynchronize(oldest->event);
        return *ret == CUDA_SUCCESS ? oldest : NULL;
}

int client_cuda_record(ClientCuda *cc, void *stream, uint8_t ret[CLIENT_CUDA_EVENT_SIZE]) {
        OwnEvent *e;
        CUresult r;

        r = push(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot make tierd's GPU current: %s", cu_err(cc, r));
        e = own_get(cc, &r);
        if (e)
                r = cc->drv->cuEventRecord(e->event, (CUstream) stream);
        pop(cc);
        if (r != CUDA_SUCCESS)
                return cc_fail(cc, cudrv_errno(r), "cannot record an interprocess event: %s", cu_err(cc, r));
        e->recorded = ++cc->clock;
        memcpy(ret, &e->handle, CLIENT_CUDA_EVENT_SIZE);
        return 0;
}

#else /* !TIERD_HAVE_CUDA */

#define NO_CUDA "libtier was built without CUDA support (no cuda.h at build time)"

int client_cuda_new(ClientCuda **ret, const char *device, char *error, size_t size) {
        snprintf(error, size, NO_CUDA);
        return -ENODEV;
}

ClientCuda *client_cuda_free(ClientCuda *cc) {
        return NULL;
}

const char *client_cuda_error(const ClientCuda *cc) {
        return NO_CUDA;
}

int client_cuda_map(ClientCuda *cc, int fd, uint64_t size, uint64_t *ret_va, uint64_t *ret_handle) {
        return -ENODEV;
}

void client_cuda_unmap(ClientCuda *cc, uint64_t va, uint64_t size, uint64_t handle) {
}

int client_cuda_view_new(ClientCuda *cc, uint64_t size, uint64_t *ret_va, uint64_t *ret_size) {
        return -ENODEV;
}

int client_cuda_view_map(ClientCuda *cc, uint64_t va, uint64_t handle, uint64_t offset, uint64_t len) {
        return -ENODEV;
}

void client_cuda_view_unmap(ClientCuda *cc, uint64_t va, uint64_t len) {
}

void client_cuda_view_free(ClientCuda *cc, uint64_t va, uint64_t size) {
}

int client_cuda_host_register(ClientCuda *cc, void *p, uint64_t size) {
        return -ENODEV;
}

void client_cuda_host_unregister(ClientCuda *cc, void *p) {
}

int client_cuda_stream_wait(ClientCuda *cc, const uint8_t handle[CLIENT_CUDA_EVENT_SIZE], void *stream) {
        return -ENODEV;
}

int client_cuda_record(ClientCuda *cc, void *stream, uint8_t ret[CLIENT_CUDA_EVENT_SIZE]) {
        return -ENODEV;
}

#endif
