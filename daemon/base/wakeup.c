/* SPDX-License-Identifier: MIT */
/* wakeup.c: a client's wakeup pipe: tierd keeps the write end, the client sleeps on the read end. */

/*
 * Theory of operation: a client that waits for a fence or a plan phase
 * polls its wakeup fd (HelloReply.fence_eventfd), and tierd writes to it on
 * its one event loop, so that write must never block.  An eventfd could
 * not promise that: its one open file description is shared with the
 * client, which can clear O_NONBLOCK and fill the counter, and eventfd has
 * no per-call non-blocking write (pwritev2 RWF_NOWAIT is EOPNOTSUPP).  A
 * pipe can: tierd's write end is a file description of its own, which the
 * client never holds (no flag of its own to change), and the client's read
 * end cannot be written (EBADF).
 *
 * Tokens are 8 bytes, what an eventfd read gives, so a libtier written for
 * the eventfd (poll, then read 8 bytes, then look at the page) still works;
 * libtier now reads every token there is in one read (client_wakeup_drain()).
 * tierd writes a token only while none is unread (FIONREAD, which works on
 * a pipe's write end), so the pipe holds 8 bytes at most: an old libtier
 * empties it in one read, and a client that never reads cannot fill it.
 * A full pipe (EAGAIN) would do no harm either: its client is awake.
 *
 * No wakeup is lost by skipping the write.  tierd publishes the new state
 * (release store to the fence or plan page) before it looks at FIONREAD.
 * If it finds a token unread, the client's read that takes that token comes
 * after tierd's look, in the pipe's own order (its mutex), and so after the
 * state was published; the client reads the tokens, then checks the state
 * (acquire load) again before it sleeps: it sees the new state.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "daemon/base/wakeup.h"

int wakeup_new(int *ret_write, int *ret_read) {
        int p[2];

        if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
                return -errno;
        *ret_read = p[0];
        *ret_write = p[1];
        return 0;
}

void wakeup_kick(int fd) {
        uint64_t token = 1;
        int unread = 0;

        if (fd < 0)
                return;
        /* an unread token wakes the client already (see above: nothing is lost) */
        if (ioctl(fd, FIONREAD, &unread) == 0 && unread > 0)
                return;
        /* 8 bytes <= PIPE_BUF: all written, or nothing (EAGAIN: full, the client is awake; EPIPE: it closed it) */
        (void) write(fd, &token, sizeof(token));
}
