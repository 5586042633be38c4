/* SPDX-License-Identifier: MIT */
/* fake-cuda.c: a fake CUDA driver on memfds, loaded in place of libcuda.so.1 by tests. */

/*
 * Theory of operation: "device memory" is host memory the test can see.
 * A physical allocation (cuMemCreate) is a memfd; exporting it gives a dup
 * of that fd, importing one keeps a dup of the fd it is given, reserving
 * address space maps PROT_NONE anonymous memory, cuMemMap maps the memfd
 * MAP_FIXED over the reservation and cuMemSetAccess makes it read/write.
 * So a device address is a host address in the process that mapped it, two
 * processes mapping the same exported chunk share its bytes exactly as two
 * GPU contexts would, and tests can check data with memcmp().
 *
 * Streams (each a queue, run in order: cuStreamWaitEvent() does not block)
 * and events, interprocess ones too: fake-cuda-streams.c.
 * Everything is counted (fake_cuda_stats) so tests can check
 * which calls the code under test made.  All state is behind one mutex:
 * tierd calls in from its loop thread and its copy-completion threads.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

#include "tests/helpers/fake-cuda-private.h"
#include "tests/helpers/fake-cuda.h"

#define FAKE_GRANULARITY (2u << 20)
#define FAKE_DEFAULT_MEM (1ull << 30)
#define FAKE_MAX_DEVICES 8
#define FAKE_MAX_REGS 4096

typedef struct FakeAlloc {
        int fd;
        size_t size;
        bool counted;           /* created here (counts against the device memory) */
} FakeAlloc;

typedef struct FakeFail {
        char function[48];
        CUresult result;
        unsigned skip;          /* calls that still succeed first */
        unsigned count;
} FakeFail;

pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
bool fake_initialized;
static uint64_t total_mem = FAKE_DEFAULT_MEM;
static int n_devices = 1;
static bool no_fd;
FakeCudaStats fake_counts;
static FakeFail fails[8];
static struct { void *p; size_t size; } regs[FAKE_MAX_REGS];
/* address reservations, so that a bad unmap or free is an error rather than a MAP_FIXED over anything */
#define FAKE_MAX_RANGES 4096
/* Address reservations, and what is mapped inside each (pieces of allocations, on the granularity). */
#define FAKE_MAX_MAPS 64
static struct {
        uintptr_t p;
        size_t size;
        unsigned n_maps;
        struct { uintptr_t p; size_t size; } maps[FAKE_MAX_MAPS];
} ranges[FAKE_MAX_RANGES];

/* The mapping of reservation @i that is exactly [p, p + size), or -1. */
static int map_find(int i, uintptr_t p, size_t size) {
        for (unsigned k = 0; k < ranges[i].n_maps; k++)
                if (ranges[i].maps[k].p == p && ranges[i].maps[k].size == size)
                        return (int) k;
        return -1;
}

/* Does [p, p + size) meet a mapping of reservation @i?  Or, with @all: is every byte of it mapped? */
static bool maps_cover(int i, uintptr_t p, size_t size, bool all) {
        size_t covered = 0;

        for (unsigned k = 0; k < ranges[i].n_maps; k++) {
                uintptr_t a = ranges[i].maps[k].p, b = a + ranges[i].maps[k].size;
                uintptr_t lo = a > p ? a : p, hi = b < p + size ? b : p + size;

                if (lo < hi) {
                        if (!all)
                                return true;
                        covered += hi - lo;
                }
        }
        return all && covered == size;
}

/* Called with the lock held: the reservation [p, p + size) lies in, or -1. */
static int range_find(uintptr_t p, size_t size) {
        for (int i = 0; i < FAKE_MAX_RANGES; i++)
                if (ranges[i].p && p >= ranges[i].p && p + size <= ranges[i].p + ranges[i].size)
                        return i;
        return -1;
}
static int ctx_dummy;

FAKE_API void fake_cuda_stats(FakeCudaStats *ret);
FAKE_API void fake_cuda_fail(const char *function, int result, unsigned skip, unsigned count);

FAKE_API void fake_cuda_stats(FakeCudaStats *ret) {
        pthread_mutex_lock(&fake_lock);
        *ret = fake_counts;
        pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cuda_fail(const char *function, int result, unsigned skip, unsigned count) {
        pthread_mutex_lock(&fake_lock);
        for (size_t i = 0; i < sizeof(fails) / sizeof(fails[0]); i++)
                if (fails[i].count == 0 || strcmp(fails[i].function, function) == 0) {
                        snprintf(fails[i].function, sizeof(fails[i].function), "%s", function);
                        fails[i].result = (CUresult) result;
                        fails[i].skip = skip;
                        fails[i].count = count;
                        break;
                }
        pthread_mutex_unlock(&fake_lock);
}

/* Called with the lock held: an injected failure of @function, or CUDA_SUCCESS. */
CUresult fake_injected(const char *function) {
        for (size_t i = 0; i < sizeof(fails) / sizeof(fails[0]); i++)
                if (fails[i].count > 0 && strcmp(fails[i].function, function) == 0) {
                        if (fails[i].skip > 0) {
                                fails[i].skip--;
                                return CUDA_SUCCESS;
                        }
                        fails[i].count--;
                        return fails[i].result;
                }
        return CUDA_SUCCESS;
}

/* ---- driver, errors, devices, contexts ------------------------------------------------- */

CUresult CUDAAPI cuInit(unsigned int flags) {
        const char *e;

        pthread_mutex_lock(&fake_lock);
        e = getenv("FAKE_CUDA_INIT_ERROR");
        if (e && *e) {
                pthread_mutex_unlock(&fake_lock);
                return (CUresult) atoi(e);
        }
        e = getenv("FAKE_CUDA_MEM");
        total_mem = e && *e ? strtoull(e, NULL, 0) : FAKE_DEFAULT_MEM;
        e = getenv("FAKE_CUDA_DEVICES");
        n_devices = e && *e ? atoi(e) : 1;
        if (n_devices < 0 || n_devices > FAKE_MAX_DEVICES)
                n_devices = 1;
        no_fd = getenv("FAKE_CUDA_NO_FD") != NULL;
        fake_initialized = true;
        pthread_mutex_unlock(&fake_lock);
        return n_devices > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult CUDAAPI cuDriverGetVersion(int *v) {
        *v = 13000;
        return CUDA_SUCCESS;
}

static const struct {
        CUresult r;
        const char *name, *text;
} error_table[] = {
        { CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
        { CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
        { CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
        { CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
        { CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
        { CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
        { CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
        { CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
        { CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
        { CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
          "part or all of the requested memory range is already mapped" },
        { CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
          "pointer does not correspond to a registered memory region" },
        { CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered" },
};

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **s) {
        for (size_t i = 0; i < sizeof(error_table) / sizeof(error_table[0]); i++)
                if (error_table[i].r == error) {
                        *s = error_table[i].name;
                        return CUDA_SUCCESS;
                }
        *s = NULL;
        return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **s) {
        for (size_t i = 0; i < sizeof(error_table) / sizeof(error_table[0]); i++)
                if (error_table[i].r == error) {
                        *s = error_table[i].text;
                        return CUDA_SUCCESS;
                }
        *s = NULL;
        return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
        ENTER("cuDeviceGetCount");
        *count = n_devices;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal) {
        ENTER("cuDeviceGet");
        if (ordinal < 0 || ordinal >= n_devices)
                LEAVE(CUDA_ERROR_INVALID_DEVICE);
        *dev = ordinal;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
        ENTER("cuDeviceGetAttribute");
        if (dev < 0 || dev >= n_devices)
                LEAVE(CUDA_ERROR_INVALID_DEVICE);
        switch (attrib) {
        case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
                *pi = 1;
                break;
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
                *pi = !no_fd;
                break;
        case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
                *pi = 1;
                break;
        default:
                *pi = 0;
                break;
        }
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
        ENTER("cuDeviceGetName");
        snprintf(name, (size_t) len, "Fake CUDA Device %d", dev);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
        ENTER("cuDeviceGetPCIBusId");
        if (dev < 0 || dev >= n_devices)
                LEAVE(CUDA_ERROR_INVALID_DEVICE);
        /* device 0 is FAKE_CUDA_PCI_BUS_ID, the next ones follow on the bus */
        snprintf(bus_id, (size_t) len, "0000:%02X:00.0", 0x3b + dev);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id) {
        char want[32];

        ENTER("cuDeviceGetByPCIBusId");
        for (int i = 0; i < n_devices; i++) {
                snprintf(want, sizeof(want), "0000:%02X:00.0", 0x3b + i);
                if (strcasecmp(want, bus_id) == 0) {
                        *dev = i;
                        LEAVE(CUDA_SUCCESS);
                }
        }
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
        ENTER("cuDevicePrimaryCtxRetain");
        if (dev < 0 || dev >= n_devices)
                LEAVE(CUDA_ERROR_INVALID_DEVICE);
        *ctx = (CUcontext) &ctx_dummy;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *ctx) {
        if (ctx)
                *ctx = (CUcontext) &ctx_dummy;
        return CUDA_SUCCESS;
}

/* ---- virtual memory management ------------------------------------------------------------- */

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total) {
        ENTER("cuMemGetInfo");
        *total = (size_t) total_mem;
        *free_bytes = (size_t) (total_mem - fake_counts.live_bytes);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
        ENTER("cuMemGetAllocationGranularity");
        *granularity = FAKE_GRANULARITY;
        LEAVE(CUDA_SUCCESS);
}

static CUmemGenericAllocationHandle alloc_handle(FakeAlloc *a) {
        return (CUmemGenericAllocationHandle) (uintptr_t) a;
}

static FakeAlloc *handle_alloc(CUmemGenericAllocationHandle h) {
        return (FakeAlloc *) (uintptr_t) h;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
        FakeAlloc *a;

        ENTER("cuMemCreate");
        if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            prop->location.id < 0 || prop->location.id >= n_devices || size == 0 || size % FAKE_GRANULARITY != 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && no_fd)
                LEAVE(CUDA_ERROR_NOT_SUPPORTED);
        if (fake_counts.live_bytes + size > total_mem)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        a = calloc(1, sizeof(*a));
        if (!a)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        a->fd = memfd_create("fake-cuda-vram", MFD_CLOEXEC);
        if (a->fd < 0 || ftruncate(a->fd, (off_t) size) < 0) {
                if (a->fd >= 0)
                        close(a->fd);
                free(a);
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        }
        a->size = size;
        a->counted = true;
        fake_counts.creates++;
        fake_counts.live_allocs++;
        fake_counts.live_bytes += size;
        *handle = alloc_handle(a);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
        FakeAlloc *a = handle_alloc(handle);

        ENTER("cuMemRelease");
        if (!a)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        if (a->counted) {
                fake_counts.live_allocs--;
                fake_counts.live_bytes -= a->size;
        }
        fake_counts.releases++;
        close(a->fd);
        free(a);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type, unsigned long long flags) {
        FakeAlloc *a = handle_alloc(handle);
        int fd;

        ENTER("cuMemExportToShareableHandle");
        if (!a || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || no_fd)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        /* like the driver's, the exported fd is not close-on-exec: the caller decides */
        fd = dup(a->fd);
        if (fd < 0)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        *(int *) shareable = fd;
        fake_counts.exports++;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                                CUmemAllocationHandleType type) {
        int fd = (int) (intptr_t) os_handle;
        struct stat st;
        FakeAlloc *a;

        ENTER("cuMemImportFromShareableHandle");
        if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) < 0 || st.st_size <= 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        a = calloc(1, sizeof(*a));
        if (!a)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (a->fd < 0) {
                free(a);
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        }
        a->size = (size_t) st.st_size;
        fake_counts.imports++;
        *handle = alloc_handle(a);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
        void *p;

        ENTER("cuMemAddressReserve");
        /* as the driver: on the granularity (or @alignment, if larger), whatever mmap() gives */
        {
                size_t align = alignment > FAKE_GRANULARITY ? alignment : FAKE_GRANULARITY;
                uintptr_t raw, start;
                void *q = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

                if (q == MAP_FAILED)
                        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
                raw = (uintptr_t) q;
                start = (raw + align - 1) / align * align;
                if (start > raw)
                        (void) munmap(q, start - raw);
                (void) munmap((void *) (start + size), raw + align - start);
                p = (void *) start;
        }
        for (int i = 0; i < FAKE_MAX_RANGES; i++)
                if (!ranges[i].p) {
                        ranges[i].p = (uintptr_t) p;
                        ranges[i].size = size;
                        ranges[i].n_maps = 0;
                        fake_counts.reserved++;
                        *ptr = (CUdeviceptr) (uintptr_t) p;
                        LEAVE(CUDA_SUCCESS);
                }
        munmap(p, size);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
        int i;

        ENTER("cuMemAddressFree");
        i = range_find(ptr, size);
        if (i < 0 || ranges[i].p != ptr || ranges[i].size != size || ranges[i].n_maps > 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);        /* the driver wants it unmapped first */
        if (munmap((void *) (uintptr_t) ptr, size) < 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        ranges[i].p = 0;
        fake_counts.reserved--;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
        FakeAlloc *a = handle_alloc(handle);
        void *p;

        int i;

        ENTER("cuMemMap");
        /* any part of a reservation, on the granularity, not mapped yet... */
        i = range_find(ptr, size);
        if (!a || offset + size > a->size || i < 0 || size == 0 || ptr % FAKE_GRANULARITY != 0 ||
            size % FAKE_GRANULARITY != 0 || offset % FAKE_GRANULARITY != 0 || maps_cover(i, ptr, size, false) ||
            ranges[i].n_maps == FAKE_MAX_MAPS)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        /*
         * ...of a whole allocation: the real driver (580, CUDA 13, H200)
         * answers CUDA_ERROR_NOT_SUPPORTED to a mapping of part of one,
         * whatever the offset (tests/gpu/vmm-probe.c).
         */
        if (offset != 0 || size != a->size)
                LEAVE(CUDA_ERROR_NOT_SUPPORTED);
        p = mmap((void *) (uintptr_t) ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, (off_t) offset);
        if (p == MAP_FAILED)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        ranges[i].maps[ranges[i].n_maps].p = ptr;
        ranges[i].maps[ranges[i].n_maps].size = size;
        ranges[i].n_maps++;
        fake_counts.maps++;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
        void *p;

        int i, k;

        ENTER("cuMemUnmap");
        /* as the driver: exactly what one cuMemMap() mapped */
        i = range_find(ptr, size);
        k = i < 0 ? -1 : map_find(i, ptr, size);
        if (k < 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        ranges[i].maps[k] = ranges[i].maps[--ranges[i].n_maps];
        /* back to a bare reservation */
        p = mmap((void *) (uintptr_t) ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                 -1, 0);
        if (p == MAP_FAILED)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        fake_counts.unmaps++;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
        int i;

        ENTER("cuMemSetAccess");
        i = range_find(ptr, size);
        if (i < 0 || !maps_cover(i, ptr, size, true) || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        if (mprotect((void *) (uintptr_t) ptr, size, PROT_READ | PROT_WRITE) < 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        LEAVE(CUDA_SUCCESS);
}

/* ---- plain allocations, host memory ------------------------------------------------------- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size) {
        void *p;

        ENTER("cuMemAlloc");
        p = malloc(size ? size : 1);
        if (!p)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        *dptr = (CUdeviceptr) (uintptr_t) p;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
        free((void *) (uintptr_t) dptr);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
        ENTER("cuMemHostAlloc");
        *pp = malloc(size ? size : 1);
        LEAVE(*pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
        free(p);
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t size, unsigned int flags) {
        size_t free_slot = FAKE_MAX_REGS;

        ENTER("cuMemHostRegister");
        if (!p || size == 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        for (size_t i = 0; i < FAKE_MAX_REGS; i++) {
                uint8_t *a = regs[i].p, *b = p;

                if (!a) {
                        if (free_slot == FAKE_MAX_REGS)
                                free_slot = i;
                        continue;
                }
                if (b < a + regs[i].size && a < b + size)
                        LEAVE(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        if (free_slot == FAKE_MAX_REGS)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        regs[free_slot].p = p;
        regs[free_slot].size = size;
        fake_counts.host_registered++;
        fake_counts.host_registered_bytes += size;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemHostUnregister(void *p) {
        ENTER("cuMemHostUnregister");
        for (size_t i = 0; i < FAKE_MAX_REGS; i++)
                if (p && regs[i].p == p) {
                        fake_counts.host_registered--;
                        fake_counts.host_registered_bytes -= regs[i].size;
                        regs[i].p = NULL;
                        LEAVE(CUDA_SUCCESS);
                }
        LEAVE(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* ---- copies --------------------------------------------------------------------------------- */

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
        ENTER("cuMemcpyHtoD");
        memcpy((void *) (uintptr_t) dst, src, n);
        fake_counts.htod_calls++;
        fake_counts.htod_bytes += n;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
        ENTER("cuMemcpyDtoH");
        memcpy(dst, (const void *) (uintptr_t) src, n);
        fake_counts.dtoh_calls++;
        fake_counts.dtoh_bytes += n;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream stream) {
        ENTER("cuMemcpyHtoDAsync");
        fake_counts.htod_calls++;
        fake_counts.htod_bytes += n;
        LEAVE(fake_submit_copy(stream, (void *) (uintptr_t) dst, src, n));
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
        ENTER("cuMemcpyDtoHAsync");
        fake_counts.dtoh_calls++;
        fake_counts.dtoh_bytes += n;
        LEAVE(fake_submit_copy(stream, dst, (const void *) (uintptr_t) src, n));
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
        ENTER("cuMemsetD8");
        memset((void *) (uintptr_t) dst, v, n);
        fake_counts.memsets++;
        fake_counts.memset_bytes += n;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream stream) {
        ENTER("cuMemsetD8Async");
        fake_counts.memsets++;
        fake_counts.memset_bytes += n;
        LEAVE(fake_submit_set(stream, (void *) (uintptr_t) dst, v, n));
}
