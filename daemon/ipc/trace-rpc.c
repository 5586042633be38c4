/* SPDX-License-Identifier: MIT */
/* trace-rpc.c: the trace requests (TraceStart, TraceStop): who may trace, one trace at a time, the dump. */

/*
 * Theory of operation: the recorder is the engine's (engine/trace.c); this
 * is who may use it and the wire.  Tracing shows every job's tensor names
 * and timing, so it needs root or group tier-admin (rpc.c's
 * rpc_conn_is_admin()); a denial is logged and answered with the peer's uid
 * and pid.  There is one trace at a time in the daemon: it belongs to the
 * connection that started it (Trace.owner) and ends with it, so a tierctl
 * that dies leaves nothing behind; a second TraceStart gets -EBUSY naming
 * the holder.  A timer stops the recording after the seconds asked for
 * (the records stay for TraceStop).  TraceStop sends the records as they
 * are in memory (proto/trace.h) in a sealed memfd, with the growth of the
 * engine's link counters over the same span, so that the client can check
 * that the transfers add up.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/trace.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/trace-rpc.h"
#include "proto/macro.h"
#include "tier.pb-c.h"
#include "util/time-util.h"

/* Stop recording now, taking the link counters' values of the moment. */
static void trace_halt(Engine *e) {
        Trace *tr = &e->trace;

        if (!tr->on)
                return;
        trace_stop(tr, now_ns());
        for (int i = 0; i < _LINK_MAX; i++)
                tr->links_stop[i] = e->links[i].bytes;
        log_info("Trace stopped: %u record(s) kept, %llu dropped (buffer of %u)", tr->n,
                 (unsigned long long) tr->dropped, tr->cap);
}

static int on_trace_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        trace_halt(userdata);
        return 0;
}

int trace_rpc_start(Rpc *rpc, Conn *c, uint64_t seq, const Tier__TraceStart *q) {
        Engine *e = rpc->engine;
        Trace *tr = &e->trace;
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__TraceReply tr_reply = TIER__TRACE_REPLY__INIT;
        uint32_t seconds = q->seconds ? q->seconds : TRACE_SECONDS_MAX;
        uint32_t buffer = q->buffer ? q->buffer : rpc->config->trace_buffer;
        int r;

        if (!rpc_conn_is_admin(rpc, c)) {
                log_notice("Denied: uid %u (pid " PID_FMT ") may not trace tierd", (unsigned) c->uid, c->pid);
                return conn_reply_error(c, seq, -EACCES, "permission denied: uid %u (pid " PID_FMT ") may not trace "
                                        "tierd (only root and group tier-admin may: a trace shows every job)",
                                        (unsigned) c->uid, c->pid);
        }
        if (tr->rec)
                return conn_reply_error(c, seq, -EBUSY, "a trace is running already, started by uid %u (pid " PID_FMT
                                        "); one trace at a time: wait for it to end (it ends with its tierctl)",
                                        (unsigned) tr->uid, tr->pid);
        if (q->seconds > TRACE_SECONDS_MAX)
                return conn_reply_error(c, seq, -EINVAL, "a trace records for at most %u seconds, not %u",
                                        TRACE_SECONDS_MAX, q->seconds);
        if (buffer > TRACE_BUFFER_MAX)
                return conn_reply_error(c, seq, -EINVAL, "a trace buffer holds at most %u records, not %u",
                                        TRACE_BUFFER_MAX, buffer);
        r = trace_start(tr, buffer, now_ns());
        if (r < 0)
                return conn_reply_error(c, seq, r, "cannot allocate a trace buffer of %u records: %s", buffer,
                                        strerror(-r));
        r = sd_event_add_time_relative(e->event, &tr->timer, CLOCK_MONOTONIC, (uint64_t) seconds * USEC_PER_SEC,
                                       0, on_trace_timer, e);
        if (r < 0) {
                trace_reset(tr);
                return conn_reply_error(c, seq, r, "cannot set the trace's timer: %s", strerror(-r));
        }
        (void) sd_event_source_set_description(tr->timer, "trace-stop");
        for (int i = 0; i < _LINK_MAX; i++)
                tr->links_start[i] = e->links[i].bytes;
        tr->owner = c;
        tr->uid = c->uid;
        tr->pid = c->pid;
        log_info("Trace started by uid %u (pid " PID_FMT "): %u s, buffer of %u records", (unsigned) c->uid,
                 c->pid, seconds, buffer);

        tr_reply.buffer = buffer;
        tr_reply.start_ns = tr->start_ns;
        tr_reply.record_size = sizeof(TraceRecord);
        tr_reply.fd = -1;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_TRACE;
        resp.trace = &tr_reply;
        return conn_send_response(c, &resp, NULL, 0, false);
}

/* The records in a sealed memfd; the fd, or -errno. */
static int trace_to_memfd(const Trace *tr) {
        _cleanup_close_ int fd = memfd_create("tierd-trace", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        size_t len = (size_t) tr->n * sizeof(TraceRecord), done = 0;

        if (fd < 0)
                return negative_errno();
        while (done < len) {
                ssize_t w = write(fd, (const uint8_t *) tr->rec + done, len - done);

                if (w < 0 && errno == EINTR)
                        continue;
                if (w <= 0)
                        return w < 0 ? negative_errno() : -EIO;
                done += (size_t) w;
        }
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return negative_errno();
        return TAKE_FD(fd);
}

int trace_rpc_stop(Rpc *rpc, Conn *c, uint64_t seq) {
        Engine *e = rpc->engine;
        Trace *tr = &e->trace;
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__TraceReply tr_reply = TIER__TRACE_REPLY__INIT;
        uint64_t links[_LINK_MAX];
        _cleanup_close_ int fd = -1;
        int r;

        if (!tr->rec)
                return conn_reply_error(c, seq, -ENOENT, "no trace is running (start one first)");
        if (tr->owner != c)
                return conn_reply_error(c, seq, -EPERM, "the trace running belongs to another connection (uid %u, "
                                        "pid " PID_FMT "): only it may stop and read it", (unsigned) tr->uid, tr->pid);
        trace_halt(e);
        if (tr->n > 0) {
                fd = trace_to_memfd(tr);
                if (fd < 0) {
                        r = conn_reply_error(c, seq, fd, "cannot write the trace into a memfd: %s", strerror(-fd));
                        trace_reset(tr);
                        return r;
                }
        }
        for (int i = 0; i < _LINK_MAX; i++)
                links[i] = tr->links_stop[i] - tr->links_start[i];
        tr_reply.buffer = tr->cap;
        tr_reply.records = tr->n;
        tr_reply.dropped = tr->dropped;
        tr_reply.start_ns = tr->start_ns;
        tr_reply.stop_ns = tr->stop_ns;
        tr_reply.n_link_bytes = _LINK_MAX;
        tr_reply.link_bytes = links;
        tr_reply.record_size = sizeof(TraceRecord);
        tr_reply.fd = fd >= 0 ? 0 : -1;
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_TRACE;
        resp.trace = &tr_reply;
        trace_reset(tr);
        return conn_send_response(c, &resp, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, false);
}

void trace_rpc_conn_gone(Rpc *rpc, Conn *c) {
        Trace *tr = &rpc->engine->trace;

        if (!tr->rec || tr->owner != c)
                return;
        trace_halt(rpc->engine);
        log_info("Trace of uid %u (pid " PID_FMT ") ended with its connection, unread", (unsigned) tr->uid, tr->pid);
        trace_reset(tr);
}
