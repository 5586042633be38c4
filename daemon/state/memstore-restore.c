/* SPDX-License-Identifier: MIT */
/* memstore-restore.c: the memory store puts the last run's copies back, tensor by tensor, as the NVMe index restores them. */

#include <stdlib.h>
#include <string.h>

#include "daemon/base/level.h"
#include "daemon/base/log.h"
#include "daemon/state/memstore-private.h"
#include "daemon/state/memstore.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"

static const MsRecord *find_old(const MemStore *ms, uint64_t job_key, uint64_t tensor_key) {
        MsRecord key = { .job_key = job_key, .tensor_key = tensor_key };

        return ms->n_old ? bsearch(&key, ms->old, ms->n_old, sizeof(MsRecord), ms_by_keys) : NULL;
}

static uint64_t effective(const MsCopy *c) {
        return c->state == MS_WRITING ? c->version + 1 : c->state == MS_VALID ? c->version : 0;
}

void memstore_prepare(MemStore *ms, Registry *r) {
        bool *taken;
        unsigned n = 0;

        if (!ms || !ms->usable)
                return;
        taken = calloc(MAX(ms->n_old, (size_t) 1), sizeof(bool));
        if (!taken) {
                log_warning("Memory store: out of memory sorting out the last run's table: its memory is not used");
                ms->usable = false;     /* (nothing claimed yet: memstore_begin() renews every segment) */
                return;
        }
        list_for_each_safe(jn, jtmp, &r->jobs) {
                Job *j = list_entry(jn, Job, link);

                list_for_each_safe(tn, ttmp, &j->tensors) {
                        const Tensor *t = list_entry(tn, Tensor, job_link);
                        const MsRecord *rec = t->book_key && j->book_key ? find_old(ms, j->book_key, t->book_key)
                                                                         : NULL;

                        if (rec && rec->alloc_size == t->alloc_size)
                                taken[rec - ms->old] = true;    /* (memstore_restore() keeps its rooms) */
                }
        }
        for (size_t i = 0; i < ms->n_old; i++)
                for (int k = 0; !taken[i] && k < MS_TIERS; k++) {
                        const MsCopy *mc = &ms->old[i].copy[k];

                        for (uint32_t p = 0; mc->state == MS_WRITING && p < mc->n_pieces && p < MS_MAX_PIECES; p++) {
                                uint32_t seg = mc->pieces[p].seg;

                                if (seg >= ms->n_segs[k] || !ms->adopted[k][seg] || ms->spoiled[k][seg])
                                        continue;
                                ms->spoiled[k][seg] = true;
                                n++;
                        }
                }
        free(taken);
        if (n > 0)
                log_warning("Memory store: %u segment(s) hold a copy that was held for writing when tierd went, "
                            "of a tensor not restored as it was (not in the NVMe index, of another size, or more "
                            "than [limits] max_tensors): a process of before may still write there, so their "
                            "memory is not used again, and the tensors with copies there lose those", n);
}

/* Put one copy back: its segments claimed for the job, its ranges reserved.  false: it cannot be. */
static bool restore_copy(MemStore *ms, Registry *r, Tensor *t, int tier, const MsCopy *mc, uint64_t version) {
        int k = ms_tier(tier);
        SegPool *pool = r->pools[tier];
        Copy *c = &t->copy[tier];
        CopyPiece *pieces;
        uint64_t total = 0;
        uint32_t got = 0;

        if (!pool || mc->n_pieces == 0 || mc->n_pieces > MS_MAX_PIECES || c->state != COPY_ABSENT)
                return false;
        pieces = mc->n_pieces == 1 ? &c->one : calloc(mc->n_pieces, sizeof(CopyPiece));
        if (!pieces)
                return false;
        for (; got < mc->n_pieces; got++) {
                const MsPiece *p = &mc->pieces[got];
                uint64_t align = mc->n_pieces > 1 ? pool->piece_align : SEG_UNIT;
                uint64_t span = p->len == pool->seg_size ? pool->seg_size : ALIGN_UP(p->len, align);
                Segment *s;

                if (p->seg >= pool->n_segs || p->seg >= ms->n_segs[k] || !ms->adopted[k][p->seg] ||
                    ms->spoiled[k][p->seg] || p->offset % SEG_UNIT != 0 ||
                    p->len == 0 || p->offset + span > pool->seg_size)
                        break;
                s = &pool->segs[p->seg];
                if (s->owner != t->job && segpool_claim(pool, s, t->job, &t->job->segments[tier]) < 0)
                        break;
                if (segment_reserve(s, p->offset, span) < 0)
                        break;
                pieces[got] = (CopyPiece) { .seg = s, .offset = p->offset, .len = p->len, .span = span };
                total += p->len;
        }
        if (got < mc->n_pieces || total != t->alloc_size) {
                for (uint32_t i = 0; i < got; i++)
                        segment_free(pieces[i].seg, pieces[i].offset, pieces[i].span);
                if (pieces != &c->one)
                        free(pieces);
                c->one = (CopyPiece) {};
                log_warning("Tensor '%s' of job '%s': its %s copy in the memory store does not fit the pool as it "
                            "is (a piece out of range, claimed twice, of another size, or in a segment not used "
                            "again): not put back",
                            t->name, t->job->name, ms_tier_names[k]);
                return false;
        }
        c->pieces = pieces;
        c->n_pieces = mc->n_pieces;
        copy_set_state(t, tier, COPY_RESIDENT);
        c->version = version;
        copy_account(t, tier, (int64_t) t->alloc_size);
        copy_touch(t, tier);
        return true;
}

/* @t's copy in @tier (@mc, of @rec's copy @k), held for writing when tierd went, stays pinned for its ranks. */
static void ghost_pin(Tensor *t, int tier, const MsRecord *rec, int k) {
        const MsCopy *mc = &rec->copy[k];

        t->copy[tier].pins++;
        t->copy[tier].writer_rank = mc->writer_rank;
        t->ghost_ranks[tier].n = mc->n_ranks > RANK_SET_MAX ? RANK_SET_MANY : mc->n_ranks;
        memcpy(t->ghost_ranks[tier].rank, rec->ranks[k], sizeof(rec->ranks[k]));
        tensor_pin_account(t, tier, +1);
        t->ghost |= (uint8_t) (1u << tier);
}

/*
 * The rooms of @rec's copies held for writing that are not put back as data (older than the newest,
 * or the tensor is not put back): a process of before may still write into them through its mapping,
 * so they stay reserved and pinned for its ranks (Tensor.ghost_room), never read, until their Hellos.
 */
static void restore_rooms(MemStore *ms, Registry *r, Tensor *t, const MsRecord *rec) {
        for (int k = 0; k < MS_TIERS; k++) {
                const MsCopy *mc = &rec->copy[k];
                int tier = k == MS_HOST ? LEVEL_HOST : LEVEL_VRAM;

                if (mc->state != MS_WRITING || t->copy[tier].state != COPY_ABSENT ||
                    !restore_copy(ms, r, t, tier, mc, effective(mc)))
                        continue;
                t->copy[tier].unwritten = true;         /* (none of the tensor's bytes) */
                ghost_pin(t, tier, rec, k);
                t->ghost_room |= (uint8_t) (1u << tier);
                log_notice("Tensor '%s' of job '%s': its %s copy was held for writing when tierd went but is not "
                           "its newest: its room stays held for the clients of before until they attach again",
                           t->name, t->job->name, ms_tier_names[k]);
        }
}

bool memstore_restore(MemStore *ms, Registry *r, Tensor *t, uint64_t newest) {
        const MsRecord *rec;
        uint64_t best = 0;
        int writing = 0;
        bool any = false;

        if (!ms || !ms->usable || !t->book_key || !t->job->book_key)
                return false;
        rec = find_old(ms, t->job->book_key, t->book_key);
        if (!rec || rec->alloc_size != t->alloc_size)
                return false;
        for (int k = 0; k < MS_TIERS; k++)
                best = MAX(best, effective(&rec->copy[k]));
        /* (one held for writing below the newest is a ghost's room since overtaken: restore_rooms()) */
        for (int k = 0; k < MS_TIERS; k++)
                writing += rec->copy[k].state == MS_WRITING && effective(&rec->copy[k]) == best;
        if (best == 0 || best < newest) {
                restore_rooms(ms, r, t, rec);
                return false;   /* nothing, or older than what the index heard of: not the newest */
        }
        if (writing > 1) {
                log_warning("Tensor '%s' of job '%s' was held for writing in host and VRAM at once when tierd went: "
                            "which holds the newest data is not known, it is lost", t->name, t->job->name);
                restore_rooms(ms, r, t, rec);
                return false;
        }
        /* the newest copies only (a valid copy of the version below one being written is stale) */
        for (int k = 0; k < MS_TIERS; k++) {
                const MsCopy *mc = &rec->copy[k];
                int tier = k == MS_HOST ? LEVEL_HOST : LEVEL_VRAM;

                if (effective(mc) != best)
                        continue;
                if (!restore_copy(ms, r, t, tier, mc, best))
                        continue;
                any = true;
                if (mc->state == MS_WRITING) {
                        /*
                         * the clients may still be writing into it: nothing moves it until the Hello of
                         * each rank that held it for writing, or the job's end (job_release_ghosts(); in a
                         * table of before the ranks were kept: any rank's), which says whether a write-only
                         * pin's grant reached it
                         */
                        ghost_pin(t, tier, rec, k);
                        if (mc->flags & MS_C_UNWRITTEN) {
                                /* its room holds the tensor's bytes only if that pin wrote: no read's (op.c) */
                                t->copy[tier].unwritten = true;
                                t->ghost_unwritten |= (uint8_t) (1u << tier);
                                t->ghost_rank = mc->writer_rank;
                        }
                        if (mc->flags & MS_C_DEAD_BEFORE) {
                                t->ghost_dead_before = true;
                                t->dead_rank = rec->dead_rank;  /* whose plan made it dead, if it goes back to dead */
                        }
                }
        }
        if (!any) {
                restore_rooms(ms, r, t, rec);
                return false;
        }
        /*
         * A write-only pin's copy may come to nothing (job_release_ghosts()): the
         * copies of the version before come back too, stale until then (and kept:
         * tensor_free_stale() passes over them), to be the tensor's again then.
         */
        for (int k = 0; t->ghost_unwritten && k < MS_TIERS; k++) {
                const MsCopy *mc = &rec->copy[k];
                int tier = k == MS_HOST ? LEVEL_HOST : LEVEL_VRAM;

                if (mc->state == MS_VALID && mc->version == best - 1)
                        (void) restore_copy(ms, r, t, tier, mc, mc->version);
        }
        restore_rooms(ms, r, t, rec);
        /* an NVMe copy restored from the index is stale when memory holds a newer version */
        t->version = best;
        t->lost = false;
        t->dead = false;
        if (t->copy[LEVEL_NVME].state != COPY_ABSENT && t->copy[LEVEL_NVME].version != best)
                t->book_state = BOOK_T_NEWER;
        else if (t->copy[LEVEL_NVME].state == COPY_ABSENT)
                t->book_state = BOOK_T_NEWER;
        ms->restored++;
        return true;
}

bool memstore_was_dead(MemStore *ms, const Tensor *t, uint64_t newest, uint32_t *ret_dead_rank) {
        const MsRecord *rec;

        if (!ms || !ms->usable || !t->book_key || !t->job->book_key)
                return false;
        rec = find_old(ms, t->job->book_key, t->book_key);
        if (!rec || !(rec->flags & MS_F_DEAD) || rec->version < newest)
                return false;
        *ret_dead_rank = rec->dead_rank;
        return true;
}
