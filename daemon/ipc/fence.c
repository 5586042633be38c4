/* SPDX-License-Identifier: MIT */
/* fence.c: a connection's fences (the job's fence page, its wakeup pipe). */

/*
 * Theory of operation: each connection of a job owns one slot of the job's
 * fence page (proto/fence.h), which its client maps read-only.  Async
 * requests get fence numbers 1, 2, ... in the order they were accepted;
 * done[slot] is a watermark, so fences that complete out of order are
 * remembered (Conn.fence_completed, bounded by max_inflight, which bounds
 * the fences outstanding too) until the ones before them have completed.
 * A failed fence also counts in failed[slot] and is told by
 * Event.fence_failed; a client that cannot be sent that event would wait
 * forever, so its connection is closed instead.  After the page changes
 * the connection's wakeup pipe gets a token (wakeup_kick()), for a client
 * sleeping on it.  The pins a connection holds: pins.c.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon/base/log.h"

#include "daemon/base/wakeup.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/fence.h"
#include "daemon/sched/plan.h"
#include "daemon/state/registry.h"
#include "proto/fence.h"
#include "tier.pb-c.h"

static void fence_send_failed(Conn *c, uint64_t fence, int status, const char *error) {
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__FenceFailed ff = TIER__FENCE_FAILED__INIT;

        ff.fence = fence;
        ff.status = status;
        ff.error = (char *) (error ? error : "");
        ev.kind_case = TIER__EVENT__KIND_FENCE_FAILED;
        ev.fence_failed = &ff;
        /* a client that misses this event would wait forever: better closed */
        if (conn_send_event(c, &ev) < 0)
                conn_abort(c);
        __atomic_add_fetch(&c->job->fences->failed[c->fence_slot], 1, __ATOMIC_RELEASE);
}

void fence_complete(Conn *c, uint64_t fence, int status, const char *error, unsigned max_pending) {
        bool advanced = false;

        if (status < 0)
                fence_send_failed(c, fence, status, error);

        if (fence == c->fence_done + 1) {
                c->fence_done = fence;
                advanced = true;
                /* absorb fences that completed out of order */
                for (bool again = true; again;) {
                        again = false;
                        for (size_t i = 0; i < c->n_fence_completed; i++)
                                if (c->fence_completed[i] == c->fence_done + 1) {
                                        c->fence_done++;
                                        c->fence_completed[i] = c->fence_completed[--c->n_fence_completed];
                                        again = true;
                                        break;
                                }
                }
        } else if (c->n_fence_completed < max_pending)
                c->fence_completed[c->n_fence_completed++] = fence;

        if (advanced || status < 0) {
                __atomic_store_n(&c->job->fences->done[c->fence_slot], c->fence_done, __ATOMIC_RELEASE);
                wakeup_kick(c->efd);
        }
}

/* The pins by slot (pins.c): a free slot is a NULL tensor in tier -1, which no phase's tier matches. */
static bool plan_pin(void *owner, size_t i, Tensor **ret_tensor, int *ret_tier) {
        Conn *c = owner;

        if (i >= c->n_pin_slots)
                return false;
        *ret_tensor = c->pins[i].tensor;
        *ret_tier = c->pins[i].tensor ? c->pins[i].tier : -1;
        return true;
}

static void plan_refused(void *owner, uint64_t seq, uint32_t phase, int status, const char *error) {
        Conn *c = owner;
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__PhaseRefused pr = TIER__PHASE_REFUSED__INIT;

        pr.seq = seq;
        pr.phase = phase;
        pr.status = status;
        pr.error = (char *) (error ? error : "");
        ev.kind_case = TIER__EVENT__KIND_PHASE_REFUSED;
        ev.phase_refused = &pr;
        /* a client that misses this event waits in tier_phase_enter() forever: better closed */
        if (conn_send_event(c, &ev) < 0) {
                log_debug("ipc: connection %" PRIu64 " cannot be told its phase %" PRIu32 " is refused: closed",
                          c->id, phase);
                conn_abort(c);
        }
        wakeup_kick(c->efd);
}

static const PlanOwnerOps plan_owner_ops = {
        .pin = plan_pin,
        .refused = plan_refused,
};

void pin_plan_attach(Conn *c, Plan *p) {
        plan_set_owner_ops(p, &plan_owner_ops, c);
}
