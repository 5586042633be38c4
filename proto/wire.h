/* SPDX-License-Identifier: MIT */
/* wire.h: packet framing over AF_UNIX SOCK_SEQPACKET with SCM_RIGHTS fds. */
#pragma once

#include <stddef.h>

/*
 * The version of tier.proto a Hello carries (libtier's TIER_PROTOCOL_VERSION,
 * checked by tests/unit/test-vocab.c).  tierd serves every version from
 * WIRE_PROTOCOL_MIN to WIRE_PROTOCOL_VERSION and answers in the client's;
 * a new version only adds (fields, requests), and one that must take
 * something away raises WIRE_PROTOCOL_MIN, which needs a new libtier
 * soname.  Version 2 is what libtier.so.0 (0.1.0) and libtier.so.1 speak.
 */
#define WIRE_PROTOCOL_VERSION 2
#define WIRE_PROTOCOL_MIN 2

/* Most fds one packet may carry; more is a protocol error. */
#define WIRE_MAX_FDS 16

/**
 * wire_send() - send one packet with optional fds.
 * @fds: borrowed; the caller keeps and closes them.
 * Returns 0, -EAGAIN when a non-blocking socket is full, -EPIPE when the
 * peer is gone, -EINVAL if @n_fds > WIRE_MAX_FDS or @len is 0 (an empty
 * packet would read as end-of-stream), other -errno.
 * Never raises SIGPIPE (MSG_NOSIGNAL).
 */
int wire_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds);

/**
 * wire_recv() - receive one packet.
 * @buf, @cap:    where the payload goes
 * @ret_len:      payload length (may be NULL)
 * @fds:          array of at least WIRE_MAX_FDS ints; receives fds that are
 *                CLOEXEC (MSG_CMSG_CLOEXEC) and owned by the caller on success;
 *                with @fds or @ret_n_fds NULL a packet carrying fds is -EBADMSG
 * @ret_n_fds:    how many fds arrived
 * Returns 0 on success, -EAGAIN if nothing is queued (non-blocking socket),
 * -ECONNRESET when the peer closed (end of stream), -EMSGSIZE if the packet
 * was larger than @cap, -EBADMSG if control data was truncated, not
 * SCM_RIGHTS or more than WIRE_MAX_FDS fds; on every error no fd is left
 * open and *@ret_len, *@ret_n_fds are 0.
 */
int wire_recv(int sock, void *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds);

/* Close @n fds of @fds and set them to -1. */
void wire_close_fds(int *fds, size_t n);
