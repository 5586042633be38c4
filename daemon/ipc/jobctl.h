/* SPDX-License-Identifier: MIT */
/* jobctl.h: tierctl's requests on a whole job: list its tensors, evict it, detach it. */
#pragma once

#include <stdint.h>

typedef struct Conn Conn;
typedef struct Rpc Rpc;
typedef struct Tier__JobDetach Tier__JobDetach;
typedef struct Tier__JobEvict Tier__JobEvict;
typedef struct Tier__JobTensors Tier__JobTensors;

/* Tensors a JobTensors reply lists at most (a page; the client asks for the next one). */
#define JOBCTL_TENSORS_PAGE_MAX 1024u
/* Bytes of packed entries a JobTensors reply holds at most (well inside a client's receive buffer). */
#define JOBCTL_TENSORS_PAGE_BYTES (48u << 10)

typedef struct Job Job;
typedef struct List List;

/*
 * jobctl_page_start() - where @c's page of @j's tensors at @offset starts
 * (a node of Job.tensors, or &j->tensors: none left).  The tensor after
 * @c's last page, when it asks for the offset that page ended at and that
 * tensor is still there (a page is a snapshot: a job that changed between
 * pages may list a tensor twice or not at all); else a walk from the
 * start, skipping @offset tensors (not doomed ones).
 */
List *jobctl_page_start(Conn *c, Job *j, uint32_t offset);

/*
 * Each handler answers @seq on @c (control or job connection) and returns
 * < 0 only when @c must be closed.  Allowed to the job's uid, root and
 * members of group tier-admin; a denial is logged with the peer's uid and
 * pid and says so in the reply.
 */
int jobctl_tensors(Rpc *rpc, Conn *c, uint64_t seq, const Tier__JobTensors *q);
/* Answered once every evict op has ended (or at once when there is nothing to do). */
int jobctl_evict(Rpc *rpc, Conn *c, uint64_t seq, const Tier__JobEvict *q);
int jobctl_detach(Rpc *rpc, Conn *c, uint64_t seq, const Tier__JobDetach *q);
/* @c is going away: its evict in flight runs on, unanswered. */
void jobctl_conn_gone(Conn *c);
