/* SPDX-License-Identifier: MIT */
/* renew.c: segments' memory replaced on a worker thread, off the event loop. */

/*
 * Theory of operation: a segment a job gives back gets fresh memory (its
 * old pages may still be mapped by the job's clients).  Dropping a locked
 * mapping and making, locking and faulting in a new one costs time in
 * proportion to its size: a job of 3 GB ending held the event loop for
 * 1.8 s, every job's requests waiting.  So segpool_release() does on the
 * loop only what must run there (ops->unprepare: the io_uring fixed buffer
 * and DMA registration go), marks the segment renewing (out of service:
 * segpool_assign() passes it over, nothing on the loop reads its memory
 * fields) and queues it here.  The worker runs ops->drop_memory and
 * ops->make_memory (system calls on a memfd and a mapping: nothing of
 * tierd's state, no logging) and moves the segment to the done queue; an
 * eventfd wakes the loop, which runs ops->prepare (registration again) and
 * puts the segment back in service, or, when anything failed, logs it and
 * leaves the segment out of service, as the synchronous path does.  The
 * queues are the only state both threads touch, under one mutex.
 */

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/tiers/renew.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"

typedef struct Job_ {
        Segment *seg;
        int error;              /* 0, or what drop_memory/make_memory returned */
        struct Job_ *next;
} RenewJob;

struct SegRenewer {
        SegPool *pool;
        pthread_t thread;
        bool started;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        RenewJob *todo, **todo_tail;    /* FIFO, the worker's */
        RenewJob *done, **done_tail;    /* FIFO, the loop's */
        unsigned pending;               /* queued and not yet back on the loop */
        bool stop, hold, busy;
        int efd;
        sd_event_source *source;
        void (*renewed)(SegPool *p, void *userdata);
        void *userdata;
};

static void *renew_thread(void *arg) {
        SegRenewer *r = arg;

        pthread_mutex_lock(&r->lock);
        for (;;) {
                RenewJob *j;
                uint64_t one = 1;

                while (!r->stop && (r->hold || !r->todo))
                        pthread_cond_wait(&r->cond, &r->lock);
                if (!r->todo)
                        break;          /* stopping, and nothing left */
                j = r->todo;
                r->todo = j->next;
                if (!r->todo)
                        r->todo_tail = &r->todo;
                r->busy = true;
                pthread_mutex_unlock(&r->lock);

                r->pool->ops->drop_memory(r->pool, j->seg);
                j->error = r->pool->ops->make_memory(r->pool, j->seg, r->pool->seg_size);

                pthread_mutex_lock(&r->lock);
                r->busy = false;
                j->next = NULL;
                *r->done_tail = j;
                r->done_tail = &j->next;
                pthread_cond_broadcast(&r->cond);
                (void) !write(r->efd, &one, sizeof(one));
        }
        pthread_mutex_unlock(&r->lock);
        return NULL;
}

static int on_renewed(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        SegRenewer *r = userdata;
        RenewJob *list;
        uint64_t v;
        unsigned got = 0;

        (void) !read(r->efd, &v, sizeof(v));
        pthread_mutex_lock(&r->lock);
        list = r->done;
        r->done = NULL;
        r->done_tail = &r->done;
        pthread_mutex_unlock(&r->lock);

        while (list) {
                RenewJob *j = list;
                Segment *seg = j->seg;
                int q = j->error;

                list = j->next;
                free(j);
                r->pending--;
                got++;
                if (q >= 0 && r->pool->ops->prepare)
                        q = r->pool->ops->prepare(r->pool, seg);
                seg->renewing = false;
                r->pool->n_renewing--;
                if (q < 0) {
                        log_warning_errno(q, "Cannot renew segment %u of the %s pool, it stays out of service: %m",
                                          seg->id, r->pool->kind);
                        continue;
                }
                r->pool->n_free++;
        }
        /*
         * Waiters wait while segments renew (reclaim(), copy_reserve()): they are woken when the last
         * of a batch fails too, to find room elsewhere or fail, not to wait for segments that never come.
         */
        if (got > 0 && r->renewed)
                r->renewed(r->pool, r->userdata);
        return 0;
}

int segrenewer_new(SegPool *p, sd_event *event, void (*renewed)(SegPool *p, void *userdata), void *userdata,
                   SegRenewer **ret) {
        SegRenewer *r;
        int q;

        if (!p->ops->drop_memory || !p->ops->make_memory)
                return -EOPNOTSUPP;
        r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        *r = (SegRenewer) {
                .pool = p,
                .efd = -1,
                .renewed = renewed,
                .userdata = userdata,
        };
        r->todo_tail = &r->todo;
        r->done_tail = &r->done;
        pthread_mutex_init(&r->lock, NULL);
        pthread_cond_init(&r->cond, NULL);
        r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (r->efd < 0) {
                q = negative_errno();
                goto fail;
        }
        q = sd_event_add_io(event, &r->source, r->efd, EPOLLIN, on_renewed, r);
        if (q < 0)
                goto fail;
        (void) sd_event_source_set_description(r->source, "segment-renew");
        q = -pthread_create(&r->thread, NULL, renew_thread, r);
        if (q < 0)
                goto fail;
        r->started = true;
        (void) pthread_setname_np(r->thread, "tierd-renew");     /* top -H, /proc/PID/task/TID/comm */
        p->renewer = r;
        *ret = r;
        return 0;
fail:
        segrenewer_free(r);
        return q;
}

SegRenewer *segrenewer_free(SegRenewer *r) {
        if (!r)
                return NULL;
        if (r->started) {
                pthread_mutex_lock(&r->lock);
                r->stop = true;
                r->hold = false;
                pthread_cond_broadcast(&r->cond);
                pthread_mutex_unlock(&r->lock);
                pthread_join(r->thread, NULL);
        }
        /* what came back and was not taken on the loop (never registered again): its memory goes */
        while (r->done) {
                RenewJob *j = r->done;

                r->done = j->next;
                r->pool->ops->drop_memory(r->pool, j->seg);
                j->seg->renewing = false;
                r->pool->n_renewing--;
                free(j);
        }
        if (r->pool && r->pool->renewer == r)
                r->pool->renewer = NULL;
        r->source = sd_event_source_disable_unref(r->source);
        safe_close(r->efd);
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return NULL;
}

int segrenewer_queue(SegRenewer *r, Segment *seg) {
        RenewJob *j = calloc(1, sizeof(*j));

        if (!j)
                return -ENOMEM;
        j->seg = seg;
        seg->renewing = true;
        r->pool->n_renewing++;
        r->pending++;
        pthread_mutex_lock(&r->lock);
        *r->todo_tail = j;
        r->todo_tail = &j->next;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
        return 0;
}

unsigned segrenewer_pending(const SegRenewer *r) {
        return r ? r->pending : 0;
}

void segrenewer_hold(SegRenewer *r, bool hold) {
        pthread_mutex_lock(&r->lock);
        r->hold = hold;
        pthread_cond_broadcast(&r->cond);
        pthread_mutex_unlock(&r->lock);
}
