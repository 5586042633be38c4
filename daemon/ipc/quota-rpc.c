/* SPDX-License-Identifier: MIT */
/* quota-rpc.c: the quota requests (QuotaGet, QuotaSet) and a new job's quota, for rpc.c. */

/*
 * Theory of operation: the quotas themselves (precedence, checks, the state
 * file) are daemon/state/quota.c's; this is who may do what, and the wire.
 * Setting a quota (any target: a job name, a uid, a group) needs root or
 * group tier-admin (rpc.c's conn_is_admin() decides and passes @admin);
 * reading needs nothing for the default and for a job name that does not
 * run, and otherwise that the peer is the job's or the uid's, or a member
 * of the group (or an admin).  A denial says the peer's uid and pid, in
 * tierd's log and in the client's error.  A set that changed running jobs'
 * quotas tells the engine (engine_limits_changed()), so that ops waiting
 * for room re-check it.  The reply is the target's quota as it resolves
 * now, each value with where it comes from.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/conn.h"
#include "daemon/ipc/quota-rpc.h"
#include "daemon/ipc/rpc.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "proto/utf8.h"
#include "tier.pb-c.h"

int quota_rpc_job_created(Rpc *rpc, Conn *c, Job *j, char *why, size_t size) {
        _cleanup_free_ gid_t *groups = NULL;
        int n = conn_peer_groups(c, &groups);

        if (n < 0) {
                /* a job made without its groups would escape their quotas */
                (void) snprintf(why, size, "cannot read the groups of the peer (uid %u): %s", (unsigned) c->uid,
                                strerror(-n));
                return n;
        }

        /*
         * An admin's jobs have no uid_share (a [quota] total still holds),
         * nor have the jobs of tierd's own uid: a tierd a user runs for
         * itself (the demo, a test suite run as nobody) serves that user alone.
         */
        j->admin = rpc_conn_is_admin(rpc, c) || c->uid == geteuid();
        return quota_job_created(rpc->quotas, j, c->gid, groups, (size_t) n, true, why, size);
}

static int reply_quota(const Rpc *rpc, Conn *c, uint64_t seq, QuotaKind kind, uint32_t id, const char *job,
                       bool running, const QuotaResolved *q, const char *warning) {
        Tier__Response resp = TIER__RESPONSE__INIT;
        Tier__QuotaReply qr = TIER__QUOTA_REPLY__INIT;
        uint64_t limits[TIERS], mins[TIERS], totals[TIERS], used[TIERS];
        char from[2 * TIERS + 1][QUOTA_JOB_NAME_MAX + 32], tfrom[TIERS][64];
        char *limit_from[TIERS], *min_from[TIERS], *total_from[TIERS];

        if (kind == QUOTA_UID || kind == QUOTA_GROUP) {
                QuotaSource src[TIERS];
                JobTotal jt;

                /* for a uid: its jobs' share unless it is root or tierd's (a tier-admin member's jobs have none either) */
                quota_totals_resolve(rpc->config, rpc->registry, &rpc->quotas->runtime, kind, id,
                                     kind == QUOTA_UID && (id == 0 || id == (uint32_t) geteuid()), &jt, src);
                for (int t = 0; t < TIERS; t++) {
                        totals[t] = jt.total[t];
                        used[t] = total_used(rpc->registry, &jt, t, NULL);
                        if (jt.from_share & (1u << t))
                                (void) snprintf(tfrom[t], sizeof(tfrom[t]), "uid_share");
                        else if (src[t].kind == QUOTA_DEFAULT)
                                (void) snprintf(tfrom[t], sizeof(tfrom[t]), "none");
                        else
                                (void) quota_source_format(&src[t], tfrom[t], sizeof(tfrom[t]));
                        total_from[t] = tfrom[t];
                }
                qr.n_tier_total = TIERS;
                qr.tier_total = totals;
                qr.n_total_from = TIERS;
                qr.total_from = total_from;
                qr.n_total_used = TIERS;
                qr.total_used = used;
        }

        for (int t = 0; t < TIERS; t++) {
                limits[t] = q->value[QUOTA_MAX(t)];
                mins[t] = q->value[QUOTA_MIN(t)];
                limit_from[t] = quota_source_format(&q->from[QUOTA_MAX(t)], from[t], sizeof(from[t]));
                min_from[t] = quota_source_format(&q->from[QUOTA_MIN(t)], from[TIERS + t], sizeof(from[t]));
        }
        qr.job = (char *) (job ? job : "");
        qr.kind = (uint32_t) kind;
        qr.id = id;
        qr.running = running;
        qr.n_tier_limit = TIERS;
        qr.tier_limit = limits;
        qr.n_tier_min = TIERS;
        qr.tier_min = mins;
        qr.n_limit_from = TIERS;
        qr.limit_from = limit_from;
        qr.n_min_from = TIERS;
        qr.min_from = min_from;
        qr.weight = (uint32_t) q->value[QUOTA_WEIGHT];
        qr.weight_from = quota_source_format(&q->from[QUOTA_WEIGHT], from[2 * TIERS], sizeof(from[0]));
        qr.warning = (char *) (warning ? warning : "");
        resp.seq = seq;
        resp.result_case = TIER__RESPONSE__RESULT_QUOTA;
        resp.quota = &qr;
        return conn_send_response(c, &resp, NULL, 0, false);
}

/* Does tierd.conf or the run-time set have a rule for job name @name? */
static bool name_has_rule(const Rpc *rpc, const char *name) {
        return quota_rules_find(&rpc->quotas->runtime, QUOTA_JOB, 0, name) ||
               quota_rules_find(&rpc->config->quotas, QUOTA_JOB, 0, name);
}

/* Resolve target (@kind, @id, @name) as it stands now; *@ret_running: a job of that name runs. */
static void resolve_target(const Rpc *rpc, QuotaKind kind, uint32_t id, const char *name, QuotaResolved *ret,
                           bool *ret_running) {
        Job *j = kind == QUOTA_JOB ? job_find(rpc->registry, name) : NULL;
        gid_t gid = (gid_t) id;
        QuotaSubject who = {
                .job = kind == QUOTA_JOB ? name : NULL,
                .has_uid = kind == QUOTA_UID,
                .uid = id,
                .gids = kind == QUOTA_GROUP ? &gid : NULL,
                .n_gids = kind == QUOTA_GROUP,
        };

        *ret_running = j != NULL;
        if (j)
                quota_resolve_job(rpc->config, &rpc->quotas->runtime, j, ret);
        else
                quota_resolve(rpc->config, &rpc->quotas->runtime, &who, ret);
}

static int check_job_name(const Rpc *rpc, Conn *c, uint64_t seq, const char *name) {
        size_t len = strlen(name);
        char why[UTF8_NAME_FLAW_MAX];
        const char *flaw;

        if (len > rpc->config->max_name)
                return conn_reply_error(c, seq, -ENAMETOOLONG, "job name longer than max_name (%u bytes)",
                                        rpc->config->max_name), -ENAMETOOLONG;
        flaw = utf8_name_flaw(name, len, why);         /* the rule of rpc.c check_name(): no job has such a name */
        if (flaw)
                return conn_reply_error(c, seq, -EINVAL, "job name %s", flaw), -EINVAL;
        return 0;
}

/* Refuse @c and log it, naming the peer. */
static int deny(Conn *c, uint64_t seq, const char *action, const char *target, const char *who_may) {
        log_notice("Connection %" PRIu64 " (uid %u, pid " PID_FMT ") denied: %s %s needs %s", c->id, (unsigned) c->uid,
                   c->pid, action, target, who_may);
        return conn_reply_error(c, seq, -EPERM, "uid %u (pid " PID_FMT ") may not %s %s: that needs %s", (unsigned) c->uid,
                                c->pid, action, target, who_may);
}

int quota_rpc_get(Rpc *rpc, Conn *c, uint64_t seq, const Tier__QuotaGet *q, bool admin) {
        QuotaKind kind = (QuotaKind) q->kind;
        const char *name = NULL;
        char target[QUOTA_JOB_NAME_MAX + 16];
        QuotaResolved res;
        bool running;
        Job *j = NULL;

        if (q->kind >= _QUOTA_KIND_MAX)
                return conn_reply_error(c, seq, -EINVAL, "unknown quota target kind %" PRIu32 " (0 job, 1 uid, 2 group, "
                                        "3 default)", q->kind);
        if (kind == QUOTA_JOB) {
                name = q->job && q->job[0] ? q->job : c->job ? c->job->name : NULL;
                if (!name)
                        return conn_reply_error(c, seq, -EINVAL, "a control connection has no job of its own: name one");
                if (check_job_name(rpc, c, seq, name) < 0)
                        return 0;
                j = job_find(rpc->registry, name);
                if (!j && !name_has_rule(rpc, name))
                        return conn_reply_error(c, seq, -ENOENT, "no job '%s', and no quota for that job name", name);
        }
        quota_target_format(kind, q->id, name, target, sizeof(target));
        if (!admin) {
                char who[64];

                if (j && j->uid != c->uid) {
                        (void) snprintf(who, sizeof(who), "root, group tier-admin or uid %u", (unsigned) j->uid);
                        return deny(c, seq, "read the quota of", target, who);
                }
                if (kind == QUOTA_UID && q->id != (uint32_t) c->uid) {
                        (void) snprintf(who, sizeof(who), "root, group tier-admin or uid %" PRIu32, q->id);
                        return deny(c, seq, "read the quota of", target, who);
                }
                if (kind == QUOTA_GROUP && !conn_peer_in_group(c, (gid_t) q->id))
                        return deny(c, seq, "read the quota of", target,
                                    "root, group tier-admin or membership of that group");
        }
        resolve_target(rpc, kind, q->id, name, &res, &running);
        return reply_quota(rpc, c, seq, kind, kind == QUOTA_UID || kind == QUOTA_GROUP ? q->id : 0, name, running,
                           &res, NULL);
}

int quota_rpc_set(Rpc *rpc, Conn *c, uint64_t seq, const Tier__QuotaSet *q, bool admin) {
        QuotaRule change = {};
        char target[QUOTA_JOB_NAME_MAX + 16], why[1024] = "", warn[1024] = "";
        QuotaResolved res;
        bool running;
        int r;

        if (q->kind >= _QUOTA_KIND_MAX)
                return conn_reply_error(c, seq, -EINVAL, "unknown quota target kind %" PRIu32 " (0 job, 1 uid, 2 group)",
                                        q->kind);
        change.kind = (QuotaKind) q->kind;
        change.id = change.kind == QUOTA_UID || change.kind == QUOTA_GROUP ? q->id : 0;
        if (change.kind == QUOTA_JOB) {
                if (!q->job || !q->job[0])
                        return conn_reply_error(c, seq, -EINVAL, "no job named: a quota is set on a job name, a uid or a "
                                                "group");
                if (check_job_name(rpc, c, seq, q->job) < 0)
                        return 0;
                change.job = q->job;    /* borrowed: quota_store_set() copies */
        }
        quota_target_format(change.kind, change.id, change.job, target, sizeof(target));
        if (!admin)
                return deny(c, seq, "set the quota of", target, "root or membership of group tier-admin");
        if (q->n_tier_limit != 0 && q->n_tier_limit != TIERS)
                return conn_reply_error(c, seq, -EINVAL, "a quota has one max per tier (%d), not %zu", TIERS,
                                        q->n_tier_limit);
        if (q->n_tier_min != 0 && q->n_tier_min != TIERS)
                return conn_reply_error(c, seq, -EINVAL, "a quota has one min per tier (%d), not %zu", TIERS,
                                        q->n_tier_min);
        if (q->min_set & ~((1u << TIERS) - 1))
                return conn_reply_error(c, seq, -EINVAL, "min_set 0x%" PRIx32 " names tiers that do not exist", q->min_set);
        if (q->min_set && q->n_tier_min == 0)
                return conn_reply_error(c, seq, -EINVAL, "min_set names tiers but no minimum is given");
        for (size_t t = 0; t < q->n_tier_limit; t++)
                if (q->tier_limit[t] > 0) {
                        change.value[QUOTA_MAX(t)] = q->tier_limit[t];
                        change.set |= 1u << QUOTA_MAX(t);
                }
        for (int t = 0; t < TIERS; t++)
                if (q->min_set & (1u << t)) {
                        change.value[QUOTA_MIN(t)] = q->tier_min[t];
                        change.set |= 1u << QUOTA_MIN(t);
                }
        if (q->weight > 0) {
                change.value[QUOTA_WEIGHT] = q->weight;
                change.set |= 1u << QUOTA_WEIGHT;
        }
        if (q->total_set & ~((1u << TIERS) - 1))
                return conn_reply_error(c, seq, -EINVAL, "total_set 0x%" PRIx32 " names tiers that do not exist",
                                        q->total_set);
        if (q->total_set && q->n_tier_total != TIERS)
                return conn_reply_error(c, seq, -EINVAL, "a quota has one total per tier (%d), not %zu", TIERS,
                                        q->n_tier_total);
        if (q->total_set && change.kind != QUOTA_UID && change.kind != QUOTA_GROUP)
                return conn_reply_error(c, seq, -EINVAL, "a total is of a uid's or a group's jobs together; a job name "
                                        "has a maximum instead");
        for (int t = 0; t < TIERS; t++)
                if (q->total_set & (1u << t)) {
                        change.value[QUOTA_TOTAL(t)] = q->tier_total[t];
                        change.set |= 1u << QUOTA_TOTAL(t);
                }

        r = quota_store_set(rpc->quotas, &change, q->clear, why, sizeof(why), warn, sizeof(warn));
        if (r < 0) {
                log_notice("Quota of %s not set (uid %u, pid " PID_FMT "): %s", target, (unsigned) c->uid, c->pid,
                           why[0] ? why : strerror(-r));
                return conn_reply_error(c, seq, r, "%s", why[0] ? why : strerror(-r));
        }
        if (r > 0)
                engine_limits_changed(rpc->engine);     /* ops waiting for space re-check their room */
        if (warn[0])
                log_warning("Quota of %s set with a warning: %s", target, warn);
        resolve_target(rpc, change.kind, change.id, change.job, &res, &running);
        return reply_quota(rpc, c, seq, change.kind, change.id, change.job, running, &res, warn);
}
