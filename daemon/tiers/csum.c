/* SPDX-License-Identifier: MIT */
/* csum.c: crc32c of transfer extents on worker threads, results handed back on the event loop. */

/*
 * Theory of operation: every byte tierd moves to or from an NVMe target is
 * checksummed (crc32c per extent, engine/xfer.c): a write's before its
 * request goes to the ring, a read's before its bytes count as data.  At
 * several GB a step that is seconds of CPU, and on the event loop it would
 * delay every job's requests by as much.  So the engine hands each extent
 * here as a CsumJob (embedded in its request: no allocation) and goes on;
 * a worker computes the crc over the extent's host bytes and puts the job
 * on the done queue; an eventfd wakes the loop, which runs the callbacks in
 * the order the jobs finished: a write's request goes to the ring, a read is
 * checked and only then becomes data.  tierd writes no host copy in
 * transfer, but a client may (its segments are mapped writable: a bug, or
 * hostile), even while a worker reads them: the crc is then of whatever the
 * worker read, and nothing here can tell.  The engine can: it checksums a
 * written extent again once the write completed, and a second crc other
 * than the first is the client's doing, counted on its job, not on the
 * target (engine/xfer.c).  The guarantees are the engine's, unchanged: nothing
 * reaches the drive before its crc is taken, nothing read counts before
 * its crc is checked.  The queues and the counters are the only state the
 * threads share, under one mutex; callbacks run on the loop only.
 */

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/tiers/csum.h"
#include "proto/crc32c.h"
#include "proto/macro.h"

struct Csum {
        pthread_t threads[CSUM_THREADS_MAX];
        unsigned n_threads;             /* started */
        pthread_mutex_t lock;
        pthread_cond_t cond;
        CsumJob *todo, **todo_tail;     /* FIFO, the workers' */
        CsumJob *done, **done_tail;     /* FIFO, the loop's */
        unsigned pending;               /* queued and not yet back on the loop (the loop's) */
        uint64_t bytes_off_loop;        /* under lock */
        bool stop, hold;
        int efd;
        sd_event_source *source;
};

static void done_push(Csum *c, CsumJob *j) {
        uint64_t one = 1;

        j->next = NULL;
        *c->done_tail = j;
        c->done_tail = &j->next;
        (void) !write(c->efd, &one, sizeof(one));
}

static void *csum_thread(void *arg) {
        Csum *c = arg;

        pthread_mutex_lock(&c->lock);
        for (;;) {
                CsumJob *j;

                while (!c->stop && (c->hold || !c->todo))
                        pthread_cond_wait(&c->cond, &c->lock);
                if (c->stop)
                        break;
                j = c->todo;
                c->todo = j->next;
                if (!c->todo)
                        c->todo_tail = &c->todo;
                pthread_mutex_unlock(&c->lock);

                j->crc = crc32c(0, j->buf, j->len);

                pthread_mutex_lock(&c->lock);
                c->bytes_off_loop += j->len;
                done_push(c, j);
        }
        pthread_mutex_unlock(&c->lock);
        return NULL;
}

static int on_csum_done(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Csum *c = userdata;
        CsumJob *list;
        uint64_t v;

        (void) !read(c->efd, &v, sizeof(v));
        pthread_mutex_lock(&c->lock);
        list = c->done;
        c->done = NULL;
        c->done_tail = &c->done;
        pthread_mutex_unlock(&c->lock);

        /* a callback may queue new jobs (they come back in a later batch) and free the memory of this one */
        while (list) {
                CsumJob *j = list;

                list = j->next;
                c->pending--;
                j->cb(j);
        }
        return 0;
}

int csum_new(sd_event *event, unsigned threads, Csum **ret) {
        Csum *c;
        int r;

        if (threads > CSUM_THREADS_MAX)
                return -EINVAL;
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        c->efd = -1;
        c->todo_tail = &c->todo;
        c->done_tail = &c->done;
        pthread_mutex_init(&c->lock, NULL);
        pthread_cond_init(&c->cond, NULL);
        c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->efd < 0) {
                r = negative_errno();
                goto fail;
        }
        r = sd_event_add_io(event, &c->source, c->efd, EPOLLIN, on_csum_done, c);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(c->source, "checksum");
        for (unsigned i = 0; i < threads; i++) {
                r = -pthread_create(&c->threads[i], NULL, csum_thread, c);
                if (r < 0)
                        goto fail;
                c->n_threads++;
                (void) pthread_setname_np(c->threads[i], "tierd-csum");
        }
        *ret = c;
        return 0;
fail:
        csum_free(c);
        return r;
}

Csum *csum_free(Csum *c) {
        if (!c)
                return NULL;
        pthread_mutex_lock(&c->lock);
        c->stop = true;
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
        for (unsigned i = 0; i < c->n_threads; i++)
                pthread_join(c->threads[i], NULL);
        c->source = sd_event_source_disable_unref(c->source);
        safe_close(c->efd);
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
}

void csum_queue(Csum *c, CsumJob *job) {
        c->pending++;
        if (c->n_threads == 0) {
                job->crc = crc32c(0, job->buf, job->len);
                pthread_mutex_lock(&c->lock);
                done_push(c, job);
                pthread_mutex_unlock(&c->lock);
                return;
        }
        pthread_mutex_lock(&c->lock);
        job->next = NULL;
        *c->todo_tail = job;
        c->todo_tail = &job->next;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(&c->lock);
}

unsigned csum_pending(const Csum *c) {
        return c ? c->pending : 0;
}

uint64_t csum_bytes_off_loop(Csum *c) {
        uint64_t v;

        if (!c)
                return 0;
        pthread_mutex_lock(&c->lock);
        v = c->bytes_off_loop;
        pthread_mutex_unlock(&c->lock);
        return v;
}

unsigned csum_threads(const Csum *c) {
        return c ? c->n_threads : 0;
}

void csum_hold(Csum *c, bool hold) {
        pthread_mutex_lock(&c->lock);
        c->hold = hold;
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
}
