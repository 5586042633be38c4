/* SPDX-License-Identifier: MIT */
/* extent.h: bitmap allocator of fixed-size units (NVMe extents, pool pages). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ExtentAlloc {
        uint64_t *bits;         /* 1 = used */
        uint64_t n_units;
        uint64_t n_free;
        uint64_t hint;          /* where the next search starts */
} ExtentAlloc;

#define EXTENT_ALLOC_NULL ((ExtentAlloc) { .bits = NULL })

/* Overwrites @a; n_units 0 gives an allocator that is always full.  -ENOMEM, -EINVAL. */
int extent_alloc_init(ExtentAlloc *a, uint64_t n_units);
void extent_alloc_deinit(ExtentAlloc *a);

/**
 * extent_alloc_get() - allocate @count contiguous units (first fit from the
 * hint, wrapping once).  Returns the first unit in *ret_unit and 0, or
 * -ENOSPC when no run of @count free units exists (n_free may still be
 * >= count: fragmentation), -EINVAL for count 0.
 */
int extent_alloc_get(ExtentAlloc *a, uint64_t count, uint64_t *ret_unit);

/**
 * extent_alloc_get_low() - allocate @count contiguous units starting at a
 * multiple of @align, at the lowest address where they fit (first fit from
 * the start: small runs pack at the low end and leave the largest run whole
 * at the high end).  -ENOSPC when no such run exists, -EINVAL for count or
 * align 0.
 */
int extent_alloc_get_low(ExtentAlloc *a, uint64_t count, uint64_t align, uint64_t *ret_unit);

/* Release a run; -EINVAL if out of range or any unit is not allocated (nothing changes then). */
int extent_alloc_put(ExtentAlloc *a, uint64_t unit, uint64_t count);

/* Mark a run as used (e.g. restoring persisted state); -EBUSY if any is used. */
int extent_alloc_reserve(ExtentAlloc *a, uint64_t unit, uint64_t count);

/* Units at or past n_units read as used. */
bool extent_alloc_is_used(const ExtentAlloc *a, uint64_t unit);
/* Length of the longest free run (for status and tests). */
uint64_t extent_alloc_largest_free(const ExtentAlloc *a);
