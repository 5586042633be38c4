/* SPDX-License-Identifier: MIT */
/* reclaim.c: capacity that flows between jobs: room taken back from lingering jobs and jobs above their share. */

/*
 * Theory of operation.
 *
 * Each job has, per tier, a guaranteed minimum (Job.guarantee) and a hard
 * maximum (Job.limit).  Between them, free segments go to whoever asks
 * (copy_alloc() takes them from the pool up to the job's maximum).  When the
 * pool has none left (SPACE_POOL), the requester may take room back:
 *
 *   share(j)   for a job with a connection: its weighted part of the tier,
 *              capacity * weight / (sum of the weights of the jobs with a
 *              connection), at least its guarantee and at most its maximum;
 *              for a lingering job (no connection left): 0, so that its
 *              copies are the first to go when a live job needs room.
 *
 * A requester still below its share after this copy takes from the others:
 * lingering jobs first, then the jobs furthest above their share (bytes
 * over it / weight), never below their share (so never below a guarantee).
 * A requester still within its guarantee after this copy is owed the room:
 * it takes from the live jobs above their own guarantee, those furthest
 * above their share first, down to their guarantee (shares are parts of
 * the capacity by weight, which do not leave room for the guarantees of
 * others: without this a job at its share kept a guaranteed job below its
 * minimum, which evicted its own copies instead).  A requester at or above
 * its share, and past its guarantee, makes room among its own copies, as
 * always (make_space() in op.c).
 *
 * Memory reaches jobs in whole segments, so room comes back a segment at a
 * time: of the victim job's segments, the one whose most valuable copy is
 * least valuable goes (the rank of each copy in the scheduler's victim
 * order: Belady's next use under the timeline policy, LRU otherwise; a
 * segment holding anything pinned, in a transfer or used by an op is not
 * chosen, nor one of a job whose rollback waits for its transfers, Job.frozen:
 * the requester waits for that job to thaw).  Its copies are dropped when another copy is valid, or drained
 * (written down first) when sole; once the segment is empty, take_segment()
 * (state/space.c) hands it to the requester, by way of the renewer (its
 * memory is replaced first, tiers/renew.c): while segments are renewing,
 * or being emptied, the requester waits for them rather than empty more.  A VRAM chunk may also hold
 * ranges given back that stay taken while a client's event is pending on
 * them (parked, SegPoolOps.park: Segment.parked bytes): they cannot be
 * emptied, and the chunk comes back only once the event completes, which
 * may be never.  So a chunk holding nothing else is not chosen (the victim's
 * other chunks are), and one holding copies too only after every chunk
 * without parked ranges.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/base/log.h"
#include "daemon/engine/engine-private.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"
#include "util/size.h"

static bool job_live(const Job *j) {
        return j->n_conns > 0 && !j->dying;
}

uint64_t engine_job_share(const Engine *e, const Job *j, int tier) {
        const Registry *r = e->registry;
        uint64_t wsum = 0, share;

        if (tier < 0 || tier >= TIERS || !job_live(j))
                return 0;
        list_for_each_safe(node, tmp, &r->jobs) {
                const Job *o = list_entry(node, Job, link);

                if (job_live(o))
                        wsum += MAX(o->weight, 1u);
        }
        if (wsum == 0)
                return 0;
        share = (uint64_t) ((double) r->capacity[tier] * (double) MAX(j->weight, 1u) / (double) wsum);
        share = MAX(share, j->guarantee[tier]);
        return MIN(share, j->limit[tier]);
}

static bool copy_in_segment(const Copy *c, const Segment *s) {
        for (uint32_t i = 0; i < c->n_pieces; i++)
                if (c->pieces[i].seg == s)
                        return true;
        return false;
}

/*
 * Is @s a better segment to empty than @than?  One without parked ranges
 * first (emptied, it comes back at once; one with them only once their
 * events complete), then the one whose most valuable copy ranks lowest
 * (@worst), then the one holding the fewest bytes to empty.
 */
static bool segment_before(const Segment *s, const Segment *than, const size_t *worst) {
        if ((s->parked > 0) != (than->parked > 0))
                return than->parked > 0;
        if (worst[s->id] != worst[than->id])
                return worst[s->id] < worst[than->id];
        return s->used - s->parked < than->used - than->parked;
}

/*
 * The segment of @v's in @tier to empty: the one whose most valuable copy
 * ranks lowest in the victim order (segment_before()), holding at most @most
 * bytes to empty (parked ranges, SegPoolOps.park, are none: they stay taken
 * until a client's event completes).  NULL if every segment holds something
 * that cannot go now, more than that, or nothing but parked ranges.
 */
static Segment *choose_segment(Engine *e, Op *op, Job *v, int tier, uint64_t most) {
        SegPool *pool = e->registry->pools[tier];
        _cleanup_free_ Tensor **cands = NULL;
        _cleanup_free_ size_t *worst = NULL;    /* per segment id: highest rank + 1, SIZE_MAX: cannot go */
        Segment *best = NULL;
        size_t n = 0, k;

        worst = calloc(pool->n_segs, sizeof(size_t));
        if (!worst || engine_victims(e, v, tier, NULL, &cands, &n) < 0)
                return NULL;
        /* a segment holding a copy that cannot go now cannot be emptied */
        list_for_each_safe(node, tmp, &e->registry->lru[tier]) {
                Copy *c = list_entry(node, Copy, lru);
                Tensor *t = container_of(c, Tensor, copy[tier]);

                if (t->job != v || copy_evictable(t, tier))
                        continue;
                for (uint32_t i = 0; i < c->n_pieces; i++)
                        worst[c->pieces[i].seg->id] = SIZE_MAX;
        }
        /*
         * The order the requester's own victims would go in (EngineSchedOps.victim_order's
         * contract: cands[0..k) may go, best first; cands[k..n) are needed no later than the
         * requester's deadline and must stay, and so must their segments).
         */
        k = e->sched && e->sched->victim_order ?
                e->sched->victim_order(e->sched_userdata, tier, cands, n, op->deadline_ns) : n;
        for (size_t i = k; i < n; i++)          /* filtered out: needed sooner than the requester */
                for (uint32_t p = 0; p < cands[i]->copy[tier].n_pieces; p++)
                        worst[cands[i]->copy[tier].pieces[p].seg->id] = SIZE_MAX;
        for (size_t i = 0; i < k; i++) {
                const Copy *c = &cands[i]->copy[tier];

                for (uint32_t p = 0; p < c->n_pieces; p++) {
                        size_t *w = &worst[c->pieces[p].seg->id];

                        if (*w != SIZE_MAX)
                                *w = MAX(*w, i + 1);
                }
        }
        list_for_each_safe(node, tmp, &v->segments[tier]) {
                Segment *s = list_entry(node, Segment, owner_link);

                /* only parked ranges left: nothing to empty, it comes back once their events complete */
                if (s->used <= s->parked || s->used - s->parked > most || s->revoking ||
                    worst[s->id] == SIZE_MAX)
                        continue;
                if (!best || segment_before(s, best, worst))
                        best = s;
        }
        return best;
}

typedef struct Victim {
        Job *job;
        double over;            /* bytes above its share / weight; lingering jobs: infinite */
        uint64_t keep;          /* bytes it keeps: its share, or its guarantee for a requester owed room; lingering: 0 */
} Victim;

static int victim_cmp(const void *a, const void *b) {
        const Victim *x = a, *y = b;

        return x->over > y->over ? -1 : x->over < y->over;
}

int reclaim(Engine *e, Op *op, Tensor *want, int tier) {
        Registry *r = e->registry;
        Job *j = want->job;
        _cleanup_free_ Victim *vs = NULL;
        _cleanup_free_ uint64_t *inflight = NULL;     /* per segment id: bytes of copies being drained */
        uint64_t need = want->alloc_size, mine, coming = 0;
        bool frozen = false, owed;
        size_t n = 0;

        if (tier == LEVEL_NVME || !r->pools[tier])
                return -ENOSPC;
        mine = engine_job_share(e, j, tier);
        owed = job_live(j) && j->used[tier] + need <= j->guarantee[tier];
        vs = calloc(r->n_jobs + 1, sizeof(Victim));
        if (!vs)
                return -ENOMEM;
        list_for_each_safe(node, tmp, &r->jobs) {
                Job *o = list_entry(node, Job, link);
                uint64_t share;

                if (o == j || o->used[tier] == 0 || n >= r->n_jobs)
                        continue;
                uint64_t keep;

                if (!job_live(o)) {
                        vs[n++] = (Victim) { o, INFINITY, 0 };
                        continue;
                }
                /*
                 * live jobs give back only to a requester below its share, and only what is above theirs;
                 * to one within its guarantee, what is above their own guarantee
                 */
                share = engine_job_share(e, o, tier);
                keep = owed ? o->guarantee[tier] : share;
                if ((!owed && j->used[tier] + need > mine) || o->used[tier] <= keep)
                        continue;
                vs[n++] = (Victim) { o, ((double) o->used[tier] - (double) share) / (double) MAX(o->weight, 1u),
                                     keep };
        }
        if (n == 0)
                return -ENOSPC;
        qsort(vs, n, sizeof(Victim), victim_cmp);

        /*
         * Segments of the victims being emptied already (all that is left in them
         * is being written down), and segments emptied and given back that the
         * renewer is replacing (segpool_release(): out of service until then):
         * wait for them rather than empty more.
         */
        coming = (uint64_t) r->pools[tier]->n_renewing * r->pools[tier]->seg_size;
        inflight = calloc(r->pools[tier]->n_segs, sizeof(uint64_t));
        if (!inflight)
                return -ENOMEM;
        list_for_each_safe(node, tmp, &r->lru[tier]) {
                Copy *c = list_entry(node, Copy, lru);

                if (c->state == COPY_DRAINING)
                        for (uint32_t p = 0; p < c->n_pieces; p++)
                                inflight[c->pieces[p].seg->id] += ALIGN_UP(c->pieces[p].span, SEG_UNIT);
        }
        for (size_t i = 0; i < n; i++)
                list_for_each_safe(node, tmp, &vs[i].job->segments[tier]) {
                        Segment *s = list_entry(node, Segment, owner_link);

                        if (s->used > 0 && inflight[s->id] == s->used)
                                coming += s->pool->seg_size;
                }
        if (coming >= need)
                return ADV_WAIT_SPACE;

        for (size_t i = 0; i < n; i++) {
                Job *v = vs[i].job;
                /* a live job keeps its share (or guarantee): only a segment holding no more than it has above */
                Segment *s = choose_segment(e, op, v, tier, job_live(v) ? v->used[tier] -
                                            MIN(v->used[tier], vs[i].keep) : UINT64_MAX);
                uint64_t freed = 0, started = 0;
                unsigned blocked = 0;
                char used[SIZE_FORMAT_MAX], size[SIZE_FORMAT_MAX];

                if (!s) {
                        /* a job whose rollback waits owes its room still: it can go once the job thaws */
                        frozen = frozen || v->frozen > 0;
                        continue;
                }
                size_format(used, sizeof(used), s->used - s->parked);
                size_format(size, sizeof(size), s->pool->seg_size);
                log_debug("Job '%s' needs room in %s: a %s segment of job '%s' (%s in use) is emptied for it (%s)",
                          j->name, level_to_string(tier), size, v->name, used,
                          !job_live(v) ? "lingering" : owed ? "owed: within its guarantee" : "above its share");
                list_for_each_safe(node, tmp, &r->lru[tier]) {
                        Copy *c = list_entry(node, Copy, lru);
                        Tensor *t = container_of(c, Tensor, copy[tier]);
                        int q;

                        if (t->job != v || !copy_in_segment(c, s) || !copy_evictable(t, tier))
                                continue;
                        q = victim_evict(e, t, tier, TRACE_F_RECLAIM, &freed, &started, &blocked);
                        if (q < 0)
                                return q;
                }
                if (freed > 0)
                        return ADV_RETRY;
                if (started > 0)
                        return ADV_WAIT_SPACE;
        }
        /* (the thaw wakes the waiters: ipc/commit.c) */
        return coming > 0 || frozen ? ADV_WAIT_SPACE : -ENOSPC;
}

/*
 * Room under a total.  Jobs held to one total (all the jobs of a uid, or of
 * the members of a group) share it as jobs share the pool: a requester whose
 * copy would take the total above itself takes room back from the others
 * under it, lingering ones first (their copies are kept for a rank that may
 * come back, written down to NVMe when sole, as a pool reclaim does), then
 * live ones holding more than their part of the total (the total over the
 * live jobs under it, by weight), and only while the requester stays within
 * its own part.  Copies go least recently used first; a pinned one, one in a
 * transfer or one of a job whose rollback waits is not touched.  Without this
 * a job whose sibling's cache filled the total got -EDQUOT, and a plan died
 * of it, for room that was only cached.
 */
static uint64_t total_part(const Registry *r, const JobTotal *jt, const Job *j, int tier) {
        uint64_t wsum = 0;

        list_for_each_safe(node, tmp, (List *) &r->jobs) {
                const Job *o = list_entry(node, Job, link);

                if (job_live(o) && total_covers(jt, o))
                        wsum += MAX(o->weight, 1u);
        }
        if (wsum == 0 || !job_live(j))
                return 0;
        return (uint64_t) ((double) jt->total[tier] * (double) MAX(j->weight, 1u) / (double) wsum);
}

int reclaim_total(Engine *e, Tensor *want, int tier) {
        Registry *r = e->registry;
        Job *j = want->job;
        uint64_t need = want->alloc_size, freed = 0, draining = 0;
        const JobTotal *jt;
        unsigned blocked = 0;
        bool over = false, below;

        if (tier == LEVEL_NVME)
                return -ENOSPC;         /* nothing below NVMe to write to */
        jt = total_exceeded(r, j, tier, need, &over);
        if (!jt || over)
                return -ENOSPC;
        below = j->used[tier] + need <= total_part(r, jt, j, tier);
        /* lingering jobs first (pass 0), then live ones above their part (pass 1) */
        for (int pass = 0; pass < 2 && freed + draining < need; pass++)
                list_for_each_safe(node, tmp, &r->lru[tier]) {
                        Copy *c = list_entry(node, Copy, lru);
                        Tensor *t = container_of(c, Tensor, copy[tier]);
                        Job *o = t->job;
                        int q;

                        if (freed + draining >= need)
                                break;
                        if (o == j || !total_covers(jt, o) || !copy_evictable(t, tier) || job_live(o) != (pass == 1))
                                continue;
                        if (pass == 1 && (!below || o->used[tier] <= total_part(r, jt, o, tier)))
                                continue;
                        q = victim_evict(e, t, tier, TRACE_F_RECLAIM, &freed, &draining, &blocked);
                        if (q < 0)
                                return q;
                }
        if (freed > 0)
                return ADV_RETRY;
        if (draining > 0)
                return ADV_WAIT_SPACE;
        return -ENOSPC;
}

/*
 * Room kept for guarantees.  Reclaim gives a job below its guarantee only
 * what others hold unpinned: a segment holding a pinned copy is never
 * emptied.  So what a job pins beyond its own guarantee must come out of
 * the room the live jobs' guarantees leave: per tier, the sum over the jobs
 * with a connection of max(held, guarantee) stays within the capacity,
 * held being the job's segments that hold a pinned copy or one being
 * filled (reclaim cannot empty them), whole segments, as reclaim moves
 * room.  A pin that would take its job's term up past that is refused as a
 * pin short of room is (-EAGAIN); a pin within the job's own guarantee
 * never is.  Nothing is counted, and nothing refused, while no other live
 * job has a guarantee in the tier.
 */
static bool copy_holds_room(const Copy *c) {
        return c->pins > 0 || c->state == COPY_FILLING;
}

/* Does another live job than @j have a guarantee in @tier? */
static bool others_guaranteed(const Registry *r, const Job *j, int tier) {
        list_for_each_safe(node, tmp, (List *) &r->jobs) {
                const Job *o = list_entry(node, Job, link);

                if (o != j && job_live(o) && o->guarantee[tier] > 0)
                        return true;
        }
        return false;
}

/* Append "'name' (guarantee, held of it pinned)" of live job @o to @who (@len used), as its room is kept. */
static void name_kept(char *who, size_t size, size_t *len, const Job *o, uint64_t guarantee, uint64_t h) {
        char g[SIZE_FORMAT_MAX], p[SIZE_FORMAT_MAX];
        int k;

        if (*len >= size)
                return;
        size_format(g, sizeof(g), guarantee);
        size_format(p, sizeof(p), h);
        k = snprintf(who + *len, size - *len, "%s'%s' (%s, %s of it pinned)", *len ? ", " : "", o->name, g, p);
        if (k > 0)
                *len = MIN(size - 1, *len + (size_t) k);
}

/*
 * The check of engine_pin_check() and engine_pin_check_reclaim().  A copy not
 * placed yet counts for the least it can take: the job's pinned bytes and its
 * own in whole segments, and a segment more with @new_segment (what reclaim
 * would hand over: it holds nothing pinned), so that a pin refused wherever
 * its room were made is refused before anything is evicted for it.
 */
static int pin_check(const Engine *e, const Tensor *t, int tier, bool new_segment, char *buf, size_t size) {
        const Registry *r = e ? e->registry : NULL;
        const SegPool *pool = r && tier >= 0 && tier < TIERS && tier != LEVEL_NVME ? r->pools[tier] : NULL;
        const Copy *mine = pool ? &t->copy[tier] : NULL;
        const Job *j = t->job;
        _cleanup_free_ bool *held = NULL;
        uint64_t seg_size, before = 0, after, sum, pinned = t->alloc_size;
        char who[256], cap[SIZE_FORMAT_MAX], now_b[SIZE_FORMAT_MAX], then_b[SIZE_FORMAT_MAX], own[SIZE_FORMAT_MAX];
        size_t len = 0;

        if (!pool || mine->pins > 0 || (new_segment && mine->n_pieces > 0) || !others_guaranteed(r, j, tier))
                return 0;
        held = calloc(pool->n_segs, sizeof(bool));
        if (!held)
                return -ENOMEM;
        list_for_each_safe(node, tmp, (List *) &r->lru[tier]) {
                const Copy *c = list_entry(node, Copy, lru);

                if (c == mine || !copy_holds_room(c))
                        continue;
                for (uint32_t p = 0; p < c->n_pieces; p++)
                        held[c->pieces[p].seg->id] = true;
                if (container_of(c, Tensor, copy[tier])->job == j)
                        pinned += container_of(c, Tensor, copy[tier])->alloc_size;
        }
        seg_size = pool->seg_size;
        list_for_each_safe(node, tmp, (List *) &j->segments[tier])
                before += held[list_entry(node, Segment, owner_link)->id] ? seg_size : 0;
        after = before;
        for (uint32_t p = 0; p < mine->n_pieces; p++)
                if (!held[mine->pieces[p].seg->id]) {
                        held[mine->pieces[p].seg->id] = true;
                        after += seg_size;
                }
        if (mine->n_pieces == 0)
                after = MAX(before + (new_segment ? seg_size : 0), ALIGN_UP(pinned, seg_size));
        if (after == before || after <= j->guarantee[tier])
                return 0;
        sum = MAX(after, j->guarantee[tier]);
        who[0] = '\0';
        list_for_each_safe(node, tmp, (List *) &r->jobs) {
                const Job *o = list_entry(node, Job, link);
                uint64_t h = 0;

                if (o == j || !job_live(o))
                        continue;
                list_for_each_safe(sn, stmp, (List *) &o->segments[tier])
                        h += held[list_entry(sn, Segment, owner_link)->id] ? seg_size : 0;
                sum += MAX(h, o->guarantee[tier]);
                if (h < o->guarantee[tier])
                        name_kept(who, sizeof(who), &len, o, o->guarantee[tier], h);
        }
        if (sum <= r->capacity[tier])
                return 0;
        if (buf && size > 0) {
                size_format(cap, sizeof(cap), r->capacity[tier]);
                size_format(now_b, sizeof(now_b), before);
                size_format(then_b, sizeof(then_b), after);
                size_format(own, sizeof(own), j->guarantee[tier]);
                (void) snprintf(buf, size, "the %s room job '%s' may pin is used: tensor '%s' would take what it pins "
                                "there from %s to %s%s (in whole segments), beyond its own guarantee (%s), and the "
                                "rest of the %s tier is kept for the guaranteed minimum of %s; retry later (when "
                                "such a job ends), or unpin something", level_to_string(tier), j->name, t->name,
                                now_b, mine->n_pieces ? "" : "at least ", then_b, own, cap,
                                who[0] ? who : "the other live jobs");
        }
        return -EAGAIN;
}

int engine_pin_check(const Engine *e, const Tensor *t, int tier, char *buf, size_t size) {
        return pin_check(e, t, tier, false, buf, size);
}

int engine_pin_check_reclaim(const Engine *e, const Tensor *t, int tier, char *buf, size_t size) {
        return pin_check(e, t, tier, true, buf, size);
}

int engine_pins_fit_kept(const Engine *e, const Job *j, int tier, uint64_t bytes, char *buf, size_t size) {
        const Registry *r = e ? e->registry : NULL;
        const SegPool *pool = r && tier >= 0 && tier < TIERS && tier != LEVEL_NVME ? r->pools[tier] : NULL;
        uint64_t need, kept = 0;
        char who[256], b_need[SIZE_FORMAT_MAX], b_own[SIZE_FORMAT_MAX], b_cap[SIZE_FORMAT_MAX];
        char b_kept[SIZE_FORMAT_MAX];
        size_t len = 0;

        if (!pool)
                return 0;
        need = ALIGN_UP(bytes, pool->seg_size);
        if (need <= j->guarantee[tier])
                return 0;               /* within its own guarantee: never refused */
        who[0] = '\0';
        list_for_each_safe(node, tmp, (List *) &r->jobs) {
                const Job *o = list_entry(node, Job, link);

                if (o == j || !job_live(o) || o->guarantee[tier] == 0)
                        continue;
                kept += o->guarantee[tier];
                if (len < sizeof(who)) {
                        char g[SIZE_FORMAT_MAX];
                        int k;

                        size_format(g, sizeof(g), o->guarantee[tier]);
                        k = snprintf(who + len, sizeof(who) - len, "%s'%s' (%s)", len ? ", " : "", o->name, g);
                        if (k > 0)
                                len = MIN(sizeof(who) - 1, len + (size_t) k);
                }
        }
        if (need + kept <= r->capacity[tier])
                return 0;
        if (buf && size > 0) {
                size_format(b_need, sizeof(b_need), need);
                size_format(b_own, sizeof(b_own), j->guarantee[tier]);
                size_format(b_cap, sizeof(b_cap), r->capacity[tier]);
                size_format(b_kept, sizeof(b_kept), kept);
                (void) snprintf(buf, size, "job '%s' would pin %s in %s at once (in whole segments), beyond its own "
                                "guarantee (%s), and %s of the %s tier are kept for the guaranteed minimum of %s "
                                "while they run: that never fits then; make the phase smaller, or lower those "
                                "guarantees (host_min, vram_min: tierd.conf(5), tierctl quota)", j->name, b_need,
                                level_to_string(tier), b_own, b_kept, b_cap, who);
        }
        return -ENOSPC;
}
