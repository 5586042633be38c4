/* SPDX-License-Identifier: MIT */
/* uring.c: the io_uring instance, its eventfd bridge to sd-event, CQE dispatch (tierd's and tierctl bench's). */

/*
 * Theory of operation: one ring serves every NVMe target.  Requests are
 * UringReq structs owned by the caller; the pointer travels in user_data.
 * uring_queue() puts a request on a pending list, ordered by virtual start
 * time (start-time fair queuing over the callers' flows, one per job, by
 * weight: what decides who goes first when a paced file is the bottleneck);
 * uring_flush(), run from a
 * post source once per loop iteration, turns as many pending requests into
 * SQEs as the ring has room for (at most @depth in flight) and submits them
 * in one io_uring_enter().  SQEs the kernel does not take at once (a
 * failed or short submit) stay in the ring and are offered again at the
 * next flush, and at the latest after SUBMIT_RETRY_USEC, so no request
 * waits for unrelated traffic.  Completion wakes the eventfd registered with the
 * ring; its sd-event handler drains the CQ in batches (the wakeup is a
 * hint: the CQ is drained until empty).  Short transfers are resumed and
 * -EAGAIN / -EINTR requeued, up to URING_MAX_AGAIN attempts in a row without
 * progress (then -EIO); any other error is retried once, then handed to
 * the request's callback.  The ring is refilled from the pending list before
 * the callbacks of a drained batch run, so the work they do (a write's
 * crc32c, a read's check) overlaps the device's.
 *
 * Injected faults (tests only): the owner's UringHooks (tierd's are
 * daemon/tiers/uring-faults.c) decide; this file carries them out.  Before
 * a request goes to the ring its attempt may be failed (put on the injected
 * list, which the eventfd handler completes like a CQE, so callbacks never
 * run inside uring_flush()) or cut short; when its CQE comes, the hook may
 * damage what it wrote, and the completion may be held back on the delayed
 * list for some ms.  Retries and callbacks are the same as for real faults.
 *
 * Nothing here logs: what is worth a message goes to the hooks.
 */

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "proto/macro.h"
#include "util/time-util.h"
#include "util/uring.h"

/* SQEs io_uring_submit() did not take (-EAGAIN, -EBUSY, short) are offered again after this long at most. */
#define SUBMIT_RETRY_USEC 1000
/* A hard submit error in a run of them is told to the hooks at the first and every this many: about 1/s. */
#define SUBMIT_REPORT_EVERY 1000u
/* A throttled file may run this far ahead of its pace, so the device always has work queued. */
#define THROTTLE_BURST_NS (2000000ull)
#define URING_MAX_FILES 16
/*
 * Plain start-time fair queuing gives a flow back nothing for the time it
 * had nothing queued: a job that computes, then reads in bursts, gets only
 * its weight's share during each burst and less than it over a step.  So a
 * flow back from idleness may start this many bytes of service behind.
 */
#define FAIR_CREDIT_DEFAULT (64ull << 20)

struct Uring {
        sd_event *event;
        sd_event_source *throttle_timer;
        sd_event_source *retry_timer;   /* SQEs the kernel did not take yet are submitted again */
        unsigned submit_errors;         /* hard submit errors in a row (UringHooks.submit_failed) */
        uint64_t bandwidth[URING_MAX_FILES];    /* bytes/s, 0: unthrottled */
        uint64_t next_ns[URING_MAX_FILES];      /* when the file's paced link is free again */
        struct io_uring ring;
        bool ring_ok;
        int efd;
        sd_event_source *efd_source;
        sd_event_source *post_source;
        unsigned depth;
        unsigned inflight;
        List pending;           /* by tag, then first come first served */
        double vtime;           /* virtual time: the tag of the request submitted last */
        uint64_t credit;        /* FAIR_CREDIT_DEFAULT, or uring_set_fair_credit() */
        const UringHooks *hooks;        /* NULL: none */
        void *hooks_userdata;
        bool faults;            /* hooks->fault_submit is set: injected faults (tests only) */
        int fds[URING_MAX_FILES];       /* the registered files (borrowed): uring_file() */
        unsigned n_fds;
        List injected;          /* attempts failed without the kernel: completed by the eventfd handler */
        List delayed;           /* completions held back, by delay_until */
        sd_event_source *delay_timer;
};

static double req_tag(const List *n) {
        return list_entry(n, const UringReq, link)->tag;
}

static void pending_insert(Uring *u, UringReq *req) {
        fair_insert(&u->pending, &req->link, req->tag, req_tag);
}

/* @req's final result is @res: its callback runs once the ring is refilled (uring_drain()). */
static void uring_done(List *done, UringReq *req, int res) {
        req->result = res;
        list_add_tail(done, &req->link);
}

static void uring_complete(Uring *u, UringReq *req, int res, List *done) {
        /* a request resumed or retried keeps its tag: it goes before later arrivals */
        if (res == -EAGAIN || res == -EINTR) {
                if (++req->again < URING_MAX_AGAIN) {
                        pending_insert(u, req);
                        return;
                }
                uring_done(done, req, -EIO);    /* a device that says so for good: no busy loop */
                return;
        }
        if (res < 0) {
                if (req->retries++ < 1) {
                        pending_insert(u, req);
                        return;
                }
                uring_done(done, req, res);
                return;
        }
        if (res == 0) {
                /* no progress: end of file or device */
                if (req->retries++ < 1) {
                        pending_insert(u, req);
                        return;
                }
                uring_done(done, req, -EIO);
                return;
        }
        req->done += (uint32_t) res;
        req->again = 0;
        if (req->done < req->len) {
                pending_insert(u, req);
                return;
        }
        uring_done(done, req, (int) req->done);
}

static bool fault_on_cqe(Uring *u, UringReq *req, int res);

static int uring_drain(Uring *u) {
        struct io_uring_cqe *cqe;
        unsigned head, n, n_inj;
        List done;

        for (;;) {
                list_init(&done);
                n = n_inj = 0;
                while (!list_empty(&u->injected)) {
                        UringReq *req = list_entry(u->injected.next, UringReq, link);

                        list_del(&req->link);
                        n_inj++;
                        uring_complete(u, req, req->result, &done);
                }
                io_uring_for_each_cqe(&u->ring, head, cqe) {
                        UringReq *req = io_uring_cqe_get_data(cqe);

                        n++;
                        u->inflight--;
                        if (u->faults && fault_on_cqe(u, req, cqe->res))
                                continue;
                        uring_complete(u, req, cqe->res, &done);
                }
                if (n == 0 && n_inj == 0)
                        break;
                if (n > 0)
                        io_uring_cq_advance(&u->ring, n);
                /* the device gets its next requests before the callbacks' CPU work */
                (void) uring_flush(u);
                while (!list_empty(&done)) {
                        UringReq *req = list_entry(done.next, UringReq, link);

                        list_del(&req->link);
                        req->cb(req, req->result);
                }
        }
        return 0;
}

static int on_uring_event(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        Uring *u = userdata;
        uint64_t v;

        (void) read(u->efd, &v, sizeof(v));
        uring_drain(u);
        uring_flush(u);
        return 0;
}

static int on_uring_post(sd_event_source *s, void *userdata) {
        uring_flush(userdata);
        return 0;
}

static int on_throttle_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        uring_flush(userdata);
        return 0;
}

static int on_retry_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Uring *u = userdata;

        u->retry_timer = sd_event_source_disable_unref(u->retry_timer);
        uring_flush(u);
        return 0;
}

/*
 * Give the kernel every SQE made and not yet taken.  What it does not take
 * now stays in the SQ ring and is retried: at the next flush, and by a timer
 * in case nothing else comes.  Returns how many it took, or -errno.
 */
static int uring_submit_ready(Uring *u) {
        unsigned ready = io_uring_sq_ready(&u->ring);
        uint64_t now = 0;
        int r;

        if (ready == 0)
                return 0;
        r = io_uring_submit(&u->ring);
        if (r >= 0)
                u->submit_errors = 0;
        if (r >= 0 && (unsigned) r >= ready)
                return r;
        if (r < 0 && r != -EAGAIN && r != -EBUSY && r != -EINTR && u->hooks && u->hooks->submit_failed) {
                /* retried every SUBMIT_RETRY_USEC: told at the first of a run, then now and then */
                u->submit_errors++;
                if (u->submit_errors == 1 || u->submit_errors % SUBMIT_REPORT_EVERY == 0)
                        u->hooks->submit_failed(u, r, ready, u->submit_errors, u->hooks_userdata);
        }
        if (!u->retry_timer && sd_event_now(u->event, CLOCK_MONOTONIC, &now) >= 0 &&
            sd_event_add_time(u->event, &u->retry_timer, CLOCK_MONOTONIC, now + SUBMIT_RETRY_USEC, 0,
                              on_retry_timer, u) >= 0)
                (void) sd_event_source_set_description(u->retry_timer, "uring-submit-retry");
        return r;
}

int uring_set_throttle(Uring *u, unsigned file_index, uint64_t bytes_per_sec) {
        if (file_index >= URING_MAX_FILES)
                return -EINVAL;
        u->bandwidth[file_index] = bytes_per_sec;
        return 0;
}

/* May @req go now?  If not, *@wake_ns says when it may. */
static bool throttle_admit(Uring *u, const UringReq *req, uint64_t now, uint64_t *wake_ns) {
        unsigned f = req->file_index;
        uint64_t bw, start;

        if (f >= URING_MAX_FILES || (bw = u->bandwidth[f]) == 0)
                return true;
        start = MAX(u->next_ns[f], now);
        if (start > now + THROTTLE_BURST_NS) {
                uint64_t at = start - THROTTLE_BURST_NS;

                if (*wake_ns == 0 || at < *wake_ns)
                        *wake_ns = at;
                return false;
        }
        u->next_ns[f] = start + (uint64_t) (req->len - req->done) * 1000000000ull / bw;
        return true;
}

int uring_new(sd_event *event, unsigned depth, Uring **ret) {
        Uring *u;
        int r;

        u = calloc(1, sizeof(*u));
        if (!u)
                return -ENOMEM;
        u->efd = -1;
        u->depth = depth;
        u->credit = FAIR_CREDIT_DEFAULT;
        u->event = sd_event_ref(event);
        list_init(&u->pending);
        list_init(&u->injected);
        list_init(&u->delayed);

        r = io_uring_queue_init(depth, &u->ring, 0);
        if (r < 0)
                goto fail;
        u->ring_ok = true;

        u->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (u->efd < 0) {
                r = negative_errno();
                goto fail;
        }
        r = io_uring_register_eventfd(&u->ring, u->efd);
        if (r < 0)
                goto fail;
        r = sd_event_add_io(event, &u->efd_source, u->efd, EPOLLIN, on_uring_event, u);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(u->efd_source, "uring-completion");
        r = sd_event_add_post(event, &u->post_source, on_uring_post, u);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(u->post_source, "uring-submit");

        *ret = u;
        return 0;
fail:
        uring_free(u);
        return r;
}

Uring *uring_free(Uring *u) {
        if (!u)
                return NULL;
        sd_event_source_disable_unref(u->efd_source);
        sd_event_source_disable_unref(u->post_source);
        sd_event_source_disable_unref(u->throttle_timer);
        sd_event_source_disable_unref(u->retry_timer);
        sd_event_source_disable_unref(u->delay_timer);
        sd_event_unref(u->event);
        if (u->ring_ok) {
                /* what the kernel never took (an error, or a short submit) will not complete: only wait for
                 * the rest (a short submit left some counted: the wait for them never ended) */
                if (io_uring_sq_ready(&u->ring) > 0)
                        (void) io_uring_submit(&u->ring);
                u->inflight -= MIN(u->inflight, io_uring_sq_ready(&u->ring));
                /* wait for what is still in flight: its buffers are about to go */
                while (u->inflight > 0) {
                        struct io_uring_cqe *cqe;

                        if (io_uring_wait_cqe(&u->ring, &cqe) < 0)
                                break;
                        io_uring_cqe_seen(&u->ring, cqe);
                        u->inflight--;
                }
                io_uring_queue_exit(&u->ring);
        }
        safe_close(u->efd);
        free(u);
        return NULL;
}

int uring_register_files(Uring *u, const int *fds, unsigned n) {
        u->n_fds = MIN(n, (unsigned) URING_MAX_FILES);
        memcpy(u->fds, fds, u->n_fds * sizeof(int));
        return io_uring_register_files(&u->ring, fds, n);
}

int uring_register_buffers(Uring *u, unsigned n) {
        return io_uring_register_buffers_sparse(&u->ring, n);
}

int uring_set_buffer(Uring *u, unsigned index, void *base, size_t len) {
        struct iovec iov = { .iov_base = base, .iov_len = len };
        __u64 tag = 0;
        int r;

        r = io_uring_register_buffers_update_tag(&u->ring, index, &iov, &tag, 1);
        return r < 0 ? r : 0;
}

void uring_set_fair_credit(Uring *u, uint64_t bytes) {
        u->credit = bytes;
}

void uring_queue(Uring *u, UringReq *req) {
        if (!req->tagged) {
                req->tag = req->flow ? fair_tag(req->flow, u->vtime, req->len, req->weight, u->credit) : u->vtime;
                req->tagged = true;
                req->fault_mask = u->faults && u->hooks->fault_mask ?
                        u->hooks->fault_mask(u, req->job, u->hooks_userdata) : 0;
        }
        pending_insert(u, req);
}

bool uring_busy(const Uring *u) {
        return u->inflight > 0 || !list_empty(&u->pending) || !list_empty(&u->injected) || !list_empty(&u->delayed);
}

void uring_counts(const Uring *u, unsigned *ret_queued, unsigned *ret_inflight) {
        unsigned n = 0;

        list_for_each_safe(node, tmp, &u->pending)
                n++;
        *ret_queued = n;
        *ret_inflight = u->inflight;
}

/* ---- hooks, and injected faults (tests only) ------------------------------------------------------ */

void uring_set_hooks(Uring *u, const UringHooks *hooks, void *userdata) {
        u->hooks = hooks;
        u->hooks_userdata = userdata;
        u->faults = hooks && hooks->fault_submit;
}

int uring_file(const Uring *u, unsigned index) {
        return index < u->n_fds ? u->fds[index] : -EBADF;
}

/* Before @req (still on the pending list) goes to the ring: fail this attempt instead? */
static bool fault_on_submit(Uring *u, UringReq *req) {
        int res = u->hooks->fault_submit(u, req, u->hooks_userdata);

        if (res >= 0)
                return false;
        list_del(&req->link);
        req->result = res;
        list_add_tail(&u->injected, &req->link);
        (void) eventfd_write(u->efd, 1);        /* the completion handler picks it up */
        return true;
}

/* The length to submit for @req's attempt of @len bytes. */
static unsigned fault_short(Uring *u, UringReq *req, unsigned len) {
        return u->hooks->fault_short ? u->hooks->fault_short(u, req, len, u->hooks_userdata) : len;
}

static int on_delay_timer(sd_event_source *s, uint64_t usec, void *userdata);

static void arm_delay_timer(Uring *u) {
        UringReq *first;

        u->delay_timer = sd_event_source_disable_unref(u->delay_timer);
        if (list_empty(&u->delayed))
                return;
        first = list_entry(u->delayed.next, UringReq, link);
        if (sd_event_add_time(u->event, &u->delay_timer, CLOCK_MONOTONIC, first->delay_until / 1000 + 1, 1000,
                              on_delay_timer, u) >= 0)
                (void) sd_event_source_set_description(u->delay_timer, "uring-fault-delay");
}

/* The CQE of @req's attempt came with @res: hold it back?  True: held back. */
static bool fault_on_cqe(Uring *u, UringReq *req, int res) {
        uint64_t ms = 0;

        if (!u->hooks->fault_cqe || !u->hooks->fault_cqe(u, req, res, &ms, u->hooks_userdata))
                return false;
        req->result = res;
        req->delay_until = now_ns() + ms * 1000000ull;
        /* in order of delay_until: before the first that is due later */
        {
                List *pos = &u->delayed;

                list_for_each_safe(n, tmp, &u->delayed)
                        if (list_entry(n, UringReq, link)->delay_until > req->delay_until) {
                                pos = n;
                                break;
                        }
                list_add_tail(pos, &req->link);         /* inserts before @pos */
        }
        arm_delay_timer(u);
        return true;
}

static int on_delay_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Uring *u = userdata;
        uint64_t now = now_ns();

        while (!list_empty(&u->delayed)) {
                UringReq *req = list_entry(u->delayed.next, UringReq, link);

                if (req->delay_until > now)
                        break;
                list_del(&req->link);
                list_add_tail(&u->injected, &req->link);
        }
        arm_delay_timer(u);
        uring_drain(u);
        uring_flush(u);
        return 0;
}

int uring_flush(Uring *u) {
        uint64_t now = 0, wake_ns = 0;
        List blocked;

        list_init(&blocked);
        while (!list_empty(&u->pending) && u->inflight < u->depth) {
                UringReq *req = list_entry(u->pending.next, UringReq, link);
                struct io_uring_sqe *sqe;
                uint8_t *buf = req->buf + req->done;
                unsigned len = req->len - req->done;
                uint64_t off = req->offset + req->done;

                if (req->file_index < URING_MAX_FILES && u->bandwidth[req->file_index]) {
                        if (!now)
                                now = now_ns();
                        if (!throttle_admit(u, req, now, &wake_ns)) {
                                /* keep order per file: set it aside, others may go */
                                list_del(&req->link);
                                list_add_tail(&blocked, &req->link);
                                continue;
                        }
                }
                if (u->faults && fault_on_submit(u, req))
                        continue;
                sqe = io_uring_get_sqe(&u->ring);
                if (!sqe)
                        break;
                list_del(&req->link);
                if (u->faults)
                        len = fault_short(u, req, len);
                if (req->prep) {
                        req->prep(req);
                        req->prep = NULL;
                }
                if (req->buf_index >= 0) {
                        if (req->op == URING_READ)
                                io_uring_prep_read_fixed(sqe, (int) req->file_index, buf, len, off, req->buf_index);
                        else
                                io_uring_prep_write_fixed(sqe, (int) req->file_index, buf, len, off, req->buf_index);
                } else {
                        if (req->op == URING_READ)
                                io_uring_prep_read(sqe, (int) req->file_index, buf, len, off);
                        else
                                io_uring_prep_write(sqe, (int) req->file_index, buf, len, off);
                }
                sqe->flags |= IOSQE_FIXED_FILE;
                io_uring_sqe_set_data(sqe, req);
                u->vtime = MAX(u->vtime, req->tag);
                u->inflight++;
        }
        /* throttled requests go back to the front, in their order */
        if (!list_empty(&blocked)) {
                list_splice_tail(&blocked, &u->pending);        /* blocked, then what was not reached */
                list_splice_tail(&u->pending, &blocked);
        }
        if (wake_ns) {
                uint64_t usec = wake_ns / 1000 + 1;

                /* a fresh one-shot timer each time (accuracy 1 us: pacing needs precision) */
                u->throttle_timer = sd_event_source_disable_unref(u->throttle_timer);
                if (sd_event_add_time(u->event, &u->throttle_timer, CLOCK_MONOTONIC, usec, 1,
                                      on_throttle_timer, u) >= 0)
                        (void) sd_event_source_set_description(u->throttle_timer, "uring-throttle");
        }
        /* also what an earlier flush could not submit */
        return uring_submit_ready(u);
}
