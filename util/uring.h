/* SPDX-License-Identifier: MIT */
/* uring.h: the io_uring instance, its eventfd bridge to sd-event, CQE dispatch (tierd's and tierctl bench's). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include <systemd/sd-event.h>

#include "util/fairq.h"
#include "util/list.h"

typedef struct Uring Uring;
typedef struct UringReq UringReq;

/* Called on the event loop with the final result: bytes done (== len) or -errno. */
typedef void (*uring_cb_t)(UringReq *req, int res);

/*
 * Attempts of a request that may come back -EAGAIN or -EINTR in a row, without progress, before it
 * fails with -EIO: a device saying so for good would otherwise be retried in a busy loop.
 */
#define URING_MAX_AGAIN 16u

typedef enum UringOp {
        URING_READ,
        URING_WRITE,
} UringOp;

/*
 * Requests waiting for a file go in order of their virtual start times
 * (fairq.h): flows of backlogged jobs share a throttled file by weight.
 */
struct UringReq {
        uring_cb_t cb;
        void (*prep)(UringReq *req);    /* optional: runs once, just before the request first goes to the ring */
        FairFlow *flow;         /* NULL: served at the current virtual time (no share) */
        unsigned weight;        /* the flow's weight (0 counts as 1) */
        double tag;             /* virtual start time, set by uring_queue() */
        bool tagged;            /* tag set: a new request starts with this false (zeroed struct) */
        UringOp op;
        unsigned file_index;    /* registered file */
        int buf_index;          /* registered buffer, or -1 for a plain buffer */
        uint8_t *buf;
        uint32_t len;
        uint64_t offset;        /* file offset */
        uint32_t done;          /* bytes transferred so far (short I/O is resumed) */
        unsigned retries;
        unsigned again;         /* attempts come back -EAGAIN / -EINTR in a row since the last progress */
        int result;             /* the final result, until the callback runs (or an injected fault's) */
        const char *job;        /* whose request (injected faults select by it); read by uring_queue() only */
        uint32_t fault_mask;    /* the fault rules that may fire for it (UringHooks.fault_mask), set by uring_queue() */
        uint64_t delay_until;   /* an injected FAULT_DELAY: CLOCK_MONOTONIC ns its completion is handed on */
        List link;              /* Uring.pending while waiting for an SQE; then the batch of completed ones */
};

/*
 * What the ring's owner hears of, and (tests only) the faults it injects.
 * Every member may be NULL; the fault_ ones are asked only when
 * fault_submit is set.  Each gets the userdata of uring_set_hooks().
 */
typedef struct UringHooks {
        /*
         * io_uring_submit() failed with @error (not -EAGAIN, -EBUSY, -EINTR) with @ready SQEs, the
         * @in_a_row-th time since one went: they are retried (every millisecond).  Told at the first
         * failure of such a run and at every 1000th, not at each.
         */
        void (*submit_failed)(Uring *u, int error, unsigned ready, unsigned in_a_row, void *userdata);
        /* The mask of the rules that may fire for requests of job @job (UringReq.fault_mask). */
        uint32_t (*fault_mask)(Uring *u, const char *job, void *userdata);
        /* Before an attempt of @req goes to the ring: -errno fails it (completed as if by a CQE), 0 lets it go. */
        int (*fault_submit)(Uring *u, const UringReq *req, void *userdata);
        /* The bytes to submit of an attempt of @len bytes (@len: not cut short). */
        unsigned (*fault_short)(Uring *u, const UringReq *req, unsigned len, void *userdata);
        /* The CQE of an attempt came with @res: hold its completion back *@ret_ms ms?  (true: yes) */
        bool (*fault_cqe)(Uring *u, const UringReq *req, int res, uint64_t *ret_ms, void *userdata);
} UringHooks;

/**
 * uring_new() - set up a ring of @depth entries and hook its completions
 * into @event through an eventfd source.  Logs nothing: the caller says
 * what failed.
 */
int uring_new(sd_event *event, unsigned depth, Uring **ret);
Uring *uring_free(Uring *u);

/* Register @n files (fds borrowed) as fixed files. */
int uring_register_files(Uring *u, const int *fds, unsigned n);
/* Register a sparse table of @n fixed buffers, filled with uring_set_buffer(). */
int uring_register_buffers(Uring *u, unsigned n);
int uring_set_buffer(Uring *u, unsigned index, void *base, size_t len);

/* How far (bytes of service) a flow back from idleness may start behind the others (default 64 MiB). */
void uring_set_fair_credit(Uring *u, uint64_t bytes);

/*
 * Hook @hooks (borrowed; NULL: none) into @u, with @userdata: injected
 * faults apply to the requests queued from then on.
 */
void uring_set_hooks(Uring *u, const UringHooks *hooks, void *userdata);
/* The fd of registered file @index (borrowed), or -EBADF. */
int uring_file(const Uring *u, unsigned index);

/* Pace submissions to file @file_index at @bytes_per_sec (0: unthrottled). */
int uring_set_throttle(Uring *u, unsigned file_index, uint64_t bytes_per_sec);

/*
 * Queue a request; it is submitted in a batch by uring_flush() (or when the
 * SQ fills), in order of virtual start time (fairq.h).  The flow is
 * read here only: it may go away while the request is in flight.
 */
void uring_queue(Uring *u, UringReq *req);
/* Submit everything queued; called once per event loop iteration. */
int uring_flush(Uring *u);
/* Is anything queued or in flight? */
bool uring_busy(const Uring *u);
/* Requests waiting for the ring, and with the kernel (for status and metrics; linear in the queue). */
void uring_counts(const Uring *u, unsigned *ret_queued, unsigned *ret_inflight);
