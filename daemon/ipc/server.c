/* SPDX-License-Identifier: MIT */
/* server.c: the listening socket, connections, SO_PEERCRED, packet I/O. */

/*
 * Theory of operation: one AF_UNIX SOCK_SEQPACKET listener, inherited from
 * systemd (LISTEN_FDS) or bound here.  Each accepted connection is a Conn
 * with an sd-event io source.  One packet is one message: the payload is
 * read into a buffer of [limits] max_message bytes (a larger packet is a
 * protocol error and closes the connection), fds beside it are received
 * CLOEXEC and — since no request carries fds today — closed at once.
 *
 * Replies are written straight to the socket; when it is full they are
 * queued (with dup'ed fds) and EPOLLOUT is enabled.  The queue is bounded:
 * a client that does not read its replies is disconnected.
 *
 * Closing a connection (EOF, error, SIGKILL of the client, protocol error)
 * cancels its requests still in the op engine, drops its pins and, when it
 * was the job's last connection, starts the job's linger timer.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "proto/macro.h"
#include "proto/wire.h"
#include "tier.pb-c.h"

/* A client that leaves this many replies (or bytes of them) unread is disconnected. */
#define OUTQ_MAX 4096
#define OUTQ_BYTES_MAX (64u << 20)

struct Server {
        Manager *manager;
        int listen_fd;
        sd_event_source *listen_source;
        char *bound_path;       /* unlinked on exit when we bound it */
        List conns;
        unsigned n_conns;
        uint64_t next_conn_id;
};

static int on_conn_io(sd_event_source *s, int fd, uint32_t revents, void *userdata);

List *server_conns(Server *s) {
        return &s->conns;
}

unsigned server_n_conns(const Server *s) {
        return s->n_conns;
}

static void outq_free(OutPacket *p) {
        wire_close_fds(p->fds, p->n_fds);
        list_del(&p->link);
        free(p);
}

void conn_close(Conn *c) {
        Server *s = c->server;

        log_debug("Connection %" PRIu64 " (pid " PID_FMT ", uid %u) closed", c->id, c->pid, (unsigned) c->uid);
        rpc_conn_gone(c);
        list_for_each_safe(n, tmp, &c->outq)
                outq_free(list_entry(n, OutPacket, link));
        c->io = sd_event_source_disable_unref(c->io);
        c->abort_source = sd_event_source_disable_unref(c->abort_source);
        safe_close(c->fd);
        safe_close(c->efd);
        list_del(&c->link);
        s->n_conns--;
        free(c->fence_completed);
        free(c->pins);
        free(c->seg_sent);
        free(c->rbuf);
        free(c);
}

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
                outq_free(p);
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
        if (c->n_outq >= OUTQ_MAX || c->outq_bytes + len > OUTQ_BYTES_MAX)
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
        list_add_tail(&c->outq, &p->link);
        c->n_outq++;
        c->outq_bytes += len;
        if (close_after)
                c->closing = true;
        return sd_event_source_set_io_events(c->io, EPOLLIN | EPOLLOUT);
}

int conn_send_response(Conn *c, Tier__Response *resp, const int *fds, size_t n_fds, bool close_after) {
        Tier__Reply reply = TIER__REPLY__INIT;
        int allfds[WIRE_MAX_FDS];
        size_t n_all = 0;
        Tier__Segment segs[WIRE_MAX_FDS], *segp[WIRE_MAX_FDS];
        size_t n_segs = 0;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;
        int r;

        for (size_t i = 0; i < n_fds && n_all < WIRE_MAX_FDS; i++)
                allfds[n_all++] = fds[i];

        /* segments of the job this client has not been sent (or not in this generation) */
        if (c->job && resp->status == 0)
                n_segs = rpc_collect_segments(c, segs, segp, allfds, &n_all, WIRE_MAX_FDS);
        resp->n_new_segments = n_segs;
        resp->new_segments = n_segs ? segp : NULL;

        reply.kind_case = TIER__REPLY__KIND_RESPONSE;
        reply.response = resp;
        len = tier__reply__get_packed_size(&reply);
        buf = malloc(len ? len : 1);
        if (!buf)
                return -ENOMEM;
        tier__reply__pack(&reply, buf);
        r = conn_send_packet(c, buf, len, allfds, n_all, close_after);
        if (r >= 0)
                rpc_segments_sent(c, segs, n_segs);
        resp->n_new_segments = 0;
        resp->new_segments = NULL;
        return r;
}

static int on_abort(sd_event_source *s, void *userdata) {
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
        if (sd_event_add_defer(c->manager->event, &c->abort_source, on_abort, c) < 0)
                c->closing = true;      /* at least stop reading from it */
}

int conn_send_event(Conn *c, Tier__Event *ev) {
        Tier__Reply reply = TIER__REPLY__INIT;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t len;

        reply.kind_case = TIER__REPLY__KIND_EVENT;
        reply.event = ev;
        len = tier__reply__get_packed_size(&reply);
        buf = malloc(len ? len : 1);
        if (!buf)
                return -ENOMEM;
        tier__reply__pack(&reply, buf);
        return conn_send_packet(c, buf, len, NULL, 0, false);
}

static int conn_read(Conn *c) {
        int fds[WIRE_MAX_FDS];
        size_t len = 0, n_fds = 0;
        Tier__Request *req;
        int r;

        /* a few packets per wakeup, so one chatty client cannot starve the rest */
        for (unsigned i = 0; i < 32 && !c->closing; i++) {
                r = wire_recv(c->fd, c->rbuf, c->rbuf_size, &len, fds, &n_fds);
                if (r == -EAGAIN)
                        return 0;
                if (r == -EMSGSIZE) {
                        log_warning("Connection %" PRIu64 " (pid " PID_FMT "): packet larger than %zu bytes, closing",
                                    c->id, c->pid, c->rbuf_size);
                        return rpc_protocol_error(c, 0, -EMSGSIZE, "message larger than max_message");
                }
                if (r < 0)
                        return r;
                /* no request carries fds (yet): never keep what a client sends */
                wire_close_fds(fds, n_fds);

                req = tier__request__unpack(NULL, len, c->rbuf);
                if (!req) {
                        log_warning("Connection %" PRIu64 " (pid " PID_FMT "): malformed packet of %zu bytes, closing",
                                    c->id, c->pid, len);
                        return rpc_protocol_error(c, 0, -EBADMSG, "malformed message");
                }
                r = rpc_dispatch(c, req);
                tier__request__free_unpacked(req, NULL);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int on_conn_io(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
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

static int on_accept(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Server *s = userdata;
        Manager *m = s->manager;
        struct ucred cred;
        socklen_t sl = sizeof(cred);
        Conn *c;
        int cfd, r;

        cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (cfd < 0) {
                if (errno != EAGAIN && errno != EINTR)
                        log_warning_errno(errno, "accept() failed, ignoring: %m");
                return 0;
        }
        if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &sl) < 0) {
                log_warning_errno(errno, "SO_PEERCRED failed, dropping connection: %m");
                safe_close(cfd);
                return 0;
        }
        if (s->n_conns >= m->config.max_connections) {
                log_warning("Refusing connection from pid " PID_FMT ": %u connections (max_connections)",
                            cred.pid, s->n_conns);
                safe_close(cfd);
                return 0;
        }

        c = calloc(1, sizeof(*c));
        if (!c) {
                safe_close(cfd);
                return 0;
        }
        c->server = s;
        c->manager = m;
        c->fd = cfd;
        c->efd = -1;
        c->uid = cred.uid;
        c->gid = cred.gid;
        c->pid = cred.pid;
        c->id = ++s->next_conn_id;
        c->next_fence = 1;
        list_init(&c->job_link);
        list_init(&c->pending);
        list_init(&c->outq);
        c->rbuf_size = m->config.max_message;
        c->rbuf = malloc(c->rbuf_size);
        list_add_tail(&s->conns, &c->link);
        s->n_conns++;
        if (!c->rbuf) {
                conn_close(c);
                return 0;
        }
        r = sd_event_add_io(m->event, &c->io, cfd, EPOLLIN, on_conn_io, c);
        if (r < 0) {
                log_warning_errno(r, "Cannot watch connection, dropping it: %m");
                conn_close(c);
                return 0;
        }
        (void) sd_event_source_set_description(c->io, "conn");
        log_debug("Connection %" PRIu64 " from pid " PID_FMT " uid %u", c->id, c->pid, (unsigned) c->uid);
        return 0;
}

int server_new(Manager *m, Server **ret) {
        Server *s = calloc(1, sizeof(*s));

        if (!s)
                return -ENOMEM;
        s->manager = m;
        s->listen_fd = -1;
        list_init(&s->conns);
        *ret = s;
        return 0;
}

Server *server_free(Server *s) {
        if (!s)
                return NULL;
        list_for_each_safe(n, tmp, &s->conns)
                conn_close(list_entry(n, Conn, link));
        s->listen_source = sd_event_source_disable_unref(s->listen_source);
        safe_close(s->listen_fd);
        if (s->bound_path) {
                (void) unlink(s->bound_path);
                free(s->bound_path);
        }
        free(s);
        return NULL;
}

int server_listen(Server *s, int inherited_fd, const char *path) {
        int fd, r;

        if (inherited_fd >= 0) {
                int type = 0;
                socklen_t l = sizeof(type);

                fd = inherited_fd;
                if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0 || type != SOCK_SEQPACKET) {
                        safe_close(fd);
                        return log_error_errno(EINVAL, "The inherited socket is not SOCK_SEQPACKET "
                                               "(use ListenSequentialPacket= in the socket unit)");
                }
                (void) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
        } else {
                struct sockaddr_un sa = { .sun_family = AF_UNIX };

                if (strlen(path) >= sizeof(sa.sun_path))
                        return log_error_errno(ENAMETOOLONG, "Socket path too long: \"%s\"", path);
                strcpy(sa.sun_path, path);
                fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                if (fd < 0)
                        return log_error_errno(errno, "Cannot create socket: %m");
                /* a stale socket from a crashed run: only remove it if nobody answers on it */
                if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0) {
                        safe_close(fd);
                        return log_error_errno(EADDRINUSE, "Another tierd is already listening on \"%s\"", path);
                }
                (void) unlink(path);
                safe_close(fd);
                fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                if (fd < 0)
                        return log_error_errno(errno, "Cannot create socket: %m");
                if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                        r = log_error_errno(errno, "Cannot bind \"%s\": %m", path);
                        safe_close(fd);
                        return r;
                }
                (void) chmod(path, 0660);
                if (listen(fd, 128) < 0) {
                        r = log_error_errno(errno, "Cannot listen on \"%s\": %m", path);
                        safe_close(fd);
                        return r;
                }
                s->bound_path = strdup(path);
        }
        s->listen_fd = fd;
        r = sd_event_add_io(s->manager->event, &s->listen_source, fd, EPOLLIN, on_accept, s);
        if (r < 0)
                return log_error_errno(r, "Cannot watch the listening socket: %m");
        (void) sd_event_source_set_description(s->listen_source, "listener");
        return 0;
}

void server_broadcast_shutdown(Server *s, const char *reason) {
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__Shutdown sh = TIER__SHUTDOWN__INIT;

        sh.reason = (char *) reason;
        ev.kind_case = TIER__EVENT__KIND_SHUTDOWN;
        ev.shutdown = &sh;
        if (s->listen_source)
                (void) sd_event_source_set_enabled(s->listen_source, SD_EVENT_OFF);
        list_for_each_safe(n, tmp, &s->conns)
                (void) conn_send_event(list_entry(n, Conn, link), &ev);
}
