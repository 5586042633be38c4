/* SPDX-License-Identifier: MIT */
/* quota-owner.c: a job name's owner ([quota] owner =), and the warning of a job-name rule without one. */

/*
 * Theory of operation: a job name is the first Hello's, and so is the
 * quota of its [quota] job = rule.  A rule may name the name's owner: only
 * that uid then creates a job of that name (ipc/owner.c refuses the
 * others' Hello), and the name's rules govern no job of another uid that
 * holds it (one the NVMe index restored, or one that ran when a reload
 * named the owner: quota.c's quota_resolve()); such a job counts by its
 * own quota while the name's guarantee stays kept for the owner (quota.c's
 * check()).  Names match byte for byte, as jobs' do: no case folding, no
 * Unicode normalization ("é" precomposed and "e" with a combining accent
 * are two names, the rule governing only the one it spells).
 *
 * A rule without an owner is what any user takes by naming a job so
 * first: quota_warn_unowned() says which ones give something worth
 * taking, at start, at reload and with --check-config.
 */

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/state/quota.h"
#include "util/size.h"

bool quota_job_owner(const Config *c, const QuotaRules *runtime, const char *job, uint32_t *ret) {
        const QuotaRule *q = runtime ? quota_rules_find(runtime, QUOTA_JOB, 0, job) : NULL;

        if (q && q->has_owner) {
                *ret = q->owner;
                return true;
        }
        for (size_t i = c->quotas.n; i-- > 0;) {
                q = &c->quotas.rules[i];
                if (q->has_owner && quota_rule_matches(q, QUOTA_JOB, 0, job)) {
                        *ret = q->owner;
                        return true;
                }
        }
        return false;
}

/* tierd.conf's value of @field for a target: its last rule that sets it; NULL if none. */
static const QuotaRule *config_value(const Config *c, QuotaKind kind, uint32_t id, const char *job, int field) {
        for (size_t i = c->quotas.n; i-- > 0;) {
                const QuotaRule *q = &c->quotas.rules[i];

                if ((q->set & (1u << field)) && quota_rule_matches(q, kind, id, job))
                        return q;
        }
        return NULL;
}

/* The uid or group rule of tierd.conf with the lowest value of @field (the one that holds for its target); NULL if none. */
static const QuotaRule *lowest_rule(const Config *c, int field) {
        const QuotaRule *low = NULL;

        for (size_t i = 0; i < c->quotas.n; i++) {
                const QuotaRule *q = &c->quotas.rules[i];

                if ((q->kind != QUOTA_UID && q->kind != QUOTA_GROUP) || !(q->set & (1u << field)))
                        continue;
                if (config_value(c, q->kind, q->id, NULL, field) != q)
                        continue;       /* a later section of that target sets it */
                if (!low || q->value[field] < low->value[field])
                        low = q;
        }
        return low;
}

/* @v as a value of @field: a size, or the weight's number. */
static char *value_text(int field, uint64_t v, char buf[static SIZE_FORMAT_MAX]) {
        if (field == QUOTA_WEIGHT)
                (void) snprintf(buf, SIZE_FORMAT_MAX, "%" PRIu64, v);
        else
                (void) size_format_exact(buf, SIZE_FORMAT_MAX, v);
        return buf;
}

/* Is @q the first of tierd.conf's rules of its job name? (each name is warned of once) */
static bool first_of_name(const Config *c, const QuotaRule *q) {
        for (const QuotaRule *o = c->quotas.rules; o < q; o++)
                if (quota_rule_matches(o, QUOTA_JOB, 0, q->job))
                        return false;
        return true;
}

void quota_warn_unowned(const Config *c) {
        const QuotaRule *low[QUOTA_FIELDS] = {};
        bool lows = false;

        for (size_t i = 0; i < c->quotas.n; i++) {
                const QuotaRule *q = &c->quotas.rules[i];
                char what[1024] = "";
                size_t n = 0;
                uint32_t owner;

                if (q->kind != QUOTA_JOB || !first_of_name(c, q) || quota_job_owner(c, NULL, q->job, &owner))
                        continue;
                if (!lows) {
                        for (int f = 0; f < QUOTA_FIELDS; f++)
                                low[f] = lowest_rule(c, f);
                        lows = true;
                }
                /* what a user gains by naming a job so: a guarantee, or more than the default or its own rules give */
                for (int f = 0; f < QUOTA_TOTAL(0) && n < sizeof(what); f++) {
                        const QuotaRule *v = config_value(c, QUOTA_JOB, 0, q->job, f);
                        char why[128], a[SIZE_FORMAT_MAX], b[SIZE_FORMAT_MAX];
                        int k;

                        if (!v)
                                continue;
                        if (f >= QUOTA_MIN(0) && f < QUOTA_MIN(TIERS)) {
                                if (v->value[f] == 0)
                                        continue;
                                (void) snprintf(why, sizeof(why), "a guarantee");
                        } else if (v->value[f] > quota_default_value(c, f))
                                (void) snprintf(why, sizeof(why), "above the default %s",
                                                value_text(f, quota_default_value(c, f), b));
                        else if (low[f] && v->value[f] > low[f]->value[f])
                                (void) snprintf(why, sizeof(why), "above %s %" PRIu32 "'s %s",
                                                quota_kind_to_string(low[f]->kind), low[f]->id,
                                                value_text(f, low[f]->value[f], b));
                        else
                                continue;
                        k = snprintf(what + n, sizeof(what) - n, "%s%s %s (%s)", n ? ", " : "", quota_field_name(f),
                                     value_text(f, v->value[f], a), why);
                        if (k < 0)
                                break;
                        n += (size_t) k;
                }
                if (n > 0)
                        log_warning("[quota] job = %s has no owner: any user who names a job so first gets its %s, "
                                    "escaping its own uid's and groups' quotas, and holds the name against the user "
                                    "it is meant for; add 'owner = USER' to a section of that name", q->job, what);
        }
}
