/* SPDX-License-Identifier: MIT */
/* rpc.h: decoded requests -> registry and op-engine calls -> responses. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct Conn Conn;
typedef struct Tier__Request Tier__Request;
typedef struct Tier__Segment Tier__Segment;

/* Handle one request.  < 0: close the connection. */
int rpc_dispatch(Conn *c, Tier__Request *req);
/* Reply with an error and close the connection once it is sent. */
int rpc_protocol_error(Conn *c, uint64_t seq, int status, const char *msg);
/* The connection is going away: cancel its requests, drop its pins, detach from the job. */
void rpc_conn_gone(Conn *c);

/* Fill up to @max - *n_fds Segment messages for segments @c has not been sent. */
size_t rpc_collect_segments(Conn *c, Tier__Segment *segs, Tier__Segment **segp, int *fds, size_t *n_fds, size_t max);
void rpc_segments_sent(Conn *c, const Tier__Segment *segs, size_t n);
