/* SPDX-License-Identifier: MIT */
/* vram-cuda.h: internals of the CUDA VRAM backend that unit tests reach. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Host<->VRAM copies are queued in pieces this big (one cuMemcpy*Async each). */
#define VRAM_CUDA_PIECE (8u << 20)
/* An oversized [vram] capacity is cut to this share (%) of the free device memory. */
#define VRAM_CUDA_FREE_PERCENT 90u

/*
 * vram_cuda_arena() - the pool's geometry.
 * @chunk_size:  [vram] chunk_size
 * @capacity:    [vram] capacity
 * @granularity: the device's recommended allocation granularity
 * @free_bytes:  free device memory now
 * Chunks are @chunk_size rounded up to @granularity; the capacity is
 * @capacity, cut to VRAM_CUDA_FREE_PERCENT of @free_bytes when it asks for
 * more or is 0, rounded down to whole chunks.  -ENOMEM when not one chunk fits,
 * -EINVAL for a zero granularity or chunk size.  *@ret_clamped tells
 * whether the capacity was cut.
 */
int vram_cuda_arena(uint64_t chunk_size, uint64_t capacity, uint64_t granularity, uint64_t free_bytes,
                    uint64_t *ret_chunk, uint64_t *ret_capacity, int *ret_clamped);

/*
 * vram_cuda_numa_node_of() - NUMA node of the PCI device @bus_id (as CUDA
 * writes it), read from @sysfs_root/<name>/numa_node (@sysfs_root NULL:
 * /sys/bus/pci/devices).  -1 when unknown or on a machine without NUMA.
 */
int vram_cuda_numa_node_of(const char *sysfs_root, const char *bus_id);
