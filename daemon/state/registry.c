/* SPDX-License-Identifier: MIT */
/* registry.c: jobs, tensors, their copies in each tier, pins. */

/*
 * Theory of operation: a Job is a named tensor namespace owned by the uid
 * that created it; every connection that joins it is one rank.  Tensors are
 * found by id (job-local: slot index in the low 32 bits, a generation in the
 * high 32 bits so a stale id never reaches a reused slot) or by name.
 * Each tensor has one Copy per tier with a state and a data version; the
 * mover decides where copies go, this module only keeps the books.
 *
 * A job with no connection lingers for [daemon] linger_sec so that a
 * restarted rank can re-attach; then job_destroy() frees its tensors and
 * gives its segments back to the pools (which replace their memory).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/engine/mover.h"
#include "daemon/state/registry.h"
#include "daemon/state/tensormap.h"
#include "daemon/tiers/vram.h"
#include "proto/fence.h"
#include "proto/macro.h"

static const char *const copy_state_names[_COPY_STATE_MAX] = {
        [COPY_ABSENT] = "absent",
        [COPY_FILLING] = "filling",
        [COPY_RESIDENT] = "resident",
        [COPY_DRAINING] = "draining",
};

const char *copy_state_to_string(CopyState s) {
        return s < _COPY_STATE_MAX ? copy_state_names[s] : "?";
}

bool copy_is_sole(const Tensor *t, int tier) {
        if (t->version == 0 || t->dead || !copy_valid(t, tier))
                return false;
        for (int i = 0; i < TIERS; i++)
                if (i != tier && copy_valid(t, i))
                        return false;
        return true;
}

int tensor_valid_tier(const Tensor *t, int below_or_at) {
        for (int i = 0; i <= below_or_at && i < TIERS; i++)
                if (copy_valid(t, i))
                        return i;
        return -1;
}

static int fence_page_new(Job *j) {
        int fd;
        void *p;

        fd = memfd_create("tierd-fences", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return negative_errno();
        if (ftruncate(fd, sizeof(FencePage)) < 0)
                goto fail;
        p = mmap(NULL, sizeof(FencePage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                goto fail;
        /* Clients may only map it read-only from now on. */
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
                munmap(p, sizeof(FencePage));
                goto fail;
        }
        j->fence_fd = fd;
        j->fences = p;
        return 0;
fail:
        {
                int r = negative_errno();
                safe_close(fd);
                return r;
        }
}

int job_new(Manager *m, const char *name, uid_t uid, Job **ret) {
        Job *j;
        int r;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->manager = m;
        j->id = ++m->next_job_id;
        j->uid = uid;
        j->fence_fd = -1;
        list_init(&j->link);
        list_init(&j->conns);
        list_init(&j->tensors);
        for (int i = 0; i < TIERS; i++)
                list_init(&j->segments[i]);
        j->limit[TIER_VRAM] = m->config.vram_job_limit;
        j->limit[TIER_HOST] = m->config.host_job_limit;
        j->limit[TIER_NVME] = m->config.nvme_job_limit;
        j->weight = m->config.default_weight;

        j->name = strdup(name);
        j->by_name = tensormap_new();
        if (!j->name || !j->by_name) {
                r = -ENOMEM;
                goto fail;
        }
        r = fence_page_new(j);
        if (r < 0)
                goto fail;

        list_add_tail(&m->jobs, &j->link);
        m->n_jobs++;
        *ret = j;
        return 0;
fail:
        tensormap_free(j->by_name);
        free(j->name);
        free(j);
        return r;
}

static void job_free_final(Job *j) {
        Manager *m = j->manager;

        for (int i = 0; i < TIERS; i++) {
                list_for_each_safe(n, tmp, &j->segments[i]) {
                        Segment *s = list_entry(n, Segment, owner_link);
                        int r = segpool_release(s->pool, s);

                        if (r < 0)
                                log_object(LOG_WARNING, r, j->name, NULL, tier_to_string(s->pool->tier),
                                           "Cannot renew segment %u after job '%s', it stays out of service: %m",
                                           s->id, j->name);
                }
        }
        list_del(&j->link);
        if (j->fences)
                munmap(j->fences, sizeof(FencePage));
        safe_close(j->fence_fd);
        tensormap_free(j->by_name);
        free(j->by_id);
        free(j->name);
        (void) m;
        free(j);
}

/* Called by the mover whenever a doomed tensor of a dying job is finally freed. */
void job_maybe_finish(Job *j);
void job_maybe_finish(Job *j) {
        if (j->dying && j->n_tensors == 0)
                job_free_final(j);
}

void job_destroy(Job *j) {
        Manager *m = j->manager;

        log_job(LOG_INFO, 0, j->name, "Job '%s' (id %" PRIu64 ") ended, freeing %u tensor(s)", j->name, j->id,
                j->n_tensors);
        j->linger = sd_event_source_disable_unref(j->linger);
        mover_cancel_job(m, j);
        list_del(&j->link);
        m->n_jobs--;
        list_add_tail(&m->dying_jobs, &j->link);

        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                /* no connection is left to hold a pin or a plan: whatever remains goes */
                for (int i = 0; i < TIERS; i++)
                        t->copy[i].pins = 0;
                t->plan_refs = 0;
                (void) tensor_free(t);
        }
        /* only now: a tensor freed above must not free the job under this loop */
        j->dying = true;
        job_maybe_finish(j);
}

Job *job_find(Manager *m, const char *name) {
        list_for_each_safe(n, tmp, &m->jobs) {
                Job *j = list_entry(n, Job, link);

                if (strcmp(j->name, name) == 0)
                        return j;
        }
        return NULL;
}

int job_fence_slot_get(Job *j, unsigned *ret) {
        for (unsigned i = 0; i < FENCE_SLOTS; i++) {
                uint64_t bit = 1ull << (i % 64);

                if (j->fence_slots[i / 64] & bit)
                        continue;
                j->fence_slots[i / 64] |= bit;
                __atomic_store_n(&j->fences->done[i], 0, __ATOMIC_RELEASE);
                __atomic_store_n(&j->fences->failed[i], 0, __ATOMIC_RELEASE);
                *ret = i;
                return 0;
        }
        return -EUSERS;
}

void job_fence_slot_put(Job *j, unsigned slot) {
        if (slot < FENCE_SLOTS)
                j->fence_slots[slot / 64] &= ~(1ull << (slot % 64));
}

int tensor_new(Job *j, const char *name, uint64_t size, Tensor **ret) {
        Tensor *t;
        uint32_t slot;
        int r;

        if (j->n_tensors >= j->manager->config.max_tensors)
                return -EMFILE;
        if (tensormap_get(j->by_name, name))
                return -EEXIST;

        /* find a free id slot */
        for (slot = 0; slot < j->by_id_cap; slot++)
                if (!j->by_id[slot])
                        break;
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
        for (int i = 0; i < TIERS; i++)
                list_init(&t->copy[i].lru);
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
        list_add_tail(&j->tensors, &t->job_link);
        j->n_tensors++;
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
void tensor_destroy_final(Tensor *t);
void tensor_destroy_final(Tensor *t) {
        Job *j = t->job;

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
        t->doomed = true;
        tensor_release_copies(t);       /* calls tensor_destroy_final() now or after the transfer */
        return 0;
}

void tensor_pin_account(Tensor *t, int tier, int delta) {
        Manager *m = t->job->manager;
        uint64_t bytes = t->alloc_size;

        if (delta > 0) {
                t->job->pinned[tier] += bytes;
                m->pinned[tier] += bytes;
        } else {
                t->job->pinned[tier] -= bytes;
                m->pinned[tier] -= bytes;
        }
}

const char *tier_to_string(int tier) {
        static const char *const names[TIERS] = { "vram", "host", "nvme" };

        return tier >= 0 && tier < TIERS ? names[tier] : "?";
}
