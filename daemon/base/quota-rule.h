/* SPDX-License-Identifier: MIT */
/* quota-rule.h: quota rules (whom one governs, which fields it sets), as [quota] sections spell them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/base/level.h"

/* Whom a rule governs; numbered as QuotaTarget.kind in tier.proto. */
typedef enum QuotaKind {
        QUOTA_JOB,              /* jobs of one name, whether one runs now or not */
        QUOTA_UID,              /* jobs created by one uid */
        QUOTA_GROUP,            /* jobs created by a member of one group */
        QUOTA_DEFAULT,          /* everyone: [host]/[vram]/[nvme] job_limit, [sched] default_weight, no minimum */
        _QUOTA_KIND_MAX,
        _QUOTA_KIND_INVALID = -22,
} QuotaKind;

/*
 * The fields of a quota: a maximum and a guaranteed minimum per tier (for
 * each job governed), the bandwidth weight, and for a uid or a group the
 * total per tier all its jobs together may use (0: no total).
 */
#define QUOTA_MAX(tier) (tier)
#define QUOTA_MIN(tier) (TIERS + (tier))
#define QUOTA_WEIGHT (2 * TIERS)
#define QUOTA_TOTAL(tier) (2 * TIERS + 1 + (tier))
#define QUOTA_FIELDS (3 * TIERS + 1)
#define QUOTA_IS_TOTAL(field) ((field) >= QUOTA_TOTAL(0) && (field) < QUOTA_TOTAL(TIERS))
#define QUOTA_WEIGHT_MAX 1000u

/* Most rules one list holds (tierd.conf's, or those set at run time): each costs tierd memory. */
#define QUOTA_RULES_MAX 4096u
/* Longest job name a rule may hold (tierd's max_name is at most 4096). */
#define QUOTA_JOB_NAME_MAX 4096u

typedef struct QuotaRule {
        QuotaKind kind;
        uint32_t id;                    /* QUOTA_UID, QUOTA_GROUP: the uid or gid */
        char *job;                      /* QUOTA_JOB: the name (owned) */
        uint64_t value[QUOTA_FIELDS];   /* bytes; the weight at QUOTA_WEIGHT */
        uint32_t set;                   /* bits 1 << field: what the rule sets; the rest falls through */
        bool has_owner;                 /* QUOTA_JOB: "owner =": only uid @owner may create a job of this name */
        uint32_t owner;
} QuotaRule;

typedef struct QuotaRules {
        QuotaRule *rules;
        size_t n;
} QuotaRules;

#define QUOTA_RULES_NULL ((QuotaRules) {})

/* "host", "host_min", ..., "weight": the field's key in a [quota] section. */
const char *quota_field_name(int field);
/* "job", "uid", "group", "default". */
const char *quota_kind_to_string(QuotaKind k);

void quota_rule_done(QuotaRule *q);
/* A deep copy of @from into @to (-ENOMEM: @to is left empty). */
int quota_rule_copy(QuotaRule *to, const QuotaRule *from);
/* Does @q govern the same target as (@kind, @id, @job)? */
bool quota_rule_matches(const QuotaRule *q, QuotaKind kind, uint32_t id, const char *job);
/* "job 'NAME'", "uid 1000", "group 27", "default", into @buf. */
char *quota_target_format(QuotaKind kind, uint32_t id, const char *job, char *buf, size_t size);

/*
 * quota_rule_set_key() - apply "@key = @value" of a [quota] section to @q:
 * a target (job, uid, user, group: a name or a number; user and group
 * names are looked up, which may block on NSS: tierd parses its
 * configuration only at start and reload), for a job name its owner
 * (owner: a user name or a uid, looked up alike) or a field (host, host_min,
 * vram, vram_min, nvme, nvme_min, and for a uid or a group host_total,
 * vram_total, nvme_total: sizes, a total 0 for none; weight: 1..1000).  -EINVAL with a
 * malloc'ed reason in *@ret_reason (the key is not repeated in it).
 */
int quota_rule_set_key(QuotaRule *q, const char *key, const char *value, char **ret_reason);
/* A section is complete: it names its target, totals only for a uid or a group, an owner only for a job name; -EINVAL with a reason otherwise. */
int quota_rule_check(const QuotaRule *q, char **ret_reason);

void quota_rules_clear(QuotaRules *rs);
/* Deep copy (-ENOMEM: @to is left empty). */
int quota_rules_copy(QuotaRules *to, const QuotaRules *from);
/* The rule of this target, or NULL. */
QuotaRule *quota_rules_find(const QuotaRules *rs, QuotaKind kind, uint32_t id, const char *job);
/* Append @q (taken over, also on failure); -E2BIG past QUOTA_RULES_MAX. */
int quota_rules_add(QuotaRules *rs, QuotaRule *q);
/* Remove the rule at @i (freed). */
void quota_rules_remove(QuotaRules *rs, size_t i);

/*
 * quota_rules_parse_text() - parse a file of [quota] sections (comments,
 * blank lines, nothing else) into @rs (appended).  -EINVAL with "FILE:LINE:
 * reason" in *@ret_error; @rs is left as it was then.  Two sections of the
 * same target are refused (the state file holds one each).
 */
int quota_rules_parse_text(QuotaRules *rs, const char *text, const char *filename, char **ret_error);
/* @rs as [quota] sections (what quota_rules_parse_text() reads back), malloc'ed; NULL: -ENOMEM. */
char *quota_rules_format(const QuotaRules *rs);
