/* SPDX-License-Identifier: MIT */
/* registry.c: the books: the registry itself, jobs, their fence pages and their linger. */

/*
 * Theory of operation: the Registry keeps the books of everything tierd
 * holds: jobs, their tensors (tensor.c), each tensor's copy per tier and
 * the bytes used and pinned, per job and in all.  It decides nothing about
 * movement: the engine (daemon/engine) makes copies appear and disappear
 * and the scheduler decides when.  The registry never calls up into them;
 * what the engine must hear from it (a job ends: forget its ops; space was
 * given back: retry the ops waiting for it) goes through the RegistryOps
 * the engine registers.
 *
 * A Job is a named tensor namespace owned by the uid that created it; every
 * connection that joins it is one rank (the ipc room keeps Job.conns).  A
 * job with no connection lingers for [daemon] linger_sec so that a
 * restarted rank can re-attach; then job_destroy() frees its tensors and
 * gives its segments back to the pools (which replace their memory).  A
 * tensor still in transfer when its job ends is freed when the transfer
 * does, and the job itself after its last tensor (Registry.dying_jobs).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/state/book.h"
#include "daemon/state/registry.h"
#include "daemon/state/tensormap.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/segpool.h"
#include "proto/fence.h"
#include "proto/macro.h"
#include "util/time-util.h"

int registry_new(const Config *config, sd_event *event, SegPool *host, SegPool *vram, NvmeTier *nvme,
                 Registry **ret) {
        Registry *r = calloc(1, sizeof(*r));

        if (!r)
                return -ENOMEM;
        r->config = config;
        r->event = event;
        r->pools[LEVEL_HOST] = host;
        r->pools[LEVEL_VRAM] = vram;
        r->nvme = nvme;
        list_init(&r->jobs);
        list_init(&r->dying_jobs);
        for (int i = 0; i < TIERS; i++)
                list_init(&r->lru[i]);
        r->capacity[LEVEL_VRAM] = vram ? (uint64_t) vram->n_segs * vram->seg_size : 0;
        r->capacity[LEVEL_HOST] = host ? (uint64_t) host->n_segs * host->seg_size : 0;
        r->capacity[LEVEL_NVME] = nvme ? nvme->capacity : 0;
        *ret = r;
        return 0;
}

void registry_set_ops(Registry *r, const RegistryOps *ops, void *userdata) {
        r->ops = ops;
        r->ops_userdata = userdata;
}

Registry *registry_free(Registry *r) {
        if (!r)
                return NULL;
        r->freeing = true;
        book_detach(r->book);           /* its jobs stay in the NVMe index: they are forgotten, not ended */
        list_for_each_safe(n, tmp, &r->jobs)
                job_destroy(list_entry(n, Job, link));
        /* jobs whose tensors waited for a transfer: the engine is gone, nothing is in flight any more */
        list_for_each_safe(n, tmp, &r->dying_jobs) {
                Job *j = list_entry(n, Job, link);

                list_for_each_safe(tn, ttmp, &j->tensors) {
                        Tensor *t = list_entry(tn, Tensor, job_link);

                        t->xfer = NULL;
                        tensor_release_copies(t);       /* doomed: frees it, and the job after its last */
                }
        }
        free(r);
        return NULL;
}

/* ---- jobs ---------------------------------------------------------------------------- */

static int fence_page_new(Job *j) {
        _cleanup_close_ int fd = -1;
        void *p;

        fd = memfd_create("tierd-fences", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return negative_errno();
        if (ftruncate(fd, sizeof(FencePage)) < 0)
                return negative_errno();
        p = mmap(NULL, sizeof(FencePage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return negative_errno();
        /* Clients may only map it read-only from now on. */
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
                int r = negative_errno();

                munmap(p, sizeof(FencePage));
                return r;
        }
        j->fence_fd = TAKE_FD(fd);
        j->fences = p;
        return 0;
}

int job_new(Registry *r, const char *name, uid_t uid, Job **ret) {
        Job *j;
        int q;

        j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->registry = r;
        j->id = ++r->next_job_id;
        j->uid = uid;
        j->fence_fd = -1;
        list_init(&j->link);
        list_init(&j->conns);
        list_init(&j->plans);
        list_init(&j->tensors);
        for (int i = 0; i < TIERS; i++) {
                list_init(&j->segments[i]);
                list_init(&j->lru[i]);
        }
        j->limit[LEVEL_VRAM] = r->config->vram_job_limit;
        j->limit[LEVEL_HOST] = r->config->host_job_limit;
        j->limit[LEVEL_NVME] = r->config->nvme_job_limit;
        j->weight = r->config->default_weight;

        j->name = strdup(name);
        j->by_name = tensormap_new();
        if (!j->name || !j->by_name) {
                q = -ENOMEM;
                goto fail;
        }
        q = fence_page_new(j);
        if (q < 0)
                goto fail;

        list_add_tail(&r->jobs, &j->link);
        r->n_jobs++;
        *ret = j;
        return 0;
fail:
        tensormap_free(j->by_name);
        free(j->name);
        free(j);
        return q;
}

static void job_free_final(Job *j) {
        wear_job_end(j->registry->wear, j);
        for (int i = 0; i < TIERS; i++) {
                list_for_each_safe(n, tmp, &j->segments[i]) {
                        Segment *s = list_entry(n, Segment, owner_link);
                        int r;

                        if (j->registry->freeing) {
                                segpool_forget(s->pool, s);     /* the pools go next: nothing to renew */
                                continue;
                        }
                        r = segpool_release(s->pool, s);

                        if (r < 0)
                                log_object(LOG_WARNING, r, j->name, NULL, level_to_string(s->pool->tier),
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
        free(j->gids);
        free(j->totals);
        free(j->name);
        free(j);
}

void job_maybe_finish(Job *j) {
        if (j->dying && j->n_tensors == 0)
                job_free_final(j);
}

void job_destroy(Job *j) {
        Registry *r = j->registry;

        log_job(LOG_INFO, 0, j->name, "Job '%s' (id %" PRIu64 ") ended, freeing %u tensor(s)", j->name, j->id,
                j->n_tensors);
        j->linger = sd_event_source_disable_unref(j->linger);
        book_job_gone(r->book, j);      /* (not at tierd's exit: the index keeps it) */
        if (r->ops && r->ops->job_ending)
                r->ops->job_ending(r->ops_userdata, j);
        list_del(&j->link);
        r->n_jobs--;
        list_add_tail(&r->dying_jobs, &j->link);

        list_for_each_safe(n, tmp, &j->tensors) {
                Tensor *t = list_entry(n, Tensor, job_link);

                /* no connection is left to hold a pin or a plan: whatever remains goes (a ghost's: memstore.c) */
                for (int i = 0; i < TIERS; i++)
                        for (; t->copy[i].pins > 0; t->copy[i].pins--)
                                tensor_pin_account(t, i, -1);
                t->plan_refs = 0;
                (void) tensor_free(t);
        }
        /* only now: a tensor freed above must not free the job under this loop */
        j->dying = true;
        job_maybe_finish(j);
}

uint64_t job_tensor_max(const Job *j, int tier) {
        return MIN(j->limit[tier], j->registry->capacity[tier]);
}

Job *job_find(Registry *r, const char *name) {
        list_for_each_safe(n, tmp, &r->jobs) {
                Job *j = list_entry(n, Job, link);

                if (strcmp(j->name, name) == 0)
                        return j;
        }
        return NULL;
}

static int on_linger(sd_event_source *s, uint64_t usec, void *userdata) {
        job_destroy(userdata);
        return 0;
}

void job_linger_start(Job *j) {
        Registry *r = j->registry;
        uint64_t until = now_usec() + r->config->linger_usec;
        int q;

        if (j->n_conns > 0 || j->dying)
                return;
        j->linger = sd_event_source_disable_unref(j->linger);
        j->linger_until = until;
        q = sd_event_add_time(r->event, &j->linger, CLOCK_MONOTONIC, until, 0, on_linger, j);
        if (q < 0) {
                log_job(LOG_WARNING, q, j->name, "Cannot arm linger timer of job '%s', ending it now: %m", j->name);
                job_destroy(j);
                return;
        }
        (void) sd_event_source_set_description(j->linger, "job-linger");
}

void job_linger_stop(Job *j) {
        j->linger = sd_event_source_disable_unref(j->linger);
        j->linger_until = 0;
}

int job_fence_slot_get(Job *j, unsigned *ret) {
        for (unsigned i = 0; i < FENCE_SLOTS; i++) {
                uint64_t bit = 1ull << (i % 64);

                if (j->fence_slots[i / 64] & bit)
                        continue;
                j->fence_slots[i / 64] |= bit;
                /*
                 * The slot's previous connection may be one tierd closed, whose client has not
                 * looked yet: the new connection's fences must not read as its fences.  failed
                 * is bumped, never reset, and before done goes back to 0: a client that loads a
                 * done of the new connection's (acquire) then sees a failure it has no event
                 * for, drains its socket, finds it closed and fails the fence with that error
                 * (client/fences.c).  The new client takes failed as its base after the Hello.
                 */
                __atomic_add_fetch(&j->fences->failed[i], 1, __ATOMIC_RELEASE);
                __atomic_store_n(&j->fences->done[i], 0, __ATOMIC_RELEASE);
                *ret = i;
                return 0;
        }
        return -EUSERS;
}

void job_fence_slot_put(Job *j, unsigned slot) {
        if (slot < FENCE_SLOTS)
                j->fence_slots[slot / 64] &= ~(1ull << (slot % 64));
}
