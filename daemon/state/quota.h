/* SPDX-License-Identifier: MIT */
/* quota.h: quotas of jobs, uids and groups: precedence, checks against the capacities, the state file. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/base/quota-rule.h"

typedef struct Config Config;
typedef struct Job Job;
typedef struct Registry Registry;

/* Name of the state file under [daemon] state_dir. */
#define QUOTA_STATE_FILE "quotas"
/* Largest state file read (QUOTA_RULES_MAX rules fit many times). */
#define QUOTA_STATE_FILE_MAX (4u * 1024 * 1024)
/* Most groups of a job that quotas look at (its creator's primary group and supplementary ones). */
#define QUOTA_GROUPS_MAX 64u

/* Where a resolved field comes from: a rule (of tierd.conf or set at run time), or the default. */
typedef struct QuotaSource {
        QuotaKind kind;         /* QUOTA_DEFAULT: no rule */
        uint32_t id;
        const char *job;        /* borrowed from the rule: valid until the rules change */
        bool config;            /* from tierd.conf (else set at run time) */
        bool has_owner;         /* QUOTA_JOB: the name's owner (quota_job_owner()) */
        uint32_t owner;
} QuotaSource;

typedef struct QuotaResolved {
        uint64_t value[QUOTA_FIELDS];
        QuotaSource from[QUOTA_FIELDS];
        bool not_owner;         /* the job name's rules have owner uid @owner, not the subject's uid: they did not apply */
        uint32_t owner;
} QuotaResolved;

/* Whom to resolve a quota for. */
typedef struct QuotaSubject {
        const char *job;        /* NULL: no job (the quota of a uid or a group) */
        bool has_uid;
        uint32_t uid;
        const gid_t *gids;      /* primary group first, then ascending */
        size_t n_gids;
} QuotaSubject;

typedef struct QuotaStore {
        Registry *registry;     /* borrowed: jobs and capacities */
        const Config *config;   /* borrowed: its rules ([quota]) and defaults, read at each use */
        QuotaRules runtime;     /* set with tierctl quota set, kept in the state file */
        char *path;             /* <state_dir>/quotas */
        bool read_only;         /* the state file could not be read at start: never overwrite it */
        bool renamed;           /* quota_store_rename_job() changed a rule: quota_store_rename_old() saves */
} QuotaStore;

int quota_store_new(Registry *r, const Config *config, QuotaStore **ret);
QuotaStore *quota_store_free(QuotaStore *s);

/*
 * quota_store_load() - read the state file.  A missing file is no quota;
 * a corrupt one is logged in words and moved aside (PATH.corrupt, replacing an older one),
 * and tierd starts with tierd.conf's quotas only; one that cannot be read
 * is logged and never overwritten (quota set then fails, saying why).
 * Returns 0, or -ENOMEM.
 */
int quota_store_load(QuotaStore *s);
/* Write the state file: a temporary file, fsync, rename, fsync of the directory. */
int quota_store_save(const QuotaStore *s, const QuotaRules *rules, char *why, size_t size);

/*
 * quota_store_rename_job() - the NVMe index restored job @was (a name from an older tierd: control
 * characters, bytes not UTF-8, which no client can give now) as @now (book-replay.c restore_name()):
 * the run-time rule of @was, if any, governs @now from now on, said in the log; dropped (said too)
 * when @now has a rule of its own.  Call it before the job's quota is resolved; saved by
 * quota_store_rename_old().  0 or -ENOMEM.
 */
int quota_store_rename_job(QuotaStore *s, const char *was, const char *now);
/*
 * quota_store_rename_old() - after the NVMe index's jobs were restored: every other run-time rule of
 * such a name governs its escaped text (text_escape_name(): "evil\u009b31m", the name the index
 * would restore its job under; with a hash when a rule has that; dropped when that has one too),
 * said in the log, so that tierctl can name it and it holds for a job started under that name, and
 * for a job restored under it (which an earlier start, killed before it saved the rule's new name or
 * failing to, made of that name); then the state file is saved when a rule changed.  0 or -ENOMEM.
 */
int quota_store_rename_old(QuotaStore *s);

/*
 * quota_job_owner() - the uid that alone may create a job named @job: the
 * owner of its run-time rule, else of tierd.conf's last rule of that name
 * that names one.  false: none (whoever creates the name first has it).
 */
bool quota_job_owner(const Config *c, const QuotaRules *runtime, const char *job, uint32_t *ret);
/* The default of quota field @field: [host]/[vram]/[nvme] job_limit, [sched] default_weight, no minimum. */
uint64_t quota_default_value(const Config *c, int field);
/*
 * quota_warn_unowned() - log a warning for each job name of tierd.conf's
 * rules that has no owner and that any user could take by naming a job so:
 * one that sets a guarantee, or a maximum or weight above the default or
 * above a uid's or a group's rule of tierd.conf (whose users escape theirs
 * so).  Once per name, with the values of all its sections.  (quota-owner.c)
 */
void quota_warn_unowned(const Config *c);

/*
 * Resolve @who's quota field by field: job > uid > groups (in @who's order) > default; tierd.conf's rules
 * and @runtime's.  A job name's rules do not apply when the name has an owner and @who has another uid.
 */
void quota_resolve(const Config *c, const QuotaRules *runtime, const QuotaSubject *who, QuotaResolved *ret);
/* The same for running job @j (its name, its creator's uid and groups). */
void quota_resolve_job(const Config *c, const QuotaRules *runtime, const Job *j, QuotaResolved *ret);
/*
 * quota_totals_resolve() - the totals of uid or group @id (@kind): per tier
 * the [quota] field host_total... (run-time rule first, then tierd.conf's
 * last), else for a uid whose jobs are not an admin's (@admin false)
 * quota_uid_share(), else none (0).  @ret_from (may be NULL): per tier
 * where it comes from (QUOTA_DEFAULT: the share, or none).
 */
typedef struct JobTotal JobTotal;
void quota_totals_resolve(const Config *c, const Registry *r, const QuotaRules *runtime, QuotaKind kind, uint32_t id,
                          bool admin, JobTotal *ret, QuotaSource *ret_from);
/* [tier] uid_share of the tier's capacity in bytes; 0: no share. */
uint64_t quota_uid_share(const Config *c, const Registry *r, int tier);

/* "uid 1000", "job 'x' (tierd.conf)", "default", into @buf. */
char *quota_source_format(const QuotaSource *src, char *buf, size_t size);

/*
 * quota_check() - would tierd.conf's rules of @c and @runtime be sound
 * with the jobs running now?  For every running job and every job-name
 * rule: min <= max; per tier, the guarantees (min) of the running jobs
 * (not lingering ones) and of the job names that have rules add up to at
 * most the tier's capacity; the running jobs' NVMe guarantees, less what
 * each uses there, to at most the NVMe room free now (-ENOSPC otherwise:
 * NVMe copies are never taken back, state/space.c).
 * -EINVAL (a min above a max) or -ENOSPC (guarantees) with the reason in @why.
 */
int quota_check(const QuotaStore *s, const Config *c, const QuotaRules *runtime, char *why, size_t size);
/*
 * quota_check_rules() - quota_check() but for the NVMe room free now: the
 * rules alone (tierd.conf's without the run-time ones, whose values may be
 * what applies: a reload); quota_check_room() - that room alone, with the
 * rules as they apply.
 */
int quota_check_rules(const QuotaStore *s, const Config *c, const QuotaRules *runtime, char *why, size_t size);
int quota_check_room(const QuotaStore *s, const Config *c, const QuotaRules *runtime, char *why, size_t size);

/*
 * quota_job_created() - @j was just created by a peer of @gid with
 * supplementary @groups (@n of them, at most QUOTA_GROUPS_MAX kept): give
 * it its quota and log which applies and from where.  With @check,
 * -ENOSPC (@why says it) when its guarantees do not fit beside the others':
 * the caller ends the job; without (a job restored from the NVMe index,
 * which lingers and so claims nothing until a rank attaches:
 * quota_job_attach_check()), never.  -ENOMEM.
 */
int quota_job_created(QuotaStore *s, Job *j, gid_t gid, const gid_t *groups, size_t n, bool check, char *why,
                      size_t size);

/*
 * quota_job_attach_check() - a rank attaches to lingering job @j, which
 * claims its guarantees again: -ENOSPC (@why says it) when they do not fit
 * beside the running jobs' now (a capacity or rule changed while it
 * lingered); the job keeps lingering, its tensors kept.  0 when it fits,
 * does not linger or has no guarantee.  -ENOMEM.
 */
int quota_job_attach_check(QuotaStore *s, Job *j, char *why, size_t size);

/*
 * quota_apply_all() - give every running job the quota the rules now
 * resolve to, logging each change ("Job 'x': host limit 32M -> 16M
 * (uid 1000)"); a max below what a job uses now is logged at notice and
 * described in @warn (when not NULL).  Returns whether anything changed:
 * the caller then tells the engine (engine_limits_changed()).
 */
bool quota_apply_all(QuotaStore *s, char *warn, size_t size);

/*
 * quota_store_set() - set (merge into) or clear the run-time rule of
 * @change's target, checked (maxima within the capacities, min <= max,
 * guarantees that fit, weight 1..1000), saved and applied to the running
 * jobs.  @clear: drop the target's run-time rule first.  -EINVAL, -ENOSPC
 * (guarantees) or -EIO (state file) with @why; @warn gets a warning (a
 * max below what a job uses) or "".  Returns 1 when running jobs' quotas
 * changed (tell the engine), else 0.
 */
int quota_store_set(QuotaStore *s, const QuotaRule *change, bool clear, char *why, size_t why_size, char *warn,
                    size_t warn_size);
