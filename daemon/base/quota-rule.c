/* SPDX-License-Identifier: MIT */
/* quota-rule.c: quota rules (whom one governs, which fields it sets), as [quota] sections spell them. */

/*
 * Theory of operation: a quota rule names its target (a job name, a uid, a
 * group) and sets some of the fields of a quota: per tier a maximum ("host
 * = 8G") and a guaranteed minimum ("host_min = 2G"), and the bandwidth
 * weight.  A field the rule does not set falls through to the next rule in
 * the order of precedence, job > uid > group > default (daemon/state/
 * quota.c resolves it).  Rules come from tierd.conf's [quota] sections
 * (config.c feeds their lines to quota_rule_set_key()) and from tierctl
 * quota set, which tierd keeps in a state file of the same [quota]
 * sections: quota_rules_format() writes it and quota_rules_parse_text()
 * reads it back.  A job-name rule may name the name's owner ("owner =
 * alice"): only that uid may then create a job of that name (ipc/owner.c
 * refuses the others' Hello), and the rule governs no job of another uid
 * (one the NVMe index restored, or one that ran when the owner changed):
 * without an owner, whoever creates the name first gets its quota.
 * Nothing here logs.
 */

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/quota-rule.h"
#include "proto/macro.h"
#include "util/size.h"

static const char *const field_names[QUOTA_FIELDS] = {
        [QUOTA_MAX(LEVEL_VRAM)] = "vram",
        [QUOTA_MAX(LEVEL_HOST)] = "host",
        [QUOTA_MAX(LEVEL_NVME)] = "nvme",
        [QUOTA_MIN(LEVEL_VRAM)] = "vram_min",
        [QUOTA_MIN(LEVEL_HOST)] = "host_min",
        [QUOTA_MIN(LEVEL_NVME)] = "nvme_min",
        [QUOTA_WEIGHT] = "weight",
        [QUOTA_TOTAL(LEVEL_VRAM)] = "vram_total",
        [QUOTA_TOTAL(LEVEL_HOST)] = "host_total",
        [QUOTA_TOTAL(LEVEL_NVME)] = "nvme_total",
};

static const char *const kind_names[_QUOTA_KIND_MAX] = {
        [QUOTA_JOB] = "job",
        [QUOTA_UID] = "uid",
        [QUOTA_GROUP] = "group",
        [QUOTA_DEFAULT] = "default",
};

const char *quota_field_name(int field) {
        return field >= 0 && field < QUOTA_FIELDS ? field_names[field] : "?";
}

const char *quota_kind_to_string(QuotaKind k) {
        return k >= 0 && k < _QUOTA_KIND_MAX ? kind_names[k] : "?";
}

_printf_(2, 3)
static int reason(char **ret, const char *fmt, ...) {
        va_list ap;
        int r;

        if (!ret)
                return -EINVAL;
        va_start(ap, fmt);
        r = vasprintf(ret, fmt, ap);
        va_end(ap);
        if (r < 0) {
                *ret = NULL;
                return -ENOMEM;
        }
        return -EINVAL;
}

/*
 * The uid of user @name (@user) or the gid of group @name: 0, -ENOENT when
 * the database has no such name, another -errno when the lookup failed.
 */
static int lookup_id(bool user, const char *name, uint32_t *ret) {
        size_t size = 16384;

        for (;;) {
                _cleanup_free_ char *buf = malloc(size);
                struct passwd pw, *pwp = NULL;
                struct group gr, *grp = NULL;
                int r;

                if (!buf)
                        return -ENOMEM;
                r = user ? getpwnam_r(name, &pw, buf, size, &pwp) : getgrnam_r(name, &gr, buf, size, &grp);
                if (r == ERANGE && size < (1u << 20)) {
                        size *= 2;
                        continue;
                }
                /* "not found" may come as 0 and no entry, or as one of these (getpwnam_r(3)) */
                if (r == 0 || r == ENOENT || r == ESRCH || r == EBADF || r == EPERM) {
                        if (user ? !pwp : !grp)
                                return -ENOENT;
                        *ret = user ? (uint32_t) pw.pw_uid : (uint32_t) gr.gr_gid;
                        return 0;
                }
                return -r;
        }
}

void quota_rule_done(QuotaRule *q) {
        q->job = mfree(q->job);
}

int quota_rule_copy(QuotaRule *to, const QuotaRule *from) {
        *to = *from;
        to->job = NULL;
        if (from->job) {
                to->job = strdup(from->job);
                if (!to->job)
                        return -ENOMEM;
        }
        return 0;
}

bool quota_rule_matches(const QuotaRule *q, QuotaKind kind, uint32_t id, const char *job) {
        if (q->kind != kind)
                return false;
        switch (kind) {
        case QUOTA_JOB:
                return q->job && job && strcmp(q->job, job) == 0;
        case QUOTA_UID:
        case QUOTA_GROUP:
                return q->id == id;
        default:
                return true;
        }
}

char *quota_target_format(QuotaKind kind, uint32_t id, const char *job, char *buf, size_t size) {
        switch (kind) {
        case QUOTA_JOB:
                (void) snprintf(buf, size, "job '%s'", job ? job : "");
                break;
        case QUOTA_UID:
        case QUOTA_GROUP:
                (void) snprintf(buf, size, "%s %" PRIu32, kind_names[kind], id);
                break;
        default:
                (void) snprintf(buf, size, "default");
                break;
        }
        return buf;
}

/* A job name a rule can hold and the state file can spell: no control characters, no blanks at the ends. */
static bool job_name_ok(const char *s) {
        size_t n = strlen(s);

        if (n == 0 || n > QUOTA_JOB_NAME_MAX || s[0] == ' ' || s[0] == '\t' || s[n - 1] == ' ' || s[n - 1] == '\t')
                return false;
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (*p < 0x20 || *p == 0x7f)
                        return false;
        return true;
}

/* A uid or gid written as a number: 0..2^32-2 (-1 is "no id"). */
static bool parse_id(const char *s, uint32_t *ret) {
        char *end;
        unsigned long long v;

        if (*s < '0' || *s > '9')
                return false;
        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno || *end || v >= UINT32_MAX)
                return false;
        *ret = (uint32_t) v;
        return true;
}

static int set_target(QuotaRule *q, QuotaKind kind, uint32_t id, const char *job, char **ret_reason) {
        char *name = NULL;

        if (q->kind != QUOTA_DEFAULT)
                return reason(ret_reason, "a [quota] section governs one job, uid, user or group; "
                              "this one has a target already (start a new [quota] section)");
        if (job) {
                name = strdup(job);
                if (!name)
                        return -ENOMEM;
        }
        q->kind = kind;
        q->id = id;
        q->job = name;
        return 0;
}

int quota_rule_set_key(QuotaRule *q, const char *key, const char *value, char **ret_reason) {
        uint32_t id;

        if (strcmp(key, "job") == 0) {
                if (!job_name_ok(value))
                        return reason(ret_reason, "'%s' is not a job name (not empty, no control characters, "
                                      "no blanks at either end)", value);
                return set_target(q, QUOTA_JOB, 0, value, ret_reason);
        }
        if (strcmp(key, "uid") == 0) {
                if (!parse_id(value, &id))
                        return reason(ret_reason, "'%s' is not a uid (a number)", value);
                return set_target(q, QUOTA_UID, id, NULL, ret_reason);
        }
        if (strcmp(key, "user") == 0 || strcmp(key, "group") == 0 || strcmp(key, "owner") == 0) {
                bool user = key[0] != 'g', owner = key[0] == 'o';

                if (!parse_id(value, &id)) {
                        int r = lookup_id(user, value, &id);

                        if (r == -ENOENT)
                                return reason(ret_reason, "no %s '%s' (not in the %s database)", owner ? "user" : key,
                                              value, owner ? "user" : key);
                        /*
                         * The database failed (a directory service down, out of fds): not "no
                         * such name", which would make a valid configuration look broken, or
                         * at reload drop the quota of a user who exists.
                         */
                        if (r < 0)
                                return reason(ret_reason, "cannot look up %s '%s' in the %s database: %s (try "
                                              "again, or give the %s as a number)", owner ? "user" : key, value,
                                              owner ? "user" : key, strerror(-r),
                                              user ? "uid" : "gid");
                }
                if (owner) {
                        if (q->has_owner)
                                return reason(ret_reason, "set a second time in this [quota] section (uid %" PRIu32
                                              " first): remove one of the two lines", q->owner);
                        q->has_owner = true;
                        q->owner = id;
                        return 0;
                }
                return set_target(q, user ? QUOTA_UID : QUOTA_GROUP, id, NULL, ret_reason);
        }

        for (int f = 0; f < QUOTA_FIELDS; f++) {
                uint64_t v;
                int r;

                if (strcmp(key, field_names[f]) != 0)
                        continue;
                if (f == QUOTA_WEIGHT) {
                        uint32_t w;

                        if (!parse_id(value, &w) || w < 1 || w > QUOTA_WEIGHT_MAX)
                                return reason(ret_reason, "'%s' is not a weight from 1 to %u", value,
                                              QUOTA_WEIGHT_MAX);
                        v = w;
                } else {
                        r = size_parse(value, &v);
                        if (r == -ERANGE)
                                return reason(ret_reason, "size '%s' does not fit in 64 bits", value);
                        if (r < 0)
                                return reason(ret_reason, "invalid size '%s' (e.g. 512M, 8G)", value);
                        if (v == 0 && f < QUOTA_MIN(0))
                                return reason(ret_reason, "a maximum must be positive");
                }
                q->value[f] = v;
                q->set |= 1u << f;
                return 0;
        }
        return reason(ret_reason, "unknown key (job, uid, user, group, owner, host, host_min, vram, vram_min, nvme, "
                      "nvme_min, weight, host_total, vram_total, nvme_total)");
}

int quota_rule_check(const QuotaRule *q, char **ret_reason) {
        if (q->kind == QUOTA_DEFAULT)
                return reason(ret_reason, "[quota] section names no job, uid, user or group");
        if (q->has_owner && q->kind != QUOTA_JOB)
                return reason(ret_reason, "owner is the uid that alone may create a job of a name: it goes in a "
                              "[quota] section of a job name (job =), not of a %s", kind_names[q->kind]);
        for (int t = 0; t < TIERS; t++)
                if ((q->set & (1u << QUOTA_TOTAL(t))) && q->kind == QUOTA_JOB)
                        return reason(ret_reason, "%s_total is the total of a uid's or a group's jobs: a job name "
                                      "has a maximum (%s) instead", level_to_string(t), level_to_string(t));
        for (int t = 0; t < TIERS; t++)
                if ((q->set & (1u << QUOTA_MIN(t))) && (q->set & (1u << QUOTA_MAX(t))) &&
                    q->value[QUOTA_MIN(t)] > q->value[QUOTA_MAX(t)])
                        return reason(ret_reason, "%s_min %s is above %s %s", level_to_string(t),
                                      FORMAT_SIZE_EXACT(q->value[QUOTA_MIN(t)]), level_to_string(t),
                                      FORMAT_SIZE_EXACT(q->value[QUOTA_MAX(t)]));
        return 0;
}

/* ---- lists ------------------------------------------------------------------------------ */

void quota_rules_clear(QuotaRules *rs) {
        for (size_t i = 0; i < rs->n; i++)
                quota_rule_done(&rs->rules[i]);
        rs->rules = mfree(rs->rules);
        rs->n = 0;
}

int quota_rules_copy(QuotaRules *to, const QuotaRules *from) {
        *to = QUOTA_RULES_NULL;
        if (from->n == 0)
                return 0;
        to->rules = calloc(from->n, sizeof(QuotaRule));
        if (!to->rules)
                return -ENOMEM;
        for (size_t i = 0; i < from->n; i++) {
                if (quota_rule_copy(&to->rules[i], &from->rules[i]) < 0) {
                        to->n = i;
                        quota_rules_clear(to);
                        return -ENOMEM;
                }
        }
        to->n = from->n;
        return 0;
}

QuotaRule *quota_rules_find(const QuotaRules *rs, QuotaKind kind, uint32_t id, const char *job) {
        for (size_t i = 0; i < rs->n; i++)
                if (quota_rule_matches(&rs->rules[i], kind, id, job))
                        return &rs->rules[i];
        return NULL;
}

int quota_rules_add(QuotaRules *rs, QuotaRule *q) {
        QuotaRule *a;

        if (rs->n >= QUOTA_RULES_MAX) {
                quota_rule_done(q);
                return -E2BIG;
        }
        a = reallocarray(rs->rules, rs->n + 1, sizeof(QuotaRule));
        if (!a) {
                quota_rule_done(q);
                return -ENOMEM;
        }
        rs->rules = a;
        rs->rules[rs->n++] = *q;
        *q = (QuotaRule) {};
        return 0;
}

void quota_rules_remove(QuotaRules *rs, size_t i) {
        if (i >= rs->n)
                return;
        quota_rule_done(&rs->rules[i]);
        memmove(&rs->rules[i], &rs->rules[i + 1], (rs->n - i - 1) * sizeof(QuotaRule));
        rs->n--;
}

/* ---- text ------------------------------------------------------------------------------- */

static char *strip(char *s) {
        char *e;

        while (*s == ' ' || *s == '\t' || *s == '\r')
                s++;
        e = s + strlen(s);
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
                e--;
        *e = '\0';
        return s;
}

/* The section that began at line @line is complete: check it and add it to @rs. */
static int section_end(QuotaRules *rs, QuotaRule *cur, const char *filename, unsigned line, char **ret_error) {
        _cleanup_free_ char *why = NULL;
        int r;

        r = quota_rule_check(cur, &why);
        if (r >= 0 && quota_rules_find(rs, cur->kind, cur->id, cur->job))
                r = -EEXIST;
        if (r == -EEXIST) {
                char t[300];

                quota_target_format(cur->kind, cur->id, cur->job, t, sizeof(t));
                quota_rule_done(cur);
                return reason(ret_error, "%s:%u: a second [quota] section for %s", filename, line, t);
        }
        if (r < 0) {
                quota_rule_done(cur);
                if (r == -ENOMEM)
                        return r;
                return reason(ret_error, "%s:%u: %s", filename, line, why ? why : "invalid section");
        }
        r = quota_rules_add(rs, cur);
        if (r == -E2BIG)
                return reason(ret_error, "%s:%u: more than %u quotas", filename, line, QUOTA_RULES_MAX);
        return r;
}

int quota_rules_parse_text(QuotaRules *rs, const char *text, const char *filename, char **ret_error) {
        _cleanup_free_ char *copy = strdup(text);
        QuotaRule cur = {};
        size_t n0 = rs->n;
        unsigned line = 0, start = 0;
        bool in_section = false;
        char *l, *next;
        int r = 0;

        if (ret_error)
                *ret_error = NULL;
        if (!copy)
                return -ENOMEM;
        cur.kind = QUOTA_DEFAULT;
        for (l = copy; l; l = next) {
                _cleanup_free_ char *why = NULL;
                char *eq, *key, *value;

                next = strchr(l, '\n');
                if (next)
                        *next++ = '\0';
                line++;
                l = strip(l);
                if (l[0] == '\0' || l[0] == '#' || l[0] == ';')
                        continue;
                if (l[0] == '[') {
                        if (strcmp(l, "[quota]") != 0) {
                                r = reason(ret_error, "%s:%u: unexpected '%s' (only [quota] sections)", filename,
                                           line, l);
                                break;
                        }
                        if (in_section) {
                                r = section_end(rs, &cur, filename, start, ret_error);
                                if (r < 0)
                                        break;
                        }
                        cur = (QuotaRule) { .kind = QUOTA_DEFAULT };
                        in_section = true;
                        start = line;
                        continue;
                }
                eq = strchr(l, '=');
                if (!eq || !in_section) {
                        r = reason(ret_error, "%s:%u: %s", filename, line,
                                   !in_section ? "a line outside of any [quota] section" :
                                   "missing '=' (expected 'key = value')");
                        break;
                }
                *eq = '\0';
                key = strip(l);
                value = strip(eq + 1);
                r = quota_rule_set_key(&cur, key, value, &why);
                if (r == -EINVAL)
                        r = reason(ret_error, "%s:%u: %s: %s", filename, line, key, why ? why : "invalid value");
                if (r < 0)
                        break;
        }
        if (r >= 0 && in_section)
                r = section_end(rs, &cur, filename, start, ret_error);
        else
                quota_rule_done(&cur);
        if (r < 0)
                while (rs->n > n0)
                        quota_rules_remove(rs, rs->n - 1);
        return r;
}

char *quota_rules_format(const QuotaRules *rs) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);

        if (!f)
                return NULL;
        for (size_t i = 0; i < rs->n; i++) {
                const QuotaRule *q = &rs->rules[i];

                fprintf(f, "%s[quota]\n", i ? "\n" : "");
                if (q->kind == QUOTA_JOB)
                        fprintf(f, "job = %s\n", q->job);
                if (q->kind == QUOTA_JOB && q->has_owner)
                        fprintf(f, "owner = %" PRIu32 "\n", q->owner);
                else if (q->kind == QUOTA_UID || q->kind == QUOTA_GROUP)
                        fprintf(f, "%s = %" PRIu32 "\n", kind_names[q->kind], q->id);
                for (int fi = 0; fi < QUOTA_FIELDS; fi++) {
                        if (!(q->set & (1u << fi)))
                                continue;
                        if (fi == QUOTA_WEIGHT)
                                fprintf(f, "weight = %" PRIu64 "\n", q->value[fi]);
                        else
                                fprintf(f, "%s = %s\n", field_names[fi], FORMAT_SIZE_EXACT(q->value[fi]));
                }
        }
        if (fclose(f) != 0) {
                free(text);
                return NULL;
        }
        return text;
}
