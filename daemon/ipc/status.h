/* SPDX-License-Identifier: MIT */
/* status.h: the daemon's state as a StatusReply message (tierctl status). */
#pragma once

#include <stdint.h>

typedef struct Conn Conn;
typedef struct Rpc Rpc;
typedef struct Tier__StatusReply Tier__StatusReply;

/* A snapshot of everything @r reaches; free it with status_free(). */
int status_build(const Rpc *r, Tier__StatusReply **ret);
/*
 * status_send() - answer request @seq of @c with @sr (borrowed): inline, or
 * as a sealed memfd when it is too large for one packet.  Returns what
 * sending returned (< 0: the connection is broken).
 */
int status_send(Conn *c, uint64_t seq, Tier__StatusReply *sr);
void status_free(Tier__StatusReply *sr);
