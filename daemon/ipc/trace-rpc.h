/* SPDX-License-Identifier: MIT */
/* trace-rpc.h: the trace requests (TraceStart, TraceStop), for rpc.c. */
#pragma once

#include <stdint.h>

typedef struct Conn Conn;
typedef struct Rpc Rpc;
typedef struct Tier__TraceStart Tier__TraceStart;

/*
 * Each handler answers @seq on @c and returns < 0 only when @c must be
 * closed.  Root and group tier-admin only (a denial is logged with the
 * peer's uid and pid); one trace at a time, owned by the connection that
 * started it.
 */
int trace_rpc_start(Rpc *rpc, Conn *c, uint64_t seq, const Tier__TraceStart *q);
/* Stop recording and send the records (a sealed memfd); the trace ends. */
int trace_rpc_stop(Rpc *rpc, Conn *c, uint64_t seq);
/* @c is going away: a trace it owns ends, its records unread. */
void trace_rpc_conn_gone(Rpc *rpc, Conn *c);
