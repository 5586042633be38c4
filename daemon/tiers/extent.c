/* SPDX-License-Identifier: MIT */
/* extent.c: bitmap allocator of fixed-size units (NVMe extents, pool pages). */

/*
 * Theory of operation
 *
 * One bit per unit, 1 = used, in 64-bit words.  The bits past n_units in the
 * last word are set at init and never cleared, so every search can treat the
 * bitmap as whole words: a free run can never reach past the end, and a word
 * equal to ~0 (full) or 0 (empty) is skipped with a single compare.
 *
 * extent_alloc_get() is first fit from the hint: it looks for the lowest run
 * of @count free units that starts at or after the hint, and failing that
 * the lowest one that starts before it (one wrap).  After a success the hint
 * moves just past the new run, so consecutive allocations fill the space
 * like a ring instead of re-scanning the crowded front each time.  The cost
 * is O(words scanned + runs too short to fit).
 *
 * extent_alloc_put() and extent_alloc_reserve() check the whole range before
 * touching a bit, so a bad call (double free, overlap) changes nothing.  The
 * allocator is not thread-safe; its owner serializes calls.
 */

#include <errno.h>
#include <stdlib.h>

#include "daemon/tiers/extent.h"

#define WORD_BITS 64u

static inline uint64_t word_index(uint64_t unit) {
        return unit / WORD_BITS;
}

/* Mask of bits [lo, hi) within one word, 0 <= lo < hi <= 64. */
static inline uint64_t word_mask(unsigned lo, unsigned hi) {
        uint64_t m = hi == WORD_BITS ? ~UINT64_C(0) : (UINT64_C(1) << hi) - 1;

        return m & ~((UINT64_C(1) << lo) - 1);
}

static uint64_t n_words(uint64_t n_units) {
        return n_units / WORD_BITS + (n_units % WORD_BITS != 0);
}

static bool range_valid(const ExtentAlloc *a, uint64_t unit, uint64_t count) {
        return count > 0 && unit < a->n_units && count <= a->n_units - unit;
}

/* Mask of the bits of word @w that lie in [unit, end). */
static inline uint64_t range_word_mask(uint64_t w, uint64_t unit, uint64_t end) {
        uint64_t base = w * WORD_BITS;
        unsigned lo = unit > base ? (unsigned) (unit - base) : 0;
        unsigned hi = end - base >= WORD_BITS ? WORD_BITS : (unsigned) (end - base);

        return word_mask(lo, hi);
}

/* @any: is any unit of a valid range used?  Else: are all of them used? */
static bool range_test(const ExtentAlloc *a, uint64_t unit, uint64_t count, bool any) {
        uint64_t end = unit + count;

        for (uint64_t w = word_index(unit); w <= word_index(end - 1); w++) {
                uint64_t m = range_word_mask(w, unit, end);

                if (any && (a->bits[w] & m))
                        return true;
                if (!any && (a->bits[w] & m) != m)
                        return false;
        }
        return !any;
}

/* Set (@used) or clear the bits of a valid range. */
static void range_write(ExtentAlloc *a, uint64_t unit, uint64_t count, bool used) {
        uint64_t end = unit + count;

        for (uint64_t w = word_index(unit); w <= word_index(end - 1); w++) {
                uint64_t m = range_word_mask(w, unit, end);

                if (used)
                        a->bits[w] |= m;
                else
                        a->bits[w] &= ~m;
        }
}

/* First free unit >= @from, or n_units. */
static uint64_t find_free(const ExtentAlloc *a, uint64_t from) {
        uint64_t w, nw = n_words(a->n_units), bits;

        if (from >= a->n_units)
                return a->n_units;

        w = word_index(from);
        bits = ~a->bits[w] & (~UINT64_C(0) << (from % WORD_BITS));
        while (bits == 0) {
                if (++w >= nw)
                        return a->n_units;
                bits = ~a->bits[w];
        }
        return w * WORD_BITS + (uint64_t) __builtin_ctzll(bits);
}

/* First used unit in [from, limit), or limit.  @limit <= n_units. */
static uint64_t find_used(const ExtentAlloc *a, uint64_t from, uint64_t limit) {
        uint64_t w, last, bits, r;

        if (from >= limit)
                return limit;

        w = word_index(from);
        last = word_index(limit - 1);
        bits = a->bits[w] & (~UINT64_C(0) << (from % WORD_BITS));
        while (bits == 0) {
                if (++w > last)
                        return limit;
                bits = a->bits[w];
        }
        r = w * WORD_BITS + (uint64_t) __builtin_ctzll(bits);
        return r < limit ? r : limit;
}

/* Lowest start in [from, start_limit) of @count free units; n_units if none. */
static uint64_t find_run(const ExtentAlloc *a, uint64_t from, uint64_t start_limit, uint64_t count) {
        uint64_t pos = find_free(a, from);

        while (pos < start_limit) {
                uint64_t end;

                if (count > a->n_units - pos)
                        break;          /* every later start overruns too */
                end = find_used(a, pos, pos + count);
                if (end - pos == count)
                        return pos;
                pos = find_free(a, end);
        }
        return a->n_units;
}

int extent_alloc_init(ExtentAlloc *a, uint64_t n_units) {
        uint64_t nw;

        if (n_units > UINT64_MAX - WORD_BITS)
                return -EINVAL;
        nw = n_words(n_units);
        if (nw > SIZE_MAX / sizeof(uint64_t))
                return -ENOMEM;

        *a = EXTENT_ALLOC_NULL;
        /* At least one word so that bits is never NULL for an initialised allocator. */
        a->bits = calloc(nw > 0 ? nw : 1, sizeof(uint64_t));
        if (!a->bits)
                return -ENOMEM;
        if (n_units % WORD_BITS != 0)
                a->bits[nw - 1] = ~word_mask(0, (unsigned) (n_units % WORD_BITS));
        a->n_units = n_units;
        a->n_free = n_units;
        a->hint = 0;
        return 0;
}

void extent_alloc_deinit(ExtentAlloc *a) {
        free(a->bits);
        *a = EXTENT_ALLOC_NULL;
}

int extent_alloc_get(ExtentAlloc *a, uint64_t count, uint64_t *ret_unit) {
        uint64_t pos, hint;

        if (count == 0)
                return -EINVAL;
        if (count > a->n_free)
                return -ENOSPC;

        hint = a->hint < a->n_units ? a->hint : 0;
        pos = find_run(a, hint, a->n_units, count);
        if (pos >= a->n_units && hint > 0)
                pos = find_run(a, 0, hint, count);
        if (pos >= a->n_units)
                return -ENOSPC;

        range_write(a, pos, count, true);
        a->n_free -= count;
        a->hint = pos + count < a->n_units ? pos + count : 0;
        *ret_unit = pos;
        return 0;
}

int extent_alloc_get_low(ExtentAlloc *a, uint64_t count, uint64_t align, uint64_t *ret_unit) {
        uint64_t pos;

        if (count == 0 || align == 0)
                return -EINVAL;
        if (count > a->n_free)
                return -ENOSPC;

        pos = find_free(a, 0);
        while (pos < a->n_units) {
                uint64_t start = (pos + align - 1) / align * align, end;

                if (start >= a->n_units || count > a->n_units - start)
                        return -ENOSPC;         /* every later start overruns too */
                end = find_used(a, start, start + count);
                if (end - start == count) {
                        range_write(a, start, count, true);
                        a->n_free -= count;
                        *ret_unit = start;
                        return 0;
                }
                pos = find_free(a, end);
        }
        return -ENOSPC;
}

int extent_alloc_put(ExtentAlloc *a, uint64_t unit, uint64_t count) {
        if (!range_valid(a, unit, count))
                return -EINVAL;
        if (!range_test(a, unit, count, false))
                return -EINVAL;

        range_write(a, unit, count, false);
        a->n_free += count;
        return 0;
}

int extent_alloc_reserve(ExtentAlloc *a, uint64_t unit, uint64_t count) {
        if (!range_valid(a, unit, count))
                return -EINVAL;
        if (range_test(a, unit, count, true))
                return -EBUSY;

        range_write(a, unit, count, true);
        a->n_free -= count;
        return 0;
}

bool extent_alloc_is_used(const ExtentAlloc *a, uint64_t unit) {
        /* Units past the end read as used: they can never be handed out. */
        if (unit >= a->n_units)
                return true;
        return a->bits[word_index(unit)] & (UINT64_C(1) << (unit % WORD_BITS));
}

uint64_t extent_alloc_largest_free(const ExtentAlloc *a) {
        uint64_t best = 0, pos;

        if (a->n_free == 0)
                return 0;

        pos = find_free(a, 0);
        while (pos < a->n_units) {
                uint64_t end = find_used(a, pos, a->n_units);

                if (end - pos > best)
                        best = end - pos;
                if (best >= a->n_free)
                        break;  /* no longer run can exist */
                pos = find_free(a, end);
        }
        return best;
}
