/* SPDX-License-Identifier: MIT */
/* renew.h: segments' memory replaced on a worker thread, off the event loop. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct SegPool SegPool;
typedef struct SegRenewer SegRenewer;
typedef struct Segment Segment;
typedef struct sd_event sd_event;

/*
 * segrenewer_new() - a worker thread for @p (whose ops have drop_memory and
 * make_memory) and an eventfd source on @event through which it reports on
 * the loop; segpool_release() hands it the segments from then on.
 * @renewed: called on the loop after one or more segments came back in
 * service or failed to (room for ops waiting for space, or none to wait
 * for any more), with @userdata.
 */
int segrenewer_new(SegPool *p, sd_event *event, void (*renewed)(SegPool *p, void *userdata), void *userdata,
                   SegRenewer **ret);
/* Stop the worker once it has done what it was given (tierd's exit); the segments stay where they are. */
SegRenewer *segrenewer_free(SegRenewer *r);
/* Queue @seg (out of service, ops->unprepare done): its memory dropped and made anew on the worker. */
int segrenewer_queue(SegRenewer *r, Segment *seg);
/* Segments queued or being renewed now. */
unsigned segrenewer_pending(const SegRenewer *r);

/* Tests: while held, the worker takes no new segment (what is queued waits): orders, not times. */
void segrenewer_hold(SegRenewer *r, bool hold);
