/* SPDX-License-Identifier: MIT */
/* server.c: the listening socket, accepting connections (SO_PEERCRED), the set of connections. */

/*
 * Theory of operation: one AF_UNIX SOCK_SEQPACKET listener, inherited from
 * systemd (LISTEN_FDS) or bound here.  Each accepted connection is a Conn
 * (conn.c) that carries its peer's credentials from SO_PEERCRED; beyond
 * [daemon] max_connections (or a uid's max_connections_per_uid), new ones
 * are closed at once, told why first (refuse()).  The server hands
 * decoded requests to the request layer through the ServerOps it was given
 * and never looks at what they mean.
 *
 * Binding: a socket file left by a crashed tierd is removed only when
 * connecting to it is refused (ECONNREFUSED: nobody listens) and it is a
 * socket (lstat()); anything else at the path is left alone and tierd
 * refuses to start.  Any other answer, a full backlog (EAGAIN) included,
 * means a daemon may be alive there, and tierd refuses to start rather than
 * steal its socket.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/server.h"
#include "proto/macro.h"
#include "tier.pb-c.h"

/* Connections the kernel queues for accept(). */
#define LISTEN_BACKLOG 128

unsigned server_n_conns(const Server *s) {
        return s->n_conns;
}

unsigned server_count_uid(const Server *s, uid_t uid, const Conn *except) {
        unsigned n = 0;

        list_for_each_safe(node, tmp, &s->conns) {
                const Conn *o = list_entry(node, Conn, link);

                if (o != except && o->uid == uid && o->hello_done)
                        n++;
        }
        return n;
}

/* How long the listener rests after accept() ran out of fds. */
#define ACCEPT_RETRY_USEC (100 * 1000)

static int on_accept_retry(sd_event_source *es, uint64_t usec, void *userdata) {
        Server *s = userdata;

        s->accept_retry = sd_event_source_disable_unref(s->accept_retry);
        if (s->listen_source && !s->stopping)
                (void) sd_event_source_set_enabled(s->listen_source, SD_EVENT_ON);
        return 0;
}

/* Connections of @uid, before their Hello too. */
static unsigned count_uid_all(const Server *s, uid_t uid) {
        unsigned n = 0;

        list_for_each_safe(node, tmp, &s->conns)
                n += list_entry(node, Conn, link)->uid == uid;
        return n;
}

/*
 * Tell a connection refused at accept why, then close it: the Response a
 * refusal of its Hello would be (libtier's Hello is a connection's first
 * request, seq 1), so that tier_client_new() fails with -EUSERS and says why
 * rather than "tierd closed the connection".  Never waits: a fresh socket
 * takes one small packet; where it would block, it is just closed.
 */
static void refuse(int cfd, const char *fmt, ...) _printf_(2, 3);
static void refuse(int cfd, const char *fmt, ...) {
        Tier__Reply reply = TIER__REPLY__INIT;
        Tier__Response resp = TIER__RESPONSE__INIT;
        char msg[256];
        uint8_t buf[512];
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        resp.seq = 1;
        resp.status = -EUSERS;
        resp.error = msg;
        reply.kind_case = TIER__REPLY__KIND_RESPONSE;
        reply.response = &resp;
        if (tier__reply__get_packed_size(&reply) <= sizeof(buf))
                (void) send(cfd, buf, tier__reply__pack(&reply, buf), MSG_DONTWAIT | MSG_NOSIGNAL);
        safe_close(cfd);
}

static int on_accept(sd_event_source *es, int fd, uint32_t revents, void *userdata) {
        Server *s = userdata;
        struct ucred cred;
        socklen_t sl = sizeof(cred);
        Conn *c;
        int cfd, r;

        cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (cfd < 0 && (errno == EMFILE || errno == ENFILE)) {
                /*
                 * The connection stays in the backlog and the listener readable: accepting
                 * again at once would spin (and log) until an fd frees.  Rest a moment; say it
                 * once per time it runs out.
                 */
                if (!s->out_of_fds)
                        log_warning_errno(errno, "accept() failed: out of file descriptors (RLIMIT_NOFILE); "
                                          "new connections wait until some close: %m");
                s->out_of_fds = true;
                (void) sd_event_source_set_enabled(es, SD_EVENT_OFF);
                if (!s->accept_retry &&
                    sd_event_add_time_relative(s->event, &s->accept_retry, CLOCK_MONOTONIC, ACCEPT_RETRY_USEC, 0,
                                               on_accept_retry, s) < 0)
                        (void) sd_event_source_set_enabled(es, SD_EVENT_ON);    /* (no timer: as before) */
                return 0;
        }
        if (cfd < 0) {
                if (errno != EAGAIN && errno != EINTR)
                        log_warning_errno(errno, "accept() failed, ignoring: %m");
                return 0;
        }
        s->out_of_fds = false;
        if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &sl) < 0) {
                log_warning_errno(errno, "SO_PEERCRED failed, dropping connection: %m");
                safe_close(cfd);
                return 0;
        }
        if (count_uid_all(s, cred.uid) >= s->config->max_connections_per_uid) {
                /* before its Hello too: one uid's idle connections do not keep the others out */
                log_warning("Refusing connection from pid " PID_FMT ": uid %u has %u connections "
                            "(max_connections_per_uid)", cred.pid, (unsigned) cred.uid, count_uid_all(s, cred.uid));
                refuse(cfd, "tierd refused the connection: uid %u has %u connections, as many as [daemon] "
                       "max_connections_per_uid allows (close some, or raise it in tierd.conf)",
                       (unsigned) cred.uid, count_uid_all(s, cred.uid));
                return 0;
        }
        if (s->n_conns >= s->config->max_connections) {
                log_warning("Refusing connection from pid " PID_FMT ": %u connections (max_connections)",
                            cred.pid, s->n_conns);
                refuse(cfd, "tierd refused the connection: it has %u connections, as many as [daemon] "
                       "max_connections allows (wait for some to close, or raise it in tierd.conf)", s->n_conns);
                return 0;
        }
        r = conn_new(s, cfd, cred.uid, cred.gid, cred.pid, &c);        /* consumes cfd */
        if (r < 0) {
                log_warning_errno(r, "Cannot set up a connection from pid " PID_FMT ", dropping it: %m", cred.pid);
                return 0;
        }
        log_debug("Connection %" PRIu64 " from pid " PID_FMT " uid %u", c->id, c->pid, (unsigned) c->uid);
        return 0;
}

int server_new(sd_event *event, const Config *config, const ServerOps *ops, void *userdata, Server **ret) {
        Server *s = calloc(1, sizeof(*s));

        if (!s)
                return -ENOMEM;
        s->event = event;
        s->config = config;
        s->ops = ops;
        s->userdata = userdata;
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
        s->accept_retry = sd_event_source_disable_unref(s->accept_retry);
        safe_close(s->listen_fd);
        if (s->bound_path) {
                (void) unlink(s->bound_path);
                free(s->bound_path);
        }
        free(s->rbuf);
        free(s);
        return NULL;
}

/* Is the socket passed by the service manager one tierd can serve on?  0 or -EINVAL, logged. */
static int check_inherited(int fd) {
        int type = 0;
        socklen_t l = sizeof(type);

        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0 || type != SOCK_SEQPACKET)
                return log_error_errno(EINVAL, "The inherited socket is not SOCK_SEQPACKET "
                                       "(use ListenSequentialPacket= in the socket unit)");
        if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
                return log_error_errno(EINVAL, "The inherited socket is not a listening AF_UNIX socket "
                                       "(use ListenSequentialPacket=PATH in the socket unit)");
        return 0;
}

/* Take over a socket passed by the service manager (consumed). */
static int listen_inherited(int fd) {
        int r = check_inherited(fd);

        if (r < 0) {
                safe_close(fd);
                return r;
        }
        (void) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
        return fd;
}

/*
 * Is a daemon listening on @sa?  0: no (nothing there, or a stale socket
 * file, which is removed), -EADDRINUSE: yes, -EEXIST: something that is
 * not a socket is there, another -errno: cannot tell.
 */
static int check_stale(const struct sockaddr_un *sa, const char *path) {
        _cleanup_close_ int fd = -1;

        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return log_error_errno(errno, "Cannot create socket: %m");
        if (connect(fd, (const struct sockaddr *) sa, sizeof(*sa)) == 0)
                return log_error_errno(EADDRINUSE, "Another tierd is already listening on \"%s\"", path);
        switch (errno) {
        case ENOENT:
                return 0;
        case ECONNREFUSED: {
                struct stat st;

                /*
                 * Nobody listens: a socket file left by a tierd that crashed, or no socket at all
                 * (connect() to a regular file is refused too), which is not ours to remove.
                 */
                if (lstat(path, &st) < 0) {
                        if (errno == ENOENT)
                                return 0;
                        return log_error_errno(errno, "Cannot stat \"%s\": %m", path);
                }
                if (!S_ISSOCK(st.st_mode))
                        return log_error_errno(EEXIST, "\"%s\" exists and is not a socket, not replacing it",
                                               path);
                if (unlink(path) < 0 && errno != ENOENT)
                        return log_error_errno(errno, "Cannot remove the stale socket \"%s\": %m", path);
                log_info("Removed the stale socket \"%s\" (nobody listens on it)", path);
                return 0;
        }
        case EAGAIN:
                return log_error_errno(EADDRINUSE, "Another tierd is listening on \"%s\" (its backlog is full)", path);
        default:
                return log_error_errno(errno, "Cannot tell whether another tierd listens on \"%s\", not "
                                       "replacing it: %m", path);
        }
}

static int listen_path(Server *s, const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        _cleanup_close_ int fd = -1;
        mode_t old_mask;
        int r;

        if (strlen(path) >= sizeof(sa.sun_path))
                return log_error_errno(ENAMETOOLONG, "Socket path too long: \"%s\"", path);
        strcpy(sa.sun_path, path);
        r = check_stale(&sa, path);
        if (r < 0)
                return r;
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return log_error_errno(errno, "Cannot create socket: %m");
        /*
         * The socket file is made 0660 by bind() itself, under a umask that leaves nothing else: a
         * chmod() by its path after would follow a link put there meanwhile (by a user who can
         * write the directory) to a file of root's, and until then the file had tierd's umask.
         * (No other thread makes files: the book's syncs, the checksum workers, the renewer.)
         */
        old_mask = umask(0117);
        r = bind(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ? -errno : 0;
        (void) umask(old_mask);
        if (r < 0)
                return log_error_errno(-r, "Cannot bind \"%s\": %m", path);
        if (listen(fd, LISTEN_BACKLOG) < 0) {
                r = log_error_errno(errno, "Cannot listen on \"%s\": %m", path);
                (void) unlink(path);
                return r;
        }
        s->bound_path = strdup(path);
        if (!s->bound_path) {
                (void) unlink(path);
                return log_error_errno(ENOMEM, "Out of memory");
        }
        return TAKE_FD(fd);
}

int server_check_listen(int inherited_fd, const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };

        if (inherited_fd >= 0)
                return check_inherited(inherited_fd);
        if (strlen(path) >= sizeof(sa.sun_path))
                return log_error_errno(ENAMETOOLONG, "Socket path too long: \"%s\"", path);
        strcpy(sa.sun_path, path);
        return check_stale(&sa, path);
}

int server_listen(Server *s, int inherited_fd, const char *path) {
        int fd, r;

        fd = inherited_fd >= 0 ? listen_inherited(inherited_fd) : listen_path(s, path);
        if (fd < 0)
                return fd;
        s->listen_fd = fd;
        r = sd_event_add_io(s->event, &s->listen_source, fd, EPOLLIN, on_accept, s);
        if (r < 0)
                return log_error_errno(r, "Cannot watch the listening socket: %m");
        (void) sd_event_source_set_description(s->listen_source, "listener");
        return 0;
}

void server_stop(Server *s, const char *reason) {
        Tier__Event ev = TIER__EVENT__INIT;
        Tier__Shutdown sh = TIER__SHUTDOWN__INIT;

        sh.reason = (char *) reason;
        ev.kind_case = TIER__EVENT__KIND_SHUTDOWN;
        ev.shutdown = &sh;
        s->stopping = true;
        s->accept_retry = sd_event_source_disable_unref(s->accept_retry);
        if (s->listen_source)
                (void) sd_event_source_set_enabled(s->listen_source, SD_EVENT_OFF);
        list_for_each_safe(n, tmp, &s->conns) {
                Conn *c = list_entry(n, Conn, link);

                (void) conn_send_event(c, &ev);
        }
        server_reap(s);
}

void server_reap_conn(Server *s, Conn *c) {
        /*
         * Read no more requests; write what is queued (the shutdown event
         * last), then close, as after a protocol error: the connection's
         * requests are cancelled and its pins dropped.  One that holds
         * what its client may be writing through is served on (the
         * requests it may make while stopping: rpc.c) until it lets go.
         */
        if (s->stopping && !c->closing && !(s->ops && s->ops->holds && s->ops->holds(s->userdata, c)))
                conn_shutdown(c);
}

void server_reap(Server *s) {
        if (!s->stopping)
                return;
        list_for_each_safe(n, tmp, &s->conns)
                server_reap_conn(s, list_entry(n, Conn, link));
}
