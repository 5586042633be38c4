/* SPDX-License-Identifier: MIT */
/* fence.h: layout of a job's fence page, shared read-only with its clients. */
#pragma once

#include <stdint.h>

/*
 * Each connection of a job owns one slot.  Fences are numbered per
 * connection from 1 upwards, in the order tierd accepted the requests.
 * done[slot] is a watermark: every fence <= done[slot] has completed.
 * failed[slot] counts fences of that slot that completed with an error;
 * when it changes the client reads FenceFailed events from its socket to
 * learn which ones.  tierd writes with release ordering, clients read with
 * acquire ordering; after advancing a slot tierd writes a token to the
 * connection's wakeup pipe (HelloReply.fence_eventfd, its read end), so a
 * client that found done[slot] too small may sleep on it.
 *
 * A slot freed by a closed connection goes to the job's next one: done[slot]
 * restarts at 0, but failed[slot] is bumped by one (before done is reset),
 * never reset, and a client takes failed[slot] at its Hello as its base.  The
 * closed connection's client, if it has not looked yet, then sees a failure it
 * has no event for, finds its socket closed and fails its fences with that,
 * instead of reading the next connection's done[slot] as its own.
 */
#define FENCE_SLOTS 256     /* max connections per job: fits one 4 KiB page */

typedef struct FencePage {
        uint64_t done[FENCE_SLOTS];
        uint64_t failed[FENCE_SLOTS];
} FencePage;

_Static_assert(sizeof(FencePage) == 4096, "fence page is one page");
