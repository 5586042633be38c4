/* SPDX-License-Identifier: MIT */
/* vram-cuda.c: device probe for the CUDA VRAM backend. */

/*
 * Theory of operation: tierd never links libcuda, so it starts on machines
 * without the NVIDIA driver.  This file finds out whether a CUDA device is
 * usable by loading libcuda.so.1 at run time and asking it; the reason it
 * is not is returned as text so that backend=auto can log it once and fall
 * back to the emulated backend, and backend=cuda can refuse to start.
 *
 * The CUDA VMM arena itself (cuMemCreate chunks exported as fds, copies on
 * tierd's streams) is the work of the "CUDA VRAM tier" issue and is not in
 * this build: with a device present this reports that plainly instead of
 * pretending.
 */

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/config.h"
#include "daemon/vram.h"

typedef int (*cu_init_t)(unsigned flags);
typedef int (*cu_count_t)(int *count);

static int fail(char **ret_error, int r, const char *msg) {
        if (ret_error) {
                free(*ret_error);
                *ret_error = NULL;
                if (asprintf(ret_error, "%s", msg) < 0)
                        *ret_error = NULL;
        }
        return r;
}

int vram_cuda_new(const Config *c, sd_event *event, VramBackend **ret, char **ret_error) {
        char buf[256];
        void *lib;
        cu_init_t cu_init;
        cu_count_t cu_count;
        int n = 0, r;

        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib)
                return fail(ret_error, -ENODEV, "libcuda.so.1 cannot be loaded (no NVIDIA driver installed)");
        cu_init = (cu_init_t) dlsym(lib, "cuInit");
        cu_count = (cu_count_t) dlsym(lib, "cuDeviceGetCount");
        if (!cu_init || !cu_count) {
                dlclose(lib);
                return fail(ret_error, -ENODEV, "libcuda.so.1 lacks cuInit/cuDeviceGetCount");
        }
        r = cu_init(0);
        if (r != 0) {
                dlclose(lib);
                snprintf(buf, sizeof(buf), "cuInit failed with CUresult %d (driver not loaded or no device)", r);
                return fail(ret_error, -ENODEV, buf);
        }
        r = cu_count(&n);
        dlclose(lib);
        if (r != 0 || n <= 0)
                return fail(ret_error, -ENODEV, "the driver reports no CUDA device");

        snprintf(buf, sizeof(buf), "%d CUDA device(s) found, but this tierd has no CUDA VRAM backend yet", n);
        return fail(ret_error, -EOPNOTSUPP, buf);
}
