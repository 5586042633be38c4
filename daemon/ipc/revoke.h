/* SPDX-License-Identifier: MIT */
/* revoke.h: taking segments back from a job's clients cooperatively (Event.revoke, Request.ack). */
#pragma once

#include <stdint.h>

#include "proto/macro.h"

typedef struct Conn Conn;
typedef struct Engine Engine;
typedef struct Revoke Revoke;
typedef struct SegPool SegPool;
typedef struct Segment Segment;
typedef struct Tier__Ack Tier__Ack;
typedef struct sd_event sd_event;

/* How long a client has to unmap a revoked segment and ack it before its connection is closed. */
#define REVOKE_TIMEOUT_USEC (5ull * 1000000ull)

/* The revokes waited for; @engine's space waiters run again when a segment is back. */
int revoke_new(sd_event *event, Engine *engine, Revoke **ret);
Revoke *revoke_free(Revoke *v);
DEFINE_TRIVIAL_CLEANUP_FUNC(Revoke *, revoke_free);

/*
 * revoke_segment() - SegPool.revoke hook (userdata: the Revoke).  Sends
 * Event.revoke to every connection of @seg's owner that was sent this
 * generation of it.  Returns 0 when none was (drop the memory now), 1 when
 * segpool_revoked() follows once each has acked, gone away or timed out.
 */
int revoke_segment(SegPool *p, Segment *seg, void *userdata);
/* A client's Ack (rpc.c); an ack of nothing pending is ignored.  Never replied to. */
void revoke_ack(Revoke *v, Conn *c, const Tier__Ack *ack);
/* @c is closing: it holds no mapping tierd waits for any more. */
void revoke_conn_gone(Revoke *v, Conn *c);
