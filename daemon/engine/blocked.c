/* SPDX-License-Identifier: MIT */
/* blocked.c: victims whose write-down would fail the same way as one that just did, passed over. */

/*
 * Theory of operation.
 *
 * A drain (or write-behind) that fails leaves its copy sole where it is,
 * and marks it (Tensor.drain_blocked): it is not chosen for a drain again
 * until the tier below changes (Engine.space_gen of that tier moves when a
 * copy there is freed or unpinned, or limits change).  That alone passes over only the
 * victim that failed: when the tier below has no room for the job, an op
 * making room in a tier of N sole copies would drain them one after the
 * other, each failing for the same reason, and each failure woke it to
 * rank all N again -- N drains and N rankings of N victims, all in one run
 * of the engine's queue, the loop serving no one meanwhile (65536 4 KiB
 * tensors, a full nvme limit: minutes).
 *
 * So a drain that failed for want of room below (-ENOSPC from its
 * reservation, not a transfer's error) marks its job too
 * (Job.drain_short): until the tier below changes, a sole copy of that job
 * with no copy of its own there yet, at least as large as the one that
 * failed, is blocked as well -- its reservation would ask the same job for
 * at least as much room in the same tier, with nothing freed since.  A
 * smaller one is still tried (room for it may remain).
 */

#include <errno.h>

#include "daemon/engine/engine-private.h"
#include "daemon/state/registry.h"

bool engine_drain_blocked(const Engine *e, const Tensor *v, int tier) {
        const Job *j = v->job;
        uint64_t gen;

        if (tier < 0 || tier + 1 >= TIERS)
                return false;
        gen = e->space_gen[tier + 1] + 1;
        if (v->drain_blocked[tier] == gen)
                return true;
        return j && j->drain_short[tier].gen == gen && v->alloc_size >= j->drain_short[tier].size &&
               v->copy[tier + 1].state == COPY_ABSENT;
}

void engine_drain_failed(Engine *e, Tensor *v, int tier, int r, bool reserving) {
        Job *j = v->job;
        uint64_t gen;

        if (tier < 0 || tier + 1 >= TIERS)
                return;
        gen = e->space_gen[tier + 1] + 1;
        v->drain_blocked[tier] = gen;
        if (r != -ENOSPC || !reserving || !j || v->copy[tier + 1].state != COPY_ABSENT)
                return;
        if (j->drain_short[tier].gen != gen || v->alloc_size < j->drain_short[tier].size)
                j->drain_short[tier] = (DrainShort) { gen, v->alloc_size };
}
