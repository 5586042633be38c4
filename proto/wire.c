/* SPDX-License-Identifier: MIT */
/* wire.c: packet framing over AF_UNIX SOCK_SEQPACKET with SCM_RIGHTS fds. */

/*
 * Theory of operation
 *
 * SOCK_SEQPACKET keeps message boundaries, so one packet is one message and
 * this layer adds no header of its own: it only moves bytes and fds and
 * turns every odd outcome of sendmsg()/recvmsg() into one -errno.
 *
 * Sending uses MSG_NOSIGNAL, so a vanished peer is -EPIPE and never SIGPIPE.
 * An empty packet is refused (-EINVAL): the receiver could not tell it from
 * end-of-stream, where recvmsg() also returns 0.
 *
 * Receiving uses MSG_TRUNC, so the kernel reports the real packet length and
 * an oversized packet is detected instead of silently cut, and
 * MSG_CMSG_CLOEXEC, so received fds are never leaked into a child.  The
 * control buffer has room for exactly WIRE_MAX_FDS descriptors; when a peer
 * sends more, the kernel installs what fits, drops the rest and sets
 * MSG_CTRUNC.  Whatever arrived is owned by us from that moment, so on every
 * error path all installed fds are closed before returning: the caller sees
 * either a complete, valid packet with its fds, or an error and no fds.
 */

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "proto/macro.h"
#include "proto/wire.h"

/* Room for WIRE_MAX_FDS descriptors in one SCM_RIGHTS message, aligned for cmsghdr. */
typedef union WireControl {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
} WireControl;

void wire_close_fds(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++)
                fds[i] = safe_close(fds[i]);
}

int wire_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds) {
        WireControl control;
        struct iovec iov = {
                .iov_base = (void *) buf,
                .iov_len = len,
        };
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
        };
        ssize_t n;

        if (len == 0 || n_fds > WIRE_MAX_FDS || (n_fds > 0 && !fds))
                return -EINVAL;

        if (n_fds > 0) {
                struct cmsghdr *cmsg;

                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                cmsg = CMSG_FIRSTHDR(&msg);
                cmsg->cmsg_level = SOL_SOCKET;
                cmsg->cmsg_type = SCM_RIGHTS;
                cmsg->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * n_fds);
        }

        do
                n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == EWOULDBLOCK ? -EAGAIN : negative_errno();
        /* SEQPACKET sends all or nothing; anything else is a kernel surprise. */
        if ((size_t) n != len)
                return -EIO;

        return 0;
}

/* Close every fd carried by any SCM_RIGHTS message in @msg. */
static void wire_close_received(struct msghdr *msg) {
        for (struct cmsghdr *cmsg = CMSG_FIRSTHDR(msg); cmsg; cmsg = CMSG_NXTHDR(msg, cmsg)) {
                size_t n;

                if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS ||
                    cmsg->cmsg_len < CMSG_LEN(0))
                        continue;

                n = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < n; i++) {
                        int fd;

                        memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
                        safe_close(fd);
                }
        }
}

/* Count the fds in @msg; -EBADMSG for anything but well-formed SCM_RIGHTS. */
static int wire_count_fds(struct msghdr *msg, size_t *ret_n) {
        size_t total = 0;

        for (struct cmsghdr *cmsg = CMSG_FIRSTHDR(msg); cmsg; cmsg = CMSG_NXTHDR(msg, cmsg)) {
                size_t bytes;

                if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
                        return -EBADMSG;
                if (cmsg->cmsg_len < CMSG_LEN(0))
                        return -EBADMSG;
                bytes = cmsg->cmsg_len - CMSG_LEN(0);
                if (bytes % sizeof(int) != 0)
                        return -EBADMSG;
                total += bytes / sizeof(int);
        }
        if (total > WIRE_MAX_FDS)
                return -EBADMSG;

        *ret_n = total;
        return 0;
}

int wire_recv(int sock, void *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds) {
        WireControl control;
        struct iovec iov = {
                .iov_base = buf,
                .iov_len = cap,
        };
        struct msghdr msg = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof(control.buf),
        };
        size_t n_fds = 0;
        ssize_t n;
        int r;

        if (ret_len)
                *ret_len = 0;
        if (ret_n_fds)
                *ret_n_fds = 0;

        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == EWOULDBLOCK ? -EAGAIN : negative_errno();

        /* From here on we own whatever fds were installed. */
        if (msg.msg_flags & MSG_CTRUNC) {
                r = -EBADMSG;
                goto close_fds;
        }
        r = wire_count_fds(&msg, &n_fds);
        if (r < 0)
                goto close_fds;
        if (n == 0) {
                /* No payload and no fds is end-of-stream; an empty packet
                 * carrying fds is something no wire_send() produces. */
                r = n_fds > 0 ? -EBADMSG : -ECONNRESET;
                goto close_fds;
        }
        if ((msg.msg_flags & MSG_TRUNC) || (size_t) n > cap) {
                r = -EMSGSIZE;
                goto close_fds;
        }
        if (n_fds > 0 && (!fds || !ret_n_fds)) {
                r = -EBADMSG;
                goto close_fds;
        }

        if (n_fds > 0) {
                struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);

                /* Linux delivers one SCM_RIGHTS message per packet; merge anyway. */
                for (size_t at = 0; cmsg; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
                        size_t k = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);

                        memcpy(fds + at, CMSG_DATA(cmsg), k * sizeof(int));
                        at += k;
                }
                *ret_n_fds = n_fds;
        }
        if (ret_len)
                *ret_len = (size_t) n;
        return 0;

close_fds:
        wire_close_received(&msg);
        return r;
}
