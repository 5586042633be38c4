/* SPDX-License-Identifier: MIT */
/* commit.h: a job's commit, and its rollback, which waits for the transfers in flight of the job's tensors. */
#pragma once

#include <stdint.h>

typedef struct Conn Conn;
typedef struct Rpc Rpc;
typedef struct Tier__JobCommit Tier__JobCommit;

/* One rollback waiting for the transfers of its job's tensors (commit.c), at most one per connection. */
typedef struct RollbackWait RollbackWait;

/*
 * Each handler answers @seq on @c, a job connection, and returns < 0 only
 * when @c must be closed.  commit_request(): -EBUSY while a tensor of the
 * job is pinned for reading and writing.
 */
int commit_request(Conn *c, uint64_t seq, const Tier__JobCommit *jc);
/*
 * rollback_request(): -EBUSY while a tensor of the job is pinned or a
 * client's request is on one; tierd's own ops on them are cancelled, and
 * the answer waits until the transfers they started have ended.
 */
int rollback_request(Rpc *rpc, Conn *c, uint64_t seq);
/* @c is going away: its waiting rollback ends unanswered (the job thaws). */
void rollback_conn_gone(Conn *c);
