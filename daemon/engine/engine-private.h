/* SPDX-License-Identifier: MIT */
/* engine-private.h: what op.c and xfer.c share inside the engine (never used outside daemon/engine). */
#pragma once

#include <stdint.h>

#include "daemon/engine/engine.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"

typedef struct XferPart XferPart;
typedef struct XferCopy XferCopy;

/*
 * A transfer: one tensor's valid copy in @src copied into its reserved copy
 * in @dst.  It belongs to the tensor (Tensor.xfer), not to an op: ops only
 * wait for it (Tensor.waiters), so cancelling an op never touches I/O.
 */
typedef struct Xfer {
        Engine *engine;
        Tensor *tensor;
        int src, dst;
        uint64_t version;
        unsigned pending;       /* NVMe parts not completed yet */
        int error;
        char errmsg[160];
        VramDir vdir;
        XferCopy *vcopies;      /* host <-> VRAM: one copy per stretch within one host and one VRAM piece */
        uint32_t n_vcopies;
        uint32_t vpending;      /* of them with the backend, not done yet */
        List vlink;             /* VramLink.waiting, while it waits for the VRAM link */
        double vtag;            /* its virtual start time there (fairq.h) */
        XferPart *parts;
        uint32_t n_parts;
        List link;              /* Engine.xfers */
} Xfer;

/* Record why @op fails in op->error; returns @r. */
int op_fail(Op *op, int r, const char *fmt, ...) _printf_(3, 4);

/* Start moving @t's valid copy in @src into the reserved copy in @dst (xfer.c).  0 or -errno (op->error set). */
int xfer_start(Op *op, Tensor *t, int src, int dst);

/* Free every transfer still in flight, as if it never started (tierd's exit, nothing will complete them). */
void xfer_abandon_all(Engine *e);

/*
 * engine_xfer_ended() - the transfer of @t ended (t->xfer is NULL again):
 * the ops that waited for it run again, failing with @error (< 0, reason
 * @errmsg) if it failed.  Called by xfer.c.
 */
void engine_xfer_ended(Engine *e, Tensor *t, List *waiters, int error, const char *errmsg);
