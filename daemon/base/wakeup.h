/* SPDX-License-Identifier: MIT */
/* wakeup.h: a client's wakeup pipe: tierd keeps the write end, the client sleeps on the read end. */
#pragma once

/*
 * wakeup_new() - a pipe (O_CLOEXEC, O_NONBLOCK): its write end in
 * *@ret_write, for tierd to keep and give to wakeup_kick(), its read end in
 * *@ret_read, to send to the client and close.  0 or -errno.
 */
int wakeup_new(int *ret_write, int *ret_read);

/*
 * wakeup_kick() - wake the client sleeping on the read end of @fd's pipe
 * (-1: nothing): one 8-byte token, unless one is still unread.  Never blocks;
 * a full pipe, or one the client closed, is ignored (EPIPE: tierd's main()
 * ignores SIGPIPE, as must every program that runs this code).
 * The caller publishes what changed (release store) before calling it.
 */
void wakeup_kick(int fd);
