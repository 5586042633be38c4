/* SPDX-License-Identifier: MIT */
/* fairq.h: start-time fair queuing tags, for the NVMe queue (util/uring.c) and tierd's VRAM link (engine/xfer.c). */
#pragma once

#include <stdint.h>

#include "proto/macro.h"
#include "util/list.h"

/*
 * A flow: one job's requests on one link.  A request of @len bytes from a
 * flow of weight w gets the virtual start time (tag) max(flow's last finish,
 * V - credit / w) and moves the flow's finish to tag + len / w; the link
 * serves the smallest tag first and sets V to the tag it serves.  Backlogged
 * flows then share the link by weight; a flow back from idleness may start
 * up to @credit bytes of service behind the others (a bounded catch-up, so
 * that a job that computes and then transfers in bursts gets its share over
 * a step and not only during each burst).
 */
typedef struct FairFlow {
        double finish;          /* virtual finish time of the flow's last request */
} FairFlow;

static inline double fair_tag(FairFlow *f, double vtime, uint64_t len, unsigned weight, uint64_t credit) {
        double w = (double) MAX(weight, 1u), tag = MAX(f->finish, vtime - (double) credit / w);

        f->finish = tag + (double) len / w;
        return tag;
}

/*
 * Put @node (tag @tag) into @head, a list ordered by tag: after those with the
 * same or a smaller tag (first come, first served among equals).  @tag_of
 * reads a queued node's tag.  The newest usually goes last: walk from the tail.
 */
static inline void fair_insert(List *head, List *node, double tag, double (*tag_of)(const List *n)) {
        List *pos = head;

        while (pos->prev != head && tag_of(pos->prev) > tag)
                pos = pos->prev;
        list_add_tail(pos, node);
}
