/* SPDX-License-Identifier: MIT */
/* tensor.c: the books of tensors and their copies: ids, names, versions, space, pins. */

/*
 * Theory of operation: tensors are found by id (job-local: slot index in
 * the low 32 bits, a generation in the high 32 bits so a stale id never
 * reaches a reused slot) or by name.  Each tensor has one Copy per tier
 * with a state and a data version; a copy is valid while its version is the
 * tensor's.  A client's dirty unpin bumps the version, which makes the
 * other copies stale; stale copies are freed as soon as nothing pins them.
 * Version 0 means "never written": all zeros, so no copy is needed to keep
 * it.
 *
 * The space a copy takes is counted here, per job and in all, and given
 * back by copy_free(), which tells the registry's ops (the engine: ops
 * waiting for space may retry).  A tensor freed while a transfer of it runs
 * is "doomed": it is no longer found, and tensor_release_copies(), called
 * again by the engine when the transfer ends, frees it.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/state/book.h"
#include "daemon/state/memstore.h"
#include "daemon/state/registry.h"
#include "daemon/state/tensormap.h"
#include "daemon/tiers/segpool.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/macro.h"
#include "util/time-util.h"

const char *copy_state_to_string(CopyState s) {
        static const char *const names[_COPY_STATE_MAX] = {
                [COPY_ABSENT] = "absent",
                [COPY_FILLING] = "filling",
                [COPY_RESIDENT] = "resident",
                [COPY_DRAINING] = "draining",
        };

        return s >= 0 && s < _COPY_STATE_MAX ? names[s] : "?";
}

bool copy_is_sole(const Tensor *t, int tier) {
        if (t->version == 0 || t->dead || !copy_valid(t, tier))
                return false;
        for (int i = 0; i < TIERS; i++)
                if (i != tier && copy_valid(t, i))
                        return false;
        return true;
}

bool copy_unsaved(const Tensor *t, int tier) {
        return tier != LEVEL_NVME && t->version != 0 && !t->dead && !t->lost && copy_valid(t, tier) &&
               !copy_valid(t, LEVEL_NVME);
}

int tensor_valid_tier(const Tensor *t, int below_or_at) {
        for (int i = 0; i <= below_or_at && i < TIERS; i++)
                if (copy_valid(t, i))
                        return i;
        return -1;
}

/* ---- ids and names ------------------------------------------------------------------ */

int tensor_new(Job *j, const char *name, uint64_t size, Tensor **ret) {
        Tensor *t;
        uint32_t slot;
        int r;

        if (j->n_tensors >= j->registry->config->max_tensors)
                return -EMFILE;
        if (tensormap_get(j->by_name, name))
                return -EEXIST;

        /*
         * the lowest free id slot, looked for from the first that may be free: from 0 every time, filling a
         * job cost n^2/2 looks (65536 tensors: 2.1e9)
         */
        for (slot = j->by_id_free; slot < j->by_id_cap; slot++) {
                j->by_id_looks++;
                if (!j->by_id[slot])
                        break;
        }
        if (slot == j->by_id_cap) {
                uint32_t cap = j->by_id_cap ? j->by_id_cap * 2 : 64;
                Tensor **n = realloc(j->by_id, cap * sizeof(Tensor *));

                if (!n)
                        return -ENOMEM;
                memset(n + j->by_id_cap, 0, (cap - j->by_id_cap) * sizeof(Tensor *));
                j->by_id = n;
                j->by_id_cap = cap;
        }

        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->job = j;
        t->size = size;
        t->alloc_size = ALIGN_UP(size, SEG_UNIT);
        t->id = ((uint64_t) ++j->next_gen << 32) | slot;
        list_init(&t->waiters);
        for (int i = 0; i < TIERS; i++) {
                list_init(&t->copy[i].lru);
                list_init(&t->copy[i].job_lru);
        }
        t->name = strdup(name);
        if (!t->name) {
                free(t);
                return -ENOMEM;
        }
        r = tensormap_put(j->by_name, t->name, t);
        if (r < 0) {
                free(t->name);
                free(t);
                return r;
        }
        j->by_id[slot] = t;
        j->by_id_free = slot + 1;
        list_add_tail(&j->tensors, &t->job_link);
        j->n_tensors++;
        book_tensor(j->registry->book, t);
        *ret = t;
        return 0;
}

Tensor *tensor_find(Job *j, uint64_t id) {
        uint32_t slot = (uint32_t) id;
        Tensor *t;

        if (slot >= j->by_id_cap)
                return NULL;
        t = j->by_id[slot];
        if (!t || t->id != id || t->doomed)
                return NULL;
        return t;
}

Tensor *tensor_find_name(Job *j, const char *name) {
        Tensor *t = tensormap_get(j->by_name, name);

        return t && !t->doomed ? t : NULL;
}

/* Final free, once no transfer references the tensor. */
/* Give back the NVMe image of @t's committed version (a commit made it needless, or @t goes). */
static void tensor_drop_image(Tensor *t) {
        Registry *r = t->job->registry;

        if (!t->base)
                return;
        copy_account(t, LEVEL_NVME, -(int64_t) ((uint64_t) t->n_base * r->nvme->extent_size));
        nvme_free(r->nvme, t->base, t->n_base);
        t->base = NULL;
        t->n_base = 0;
}

static void tensor_destroy_final(Tensor *t) {
        Job *j = t->job;

        /* its record in the memory store goes: one with no copy (a dead tensor's) has no copy_free() to do it */
        memstore_note(j->registry->memstore, t);
        tensor_drop_image(t);
        list_del(&t->job_link);
        j->n_tensors--;
        free(t->name);
        free(t);
        job_maybe_finish(j);
}

int tensor_free(Tensor *t) {
        Job *j = t->job;

        if (t->doomed)
                return -ENOENT;
        for (int i = 0; i < TIERS; i++)
                if (t->copy[i].pins > 0)
                        return -EBUSY;
        if (t->op_refs > 0 || t->plan_refs > 0)
                return -EBUSY;

        tensormap_remove(j->by_name, t->name);
        j->by_id[(uint32_t) t->id] = NULL;
        if ((uint32_t) t->id < j->by_id_free)
                j->by_id_free = (uint32_t) t->id;
        t->doomed = true;
        book_tensor_gone(j->registry->book, t);
        tensor_release_copies(t);       /* frees it now, or when its transfer ends */
        return 0;
}

void tensor_release_copies(Tensor *t) {
        if (t->xfer)
                return;         /* the engine comes back here when the transfer ends */
        for (int i = 0; i < TIERS; i++)
                copy_free(t, i);
        if (t->doomed)
                tensor_destroy_final(t);
}

/* ---- space ------------------------------------------------------------------------------ */

void copy_account(Tensor *t, int tier, int64_t delta) {
        t->job->used[tier] += (uint64_t) delta;
        t->job->registry->used[tier] += (uint64_t) delta;
}

void copy_touch(Tensor *t, int tier) {
        Copy *c = &t->copy[tier];

        c->last_use = now_usec();
        list_del(&c->lru);
        list_add_tail(&t->job->registry->lru[tier], &c->lru);
        list_del(&c->job_lru);
        list_add_tail(&t->job->lru[tier], &c->job_lru);
}

void copy_set_state(Tensor *t, int tier, CopyState state) {
        Copy *c = &t->copy[tier];

        if (c->state == COPY_DRAINING)
                t->job->draining[tier] -= t->alloc_size;
        if (state == COPY_DRAINING)
                t->job->draining[tier] += t->alloc_size;
        c->state = state;
}

void copy_free(Tensor *t, int tier) {
        Registry *r = t->job->registry;
        Copy *c = &t->copy[tier];

        if (c->state == COPY_ABSENT)
                return;
        if (tier == LEVEL_NVME && t->job->committing && !t->doomed && !t->base && t->version > 0 &&
            c->state != COPY_FILLING && c->version == t->commit_version) {
                /* the committed version's image, now that a newer one is written: kept for a rollback */
                t->base = c->extents;
                t->n_base = c->n_extents;
                c->extents = NULL;
                c->n_extents = 0;
                book_image(r->book, t);
        } else
                copy_release(t, tier);
        copy_set_state(t, tier, COPY_ABSENT);
        c->version = 0;
        c->writers = 0;
        c->unwritten = false;
        list_del(&c->lru);
        list_del(&c->job_lru);
        if (tier == LEVEL_NVME)
                book_version(r->book, t);       /* its NVMe copy was what the index had of it */
        else
                memstore_note(r->memstore, t);  /* before the range can be taken again */
        if (r->ops && r->ops->space_freed)
                r->ops->space_freed(r->ops_userdata, tier);
}

void tensor_free_stale(Tensor *t) {
        if (t->ghost_unwritten)
                return;         /* the version a write-only pin cut off by a restart may go back to */
        for (int i = 0; i < TIERS; i++) {
                Copy *c = &t->copy[i];

                if ((c->state == COPY_RESIDENT || c->state == COPY_DRAINING) &&
                    c->version != t->version && c->pins == 0 && !t->xfer)
                        copy_free(t, i);
        }
}

/* ---- commits ---------------------------------------------------------------------------- */

const char *tensor_lost_reason(const Tensor *t) {
        switch (t->lost_why) {
        case TENSOR_LOST_TARGET:
                return "its extents lie on an NVMe target that is no longer configured, or changed, since tierd stopped "
                       "(or are claimed twice)";
        case TENSOR_LOST_DAMAGED:
                return "the NVMe index was damaged when tierd started";
        case TENSOR_LOST_ROLLBACK:
                return "the rollback to its job's last commit found nothing of the committed version";
        case TENSOR_LOST_WRITE_ONLY:
                return "the write-only pin that reserved it before tierd restarted never reached its client, and "
                       "nothing held the version before";
        default:
                return "its newest data was in memory, not on NVMe, when tierd stopped";
        }
}

unsigned tensor_writers(const Tensor *t) {
        unsigned n = 0;

        for (int i = 0; i < TIERS; i++)
                n += t->copy[i].writers;
        return n;
}

bool tensor_needs_image(const Tensor *t) {
        return t->job->committing && !t->base && t->version > 0 && !t->dead && !t->commit_dead && !t->lost &&
               t->version == t->commit_version && !copy_valid(t, LEVEL_NVME);
}

void job_commit(Job *j, uint64_t step) {
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                tensor_drop_image(t);
                t->commit_version = t->version;
                t->commit_dead = t->dead;
                t->commit_dead_rank = t->dead ? t->dead_rank : 0;
        }
        j->committing = true;
        j->commit_step = step;
        book_commit(j->registry->book, j);
}

void tensor_commit_dead(Tensor *t, uint32_t rank) {
        t->commit_dead = true;
        t->commit_dead_rank = rank;
        book_commit_dead(t->job->registry->book, t);
}

/*
 * Why @t's ghost in @tier holds a commit (@commit) or a rollback back, for messages: the ranks it waits
 * for ("rank 1", "ranks 0, 1"), and till when; more ranks than fit are not known: the job's end.
 */
static void ghost_why(const Tensor *t, int tier, bool commit, char *buf, size_t size) {
        const RankSet *s = &t->ghost_ranks[MIN(tier, LEVEL_NVME - 1)];
        size_t at;

        if (s->n == RANK_SET_MANY) {
                snprintf(buf, size, "the clients of more than %d ranks of before tierd restarted, which may have "
                         "written it: which ranks is not known, so it is held until the job ends (its linger, or "
                         "tierctl detach)", RANK_SET_MAX);
                return;
        }
        if (s->n <= 1)  /* (n 0, a table of before: a write-only pin's waits for its rank, else any) */
                at = (size_t) snprintf(buf, size, "the client of rank %" PRIu32, s->n ? s->rank[0] : t->ghost_rank);
        else {
                at = (size_t) snprintf(buf, size, "the clients of ranks %" PRIu32, s->rank[0]);
                for (unsigned i = 1; i < s->n && at < size; i++)
                        at += (size_t) snprintf(buf + at, size - at, ", %" PRIu32, s->rank[i]);
        }
        if (at < size)
                snprintf(buf + at, size - at, " of before tierd restarted, which may have written it%s%s%s",
                         commit ? ": what it holds is known once " : " (released when ",
                         s->n <= 1 ? "that rank attaches again" : "those ranks have all attached again",
                         commit ? " (commit then)" : ")");
}

int job_commit_refused(const Job *j, char *why, size_t why_size) {
        list_for_each_safe(n, tmp, &((Job *) j)->tensors) {
                const Tensor *t = list_entry(n, Tensor, job_link);

                for (int i = 0; i < TIERS; i++)
                        if (t->ghost & (1u << i)) {
                                char ghost[320];

                                ghost_why(t, i, true, ghost, sizeof(ghost));
                                snprintf(why, why_size, "tensor '%s' is held in %s for %s", t->name,
                                         level_to_string(i), ghost);
                                return -EBUSY;
                        }
        }
        return 0;
}

int job_rollback_refused(const Job *j, const Tensor *busy, char *why, size_t why_size) {
        list_for_each_safe(n, tmp, &((Job *) j)->tensors) {
                const Tensor *t = list_entry(n, Tensor, job_link);

                for (int i = 0; i < TIERS; i++) {
                        if (t->copy[i].pins == 0)
                                continue;
                        if ((t->ghost & (1u << i)) && t->copy[i].pins == 1) {
                                char ghost[320];

                                ghost_why(t, i, false, ghost, sizeof(ghost));
                                snprintf(why, why_size, "tensor '%s' is held in %s for %s", t->name,
                                         level_to_string(i), ghost);
                        } else
                                snprintf(why, why_size, "tensor '%s' is pinned (in %s)", t->name, level_to_string(i));
                        return -EBUSY;
                }
        }
        if (busy) {
                snprintf(why, why_size, "a request on tensor '%s' is in progress (wait for it first)", busy->name);
                return -EBUSY;
        }
        return 0;
}

int job_rollback(Job *j, unsigned *ret_rolled, unsigned *ret_lost, char *why, size_t why_size) {
        unsigned rolled = 0, lost = 0;
        const Tensor *moving = NULL, *busy = NULL;
        int r;

        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                if (t->op_refs > 0 && !busy)
                        busy = t;
                if (t->xfer && !moving)
                        moving = t;
        }
        r = job_rollback_refused(j, busy, why, why_size);
        if (r < 0)
                return r;
        if (moving) {
                snprintf(why, why_size, "tensor '%s' is in a transfer", moving->name);
                return -EAGAIN;
        }
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                if (t->version == t->commit_version && !t->lost)
                        continue;
                for (int i = 0; i < TIERS; i++)
                        copy_free(t, i);
                t->dead = false;
                /*
                 * The image first: the committed version's bytes, a tensor committed dead included
                 * (its plan's hold overwriting it while NVMe held that version, whose copy became
                 * the image when the hold wrote, copy_free()), as after a restart, where
                 * commit_dead is not known
                 */
                if (t->base) {
                        NvmeExtent *ext = t->base;
                        uint32_t n_ext = t->n_base;

                        /* the image is counted already: it becomes the NVMe copy as it is */
                        t->base = NULL;
                        t->n_base = 0;
                        t->version = t->commit_version;
                        t->lost = false;
                        copy_account(t, LEVEL_NVME, -(int64_t) ((uint64_t) n_ext * j->registry->nvme->extent_size));
                        (void) copy_restore_nvme(t, ext, n_ext);
                        book_restored(j->registry->book, t);
                        rolled++;
                } else if (t->commit_dead) {
                        /*
                         * Dead at the commit (its next access wrote it whole: no copy was kept, so
                         * no image either): dead again, which is all the commit had of it
                         */
                        t->version = t->commit_version;
                        t->dead = true;
                        /*
                         * as at the commit: its plan's own holds read zeros, others' reads fail (op.c);
                         * whose plan not known (dead then as a table of before the rank was kept had
                         * it): no read, as before the commit
                         */
                        t->dead_rank = t->commit_dead_rank;
                        t->lost = !t->commit_dead_rank;
                        t->lost_why = TENSOR_LOST_STOPPED;
                        tensor_note(t);
                        book_version(j->registry->book, t);
                        /* lost again: counted so (struct tier_commit.lost: its reads fail -ENODATA) */
                        if (t->lost)
                                lost++;
                        else
                                rolled++;
                } else if (t->commit_version == 0) {
                        t->version = 0;         /* it was never written at the commit: zeros */
                        t->lost = false;
                        book_restored(j->registry->book, t);
                        rolled++;
                } else {
                        t->lost = true;
                        t->lost_why = TENSOR_LOST_ROLLBACK;
                        lost++;
                }
        }
        *ret_rolled = rolled;
        *ret_lost = lost;
        return 0;
}

/* ---- pins ------------------------------------------------------------------------------- */

int tensor_unpin(Tensor *t, int tier, bool dirty) {
        Copy *c = &t->copy[tier];

        if (c->pins == 0)
                return -ENOENT;
        c->pins--;
        t->job->registry->unpins++;
        if (dirty) {
                t->version++;
                c->version = t->version;
                c->unwritten = false;
                t->dead = false;
                t->lost = false;
        }
        log_debug("unpin '%s' of job '%s' in %s%s: version %" PRIu64 ", pins left %u", t->name, t->job->name,
                  level_to_string(tier), dirty ? " (dirty)" : "", t->version, c->pins);
        copy_touch(t, tier);
        if (dirty)
                tensor_note(t);
        tensor_free_stale(t);
        if (dirty)
                book_version(t->job->registry->book, t);        /* the newest is not on NVMe (if it was) */
        if (c->pins == 0 && t->job->registry->ops && t->job->registry->ops->unpinned)
                t->job->registry->ops->unpinned(t->job->registry->ops_userdata, tier);
        return 0;
}

/* The ghost pin of @t in @tier goes, the copy counting as written (no revert); a room alone (no data) goes. */
static void ghost_drop(Tensor *t, int tier) {
        uint8_t bit = (uint8_t) (1u << tier);
        bool room = t->ghost_room & bit;

        t->ghost &= (uint8_t) ~bit;
        t->ghost_room &= (uint8_t) ~bit;
        t->ghost_unwritten &= (uint8_t) ~bit;
        if (!t->ghost_unwritten)
                t->ghost_dead_before = false;
        tensor_pin_account(t, tier, -1);
        t->copy[tier].pins--;
        if (room) {
                /* (nothing else pins it: no read gets it, op.c refill_stale()) */
                if (t->copy[tier].pins == 0 && !t->xfer)
                        copy_free(t, tier);
                return;
        }
        if (t->copy[tier].writers == 0)         /* (else a writer's since, which reserved it: its) */
                t->copy[tier].unwritten = false;        /* written, as far as anyone can tell */
}

/* The index of @rank in @s, or -1 (RANK_SET_MANY: never in it). */
static int rank_set_find(const RankSet *s, uint32_t rank) {
        for (unsigned i = 0; s->n != RANK_SET_MANY && i < s->n; i++)
                if (s->rank[i] == rank)
                        return (int) i;
        return -1;
}

void copy_writers(Tensor *t, int tier, int delta, uint32_t rank) {
        Copy *c = &t->copy[tier];
        int i;

        if (delta > 0) {
                /*
                 * A client writes the copy a write-only pin of before tierd's restart reserved:
                 * it is that client's to write now, whatever came of the pin of before (nothing
                 * goes back; its room stays a reservation until this one writes).  The ghost pin
                 * stays, for the ranks of before may still write through their mappings.
                 */
                if ((t->ghost_unwritten >> tier) & 1 && c->pins > 1) {
                        t->ghost_unwritten &= (uint8_t) ~(1u << tier);
                        if (!t->ghost_unwritten)
                                t->ghost_dead_before = false;
                }
                if (c->writers == 0)
                        c->write_ranks.n = 0;
                c->writer_rank = rank;
                i = rank_set_find(&c->write_ranks, rank);
                if (i < 0 && c->write_ranks.n < RANK_SET_MAX) {
                        i = c->write_ranks.n++;
                        c->write_ranks.rank[i] = rank;
                        c->write_pins[i] = 0;
                } else if (i < 0)
                        c->write_ranks.n = RANK_SET_MANY;       /* (which, not known until it has none) */
                if (i >= 0)
                        c->write_pins[i]++;
                c->writers++;
        } else if (c->writers > 0) {
                /*
                 * A rank that let go of its last pin that may write the copy no longer writes it (a write
                 * after its unpin is out of bounds, as for a copy nothing holds): its record leaves it
                 * out, and a ghost of it does not wait for that rank's Hello, which may never come.
                 */
                i = rank_set_find(&c->write_ranks, rank);
                if (i >= 0 && --c->write_pins[i] == 0) {
                        c->write_ranks.n--;
                        c->write_ranks.rank[i] = c->write_ranks.rank[c->write_ranks.n];
                        c->write_pins[i] = c->write_pins[c->write_ranks.n];
                }
                c->writers--;
                t->job->registry->unpins++;
        }
        tensor_note(t);
}

void tensor_note(Tensor *t) {
        memstore_note(t->job->registry->memstore, t);
}

/*
 * A ghost copy of @t in @tier that a write-only pin reserved, whose client
 * never had the grant: it goes, and the tensor is what it was before that
 * pin (a copy of the version before, which the restore kept; zeros; dead),
 * or lost when nothing holds that.
 */
static void ghost_unwritten_back(Tensor *t, int tier, uint32_t rank, bool dead_before) {
        uint64_t before = t->version - 1;       /* (a ghost held for writing is its write's version) */
        char now[160];
        int level = LOG_NOTICE, from = -1;

        if (t->copy[tier].pins > 0 || t->xfer) {
                /* another client of the job pinned it (or a transfer reads it) before this rank came back */
                log_tensor(LOG_WARNING, 0, t->job->name, t->name, level_to_string(tier),
                           "Tensor '%s' of job '%s': the write-only pin that reserved its %s copy before tierd "
                           "restarted never reached rank %" PRIu32 ", but another client pinned the copy, or a "
                           "transfer reads it, first: it counts as written, with whatever bytes its room held", t->name, t->job->name,
                           level_to_string(tier), rank);
                return;
        }
        copy_free(t, tier);
        for (int i = TIERS - 1; i >= 0 && from < 0; i--)
                if (t->copy[i].state == COPY_RESIDENT && t->copy[i].version == before && !t->copy[i].unwritten)
                        from = i;
        t->version = before;
        if (before > 0 && from >= 0)
                snprintf(now, sizeof(now), "back at the version before (its copy in %s)", level_to_string(from));
        else if (before == 0)
                snprintf(now, sizeof(now), "back to zeros (it was never written before)");
        else if (dead_before) {
                t->dead = true;         /* as it was: its next access writes it whole */
                t->lost = !t->dead_rank; /* whose plan made it so not known (an older table): no read (op.c) */
                t->lost_why = TENSOR_LOST_STOPPED;
                snprintf(now, sizeof(now), "dead again, as before the pin (its next access writes it whole)");
                level = LOG_INFO;
        } else {
                t->lost = true;
                t->lost_why = TENSOR_LOST_WRITE_ONLY;
                snprintf(now, sizeof(now), "lost (its reads fail with ENODATA until it is written whole)");
                level = LOG_WARNING;
        }
        /*
         * The index: what NVMe holds, or zeros, is the newest again; a memory copy
         * is NEWER, at the version before (it said the pin's); dead or lost: as it says.
         */
        if (!t->lost && !t->dead && (before == 0 || from == LEVEL_NVME))
                book_restored(t->job->registry->book, t);
        else if (!t->lost && !t->dead)
                book_version_back(t->job->registry->book, t);
        tensor_free_stale(t);
        tensor_note(t);
        log_tensor(level, 0, t->job->name, t->name, level_to_string(tier),
                   "Tensor '%s' of job '%s': the write-only pin that reserved its %s copy before tierd restarted "
                   "never reached rank %" PRIu32 " (its client does not name it): the copy's bytes are not the "
                   "tensor's, so it is %s", t->name, t->job->name, level_to_string(tier), rank, now);
}

void rank_set_add(RankSet *s, uint32_t rank) {
        if (s->n == RANK_SET_MANY)
                return;
        for (unsigned i = 0; i < s->n; i++)
                if (s->rank[i] == rank)
                        return;
        if (s->n == RANK_SET_MAX)
                s->n = RANK_SET_MANY;
        else
                s->rank[s->n++] = rank;
}

/* Take @rank out of @s: false when it is not in it (RANK_SET_MANY: never). */
static bool rank_set_del(RankSet *s, uint32_t rank) {
        for (unsigned i = 0; s->n != RANK_SET_MANY && i < s->n; i++)
                if (s->rank[i] == rank) {
                        s->rank[i] = s->rank[--s->n];
                        return true;
                }
        return false;
}

uint8_t copy_write_ranks(const Tensor *t, int tier, uint32_t rank[RANK_SET_MAX]) {
        RankSet s = t->copy[tier].writers > 0 ? t->copy[tier].write_ranks : (RankSet) {};
        const RankSet *g = &t->ghost_ranks[MIN(tier, LEVEL_NVME - 1)];

        if (tier != LEVEL_NVME && ((t->ghost >> tier) & 1)) {
                for (unsigned i = 0; i < g->n && i < RANK_SET_MAX; i++)
                        rank_set_add(&s, g->rank[i]);   /* (a ghost taken over by a writer since: both) */
                if (g->n == RANK_SET_MANY)
                        s.n = RANK_SET_MANY;
        }
        memcpy(rank, s.rank, sizeof(s.rank));
        return s.n;
}

void job_release_ghosts(Job *j, bool says, uint32_t rank, bool (*held)(const Tensor *t, int tier, void *userdata),
                        void *userdata) {
        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                for (int tier = 0; tier < LEVEL_NVME && t->ghost; tier++) {
                        uint8_t bit = (uint8_t) (1u << tier);
                        RankSet *s = &t->ghost_ranks[tier];
                        bool unwritten = t->ghost_unwritten & bit, back;

                        if (!(t->ghost & bit))
                                continue;
                        /* a table of before the ranks were kept (n 0): as then, any rank but a write-only pin's */
                        if (s->n == 0 ? unwritten && says && t->ghost_rank != rank : !rank_set_del(s, rank))
                                continue;       /* not a rank it waits for */
                        /*
                         * A write-only pin's copy: written when this rank's client got its grant, or does
                         * not say (an older libtier); a write since the restart made the tensor newer:
                         * that stands.
                         */
                        if (unwritten && (!says || (held && held(t, tier, userdata)) ||
                                          t->copy[tier].version != t->version)) {
                                t->ghost_unwritten &= (uint8_t) ~bit;
                                t->copy[tier].unwritten = false;
                                if (!t->ghost_unwritten)
                                        t->ghost_dead_before = false;
                        }
                        if (s->n != 0) {
                                /* another rank of before may still write into its room: held (recorded so) */
                                tensor_free_stale(t);
                                tensor_note(t);
                                continue;
                        }
                        back = t->ghost_unwritten & bit;
                        if (back) {
                                bool dead_before = t->ghost_dead_before;

                                ghost_drop(t, tier);
                                ghost_unwritten_back(t, tier, t->ghost_rank, dead_before);
                        } else {
                                ghost_drop(t, tier);
                                tensor_free_stale(t);   /* as after any pin: what the copy made stale goes */
                        }
                        tensor_note(t);         /* no longer held: the memory store records it as it is now */
                        if (t->copy[tier].pins == 0 && j->registry->ops && j->registry->ops->unpinned)
                                j->registry->ops->unpinned(j->registry->ops_userdata, tier);   /* (waiting holds) */
                }
        }
}

void tensor_pin_account(Tensor *t, int tier, int delta) {
        Registry *r = t->job->registry;
        uint64_t bytes = t->alloc_size;
        unsigned *n = &t->copy[tier].pins_counted;

        /* what the copy takes, once while any pin holds it: two ranks' pins take its room once */
        if (delta > 0) {
                if ((*n)++ > 0)
                        return;
                t->job->pinned[tier] += bytes;
                r->pinned[tier] += bytes;
        } else {
                if (*n == 0 || --*n > 0)
                        return;
                t->job->pinned[tier] -= bytes;
                r->pinned[tier] -= bytes;
        }
}
