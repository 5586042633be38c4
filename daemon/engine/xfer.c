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
 * Each extent is checksummed on its own, on the checksum workers
 * (Engine.csum, tiers/csum.c; computed here at once without them): a
 * write's request is queued for the ring only once its crc32c is taken, a
 * read's extent counts only once its crc32c is checked, after the read
 * completed.  tierd writes no host copy in transfer, and a pin that may
 * write waits for the transfer (op.c), but the client maps its segments
 * writable and may write them anyway (a bug, or on purpose): the drive then
 * gets bytes other than those the crc32c was taken of (O_DIRECT reads them
 * while the write runs), and the read back would count a crc error on the
 * target, the drive blamed for the client's writes.  So once a write
 * completed, its extent's host bytes are checksummed again: a crc32c other
 * than the first is the client's doing.  Such a write-down fails with -EIO,
 * counted on the job (Job.nvme_host_changed, "tierctl status", the metric
 * tierd_job_nvme_host_changed_total) and logged with its name, never on the
 * target; its source stays.  (A client that writes and puts the same bytes
 * back before the second pass is not seen: its image is torn, the read back
 * counts a crc error on the target, and on the job as every read's crc
 * error does (Job.nvme_crc_errors, tierd_job_nvme_crc_errors_total).  Only
 * a copy of the bytes first, a bounce buffer, would close that:
 * ARCHITECTURE.md, Failure model.)
 * So the checksums overlap the device's work on the other extents in
 * flight and stay off the event loop, and a tensor of any size streams
 * through in extents.  A read whose crc32c mismatches fails the transfer
 * with -EIO ("crc32c mismatch ...": -EBADMSG would tell a client its
 * connection is unusable, libtier(3)) and is never data.
 *
 * Host <-> VRAM through the VRAM backend.  Per direction, at most as many
 * copies as the backend runs at once (VramBackend.depth) are with it; the
 * others wait in VramLink.waiting ordered by fair tags (fairq.h, per-job
 * flows by weight, the same credit as the NVMe queue), so the link is
 * shared by weight whatever asked for the copy: a pin, a prefetch, a drain.
 *
 * A copy goes over the link in steps (XferStep): a plain transfer is one
 * step, with one fair tag for all its bytes, holding one slot of the link.
 *
 * Chained (NVMe -> host -> VRAM, xfer_start_chain()): when VRAM needs a
 * copy whose only valid one is on NVMe, both hops run piece by piece, a
 * piece being an extent.  The extents are read as above; each VRAM step is
 * one extent's stretch, queued on the link with its own fair tag once that
 * extent and every one before it are read and checksummed (so steps go in
 * order), while the later extents are still on their way.  The reads stop
 * feeding the link at the first error: the steps still waiting leave the
 * link, those with the backend finish, and the transfer ends once nothing of
 * it is in flight.  Each hop is counted (and traced) as one transfer of the
 * whole tensor, the NVMe hop when its last extent is read, the VRAM hop at
 * the end; a failed hop counts no bytes.  Only then do the copies change:
 * both resident on success; a failed read frees the host copy, and any
 * failure frees the VRAM copy unless a pin holds it (an async pin's op, or a
 * reader of the stale copy refilled in place: it is left stale then, and goes
 * with its last pin), so no half-written copy is ever valid.
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
#include "daemon/state/book.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/csum.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/crc32c.h"
#include "proto/macro.h"
#include "util/fairq.h"
#include "util/time-util.h"
#include "util/uring.h"

/* How far (bytes of service) a job back from idleness may start behind the others on the VRAM link. */
#define VRAM_FAIR_CREDIT (64ull << 20)

struct XferPart {
        UringReq req;
        CsumJob csum;           /* the extent's crc32c, off the loop (tiers/csum.c) */
        Xfer *xfer;
        uint32_t index;         /* extent index */
};

struct XferCopy {
        VramCopy vc;
        XferStep *step;
};

static void xfer_free(Xfer *x) {
        free(x->parts);
        free(x->vcopies);
        free(x->steps);
        free(x->read_ok);
        free(x);
}

/* Tests only: tell the observer about a piece of a chained transfer. */
static void piece_observe(const Xfer *x, LinkDir link, uint32_t piece, bool done) {
        Engine *e = x->engine;

        if (e->piece_observer)
                e->piece_observer(e->piece_observer_userdata, x->tensor, link, piece, done);
}

/* Free copy @tier of @t after a failed transfer: no new room in the tier (see xfer_finish()). */
static void copy_free_failed(Engine *e, Tensor *t, int tier) {
        uint64_t gen = e->space_gen[tier];

        copy_free(t, tier);
        e->space_gen[tier] = gen;
}

/*
 * What a failed transfer reports to the ops that waited for it (and so to
 * clients): -EIO whatever the drive or the VRAM backend said (-ENODEV,
 * -ENXIO, -EROFS, -EINVAL mean other things to libtier's users; the error
 * text keeps the cause), -ENOSPC and -ENOMEM as they are (tier_pin(3)).
 */
static int xfer_errno(int error) {
        return error >= 0 || error == -ENOSPC || error == -ENOMEM ? error : -EIO;
}

static void link_count(Engine *e, Xfer *x);

static void xfer_finish_now(Xfer *x) {
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        Copy *d = &t->copy[x->dst];
        int error = xfer_errno(x->error < 0 ? x->error : x->chain ? x->verror : 0);
        const char *errmsg = x->error < 0 ? x->errmsg : x->verrmsg;
        List waiters;

        if (x->dst == LEVEL_NVME)
                link_count(e, x);       /* its error known: the drive's, or its flush's (engine_book_durable()) */
        t->xfer = NULL;
        list_del(&x->link);
        list_init(&waiters);
        list_splice_tail(&waiters, &t->waiters);

        if (error < 0) {
                log_tensor(LOG_ERR, 0, t->job->name, t->name, level_to_string(x->dst),
                           "Transfer of tensor '%s' of job '%s' %s->%s failed: %s",
                           t->name, t->job->name, level_to_string(x->src),
                           level_to_string(x->chain ? LEVEL_VRAM : x->dst), errmsg);
        }
        if (x->error < 0 && d->pins > 0) {
                /*
                 * A copy still pinned (an async pin's op holds it, or a reader of the stale copy refilled
                 * in place): its bytes are garbage now, and it goes once the last pin does (stale).
                 */
                copy_set_state(t, x->dst, COPY_RESIDENT);
                d->version = t->version - 1;
                d->unwritten = true;
        } else if (x->error < 0)
                /*
                 * The room it reserved goes back: that is no new room in the
                 * tier, so drains that failed stay blocked (Engine.space_gen);
                 * else failing drains would unblock each other, forever.
                 */
                copy_free_failed(e, t, x->dst);
        else if (x->dst == LEVEL_NVME && x->version != t->version)
                /*
                 * The tensor was written while its write-down ran (xfer_finish()): the image holds a
                 * version it has left, its bytes perhaps torn (read while they were written), and
                 * the index never names it.  It goes, whatever a restored pin may go back to.
                 */
                copy_free(t, x->dst);
        else {
                copy_set_state(t, x->dst, COPY_RESIDENT);
                d->version = x->version;
                d->unwritten = false;   /* (a stale copy refilled in place: garbage a failed fill left, a ghost's room) */
                copy_touch(t, x->dst);
                tensor_note(t);         /* the memory store: a valid copy more */
        }
        if (x->chain) {
                Copy *v = &t->copy[LEVEL_VRAM];

                if (error >= 0 && v->state == COPY_FILLING) {
                        copy_set_state(t, LEVEL_VRAM, COPY_RESIDENT);
                        v->version = x->version;
                        v->unwritten = false;
                        copy_touch(t, LEVEL_VRAM);
                        tensor_note(t);
                } else if (v->state == COPY_FILLING && v->pins > 0) {
                        /* as d above: garbage now, it goes, stale, with its last pin */
                        copy_set_state(t, LEVEL_VRAM, COPY_RESIDENT);
                        v->version = t->version - 1;
                        v->unwritten = true;
                } else if (v->state == COPY_FILLING)
                        copy_free_failed(e, t, LEVEL_VRAM);
        }
        e->n_xfers--;
        engine_xfer_ended(e, t, &waiters, error, errmsg);
        xfer_free(x);
}

/*
 * A transfer's bytes are where they go: end it.  A write to NVMe ends only
 * once the NVMe index (state/book.c) has it, and it and its data are on the
 * drive: until then it stays in flight (parked: Xfer.book_seq), nothing
 * waiting for it runs and no fence says it is written; engine_book_durable()
 * ends it then.
 */
static void xfer_finish(Xfer *x) {
        Book *book = x->engine->registry->book;

        /*
         * Not a version other than the tensor's newest: written meanwhile, it has a NEWER record
         * that an NVME record of the version before must not follow (after a SIGKILL the index
         * would bring that version back as current); the copy goes as stale (xfer_finish_now()).
         */
        if (x->dst == LEVEL_NVME && x->error >= 0 && book && x->version == x->tensor->version) {
                uint64_t seq = book_nvme(book, x->tensor, x->version);

                if (!book_durable(book, seq)) {
                        x->book_seq = seq;
                        book_sync(book);
                        return;
                }
        }
        xfer_finish_now(x);
}

void engine_book_durable(void *userdata) {
        Engine *e = userdata;
        Book *book = e->registry->book;

        list_for_each_safe(n, tmp, &e->xfers) {
                Xfer *x = list_entry(n, Xfer, link);

                if (x->book_seq && book_durable(book, x->book_seq)) {
                        const Copy *c = &x->tensor->copy[LEVEL_NVME];
                        uint64_t targets = 0;
                        int r;

                        for (uint32_t i = 0; i < c->n_extents; i++)
                                targets |= 1ull << (c->extents[i].target % 64);
                        r = book_sync_failed(book, x->book_seq, targets);
                        if (r < 0) {
                                /* its data may not be on the drive: the write-down failed, the source stays */
                                for (uint32_t i = 0; i < e->nvme->n_targets && i < 64; i++)
                                        if (targets & (1ull << i))
                                                e->nvme->targets[i].io_errors++;
                                x->error = r;
                                snprintf(x->errmsg, sizeof(x->errmsg), "cannot flush the NVMe target: fdatasync: %s",
                                         strerror(-r));
                        }
                        xfer_finish_now(x);
                }
        }
}

/* The transfer's link (what it is counted on). */
static LinkDir xfer_link(const Xfer *x) {
        if (x->dst == LEVEL_NVME)
                return LINK_HOST_TO_NVME;
        if (x->src == LEVEL_NVME)
                return LINK_NVME_TO_HOST;
        return x->dst == LEVEL_VRAM ? LINK_HOST_TO_VRAM : LINK_VRAM_TO_HOST;
}

/* A hop of @x over @d ended: its bytes count on the link when it succeeded; the trace records it either way, with those bytes. */
static void link_count_hop(Engine *e, Xfer *x, LinkDir d, uint64_t queued, uint64_t started, int error) {
        Tensor *t = x->tensor;
        uint64_t bytes = error >= 0 ? t->alloc_size : 0;

        if (error >= 0) {
                e->links[d].bytes += bytes;
                e->links[d].ops++;
                t->job->link_bytes[d] += bytes;
        }
        if (trace_on(&e->trace))
                trace_xfer(&e->trace, t, d, queued, started, now_ns(), bytes, error);
}

/* @x ended (its only hop, or a chained transfer's first one). */
static void link_count(Engine *e, Xfer *x) {
        link_count_hop(e, x, xfer_link(x), x->queued_ns, x->start_ns, x->error);
}

static void chain_feed(Xfer *x);
static void chain_check(Xfer *x);

/* ---- NVMe <-> host ------------------------------------------------------------------------ */

/* Checksum @p's extent (crc32c of its host bytes), then @cb on the loop: on a worker (Engine.csum) or here at once. */
static void xfer_part_csum(XferPart *p, csum_cb_t cb) {
        Engine *e = p->xfer->engine;

        p->csum = (CsumJob) {
                .buf = p->req.buf,
                .len = p->req.len,
                .cb = cb,
        };
        if (e->csum)
                csum_queue(e->csum, &p->csum);
        else {
                p->csum.crc = crc32c(0, p->csum.buf, p->csum.len);
                cb(&p->csum);
        }
}

/*
 * A write-down's last part is over: extents whose host bytes changed while they were written (the
 * client wrote them) fail it, counted on the job, not the target: the drive has what it was given.
 * Unless the tensor's version moved on meanwhile (a writer's pin, tensor_unpin()): then its image
 * goes as stale anyway (xfer_finish_now()), and nothing was wrong.
 */
static void xfer_host_changed(Xfer *x) {
        Tensor *t = x->tensor;

        if (x->host_changed == 0 || x->version != t->version)
                return;
        t->job->nvme_host_changed += x->host_changed;
        log_tensor(LOG_WARNING, 0, t->job->name, t->name, level_to_string(LEVEL_NVME),
                   "Job '%s' wrote the host copy of tensor '%s' while tierd wrote it to NVMe: "
                   "%" PRIu32 " extent(s) changed, the write-down fails (not the drive's fault)",
                   t->job->name, t->name, x->host_changed);
        if (x->error >= 0) {
                x->error = -EIO;
                snprintf(x->errmsg, sizeof(x->errmsg),
                         "the host copy changed while it was written to NVMe (%" PRIu32 " extent(s)): "
                         "do not write a tensor while tierd moves it",
                         x->host_changed);
        }
}

/* Part @p is over (its I/O, and for a read its check): the transfer goes on, or ends with its last part. */
static void xfer_part_next(XferPart *p) {
        Xfer *x = p->xfer;
        Engine *e = x->engine;

        if (x->chain) {
                if (--x->pending == 0)
                        link_count(e, x);       /* the NVMe hop is over */
                chain_feed(x);
                chain_check(x);         /* may free x */
                return;
        }
        if (--x->pending > 0)
                return;
        xfer_host_changed(x);
        if (x->dst != LEVEL_NVME)
                link_count(e, x);       /* a write-down's once it is durable, or failed (xfer_finish_now()) */
        xfer_finish(x);
}

/* A read extent's crc32c is known: its bytes are data only if it matches the one taken when it was written. */
static void xfer_part_checked(CsumJob *job) {
        XferPart *p = container_of(job, XferPart, csum);
        Xfer *x = p->xfer;
        Tensor *t = x->tensor;
        NvmeExtent *ext = &t->copy[LEVEL_NVME].extents[p->index];
        NvmeTarget *tg = &x->engine->nvme->targets[ext->target];

        if (job->crc != ext->crc) {
                tg->crc_errors++;
                t->job->nvme_crc_errors++;      /* whose tensor it was: a torn write-down of its own shows here */
                if (x->error >= 0) {
                        x->error = -EIO;
                        snprintf(x->errmsg, sizeof(x->errmsg),
                                 "crc32c mismatch in extent %u of tensor '%s' (%s offset %" PRIu64 ")",
                                 p->index, t->name, tg->path, p->req.offset);
                }
        } else if (x->chain) {
                x->read_ok[p->index] = true;
                piece_observe(x, LINK_NVME_TO_HOST, p->index, true);
        }
        xfer_part_next(p);
}

/* A written extent's host bytes, checksummed again: a crc32c other than the first is the client's doing. */
static void xfer_part_rechecked(CsumJob *job) {
        XferPart *p = container_of(job, XferPart, csum);
        Xfer *x = p->xfer;

        if (job->crc != x->tensor->copy[LEVEL_NVME].extents[p->index].crc)
                x->host_changed++;
        xfer_part_next(p);
}

static void xfer_part_done(UringReq *req, int res) {
        XferPart *p = container_of(req, XferPart, req);
        Xfer *x = p->xfer;
        Tensor *t = x->tensor;
        NvmeExtent *ext = &t->copy[LEVEL_NVME].extents[p->index];
        NvmeTarget *tg = &x->engine->nvme->targets[ext->target];

        if (res < 0) {
                tg->io_errors++;
                if (x->error >= 0) {
                        x->error = res;
                        snprintf(x->errmsg, sizeof(x->errmsg), "I/O error on %s at offset %" PRIu64 ": %s",
                                 tg->path, req->offset, strerror(-res));
                }
        } else if (req->op == URING_READ) {
                tg->bytes_read += req->len;
                xfer_part_csum(p, xfer_part_checked);   /* the transfer goes on from there */
                return;
        } else {
                tg->bytes_written += req->len;
                t->job->nvme_written += req->len;
                if (x->error >= 0 && x->version == t->version) {
                        xfer_part_csum(p, xfer_part_rechecked);  /* the transfer goes on from there */
                        return;
                }
        }
        xfer_part_next(p);
}

/* The first of @x's extents goes to the device: for the trace, the transfer starts (it was queued before). */
static void xfer_part_started(Xfer *x) {
        if (trace_on(&x->engine->trace) && x->start_ns == 0)
                x->start_ns = now_ns();
}

/* A write's extent goes to the device (set only while a trace runs); its crc32c was taken before it was queued. */
static void xfer_part_prep(UringReq *req) {
        xfer_part_started(container_of(req, XferPart, req)->xfer);
}

/* A write extent's crc32c is taken: now its request may go to the ring (checked again once written). */
static void xfer_part_summed(CsumJob *job) {
        XferPart *p = container_of(job, XferPart, csum);
        Engine *e = p->xfer->engine;

        p->xfer->tensor->copy[LEVEL_NVME].extents[p->index].crc = job->crc;
        uring_queue(e->uring, &p->req);         /* submitted by the ring's flush after this loop iteration */
}

/* One request per extent, each within one host piece. */
static int xfer_plan_nvme(Op *op, Xfer *x) {
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        Copy *h = &t->copy[LEVEL_HOST];
        Copy *n = &t->copy[LEVEL_NVME];
        uint64_t es = e->nvme->extent_size;
        bool write = x->dst == LEVEL_NVME;

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
                        .prep = trace_on(&e->trace) ? xfer_part_prep : NULL,
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
        }
        return 0;
}

/* Hand the planned requests to the ring, writes once their extent is checksummed: the transfer is in flight. */
static void xfer_queue_nvme(Xfer *x) {
        Engine *e = x->engine;

        x->tensor->xfer = x;
        list_add_tail(&e->xfers, &x->link);
        e->n_xfers++;
        for (uint32_t i = 0; i < x->n_parts; i++) {
                XferPart *p = &x->parts[i];

                if (p->req.op == URING_WRITE)
                        xfer_part_csum(p, xfer_part_summed);
                else
                        uring_queue(e->uring, &p->req);
        }
        (void) uring_flush(e->uring);
}

static int xfer_start_nvme(Op *op, Xfer *x) {
        int r = xfer_plan_nvme(op, x);

        if (r < 0)
                return r;
        xfer_queue_nvme(x);
        return 0;
}

/* ---- host <-> VRAM ------------------------------------------------------------------------ */

static double step_vtag(const List *n) {
        return list_entry(n, const XferStep, vlink)->vtag;
}

static unsigned vram_depth(const Engine *e) {
        return MAX(e->vram->depth, 1u);
}

/* Record the VRAM hop's error @r (the first one counts). */
static void xfer_vfail(Xfer *x, int r, const char *what) {
        int *err = x->chain ? &x->verror : &x->error;
        char *msg = x->chain ? x->verrmsg : x->errmsg;

        if (*err >= 0) {
                *err = r;
                snprintf(msg, sizeof(x->errmsg), "%s: %s", what, strerror(-r));
        }
}

/*
 * Hand step @s's copies to the backend.  When one is refused, those already
 * given still complete: the transfer fails once they have.  Returns the error
 * when none was given.
 */
static int vram_link_start(Engine *e, XferStep *s) {
        Xfer *x = s->xfer;
        int d = (int) x->vdir, r = 0;

        s->pending = 0;
        for (uint32_t i = s->first; i < s->first + s->n; i++) {
                r = e->vram->ops->copy(e->vram, &x->vcopies[i].vc);
                if (r < 0)
                        break;
                s->pending++;
        }
        if (s->pending == 0)
                return r;
        if (r < 0)
                xfer_vfail(x, r, "cannot start VRAM copy");
        e->vlink.active[d]++;
        e->vlink.vtime[d] = MAX(e->vlink.vtime[d], s->vtag);
        if (trace_on(&e->trace)) {
                uint64_t *start = x->chain ? &x->vstart_ns : &x->start_ns;

                if (*start == 0)
                        *start = now_ns();
        }
        if (x->chain)
                piece_observe(x, LINK_HOST_TO_VRAM, s->piece, false);
        return 0;
}

/* Step @s could not start at all: its transfer fails (a chained one once nothing else of it is in flight). */
static void vram_step_refused(Engine *e, XferStep *s, int r) {
        Xfer *x = s->xfer;

        xfer_vfail(x, r, "cannot start VRAM copy");
        if (!x->chain) {
                link_count(e, x);       /* nothing counted; the trace has it, with its error */
                xfer_finish(x);
                return;
        }
        x->steps_out--;
        chain_check(x);
}

/* Start waiting steps while direction @d has room; a transfer that cannot start at all fails. */
static void vram_link_dispatch(Engine *e, int d) {
        while (e->vlink.active[d] < vram_depth(e) && !list_empty(&e->vlink.waiting[d])) {
                XferStep *s = list_entry(e->vlink.waiting[d].next, XferStep, vlink);
                int r;

                list_del(&s->vlink);
                s->queued = false;
                r = vram_link_start(e, s);
                if (r < 0)
                        vram_step_refused(e, s, r);
        }
}

static void xfer_vram_done(VramCopy *vc) {
        XferStep *s = container_of(vc, XferCopy, vc)->step;
        Xfer *x = s->xfer;
        Engine *e = x->engine;
        int dir = (int) x->vdir;

        if (vc->result < 0)
                xfer_vfail(x, vc->result, "VRAM copy failed");
        if (--s->pending > 0)
                return;
        e->vlink.active[dir]--;
        if (x->chain) {
                piece_observe(x, LINK_HOST_TO_VRAM, s->piece, true);
                x->steps_out--;
                chain_check(x);         /* may free x */
        } else {
                link_count(e, x);
                xfer_finish(x);         /* frees x */
        }
        vram_link_dispatch(e, dir);
}

/*
 * One copy per stretch of the tensor that lies within one host piece and one
 * VRAM piece, and (chained) one extent; one step for all of them, or
 * (chained) one per extent.
 */
static int xfer_plan_vram(Op *op, Xfer *x) {
        Engine *e = x->engine;
        Tensor *t = x->tensor;
        const Copy *h = &t->copy[LEVEL_HOST], *v = &t->copy[LEVEL_VRAM];
        uint64_t es = x->chain ? e->nvme->extent_size : t->alloc_size;
        uint32_t n_steps = x->chain ? t->copy[LEVEL_NVME].n_extents : 1;
        uint32_t max = h->n_pieces + v->n_pieces + n_steps, n = 0;

        x->vcopies = calloc(max, sizeof(XferCopy));
        x->steps = calloc(n_steps, sizeof(XferStep));
        if (!x->vcopies || !x->steps)
                return op_fail(op, -ENOMEM, "out of memory");
        x->n_steps = n_steps;
        for (uint32_t i = 0; i < n_steps; i++) {
                x->steps[i] = (XferStep) { .xfer = x, .piece = i };
                list_init(&x->steps[i].vlink);
        }
        for (uint64_t pos = 0; pos < t->alloc_size;) {
                uint64_t hoff, hrun, voff, vrun, len;
                const CopyPiece *hp = copy_locate(h, pos, &hoff, &hrun);
                const CopyPiece *vp = copy_locate(v, pos, &voff, &vrun);
                uint32_t k = (uint32_t) (pos / es);
                XferStep *s = &x->steps[k];

                if (!hp || !vp || n == max || k >= n_steps)
                        return op_fail(op, -EINVAL, "tensor '%s' has no piece at byte %" PRIu64 " (internal error)",
                                       t->name, pos);
                len = MIN(MIN(hrun, vrun), (uint64_t) (k + 1) * es - pos);
                if (s->n == 0)
                        s->first = n;
                s->n++;
                s->bytes += len;
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
                        .step = s,
                };
                pos += len;
        }
        x->n_vcopies = n;
        return 0;
}

/*
 * Put step @s on the VRAM link: started now when the link has room and no
 * one waits, else queued by its fair tag.  0, or the error when it could not
 * start (nothing charged then).
 */
static int vram_step_submit(Engine *e, XferStep *s) {
        Xfer *x = s->xfer;
        Tensor *t = x->tensor;
        int d = (int) x->vdir, r;
        FairFlow *flow = &t->job->vram_flow[d], before = *flow;

        s->vtag = fair_tag(flow, e->vlink.vtime[d], s->bytes, t->job->weight, VRAM_FAIR_CREDIT);
        if (e->vlink.active[d] < vram_depth(e) && list_empty(&e->vlink.waiting[d])) {
                r = vram_link_start(e, s);
                if (r < 0)
                        *flow = before;         /* nothing moved: nothing to charge */
                return r;
        }
        fair_insert(&e->vlink.waiting[d], &s->vlink, s->vtag, step_vtag);
        s->queued = true;
        return 0;
}

static int xfer_start_vram(Op *op, Xfer *x) {
        int r;

        x->vdir = x->dst == LEVEL_VRAM ? VRAM_TO_DEVICE : VRAM_TO_HOST;
        r = xfer_plan_vram(op, x);
        if (r < 0)
                return r;
        r = vram_step_submit(x->engine, &x->steps[0]);
        if (r < 0)
                return op_fail(op, r, "cannot start VRAM copy: %s", strerror(-r));
        x->tensor->xfer = x;
        list_add_tail(&x->engine->xfers, &x->link);
        x->engine->n_xfers++;
        return 0;
}

/* ---- chained: NVMe -> host -> VRAM, piece by piece ------------------------------------------ */

/* Queue the VRAM steps whose extents (and all before) are read, in order; none after an error. */
static void chain_feed(Xfer *x) {
        Engine *e = x->engine;

        while (x->error >= 0 && x->verror >= 0 && x->next_step < x->n_steps && x->read_ok[x->next_step]) {
                XferStep *s = &x->steps[x->next_step++];
                int r;

                if (trace_on(&e->trace) && x->vqueued_ns == 0)
                        x->vqueued_ns = now_ns();
                x->steps_out++;
                r = vram_step_submit(e, s);
                if (r < 0) {
                        xfer_vfail(x, r, "cannot start VRAM copy");
                        x->steps_out--;
                }
        }
}

/*
 * After an error, the steps still waiting for the link leave it; once no
 * read and no step is in flight, and every step went (or an error stopped
 * them), the chained transfer ends: the VRAM hop is counted, the copies set.
 */
static void chain_check(Xfer *x) {
        Engine *e = x->engine;
        int error;

        if (x->error < 0 || x->verror < 0)
                for (uint32_t i = 0; i < x->n_steps; i++)
                        if (x->steps[i].queued) {
                                list_del(&x->steps[i].vlink);
                                x->steps[i].queued = false;
                                x->steps_out--;
                        }
        if (x->pending > 0 || x->steps_out > 0)
                return;
        error = x->error < 0 ? x->error : x->verror;
        if (error >= 0 && x->next_step < x->n_steps)
                return;         /* cannot be: every extent read feeds its step */
        link_count_hop(e, x, LINK_HOST_TO_VRAM, x->vqueued_ns ? x->vqueued_ns : x->queued_ns, x->vstart_ns, error);
        xfer_finish(x);
}

int xfer_start_chain(Op *op, Tensor *t) {
        Engine *e = op->engine;
        Xfer *x;
        int r;

        x = calloc(1, sizeof(*x));
        if (!x)
                return op_fail(op, -ENOMEM, "out of memory");
        x->engine = e;
        x->tensor = t;
        x->src = LEVEL_NVME;
        x->dst = LEVEL_HOST;
        x->chain = true;
        x->vdir = VRAM_TO_DEVICE;
        x->version = t->copy[LEVEL_NVME].version;
        if (trace_on(&e->trace))
                x->queued_ns = now_ns();
        log_debug("xfer '%s' of job '%s': nvme -> host -> vram piecewise, version %" PRIu64, t->name, t->job->name,
                  x->version);
        x->read_ok = calloc(MAX(t->copy[LEVEL_NVME].n_extents, 1u), sizeof(bool));
        if (!x->read_ok)
                r = op_fail(op, -ENOMEM, "out of memory");
        else
                r = xfer_plan_nvme(op, x);
        if (r >= 0)
                r = xfer_plan_vram(op, x);
        if (r < 0) {
                xfer_free(x);
                return r;
        }
        xfer_queue_nvme(x);
        return 0;
}

void xfer_abandon_all(Engine *e) {
        list_for_each_safe(n, tmp, &e->xfers) {
                Xfer *x = list_entry(n, Xfer, link);

                /* its destination stays reserved and filling: the registry frees it with the tensor */
                x->tensor->xfer = NULL;
                list_del(&x->link);
                for (uint32_t i = 0; i < x->n_steps; i++)
                        list_del(&x->steps[i].vlink);
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

        if (src == LEVEL_NVME || dst == LEVEL_NVME)
                r = xfer_start_nvme(op, x);
        else
                r = xfer_start_vram(op, x);
        if (r < 0)
                xfer_free(x);
        return r;
}
