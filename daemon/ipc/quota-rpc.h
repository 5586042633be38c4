/* SPDX-License-Identifier: MIT */
/* quota-rpc.h: the quota requests (QuotaGet, QuotaSet) and a new job's quota, for rpc.c. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Conn Conn;
typedef struct Job Job;
typedef struct Rpc Rpc;
typedef struct Tier__QuotaGet Tier__QuotaGet;
typedef struct Tier__QuotaSet Tier__QuotaSet;

/* Answer a QuotaGet of @c; @admin: root or group tier-admin (rpc.c decides). */
int quota_rpc_get(Rpc *rpc, Conn *c, uint64_t seq, const Tier__QuotaGet *q, bool admin);
/* Answer a QuotaSet of @c (refused, with uid and pid in the log and the reply, unless @admin). */
int quota_rpc_set(Rpc *rpc, Conn *c, uint64_t seq, const Tier__QuotaSet *q, bool admin);
/*
 * quota_rpc_job_created() - @j was just created by @c's peer: give it the
 * quota its name, that uid and those groups resolve to.  < 0 with @why:
 * the job cannot start (its guarantees do not fit); the caller ends it.
 */
int quota_rpc_job_created(Rpc *rpc, Conn *c, Job *j, char *why, size_t size);
