/* SPDX-License-Identifier: MIT */
/* cudrv.h: the CUDA driver API, loaded at run time (tierd and libtier never link libcuda). */
#pragma once

/*
 * Only built when the CUDA toolkit's cuda.h was found (TIERD_HAVE_CUDA):
 * the types and prototypes come from there, the code from libcuda.so.1,
 * opened with dlopen() on first use.  A machine without the NVIDIA driver
 * therefore runs tierd, libtier and tierctl all the same; cudrv_open()
 * merely fails with a reason.
 *
 * Every function is reached through a CuDriver table.  Its fields carry the
 * names of cuda.h, which maps several of them to versioned ABI symbols
 * (cuMemcpyHtoDAsync is cuMemcpyHtoDAsync_v2): the table is filled with
 * dlsym() of exactly those symbols, so the prototypes the compiler checks
 * are the ABI the library provides.
 *
 * $TIER_LIBCUDA (read with secure_getenv()) names another library to load
 * instead of libcuda.so.1.  It exists for tests, which load a fake driver
 * (tests/helpers/fake-cuda.c) that implements the same symbols on memfds.
 */

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>

/* X-macro of every driver function tierd, libtier and the GPU tests use. */
#define CUDRV_FUNCS(X)                          \
        X(cuInit)                               \
        X(cuDriverGetVersion)                   \
        X(cuGetErrorName)                       \
        X(cuGetErrorString)                     \
        X(cuDeviceGetCount)                     \
        X(cuDeviceGet)                          \
        X(cuDeviceGetAttribute)                 \
        X(cuDeviceGetName)                      \
        X(cuDeviceGetPCIBusId)                  \
        X(cuDeviceGetByPCIBusId)                \
        X(cuDevicePrimaryCtxRetain)             \
        X(cuDevicePrimaryCtxRelease)            \
        X(cuCtxSetCurrent)                      \
        X(cuCtxPushCurrent)                     \
        X(cuCtxPopCurrent)                      \
        X(cuMemGetInfo)                         \
        X(cuMemGetAllocationGranularity)        \
        X(cuMemCreate)                          \
        X(cuMemRelease)                         \
        X(cuMemExportToShareableHandle)         \
        X(cuMemImportFromShareableHandle)       \
        X(cuMemAddressReserve)                  \
        X(cuMemAddressFree)                     \
        X(cuMemMap)                             \
        X(cuMemUnmap)                           \
        X(cuMemSetAccess)                       \
        X(cuMemAlloc)                           \
        X(cuMemFree)                            \
        X(cuMemHostAlloc)                       \
        X(cuMemFreeHost)                        \
        X(cuMemHostRegister)                    \
        X(cuMemHostUnregister)                  \
        X(cuMemcpyHtoD)                         \
        X(cuMemcpyDtoH)                         \
        X(cuMemcpyHtoDAsync)                    \
        X(cuMemcpyDtoHAsync)                    \
        X(cuMemsetD8)                           \
        X(cuMemsetD8Async)                      \
        X(cuStreamCreate)                       \
        X(cuStreamDestroy)                      \
        X(cuStreamSynchronize)                  \
        X(cuStreamWaitEvent)                    \
        X(cuLaunchHostFunc)                     \
        X(cuEventCreate)                        \
        X(cuEventDestroy)                       \
        X(cuEventRecord)                        \
        X(cuEventQuery)                         \
        X(cuEventSynchronize)                   \
        X(cuIpcGetEventHandle)                  \
        X(cuIpcOpenEventHandle)

typedef struct CuDriver {
        void *lib;              /* dlopen() handle */
        char path[128];         /* what was loaded */
        int version;            /* cuDriverGetVersion(), e.g. 13000 */
#define CUDRV_FIELD(f) __typeof__(f) *f;
        CUDRV_FUNCS(CUDRV_FIELD)
#undef CUDRV_FIELD
} CuDriver;

/*
 * cudrv_open() - load the driver library, resolve every function, cuInit(0).
 * Returns 0, or -ENODEV with *@ret_error (malloc'ed, may be NULL on ENOMEM)
 * saying why no CUDA device can be used, e.g. "libcuda.so.1 cannot be loaded
 * (no NVIDIA driver installed): ...".  Does not look at devices.
 */
int cudrv_open(CuDriver **ret, char **ret_error);
/* dlclose() and free; takes NULL, returns NULL. */
CuDriver *cudrv_close(CuDriver *d);

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory" into @buf (NUL-terminated), returns @buf. */
const char *cudrv_strerror(const CuDriver *d, CUresult r, char *buf, size_t size);
/* The nearest -errno for a CUresult (0 for CUDA_SUCCESS). */
int cudrv_errno(CUresult r);

/*
 * cudrv_map() - reserve address space for @size bytes of @handle (aligned
 * to @align), map it and allow read/write access from @device.
 * Returns 0 with *@ret_va set, or a CUresult (nothing is left reserved).
 */
CUresult cudrv_map(const CuDriver *d, CUmemGenericAllocationHandle handle, size_t size, size_t align,
                   CUdevice device, CUdeviceptr *ret_va);
/* Undo cudrv_map(); errors are ignored (nothing useful can be done about them). */
void cudrv_unmap(const CuDriver *d, CUdeviceptr va, size_t size);

/*
 * cudrv_pci_sysfs_name() - turn a CUDA PCI bus id ("0000:3B:00.0", or with
 * an 8-digit domain "00000000:3b:00.0") into the name of its directory under
 * /sys/bus/pci/devices ("0000:3b:00.0").  -EINVAL if it is not one.
 */
int cudrv_pci_sysfs_name(const char *bus_id, char *buf, size_t size);
