/* SPDX-License-Identifier: MIT */
/* cudrv.c: the CUDA driver API, loaded at run time (tierd and libtier never link libcuda). */

/*
 * Theory of operation: cudrv_open() dlopen()s libcuda.so.1 (RTLD_LOCAL, so
 * its symbols never satisfy anything else in the process), resolves every
 * function of CUDRV_FUNCS by its ABI name and calls cuInit(0).  Any failure
 * is turned into one sentence for the "no CUDA device: <reason>" message.
 * Nothing here keeps global state: the daemon and each libtier client hold
 * their own CuDriver (dlopen() reference-counts the library).
 */

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/cudrv.h"
#include "proto/macro.h"

#define CUDRV_STR(x) #x
#define CUDRV_XSTR(x) CUDRV_STR(x)

/* What cudrv_open() loads unless $TIER_LIBCUDA says otherwise. */
#define CUDRV_LIBRARY "libcuda.so.1"

_printf_(3, 4)
static int open_fail(CuDriver *d, char **ret_error, const char *fmt, ...) {
        va_list ap;

        if (ret_error) {
                free(*ret_error);
                va_start(ap, fmt);
                if (vasprintf(ret_error, fmt, ap) < 0)
                        *ret_error = NULL;
                va_end(ap);
        }
        cudrv_close(d);
        return -ENODEV;
}

int cudrv_open(CuDriver **ret, char **ret_error) {
        const char *path = secure_getenv("TIER_LIBCUDA");
        char buf[160];
        CuDriver *d;
        CUresult r;
        int n;

        if (!path || !*path)
                path = CUDRV_LIBRARY;
        d = calloc(1, sizeof(*d));
        if (!d)
                return -ENOMEM;
        snprintf(d->path, sizeof(d->path), "%s", path);

        d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!d->lib) {
                const char *why = dlerror();

                return open_fail(d, ret_error, "%s cannot be loaded (no NVIDIA driver installed?): %s", path,
                                 why ? why : "unknown error");
        }

#define CUDRV_RESOLVE(f)                                                                                \
        d->f = (__typeof__(d->f)) dlsym(d->lib, CUDRV_XSTR(f));                                         \
        if (!d->f)                                                                                      \
                return open_fail(d, ret_error, "%s lacks %s (the driver is too old for CUDA VMM)", path, \
                                 CUDRV_XSTR(f));
        CUDRV_FUNCS(CUDRV_RESOLVE)
#undef CUDRV_RESOLVE

        r = d->cuInit(0);
        if (r != CUDA_SUCCESS)
                return open_fail(d, ret_error, "cuInit failed: %s (driver not loaded, or no device usable)",
                                 cudrv_strerror(d, r, buf, sizeof(buf)));
        if (d->cuDriverGetVersion(&n) == CUDA_SUCCESS)
                d->version = n;
        *ret = d;
        return 0;
}

CuDriver *cudrv_close(CuDriver *d) {
        if (!d)
                return NULL;
        if (d->lib)
                dlclose(d->lib);
        free(d);
        return NULL;
}

const char *cudrv_strerror(const CuDriver *d, CUresult r, char *buf, size_t size) {
        const char *name = NULL, *text = NULL;

        if (d && d->cuGetErrorName)
                (void) d->cuGetErrorName(r, &name);
        if (d && d->cuGetErrorString)
                (void) d->cuGetErrorString(r, &text);
        if (name && text)
                snprintf(buf, size, "%s: %s", name, text);
        else
                snprintf(buf, size, "CUresult %d", (int) r);
        return buf;
}

int cudrv_errno(CUresult r) {
        switch (r) {
        case CUDA_SUCCESS:
                return 0;
        case CUDA_ERROR_OUT_OF_MEMORY:
                return -ENOMEM;
        case CUDA_ERROR_INVALID_VALUE:
        case CUDA_ERROR_INVALID_HANDLE:
                return -EINVAL;
        case CUDA_ERROR_NOT_READY:
                return -EAGAIN;
        case CUDA_ERROR_NOT_SUPPORTED:
        case CUDA_ERROR_NOT_PERMITTED:
                return -EOPNOTSUPP;
        case CUDA_ERROR_NO_DEVICE:
        case CUDA_ERROR_INVALID_DEVICE:
        case CUDA_ERROR_NOT_INITIALIZED:
        case CUDA_ERROR_DEINITIALIZED:
                return -ENODEV;
        case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
                return -EEXIST;
        case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
                return -ENOENT;
        default:
                return -EIO;
        }
}

CUresult cudrv_map(const CuDriver *d, CUmemGenericAllocationHandle handle, size_t size, size_t align,
                   CUdevice device, CUdeviceptr *ret_va) {
        CUmemAccessDesc access = {
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device },
                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        CUdeviceptr va = 0;
        CUresult r;

        r = d->cuMemAddressReserve(&va, size, align, 0, 0);
        if (r != CUDA_SUCCESS)
                return r;
        r = d->cuMemMap(va, size, 0, handle, 0);
        if (r != CUDA_SUCCESS)
                goto free_va;
        r = d->cuMemSetAccess(va, size, &access, 1);
        if (r != CUDA_SUCCESS)
                goto unmap;
        *ret_va = va;
        return CUDA_SUCCESS;
unmap:
        (void) d->cuMemUnmap(va, size);
free_va:
        (void) d->cuMemAddressFree(va, size);
        return r;
}

void cudrv_unmap(const CuDriver *d, CUdeviceptr va, size_t size) {
        if (!va)
                return;
        (void) d->cuMemUnmap(va, size);
        (void) d->cuMemAddressFree(va, size);
}

int cudrv_pci_sysfs_name(const char *bus_id, char *buf, size_t size) {
        unsigned domain, bus, dev, fn;
        int n = 0;

        if (!bus_id || sscanf(bus_id, "%x:%x:%x.%x%n", &domain, &bus, &dev, &fn, &n) != 4 || bus_id[n] != 0)
                return -EINVAL;
        if (bus > 0xff || dev > 0x1f || fn > 7)
                return -EINVAL;
        if ((size_t) snprintf(buf, size, "%04x:%02x:%02x.%x", domain, bus, dev, fn) >= size)
                return -ENOBUFS;
        return 0;
}
