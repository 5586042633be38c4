/* SPDX-License-Identifier: MIT */
/* conn.c: one client connection: reading packets, the out-queue, replies with the job's new segments. */

/*
 * Theory of operation: each accepted connection is a Conn with an sd-event
 * io source.  One packet is one message: the payload is read into the
 * server's one buffer of [limits] max_message bytes (Server.rbuf: each
 * packet is decoded before the next is read, so no connection needs one of
 * its own); a larger packet is a protocol error and closes the connection.
 * Fds beside it are received CLOEXEC and — since no request carries fds —
 * closed at once.  A decoded request goes to the request layer through
 * ServerOps.dispatch; this file knows nothing of what requests mean.
 *
 * Replies are written straight to the socket; when it is full they are
 * queued (with dup'ed fds) and EPOLLOUT is enabled.  The queue is bounded:
 * a client that does not read its replies is disconnected, as is one that
 * leaves too many bytes of reply memfds unread (conn_charge_files()).  Every
 * successful reply on a job connection carries the job's segments this
 * connection has not been sent in their current generation (Conn.seg_sent),
 * so a client always holds the memory its grants point into.
 *
 * Closing a connection (EOF, error, SIGKILL of the client, protocol error)
 * first lets the request layer release what it holds (ServerOps.conn_gone:
 * requests, pins, plan, fence slot), then frees the socket and the queue.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/fence.h"
#include "daemon/ipc/server.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"
#include "proto/pbcheck.h"
#include "proto/wire.h"
#include "tier.pb-c.h"

/* A client that leaves this many replies (or bytes of them) unread is disconnected. */
#define OUTQ_MAX 4096
#define OUTQ_BYTES_MAX (64u << 20)
/* ... or this many fds in them (each one tierd's own copy, against its RLIMIT_NOFILE). */
#define OUTQ_FDS_MAX 512
/*
 * ... or this many bytes of the files tierd made for its replies (status, metrics and trace memfds, plan
 * pages), counted until the client has read everything it was sent (the socket's queue too: a file in
 * flight lives as long as the packet that carries it).  The first such reply always goes.
 */
#define OUTQ_MEMFD_BYTES_MAX (16u << 20)
/* Packets read per wakeup, so that one chatty client cannot starve the rest. */
#define READ_BATCH 32
/* The first try at a peer's supplementary groups (SO_PEERGROUPS); the kernel says when it needs more. */
#define PEER_GROUPS_FIRST 64

static void outq_free(Conn *c, OutPacket *p) {
        c->outq_fds -= p->n_fds;
        wire_close_fds(p->fds, p->n_fds);
        list_del(&p->link);
        free(p);
}

void conn_close(Conn *c) {
        Server *s = c->server;

        log_debug("Connection %" PRIu64 " (pid " PID_FMT ", uid %u) closed", c->id, c->pid, (unsigned) c->uid);
        if (s->ops && s->ops->conn_gone)
                s->ops->conn_gone(s->userdata, c);
        list_for_each_safe(n, tmp, &c->outq)
                outq_free(c, list_entry(n, OutPacket, link));
        c->io = sd_event_source_disable_unref(c->io);
        c->abort_source = sd_event_source_disable_unref(c->abort_source);
        safe_close(c->fd);
        safe_close(c->efd);
        list_del(&c->link);
        s->n_conns--;
        free(c->fence_completed);
        pins_free(c);
        free(c->seg_sent);
        free(c);
}

/* ---- writing ---------------------------------------------------------------------------------- */

static int conn_flush(Conn *c) {
        while (!list_empty(&c->outq)) {
                OutPacket *p = list_entry(c->outq.next, OutPacket, link);
                int r = wire_send(c->fd, p->data, p->len, p->fds, p->n_fds);

                if (r == -EAGAIN)
                        return sd_event_source_set_io_events(c->io, EPOLLIN | EPOLLOUT);
                if (r < 0)
                        return r;
                if (p->close_after)
                        return -ECONNRESET;
                c->outq_bytes -= p->len;
                outq_free(c, p);
                c->n_outq--;
        }
        return sd_event_source_set_io_events(c->io, c->closing ? EPOLLOUT : EPOLLIN);
}

static int conn_send_packet(Conn *c, const uint8_t *buf, size_t len, const int *fds, size_t n_fds, bool close_after) {
        OutPacket *p;
        int r;

        if (list_empty(&c->outq)) {
                r = wire_send(c->fd, buf, len, fds, n_fds);
                if (r >= 0) {
                        if (close_after) {
                                c->closing = true;
                                (void) sd_event_source_set_io_events(c->io, EPOLLOUT);
                        }
                        return 0;
                }
                if (r != -EAGAIN)
                        return r;
        }
        if (c->n_outq >= OUTQ_MAX || c->outq_bytes + len > OUTQ_BYTES_MAX || c->outq_fds + n_fds > OUTQ_FDS_MAX)
                return -ENOBUFS;
        p = malloc(sizeof(*p) + len);
        if (!p)
                return -ENOMEM;
        memcpy(p->data, buf, len);
        p->len = len;
        p->n_fds = 0;
        p->close_after = close_after;
        list_init(&p->link);
        for (size_t i = 0; i < n_fds; i++) {
                p->fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
                if (p->fds[i] < 0) {
                        r = negative_errno();
                        wire_close_fds(p->fds, i);
                        free(p);
                        return r;
                }
                p->n_fds++;
        }
        c->outq_fds += p->n_fds;
        list_add_tail(&c->outq, &p->link);
        c->n_outq++;
        c->outq_bytes += len;
        if (close_after)
                c->closing = true;
        return sd_event_source_set_io_events(c->io, EPOLLIN | EPOLLOUT);
}

static int conn_send_reply(Conn *c, Tier__Reply *reply, const int *fds, size_t n_fds, bool close_after) {
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;

        len = tier__reply__get_packed_size(reply);
        buf = malloc(len ? len : 1);
        if (!buf)
                return -ENOMEM;
        tier__reply__pack(reply, buf);
        return conn_send_packet(c, buf, len, fds, n_fds, close_after);
}

/* ---- segments ------------------------------------------------------------------------------------ */

static uint32_t seg_wire_id(const Segment *s) {
        return s->pool->id_base + s->id;
}

bool conn_segment_known(const Conn *c, uint32_t wire_id, uint32_t generation) {
        return wire_id < c->n_seg_sent && c->seg_sent[wire_id] == generation + 1;
}

void conn_segment_forget(Conn *c, uint32_t wire_id) {
        if (wire_id < c->n_seg_sent)
                c->seg_sent[wire_id] = 0;
}

void conn_segment_want(Conn *c, uint32_t wire_id) {
        conn_segment_forget(c, wire_id);
        if (c->n_seg_want < ELEMENTSOF(c->seg_want))
                c->seg_want[c->n_seg_want++] = wire_id;
}

static bool segment_wanted(const Conn *c, uint32_t wire_id) {
        for (uint32_t i = 0; i < c->n_seg_want; i++)
                if (c->seg_want[i] == wire_id)
                        return true;
        return false;
}

/*
 * Fill Segment messages (and fds, up to @max in all) for the job's segments @c has not been sent: those
 * it asked for first (when more than @max others are unsent, they would not come otherwise), then the rest.
 */
static size_t collect_segments(Conn *c, Tier__Segment *segs, Tier__Segment **segp, int *fds, size_t *n_fds,
                               size_t max) {
        Job *j = c->job;
        size_t n = 0;

        for (int pass = c->n_seg_want ? 0 : 1; pass < 2; pass++)
        for (int tier = 0; tier < TIERS; tier++) {
                list_for_each_safe(node, tmp, &j->segments[tier]) {
                        Segment *s = list_entry(node, Segment, owner_link);
                        uint32_t wid = seg_wire_id(s);

                        if (*n_fds >= max)
                                return n;
                        if (conn_segment_known(c, wid, s->generation) || segment_wanted(c, wid) != (pass == 0))
                                continue;
                        tier__segment__init(&segs[n]);
                        segs[n].id = wid;
                        segs[n].generation = s->generation;
                        segs[n].tier = (Tier__Tier) tier;
                        segs[n].size = s->pool->seg_size;
                        segs[n].fd_index = (int32_t) *n_fds;
                        segs[n].kind = (char *) s->pool->kind;
                        fds[(*n_fds)++] = s->fd;
                        segp[n] = &segs[n];
                        n++;
                }
        }
        return n;
}

static void segments_sent(Conn *c, const Tier__Segment *segs, size_t n) {
        for (size_t i = 0; i < n; i++) {
                uint32_t wid = segs[i].id;

                if (wid >= c->n_seg_sent) {
                        uint32_t cap = MAX(wid + 1, c->n_seg_sent * 2);
                        uint32_t *p = realloc(c->seg_sent, cap * sizeof(uint32_t));

                        if (!p)
                                continue;       /* will be sent again: harmless */
                        memset(p + c->n_seg_sent, 0, (cap - c->n_seg_sent) * sizeof(uint32_t));
                        c->seg_sent = p;
                        c->n_seg_sent = cap;
                }
                c->seg_sent[wid] = segs[i].generation + 1;
        }
}

/*
 * Count the bytes of the files in @fds (made for one reply) against what @c has not read: -ENOBUFS when
 * that would go over OUTQ_MEMFD_BYTES_MAX.  Such a file lives while its packet waits, in tierd's queue or
 * the socket's, where OUTQ_BYTES_MAX does not see it: a client that asked for status over and over and
 * read nothing held hundreds of them per connection.
 */
static int conn_charge_files(Conn *c, const int *fds, size_t n_fds) {
        uint64_t bytes = 0;
        int unread = 0;

        for (size_t i = 0; i < n_fds; i++) {
                struct stat st;

                if (fstat(fds[i], &st) == 0 && S_ISREG(st.st_mode))
                        bytes += (uint64_t) st.st_size;
        }
        if (bytes == 0)
                return 0;
        /* all it was sent is read (SIOCOUTQ: bytes of ours its socket still holds): start again */
        if (list_empty(&c->outq) && ioctl(c->fd, SIOCOUTQ, &unread) == 0 && unread == 0)
                c->outq_file_bytes = 0;
        if (c->outq_file_bytes > 0 && c->outq_file_bytes + bytes > OUTQ_MEMFD_BYTES_MAX) {
                log_job(LOG_WARNING, 0, c->job ? c->job->name : NULL,
                        "Connection %" PRIu64 " (pid " PID_FMT ") leaves %" PRIu64 " bytes of replies in memfds "
                        "unread, closing it", c->id, c->pid, c->outq_file_bytes);
                return -ENOBUFS;
        }
        c->outq_file_bytes += bytes;
        return 0;
}

int conn_send_response(Conn *c, Tier__Response *resp, const int *fds, size_t n_fds, bool close_after) {
        Tier__Reply reply = TIER__REPLY__INIT;
        Tier__Segment segs[WIRE_MAX_FDS], *segp[WIRE_MAX_FDS];
        int allfds[WIRE_MAX_FDS];
        size_t n_all = 0, n_segs = 0;
        int r;

        r = conn_charge_files(c, fds, n_fds);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n_fds && n_all < WIRE_MAX_FDS; i++)
                allfds[n_all++] = fds[i];

        /* segments of the job this client has not been sent (or not in this generation) */
        if (c->job && resp->status == 0)
                n_segs = collect_segments(c, segs, segp, allfds, &n_all, WIRE_MAX_FDS);
        resp->n_new_segments = n_segs;
        resp->new_segments = n_segs ? segp : NULL;

        reply.kind_case = TIER__REPLY__KIND_RESPONSE;
        reply.response = resp;
        r = conn_send_reply(c, &reply, allfds, n_all, close_after);
        if (r >= 0) {
                segments_sent(c, segs, n_segs);
                c->n_seg_want = 0;
        }
        resp->n_new_segments = 0;
        resp->new_segments = NULL;
        return r;
}

int conn_send_event(Conn *c, Tier__Event *ev) {
        Tier__Reply reply = TIER__REPLY__INIT;

        reply.kind_case = TIER__REPLY__KIND_EVENT;
        reply.event = ev;
        return conn_send_reply(c, &reply, NULL, 0, false);
}

int conn_protocol_error(Conn *c, uint64_t seq, int status, const char *msg) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        int r;

        resp.seq = seq;
        resp.status = status;
        resp.error = (char *) msg;
        r = conn_send_response(c, &resp, NULL, 0, true);
        return r < 0 ? r : 0;
}

int conn_reply_error(Conn *c, uint64_t seq, int status, const char *fmt, ...) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        char msg[CONN_ERROR_MAX];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        resp.seq = seq;
        resp.status = status;
        resp.error = msg;
        return conn_send_response(c, &resp, NULL, 0, false);
}

/* ---- reading ------------------------------------------------------------------------------------- */

static int conn_read(Conn *c) {
        Server *s = c->server;
        int fds[WIRE_MAX_FDS];
        size_t len = 0, n_fds = 0;
        Tier__Request *req;
        int r;

        for (unsigned i = 0; i < READ_BATCH && !c->closing; i++) {
                r = wire_recv(c->fd, s->rbuf, s->rbuf_size, &len, fds, &n_fds);
                if (r == -EAGAIN)
                        return 0;
                if (r == -EMSGSIZE) {
                        log_warning("Connection %" PRIu64 " (pid " PID_FMT "): packet larger than %zu bytes, closing",
                                    c->id, c->pid, s->rbuf_size);
                        return conn_protocol_error(c, 0, -EMSGSIZE, "message larger than max_message");
                }
                if (r < 0)
                        return r;
                /* no request carries fds: never keep what a client sends */
                wire_close_fds(fds, n_fds);

                req = tier__request__unpack(NULL, len, s->rbuf);
                if (!req) {
                        log_warning("Connection %" PRIu64 " (pid " PID_FMT "): malformed packet of %zu bytes, closing",
                                    c->id, c->pid, len);
                        return conn_protocol_error(c, 0, -EBADMSG, "malformed message");
                }
                /* protobuf-c cuts a string at a NUL: "bad\0name" would reach the handlers as "bad" */
                {
                        char why[160];

                        r = pb_check_strings(&tier__request__descriptor, s->rbuf, len, why, sizeof(why));
                        if (r < 0) {
                                Tier__Response resp = TIER__RESPONSE__INIT;
                                char msg[200];
                                uint64_t seq = req->seq;

                                tier__request__free_unpacked(req, NULL);
                                log_debug("Connection %" PRIu64 " (pid " PID_FMT "): request %" PRIu64 " refused: %s",
                                          c->id, c->pid, seq, why);
                                if (r == -EBADMSG)
                                        return conn_protocol_error(c, seq, r, why);
                                (void) snprintf(msg, sizeof(msg), "%s: names and other strings are UTF-8 text", why);
                                resp.seq = seq;
                                resp.status = r;
                                resp.error = msg;
                                r = conn_send_response(c, &resp, NULL, 0, false);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                }
                r = s->ops && s->ops->dispatch ? s->ops->dispatch(s->userdata, c, req) : -EOPNOTSUPP;
                tier__request__free_unpacked(req, NULL);
                if (r < 0)
                        return r;
                /* stopping, and this request let go of the last pin: no further request is read */
                server_reap_conn(s, c);
        }
        return 0;
}

static int on_conn_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        Conn *c = userdata;
        int r = 0;

        if (revents & EPOLLOUT) {
                r = conn_flush(c);
                if (r < 0)
                        goto close;
        }
        if ((revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->closing) {
                r = conn_read(c);
                if (r < 0)
                        goto close;
        }
        if (c->closing && list_empty(&c->outq))
                goto close;
        if ((revents & (EPOLLHUP | EPOLLERR)) && !(revents & EPOLLIN))
                goto close;
        return 0;
close:
        if (r < 0 && r != -ECONNRESET && r != -EPIPE)
                log_debug_errno(r, "Connection %" PRIu64 ": %m", c->id);
        conn_close(c);
        return 0;
}

static int on_abort(sd_event_source *source, void *userdata) {
        Conn *c = userdata;

        log_job(LOG_WARNING, 0, c->job ? c->job->name : NULL,
                "Connection %" PRIu64 " (pid " PID_FMT ") does not read its replies, closing it", c->id, c->pid);
        conn_close(c);
        return 0;
}

void conn_abort(Conn *c) {
        if (c->broken)
                return;
        c->broken = true;
        if (sd_event_add_defer(c->server->event, &c->abort_source, on_abort, c) < 0)
                c->closing = true;      /* at least stop reading from it */
}

void conn_shutdown(Conn *c) {
        c->closing = true;
        if (sd_event_source_set_io_events(c->io, EPOLLOUT) < 0)
                conn_close(c);
}

int conn_peer_groups(const Conn *c, gid_t **ret) {
        socklen_t len = PEER_GROUPS_FIRST * sizeof(gid_t);

        /* the kernel answers ERANGE with the length it needs (at most NGROUPS_MAX groups) */
        for (;;) {
                gid_t *groups = malloc(len);
                socklen_t got = len;

                if (!groups)
                        return -ENOMEM;
                if (getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &got) == 0) {
                        *ret = groups;
                        return (int) (got / sizeof(gid_t));
                }
                free(groups);
                if (errno != ERANGE || got <= len || got > NGROUPS_MAX * sizeof(gid_t))
                        return errno == ENOPROTOOPT ? 0 : -errno;
                len = got;
        }
}

bool conn_peer_in_group(const Conn *c, gid_t gid) {
        _cleanup_free_ gid_t *groups = NULL;
        int n;

        if (c->gid == gid)
                return true;
        n = conn_peer_groups(c, &groups);
        for (int i = 0; i < n; i++)
                if (groups[i] == gid)
                        return true;
        return false;   /* (groups that cannot be read: none, an admin check fails closed) */
}

int conn_new(Server *s, int fd, uid_t uid, gid_t gid, pid_t pid, Conn **ret) {
        Conn *c;
        int r;

        if (!s->rbuf || s->rbuf_size != s->config->max_message) {
                uint8_t *b = realloc(s->rbuf, s->config->max_message);

                if (!b) {
                        safe_close(fd);
                        return -ENOMEM;
                }
                s->rbuf = b;
                s->rbuf_size = s->config->max_message;
        }
        c = calloc(1, sizeof(*c));
        if (!c) {
                safe_close(fd);
                return -ENOMEM;
        }
        c->server = s;
        c->fd = fd;
        c->efd = -1;
        c->uid = uid;
        c->gid = gid;
        c->pid = pid;
        c->id = ++s->next_conn_id;
        c->next_fence = 1;
        list_init(&c->job_link);
        list_init(&c->pending);
        list_init(&c->outq);
        list_add_tail(&s->conns, &c->link);
        s->n_conns++;
        r = sd_event_add_io(s->event, &c->io, fd, EPOLLIN, on_conn_io, c);
        if (r < 0) {
                conn_close(c);
                return r;
        }
        (void) sd_event_source_set_description(c->io, "conn");
        *ret = c;
        return 0;
}
