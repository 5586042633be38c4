/* SPDX-License-Identifier: MIT */
/* transport.c: libtier's connection to tierd: packets, synchronous calls, events, breaking. */

/*
 * Theory of operation
 *
 * A tier_client is one SOCK_SEQPACKET connection to tierd.  Every request is
 * one packed tier.Request; every packet from tierd is one tier.Reply, either
 * the Response to a request (same seq) or an unsolicited Event.  File
 * descriptors travel beside a packet and messages name them by index into
 * that packet's fd array; whatever fd a packet carries that no message
 * claims is closed when the packet is done with (packet_done()).
 *
 * The client is synchronous: transport_call() sends one request and reads
 * packets until the Response with that seq arrives.  Events that arrive in
 * between are handled on the way: FenceFailed goes into a small ring of
 * remembered failures (fences.c), Shutdown makes later requests fail with
 * -ESHUTDOWN, Revoke unmaps a segment and is acked (segments.c).  Any
 * Response may carry new_segments, which are mapped (and their fds closed)
 * before the caller sees the Response.  Between calls, tier_client_process()
 * handles whatever is queued.
 *
 * The socket is O_NONBLOCK so that draining never blocks; synchronous
 * calls poll() when the socket has nothing queued.
 *
 * A call waits for tierd's answer without limit, unless the caller set a
 * timeout (tier_client_set_timeout()): then one deadline bounds the request
 * from its send (which may wait for room in the socket) to its Response.  A
 * call that reaches it fails with -ETIMEDOUT and closes the socket: a late
 * Response could not be told from the next request's (seq would mismatch:
 * -EPROTO), and tierd, when it reads again, sees the connection end and lets
 * go of what the client held.  The client is then broken with -ECONNRESET, as
 * after a lost connection (or the next call reconnects, reconnect.c).  Only
 * the wait for an answer counts: a fence or a plan phase is tierd's work, not
 * an answer, and their waits (fences.c, plans.c) keep their own rules.
 *
 * Once tierd sees that connection end, its slot of the job's fence page is
 * the job's next connection's: what the slot says at the close is all the
 * client keeps (fence_freeze()).  A signal (EINTR) polls again for what is
 * left of the deadline, never for all of it.  A reconnect's connect() has
 * the same bound (transport_connect()).
 *
 * Once the connection breaks (tierd gone, malformed packet, protocol
 * error, out of memory decoding a packet) the client keeps its mappings but every request fails with the
 * error that broke it.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"
#include "proto/wire.h"
#include "util/time-util.h"

void packet_done(Packet *p) {
        for (size_t i = 0; i < p->n_fds; i++)
                p->fds[i] = safe_close(p->fds[i]);
        p->n_fds = 0;
        if (p->reply)
                tier__reply__free_unpacked(p->reply, NULL);
        p->reply = NULL;
}

/* Claim the fd a message names by index; each fd may be claimed once. */
int packet_take_fd(Packet *p, int32_t index) {
        if (index < 0 || (size_t) index >= p->n_fds || p->fds[index] < 0)
                return -EPROTO;
        return TAKE_FD(p->fds[index]);
}

/* The connection is unusable from now on; every later request returns @r. */
_printf_(3, 4)
int transport_break(tier_client *c, int r, const char *fmt, ...) {
        va_list ap;

        if (c->broken < 0)
                return c->broken;
        c->broken = r;
        va_start(ap, fmt);
        (void) vsnprintf(c->broken_reason, sizeof(c->broken_reason), fmt, ap);
        va_end(ap);
        return client_error(c, r, "%s", c->broken_reason);
}

int transport_broken(tier_client *c) {
        return client_error(c, c->broken, "%s", *c->broken_reason ? c->broken_reason : tier_strerror(c->broken));
}

/* Can a request be sent now? */
int transport_check(tier_client *c) {
        int r = client_check_fork(c);

        if (r < 0)
                return r;
        /*
         * A connection closed after tierd announced its shutdown reports the
         * shutdown; so does an open one, but where the client reconnects: tierd
         * keeps that one open while it holds what the client may still write
         * through, and the client leaves at its next phase (tier_phase_enter()) or
         * when tierd refuses a request or closes the connection.
         */
        if (c->shutdown && (c->reconnect_ms == 0 || c->broken < 0))
                return client_error(c, -ESHUTDOWN, "%s", *c->shutdown_reason ? c->shutdown_reason :
                                    "tierd ended the connection (it is stopping)");
        if (c->broken < 0)
                return transport_broken(c);
        return 0;
}

/* What is left of @deadline (now_ms(), 0: none) for poll(): -1 for none, 0 once it passed. */
static int deadline_left(uint64_t deadline) {
        uint64_t now;

        if (deadline == 0)
                return -1;
        now = now_ms();
        return now >= deadline ? 0 : (int) MIN(deadline - now, (uint64_t) INT_MAX);
}

/*
 * poll() @fd for @events until @deadline (now_ms(), 0: none): > 0 when ready, 0 once the deadline
 * passed.  A signal (EINTR) polls again for what is left of the deadline, not for all of it: a
 * process that takes signals more often than the timeout (a profiler's timer) would wait for ever.
 */
static int fd_wait(int fd, short events, uint64_t deadline) {
        struct pollfd pfd = { .fd = fd, .events = events };

        for (;;) {
                int n = poll(&pfd, 1, deadline_left(deadline));
                if (n >= 0)
                        return n;
                if (errno != EINTR)
                        return negative_errno();
        }
}

/* @deadline: now_ms() by which there must be room (0: none); -ETIMEDOUT after it */
static int transport_send(tier_client *c, const void *buf, size_t len, uint64_t deadline) {
        for (;;) {
                int r = wire_send(c->fd, buf, len, NULL, 0);
                if (r == -EINTR)
                        continue;
                if (r == -EAGAIN) {
                        r = fd_wait(c->fd, POLLOUT, deadline);
                        if (r < 0)
                                return r;
                        if (r == 0)
                                return -ETIMEDOUT;
                        continue;
                }
                return r;
        }
}

/* protobuf-c's allocator, telling running out of memory from a malformed packet (transport_recv()) */
static void *reply_alloc(void *data, size_t size) {
        void *p = malloc(size);

        if (!p)
                *(bool *) data = true;
        return p;
}

static void reply_free(void *data, void *p) {
        (void) data;
        free(p);
}

/* The request @op names, as the protocol spells it ("status", "pin", ...). */
static const char *request_name(Tier__Request__OpCase op) {
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(&tier__request__descriptor,
                                                                                   (unsigned) op);

        return f ? f->name : "a request";
}

/**
 * transport_recv() - receive one packet.
 * @block: wait for one; else return 0 at once when none is queued
 * @op: the request in flight, or 0: what a reply that cannot be decoded answered
 * @deadline: with @block, now_ms() by which a packet must come (0: none)
 * Returns 1 with @ret filled, 0 (non-blocking, nothing queued), -ETIMEDOUT
 * (blocking, nothing came by @deadline: the connection is as it was), or < 0
 * after breaking the connection.
 */
static int transport_recv(tier_client *c, bool block, Tier__Request__OpCase op, uint64_t deadline, Packet *ret) {
        bool oom = false;
        ProtobufCAllocator alloc = { .alloc = reply_alloc, .free = reply_free, .allocator_data = &oom };
        int fds[WIRE_MAX_FDS];
        size_t len = 0, n_fds = 0;
        Tier__Reply *reply;
        bool reset = false;
        int r;

        if (c->broken < 0)
                return transport_broken(c);
        for (;;) {
                r = wire_recv(c->fd, c->rbuf, CLIENT_RECV_BUFFER, &len, fds, &n_fds);
                if (r == -EINTR)
                        continue;
                if (r == -EAGAIN && !reset) {
                        if (!block)
                                return 0;
                        r = fd_wait(c->fd, POLLIN, deadline);
                        if (r < 0)
                                return transport_break(c, r, "waiting for tierd failed: %s",
                                                       tier_strerror(r));
                        if (r == 0)
                                return -ETIMEDOUT;
                        continue;
                }
                if (r == -ECONNRESET && !reset) {
                        /*
                         * tierd closed the connection with a request of ours unread: the kernel says
                         * so once, ahead of what tierd sent before it (why it refused the connection,
                         * server.c); read that, if there is anything (the socket does not block)
                         */
                        reset = true;
                        continue;
                }
                if (r == -EAGAIN && reset)
                        r = -ECONNRESET;
                break;
        }
        if (r == -ECONNRESET)
                return transport_break(c, r, "tierd closed the connection");
        if (r < 0)
                return transport_break(c, r, "receiving from tierd failed: %s", tier_strerror(r));

        /* freed with protobuf-c's own allocator (packet_done()): both are malloc()'s */
        reply = tier__reply__unpack(&alloc, len, c->rbuf);
        if (!reply) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                /*
                 * The packet is gone: whether it was the Response (its new segments, what tierd did
                 * for the request) or an Event (a failed fence, a Revoke to ack) cannot be told, so
                 * the connection cannot go on, but the reason is the client's memory, not tierd
                 */
                if (oom && op)
                        return transport_break(c, -ENOMEM, "out of memory decoding tierd's reply to %s "
                                               "(%zu bytes)", request_name(op), len);
                if (oom)
                        return transport_break(c, -ENOMEM, "out of memory decoding a packet from tierd "
                                               "(%zu bytes)", len);
                return transport_break(c, -EBADMSG, "tierd sent a malformed packet (%zu bytes)", len);
        }
        ret->reply = reply;
        memcpy(ret->fds, fds, n_fds * sizeof(int));
        ret->n_fds = n_fds;
        return 1;
}

/* Tell tierd a revoked segment is unmapped.  Ack has no Response, so this never waits for one. */
int transport_send_ack(tier_client *c, uint32_t segment, uint32_t generation) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Ack ack = TIER__ACK__INIT;
        uint8_t buf[64];
        size_t len;
        int r;

        ack.segment = segment;
        ack.generation = generation;
        req.op_case = TIER__REQUEST__OP_ACK;
        req.ack = &ack;
        r = client_check_fork(c);
        if (r < 0)
                return r;
        len = tier__request__get_packed_size(&req);
        if (len > sizeof(buf))
                return -EMSGSIZE;
        (void) tier__request__pack(&req, buf);
        r = transport_send(c, buf, len, 0);
        if (r < 0)
                return transport_break(c, r == -EPIPE ? -ECONNRESET : r, "sending to tierd failed: %s",
                                       tier_strerror(r));
        return 0;
}

static void transport_handle_event(tier_client *c, const Tier__Event *e) {
        switch (e->kind_case) {
        case TIER__EVENT__KIND_FENCE_FAILED: {
                const Tier__FenceFailed *ff = e->fence_failed;
                int status;

                if (!ff)
                        break;
                /* A failure must fail: a daemon that sends status >= 0 still means an error. */
                status = ff->status < 0 ? ff->status : -EIO;
                fence_record_failure(c, ff->fence, status);
                c->failed_events++;
                /* the fence as the caller has it (tagged, numbered after a restart's: fence_out()) */
                (void) client_error(c, status, "fence %#" PRIx64 " failed: %s",
                                    fence_out(c, ff->fence + c->fence_offset),
                                    ff->error && *ff->error ? ff->error : tier_strerror(status));
                break;
        }
        case TIER__EVENT__KIND_SHUTDOWN:
                c->shutdown = true;
                (void) snprintf(c->shutdown_reason, sizeof(c->shutdown_reason), "%s",
                                e->shutdown && e->shutdown->reason ? e->shutdown->reason : "");
                /* tierd's reason says who ended it ("tierd is stopping", "job 'x' was detached by ...") */
                (void) client_error(c, -ESHUTDOWN, "%s", *c->shutdown_reason ? c->shutdown_reason :
                                    "tierd ended the connection (it is stopping)");
                break;
        case TIER__EVENT__KIND_PHASE_REFUSED:
                if (e->phase_refused)
                        plan_phase_refused(c, e->phase_refused);
                break;
        case TIER__EVENT__KIND_REVOKE:
                if (e->revoke)
                        segment_revoke(c, e->revoke);
                break;
        default:
                break;          /* an event of a newer protocol: ignored */
        }
}

/**
 * transport_process() - handle one packet.
 * @seq: the request in flight, or 0 when none is
 * Returns 1 when @p is the Response to @seq (left in @p for the caller, its
 * new segments mapped), 0 when @p was consumed, < 0 on a protocol error.
 */
static int transport_process(tier_client *c, Packet *p, uint64_t seq) {
        Tier__Reply *reply = p->reply;
        Tier__Response *resp;

        switch (reply->kind_case) {
        case TIER__REPLY__KIND_EVENT:
                if (reply->event)
                        transport_handle_event(c, reply->event);
                packet_done(p);
                return 0;
        case TIER__REPLY__KIND_RESPONSE:
                resp = reply->response;
                if (resp && resp->status < 0 && (resp->seq == 0 || (seq == 0 && c->seq == 0))) {
                        /*
                         * tierd's refusal of the connection itself, which it closes: at accept, before the
                         * first request (server.c), or a packet it could not read (conn.c: a malformed one,
                         * which has no seq to answer: seq 0).
                         * After the first request this was "tierd answered request 0 while request 0 was
                         * in flight", tierd's reason lost.
                         */
                        int r = c->seq == 0 ?
                                transport_break(c, resp->status, "%s", resp->error && *resp->error ?
                                                resp->error : tier_strerror(resp->status)) :
                                transport_break(c, resp->status, "tierd closed the connection: %s",
                                                resp->error && *resp->error ? resp->error :
                                                tier_strerror(resp->status));

                        packet_done(p);
                        return r;
                }
                if (!resp || seq == 0 || resp->seq != seq) {
                        uint64_t got = resp ? resp->seq : 0;

                        packet_done(p);
                        return transport_break(c, -EPROTO, "tierd answered request %" PRIu64
                                               " while request %" PRIu64 " was in flight", got, seq);
                }
                segment_add_all(c, resp->new_segments, resp->n_new_segments, p);
                return 1;
        default:
                packet_done(p);
                return 0;       /* a reply kind of a newer protocol: ignored */
        }
}

/* Handle every packet already queued on the socket, without blocking. */
int transport_drain(tier_client *c) {
        /* a fork()'s child reads nothing: what is queued is the parent's */
        int q = client_check_fork(c);

        if (q < 0)
                return q;
        for (;;) {
                Packet p = PACKET_NULL;
                int r;

                r = transport_recv(c, false, 0, 0, &p);
                if (r <= 0)
                        return r;
                r = transport_process(c, &p, 0);
                if (r < 0)
                        return r;
        }
}

/**
 * transport_call() - send @req and wait for its Response.
 * @req: its seq is assigned here
 * @ret: on success, the packet holding the Response (status >= 0); the caller
 *       claims fds from it and must packet_done() it
 * A Response with status < 0 is returned as that status, its error text kept
 * in last_error.
 */
static int transport_call_once(tier_client *c, Tier__Request *req, Packet *ret);

int transport_call(tier_client *c, Tier__Request *req, Packet *ret) {
        int r = client_check_fork(c);

        if (r < 0)
                return r;       /* a fork()'s child: the connection is the parent's, never to reconnect */
        r = transport_call_once(c, req, ret);

        /* tierd went away: connect to the next one when the caller asked to (reconnect.c) */
        if (r < 0 && (c->broken < 0 || c->shutdown))
                return client_reconnect(c, r);
        return r;
}

/*
 * tierd did not answer @op within the client's timeout: the connection goes (a late answer would be
 * taken for the next request's), now, so that tierd sees it end when it reads again.  Later calls fail
 * with -ECONNRESET (or reconnect); this one with -ETIMEDOUT.
 */
static int transport_timed_out(tier_client *c, Tier__Request__OpCase op) {
        char why[CLIENT_ERROR_MAX / 2];

        (void) snprintf(why, sizeof(why), "tierd did not answer %s within %d ms (tier_client_set_timeout())",
                        request_name(op), c->timeout_ms);
        fence_freeze(c);        /* before tierd can see the end and give the slot to another connection */
        c->fd = safe_close(c->fd);
        c->timed_out = true;
        (void) transport_break(c, -ECONNRESET, "the connection was closed: %s", why);
        return client_error(c, -ETIMEDOUT, "%s: the connection is closed (every later call fails with "
                            "ECONNRESET, or joins tierd again with tier_client_set_reconnect())", why);
}

static int transport_call_once(tier_client *c, Tier__Request *req, Packet *ret) {
        _cleanup_free_ uint8_t *buf = NULL;
        Tier__Response *resp;
        uint64_t deadline = 0;
        size_t len;
        int r;

        /*
         * Events already queued (a shutdown, failed fences) count before this
         * request; but what lets go of pins is still sent while the connection
         * is open, so that tierd writes down what was written through them.
         */
        (void) transport_drain(c);
        r = transport_check(c);
        if (r == -ESHUTDOWN && c->broken == 0 &&
            (req->op_case == TIER__REQUEST__OP_UNPIN || req->op_case == TIER__REQUEST__OP_END_PLAN))
                r = 0;
        if (r == -ESHUTDOWN)
                return client_error(c, r, "%s", *c->shutdown_reason ? c->shutdown_reason :
                                    "tierd ended the connection (it is stopping)");
        if (r < 0)
                return r;

        /* last_error describes this request from now on. */
        c->last_error[0] = 0;
        req->seq = ++c->seq;
        len = tier__request__get_packed_size(req);
        if (len > c->max_message)
                return client_error(c, -EMSGSIZE, "%s request of %zu bytes exceeds tierd's limit of %u bytes "
                                    "([limits] max_message of tierd.conf: raise it there, or send less at once)",
                                    request_name(req->op_case), len, c->max_message);
        buf = malloc(len ? len : 1);
        if (!buf)
                return client_error(c, -ENOMEM, "out of memory");
        (void) tier__request__pack(req, buf);

        if (c->timeout_ms > 0)
                deadline = now_ms() + (uint64_t) c->timeout_ms;
        r = transport_send(c, buf, len, deadline);
        if (r == -ETIMEDOUT)
                return transport_timed_out(c, req->op_case);
        /*
         * tierd closed the connection: it may have answered first (a connection refused at accept,
         * server.c, is told why in the Response its Hello would get): read what it left, not waiting
         */
        bool closed = r == -EPIPE || r == -ECONNRESET;
        if (r < 0 && !closed)
                return transport_break(c, r, "sending to tierd failed: %s", tier_strerror(r));

        for (;;) {
                Packet p = PACKET_NULL;

                r = transport_recv(c, !closed, req->op_case, deadline, &p);
                if (r == -ETIMEDOUT)
                        return transport_timed_out(c, req->op_case);
                if (r == 0)
                        r = transport_break(c, -ECONNRESET, "tierd closed the connection");
                if (r < 0)
                        return r;
                r = transport_process(c, &p, req->seq);
                if (r < 0)
                        return r;
                if (r > 0) {
                        *ret = p;
                        break;
                }
        }

        resp = ret->reply->response;
        if (resp->status < 0) {
                r = client_error(c, resp->status, "%s",
                                 resp->error && *resp->error ? resp->error : tier_strerror(resp->status));
                packet_done(ret);
                return r;
        }
        return 0;
}

/* A Response must carry the result its request asks for. */
int transport_expect(tier_client *c, Packet *p, Tier__Response__ResultCase want, const char *what) {
        const Tier__Response *resp = p->reply->response;
        const void *body = NULL;

        if (resp->result_case == want)
                switch (want) {
                case TIER__RESPONSE__RESULT_HELLO:
                        body = resp->hello;
                        break;
                case TIER__RESPONSE__RESULT_TENSOR:
                        body = resp->tensor;
                        break;
                case TIER__RESPONSE__RESULT_STAT:
                        body = resp->stat;
                        break;
                case TIER__RESPONSE__RESULT_PIN:
                        body = resp->pin;
                        break;
                default:
                        body = resp;    /* callers look at the rest themselves */
                        break;
                }
        if (body)
                return 0;
        packet_done(p);
        return client_error(c, -EPROTO, "tierd answered %s without a result", what);
}

int transport_connect(tier_client *c, const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        uint64_t deadline = 0;
        const char *hint;
        int r;

        if (strlen(path) >= sizeof(sa.sun_path))
                return client_error(c, -ENAMETOOLONG, "cannot connect to %s: socket path too long", path);
        memcpy(sa.sun_path, path, strlen(path) + 1);

        c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (c->fd < 0)
                return client_error(c, negative_errno(), "cannot create socket: %m");

        /*
         * A request timeout bounds connect() too (a reconnect's, reconnect.c; tier_client_new() has none
         * yet): a tierd that stopped answering accepts nothing, each attempt of a reconnecting client
         * leaves its connection in tierd's listen queue, and once that is full connect() waits for ever.
         * SO_SNDTIMEO bounds a blocking connect() on AF_UNIX (-EAGAIN); a signal retries for what is left.
         */
        if (c->timeout_ms > 0)
                deadline = now_ms() + (uint64_t) c->timeout_ms;
        for (;;) {
                if (deadline > 0) {
                        int left = deadline_left(deadline);
                        struct timeval tv = { .tv_sec = left / 1000, .tv_usec = (left % 1000) * 1000 };

                        if (left == 0)
                                tv.tv_usec = 1;         /* (0 would be no limit): the queue is asked once more */
                        if (setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
                                return client_error(c, negative_errno(), "cannot set up socket: %m");
                }
                r = connect(c->fd, (const struct sockaddr *) &sa, sizeof(sa));
                if (r >= 0 || errno != EINTR)
                        break;
        }
        if (r < 0 && errno == EAGAIN && deadline > 0)
                return client_error(c, -ETIMEDOUT, "cannot connect to %s: tierd accepted no connection within %d ms "
                                    "(tier_client_set_timeout()): its queue is full, it may be stopped or wedged",
                                    path, c->timeout_ms);
        if (r < 0) {
                r = negative_errno();
                hint = r == -EACCES || r == -EPERM ? "is this user in the socket's group?" :
                                                     "is tierd running?";
                return client_error(c, r, "cannot connect to %s: %s (%s)", path, tier_strerror(r), hint);
        }

        /* Non-blocking from here on, so that draining events never blocks. */
        r = fcntl(c->fd, F_GETFL);
        if (r < 0 || fcntl(c->fd, F_SETFL, r | O_NONBLOCK) < 0)
                return client_error(c, negative_errno(), "cannot set up socket: %m");
        return 0;
}

_public_ int tier_client_set_timeout(tier_client *c, int timeout_ms) {
        if (!c)
                return -EINVAL;
        if (timeout_ms < 0)
                return client_error(c, -EINVAL, "the request timeout is %d ms: it must be 0 (none) or more",
                                    timeout_ms);
        c->timeout_ms = timeout_ms;
        return 0;
}

_public_ int tier_client_process(tier_client *c) {
        int r;

        if (!c)
                return -EINVAL;
        r = transport_drain(c);
        /* once tierd announced its stop, the connection it then closes reports the stop, as requests do */
        if (r < 0 && !c->shutdown)
                return r;
        return transport_check(c);
}
