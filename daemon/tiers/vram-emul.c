/* SPDX-License-Identifier: MIT */
/* vram-emul.c: emulated VRAM backend: memfd "device memory", copies on a mover thread. */

/*
 * Theory of operation: for machines without a GPU (CI, laptops).  VRAM is a
 * pool of memfd chunks exactly like the host tier (so clients map it the
 * same way), and every host<->VRAM copy is a memcpy done by one mover
 * thread, optionally throttled to [vram] bandwidth bytes/s so benchmarks can
 * model a PCIe link.  The event loop hands copies to the thread through a
 * mutex-protected queue; finished copies come back through a second queue
 * and an eventfd watched by sd-event, so done() callbacks run on the loop
 * thread and never need locks.  It is labelled "emulated" wherever it shows.
 */

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/tiers/fault.h"
#include "daemon/tiers/memfd-seg.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* Copies are done in pieces this big so the throttle is smooth. */
#define EMUL_PIECE (4u << 20)
/* [vram] capacity = 0 asks for what the device can give: here, the built-in default. */
#define EMUL_DEFAULT_CAPACITY (1ull << 30)

typedef struct VramEmul {
        VramBackend base;
        MemfdSegConfig memfd;
        uint64_t bandwidth;     /* atomic: the loop sets it (reload), the thread reads it */
        pthread_t thread;
        bool thread_ok;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        VramCopy *todo_head, **todo_tail;
        VramCopy *done_head, **done_tail;
        bool stop;
        int efd;
        sd_event_source *efd_source;
} VramEmul;

/*
 * Wait until @until_ns (CLOCK_MONOTONIC), or until the backend stops.  Called
 * and returns with e->lock held.  Returns false when stopping.
 */
static bool throttle_wait(VramEmul *e, uint64_t until_ns) {
        struct timespec ts = {
                .tv_sec = (time_t) (until_ns / 1000000000ull),
                .tv_nsec = (long) (until_ns % 1000000000ull),
        };

        while (!e->stop && now_ns() < until_ns)
                (void) pthread_cond_timedwait(&e->cond, &e->lock, &ts);
        return !e->stop;
}

static void *emul_thread(void *userdata) {
        VramEmul *e = userdata;
        uint64_t link_free_at = 0;      /* throttle: when the emulated link is idle again */

        pthread_mutex_lock(&e->lock);
        for (;;) {
                VramCopy *c;

                while (!e->todo_head && !e->stop)
                        pthread_cond_wait(&e->cond, &e->lock);
                if (e->stop)
                        break;
                c = e->todo_head;
                e->todo_head = c->next;
                if (!e->todo_head)
                        e->todo_tail = &e->todo_head;
                pthread_mutex_unlock(&e->lock);

                for (uint64_t off = 0; off < c->len; off += EMUL_PIECE) {
                        uint64_t n = MIN((uint64_t) EMUL_PIECE, c->len - off);
                        uint8_t *dev = (uint8_t *) c->seg->map + c->offset + off;
                        uint8_t *host = (uint8_t *) c->host + off;
                        uint64_t bandwidth = __atomic_load_n(&e->bandwidth, __ATOMIC_RELAXED);
                        bool go_on = true;

                        if (c->dir == VRAM_TO_DEVICE)
                                memcpy(dev, host, n);
                        else
                                memcpy(host, dev, n);
                        pthread_mutex_lock(&e->lock);
                        if (bandwidth > 0) {
                                uint64_t now = now_ns();

                                if (link_free_at < now)
                                        link_free_at = now;
                                link_free_at += n * 1000000000ull / bandwidth;
                                go_on = throttle_wait(e, link_free_at);
                        } else
                                go_on = !e->stop;
                        pthread_mutex_unlock(&e->lock);
                        /* stopping (the host pool is about to go): the rest of the copy is abandoned */
                        if (!go_on)
                                return NULL;
                }
                c->result = 0;

                pthread_mutex_lock(&e->lock);
                c->next = NULL;
                *e->done_tail = c;
                e->done_tail = &c->next;
                {
                        uint64_t one = 1;
                        (void) write(e->efd, &one, sizeof(one));
                }
        }
        pthread_mutex_unlock(&e->lock);
        return NULL;
}

static int on_emul_done(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        VramEmul *e = userdata;
        VramCopy *list;
        uint64_t v;

        (void) read(e->efd, &v, sizeof(v));
        pthread_mutex_lock(&e->lock);
        list = e->done_head;
        e->done_head = NULL;
        e->done_tail = &e->done_head;
        pthread_mutex_unlock(&e->lock);

        while (list) {
                VramCopy *c = list;

                list = c->next;
                c->next = NULL;
                if (e->base.faults && c->result == 0) {
                        FaultKind k = c->dir == VRAM_TO_DEVICE ? FAULT_VRAM_H2D_EIO : FAULT_VRAM_D2H_EIO;

                        if (fault_fire(e->base.faults, k, c->fault_mask, FAULT_TARGET_ANY)) {
                                log_warning("Injected fault %s: a copy of %" PRIu64 " bytes %s is reported failed "
                                            "with %s.", fault_kind_to_string(k), c->len,
                                            c->dir == VRAM_TO_DEVICE ? "to VRAM" : "to host", strerror(EIO));
                                c->result = -EIO;
                        }
                }
                c->done(c);
        }
        return 0;
}

static int emul_copy(VramBackend *b, VramCopy *c) {
        VramEmul *e = container_of(b, VramEmul, base);

        if (!c->seg || !c->seg->map || c->offset + c->len > c->seg->pool->seg_size)
                return -EINVAL;
        c->next = NULL;
        c->fault_mask = e->base.faults ? fault_job_mask(e->base.faults, c->job) : 0;
        pthread_mutex_lock(&e->lock);
        *e->todo_tail = c;
        e->todo_tail = &c->next;
        pthread_cond_signal(&e->cond);
        pthread_mutex_unlock(&e->lock);
        return 0;
}

static int emul_zero(VramBackend *b, Segment *seg, uint64_t offset, uint64_t len) {
        if (!seg->map || offset + len > seg->pool->seg_size)
                return -EINVAL;
        memset((uint8_t *) seg->map + offset, 0, len);
        return 0;
}

/* Stop the mover thread: at the end of the piece it copies now; copies not done are abandoned. */
static bool emul_stop(VramBackend *b) {
        VramEmul *e = container_of(b, VramEmul, base);

        if (!e->thread_ok)
                return true;
        pthread_mutex_lock(&e->lock);
        e->stop = true;
        pthread_cond_broadcast(&e->cond);
        pthread_mutex_unlock(&e->lock);
        pthread_join(e->thread, NULL);
        e->thread_ok = false;
        return true;
}

static void emul_free(VramBackend *b) {
        VramEmul *e = container_of(b, VramEmul, base);

        (void) emul_stop(b);
        sd_event_source_disable_unref(e->efd_source);
        safe_close(e->efd);
        segpool_deinit(&e->base.pool);
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->cond);
        free(e);
}

static void emul_describe(VramEmul *e) {
        uint64_t bandwidth = __atomic_load_n(&e->bandwidth, __ATOMIC_RELAXED);

        if (bandwidth > 0)
                snprintf(e->base.description, sizeof(e->base.description),
                         "emulated (no GPU; memfd, link throttled to %.2f GB/s)", (double) bandwidth / 1e9);
        else
                snprintf(e->base.description, sizeof(e->base.description), "emulated (no GPU; memfd, unthrottled)");
}

static int emul_set_bandwidth(VramBackend *b, uint64_t bandwidth) {
        VramEmul *e = container_of(b, VramEmul, base);

        __atomic_store_n(&e->bandwidth, bandwidth, __ATOMIC_RELAXED);
        emul_describe(e);
        return 0;
}

static const VramBackendOps emul_ops = {
        .name = "emulated",
        .copy = emul_copy,
        .zero = emul_zero,
        .free = emul_free,
        .stop = emul_stop,
        .set_bandwidth = emul_set_bandwidth,
};

uint64_t vram_emul_capacity(const Config *c) {
        return c->vram_capacity ? c->vram_capacity : MAX(EMUL_DEFAULT_CAPACITY, c->vram_chunk_size);
}

int vram_emul_new(const Config *c, sd_event *event, VramBackend **ret) {
        return vram_emul_new_stored(c, event, NULL, ret);
}

int vram_emul_new_stored(const Config *c, sd_event *event, const MemfdSegConfig *store, VramBackend **ret) {
        VramEmul *e;
        int r;

        e = calloc(1, sizeof(*e));
        if (!e)
                return -ENOMEM;
        e->base.ops = &emul_ops;
        e->base.emulated = true;
        e->base.depth = 1;      /* one mover thread */
        e->base.numa_node = -1;
        e->bandwidth = c->vram_bandwidth;
        e->efd = -1;
        e->todo_tail = &e->todo_head;
        e->done_tail = &e->done_head;
        pthread_mutex_init(&e->lock, NULL);
        {
                /* the throttle waits on it with CLOCK_MONOTONIC deadlines */
                pthread_condattr_t ca;

                pthread_condattr_init(&ca);
                pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
                pthread_cond_init(&e->cond, &ca);
                pthread_condattr_destroy(&ca);
        }
        e->memfd = (MemfdSegConfig) {
                .name = "tierd-vram-emulated",
                .numa_node = -1,
                .lock = false,  /* emulated device memory need not be locked */
        };
        if (store) {
                e->memfd.adopt = store->adopt;
                e->memfd.made = store->made;
                e->memfd.store_userdata = store->store_userdata;
                e->memfd.adopting = store->adopting;
        }

        r = segpool_init(&e->base.pool, "memfd", &memfd_seg_ops, &e->memfd, vram_emul_capacity(c),
                         c->vram_chunk_size);
        e->memfd.adopting = false;
        if (r < 0)
                goto fail;

        e->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (e->efd < 0) {
                r = negative_errno();
                goto fail;
        }
        r = sd_event_add_io(event, &e->efd_source, e->efd, EPOLLIN, on_emul_done, e);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(e->efd_source, "vram-emul-done");

        r = -pthread_create(&e->thread, NULL, emul_thread, e);
        if (r < 0)
                goto fail;
        e->thread_ok = true;
        (void) pthread_setname_np(e->thread, "tierd-mover");

        emul_describe(e);
        *ret = &e->base;
        return 0;
fail:
        emul_free(&e->base);
        return r;
}
