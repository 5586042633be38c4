/* SPDX-License-Identifier: MIT */
/* csum.h: crc32c of transfer extents on worker threads, results handed back on the event loop. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Csum Csum;
typedef struct CsumJob CsumJob;
typedef struct sd_event sd_event;

/* Called on the event loop once job->crc holds the checksum of job->buf. */
typedef void (*csum_cb_t)(CsumJob *job);

/* Embedded in the caller's request; it must stay put from csum_queue() until its callback runs. */
struct CsumJob {
        const uint8_t *buf;     /* tierd does not write it while the job is queued (a client may: xfer.c) */
        size_t len;
        csum_cb_t cb;
        uint32_t crc;           /* the result, crc32c(0, buf, len) */
        CsumJob *next;          /* Csum's queues */
};

/* The most worker threads one checksummer runs. */
#define CSUM_THREADS_MAX 16u

/*
 * csum_new() - @threads worker threads (0: the checksums are computed on
 * the loop, in csum_queue(), and still handed back through the eventfd,
 * for comparison and tests) and an eventfd source on @event through which
 * finished jobs come back, in batches, to their callbacks.
 */
int csum_new(sd_event *event, unsigned threads, Csum **ret);
/*
 * Stop the workers once the job each is on is done (tierd's exit): jobs
 * still queued or done and not yet handed back are dropped, their
 * callbacks never run (the transfers they belong to are abandoned).
 */
Csum *csum_free(Csum *c);
void csum_queue(Csum *c, CsumJob *job);

/* For status and tests: jobs queued or running and not yet back on the loop; bytes checksummed off the loop. */
unsigned csum_pending(const Csum *c);
uint64_t csum_bytes_off_loop(Csum *c);
unsigned csum_threads(const Csum *c);

/* Tests: while held, the workers take no new job (what is queued waits): orders, not times. */
void csum_hold(Csum *c, bool hold);
