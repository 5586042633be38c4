/* SPDX-License-Identifier: MIT */
/* rpc.h: the request layer: decoded requests -> registry, engine and scheduler calls -> replies. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/list.h"

typedef struct Config Config;
typedef struct Conn Conn;
typedef struct Engine Engine;
typedef struct NvmeTier NvmeTier;
typedef struct PlanSpec PlanSpec;
typedef struct QuotaStore QuotaStore;
typedef struct Registry Registry;
typedef struct Revoke Revoke;
typedef struct Sched Sched;
typedef struct Server Server;
typedef struct ServerOps ServerOps;
typedef struct Tier__Request Tier__Request;
typedef struct Tier__SubmitPlan Tier__SubmitPlan;
typedef struct VramBackend VramBackend;

/*
 * What the request layer works with, all borrowed (the manager owns them);
 * embedded in the Manager and given to the server as its ServerOps'
 * userdata.
 */
typedef struct Rpc {
        const Config *config;
        Registry *registry;
        Engine *engine;
        Sched *sched;
        VramBackend *vram;
        NvmeTier *nvme;
        Server *server;
        Revoke *revoke;
        QuotaStore *quotas;     /* quotas of jobs, uids and groups (daemon/state/quota.c) */
        uint64_t start_usec;    /* when tierd started (status uptime) */
        gid_t admin_gid;        /* of group "tier-admin", when it exists (rpc_resolve_admin_group()) */
        bool have_admin_gid;
        List evicts;            /* JobEvict (jobctl.c): the job evicts running, one per job at most */
} Rpc;

/* The server's ops (userdata: an Rpc). */
extern const ServerOps rpc_server_ops;

/* Handle one request of @c.  < 0: close the connection. */
int rpc_dispatch(Rpc *r, Conn *c, Tier__Request *req);
/* @c is going away: end its plan, cancel its requests, drop its pins, detach it from its job. */
void rpc_conn_gone(Rpc *r, Conn *c);
/*
 * rpc_resolve_admin_group() - look up group "tier-admin" (NSS: may block
 * on a directory service), at start and on reload, never per request.  A
 * lookup that fails (not "no such group") keeps the gid known before.
 */
void rpc_resolve_admin_group(Rpc *r);
/* Is the peer of @c root or a member of group tier-admin? */
bool rpc_conn_is_admin(const Rpc *r, const Conn *c);

/*
 * rpc_plan_spec() - the accesses of @sp, phase by phase, as the scheduler
 * reads them (PlanSpec, daemon/sched/plan.h); plan_new() checks them.
 * *@ret's array is the caller's to free().  Returns 0 or -ENOMEM.
 */
int rpc_plan_spec(const Tier__SubmitPlan *sp, PlanSpec *ret);
