/* SPDX-License-Identifier: MIT */
/* quota.c: quotas of jobs, uids and groups: precedence, checks against the capacities, the state file. */

/*
 * Theory of operation: a job's quota is, per tier, a hard maximum (Job.limit)
 * and a guaranteed minimum no other job may take (Job.guarantee), plus its
 * bandwidth weight (Job.weight).  Each of these fields is resolved on its
 * own along the order of precedence
 *
 *     job (its name) > uid (its creator's) > group (its creator's primary
 *     group, then the supplementary ones by gid) > default
 *
 * where the default is tierd.conf's [host]/[vram]/[nvme] job_limit and
 * [sched] default_weight, and no minimum.  Rules come from two places:
 * tierd.conf's [quota] sections (Config.quotas; a later section of the
 * same target wins field by field) and tierctl quota set (QuotaStore.
 * runtime, one rule per target), which wins over tierd.conf for the same
 * target.  A rule on a job name holds whether a job of that name runs or
 * not: it is how a quota is set before a job starts, and why a re-run of a
 * name finds the quota set on its previous run (tierd logs at creation
 * which quota applies and where each value comes from).
 *
 * A job gets its quota when it is created (quota_job_created()) and again
 * whenever the rules change (quota_apply_all(): a set, a reload); the
 * caller then tells the engine, whose waiters re-check their room.
 * Checks: a maximum or total above the tier's capacity is refused (at run
 * time; tierd.conf may hold them), a minimum above
 * the maximum too, and so are guarantees that would add up to more than a
 * tier's capacity over everyone who could run at once (the running jobs
 * and the job names that have rules; a lingering job yields its claim, as
 * the engine gives it no share, and counts only by its name's rule, and a
 * job of another uid than its name's owner counts by its own quota while
 * the name's guarantee stays kept for the owner: quota-owner.c); a
 * maximum below what a job uses now is accepted with a warning.  NVMe
 * copies are never taken back from a job, so an NVMe guarantee is room
 * kept free (state/space.c): the running jobs' nvme_min, less what each
 * uses there, must also fit in the NVMe room free now, or the claim (a
 * set, a reload, a new job, a lingering one attaching) is refused.
 *
 * The run-time rules are kept in <state_dir>/quotas, in the [quota] syntax
 * of tierd.conf: written whole on each change (a temporary file, fsync,
 * rename, fsync of the directory: base/statefile.c) and read at start.
 * A corrupt file is moved aside (PATH.corrupt.TIMESTAMP, base/statefile.c), never silently dropped;
 * one that is not a regular file (a FIFO, a link) too, and opening it never blocks.
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/base/statefile.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"
#include "util/escape.h"
#include "util/size.h"

int quota_store_new(Registry *r, const Config *config, QuotaStore **ret) {
        QuotaStore *s = calloc(1, sizeof(*s));
        size_t n;

        if (!s)
                return -ENOMEM;
        n = strlen(config->state_dir);
        while (n > 1 && config->state_dir[n - 1] == '/')
                n--;
        if (asprintf(&s->path, "%.*s/" QUOTA_STATE_FILE, (int) n, config->state_dir) < 0) {
                free(s);
                return -ENOMEM;
        }
        s->registry = r;
        s->config = config;
        *ret = s;
        return 0;
}

QuotaStore *quota_store_free(QuotaStore *s) {
        if (!s)
                return NULL;
        quota_rules_clear(&s->runtime);
        free(s->path);
        free(s);
        return NULL;
}

/* ---- precedence ------------------------------------------------------------------------------ */

uint64_t quota_default_value(const Config *c, int field) {
        switch (field) {
        case QUOTA_MAX(LEVEL_VRAM):
                return c->vram_job_limit;
        case QUOTA_MAX(LEVEL_HOST):
                return c->host_job_limit;
        case QUOTA_MAX(LEVEL_NVME):
                return c->nvme_job_limit;
        case QUOTA_WEIGHT:
                return c->default_weight;
        default:
                return 0;       /* no minimum */
        }
}

/* The value of @field for target (@kind, @id, @job): the run-time rule's, else tierd.conf's last one. */
static bool take(const Config *c, const QuotaRules *runtime, QuotaKind kind, uint32_t id, const char *job,
                 int field, QuotaResolved *ret) {
        const QuotaRule *q = runtime ? quota_rules_find(runtime, kind, id, job) : NULL;
        bool config = false;

        if (!q || !(q->set & (1u << field))) {
                q = NULL;
                for (size_t i = c->quotas.n; i-- > 0;)
                        if (quota_rule_matches(&c->quotas.rules[i], kind, id, job) &&
                            (c->quotas.rules[i].set & (1u << field))) {
                                q = &c->quotas.rules[i];
                                config = true;
                                break;
                        }
        }
        if (!q)
                return false;
        ret->value[field] = q->value[field];
        ret->from[field] = (QuotaSource) { .kind = kind, .id = id, .job = q->job, .config = config };
        return true;
}

void quota_resolve(const Config *c, const QuotaRules *runtime, const QuotaSubject *who, QuotaResolved *ret) {
        uint32_t owner = 0;
        bool has_owner = who->job && quota_job_owner(c, runtime, who->job, &owner);

        /* a name with an owner: its rules govern the owner's job, not one another uid holds (restored, or before a reload) */
        ret->not_owner = has_owner && who->has_uid && who->uid != owner;
        ret->owner = owner;
        for (int f = 0; f < QUOTA_FIELDS; f++) {
                if (who->job && !ret->not_owner && take(c, runtime, QUOTA_JOB, 0, who->job, f, ret)) {
                        ret->from[f].has_owner = has_owner;
                        ret->from[f].owner = owner;
                        continue;
                }
                if (who->has_uid && take(c, runtime, QUOTA_UID, who->uid, NULL, f, ret))
                        continue;
                for (size_t g = 0; g < who->n_gids; g++)
                        if (take(c, runtime, QUOTA_GROUP, (uint32_t) who->gids[g], NULL, f, ret))
                                goto next;
                ret->value[f] = quota_default_value(c, f);
                ret->from[f] = (QuotaSource) { .kind = QUOTA_DEFAULT };
        next:;
        }
}

void quota_resolve_job(const Config *c, const QuotaRules *runtime, const Job *j, QuotaResolved *ret) {
        QuotaSubject who = {
                .job = j->name,
                .has_uid = true,
                .uid = (uint32_t) j->uid,
                .gids = j->gids,
                .n_gids = j->n_gids,
        };

        quota_resolve(c, runtime, &who, ret);
}

char *quota_source_format(const QuotaSource *src, char *buf, size_t size) {
        char t[QUOTA_JOB_NAME_MAX + 16];

        if (src->kind == QUOTA_DEFAULT) {
                (void) snprintf(buf, size, "default");
                return buf;
        }
        quota_target_format(src->kind, src->id, src->job, t, sizeof(t));
        if (src->has_owner)
                (void) snprintf(buf, size, "%s (%sowner uid %" PRIu32 ")", t, src->config ? "tierd.conf, " : "",
                                src->owner);
        else
                (void) snprintf(buf, size, "%s%s", t, src->config ? " (tierd.conf)" : "");
        return buf;
}

/* ---- checks -------------------------------------------------------------------------------- */

static uint64_t add_sat(uint64_t a, uint64_t b) {
        return a + b < a ? UINT64_MAX : a + b;
}

/* min <= max in every tier for the holder @what; else -EINVAL with the reason. */
static int check_min_max(const QuotaResolved *q, const char *what, char *why, size_t size) {
        for (int t = 0; t < TIERS; t++) {
                char a[256], b[256];

                if (q->value[QUOTA_MIN(t)] <= q->value[QUOTA_MAX(t)])
                        continue;
                (void) snprintf(why, size, "%s would get a %s min of %s (from: %s) above its max of %s (from: %s)",
                                what, level_to_string(t), FORMAT_SIZE(q->value[QUOTA_MIN(t)]),
                                quota_source_format(&q->from[QUOTA_MIN(t)], a, sizeof(a)),
                                FORMAT_SIZE(q->value[QUOTA_MAX(t)]),
                                quota_source_format(&q->from[QUOTA_MAX(t)], b, sizeof(b)));
                return -EINVAL;
        }
        return 0;
}

/* No connection left, waiting for linger_sec to end (a job just created has none yet, and does not linger). */
static bool job_lingers(const Job *j) {
        return j->linger_until != 0;
}

/* Per tier: the sum of guarantees and who holds them ("job 'a' 1.0 GiB, ..."); and the NVMe ones not used yet. */
typedef struct GuaranteeSum {
        uint64_t sum[TIERS];
        char who[TIERS][512];
        uint64_t nvme_unused;
        char nvme_who[512];
} GuaranteeSum;

/*
 * Running job @j would claim an NVMe guarantee of @min.  NVMe copies are
 * never taken back from a job (state/space.c), so what it does not use of
 * it yet must be free now: count it.
 */
static void nvme_claim_add(GuaranteeSum *g, const Job *j, uint64_t min) {
        uint64_t unused = min > j->used[LEVEL_NVME] ? min - j->used[LEVEL_NVME] : 0;
        size_t n = strlen(g->nvme_who);

        if (unused == 0)
                return;
        g->nvme_unused = add_sat(g->nvme_unused, unused);
        if (n + 4 < sizeof(g->nvme_who) &&
            snprintf(g->nvme_who + n, sizeof(g->nvme_who) - n, "%sjob '%s' %s (of %s)", n ? ", " : "", j->name,
                     FORMAT_SIZE(unused), FORMAT_SIZE(min)) >= (int) (sizeof(g->nvme_who) - n))
                (void) snprintf(g->nvme_who + sizeof(g->nvme_who) - 4, 4, "...");
}

/*
 * The NVMe guarantees the running jobs claim, less what each uses of its
 * own, must fit in the NVMe room free now: it cannot be taken back from
 * the jobs that hold the rest (named, with what they hold beyond their own
 * guarantee; a lingering job all it holds).  -ENOSPC with the reason.
 */
static int nvme_claims_check(const Registry *r, const GuaranteeSum *g, char *why, size_t size) {
        uint64_t cap = r->capacity[LEVEL_NVME], free_bytes = cap > r->used[LEVEL_NVME] ? cap - r->used[LEVEL_NVME] : 0;
        char holders[512] = "";
        size_t n = 0;

        if (g->nvme_unused <= free_bytes)
                return 0;
        list_for_each_safe(node, tmp, (List *) &r->jobs) {
                const Job *o = list_entry(node, Job, link);
                uint64_t own = job_lingers(o) ? 0 : MIN(o->used[LEVEL_NVME], o->guarantee[LEVEL_NVME]);
                int k;

                if (o->used[LEVEL_NVME] <= own || n + 4 >= sizeof(holders))
                        continue;
                k = snprintf(holders + n, sizeof(holders) - n, "%sjob '%s' %s%s", n ? ", " : "", o->name,
                             FORMAT_SIZE(o->used[LEVEL_NVME] - own), job_lingers(o) ? " (lingering)" : "");
                if (k >= (int) (sizeof(holders) - n))
                        (void) snprintf(holders + sizeof(holders) - 4, 4, "...");
                else if (k > 0)
                        n += (size_t) k;
        }
        (void) snprintf(why, size, "nvme guarantees not used yet would need %s, but only %s of the nvme tier's %s is "
                        "free: %s; NVMe copies are never taken back from a job, so an nvme_min is room kept free, "
                        "and the rest holds the data of %s: free NVMe copies of those jobs or let them end first, or "
                        "lower nvme_min", FORMAT_SIZE(g->nvme_unused), FORMAT_SIZE(free_bytes), FORMAT_SIZE(cap),
                        g->nvme_who, holders[0] ? holders : "jobs that are ending");
        return -ENOSPC;
}

static void sum_add(GuaranteeSum *g, const char *name, const QuotaResolved *q) {
        for (int t = 0; t < TIERS; t++) {
                uint64_t v = q->value[QUOTA_MIN(t)];
                size_t n = strlen(g->who[t]);

                if (v == 0)
                        continue;
                g->sum[t] = add_sat(g->sum[t], v);
                if (n + 4 >= sizeof(g->who[t]))
                        continue;
                if (n > 0 && strcmp(g->who[t] + n - 3, "...") == 0)
                        continue;
                if (snprintf(g->who[t] + n, sizeof(g->who[t]) - n, "%sjob '%s' %s", n ? ", " : "", name,
                             FORMAT_SIZE(v)) >= (int) (sizeof(g->who[t]) - n))
                        (void) snprintf(g->who[t] + sizeof(g->who[t]) - 4, 4, "...");
        }
}

/* Is @name the job of an earlier job-name rule than @upto in @runtime or tierd.conf? (each name counts once) */
static bool name_seen(const Config *c, const QuotaRules *runtime, const QuotaRule *upto, const char *name) {
        const QuotaRules *lists[2] = { runtime, &c->quotas };

        for (int l = 0; l < 2; l++)
                for (size_t i = 0; lists[l] && i < lists[l]->n; i++) {
                        const QuotaRule *q = &lists[l]->rules[i];

                        if (q == upto)
                                return false;
                        if (q->kind == QUOTA_JOB && strcmp(q->job, name) == 0)
                                return true;
                }
        return false;
}

/* What check() looks at: the rules (min <= max, guarantees within the capacities), the NVMe room free now. */
enum {
        CHECK_RULES = 1 << 0,
        CHECK_ROOM = 1 << 1,
};

static int check(const QuotaStore *s, const Config *c, const QuotaRules *runtime, unsigned checks, char *why,
                 size_t size) {
        const QuotaRules *lists[2] = { runtime, &c->quotas };
        Registry *r = s->registry;
        _cleanup_free_ GuaranteeSum *g = calloc(1, sizeof(GuaranteeSum));
        QuotaResolved q;
        char what[QUOTA_JOB_NAME_MAX + 64], target[QUOTA_JOB_NAME_MAX + 16];
        int k;

        if (!g)
                return -ENOMEM;
        /* the running jobs */
        list_for_each_safe(n, tmp, &r->jobs) {
                const Job *j = list_entry(n, Job, link);

                quota_resolve_job(c, runtime, j, &q);
                (void) snprintf(what, sizeof(what), "job '%s'", j->name);
                k = checks & CHECK_RULES ? check_min_max(&q, what, why, size) : 0;
                if (k < 0)
                        return k;
                /* a lingering job yields its claim (the engine gives it no share): it counts only by its name's rule */
                if (!job_lingers(j)) {
                        sum_add(g, j->name, &q);
                        nvme_claim_add(g, j, q.value[QUOTA_MIN(LEVEL_NVME)]);
                }
        }
        /* every rule: job names that do not run now count with their guarantees; uid and group rules must make sense */
        for (int l = 0; l < 2 && (checks & CHECK_RULES); l++)
                for (size_t i = 0; lists[l] && i < lists[l]->n; i++) {
                        const QuotaRule *rule = &lists[l]->rules[i];
                        gid_t gid = (gid_t) rule->id;
                        QuotaSubject who = {};

                        if (rule->kind == QUOTA_JOB) {
                                const Job *rj = job_find(r, rule->job);
                                uint32_t owner;

                                /* a job of another uid than the name's owner holds the name: the rule is not its */
                                if (rj && quota_job_owner(c, runtime, rule->job, &owner) && owner != (uint32_t) rj->uid)
                                        rj = NULL;
                                if ((rj && !job_lingers(rj)) || name_seen(c, runtime, rule, rule->job))
                                        continue;
                                who.job = rule->job;
                        } else if (rule->kind == QUOTA_UID) {
                                who.has_uid = true;
                                who.uid = rule->id;
                        } else if (rule->kind == QUOTA_GROUP) {
                                who.gids = &gid;
                                who.n_gids = 1;
                        } else
                                continue;
                        quota_resolve(c, runtime, &who, &q);
                        quota_target_format(rule->kind, rule->id, rule->job, target, sizeof(target));
                        (void) snprintf(what, sizeof(what), rule->kind == QUOTA_JOB ? "%s" : "a job of %s", target);
                        k = check_min_max(&q, what, why, size);
                        if (k < 0)
                                return k;
                        if (rule->kind == QUOTA_JOB)
                                sum_add(g, rule->job, &q);
                }
        for (int t = 0; t < TIERS && (checks & CHECK_RULES); t++)
                if (g->sum[t] > r->capacity[t]) {
                        (void) snprintf(why, size, "%s guarantees would add up to %s of %s capacity: %s",
                                        level_to_string(t), FORMAT_SIZE(g->sum[t]), FORMAT_SIZE(r->capacity[t]),
                                        g->who[t]);
                        return -ENOSPC;
                }
        return checks & CHECK_ROOM ? nvme_claims_check(r, g, why, size) : 0;
}

int quota_check(const QuotaStore *s, const Config *c, const QuotaRules *runtime, char *why, size_t size) {
        return check(s, c, runtime, CHECK_RULES | CHECK_ROOM, why, size);
}

int quota_check_rules(const QuotaStore *s, const Config *c, const QuotaRules *runtime, char *why, size_t size) {
        return check(s, c, runtime, CHECK_RULES, why, size);
}

int quota_check_room(const QuotaStore *s, const Config *c, const QuotaRules *runtime, char *why, size_t size) {
        return check(s, c, runtime, CHECK_ROOM, why, size);
}

/* ---- applying --------------------------------------------------------------------------------- */

/* Give @j the resolved @q; log what changed (unless @quiet) and say in @warn when a max is below its use. */
static bool job_apply(Job *j, const QuotaResolved *q, bool quiet, char *warn, size_t size) {
        bool changed = false;

        for (int t = 0; t < TIERS; t++) {
                uint64_t max = q->value[QUOTA_MAX(t)], min = q->value[QUOTA_MIN(t)];
                char src[512];

                if (q->from[QUOTA_MAX(t)].kind != QUOTA_DEFAULT)
                        j->limit_set |= (uint8_t) (1u << t);
                else
                        j->limit_set &= (uint8_t) ~(1u << t);
                if (j->limit[t] != max) {
                        quota_source_format(&q->from[QUOTA_MAX(t)], src, sizeof(src));
                        if (!quiet && j->used[t] > max) {
                                log_job_tier(LOG_NOTICE, 0, j->name, level_to_string(t),
                                             "Job '%s': %s limit %s -> %s (%s); it uses %s, so its own unpinned "
                                             "copies make way as it needs room", j->name, level_to_string(t),
                                             FORMAT_SIZE_EXACT(j->limit[t]), FORMAT_SIZE_EXACT(max), src,
                                             FORMAT_SIZE_EXACT(j->used[t]));
                                if (warn) {
                                        size_t n = strlen(warn);

                                        (void) snprintf(warn + n, size - n, "%sjob '%s' uses %s of %s, above its "
                                                        "new max of %s: its unpinned copies are evicted as it needs "
                                                        "room (pinned ones stay until unpinned)", n ? "; " : "",
                                                        j->name, FORMAT_SIZE(j->used[t]), level_to_string(t),
                                                        FORMAT_SIZE(max));
                                }
                        } else if (!quiet)
                                log_job_tier(LOG_INFO, 0, j->name, level_to_string(t),
                                             "Job '%s': %s limit %s -> %s (%s)", j->name, level_to_string(t),
                                             FORMAT_SIZE_EXACT(j->limit[t]), FORMAT_SIZE_EXACT(max), src);
                        j->limit[t] = max;
                        changed = true;
                }
                if (j->guarantee[t] != min) {
                        if (!quiet)
                                log_job_tier(LOG_INFO, 0, j->name, level_to_string(t),
                                             "Job '%s': %s guarantee %s -> %s (%s)", j->name, level_to_string(t),
                                             FORMAT_SIZE_EXACT(j->guarantee[t]), FORMAT_SIZE_EXACT(min),
                                             quota_source_format(&q->from[QUOTA_MIN(t)], src, sizeof(src)));
                        j->guarantee[t] = min;
                        changed = true;
                }
        }
        if (j->weight != q->value[QUOTA_WEIGHT]) {
                char src[512];

                if (!quiet)
                        log_job(LOG_INFO, 0, j->name, "Job '%s': weight %u -> %" PRIu64 " (%s)", j->name, j->weight,
                                q->value[QUOTA_WEIGHT],
                                quota_source_format(&q->from[QUOTA_WEIGHT], src, sizeof(src)));
                j->weight = (unsigned) q->value[QUOTA_WEIGHT];
                changed = true;
        }
        return changed;
}

/* ---- totals of uids and groups --------------------------------------------------------------------- */

uint64_t quota_uid_share(const Config *c, const Registry *r, int tier) {
        unsigned pct = tier == LEVEL_HOST ? c->host_uid_share : tier == LEVEL_VRAM ? c->vram_uid_share : c->nvme_uid_share;

        return pct == 0 ? 0 : MAX((uint64_t) 1, r->capacity[tier] / 100 * pct + r->capacity[tier] % 100 * pct / 100);
}

void quota_totals_resolve(const Config *c, const Registry *r, const QuotaRules *runtime, QuotaKind kind, uint32_t id,
                          bool admin, JobTotal *ret, QuotaSource *ret_from) {
        *ret = (JobTotal) { .kind = kind, .id = id };
        for (int t = 0; t < TIERS; t++) {
                QuotaResolved one;

                if (take(c, runtime, kind, id, NULL, QUOTA_TOTAL(t), &one)) {
                        ret->total[t] = one.value[QUOTA_TOTAL(t)];
                        if (ret_from)
                                ret_from[t] = one.from[QUOTA_TOTAL(t)];
                        continue;
                }
                if (ret_from)
                        ret_from[t] = (QuotaSource) { .kind = QUOTA_DEFAULT };
                if (kind == QUOTA_UID && !admin) {
                        ret->total[t] = quota_uid_share(c, r, t);
                        ret->from_share |= (uint8_t) (1u << t);
                }
        }
}

/* Resolve @j's totals (its uid's; each of its groups' that has one); true if they changed. */
static bool job_totals(QuotaStore *s, Job *j) {
        JobTotal *tot = calloc(1 + j->n_gids, sizeof(JobTotal));
        unsigned n = 0;
        bool changed;

        if (!tot)
                return false;   /* the old ones stay: out of memory is no reason to lift a total */
        quota_totals_resolve(s->config, s->registry, &s->runtime, QUOTA_UID, (uint32_t) j->uid, j->admin, &tot[0],
                             NULL);
        if (tot[0].total[LEVEL_VRAM] | tot[0].total[LEVEL_HOST] | tot[0].total[LEVEL_NVME])
                n++;
        for (uint32_t g = 0; g < j->n_gids; g++) {
                quota_totals_resolve(s->config, s->registry, &s->runtime, QUOTA_GROUP, (uint32_t) j->gids[g], true,
                                     &tot[n], NULL);
                if (tot[n].total[LEVEL_VRAM] | tot[n].total[LEVEL_HOST] | tot[n].total[LEVEL_NVME])
                        n++;
        }
        changed = n != j->n_totals;
        for (unsigned i = 0; i < n && !changed; i++)
                changed = tot[i].kind != j->totals[i].kind || tot[i].id != j->totals[i].id ||
                          tot[i].from_share != j->totals[i].from_share ||
                          memcmp(tot[i].total, j->totals[i].total, sizeof(tot[i].total)) != 0;
        free(j->totals);
        j->totals = n > 0 ? tot : mfree(tot);
        j->n_totals = n;
        return changed;
}

/* Say when @j's name's rules stop or start governing it: their owner is another uid now, or its own again. */
static void owner_changed(Job *j, const QuotaResolved *q) {
        if (q->not_owner == j->not_owner)
                return;
        j->not_owner = q->not_owner;
        if (q->not_owner)
                log_job(LOG_NOTICE, 0, j->name, "Job '%s' of uid %u: the quota of its name has owner uid %" PRIu32
                        " now, so it no longer applies to this job (which keeps running under its uid's and "
                        "groups' quotas); uid %" PRIu32 " can create a job of that name once this one ends "
                        "(tierctl detach)", j->name, (unsigned) j->uid, q->owner, q->owner);
        else
                log_job(LOG_NOTICE, 0, j->name, "Job '%s' of uid %u: the quota of its name applies to it again "
                        "(its owner is this uid, or it has none now)", j->name, (unsigned) j->uid);
}

bool quota_apply_all(QuotaStore *s, char *warn, size_t size) {
        bool changed = false;

        if (warn && size)
                warn[0] = '\0';
        list_for_each_safe(n, tmp, &s->registry->jobs) {
                Job *j = list_entry(n, Job, link);
                QuotaResolved q;

                quota_resolve_job(s->config, &s->runtime, j, &q);
                owner_changed(j, &q);
                changed |= job_apply(j, &q, false, warn, size);
                changed |= job_totals(s, j);
        }
        return changed;
}

static int gid_compare(const void *a, const void *b) {
        gid_t x = *(const gid_t *) a, y = *(const gid_t *) b;

        return x < y ? -1 : x > y;
}

int quota_job_attach_check(QuotaStore *s, Job *j, char *why, size_t size) {
        uint64_t until = j->linger_until;
        bool any_min = false;
        int r;

        for (int t = 0; t < TIERS; t++)
                any_min |= j->guarantee[t] > 0;
        if (!job_lingers(j) || !any_min)
                return 0;
        /* counted as it will be once attached: live, its guarantees claimed again */
        j->linger_until = 0;
        r = quota_check(s, s->config, &s->runtime, why, size);
        j->linger_until = until;
        return r < 0 && r != -ENOMEM ? -ENOSPC : r;
}

int quota_job_created(QuotaStore *s, Job *j, gid_t gid, const gid_t *groups, size_t n, bool check, char *why,
                      size_t size) {
        char line[2048], src[2][512];
        size_t len = 0;
        QuotaResolved q;
        bool any_min = false;
        gid_t *g;
        int r;

        g = calloc(MIN(n, (size_t) QUOTA_GROUPS_MAX) + 1, sizeof(gid_t));
        if (!g)
                return -ENOMEM;
        g[0] = gid;
        j->n_gids = 1;
        for (size_t i = 0; i < n && j->n_gids < QUOTA_GROUPS_MAX + 1; i++)
                if (groups[i] != gid)
                        g[j->n_gids++] = groups[i];
        qsort(g + 1, j->n_gids - 1, sizeof(gid_t), gid_compare);
        free(j->gids);
        j->gids = g;

        quota_resolve_job(s->config, &s->runtime, j, &q);
        for (int t = 0; t < TIERS; t++)
                any_min |= q.value[QUOTA_MIN(t)] > 0;
        /* the job is in the registry already: the check counts it */
        if (any_min && check) {
                r = quota_check(s, s->config, &s->runtime, why, size);
                if (r < 0) {
                        if (r != -ENOMEM)
                                r = -ENOSPC;
                        return r;
                }
        }
        (void) job_apply(j, &q, true, NULL, 0);
        (void) job_totals(s, j);
        j->not_owner = q.not_owner;
        if (q.not_owner)
                log_job(LOG_WARNING, 0, j->name, "Job '%s' of uid %u: the quota of its name does not apply to it: "
                        "the name's owner is uid %" PRIu32 " ([quota] owner); the job keeps its tensors under its "
                        "uid's and groups' quotas, and uid %" PRIu32 " can create a job of that name once it ends "
                        "(tierctl detach)", j->name, (unsigned) j->uid, q.owner, q.owner);

        for (int t = 0; t < TIERS; t++)
                len += (size_t) snprintf(line + MIN(len, sizeof(line) - 1), sizeof(line) - MIN(len, sizeof(line) - 1),
                                         "%s max %s (from: %s) min %s (from: %s); ", level_to_string(t),
                                         FORMAT_SIZE(q.value[QUOTA_MAX(t)]),
                                         quota_source_format(&q.from[QUOTA_MAX(t)], src[0], sizeof(src[0])),
                                         FORMAT_SIZE(q.value[QUOTA_MIN(t)]),
                                         quota_source_format(&q.from[QUOTA_MIN(t)], src[1], sizeof(src[1])));
        (void) snprintf(line + MIN(len, sizeof(line) - 1), sizeof(line) - MIN(len, sizeof(line) - 1),
                        "weight %" PRIu64 " (from: %s)", q.value[QUOTA_WEIGHT],
                        quota_source_format(&q.from[QUOTA_WEIGHT], src[0], sizeof(src[0])));
        log_job(LOG_INFO, 0, j->name, "Job '%s' quota: %s", j->name, line);
        return 0;
}

/* ---- setting --------------------------------------------------------------------------------- */

int quota_store_set(QuotaStore *s, const QuotaRule *change, bool clear, char *why, size_t why_size, char *warn,
                    size_t warn_size) {
        Registry *r = s->registry;
        _cleanup_(quota_rules_clear) QuotaRules next = QUOTA_RULES_NULL;
        char target[QUOTA_JOB_NAME_MAX + 16];
        QuotaRule *q;
        QuotaResolved res;
        int k;

        if (warn_size)
                warn[0] = '\0';
        quota_target_format(change->kind, change->id, change->job, target, sizeof(target));
        if (change->kind == QUOTA_DEFAULT || change->kind < 0 || change->kind >= _QUOTA_KIND_MAX) {
                (void) snprintf(why, why_size, "the default quota is tierd.conf's [host], [vram] and [nvme] job_limit "
                                "and [sched] default_weight: change it there and reload tierd");
                return -EINVAL;
        }
        if (change->kind == QUOTA_JOB) {
                _cleanup_free_ char *reason = NULL;
                QuotaRule probe = { .kind = QUOTA_DEFAULT };

                k = quota_rule_set_key(&probe, "job", change->job ? change->job : "", &reason);
                quota_rule_done(&probe);
                if (k < 0) {
                        (void) snprintf(why, why_size, "%s", reason ? reason : "invalid job name");
                        return k;
                }
        }
        if (!clear && change->set == 0 && !change->has_owner) {
                (void) snprintf(why, why_size, "nothing to set for %s", target);
                return -EINVAL;
        }
        if ((change->set & (1u << QUOTA_WEIGHT)) &&
            (change->value[QUOTA_WEIGHT] < 1 || change->value[QUOTA_WEIGHT] > QUOTA_WEIGHT_MAX)) {
                (void) snprintf(why, why_size, "weight %" PRIu64 " out of range (1..%u)", change->value[QUOTA_WEIGHT],
                                QUOTA_WEIGHT_MAX);
                return -EINVAL;
        }
        for (int t = 0; t < TIERS; t++) {
                for (int f = QUOTA_MAX(t); f <= QUOTA_MIN(t); f += TIERS) {
                        if (!(change->set & (1u << f)))
                                continue;
                        if (f == QUOTA_MAX(t) && change->value[f] == 0) {
                                (void) snprintf(why, why_size, "a %s max must be positive", level_to_string(t));
                                return -EINVAL;
                        }
                        if (change->value[f] > r->capacity[t]) {
                                (void) snprintf(why, why_size, "%s %s %s is above the %s tier's capacity of %s",
                                                level_to_string(t), f == QUOTA_MAX(t) ? "max" : "min",
                                                FORMAT_SIZE(change->value[f]), level_to_string(t),
                                                FORMAT_SIZE(r->capacity[t]));
                                return -EINVAL;
                        }
                }
                /* a total above the capacity never binds (0 is none): a slip, refused as a max is */
                if ((change->set & (1u << QUOTA_TOTAL(t))) && change->value[QUOTA_TOTAL(t)] > r->capacity[t]) {
                        (void) snprintf(why, why_size, "%s total %s is above the %s tier's capacity of %s: a total "
                                        "that large never binds; 0 is none (for a uid, lifting its uid_share too)",
                                        level_to_string(t), FORMAT_SIZE(change->value[QUOTA_TOTAL(t)]),
                                        level_to_string(t), FORMAT_SIZE(r->capacity[t]));
                        return -EINVAL;
                }
        }

        k = quota_rules_copy(&next, &s->runtime);
        if (k < 0)
                return k;
        q = quota_rules_find(&next, change->kind, change->id, change->job);
        if (clear && q) {
                quota_rules_remove(&next, (size_t) (q - next.rules));
                q = NULL;
        }
        if ((change->set || change->has_owner) && !q) {
                QuotaRule n = {};

                k = quota_rule_copy(&n, change);
                if (k < 0)
                        return k;
                n.set = 0;
                n.has_owner = false;
                k = quota_rules_add(&next, &n);
                if (k == -E2BIG) {
                        (void) snprintf(why, why_size, "tierd holds %u quotas set at run time already", QUOTA_RULES_MAX);
                        return -ENOSPC;
                }
                if (k < 0)
                        return k;
                q = &next.rules[next.n - 1];
        }
        for (int f = 0; q && f < QUOTA_FIELDS; f++)
                if (change->set & (1u << f)) {
                        q->value[f] = change->value[f];
                        q->set |= 1u << f;
                }
        if (q && change->has_owner) {
                if (change->kind != QUOTA_JOB) {
                        (void) snprintf(why, why_size, "an owner is of a job name, not of %s", target);
                        return -EINVAL;
                }
                q->has_owner = true;
                q->owner = change->owner;
        }

        /* the target itself (as a job of that uid or group would see it), then everyone */
        if (change->kind != QUOTA_JOB || !job_find(r, change->job)) {
                gid_t gid = (gid_t) change->id;
                QuotaSubject who = {
                        .job = change->kind == QUOTA_JOB ? change->job : NULL,
                        .has_uid = change->kind == QUOTA_UID,
                        .uid = change->id,
                        .gids = change->kind == QUOTA_GROUP ? &gid : NULL,
                        .n_gids = change->kind == QUOTA_GROUP,
                };
                char what[QUOTA_JOB_NAME_MAX + 64];

                quota_resolve(s->config, &next, &who, &res);
                (void) snprintf(what, sizeof(what), change->kind == QUOTA_JOB ? "%s" : "a job of %s", target);
                k = check_min_max(&res, what, why, why_size);
                if (k < 0)
                        return k;
        }
        k = quota_check(s, s->config, &next, why, why_size);
        if (k < 0)
                return k;

        if (s->read_only) {
                (void) snprintf(why, why_size, "the quota state file \"%s\" could not be read when tierd started; "
                                "tierd does not overwrite it (see its log, fix the file and restart tierd)", s->path);
                return -EIO;
        }
        k = quota_store_save(s, &next, why, why_size);
        if (k < 0)
                return k;
        quota_rules_clear(&s->runtime);
        s->runtime = next;
        next = QUOTA_RULES_NULL;
        log_info("Quota of %s %s by tierctl quota set", target, clear && !change->set && !change->has_owner ?
                 "cleared" : "set");
        return quota_apply_all(s, warn, warn_size) ? 1 : 0;
}

/* ---- the state file ----------------------------------------------------------------------------- */

int quota_store_save(const QuotaStore *s, const QuotaRules *rules, char *why, size_t size) {
        static const char header[] =
                "# Quotas set with tierctl quota set, kept by tierd across restarts.\n"
                "# tierd rewrites this file: change quotas with tierctl (or in tierd.conf's [quota] sections).\n\n";
        _cleanup_free_ char *text = quota_rules_format(rules), *all = NULL;
        int r;

        if (!text || asprintf(&all, "%s%s", header, text) < 0)
                return -ENOMEM;
        r = statefile_write(s->path, all, strlen(all), 0640);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                (void) snprintf(why, size, "cannot save the quotas to \"%s\": %s", s->path, strerror(-r));
                return -EIO;
        }
        if (r > 0)
                log_warning("Saved the quotas to \"%s\", but its directory could not be synced: a power loss "
                            "may bring back the file before", s->path);
        return 0;
}

int quota_store_load(QuotaStore *s) {
        _cleanup_free_ char *text = NULL, *err = NULL;
        char aside[PATH_MAX];
        const char *what;
        size_t len = 0;
        int r;

        r = statefile_read(s->path, QUOTA_STATE_FILE_MAX, &text, &len);
        if (r == -ENOENT)
                return 0;
        if (r == -ENOMEM)
                return r;
        if (r >= 0 && strlen(text) != len)
                r = -EBADMSG;
        /* tierd writes its header and every line whole: a file that does not end in one was cut short */
        if (r >= 0 && (len == 0 || text[len - 1] != '\n'))
                r = -EPIPE;
        if (r >= 0) {
                r = quota_rules_parse_text(&s->runtime, text, s->path, &err);
                if (r >= 0) {
                        log_info("Loaded %zu quota(s) set at run time from \"%s\"", s->runtime.n, s->path);
                        return 0;
                }
                if (r == -ENOMEM)
                        return r;
        } else if (r != -EFBIG && r != -EBADMSG && r != -EINVAL && r != -EPIPE) {
                /* cannot read it (permissions, I/O): leave it alone */
                log_error_errno(r, "Cannot read the quota state file \"%s\": %m; starting with tierd.conf's quotas "
                                "only, and tierctl quota set will not overwrite the file until it can be read",
                                s->path);
                s->read_only = true;
                return 0;
        }

        what = err ? err : r == -EFBIG ? "larger than 4 MiB" :
               r == -EINVAL ? "not a regular file (a FIFO, socket, device, directory or link)" :
               r == -EPIPE ? (len == 0 ? "it is empty (cut short?)" : "it does not end with a newline (cut short?)") :
               "it contains a NUL byte";
        r = statefile_set_aside(s->path, aside, sizeof(aside));
        if (r < 0) {
                log_error_errno(r, "The quota state file \"%s\" is corrupt (%s) and cannot be moved aside: %m; "
                                "starting with tierd.conf's quotas only, and tierctl quota set will not overwrite it",
                                s->path, what);
                s->read_only = true;
                return 0;
        }
        log_error("The quota state file \"%s\" is corrupt (%s); moved it aside to \"%s\" and starting with "
                  "tierd.conf's quotas only: set the others again with tierctl quota set", s->path, what, aside);
        return 0;
}

/* ---- names an older tierd took ----------------------------------------------------------------- */

/* Rule @i of the run-time rules now governs job name @now (taken over); or, when @now has one, is dropped. */
static void rename_rule(QuotaStore *s, size_t i, char *now) {
        QuotaRule *q = &s->runtime.rules[i];

        if (quota_rules_find(&s->runtime, QUOTA_JOB, 0, now)) {
                char values[256] = "";
                size_t len = 0;

                /* what is dropped, so that an operator can set it again: "host=4194304 weight=2" */
                for (int f = 0; f < QUOTA_FIELDS && len < sizeof(values); f++)
                        if (q->set & (1u << f)) {
                                int n = snprintf(values + len, sizeof(values) - len, "%s%s=%" PRIu64,
                                                 len ? " " : "", quota_field_name(f), q->value[f]);
                                if (n < 0)
                                        break;
                                len += (size_t) n;
                        }
                log_warning("A quota set at run time (\"%s\") for a job name from an older tierd, with control "
                            "or bidi characters or bytes not UTF-8 (which tierd refuses now), is dropped (it set "
                            "%s): job '%s', the name it would govern now, has a quota of its own (tierctl quota "
                            "get '%s' shows it)",
                            s->path, len ? values : "nothing", now, now);
                free(now);
                quota_rules_remove(&s->runtime, i);
        } else {
                log_warning("A quota set at run time (\"%s\") for a job name from an older tierd, with control "
                            "or bidi characters or bytes not UTF-8 (which tierd refuses now), governs job '%s' from now "
                            "on: that name's escaped text, which its job is restored under", s->path, now);
                free(q->job);
                q->job = now;
        }
        s->renamed = true;
}

int quota_store_rename_job(QuotaStore *s, const char *was, const char *now) {
        QuotaRule *q = quota_rules_find(&s->runtime, QUOTA_JOB, 0, was);
        char *copy;

        if (!q)
                return 0;
        copy = strdup(now);
        if (!copy)
                return -ENOMEM;
        rename_rule(s, (size_t) (q - s->runtime.rules), copy);
        return 0;
}

int quota_store_rename_old(QuotaStore *s) {
        char why[1024];
        int r;

        for (size_t i = 0; i < s->runtime.n;) {
                const QuotaRule *q = &s->runtime.rules[i];
                char *e = NULL;

                if (q->kind != QUOTA_JOB || !text_needs_escape(q->job)) {
                        i++;
                        continue;
                }
                /*
                 * Its escaped text, else with a hash when a rule has that.  A job restored under the
                 * escaped text is the one this name became: an earlier start restored it so and did not
                 * save the rule's new name (killed before, a failed save, a tierd before the names
                 * followed), so it takes the rule (with a hash, none would govern it).
                 */
                for (int tagged = 0; tagged < 2; tagged++) {
                        free(e);
                        e = text_escape_name(q->job, s->config->max_name, tagged);
                        if (!e)
                                return -ENOMEM;
                        if (!quota_rules_find(&s->runtime, QUOTA_JOB, 0, e))
                                break;
                }
                /* (renamed: rule i needs no escape now; dropped: rule i is the next one) */
                rename_rule(s, i, e);
        }
        if (!s->renamed)
                return 0;
        s->renamed = false;
        /* a job restored under a new name resolved its quota before: the rule it now has */
        (void) quota_apply_all(s, NULL, 0);
        r = quota_store_save(s, &s->runtime, why, sizeof(why));
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                log_warning("%s: the quotas hold under their new names until tierd stops, and the file keeps the "
                            "old ones", why);
        return 0;
}
