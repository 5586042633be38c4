/* SPDX-License-Identifier: MIT */
/* xfer.c: transfers: NVMe <-> host in extents with crc32c, host <-> VRAM over the fair VRAM link. */

/*
 * Theory of operation: a transfer (Xfer) copies a tensor's valid copy into
 * its reserved copy in another tier; it belongs to the tensor (one at a
 * time, Tensor.xfer) and ends on its own, whatever happens to the ops that
 * wait for it.
 *
 * NVMe <-> host: one io_uring request per extent (registered file +
 * registered buffer) in the job's flow of the NVMe fair queue (uring.c).
 * Each extent is checksummed on its own: a write's crc32c just before its
 * request goes to the ring (UringReq.prep; the host copy does not change
 * while the tensor is in transfer, and its bytes are in the CPU's cache when
 * the device reads them), a read's when it completes (uring.c refills the
 * ring before it runs a batch's callbacks).  So the checksums overlap the
 * device's work on the other extents in flight, and a tensor of any size
 * streams through in extents.  A read whose crc32c mismatches fails the
 * transfer with -EBADMSG and is never data.
 *
 * Host <-> VRAM through the VRAM backend.  Per direction, at most as many
 * copies as the backend runs at once (VramBackend.depth) are with it; the
 * others wait in VramLink.waiting ordered by fair tags (fairq.h, per-job
 * flows by weight, the same credit as the NVMe queue), so the link is
 * shared by weight whatever asked for the copy: a pin, a prefetch, a drain.
 *
 * When a transfer ends, the destination becomes resident (or is freed if
 * the transfer failed), its bytes are counted on the link, and the engine
 * runs the ops that waited for it (engine_xfer_ended()).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "daemon/engine/engine-private.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/fairq.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/uring.h"
#include "daemon/tiers/vram.h"
#include "proto/crc32c.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* How far (bytes of service) a job back from idleness may start behind the others on the VRAM link. */
#define VRAM_FAIR_CREDIT (64ull << 20)

struct XferPart {
        UringReq req;
        Xfer *xfer;
        uint32_t index;         /* extent index */
};

struct XferCopy {
        VramCopy vc;
        Xfer *xfer;
};

static void xfer_free(Xfer *x) {
        free(x->parts);
        free(x->vcopies);
        free(x);
}

static void xfer_finish(Xfer *x) {
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        Copy *d = &t->copy[x->dst];
        List waiters;

        t->xfer = NULL;
        list_del(&x->link);
        list_init(&waiters);
        list_splice_tail(&waiters, &t->waiters);

        if (x->error < 0) {
                log_tensor(LOG_ERR, 0, t->job->name, t->name, level_to_string(x->dst),
                           "Transfer of tensor '%s' of job '%s' %s->%s failed: %s",
                           t->name, t->job->name, level_to_string(x->src), level_to_string(x->dst), x->errmsg);
                /*
                 * The room it reserved goes back: that is no new room in the
                 * tier, so drains that failed stay blocked (Engine.space_gen);
                 * else failing drains would unblock each other, forever.
                 */
                uint64_t gen = e->space_gen[x->dst];

                copy_free(t, x->dst);
                e->space_gen[x->dst] = gen;
        } else {
                d->state = COPY_RESIDENT;
                d->version = x->version;
                copy_touch(t, x->dst);
        }
        e->n_xfers--;
        engine_xfer_ended(e, t, &waiters, x->error, x->errmsg);
        xfer_free(x);
}

/* The transfer's link (what it is counted on). */
static LinkDir xfer_link(const Xfer *x) {
        if (x->dst == TIER_NVME)
                return LINK_HOST_TO_NVME;
        if (x->src == TIER_NVME)
                return LINK_NVME_TO_HOST;
        return x->dst == TIER_VRAM ? LINK_HOST_TO_VRAM : LINK_VRAM_TO_HOST;
}

/* @x ended: its bytes count on its link when it succeeded; the trace records it either way, with those bytes. */
static void link_count(Engine *e, Xfer *x) {
        Tensor *t = x->tensor;
        LinkDir d = xfer_link(x);
        uint64_t bytes = x->error >= 0 ? t->alloc_size : 0;

        if (x->error >= 0) {
                e->links[d].bytes += bytes;
                e->links[d].ops++;
                t->job->link_bytes[d] += bytes;
        }
        if (trace_on(&e->trace))
                trace_xfer(&e->trace, t, d, x->queued_ns, x->start_ns, now_ns(), bytes, x->error);
}

/* ---- NVMe <-> host ------------------------------------------------------------------------ */

static void xfer_part_done(UringReq *req, int res) {
        XferPart *p = container_of(req, XferPart, req);
        Xfer *x = p->xfer;
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        NvmeExtent *ext = &t->copy[TIER_NVME].extents[p->index];
        NvmeTarget *tg = &e->nvme->targets[ext->target];

        if (res < 0) {
                tg->io_errors++;
                if (x->error >= 0) {
                        x->error = res;
                        snprintf(x->errmsg, sizeof(x->errmsg), "I/O error on %s at offset %" PRIu64 ": %s",
                                 tg->path, req->offset, strerror(-res));
                }
        } else if (req->op == URING_READ) {
                tg->bytes_read += req->len;
                if (crc32c(0, req->buf, req->len) != ext->crc) {
                        tg->crc_errors++;
                        if (x->error >= 0) {
                                x->error = -EBADMSG;
                                snprintf(x->errmsg, sizeof(x->errmsg),
                                         "crc32c mismatch in extent %u of tensor '%s' (%s offset %" PRIu64 ")",
                                         p->index, t->name, tg->path, req->offset);
                        }
                }
        } else {
                tg->bytes_written += req->len;
                t->job->nvme_written += req->len;
        }

        if (--x->pending > 0)
                return;
        link_count(e, x);
        xfer_finish(x);
}

/* The first of @x's extents goes to the device: for the trace, the transfer starts (it was queued before). */
static void xfer_part_started(Xfer *x) {
        if (trace_on(&x->engine->trace) && x->start_ns == 0)
                x->start_ns = now_ns();
}

/* A write's extent is checksummed just before it goes to the device: its bytes are in the cache then. */
static void xfer_part_prep(UringReq *req) {
        XferPart *p = container_of(req, XferPart, req);

        p->xfer->tensor->copy[TIER_NVME].extents[p->index].crc = crc32c(0, req->buf, req->len);
        xfer_part_started(p->xfer);
}

/* A read's extent goes to the device (set only while a trace runs). */
static void xfer_part_prep_read(UringReq *req) {
        xfer_part_started(container_of(req, XferPart, req)->xfer);
}

static int xfer_start_nvme(Op *op, Xfer *x) {
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        Copy *h = &t->copy[TIER_HOST];
        Copy *n = &t->copy[TIER_NVME];
        uint64_t es = e->nvme->extent_size;
        bool write = x->dst == TIER_NVME;

        x->parts = calloc(n->n_extents, sizeof(XferPart));
        if (!x->parts)
                return op_fail(op, -ENOMEM, "out of memory");
        x->n_parts = n->n_extents;
        x->pending = n->n_extents;
        /* an extent lies in one host piece: pieces hold whole segments, and segments whole extents */
        for (uint32_t i = 0; i < n->n_extents; i++) {
                uint64_t pos = (uint64_t) i * es, len = MIN(es, t->alloc_size - pos), off, run = 0;
                const CopyPiece *hp = copy_locate(h, pos, &off, &run);

                if (!hp || run < len)
                        return op_fail(op, -EINVAL, "extent %u of tensor '%s' straddles host pieces (internal error)",
                                       i, t->name);
        }
        for (uint32_t i = 0; i < n->n_extents; i++) {
                XferPart *p = &x->parts[i];
                uint64_t pos = (uint64_t) i * es, off;
                const CopyPiece *hp = copy_locate(h, pos, &off, NULL);

                p->xfer = x;
                p->index = i;
                p->req = (UringReq) {
                        .cb = xfer_part_done,
                        .prep = write ? xfer_part_prep : trace_on(&e->trace) ? xfer_part_prep_read : NULL,
                        .flow = &t->job->nvme_flow,
                        .job = t->job->name,
                        .weight = t->job->weight,
                        .op = write ? URING_WRITE : URING_READ,
                        .file_index = n->extents[i].target,
                        .buf_index = (int) hp->seg->id,
                        .buf = (uint8_t *) hp->seg->map + off,
                        .len = (uint32_t) MIN(es, t->alloc_size - pos),
                        .offset = n->extents[i].unit * es,
                };
                list_init(&p->req.link);
                uring_queue(e->uring, &p->req);
        }
        t->xfer = x;
        list_add_tail(&e->xfers, &x->link);
        e->n_xfers++;
        (void) uring_flush(e->uring);  /* each write's crc32c is computed as it goes (xfer_part_prep()) */
        return 0;
}

/* ---- host <-> VRAM ------------------------------------------------------------------------ */

static double xfer_vtag(const List *n) {
        return list_entry(n, const Xfer, vlink)->vtag;
}

static unsigned vram_depth(const Engine *e) {
        return MAX(e->vram->depth, 1u);
}

/*
 * Hand @x's copies to the backend.  When one is refused, those already given
 * still complete: the transfer fails once they have (x->error).  Returns the
 * error when none was given.
 */
static int vram_link_start(Engine *e, Xfer *x) {
        int d = (int) x->vdir, r = 0;

        x->vpending = 0;
        for (uint32_t i = 0; i < x->n_vcopies; i++) {
                r = e->vram->ops->copy(e->vram, &x->vcopies[i].vc);
                if (r < 0)
                        break;
                x->vpending++;
        }
        if (x->vpending == 0)
                return r;
        if (r < 0 && x->error >= 0) {
                x->error = r;
                snprintf(x->errmsg, sizeof(x->errmsg), "cannot start VRAM copy: %s", strerror(-r));
        }
        e->vlink.active[d]++;
        e->vlink.vtime[d] = MAX(e->vlink.vtime[d], x->vtag);
        if (trace_on(&e->trace))
                x->start_ns = now_ns();
        return 0;
}

/* Start waiting transfers while direction @d has room; one that cannot start at all fails. */
static void vram_link_dispatch(Engine *e, int d) {
        while (e->vlink.active[d] < vram_depth(e) && !list_empty(&e->vlink.waiting[d])) {
                Xfer *x = list_entry(e->vlink.waiting[d].next, Xfer, vlink);
                int r;

                list_del(&x->vlink);
                r = vram_link_start(e, x);
                if (r < 0) {
                        x->error = r;
                        snprintf(x->errmsg, sizeof(x->errmsg), "cannot start VRAM copy: %s", strerror(-r));
                        xfer_finish(x);
                }
        }
}

static void xfer_vram_done(VramCopy *vc) {
        Xfer *x = container_of(vc, XferCopy, vc)->xfer;
        Engine *e = x->engine;
        int dir = (int) x->vdir;

        if (vc->result < 0 && x->error >= 0) {
                x->error = vc->result;
                snprintf(x->errmsg, sizeof(x->errmsg), "VRAM copy failed: %s", strerror(-vc->result));
        }
        if (--x->vpending > 0)
                return;
        link_count(e, x);
        e->vlink.active[dir]--;
        xfer_finish(x);         /* frees x */
        vram_link_dispatch(e, dir);
}

/* One copy per stretch of the tensor that lies within one host piece and one VRAM piece. */
static int xfer_plan_vram(Op *op, Xfer *x) {
        Tensor *t = x->tensor;
        const Copy *h = &t->copy[TIER_HOST], *v = &t->copy[TIER_VRAM];
        uint32_t n = 0;

        x->vcopies = calloc(h->n_pieces + v->n_pieces, sizeof(XferCopy));
        if (!x->vcopies)
                return op_fail(op, -ENOMEM, "out of memory");
        for (uint64_t pos = 0; pos < t->alloc_size;) {
                uint64_t hoff, hrun, voff, vrun, len;
                const CopyPiece *hp = copy_locate(h, pos, &hoff, &hrun);
                const CopyPiece *vp = copy_locate(v, pos, &voff, &vrun);

                if (!hp || !vp || n == h->n_pieces + v->n_pieces)
                        return op_fail(op, -EINVAL, "tensor '%s' has no piece at byte %" PRIu64 " (internal error)",
                                       t->name, pos);
                len = MIN(hrun, vrun);
                x->vcopies[n++] = (XferCopy) {
                        .vc = {
                                .dir = x->vdir,
                                .host = (uint8_t *) hp->seg->map + hoff,
                                .seg = vp->seg,
                                .offset = voff,
                                .len = len,
                                .job = t->job->name,
                                .done = xfer_vram_done,
                        },
                        .xfer = x,
                };
                pos += len;
        }
        x->n_vcopies = n;
        return 0;
}

static int xfer_start_vram(Op *op, Xfer *x) {
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        FairFlow *flow, before;
        int d, r;

        x->vdir = x->dst == TIER_VRAM ? VRAM_TO_DEVICE : VRAM_TO_HOST;
        r = xfer_plan_vram(op, x);
        if (r < 0)
                return r;
        d = (int) x->vdir;
        flow = &t->job->vram_flow[d];
        before = *flow;
        list_init(&x->vlink);
        x->vtag = fair_tag(flow, e->vlink.vtime[d], t->alloc_size, t->job->weight, VRAM_FAIR_CREDIT);
        if (e->vlink.active[d] < vram_depth(e) && list_empty(&e->vlink.waiting[d])) {
                r = vram_link_start(e, x);
                if (r < 0) {
                        *flow = before;         /* nothing moved: nothing to charge */
                        return op_fail(op, r, "cannot start VRAM copy: %s", strerror(-r));
                }
        } else
                fair_insert(&e->vlink.waiting[d], &x->vlink, x->vtag, xfer_vtag);
        t->xfer = x;
        list_add_tail(&e->xfers, &x->link);
        e->n_xfers++;
        return 0;
}

void xfer_abandon_all(Engine *e) {
        list_for_each_safe(n, tmp, &e->xfers) {
                Xfer *x = list_entry(n, Xfer, link);

                /* its destination stays reserved and filling: the registry frees it with the tensor */
                x->tensor->xfer = NULL;
                list_del(&x->link);
                list_del(&x->vlink);
                e->n_xfers--;
                xfer_free(x);
        }
}

int xfer_start(Op *op, Tensor *t, int src, int dst) {
        Engine *e = op->engine;
        Xfer *x;
        int r;

        x = calloc(1, sizeof(*x));
        if (!x)
                return op_fail(op, -ENOMEM, "out of memory");
        x->engine = e;
        x->tensor = t;
        x->src = src;
        x->dst = dst;
        x->version = t->copy[src].version;
        /* started: when its first extent goes to the device (xfer_part_started()), or the VRAM backend gets it */
        if (trace_on(&e->trace))
                x->queued_ns = now_ns();
        log_debug("xfer '%s' of job '%s': %s -> %s, version %" PRIu64, t->name, t->job->name, level_to_string(src),
                  level_to_string(dst), x->version);

        if (src == TIER_NVME || dst == TIER_NVME)
                r = xfer_start_nvme(op, x);
        else
                r = xfer_start_vram(op, x);
        if (r < 0)
                xfer_free(x);
        return r;
}
