/* SPDX-License-Identifier: MIT */
/* mover.h: the op engine: bringing copies up, writing them down, making space. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/base/list.h"
#include "daemon/state/registry.h"

typedef enum OpKind {
        OP_PIN,
        OP_PREFETCH,
        OP_EVICT,
        OP_DRAIN,               /* internal: write a victim down, then drop it */
        OP_CLEAN,               /* internal: write a sole copy down, keep it (write-behind) */
        _OP_KIND_MAX,
} OpKind;

typedef enum OpWait {
        OP_WAIT_NONE,
        OP_WAIT_RUN,            /* in Manager.run_queue */
        OP_WAIT_TENSOR,         /* in Tensor.waiters */
        OP_WAIT_SPACE,          /* in Manager.space_waiters */
} OpWait;

struct Op {
        Manager *manager;
        OpKind kind;
        Tensor *tensor;
        int tier;
        OpWait wait;
        List wait_link;
        List all_link;          /* Manager-wide list, for cancellation */
        bool pinned;            /* a pin op that already holds its pin */
        bool reserved_sent;     /* the reserved() callback ran */
        int failed;             /* -errno of a transfer this op waited for */
        uint64_t deadline_ns;   /* when the data is needed (0: now); victims must be needed later */
        bool no_wait;           /* fail with -EAGAIN instead of failing for lack of space */
        bool discard;           /* pin for a write-only access: reserve, do not bring the old bytes */
        /* Called once when the op ends (status 0 or -errno); the op is freed after. */
        void (*complete)(Op *op, int status, const char *error);
        /* Pin ops only: called once the destination is reserved (the grant is known). */
        void (*reserved)(Op *op);
        /* Called instead of complete() when the op is cancelled (its owner's bookkeeping). */
        void (*cancelled)(Op *op);
        void *userdata;
        char error[160];        /* reason text for a failure */
};

int mover_init(Manager *m);
void mover_deinit(Manager *m);

/* Create and queue an op.  It holds a reference on @t until it completes. */
int op_submit(Manager *m, OpKind kind, Tensor *t, int tier,
              void (*complete)(Op *, int, const char *), void (*reserved)(Op *), void *userdata, Op **ret);
/* Forget an op (its client is gone): no callback runs; a pin it took is dropped. */
void op_cancel(Op *op);
/* Cancel every op on a tensor of @j. */
void mover_cancel_job(Manager *m, Job *j);

/* Space was freed outside the op engine (a revoked segment is back): let waiting ops retry. */
void mover_wake_space_waiters(Manager *m);

/* Run queued ops until none is runnable (the run source calls this). */
void mover_run(Manager *m);

/* The grant of a pinned or reserved copy. */
void copy_grant(const Tensor *t, int tier, uint32_t *ret_segment, uint32_t *ret_generation, uint64_t *ret_offset);

/* Drop one pin; @dirty: the client wrote this copy (copies below become stale). */
int tensor_unpin(Tensor *t, int tier, bool dirty);
/* Release a copy's space (no I/O). */
void copy_free(Manager *m, Tensor *t, int tier);
/* Free a tensor's copies now or, if a transfer is running, when it ends. */
void tensor_release_copies(Tensor *t);
