/* SPDX-License-Identifier: MIT */
/* space.c: giving a copy its space in a tier (pieces of segments, NVMe extents), and saying why not. */

/*
 * Theory of operation.
 *
 * Host and VRAM memory reach jobs in segments of the pool's seg_size (S);
 * a segment belongs to one job.  A copy of a tensor of A bytes (alloc_size)
 * is laid out as pieces:
 *
 *   A <= S     one piece, in the fullest of the job's segments that has a
 *              run of A bytes (best fit by fill: small tensors pack together
 *              and empty segments stay whole for large ones), else in a
 *              segment taken from the pool;
 *   A > S      A / S whole segments (empty ones of the job's, else taken from
 *              the pool) and, for the rest, one tail piece placed like a small
 *              tensor, on the pool's piece_align (the cuda pool's granularity);
 *              in a pool whose segments clients map only whole (map_whole:
 *              cuda, where a client maps the copy's chunks side by side into
 *              one range), at offset 0 of its segment.
 *
 * So a tensor has at most A / S + 1 pieces, and I/O, copies and grants work
 * per piece.  A job holds at most ceil(limit / S) segments; when the pool has
 * no free segment, segments other jobs hold empty are taken back (the pool
 * replaces their memory).  Within a segment a run is taken at the lowest
 * address it fits (extent_alloc_get_low()), which leaves the longest run at
 * the high end.
 *
 * When a copy gets no space, copy_alloc() says why (SpaceShort) and
 * space_explain() turns that into the status and the sentence a client
 * sees: the tensor is larger than the tier (-EFBIG: never fits), larger than
 * the job's limit there (-EDQUOT: the limit must be raised), the job's limit
 * is reached (-ENOSPC, with what of it is pinned), the job's segments have
 * the room but not in one run (-ENOSPC, fragmentation, with the longest
 * run), or the pool's segments are held by other jobs (-EAGAIN: retry later;
 * they are named, with their use and whether they are idle).
 *
 * NVMe is the last tier: a copy there is never taken back from a job, as
 * host and VRAM copies are (engine/reclaim.c), for there is nothing below
 * to write it to.  So a guarantee there (nvme_min) is a reservation: the
 * part of it a job that claims it (job_claims_room()) does not use stays
 * free for it.  An NVMe copy is placed only when the targets keep that
 * room of the other jobs free after it (nvme_kept(); SPACE_NVME_KEPT,
 * -ENOSPC, the jobs named, otherwise); one within its own job's unused
 * guarantee always is.  quota.c keeps the claims within what is free when
 * they are made (a job made or attached, a quota set), so the room is
 * there when a guaranteed job needs it.  The targets are one set: a
 * copy's extents go to any of them (nvme_alloc()).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/macro.h"
#include "util/size.h"
#include "util/time-util.h"

/* ---- pieces ------------------------------------------------------------------------------ */

const CopyPiece *copy_locate(const Copy *c, uint64_t pos, uint64_t *ret_off, uint64_t *ret_len) {
        for (uint32_t i = 0; i < c->n_pieces; i++) {
                const CopyPiece *p = &c->pieces[i];

                if (pos < p->len) {
                        if (ret_off)
                                *ret_off = p->offset + pos;
                        if (ret_len)
                                *ret_len = p->len - pos;
                        return p;
                }
                pos -= p->len;
        }
        return NULL;
}

uint8_t *copy_addr(const Copy *c, uint64_t pos) {
        uint64_t off;
        const CopyPiece *p = copy_locate(c, pos, &off, NULL);

        return p && p->seg->map ? (uint8_t *) p->seg->map + off : NULL;
}

static void pieces_free(Copy *c) {
        for (uint32_t i = 0; i < c->n_pieces; i++)
                segment_free(c->pieces[i].seg, c->pieces[i].offset, c->pieces[i].span);
        if (c->pieces != &c->one)
                free(c->pieces);
        c->pieces = NULL;
        c->n_pieces = 0;
        c->one = (CopyPiece) {};
}

/* How many segments job @j holds in @tier. */
static unsigned job_segments(const Job *j, int tier) {
        unsigned n = 0;

        list_for_each_safe(node, tmp, &j->segments[tier])
                n++;
        return n;
}

/* A segment from the pool for @j; when the pool has none free, take back those jobs hold empty. */
static int take_segment(Registry *r, Job *j, int tier, Segment **ret) {
        SegPool *pool = r->pools[tier];
        int q;

        q = segpool_assign(pool, j, &j->segments[tier], ret);
        if (q != -ENOSPC)
                return q;
        for (uint32_t i = 0; i < pool->n_segs; i++) {
                Segment *s = &pool->segs[i];

                if (s->owner && s->used == 0)
                        (void) segpool_release(pool, s);
        }
        return segpool_assign(pool, j, &j->segments[tier], ret);
}

static int by_fill(const void *a, const void *b) {
        const Segment *x = *(Segment *const *) a, *y = *(Segment *const *) b;

        return x->used > y->used ? -1 : x->used < y->used;
}

/*
 * Place one piece of @span bytes (aligned to @align) in the fullest of @j's
 * segments that has a run for it, skipping @busy (segments taken whole for
 * this copy), else in a new segment if @budget allows; with @at_start only
 * at offset 0 of a segment.  *@ret_pool_empty: the pool had no segment to give.
 */
static int place_piece(Registry *r, Job *j, int tier, uint64_t span, uint64_t align, bool at_start,
                       const CopyPiece *busy, uint32_t n_busy, unsigned *budget, CopyPiece *ret,
                       bool *ret_pool_empty) {
        _cleanup_free_ Segment **cand = NULL;
        size_t n = 0;
        Segment *s;
        int q;

        cand = calloc(job_segments(j, tier) + 1, sizeof(Segment *));
        if (!cand)
                return -ENOMEM;
        list_for_each_safe(node, tmp, &j->segments[tier]) {
                bool taken = false;

                s = list_entry(node, Segment, owner_link);
                for (uint32_t i = 0; i < n_busy && !taken; i++)
                        taken = busy[i].seg == s;
                if (!taken && s->pool->seg_size - s->used >= span)
                        cand[n++] = s;
        }
        qsort(cand, n, sizeof(Segment *), by_fill);
        for (size_t i = 0; i < n; i++)
                if (segment_alloc(cand[i], span, align, &ret->offset) >= 0) {
                        /* runs are taken lowest first: not at 0 means [0, span) is not free */
                        if (at_start && ret->offset != 0) {
                                segment_free(cand[i], ret->offset, span);
                                continue;
                        }
                        ret->seg = cand[i];
                        ret->span = span;
                        return 0;
                }
        if (*budget == 0)
                return -ENOSPC;
        q = take_segment(r, j, tier, &s);
        if (q == -ENOSPC)
                *ret_pool_empty = true;
        if (q < 0)
                return q;
        (*budget)--;
        q = segment_alloc(s, span, align, &ret->offset);
        if (q < 0)
                return q;
        ret->seg = s;
        ret->span = span;
        return 0;
}

/* A whole empty segment for @j: one of its own, else a new one. */
static int whole_segment(Registry *r, Job *j, int tier, const CopyPiece *busy, uint32_t n_busy, unsigned *budget,
                         CopyPiece *ret, bool *ret_pool_empty) {
        uint64_t seg_size = r->pools[tier]->seg_size;
        Segment *s;
        int q;

        list_for_each_safe(node, tmp, &j->segments[tier]) {
                bool taken = false;

                s = list_entry(node, Segment, owner_link);
                for (uint32_t i = 0; i < n_busy && !taken; i++)
                        taken = busy[i].seg == s;
                if (taken || s->used != 0)
                        continue;
                q = segment_alloc(s, seg_size, SEG_UNIT, &ret->offset);
                if (q < 0)
                        continue;
                ret->seg = s;
                ret->span = seg_size;
                return 0;
        }
        if (*budget == 0)
                return -ENOSPC;
        q = take_segment(r, j, tier, &s);
        if (q == -ENOSPC)
                *ret_pool_empty = true;
        if (q < 0)
                return q;
        (*budget)--;
        q = segment_alloc(s, seg_size, SEG_UNIT, &ret->offset);
        if (q < 0)
                return q;
        ret->seg = s;
        ret->span = seg_size;
        return 0;
}

static int alloc_pieces(Registry *r, Tensor *t, int tier, SpaceShort *ret_why) {
        SegPool *pool = r->pools[tier];
        Job *j = t->job;
        Copy *c = &t->copy[tier];
        uint64_t size = t->alloc_size, seg_size = pool->seg_size;
        uint64_t whole = size / seg_size, tail = size % seg_size;
        uint32_t n = (uint32_t) whole + (tail ? 1 : 0), got = 0;
        unsigned held = job_segments(j, tier), budget;
        CopyPiece *pieces;
        bool pool_empty = false;
        int q = 0;

        segpool_settle(pool);   /* ranges parked for a client's device work that has ended since */
        budget = (unsigned) MIN(ALIGN_UP(j->limit[tier], seg_size) / seg_size, (uint64_t) pool->n_segs);
        budget = budget > held ? budget - held : 0;
        pieces = n == 1 ? &c->one : calloc(n, sizeof(CopyPiece));
        if (!pieces)
                return -ENOMEM;
        *pieces = (CopyPiece) {};
        for (; got < whole && q >= 0; got++) {
                q = whole_segment(r, j, tier, pieces, got, &budget, &pieces[got], &pool_empty);
                pieces[got].len = seg_size;
        }
        if (q >= 0 && tail) {
                /* alone, a small tensor needs only page alignment; a tail is mapped after whole segments */
                uint64_t align = whole ? pool->piece_align : SEG_UNIT;

                q = place_piece(r, j, tier, ALIGN_UP(tail, align), align, whole && pool->map_whole, pieces, got,
                                &budget, &pieces[got], &pool_empty);
                pieces[got].len = tail;
                if (q >= 0)
                        got++;
        } else if (q < 0)
                got--;          /* the one that failed holds nothing */
        if (q < 0) {
                for (uint32_t i = 0; i < got; i++)
                        segment_free(pieces[i].seg, pieces[i].offset, pieces[i].span);
                if (pieces != &c->one)
                        free(pieces);
                c->one = (CopyPiece) {};
                if (q == -ENOSPC)
                        *ret_why = pool_empty ? SPACE_POOL : SPACE_FRAGMENTED;
                return q;
        }
        c->pieces = pieces;
        c->n_pieces = n;
        return 0;
}

/* ---- totals of uids and groups ------------------------------------------------------------------ */

/* Is job @o under total @jt (of its uid, or a member's of its group)? */
bool total_covers(const JobTotal *jt, const Job *o) {
        if (jt->kind == QUOTA_UID)
                return (uint32_t) o->uid == jt->id;
        for (uint32_t g = 0; g < o->n_gids; g++)
                if ((uint32_t) o->gids[g] == jt->id)
                        return true;
        return false;
}

uint64_t total_used(const Registry *r, const JobTotal *jt, int tier, unsigned *ret_jobs) {
        const List *lists[] = { &r->jobs, &r->dying_jobs };
        uint64_t used = 0;
        unsigned n = 0;

        for (size_t l = 0; l < ELEMENTSOF(lists); l++)
                list_for_each_safe(node, tmp, (List *) lists[l]) {
                        const Job *o = list_entry(node, Job, link);

                        if (total_covers(jt, o)) {
                                used += o->used[tier];
                                n++;
                        }
                }
        if (ret_jobs)
                *ret_jobs = n;
        return used;
}

/* The first of @j's totals in @tier that @need more bytes would exceed (*@ret_over: @need alone does), or NULL. */
const JobTotal *total_exceeded(const Registry *r, const Job *j, int tier, uint64_t need, bool *ret_over) {
        for (unsigned i = 0; i < j->n_totals; i++) {
                const JobTotal *jt = &j->totals[i];

                if (jt->total[tier] == 0)
                        continue;
                *ret_over = need > jt->total[tier];
                if (*ret_over || total_used(r, jt, tier, NULL) + need > jt->total[tier])
                        return jt;
        }
        return NULL;
}

/* ---- room kept on NVMe for guarantees ----------------------------------------------------------- */

uint64_t nvme_kept(const Registry *r, const Job *except, char *who, size_t size) {
        uint64_t kept = 0;
        size_t len = 0;

        if (who && size > 0)
                who[0] = '\0';
        list_for_each_safe(node, tmp, (List *) &r->jobs) {
                const Job *o = list_entry(node, Job, link);
                uint64_t unused = nvme_unused_guarantee(o);
                char g[SIZE_FORMAT_MAX], u[SIZE_FORMAT_MAX];
                int k;

                if (o == except || !job_claims_room(o) || unused == 0)
                        continue;
                kept = kept + unused < kept ? UINT64_MAX : kept + unused;
                if (!who || len + 1 >= size)
                        continue;
                size_format(g, sizeof(g), o->guarantee[LEVEL_NVME]);
                size_format(u, sizeof(u), o->used[LEVEL_NVME]);
                k = snprintf(who + len, size - len, "%s'%s' (%s, %s of it used)", len ? ", " : "", o->name, g, u);
                if (k >= (int) (size - len) && size >= 4)
                        (void) snprintf(who + size - 4, 4, "...");      /* cut short: say so */
                if (k > 0)
                        len = MIN(size - 1, len + (size_t) k);
        }
        return kept;
}

/* Would @need more NVMe bytes of @j's cut into the room kept for the other jobs' guarantees? */
static bool nvme_cuts_kept(const Registry *r, const Job *j, uint64_t need) {
        uint64_t free_bytes = r->capacity[LEVEL_NVME] > r->used[LEVEL_NVME] ?
                r->capacity[LEVEL_NVME] - r->used[LEVEL_NVME] : 0;

        if (job_claims_room(j) && need <= nvme_unused_guarantee(j))
                return false;           /* within its own guarantee: never refused */
        return need > free_bytes || nvme_kept(r, j, NULL, 0) > free_bytes - need;
}

/* ---- a copy's space ------------------------------------------------------------------------ */

int copy_alloc(Tensor *t, int tier, SpaceShort *ret_why) {
        Registry *r = t->job->registry;
        Job *j = t->job;
        Copy *c = &t->copy[tier];
        uint64_t need = tier == LEVEL_NVME ? ALIGN_UP(t->alloc_size, r->nvme->extent_size) : t->alloc_size;
        int q;

        *ret_why = SPACE_OK;
        if (need > r->capacity[tier]) {
                *ret_why = SPACE_TOO_LARGE;
                return -ENOSPC;
        }
        if (need > j->limit[tier]) {
                *ret_why = SPACE_OVER_QUOTA;
                return -ENOSPC;
        }
        if (j->used[tier] + need > j->limit[tier]) {
                *ret_why = SPACE_LIMIT;
                return -ENOSPC;
        }
        if (j->n_totals > 0) {
                bool over = false;

                if (total_exceeded(r, j, tier, need, &over)) {
                        *ret_why = over ? SPACE_TOTAL_OVER : SPACE_TOTAL;
                        return -ENOSPC;
                }
        }
        if (tier == LEVEL_NVME) {
                if (nvme_cuts_kept(r, j, need)) {
                        *ret_why = SPACE_NVME_KEPT;
                        return -ENOSPC;
                }
                q = nvme_alloc(r->nvme, t->alloc_size, (unsigned) (t->id % r->nvme->n_targets), &c->extents,
                               &c->n_extents);
                if (q == -ENOSPC)
                        *ret_why = SPACE_TARGETS;
                if (q < 0)
                        return q;
                copy_account(t, tier, (int64_t) ((uint64_t) c->n_extents * r->nvme->extent_size));
                return 0;
        }
        q = alloc_pieces(r, t, tier, ret_why);
        if (q < 0)
                return q;
        copy_account(t, tier, (int64_t) t->alloc_size);
        return 0;
}

uint64_t copy_room_needed(const Tensor *t, int tier) {
        const Registry *r = t->job->registry;
        const Job *j = t->job;
        uint64_t need = tier == LEVEL_NVME ? ALIGN_UP(t->alloc_size, r->nvme->extent_size) : t->alloc_size;
        uint64_t room = need;

        if (j->used[tier] > j->limit[tier])
                room = need + (j->used[tier] - j->limit[tier]);
        for (unsigned i = 0; i < j->n_totals; i++) {
                const JobTotal *jt = &j->totals[i];
                uint64_t used = jt->total[tier] ? total_used(r, jt, tier, NULL) : 0;

                if (used > jt->total[tier])
                        room = MAX(room, need + (used - jt->total[tier]));
        }
        return room;
}

void copy_release(Tensor *t, int tier) {
        Registry *r = t->job->registry;
        Copy *c = &t->copy[tier];

        if (tier == LEVEL_NVME) {
                copy_account(t, tier, -(int64_t) ((uint64_t) c->n_extents * r->nvme->extent_size));
                nvme_free(r->nvme, c->extents, c->n_extents);
                c->extents = NULL;
                c->n_extents = 0;
                return;
        }
        if (c->n_pieces > 0)
                copy_account(t, tier, -(int64_t) t->alloc_size);
        pieces_free(c);
}

int copy_restore_nvme(Tensor *t, NvmeExtent *ext, uint32_t n) {
        Registry *r = t->job->registry;
        Copy *c = &t->copy[LEVEL_NVME];

        if (c->state != COPY_ABSENT)
                return -EEXIST;
        c->extents = ext;
        c->n_extents = n;
        copy_set_state(t, LEVEL_NVME, COPY_RESIDENT);
        c->version = t->version;
        copy_account(t, LEVEL_NVME, (int64_t) ((uint64_t) n * r->nvme->extent_size));
        copy_touch(t, LEVEL_NVME);
        return 0;
}

/* ---- why not ---------------------------------------------------------------------------------- */

/* The free bytes of @j's segments in @tier and their longest run. */
static void job_free_space(const Job *j, int tier, uint64_t *ret_free, uint64_t *ret_run, unsigned *ret_segs) {
        uint64_t free_bytes = 0, run = 0;
        unsigned n = 0;

        list_for_each_safe(node, tmp, &j->segments[tier]) {
                Segment *s = list_entry(node, Segment, owner_link);

                n++;
                free_bytes += s->pool->seg_size - s->used;
                run = MAX(run, segment_largest_free(s));
        }
        *ret_free = free_bytes;
        *ret_run = run;
        *ret_segs = n;
}

/* "'a' 192M in 3 segments (idle, ends in 20 s), 'b' 64M in 1": the jobs other than @j holding @tier's segments. */
static void holders(const Registry *r, const Job *j, int tier, char *buf, size_t size) {
        uint64_t now = now_usec();
        size_t len = 0;
        unsigned shown = 0;

        buf[0] = '\0';
        list_for_each_safe(node, tmp, &r->jobs) {
                const Job *o = list_entry(node, Job, link);
                unsigned segs = job_segments(o, tier);
                char used[SIZE_FORMAT_MAX];
                int k;

                if (o == j || segs == 0 || len >= size)
                        continue;
                if (shown == 4) {
                        (void) snprintf(buf + len, size - len, ", ...");
                        break;
                }
                size_format(used, sizeof(used), o->used[tier]);
                if (o->n_conns == 0 && o->linger_until > now)
                        k = snprintf(buf + len, size - len, "%s'%s' %s in %u segment(s) (idle, lingering %" PRIu64
                                     " s more)", shown ? ", " : "", o->name, used, segs,
                                     (o->linger_until - now + 999999) / 1000000);
                else
                        k = snprintf(buf + len, size - len, "%s'%s' %s in %u segment(s)%s", shown ? ", " : "",
                                     o->name, used, segs, o->n_conns == 0 ? " (idle)" : "");
                if (k > 0)
                        len = MIN(size - 1, len + (size_t) k);
                shown++;
        }
}

int space_explain(const Tensor *t, int tier, SpaceShort why, char *buf, size_t size) {
        const Registry *r = t->job->registry;
        const Job *j = t->job;
        const char *tn = level_to_string(tier);
        char need[SIZE_FORMAT_MAX], cap[SIZE_FORMAT_MAX], lim[SIZE_FORMAT_MAX], used[SIZE_FORMAT_MAX];
        char pinned[SIZE_FORMAT_MAX], freeb[SIZE_FORMAT_MAX], run[SIZE_FORMAT_MAX], who[384];
        uint64_t free_bytes, longest;
        unsigned segs;

        size_format(need, sizeof(need), t->alloc_size);
        size_format(cap, sizeof(cap), r->capacity[tier]);
        size_format(lim, sizeof(lim), j->limit[tier]);
        size_format(used, sizeof(used), j->used[tier]);
        size_format(pinned, sizeof(pinned), j->pinned[tier]);
        switch (why) {
        case SPACE_TOO_LARGE:
                snprintf(buf, size, "tensor '%s' (%s) is larger than the whole %s tier (%s): it can never be there",
                         t->name, need, tn, cap);
                return -EFBIG;
        case SPACE_OVER_QUOTA:
                snprintf(buf, size, "tensor '%s' (%s) is larger than job '%s' may use in %s (its limit is %s): "
                         "raise the limit (tierctl quota set)", t->name, need, j->name, tn, lim);
                return -EDQUOT;
        case SPACE_LIMIT:
                snprintf(buf, size, "job '%s' is at its %s limit: %s of %s in use, %s of it pinned by the job, the "
                         "rest in transfer or needed sooner; tensor '%s' needs %s more: unpin or free something, or "
                         "raise the limit", j->name, tn, used, lim, pinned, t->name, need);
                return -ENOSPC;
        case SPACE_FRAGMENTED:
                job_free_space(j, tier, &free_bytes, &longest, &segs);
                size_format(freeb, sizeof(freeb), free_bytes);
                size_format(run, sizeof(run), longest);
                snprintf(buf, size, "job '%s' has %s free in its %u %s segment(s) (%s of %s in use), but its longest "
                         "free run is %s and tensor '%s' needs %s%s in one: the space is fragmented, and the job may "
                         "take no more segments; free or move tensors of the job", j->name, freeb, segs, tn, used,
                         lim, run, t->name, need,
                         t->alloc_size <= r->pools[tier]->seg_size ? "" :
                         r->pools[tier]->map_whole ? " (whole segments, and its tail at the start of one: a GPU "
                                                     "maps only whole chunks)" : " (whole segments)");
                return -ENOSPC;
        case SPACE_POOL:
                holders(r, j, tier, who, sizeof(who));
                snprintf(buf, size, "the %s pool (%s) has no segment left for job '%s' (tensor '%s' needs %s): they "
                         "are held by %s, none of it free to take back now (pinned, in use, or within its "
                         "holder's share while job '%s' is at or above its own); retry later, or end idle jobs",
                         tn, cap, j->name, t->name, need, who[0] ? who : "jobs being freed", j->name);
                return -EAGAIN;
        case SPACE_TARGETS:
                snprintf(buf, size, "the NVMe targets (%s) have no room left for tensor '%s' (%s)", cap, t->name, need);
                return -ENOSPC;
        case SPACE_NVME_KEPT: {
                uint64_t left = r->capacity[LEVEL_NVME] > r->used[LEVEL_NVME] ?
                        r->capacity[LEVEL_NVME] - r->used[LEVEL_NVME] : 0;
                char kept[SIZE_FORMAT_MAX], own[SIZE_FORMAT_MAX];

                /* (the names cut short, so that the advice fits an op's error) */
                size_format(kept, sizeof(kept), nvme_kept(r, j, who, MIN(sizeof(who), (size_t) 128)));
                size_format(freeb, sizeof(freeb), left);
                size_format(own, sizeof(own), job_claims_room(j) ? nvme_unused_guarantee(j) : 0);
                snprintf(buf, size, "the NVMe room left (%s free of %s) is kept, %s of it, for the guaranteed minimum "
                         "(nvme_min) of %s: tensor '%s' of job '%s' needs %s, beyond its own unused guarantee there "
                         "(%s%s); NVMe copies are never taken back from a job, so that room stays free until those "
                         "jobs use it or end: free NVMe copies of job '%s', or lower those guarantees (tierctl quota "
                         "set --nvme-min)", freeb, cap, kept, who[0] ? who : "other jobs", t->name, j->name, need, own,
                         job_claims_room(j) ? "" : ", none while it lingers", j->name);
                return -ENOSPC;
        }
        case SPACE_TOTAL:
        case SPACE_TOTAL_OVER: {
                uint64_t want = tier == LEVEL_NVME ? ALIGN_UP(t->alloc_size, r->nvme->extent_size) : t->alloc_size;
                bool over = false;
                const JobTotal *jt = total_exceeded(r, j, tier, want, &over);
                char whom[64], tot[SIZE_FORMAT_MAX], inuse[SIZE_FORMAT_MAX], from[160], set[96];
                unsigned n_jobs = 0;

                if (!jt) {
                        snprintf(buf, size, "no %s space for tensor '%s' (%s) within its uid's and groups' totals",
                                 tn, t->name, need);
                        return -EDQUOT;
                }
                (void) snprintf(whom, sizeof(whom), jt->kind == QUOTA_UID ? "uid %" PRIu32 : "group %" PRIu32, jt->id);
                size_format(tot, sizeof(tot), jt->total[tier]);
                size_format(inuse, sizeof(inuse), total_used(r, jt, tier, &n_jobs));
                if (jt->from_share & (1u << tier))
                        (void) snprintf(from, sizeof(from), "[%s] uid_share, %u %% of %s", tn,
                                        tier == LEVEL_HOST ? r->config->host_uid_share :
                                        tier == LEVEL_VRAM ? r->config->vram_uid_share : r->config->nvme_uid_share, cap);
                else
                        (void) snprintf(from, sizeof(from), "%s_total of its [quota]", tn);
                (void) snprintf(set, sizeof(set), "tierctl quota set --%s %" PRIu32 " --%s-total SIZE",
                                jt->kind == QUOTA_UID ? "uid" : "group", jt->id, tn);
                if (over)
                        snprintf(buf, size, "tensor '%s' (%s) is larger than the %s total of %s (%s: %s): it can never "
                                 "be there; an admin raises it (%s)", t->name, need, tn, whom, tot, from, set);
                else
                        snprintf(buf, size, "%s is at its %s total: its %u job(s) use %s of %s (%s); tensor '%s' of "
                                 "job '%s' needs %s more: unpin or free something in them, or an admin raises the "
                                 "total (%s)", whom, tn, n_jobs, inuse, tot, from, t->name, j->name, need, set);
                return -EDQUOT;
        }
        default:
                snprintf(buf, size, "no %s space for tensor '%s' (%s)", tn, t->name, need);
                return -ENOSPC;
        }
}
