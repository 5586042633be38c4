/* SPDX-License-Identifier: MIT */
/* owner.h: what one uid may have: the job a Hello names (found, or made for it), and its tensors in all. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct Conn Conn;
typedef struct Job Job;
typedef struct Registry Registry;
typedef struct Rpc Rpc;

/*
 * owner_hello_job() - the job @name of a Hello on @c: found (and @c's uid
 * may attach to it: its owner, root, group tier-admin) or made for @c's uid
 * (within max_connections_per_uid jobs of that uid, its quota resolved and
 * its guarantees fitting).  NULL after a reply to @seq saying why.
 */
Job *owner_hello_job(Rpc *rpc, Conn *c, uint64_t seq, const char *name, bool *ret_created);

/* The tensors of all the jobs of @uid (lingering ones included, not those ended). */
unsigned owner_uid_tensors(const Registry *r, uid_t uid);

/*
 * owner_tensor_room() - may @c create one more tensor in its job, within
 * [limits] max_tensors_per_uid over all the jobs of that job's uid (not
 * @c's: root or tier-admin attached to it)?  0 if so, else -EMFILE
 * after a reply to @seq saying why and what to do instead.
 */
int owner_tensor_room(Rpc *rpc, Conn *c, uint64_t seq);
