/* SPDX-License-Identifier: MIT */
/* revoke.c: taking segments back from a job's clients cooperatively (Event.revoke, Request.ack). */

/*
 * Theory of operation: a CUDA VMM chunk that a client has imported and
 * mapped stays allocated on the device as long as that mapping exists,
 * whatever tierd does with its own handle.  So when tierd takes a chunk
 * back from a job whose clients are still connected (the pool ran dry and
 * the job holds the chunk empty), dropping it at once would free nothing:
 * the replacement chunk could not be allocated.  Instead segpool_release()
 * calls revoke_segment(), which sends Event.revoke{segment, generation} to
 * each connection of the job that was sent that generation, and the
 * segment waits out of service (Segment.revoking).  A client unmaps it and
 * answers with Request.ack (no Response: it may arrive while another
 * request of the same client is in flight).  When every connection asked
 * has acked, closed (its process unmapped everything, or is going), or
 * missed REVOKE_TIMEOUT_USEC (its connection is then closed: a client that
 * does not cooperate loses its session rather than hold up other jobs),
 * segpool_revoked() makes the chunk anew and ops waiting for space run
 * again.  A connection that closed without unmapping still holds the old
 * memory until its process lets go; making the new chunk may then fail,
 * and the segment stays out of service (logged).
 *
 * Only the grant-less state is revoked: the engine takes back segments with
 * nothing allocated in them, so no tensor of the client points into it.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include <systemd/sd-event.h>

#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/revoke.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"
#include "tier.pb-c.h"

struct Revoke {
        sd_event *event;
        Engine *engine;         /* its space waiters run again when a segment is back */
        List waits;             /* RevokeWait.link */
};

typedef struct RevokeWait {
        List link;              /* Revoke.waits */
        Revoke *revoke;
        Conn *conn;
        SegPool *pool;
        Segment *seg;
        uint32_t wire_id;       /* what the client knows the segment as */
        uint32_t generation;
        sd_event_source *timer;
} RevokeWait;

int revoke_new(sd_event *event, Engine *engine, Revoke **ret) {
        Revoke *v = calloc(1, sizeof(*v));

        if (!v)
                return -ENOMEM;
        v->event = event;
        v->engine = engine;
        list_init(&v->waits);
        *ret = v;
        return 0;
}

static void wait_free(RevokeWait *w) {
        list_del(&w->link);
        sd_event_source_disable_unref(w->timer);
        free(w);
}

Revoke *revoke_free(Revoke *v) {
        if (!v)
                return NULL;
        /* tierd is going: the segments waited for go with their pools */
        list_for_each_safe(n, tmp, &v->waits)
                wait_free(list_entry(n, RevokeWait, link));
        free(v);
        return NULL;
}

static bool seg_waited_for(const Revoke *v, const Segment *seg) {
        list_for_each_safe(n, tmp, &v->waits)
                if (list_entry(n, RevokeWait, link)->seg == seg)
                        return true;
        return false;
}

/* Forget @w; when it was the segment's last one, put the segment back in service. */
static void wait_done(RevokeWait *w) {
        Revoke *v = w->revoke;
        SegPool *p = w->pool;
        Segment *seg = w->seg;
        int r;

        wait_free(w);
        if (seg_waited_for(v, seg))
                return;
        r = segpool_revoked(p, seg);
        if (r < 0)
                log_tier(LOG_WARNING, r, level_to_string(p->tier), "Cannot renew %s segment %u after its revoke, "
                         "it stays out of service (an old client may still map its memory): %m",
                         level_to_string(p->tier), seg->id);
        else
                log_debug("%s segment %u is back in service after its revoke", level_to_string(p->tier), seg->id);
        engine_wake_space_waiters(v->engine);
}

static int on_revoke_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        RevokeWait *w = userdata;
        Conn *c = w->conn;

        log_job(LOG_WARNING, 0, c->job ? c->job->name : NULL,
                "Connection %" PRIu64 " (pid " PID_FMT ") did not give back %s segment %u within %llu ms, "
                "closing it", c->id, c->pid, level_to_string(w->pool->tier), w->wire_id, REVOKE_TIMEOUT_USEC / 1000);
        wait_done(w);
        conn_abort(c);
        return 0;
}

static int send_revoke(Conn *c, uint32_t wire_id, uint32_t generation) {
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__Revoke rv = TIER__REVOKE__INIT;

        rv.segment = wire_id;
        rv.generation = generation;
        rv.timeout_ms = (uint32_t) (REVOKE_TIMEOUT_USEC / 1000);
        ev.kind_case = TIER__EVENT__KIND_REVOKE;
        ev.revoke = &rv;
        return conn_send_event(c, &ev);
}

int revoke_segment(SegPool *p, Segment *seg, void *userdata) {
        Revoke *v = userdata;
        uint32_t wire_id = p->id_base + seg->id;
        Job *j = seg->owner;
        unsigned n = 0;
        uint64_t now;

        if (!j || sd_event_now(v->event, CLOCK_MONOTONIC, &now) < 0)
                return 0;
        list_for_each_safe(node, tmp, &j->conns) {
                Conn *c = list_entry(node, Conn, job_link);
                RevokeWait *w;
                int r;

                if (c->broken || c->closing || !conn_segment_known(c, wire_id, seg->generation))
                        continue;       /* never had it, or is on its way out */
                conn_segment_forget(c, wire_id);
                w = calloc(1, sizeof(*w));
                if (!w) {
                        conn_abort(c);
                        continue;
                }
                *w = (RevokeWait) {
                        .revoke = v,
                        .conn = c,
                        .pool = p,
                        .seg = seg,
                        .wire_id = wire_id,
                        .generation = seg->generation,
                };
                r = sd_event_add_time(v->event, &w->timer, CLOCK_MONOTONIC, now + REVOKE_TIMEOUT_USEC, 0,
                                      on_revoke_timeout, w);
                if (r >= 0)
                        r = send_revoke(c, wire_id, seg->generation);
                if (r < 0) {
                        /* a client we cannot ask cannot be waited for */
                        sd_event_source_disable_unref(w->timer);
                        free(w);
                        conn_abort(c);
                        continue;
                }
                (void) sd_event_source_set_description(w->timer, "revoke-timeout");
                list_add_tail(&v->waits, &w->link);
                n++;
        }
        if (n > 0)
                log_job(LOG_INFO, 0, j->name, "Taking %s segment %u back from job '%s': waiting for %u client(s) "
                        "to unmap it", level_to_string(p->tier), wire_id, j->name, n);
        return n > 0;
}

void revoke_ack(Revoke *v, Conn *c, const Tier__Ack *ack) {
        if (!ack)
                return;
        list_for_each_safe(n, tmp, &v->waits) {
                RevokeWait *w = list_entry(n, RevokeWait, link);

                if (w->conn == c && w->wire_id == ack->segment && w->generation == ack->generation) {
                        wait_done(w);
                        return;
                }
        }
}

void revoke_conn_gone(Revoke *v, Conn *c) {
        list_for_each_safe(n, tmp, &v->waits) {
                RevokeWait *w = list_entry(n, RevokeWait, link);

                if (w->conn == c)
                        wait_done(w);
        }
}
