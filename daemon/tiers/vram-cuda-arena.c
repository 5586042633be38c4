/* SPDX-License-Identifier: MIT */
/* vram-cuda-arena.c: the CUDA VRAM backend's geometry and its device's NUMA node (no driver calls). */

/*
 * Theory of operation: what vram-cuda.c decides before it asks the driver
 * for memory, kept apart as plain functions that unit tests call directly:
 * how many chunks of which size the pool gets (vram_cuda_arena()), and the
 * NUMA node of the device from sysfs (vram_cuda_numa_node_of()).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "daemon/tiers/vram-cuda.h"
#include "proto/macro.h"
#if TIERD_HAVE_CUDA
#include "proto/cudrv.h"

int vram_cuda_arena(uint64_t chunk_size, uint64_t capacity, uint64_t granularity, uint64_t free_bytes,
                    uint64_t *ret_chunk, uint64_t *ret_capacity, int *ret_clamped) {
        uint64_t chunk, limit;

        if (granularity == 0 || chunk_size == 0)
                return -EINVAL;
        chunk = ALIGN_UP(chunk_size, granularity);
        limit = free_bytes * VRAM_CUDA_FREE_PERCENT / 100;  /* no overflow below 2^57 bytes */
        *ret_clamped = capacity > limit;
        if (capacity == 0 || capacity > limit)
                capacity = limit;       /* 0: as much as the device has */
        capacity = capacity / chunk * chunk;
        if (capacity < chunk)
                return -ENOMEM;
        *ret_chunk = chunk;
        *ret_capacity = capacity;
        return 0;
}

int vram_cuda_numa_node_of(const char *sysfs_root, const char *bus_id) {
        char name[32], path[256], buf[32];
        ssize_t n;
        int fd, node;

        if (cudrv_pci_sysfs_name(bus_id, name, sizeof(name)) < 0)
                return -1;
        snprintf(path, sizeof(path), "%s/%s/numa_node", sysfs_root ? sysfs_root : "/sys/bus/pci/devices", name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -1;
        n = read(fd, buf, sizeof(buf) - 1);
        safe_close(fd);
        if (n <= 0)
                return -1;
        buf[n] = 0;
        if (sscanf(buf, "%d", &node) != 1 || node < 0)
                return -1;      /* -1: the kernel knows no node for it */
        return node;
}

#endif
