/* SPDX-License-Identifier: MIT */
/* mover.c: the op engine: bringing copies up, writing them down, making space. */

/*
 * Theory of operation.
 *
 * Every client request that may move data becomes an Op: pin, prefetch or
 * evict of one tensor to one tier.  Space pressure creates internal drain
 * ops.  An op never owns a transfer; it only waits.  op_advance() looks at
 * the tensor as it is now and takes the next step towards the op's goal,
 * returning DONE, an error, or a reason to wait:
 *
 *   WAIT_TENSOR   a transfer of this tensor is running (Tensor.xfer); the op
 *                 sits in Tensor.waiters and runs again when it ends.
 *   WAIT_SPACE    the tier is full and victims are being written down; the
 *                 op sits in Manager.space_waiters and runs again whenever
 *                 space is freed or a drain ends.
 *
 * Because ops hold no I/O, cancelling one (its client vanished) is always
 * immediate and safe: in-flight transfers finish on their own and leave a
 * resident, unpinned copy behind.
 *
 * Data versions.  A tensor has a version, bumped each time a client unpins
 * a copy dirty; a copy is valid when its version matches.  Stale copies are
 * freed as soon as nothing pins them.  Version 0 means "never written": all
 * zeros, so no copy is needed to keep it.  A copy may be dropped only if it
 * is not the sole valid copy (copy_is_sole) — otherwise it is first written
 * to the tier below (NVMe writes always come from the host copy).
 *
 * Making space (backbone policy, replaced by the scheduler's timeline
 * later): least recently used unpinned copies of the same job go first;
 * those with a valid copy elsewhere are dropped at once, sole copies are
 * drained (written down, then dropped).  Nothing pinned or in use by an op
 * is ever chosen.  When nothing can be freed the op fails with -ENOSPC and a
 * message naming the tier and the limit.
 *
 * Transfers: NVMe <-> host as one io_uring request per extent (registered
 * file + registered buffer, crc32c per extent computed before the write and
 * checked after the read); host <-> VRAM through the VRAM backend.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tiers/fairq.h"
#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/engine/mover.h"
#include "daemon/sched/timeline.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/uring.h"
#include "daemon/tiers/vram.h"
#include "proto/crc32c.h"
#include "proto/macro.h"

void tensor_destroy_final(Tensor *t);
void job_maybe_finish(Job *j);

enum {
        ADV_DONE = 0,
        ADV_WAIT_TENSOR = 1,
        ADV_WAIT_SPACE = 2,
        ADV_RETRY = 3,          /* internal to space handling */
};

typedef struct XferPart {
        UringReq req;
        Xfer *xfer;
        uint32_t index;         /* extent index */
} XferPart;

struct Xfer {
        Manager *manager;
        Tensor *tensor;
        int src, dst;
        uint64_t version;
        unsigned pending;
        int error;
        char errmsg[160];
        VramCopy vcopy;
        List vlink;             /* Manager.vram_waiting, while it waits for the VRAM link */
        double vtag;            /* its virtual start time there (fairq.h) */
        XferPart *parts;
        uint32_t n_parts;
};

static List all_ops = LIST_INIT(all_ops);

static void mover_run_queue(Manager *m);

static int op_fail(Op *op, int r, const char *fmt, ...) _printf_(3, 4);
static int op_fail(Op *op, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(op->error, sizeof(op->error), fmt, ap);
        va_end(ap);
        return r;
}

static const char *tname(int tier) {
        return tier_to_string(tier);
}

/* ---- space accounting --------------------------------------------------- */

static void copy_touch(Manager *m, Tensor *t, int tier) {
        Copy *c = &t->copy[tier];

        c->last_use = now_usec();
        list_del(&c->lru);
        list_add_tail(&m->lru[tier], &c->lru);
}

static void account(Manager *m, Tensor *t, int tier, int64_t delta) {
        t->job->used[tier] += (uint64_t) delta;
        m->used[tier] += (uint64_t) delta;
}

static void wake_space_waiters(Manager *m) {
        if (list_empty(&m->space_waiters))
                return;
        list_for_each_safe(n, tmp, &m->space_waiters) {
                Op *op = list_entry(n, Op, wait_link);
                op->wait = OP_WAIT_RUN;
        }
        list_splice_tail(&m->run_queue, &m->space_waiters);
        manager_kick(m);
}

void mover_wake_space_waiters(Manager *m) {
        wake_space_waiters(m);
}

void copy_free(Manager *m, Tensor *t, int tier) {
        Copy *c = &t->copy[tier];

        if (c->state == COPY_ABSENT)
                return;
        if (tier == TIER_NVME) {
                account(m, t, tier, -(int64_t) ((uint64_t) c->n_extents * m->nvme->extent_size));
                nvme_free(m->nvme, c->extents, c->n_extents);
                c->extents = NULL;
                c->n_extents = 0;
        } else {
                segment_free(c->seg, c->offset, t->alloc_size);
                account(m, t, tier, -(int64_t) t->alloc_size);
                c->seg = NULL;
        }
        if (c->state == COPY_DRAINING)
                c->state = COPY_ABSENT;
        c->state = COPY_ABSENT;
        c->version = 0;
        list_del(&c->lru);
        wake_space_waiters(m);
        sched_transfer_done(m);         /* space the scheduler may have been waiting for */
}

/* Free copies that no longer hold the newest data and are not in use. */
static void free_stale(Manager *m, Tensor *t) {
        for (int i = 0; i < TIERS; i++) {
                Copy *c = &t->copy[i];

                if ((c->state == COPY_RESIDENT || c->state == COPY_DRAINING) &&
                    c->version != t->version && c->pins == 0 && !t->xfer)
                        copy_free(m, t, i);
        }
}

static int seg_tier_alloc(Manager *m, Tensor *t, int tier) {
        SegPool *pool = tier == TIER_HOST ? &m->host.pool : &m->vram->pool;
        Job *j = t->job;
        Copy *c = &t->copy[tier];
        unsigned n_segs = 0;
        Segment *s;
        int r;

        list_for_each_safe(n, tmp, &j->segments[tier]) {
                s = list_entry(n, Segment, owner_link);
                n_segs++;
                if (segment_alloc(s, t->alloc_size, &c->offset) >= 0) {
                        c->seg = s;
                        return 0;
                }
        }
        /* a new segment, if the job's limit leaves room for one */
        if ((uint64_t) (n_segs + 1) * pool->seg_size > ALIGN_UP(j->limit[tier], pool->seg_size))
                return -ENOSPC;
        r = segpool_assign(pool, j, &j->segments[tier], &s);
        if (r == -ENOSPC) {
                /* pool exhausted: take back segments that jobs hold but do not use */
                for (uint32_t i = 0; i < pool->n_segs; i++) {
                        Segment *e = &pool->segs[i];

                        if (e->owner && e->used == 0)
                                (void) segpool_release(pool, e);
                }
                r = segpool_assign(pool, j, &j->segments[tier], &s);
        }
        if (r < 0)
                return r;
        r = segment_alloc(s, t->alloc_size, &c->offset);
        if (r < 0)
                return r;
        c->seg = s;
        return 0;
}

/* Choose victims in @tier of @t's job; start drains.  Returns ADV_RETRY, ADV_WAIT_SPACE or -ENOSPC. */
static int make_space(Manager *m, Op *op, Tensor *want, int tier, uint64_t need) {
        Job *j = want->job;
        uint64_t freed = 0, draining = 0;
        Tensor **cands;
        size_t n = 0, k;

        cands = calloc(j->n_tensors + 1, sizeof(Tensor *));
        if (!cands)
                return -ENOMEM;
        list_for_each_safe(node, tmp, &m->lru[tier]) {
                Copy *c = list_entry(node, Copy, lru);
                Tensor *v = container_of(c, Tensor, copy[tier]);

                if (v->job != j)
                        continue;
                if (c->state == COPY_DRAINING) {
                        draining += tier == TIER_NVME ? 0 : v->alloc_size;
                        continue;
                }
                if (v == want || c->state != COPY_RESIDENT || c->pins > 0 || v->op_refs > 0 || v->xfer)
                        continue;
                if (n < j->n_tensors)
                        cands[n++] = v;
        }
        /* the policy orders them (LRU as listed, or Belady by next use) */
        k = sched_victim_order(m, tier, cands, n, op->deadline_ns);

        for (size_t i = 0; i < k && freed + draining < need; i++) {
                Tensor *v = cands[i];
                Copy *c = &v->copy[tier];

                if (!copy_is_sole(v, tier)) {
                        freed += v->alloc_size;
                        copy_free(m, v, tier);
                        continue;
                }
                if (sched_next_access_overwrites(v)) {
                        /* its plan overwrites it before reading it: nothing to write back */
                        v->dead = true;
                        freed += v->alloc_size;
                        copy_free(m, v, tier);
                        continue;
                }
                if (tier == TIER_NVME)
                        continue;       /* nothing below NVMe */
                /* write it down first */
                {
                        Op *d;
                        int r = op_submit(m, OP_DRAIN, v, tier, NULL, NULL, NULL, &d);

                        if (r < 0) {
                                free(cands);
                                return r;
                        }
                        /*
                         * A drain is forced (the requester was chosen by deadline already), so
                         * it may take any room below; it is charged to its job's fair share.
                         */
                        sched_charge(v->job, v->alloc_size);
                        c->state = COPY_DRAINING;
                        draining += v->alloc_size;
                }
        }
        free(cands);
        if (freed > 0)
                return ADV_RETRY;
        if (draining > 0)
                return ADV_WAIT_SPACE;
        return op->no_wait ? -EAGAIN : -ENOSPC;
}

/* Reserve space for @t in @tier.  0, ADV_WAIT_SPACE, or -errno with op->error set. */
static int copy_reserve(Op *op, Tensor *t, int tier) {
        Manager *m = op->manager;
        Job *j = t->job;
        Copy *c = &t->copy[tier];
        int r;

        for (unsigned attempt = 0;; attempt++) {
                if (tier == TIER_NVME) {
                        uint64_t bytes = ALIGN_UP(t->alloc_size, m->nvme->extent_size);

                        if (j->used[tier] + bytes > j->limit[tier])
                                return op_fail(op, -ENOSPC, "job '%s' would exceed its nvme limit (%" PRIu64 " bytes)",
                                               j->name, j->limit[tier]);
                        r = nvme_alloc(m->nvme, t->alloc_size, (unsigned) (t->id % m->nvme->n_targets),
                                       &c->extents, &c->n_extents);
                        if (r < 0)
                                return op_fail(op, r, "no space left on the NVMe targets for %" PRIu64 " bytes",
                                               t->alloc_size);
                        account(m, t, tier, (int64_t) ((uint64_t) c->n_extents * m->nvme->extent_size));
                        break;
                }

                if (j->used[tier] + t->alloc_size <= j->limit[tier]) {
                        r = seg_tier_alloc(m, t, tier);
                        if (r >= 0) {
                                account(m, t, tier, (int64_t) t->alloc_size);
                                break;
                        }
                        if (r != -ENOSPC)
                                return op_fail(op, r, "cannot allocate %s memory: %s", tname(tier), strerror(-r));
                }
                r = make_space(m, op, t, tier, t->alloc_size);
                if (r == ADV_RETRY && attempt < 64)
                        continue;
                if (r == ADV_WAIT_SPACE)
                        return ADV_WAIT_SPACE;
                if (tier == TIER_VRAM && m->vram->pool.n_revoking > 0 && !op->no_wait)
                        return ADV_WAIT_SPACE;  /* chunks come back once their old clients let go (revoke.c) */
                if (r == -EAGAIN)
                        return op_fail(op, -EAGAIN, "no %s space to spare before the deadline", tname(tier));
                return op_fail(op, -ENOSPC,
                               "%s tier full for job '%s': %" PRIu64 " of %" PRIu64 " bytes used, "
                               "the rest pinned or in use (need %" PRIu64 ")",
                               tname(tier), j->name, j->used[tier], j->limit[tier], t->alloc_size);
        }
        c->state = COPY_FILLING;
        c->pins = 0;
        copy_touch(m, t, tier);
        return 0;
}

/* ---- transfers -------------------------------------------------------------- */

static void xfer_finish(Xfer *x) {
        Manager *m = x->manager;
        Tensor *t = x->tensor;
        Copy *d = &t->copy[x->dst];
        List waiters;

        t->xfer = NULL;
        list_init(&waiters);
        list_splice_tail(&waiters, &t->waiters);

        if (x->error < 0) {
                log_tensor(LOG_ERR, 0, t->job->name, t->name, tname(x->dst),
                           "Transfer of tensor '%s' of job '%s' %s->%s failed: %s",
                           t->name, t->job->name, tname(x->src), tname(x->dst), x->errmsg);
                copy_free(m, t, x->dst);
                /* fail everyone who waited for this transfer */
                list_for_each_safe(n, tmp, &waiters) {
                        Op *op = list_entry(n, Op, wait_link);

                        list_del(&op->wait_link);
                        op->wait = OP_WAIT_NONE;
                        snprintf(op->error, sizeof(op->error), "%s", x->errmsg);
                        /* complete through the run queue with the error recorded */
                        op->failed = x->error;
                        list_add_tail(&m->run_queue, &op->wait_link);
                        op->wait = OP_WAIT_RUN;
                }
        } else {
                d->state = COPY_RESIDENT;
                d->version = x->version;
                copy_touch(m, t, x->dst);
                list_for_each_safe(n, tmp, &waiters) {
                        Op *op = list_entry(n, Op, wait_link);

                        list_del(&op->wait_link);
                        list_add_tail(&m->run_queue, &op->wait_link);
                        op->wait = OP_WAIT_RUN;
                }
        }
        free(x->parts);
        free(x);
        m->n_xfers--;

        if (t->doomed) {
                tensor_release_copies(t);
                return;
        }
        free_stale(m, t);
        sched_transfer_done(m);
        manager_kick(m);
}

static void xfer_part_done(UringReq *req, int res) {
        XferPart *p = container_of(req, XferPart, req);
        Xfer *x = p->xfer;
        Manager *m = x->manager;
        Tensor *t = x->tensor;
        NvmeExtent *e = &t->copy[TIER_NVME].extents[p->index];
        NvmeTarget *tg = &m->nvme->targets[e->target];

        if (res < 0) {
                tg->io_errors++;
                if (x->error >= 0) {
                        x->error = res;
                        snprintf(x->errmsg, sizeof(x->errmsg), "I/O error on %s at offset %" PRIu64 ": %s",
                                 tg->path, req->offset, strerror(-res));
                }
        } else if (req->op == URING_READ) {
                tg->bytes_read += req->len;
                if (crc32c(0, req->buf, req->len) != e->crc) {
                        tg->crc_errors++;
                        if (x->error >= 0) {
                                x->error = -EBADMSG;
                                snprintf(x->errmsg, sizeof(x->errmsg),
                                         "crc32c mismatch in extent %u of tensor '%s' (%s offset %" PRIu64 ")",
                                         p->index, t->name, tg->path, req->offset);
                        }
                }
        } else
                tg->bytes_written += req->len;

        if (--x->pending == 0) {
                LinkDir d = x->dst == TIER_NVME ? LINK_HOST_TO_NVME : LINK_NVME_TO_HOST;

                if (x->error >= 0) {
                        m->links[d].bytes += t->alloc_size;
                        m->links[d].ops++;
                        t->job->link_bytes[d] += t->alloc_size;
                }
                xfer_finish(x);
        }
}

/*
 * The VRAM link.  Per direction, at most as many copies as the backend runs
 * at once (VramBackend.depth) are with it; the others wait in
 * Manager.vram_waiting ordered by fair tags (fairq.h, per-job flows by
 * weight, the same credit as the NVMe queue), so that the link is shared by
 * weight whatever asked for the copy: a pin, a prefetch, a drain.
 */
#define VRAM_FAIR_CREDIT (64ull << 20)

static double xfer_vtag(const List *n) {
        return list_entry(n, const Xfer, vlink)->vtag;
}

static unsigned vram_depth(const Manager *m) {
        return MAX(m->vram->depth, 1u);
}

static int vram_link_start(Manager *m, Xfer *x) {
        int d = (int) x->vcopy.dir;
        int r = m->vram->ops->copy(m->vram, &x->vcopy);

        if (r < 0)
                return r;
        m->vram_active[d]++;
        m->vram_vtime[d] = MAX(m->vram_vtime[d], x->vtag);
        return 0;
}

/* Start waiting copies while direction @d has room; one that cannot start fails its transfer. */
static void vram_link_dispatch(Manager *m, int d) {
        while (m->vram_active[d] < vram_depth(m) && !list_empty(&m->vram_waiting[d])) {
                Xfer *x = list_entry(m->vram_waiting[d].next, Xfer, vlink);
                int r;

                list_del(&x->vlink);
                r = vram_link_start(m, x);
                if (r < 0) {
                        x->error = r;
                        snprintf(x->errmsg, sizeof(x->errmsg), "cannot start VRAM copy: %s", strerror(-r));
                        xfer_finish(x);
                }
        }
}

static void xfer_vram_done(VramCopy *vc) {
        Xfer *x = container_of(vc, Xfer, vcopy);
        Manager *m = x->manager;
        LinkDir d = x->dst == TIER_VRAM ? LINK_HOST_TO_VRAM : LINK_VRAM_TO_HOST;
        int dir = (int) vc->dir;        /* xfer_finish() frees vc */

        if (vc->result < 0) {
                x->error = vc->result;
                snprintf(x->errmsg, sizeof(x->errmsg), "VRAM copy failed: %s", strerror(-vc->result));
        } else {
                m->links[d].bytes += x->tensor->alloc_size;
                m->links[d].ops++;
                x->tensor->job->link_bytes[d] += x->tensor->alloc_size;
        }
        m->vram_active[dir]--;
        xfer_finish(x);
        vram_link_dispatch(m, dir);
}

/* Start moving @t's valid copy in @src into the reserved copy in @dst. */
static int xfer_start(Op *op, Tensor *t, int src, int dst) {
        Manager *m = op->manager;
        Xfer *x;
        int r;

        x = calloc(1, sizeof(*x));
        if (!x)
                return op_fail(op, -ENOMEM, "out of memory");
        x->manager = m;
        x->tensor = t;
        x->src = src;
        x->dst = dst;
        x->version = t->copy[src].version;
        log_debug("xfer '%s' of job '%s': %s -> %s, version %" PRIu64, t->name, t->job->name, tname(src), tname(dst),
                  x->version);

        if (src == TIER_NVME || dst == TIER_NVME) {
                Copy *h = &t->copy[TIER_HOST];
                Copy *n = &t->copy[TIER_NVME];
                uint64_t es = m->nvme->extent_size;
                bool write = dst == TIER_NVME;

                x->parts = calloc(n->n_extents, sizeof(XferPart));
                if (!x->parts) {
                        free(x);
                        return op_fail(op, -ENOMEM, "out of memory");
                }
                x->n_parts = n->n_extents;
                x->pending = n->n_extents;
                for (uint32_t i = 0; i < n->n_extents; i++) {
                        XferPart *p = &x->parts[i];
                        uint8_t *buf = (uint8_t *) h->seg->map + h->offset + (uint64_t) i * es;
                        uint32_t len = (uint32_t) MIN(es, t->alloc_size - (uint64_t) i * es);

                        p->xfer = x;
                        p->index = i;
                        p->req = (UringReq) {
                                .cb = xfer_part_done,
                                .flow = &t->job->nvme_flow,
                                .weight = t->job->weight,
                                .op = write ? URING_WRITE : URING_READ,
                                .file_index = n->extents[i].target,
                                .buf_index = (int) h->seg->id,
                                .buf = buf,
                                .len = len,
                                .offset = n->extents[i].unit * es,
                        };
                        list_init(&p->req.link);
                        uring_queue(m->uring, &p->req);
                }
                t->xfer = x;
                m->n_xfers++;
                /*
                 * Submit first, checksum after: the host copy does not change while the
                 * tensor is in transfer, so the CPU computes the crcs while the device
                 * is already writing the same bytes.
                 */
                (void) uring_flush(m->uring);
                if (write)
                        for (uint32_t i = 0; i < n->n_extents; i++)
                                n->extents[i].crc = crc32c(0, x->parts[i].req.buf, x->parts[i].req.len);
                return 0;
        }

        /* host <-> vram */
        {
                Copy *h = &t->copy[TIER_HOST];
                Copy *v = &t->copy[TIER_VRAM];

                x->vcopy = (VramCopy) {
                        .dir = dst == TIER_VRAM ? VRAM_TO_DEVICE : VRAM_TO_HOST,
                        .host = (uint8_t *) h->seg->map + h->offset,
                        .seg = v->seg,
                        .offset = v->offset,
                        .len = t->alloc_size,
                        .done = xfer_vram_done,
                };
                int d = (int) x->vcopy.dir;
                FairFlow *flow = &t->job->vram_flow[d], before = *flow;

                list_init(&x->vlink);
                x->vtag = fair_tag(flow, m->vram_vtime[d], t->alloc_size, t->job->weight, VRAM_FAIR_CREDIT);
                if (m->vram_active[d] < vram_depth(m) && list_empty(&m->vram_waiting[d])) {
                        r = vram_link_start(m, x);
                        if (r < 0) {
                                *flow = before;         /* nothing moved: nothing to charge */
                                free(x);
                                return op_fail(op, r, "cannot start VRAM copy: %s", strerror(-r));
                        }
                } else
                        fair_insert(&m->vram_waiting[d], &x->vlink, x->vtag, xfer_vtag);
                t->xfer = x;
                m->n_xfers++;
        }
        return 0;
}

/* ---- the state machine -------------------------------------------------------- */

static int zero_fill(Op *op, Tensor *t, int tier) {
        Manager *m = op->manager;
        Copy *c = &t->copy[tier];

        if (tier == TIER_HOST)
                memset((uint8_t *) c->seg->map + c->offset, 0, t->alloc_size);
        else {
                int r = m->vram->ops->zero(m->vram, c->seg, c->offset, t->alloc_size);
                if (r < 0)
                        return op_fail(op, r, "cannot zero VRAM: %s", strerror(-r));
        }
        c->state = COPY_RESIDENT;
        c->version = t->version;
        return ADV_DONE;
}

/* Make @tier hold a valid copy of @t.  ADV_DONE, ADV_WAIT_*, or -errno. */
static int ensure_copy(Op *op, Tensor *t, int tier) {
        Copy *c = &t->copy[tier];
        int r, src;

        if (copy_valid(t, tier))
                return ADV_DONE;
        if (t->xfer)
                return ADV_WAIT_TENSOR;
        if (tier == TIER_NVME && (t->version == 0 || t->dead))
                return ADV_DONE;        /* zeros, or bytes about to be overwritten, need no image */

        if (c->state == COPY_RESIDENT || c->state == COPY_DRAINING)
                c->state = COPY_FILLING;        /* stale: refill in place */
        /*
         * A scheduler prefetch into VRAM stages the host copy before it takes
         * VRAM: when staging finds no room it gives up holding nothing.
         */
        if (tier == TIER_VRAM && op->no_wait && c->state == COPY_ABSENT && !op->discard &&
            !tensor_is_blank(t)) {
                r = ensure_copy(op, t, TIER_HOST);
                if (r != ADV_DONE)
                        return r;
        }
        if (c->state == COPY_ABSENT) {
                r = copy_reserve(op, t, tier);
                if (r != 0)
                        return r;
        }

        /* the phase overwrites the whole tensor: the old bytes need not be brought */
        if (op->discard && tier != TIER_NVME && op->tensor == t && op->tier == tier) {
                c->state = COPY_RESIDENT;
                c->version = t->version;
                return ADV_DONE;
        }

        /* c is reserved (FILLING); find a source */
        if (tensor_is_blank(t)) {
                if (tier == TIER_NVME)
                        return ADV_DONE;
                return zero_fill(op, t, tier);
        }

        switch (tier) {
        case TIER_VRAM:
                r = ensure_copy(op, t, TIER_HOST);
                if (r != ADV_DONE)
                        return r;
                src = TIER_HOST;
                break;
        case TIER_HOST:
                if (copy_valid(t, TIER_VRAM))
                        src = TIER_VRAM;
                else if (copy_valid(t, TIER_NVME))
                        src = TIER_NVME;
                else
                        return op_fail(op, -EIO, "tensor '%s' has no valid copy (internal error)", t->name);
                break;
        case TIER_NVME:
                r = ensure_copy(op, t, TIER_HOST);
                if (r != ADV_DONE)
                        return r;
                src = TIER_HOST;
                break;
        default:
                return -EINVAL;
        }
        r = xfer_start(op, t, src, tier);
        if (r < 0)
                return r;
        return ADV_WAIT_TENSOR;
}

static int advance_evict(Op *op, Tensor *t, int tier) {
        Manager *m = op->manager;
        int r;

        for (int i = 0; i < tier; i++)
                if (t->copy[i].pins > 0)
                        return op_fail(op, -EBUSY, "tensor '%s' is pinned in %s", t->name, tname(i));
        if (t->xfer)
                return ADV_WAIT_TENSOR;

        /* is there already a valid copy at or below @tier? */
        {
                bool below = t->version == 0 || t->dead;

                for (int i = tier; i < TIERS; i++)
                        if (copy_valid(t, i))
                                below = true;
                if (!below) {
                        r = ensure_copy(op, t, tier);
                        if (r != ADV_DONE)
                                return r;
                }
        }
        for (int i = 0; i < tier; i++)
                copy_free(m, t, i);
        return ADV_DONE;
}

static int advance_drain(Op *op, Tensor *t, int tier) {
        Manager *m = op->manager;
        Copy *c = &t->copy[tier];
        int r;

        if (c->state != COPY_DRAINING)
                return ADV_DONE;        /* pinned again meanwhile: keep it */
        if (copy_is_sole(t, tier)) {
                r = ensure_copy(op, t, tier + 1);
                if (r != ADV_DONE)
                        return r;
        }
        if (c->state == COPY_DRAINING && c->pins == 0)
                copy_free(m, t, tier);
        return ADV_DONE;
}

static int advance_clean(Op *op, Tensor *t, int tier) {
        if (!copy_is_sole(t, tier) || t->copy[tier].pins > 0)
                return ADV_DONE;
        return ensure_copy(op, t, tier + 1);
}

static int op_advance(Op *op) {
        Tensor *t = op->tensor;
        int r;

        if (op->failed < 0)             /* a transfer we waited for failed */
                return op->failed;

        switch (op->kind) {
        case OP_PIN:
                if (t->copy[op->tier].state == COPY_DRAINING)
                        t->copy[op->tier].state = COPY_RESIDENT;        /* cancel the drain */
                r = ensure_copy(op, t, op->tier);
                if (r > 0 && op->reserved && !op->reserved_sent && t->copy[op->tier].state == COPY_FILLING) {
                        /* async pin: the destination is known, the client may go on */
                        t->copy[op->tier].pins++;
                        op->pinned = true;
                        op->reserved_sent = true;
                        op->reserved(op);
                }
                return r;
        case OP_PREFETCH:
                return ensure_copy(op, t, op->tier);
        case OP_EVICT:
                return advance_evict(op, t, op->tier);
        case OP_DRAIN:
                return advance_drain(op, t, op->tier);
        case OP_CLEAN:
                return advance_clean(op, t, op->tier);
        default:
                return -EINVAL;
        }
}

static void op_free(Op *op) {
        list_del(&op->wait_link);
        list_del(&op->all_link);
        if (op->tensor) {
                Tensor *t = op->tensor;

                t->op_refs--;
                /* a reservation nobody will fill any more (whatever the op's kind) */
                if (op->tier >= 0 && t->copy[op->tier].state == COPY_FILLING && !t->xfer &&
                    t->copy[op->tier].pins == 0)
                        copy_free(op->manager, t, op->tier);
        }
        free(op);
}

static void op_end(Op *op, int r) {
        Tensor *t = op->tensor;

        if (op->kind == OP_PIN && op->tier >= 0) {
                Copy *c = &t->copy[op->tier];

                if (r >= 0) {
                        if (!op->pinned)
                                c->pins++;
                        op->pinned = true;
                        copy_touch(op->manager, t, op->tier);
                } else if (op->pinned) {
                        c->pins--;
                        op->pinned = false;
                }
        }
        if (op->complete)
                op->complete(op, r, r < 0 ? op->error : NULL);
        op_free(op);
}

void mover_run(Manager *m) {
        mover_run_queue(m);
        /* the scheduler looks at the new state and may queue more */
        sched_run(m);
        mover_run_queue(m);
}

static void mover_run_queue(Manager *m) {
        while (!list_empty(&m->run_queue)) {
                Op *op = list_entry(m->run_queue.next, Op, wait_link);
                int r;

                list_del(&op->wait_link);
                op->wait = OP_WAIT_NONE;
                r = op_advance(op);
                if (r == ADV_WAIT_TENSOR) {
                        list_add_tail(&op->tensor->waiters, &op->wait_link);
                        op->wait = OP_WAIT_TENSOR;
                } else if (r == ADV_WAIT_SPACE) {
                        list_add_tail(&m->space_waiters, &op->wait_link);
                        op->wait = OP_WAIT_SPACE;
                } else {
                        if (op->kind == OP_DRAIN)
                                wake_space_waiters(m);  /* success or not, let them re-check */
                        if (r < 0 && op->error[0] == 0)
                                snprintf(op->error, sizeof(op->error), "%s", strerror(-r));
                        if (r < 0 && op->kind == OP_DRAIN) {
                                Copy *c = &op->tensor->copy[op->tier];

                                log_tensor(LOG_WARNING, 0, op->tensor->job->name, op->tensor->name, tname(op->tier),
                                           "Cannot write tensor '%s' of job '%s' down from %s: %s",
                                           op->tensor->name, op->tensor->job->name, tname(op->tier), op->error);
                                if (c->state == COPY_DRAINING)
                                        c->state = COPY_RESIDENT;
                        }
                        op_end(op, r < 0 ? r : 0);
                }
        }
}

int op_submit(Manager *m, OpKind kind, Tensor *t, int tier,
              void (*complete)(Op *, int, const char *), void (*reserved)(Op *), void *userdata, Op **ret) {
        Op *op;

        op = calloc(1, sizeof(*op));
        if (!op)
                return -ENOMEM;
        *op = (Op) {
                .manager = m,
                .kind = kind,
                .tensor = t,
                .tier = tier,
                .complete = complete,
                .reserved = reserved,
                .userdata = userdata,
                .wait = OP_WAIT_RUN,
        };
        t->op_refs++;
        list_init(&op->all_link);
        list_add_tail(&all_ops, &op->all_link);
        list_add_tail(&m->run_queue, &op->wait_link);
        manager_kick(m);
        if (ret)
                *ret = op;
        return 0;
}

void op_cancel(Op *op) {
        if (op->cancelled)
                op->cancelled(op);
        if (op->kind == OP_PIN && op->pinned && op->tier >= 0) {
                op->tensor->copy[op->tier].pins--;
                op->pinned = false;
        }
        op->complete = NULL;
        op_free(op);
}

void mover_cancel_job(Manager *m, Job *j) {
        list_for_each_safe(n, tmp, &all_ops) {
                Op *op = list_entry(n, Op, all_link);

                if (op->tensor->job == j) {
                        if (op->kind == OP_DRAIN && op->tensor->copy[op->tier].state == COPY_DRAINING)
                                op->tensor->copy[op->tier].state = COPY_RESIDENT;
                        op_cancel(op);
                }
        }
}

int mover_init(Manager *m) {
        return 0;
}

void mover_deinit(Manager *m) {
        list_for_each_safe(n, tmp, &all_ops)
                op_cancel(list_entry(n, Op, all_link));
}

void copy_grant(const Tensor *t, int tier, uint32_t *ret_segment, uint32_t *ret_generation, uint64_t *ret_offset) {
        const Copy *c = &t->copy[tier];

        *ret_segment = c->seg ? c->seg->id : 0;
        *ret_generation = c->seg ? c->seg->generation : 0;
        *ret_offset = c->offset;
}

int tensor_unpin(Tensor *t, int tier, bool dirty) {
        Manager *m = t->job->manager;
        Copy *c = &t->copy[tier];

        if (c->pins == 0)
                return -ENOENT;
        c->pins--;
        if (dirty) {
                t->version++;
                c->version = t->version;
                t->dead = false;
        }
        log_debug("unpin '%s' of job '%s' in %s%s: version %" PRIu64 ", pins left %u", t->name, t->job->name,
                  tname(tier), dirty ? " (dirty)" : "", t->version, c->pins);
        copy_touch(m, t, tier);
        free_stale(m, t);
        return 0;
}

void tensor_release_copies(Tensor *t) {
        Manager *m = t->job->manager;

        if (t->xfer)
                return;         /* xfer_finish() comes back here */
        for (int i = 0; i < TIERS; i++)
                copy_free(m, t, i);
        if (t->doomed)
                tensor_destroy_final(t);
}
