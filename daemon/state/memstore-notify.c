/* SPDX-License-Identifier: MIT */
/* memstore-notify.c: the memory store's messages to the service manager ($NOTIFY_SOCKET), in order, never blocking the loop. */

/*
 * FDSTORE=1 and FDSTOREREMOVE=1 go out on a non-blocking datagram socket;
 * when the service manager's queue is full they wait in MemStore.queue, in
 * order, until the socket is writable again (ms_on_notify_writable()).  A
 * segment's memfd counts as stored (the table names its inode) only once its
 * message is out.  ms_queue_wait() is the one blocking wait, at start, before
 * READY=1 (memstore_begin()).
 *
 * The queue is bounded by the names, not by time: a service manager that
 * stops reading must not make tierd hold an fd per renewal forever.  A
 * FDSTOREREMOVE=1 of a name that waits makes the FDSTORE=1s of that name
 * queued before it moot (it would remove what they store), so they go, fd
 * and all; and a second FDSTOREREMOVE=1 of a name whose first still waits,
 * with nothing of the name between, is the same message again.  What the
 * store ends up with is what the whole sequence would leave; each name has
 * at most one removal and the stores after it waiting, and a renewal
 * (ms_store_remove() then ms_store_put()) leaves one of each.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <systemd/sd-event.h>

#include "daemon/base/log.h"
#include "daemon/state/memstore-private.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* One datagram, with @fd (or none: -1), never waiting: 1 sent, 0 the socket is full, -errno. */
static int send_one(MemStore *ms, const char *text, int fd) {
        union {
                struct cmsghdr h;
                uint8_t buf[CMSG_SPACE(sizeof(int))];
        } control = {};
        struct iovec iov = { .iov_base = (void *) text, .iov_len = strlen(text) };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

        if (fd >= 0) {
                struct cmsghdr *c;

                mh.msg_control = control.buf;
                mh.msg_controllen = sizeof(control.buf);
                c = CMSG_FIRSTHDR(&mh);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(c), &fd, sizeof(int));
        }
        if (sendmsg(ms->notify_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
                return 1;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : negative_errno();
}

/* Send what waits, in order, until the socket is full again. */
static void queue_flush(MemStore *ms) {
        size_t done = 0;

        while (done < ms->n_queue) {
                MsMsg *m = &ms->queue[done];
                int r = send_one(ms, m->text, m->fd);

                if (r == 0)
                        break;
                if (r < 0 && !ms->warned_notify) {
                        log_warning_errno(r, "Memory store: the service manager did not take a message (%m): "
                                          "what it concerns is not kept across restarts (logged once)");
                        ms->warned_notify = true;
                }
                if (r > 0 && m->seg_k >= 0)
                        ms_segment_stored(ms, m->seg_k, m->seg_id, m->ino);
                safe_close(m->fd);
                done++;
        }
        if (done > 0) {
                memmove(ms->queue, ms->queue + done, (ms->n_queue - done) * sizeof(MsMsg));
                ms->n_queue -= done;
        }
        if (ms->notify_source)
                (void) sd_event_source_set_enabled(ms->notify_source, ms->n_queue ? SD_EVENT_ON : SD_EVENT_OFF);
}

int ms_on_notify_writable(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        queue_flush(userdata);
        return 0;
}

/*
 * A message to the service manager with @fd (-1: none), in order with those
 * before it: sent now when nothing waits and the socket takes it, else
 * queued (the fd duplicated) until the socket is writable again.  @seg_k >= 0:
 * a segment's FDSTORE, whose inode @ino the table names once it is sent.
 */
/*
 * A removal of @name is about to wait: the stores of @name waiting before it
 * go (moot); true when a removal of @name waits already with nothing of the
 * name behind it (this one would be the same again).
 */
static bool queue_coalesce(MemStore *ms, const char *name) {
        size_t k = 0;
        bool removing = false;

        for (size_t i = 0; i < ms->n_queue; i++) {
                MsMsg *m = &ms->queue[i];

                if (strcmp(m->name, name) == 0) {
                        if (!m->remove) {
                                safe_close(m->fd);      /* the removal behind it would take it again */
                                continue;
                        }
                        removing = true;
                }
                ms->queue[k++] = *m;
        }
        ms->n_queue = k;
        return removing;
}

static void notify_send(MemStore *ms, const char *text, const char *name, bool remove, int fd, int seg_k,
                        uint32_t seg_id, uint64_t ino) {
        MsMsg *m;
        int r;

        if (ms->notify_fd < 0)
                return;
        if (ms->n_queue == 0) {
                r = send_one(ms, text, fd);
                if (r > 0) {
                        if (seg_k >= 0)
                                ms_segment_stored(ms, seg_k, seg_id, ino);
                        return;
                }
                if (r < 0) {
                        if (!ms->warned_notify)
                                log_warning_errno(r, "Memory store: the service manager did not take a message "
                                                  "(%m): what it concerns is not kept across restarts (logged once)");
                        ms->warned_notify = true;
                        return;
                }
        }
        if (remove && queue_coalesce(ms, name))
                return;
        if (ms->n_queue == ms->cap_queue) {
                size_t cap = ms->cap_queue ? ms->cap_queue * 2 : 64;
                MsMsg *q = reallocarray(ms->queue, cap, sizeof(MsMsg));

                if (!q)
                        return;         /* not kept: the table does not name it */
                ms->queue = q;
                ms->cap_queue = cap;
        }
        m = &ms->queue[ms->n_queue];
        *m = (MsMsg) { .fd = -1, .remove = remove, .seg_k = seg_k, .seg_id = seg_id, .ino = ino };
        snprintf(m->text, sizeof(m->text), "%s", text);
        snprintf(m->name, sizeof(m->name), "%s", name);
        if (fd >= 0) {
                m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
                if (m->fd < 0)
                        return;
        }
        ms->n_queue++;
        if (ms->notify_source)
                (void) sd_event_source_set_enabled(ms->notify_source, SD_EVENT_ON);
}

/* FDSTOREREMOVE=1 of what the store holds under @name. */
void ms_store_remove(MemStore *ms, const char *name) {
        char msg[128];

        snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
        notify_send(ms, msg, name, true, -1, -1, 0, 0);
}

/* FDSTORE=1 of @fd under @name (a segment's: @seg_k, @seg_id and @ino; -1 otherwise). */
void ms_store_put(MemStore *ms, const char *name, int fd, int seg_k, uint32_t seg_id, uint64_t ino) {
        char msg[128];

        snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
        notify_send(ms, msg, name, false, fd, seg_k, seg_id, ino);
}

int ms_notify_open(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        size_t l = strlen(path);
        int fd;

        if (l == 0 || l >= sizeof(sa.sun_path) || (path[0] != '/' && path[0] != '@'))
                return -EINVAL;
        memcpy(sa.sun_path, path, l);
        if (path[0] == '@')
                sa.sun_path[0] = 0;     /* abstract */
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return negative_errno();
        if (connect(fd, (struct sockaddr *) &sa, (socklen_t) (offsetof(struct sockaddr_un, sun_path) + l)) < 0) {
                int r = negative_errno();

                safe_close(fd);
                return r;
        }
        return fd;
}

/* Wait until every queued message is with the service manager, @timeout_usec at most: true once it is. */
bool ms_queue_wait(MemStore *ms, uint64_t timeout_usec) {
        uint64_t deadline = now_usec() + timeout_usec;

        queue_flush(ms);
        while (ms->n_queue > 0) {
                struct pollfd pfd = { .fd = ms->notify_fd, .events = POLLOUT };
                uint64_t now = now_usec();

                if (now >= deadline)
                        return false;
                if (poll(&pfd, 1, (int) DIV_ROUND_UP(deadline - now, (uint64_t) 1000)) < 0 && errno != EINTR)
                        return false;
                queue_flush(ms);
        }
        return true;
}

/*
 * An old segment this run will not adopt goes now, out of the service manager's store too: its memory
 * is freed before the pools take theirs (kept until memstore_begin(), it was held twice meanwhile,
 * while the capacity check had counted it as coming back).  A segment made under its name later is
 * put in the store after this removal (the same queue).
 */
void ms_old_segment_drop(MemStore *ms, int k, uint32_t id) {
        char name[64];

        if (ms->old_seg[k][id] < 0)
                return;
        ms->old_seg[k][id] = safe_close(ms->old_seg[k][id]);
        ms_seg_name(k, id, name, sizeof(name));
        ms_store_remove(ms, name);
}

void ms_seg_name(int k, uint32_t id, char *buf, size_t size) {
        snprintf(buf, size, MEMSTORE_FD_PREFIX "%s-%" PRIu32, k == MS_HOST ? "host" : "vram", id);
}
