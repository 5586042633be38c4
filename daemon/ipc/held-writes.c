/* SPDX-License-Identifier: MIT */
/* held-writes.c: a Hello's held writes, sorted once so that each copy a Hello decides is looked up. */

/*
 * Theory of operation: the first Hello of a rank after tierd restarted
 * decides each write-only copy that rank held (job_release_ghosts()): it
 * counts as written when the Hello names it in held_writes.  A Hello may
 * name up to 8 x max_tensors writes and the job hold as many such copies,
 * so a scan of the list per copy was copies x writes of work in one
 * request on the main loop (a reconnect with 100k tensors pinned for
 * writing, or a hostile client).  The list is sorted once by (tier, name)
 * (n log n, whatever names a client picks: no hash to flood), and each
 * copy is a binary search.
 */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ipc/held-writes.h"
#include "daemon/state/registry.h"
#include "tier.pb-c.h"

static int compare(int tier_a, const char *name_a, const Tier__HeldWrite *b, uint64_t *steps) {
        if (steps)
                (*steps)++;
        if (tier_a != (int) b->tier)
                return tier_a < (int) b->tier ? -1 : 1;
        return strcmp(name_a, b->tensor);
}

static int compare_writes(const void *a, const void *b, void *steps) {
        const Tier__HeldWrite *x = *(const Tier__HeldWrite *const *) a, *y = *(const Tier__HeldWrite *const *) b;

        return compare((int) x->tier, x->tensor, y, steps);
}

int held_writes_index(Tier__HeldWrite *const *w, size_t n, uint64_t *steps, HeldWrites *ret) {
        *ret = (HeldWrites) { .steps = steps };
        if (n == 0)
                return 0;
        ret->w = calloc(n, sizeof(*ret->w));
        if (!ret->w)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                if (w[i]->tensor)
                        ret->w[ret->n++] = w[i];
        qsort_r(ret->w, ret->n, sizeof(*ret->w), compare_writes, steps);
        return 0;
}

bool held_writes_has(const Tensor *t, int tier, void *userdata) {
        const HeldWrites *hw = userdata;
        size_t lo = 0, hi = hw->n;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int d = compare(tier, t->name, hw->w[mid], hw->steps);

                if (d == 0)
                        return true;
                if (d < 0)
                        hi = mid;
                else
                        lo = mid + 1;
        }
        return false;
}

void held_writes_free(HeldWrites *hw) {
        free(hw->w);
        *hw = (HeldWrites) {};
}
