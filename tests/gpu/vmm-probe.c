/* SPDX-License-Identifier: MIT */
/* vmm-probe.c: which CUDA VMM mappings this driver allows, the ones tierd and libtier rely on. */

/*
 * usage: vmm-probe [CHUNK_MIB]     (default 64)
 *
 * A diagnostic for tests/gpu/run.sh, not a test: it makes one chunk the way
 * tierd does (cuMemCreate, pinned, POSIX-fd shareable), exports it, and in a
 * forked child (another process, like a training job) imports it and maps
 * it whole, and two chunks whole side by side in one reservation (how
 * libtier maps a tensor that spans chunks); then, for information, parts of
 * a chunk (at offset 0, a granule inside, the last granule, the second
 * half), which the driver refuses (CUDA_ERROR_NOT_SUPPORTED on 580 / CUDA 13,
 * H200) and libtier therefore never asks for.  Each line says which call
 * returned what.  The same is tried in the parent on the original handles.
 * Exit status: 0 when everything libtier needs worked, 1 otherwise, 77 no device.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/cudrv.h"

static CuDriver *d;
static CUdevice dev;
static int failures;

static const char *err(CUresult r) {
        static char buf[160];

        return cudrv_strerror(d, r, buf, sizeof(buf));
}

/* Informational checks (mappings libtier does not rely on) print, but do not fail. */
static bool info_only;

static void report(const char *who, const char *what, CUresult r) {
        printf("%s: %-58s %s%s\n", who, what, r == CUDA_SUCCESS ? "ok" : err(r),
               r != CUDA_SUCCESS && info_only ? " (not needed by libtier)" : "");
        if (r != CUDA_SUCCESS && !info_only)
                failures++;
}

/* Map [offset, offset + len) of @h into a fresh reservation of @len; unmap again. */
static void piece(const char *who, CUmemGenericAllocationHandle h, size_t offset, size_t len, size_t gran) {
        CUmemAccessDesc access = {
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        char what[128];
        CUdeviceptr va = 0;
        CUresult r;

        r = d->cuMemAddressReserve(&va, len, gran, 0, 0);
        snprintf(what, sizeof(what), "reserve %zu KiB", len >> 10);
        if (r != CUDA_SUCCESS) {
                report(who, what, r);
                return;
        }
        r = d->cuMemMap(va, len, offset, h, 0);
        snprintf(what, sizeof(what), "cuMemMap offset %zu KiB size %zu KiB", offset >> 10, len >> 10);
        report(who, what, r);
        if (r == CUDA_SUCCESS) {
                r = d->cuMemSetAccess(va, len, &access, 1);
                snprintf(what, sizeof(what), "cuMemSetAccess of that piece");
                report(who, what, r);
                if (r == CUDA_SUCCESS) {
                        r = d->cuMemsetD8(va, 0x5a, len);
                        report(who, "cuMemsetD8 through it", r);
                }
                (void) d->cuMemUnmap(va, len);
        }
        (void) d->cuMemAddressFree(va, len);
}

/* Chunks @a and @b, whole, side by side in one reservation: how libtier maps a tensor over two chunks. */
static void pair(const char *who, CUmemGenericAllocationHandle a, CUmemGenericAllocationHandle b, size_t chunk,
                 size_t gran) {
        CUmemAccessDesc access = {
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        CUdeviceptr va = 0;
        CUresult r;

        r = d->cuMemAddressReserve(&va, 2 * chunk, gran, 0, 0);
        if (r != CUDA_SUCCESS) {
                report(who, "reserve two chunks", r);
                return;
        }
        r = d->cuMemMap(va, chunk, 0, a, 0);
        report(who, "pair: first chunk whole at va", r);
        if (r == CUDA_SUCCESS) {
                r = d->cuMemMap(va + chunk, chunk, 0, b, 0);
                report(who, "pair: second chunk whole at va + chunk", r);
                if (r == CUDA_SUCCESS) {
                        report(who, "pair: cuMemSetAccess first chunk", d->cuMemSetAccess(va, chunk, &access, 1));
                        report(who, "pair: cuMemSetAccess second chunk",
                               d->cuMemSetAccess(va + chunk, chunk, &access, 1));
                        report(who, "pair: cuMemsetD8 across the two", d->cuMemsetD8(va + chunk - gran, 0x11, 2 * gran));
                        (void) d->cuMemUnmap(va + chunk, chunk);
                }
                (void) d->cuMemUnmap(va, chunk);
        }
        (void) d->cuMemAddressFree(va, 2 * chunk);
}

static void pieces(const char *who, CUmemGenericAllocationHandle h, CUmemGenericAllocationHandle h2, size_t chunk,
                   size_t gran) {
        piece(who, h, 0, chunk, gran);
        pair(who, h, h2, chunk, gran);
        /* parts of a chunk: the driver of 2026 (580, CUDA 13) refuses them all */
        info_only = true;
        piece(who, h, 0, gran, gran);
        piece(who, h, gran, gran, gran);
        piece(who, h, chunk - gran, gran, gran);
        piece(who, h, chunk / 2, chunk / 2, gran);
        info_only = false;
}

/* The other process: import the two chunks' fds, map them whole, side by side, and in parts. */
static int child(int fd0, int fd1, size_t chunk) {
        CUmemAllocationProp prop = {
                .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        };
        CUmemGenericAllocationHandle ih[2] = {};
        int fds[2] = { fd0, fd1 };
        CUdeviceptr va = 0;
        char *why = NULL;
        size_t gmin = 0;
        CUcontext ctx;

        if (cudrv_open(&d, &why) < 0 || d->cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
            d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || d->cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
                printf("child: cannot open the driver: %s\n", why ? why : "?");
                return 2;
        }
        prop.location = (CUmemLocation) { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev };
        report("child", "granularity minimum",
               d->cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        for (int i = 0; i < 2; i++)
                report("child", "cuMemImportFromShareableHandle",
                       d->cuMemImportFromShareableHandle(&ih[i], (void *) (intptr_t) fds[i],
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        report("child", "map the import whole (cudrv_map)", cudrv_map(d, ih[0], chunk, gmin, dev, &va));
        pieces("child", ih[0], ih[1], chunk, gmin);
        if (va)
                cudrv_unmap(d, va, chunk);
        for (int i = 0; i < 2; i++)
                if (ih[i])
                        (void) d->cuMemRelease(ih[i]);
        return failures ? 1 : 0;
}

int main(int argc, char *argv[]) {
        size_t chunk = (argc > 1 ? strtoull(argv[1], NULL, 0) : 64) << 20, gmin = 0, grec = 0;
        CUmemAllocationProp prop = {
                .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        };
        CUmemGenericAllocationHandle h[2] = {};
        char *why = NULL;
        CUcontext ctx;
        int fd[2] = { -1, -1 };
        char self[PATH_MAX];
        ssize_t n;
        pid_t pid;
        int st;

        setvbuf(stdout, NULL, _IOLBF, 0);
        if (argc == 5 && strcmp(argv[1], "child") == 0)
                return child(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], NULL, 0) << 20);
        if (cudrv_open(&d, &why) < 0) {
                printf("no CUDA device: %s\n", why ? why : "?");
                return 77;
        }
        if (d->cuDeviceGet(&dev, 0) != CUDA_SUCCESS || d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
            d->cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
                printf("no CUDA device: device 0 unusable\n");
                return 77;
        }
        prop.location = (CUmemLocation) { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev };
        report("parent", "granularity minimum",
               d->cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        report("parent", "granularity recommended",
               d->cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        printf("granularity: minimum %zu KiB, recommended %zu KiB; chunk %zu MiB; driver %d\n", gmin >> 10,
               grec >> 10, chunk >> 20, d->version);
        for (int i = 0; i < 2; i++) {
                CUresult r = d->cuMemCreate(&h[i], chunk, &prop, 0);

                report("parent", "cuMemCreate", r);
                if (r != CUDA_SUCCESS)
                        return 1;
                r = d->cuMemExportToShareableHandle(&fd[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                report("parent", "cuMemExportToShareableHandle", r);
                if (r != CUDA_SUCCESS)
                        return 1;
        }

        /*
         * This program again, by its path: exec'ing /proc/self/exe itself would,
         * under valgrind, start valgrind's tool (whose /proc/self/exe it is),
         * while valgrind answers readlink() with the client's path
         */
        n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0 || (size_t) n >= sizeof(self) - 1)
                return 1;
        self[n] = 0;
        pid = fork();
        if (pid == 0) {
                char a[16], b[16], c[24];

                /* a new process image: CUDA state does not survive fork(); the exported fds are CLOEXEC */
                for (int i = 0; i < 2; i++)
                        (void) fcntl(fd[i], F_SETFD, 0);
                snprintf(a, sizeof(a), "%d", fd[0]);
                snprintf(b, sizeof(b), "%d", fd[1]);
                snprintf(c, sizeof(c), "%zu", chunk >> 20);
                execl(self, argv[0], "child", a, b, c, (char *) NULL);
                _exit(127);
        }
        if (pid < 0)
                return 1;
        if (waitpid(pid, &st, 0) < 0)
                return 1;
        printf("child: exit status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                failures++;
        pieces("parent", h[0], h[1], chunk, gmin);
        for (int i = 0; i < 2; i++) {
                close(fd[i]);
                (void) d->cuMemRelease(h[i]);
        }
        printf("vmm-probe: %s\n", failures ? "FAILED" : "all mappings libtier needs work");
        return failures ? 1 : 0;
}
