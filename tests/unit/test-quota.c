/* SPDX-License-Identifier: MIT */
/* test-quota.c: quota rules ([quota] sections, the state file), precedence, checks, saving and loading. */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/base/quota-rule.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "proto/macro.h"

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

static void config_deinitp(Config *c) {
        config_deinit(c);
}

/* Parse @text as a state file and expect -EINVAL with @needle in the message; @rs stays as it was. */
/* The user and group databases: the name "nss-down" finds them failing (a directory service down). */
int __real_getpwnam_r(const char *name, struct passwd *pw, char *buf, size_t size, struct passwd **ret);
int __wrap_getpwnam_r(const char *name, struct passwd *pw, char *buf, size_t size, struct passwd **ret);
int __real_getgrnam_r(const char *name, struct group *gr, char *buf, size_t size, struct group **ret);
int __wrap_getgrnam_r(const char *name, struct group *gr, char *buf, size_t size, struct group **ret);

int __wrap_getpwnam_r(const char *name, struct passwd *pw, char *buf, size_t size, struct passwd **ret) {
        if (strcmp(name, "nss-down") == 0) {
                *ret = NULL;
                return EIO;
        }
        return __real_getpwnam_r(name, pw, buf, size, ret);
}

int __wrap_getgrnam_r(const char *name, struct group *gr, char *buf, size_t size, struct group **ret) {
        if (strcmp(name, "nss-down") == 0) {
                *ret = NULL;
                return EIO;
        }
        return __real_getgrnam_r(name, gr, buf, size, ret);
}

static void rules_fail(const char *text, const char *needle) {
        _cleanup_(quota_rules_clear) QuotaRules rs = QUOTA_RULES_NULL;
        _cleanup_free_ char *err = NULL;

        assert_int_equal(quota_rules_parse_text(&rs, text, "quotas", &err), -EINVAL);
        assert_non_null(err);
        if (!strstr(err, needle))
                fail_msg("message '%s' lacks '%s'", err, needle);
        assert_int_equal(rs.n, 0);
}

static void test_rules_parse_format(void **state) {
        _cleanup_(quota_rules_clear) QuotaRules rs = QUOTA_RULES_NULL, again = QUOTA_RULES_NULL;
        _cleanup_free_ char *err = NULL, *text = NULL, *text2 = NULL;
        const QuotaRule *q;

        assert_int_equal(quota_rules_parse_text(&rs,
                                                "# comment\n"
                                                "[quota]\n"
                                                "job = train lm\n"
                                                "host = 8G\n"
                                                "host_min = 2GiB\n"
                                                "\n"
                                                "[quota]\n"
                                                "uid = 1000\n"
                                                "vram = 512M\n"
                                                "vram_min = 0\n"
                                                "weight = 7\n"
                                                "[quota]\n"
                                                "group = 27\n"
                                                "nvme = 1T\n"
                                                "nvme_min = 4K\n"
                                                "host_total = 64G\n"
                                                "vram_total = 0\n",
                                                "quotas", &err), 0);
        assert_null(err);
        assert_int_equal(rs.n, 3);
        q = quota_rules_find(&rs, QUOTA_JOB, 0, "train lm");
        assert_non_null(q);
        assert_int_equal(q->value[QUOTA_MAX(LEVEL_HOST)], 8 * GIB);
        assert_int_equal(q->value[QUOTA_MIN(LEVEL_HOST)], 2 * GIB);
        assert_int_equal(q->set, (1u << QUOTA_MAX(LEVEL_HOST)) | (1u << QUOTA_MIN(LEVEL_HOST)));
        q = quota_rules_find(&rs, QUOTA_UID, 1000, NULL);
        assert_non_null(q);
        assert_true(q->set & (1u << QUOTA_MIN(LEVEL_VRAM)));     /* a min of 0 is a value */
        assert_int_equal(q->value[QUOTA_WEIGHT], 7);
        assert_null(quota_rules_find(&rs, QUOTA_UID, 1001, NULL));
        q = quota_rules_find(&rs, QUOTA_GROUP, 27, NULL);
        assert_non_null(q);
        assert_int_equal(q->value[QUOTA_TOTAL(LEVEL_HOST)], 64 * GIB);
        assert_true(q->set & (1u << QUOTA_TOTAL(LEVEL_VRAM)));   /* a total of 0 (none) is a value */
        assert_false(q->set & (1u << QUOTA_TOTAL(LEVEL_NVME)));

        /* what the writer writes, the reader reads back the same */
        text = quota_rules_format(&rs);
        assert_non_null(text);
        assert_int_equal(quota_rules_parse_text(&again, text, "quotas", &err), 0);
        text2 = quota_rules_format(&again);
        assert_string_equal(text, text2);
        assert_int_equal(again.n, 3);
        assert_memory_equal(again.rules[0].value, rs.rules[0].value, sizeof(rs.rules[0].value));
        assert_memory_equal(again.rules[2].value, rs.rules[2].value, sizeof(rs.rules[2].value));
        assert_int_equal(again.rules[2].set, rs.rules[2].set);
}

static void test_rules_errors(void **state) {
        rules_fail("[quota]\nuid = 1\nhost = 8X\n", "quotas:3: host: invalid size '8X'");
        rules_fail("[quota]\nuid = 1\nhost = 0\n", "a maximum must be positive");
        rules_fail("[quota]\nuid = 1\nweight = 1001\n", "weight from 1 to 1000");
        rules_fail("[quota]\nuid = 1\nweight = 0\n", "weight from 1 to 1000");
        rules_fail("[quota]\nuid = 1\nspeed = 3\n", "speed: unknown key");
        rules_fail("[quota]\nhost = 8G\n", "quotas:1: [quota] section names no job, uid, user or group");
        rules_fail("[quota]\nuid = 1\njob = x\n", "has a target already");
        rules_fail("[quota]\nuid = 1\n[quota]\nuid = 1\nhost = 1G\n", "quotas:3: a second [quota] section for uid 1");
        rules_fail("host = 8G\n", "outside of any [quota] section");
        rules_fail("[host]\ncapacity = 1G\n", "only [quota] sections");
        rules_fail("[quota]\nuid = 1\nhost 8G\n", "missing '='");
        rules_fail("[quota]\nuid = -1\n", "not a uid");
        rules_fail("[quota]\nuid = 1\nhost = 1G\nhost_min = 2G\n", "host_min 2G is above host 1G");
        rules_fail("[quota]\nuser = no-such-user-here\n", "no user 'no-such-user-here'");
        rules_fail("[quota]\ngroup = no-such-group-here\n", "no group 'no-such-group-here'");
        /* a database that fails is not "no such user": the message says so and what to do */
        rules_fail("[quota]\nuser = nss-down\n", "cannot look up user 'nss-down' in the user database: "
                   "Input/output error (try again, or give the uid as a number)");
        rules_fail("[quota]\ngroup = nss-down\n", "cannot look up group 'nss-down' in the group database");
        rules_fail("[quota]\njob = x\nhost_total = 1G\n", "host_total is the total of a uid's or a group's jobs");
        rules_fail("[quota]\nuid = 1\nnvme_total = lots\n", "nvme_total: invalid size 'lots'");
}

static void test_config_sections(void **state) {
        _cleanup_(config_deinitp) Config c;
        _cleanup_free_ char *err = NULL;

        config_init(&c);
        assert_int_equal(config_parse_text(&c,
                                           "[host]\njob_limit = 64M\n"
                                           "[quota]\nuser = root\nhost = 8M\n"
                                           "[sched]\ndefault_weight = 2\n"
                                           "[quota]\ngroup = root\nvram = 4M\n"
                                           "[quota]\nuid = 0\nweight = 9\n",
                                           "test.conf", &err), 0);
        assert_null(err);
        assert_int_equal(c.quotas.n, 3);
        assert_int_equal(c.quotas.rules[0].kind, QUOTA_UID);
        assert_int_equal(c.quotas.rules[0].id, 0);      /* user root */
        assert_int_equal(c.quotas.rules[1].kind, QUOTA_GROUP);
        assert_int_equal(c.default_weight, 2);

        /* errors name the file, the line and the section */
        assert_int_equal(config_parse_text(&c, "[quota]\nuid = 5\nhost = lots\n", "x.conf", &err), -EINVAL);
        assert_non_null(strstr(err, "x.conf:3: [quota] host: invalid size 'lots'"));
        err = mfree(err);
        assert_int_equal(config_parse_text(&c, "[quota]\nhost = 1G\n[host]\njob_limit = 1G\n", "x.conf", &err),
                         -EINVAL);
        assert_non_null(strstr(err, "x.conf:1: [quota] section names no job"));
        err = mfree(err);
        /* a [quota] section at the end of a file is complete too */
        assert_int_equal(config_parse_text(&c, "[quota]\nweight = 3\n", "y.conf", &err), -EINVAL);
        assert_non_null(strstr(err, "y.conf:1:"));
}

/* Precedence: job > uid > group (primary first) > default, field by field; run time over tierd.conf. */
static void test_precedence(void **state) {
        _cleanup_(config_deinitp) Config c;
        _cleanup_(quota_rules_clear) QuotaRules rt = QUOTA_RULES_NULL;
        _cleanup_free_ char *err = NULL;
        gid_t gids[] = { 100, 27, 30 };
        QuotaSubject who = { .job = "j", .has_uid = true, .uid = 1000, .gids = gids, .n_gids = 3 };
        QuotaResolved q;
        char buf[128];

        config_init(&c);
        assert_int_equal(config_parse_text(&c,
                                           "[host]\njob_limit = 64M\n"
                                           "[vram]\njob_limit = 32M\n"
                                           "[quota]\njob = j\nhost = 10M\n"
                                           "[quota]\nuid = 1000\nhost = 20M\nvram = 20M\nhost_min = 1M\n"
                                           "[quota]\ngroup = 27\nvram = 30M\nnvme = 30M\nweight = 4\nvram_min = 2M\n"
                                           "[quota]\ngroup = 100\nnvme = 40M\n"
                                           "[quota]\ngroup = 30\nweight = 6\nnvme_min = 3M\n",
                                           "test.conf", &err), 0);
        /* a later file's section wins (one file may not set a field of one target twice) */
        assert_int_equal(config_parse_text(&c, "[quota]\njob = j\nhost = 11M\n", "drop-in.conf", &err), 0);

        quota_resolve(&c, &rt, &who, &q);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_HOST)], 11 * MIB);             /* job */
        assert_int_equal(q.from[QUOTA_MAX(LEVEL_HOST)].kind, QUOTA_JOB);
        assert_true(q.from[QUOTA_MAX(LEVEL_HOST)].config);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_VRAM)], 20 * MIB);             /* uid over group */
        assert_int_equal(q.from[QUOTA_MAX(LEVEL_VRAM)].kind, QUOTA_UID);
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_HOST)], 1 * MIB);              /* uid */
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_NVME)], 40 * MIB);             /* primary group 100 first */
        assert_int_equal(q.from[QUOTA_MAX(LEVEL_NVME)].id, 100);
        assert_int_equal(q.value[QUOTA_WEIGHT], 4);                            /* group 27 before 30 */
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_VRAM)], 2 * MIB);
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_NVME)], 3 * MIB);              /* only group 30 sets it */
        assert_int_equal(q.from[QUOTA_MIN(LEVEL_NVME)].id, 30);
        assert_string_equal(quota_source_format(&q.from[QUOTA_MAX(LEVEL_VRAM)], buf, sizeof(buf)),
                            "uid 1000 (tierd.conf)");

        /* nothing for this subject: the default */
        who = (QuotaSubject) { .job = "other", .has_uid = true, .uid = 5 };
        quota_resolve(&c, &rt, &who, &q);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_HOST)], 64 * MIB);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_VRAM)], 32 * MIB);
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_HOST)], 0);
        assert_int_equal(q.value[QUOTA_WEIGHT], 1);
        assert_string_equal(quota_source_format(&q.from[QUOTA_WEIGHT], buf, sizeof(buf)), "default");

        /* a rule set at run time wins over tierd.conf's for the same target, field by field */
        assert_int_equal(quota_rules_parse_text(&rt, "[quota]\nuid = 1000\nvram = 25M\n", "quotas", &err), 0);
        who = (QuotaSubject) { .job = "j", .has_uid = true, .uid = 1000, .gids = gids, .n_gids = 3 };
        quota_resolve(&c, &rt, &who, &q);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_VRAM)], 25 * MIB);
        assert_false(q.from[QUOTA_MAX(LEVEL_VRAM)].config);
        assert_string_equal(quota_source_format(&q.from[QUOTA_MAX(LEVEL_VRAM)], buf, sizeof(buf)), "uid 1000");
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_HOST)], 1 * MIB);              /* still tierd.conf's */
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_HOST)], 11 * MIB);             /* job over uid still */
}

/*
 * A job name's owner ([quota] owner =): found by a reviewer, uid 65534 created "nightly" first and got
 * the 48M max and 32M guarantee meant for another user's job; now the name's rules govern only a job of
 * its owner's uid (the Hello of another is refused: ipc/owner.c), and say the owner where they apply.
 */
static void test_owner(void **state) {
        _cleanup_(config_deinitp) Config c;
        _cleanup_(quota_rules_clear) QuotaRules rs = QUOTA_RULES_NULL, rt = QUOTA_RULES_NULL;
        _cleanup_free_ char *err = NULL, *text = NULL;
        QuotaSubject who = { .job = "nightly", .has_uid = true, .uid = 65534 };
        QuotaResolved q;
        uint32_t owner = 0;
        char buf[128];

        /* the state file's syntax: read, written back */
        assert_int_equal(quota_rules_parse_text(&rs, "[quota]\njob = nightly\nowner = 1000\nhost = 48M\n", "quotas",
                                                &err), 0);
        assert_true(rs.rules[0].has_owner);
        assert_int_equal(rs.rules[0].owner, 1000);
        text = quota_rules_format(&rs);
        assert_string_equal(text, "[quota]\njob = nightly\nowner = 1000\nhost = 48M\n");
        quota_rules_clear(&rs);
        assert_int_equal(quota_rules_parse_text(&rs, "[quota]\nowner = root\njob = x\n", "quotas", &err), 0);
        assert_int_equal(rs.rules[0].owner, 0);        /* a user name, looked up; before the target too */
        rules_fail("[quota]\nuid = 5\nowner = 1000\n", "owner is the uid that alone may create a job of a name: "
                   "it goes in a [quota] section of a job name (job =), not of a uid");
        rules_fail("[quota]\njob = x\nowner = 1\nowner = 2\n", "owner: set a second time in this [quota] section");
        rules_fail("[quota]\njob = x\nowner = no-such-user-here\n", "owner: no user 'no-such-user-here'");
        rules_fail("[quota]\njob = x\nowner = nss-down\n", "cannot look up user 'nss-down' in the user database");
        rules_fail("[quota]\njob = x\nowner = -1\n", "no user '-1'");

        config_init(&c);
        assert_int_equal(config_parse_text(&c,
                                           "[host]\njob_limit = 64M\n"
                                           "[quota]\njob = nightly\nowner = 1000\nhost = 48M\nhost_min = 32M\n"
                                           "[quota]\nuid = 65534\nhost = 16M\n",
                                           "test.conf", &err), 0);
        /* uid 65534's job of that name: its uid's quota, not the name's */
        quota_resolve(&c, &rt, &who, &q);
        assert_true(q.not_owner);
        assert_int_equal(q.owner, 1000);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_HOST)], 16 * MIB);
        assert_int_equal(q.from[QUOTA_MAX(LEVEL_HOST)].kind, QUOTA_UID);
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_HOST)], 0);
        /* the owner's job gets the name's, which says its owner */
        who.uid = 1000;
        quota_resolve(&c, &rt, &who, &q);
        assert_false(q.not_owner);
        assert_int_equal(q.value[QUOTA_MAX(LEVEL_HOST)], 48 * MIB);
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_HOST)], 32 * MIB);
        assert_string_equal(quota_source_format(&q.from[QUOTA_MIN(LEVEL_HOST)], buf, sizeof(buf)),
                            "job 'nightly' (tierd.conf, owner uid 1000)");
        /* the name's quota (no job, no uid: tierctl quota get of a name that does not run) is the rule's */
        who = (QuotaSubject) { .job = "nightly" };
        quota_resolve(&c, &rt, &who, &q);
        assert_int_equal(q.value[QUOTA_MIN(LEVEL_HOST)], 32 * MIB);

        /* one file may not name two owners of a name; a later file (a drop-in) changes it */
        assert_int_equal(config_parse_text(&c, "[quota]\njob = a\nowner = 1\n[quota]\njob = a\nowner = 2\n", "x.conf",
                                           &err), -EINVAL);
        assert_non_null(strstr(err, "x.conf:4: [quota] owner: set a second time in this file for job 'a' (first by "
                                    "the [quota] section at line 1)"));
        err = mfree(err);
        assert_int_equal(config_parse_text(&c, "[quota]\njob = nightly\nowner = 65534\n", "drop-in.conf", &err), 0);
        assert_true(quota_job_owner(&c, &rt, "nightly", &owner));
        assert_int_equal(owner, 65534);
        /* a run-time rule's owner wins over tierd.conf's; a name without an owner has none */
        assert_int_equal(quota_rules_parse_text(&rt, "[quota]\njob = nightly\nowner = 7\n", "quotas", &err), 0);
        assert_true(quota_job_owner(&c, &rt, "nightly", &owner));
        assert_int_equal(owner, 7);
        assert_false(quota_job_owner(&c, &rt, "other", &owner));
}

/* A registry with no pools: jobs and capacities are all quota.c looks at. */
typedef struct Books {
        Registry r;
        Config c;
        QuotaStore *s;
        char dir[64];
} Books;

static int books_setup(void **state) {
        Books *b = calloc(1, sizeof(*b));

        assert_non_null(b);
        config_init(&b->c);
        strcpy(b->dir, "/tmp/test-quota-XXXXXX");
        assert_non_null(mkdtemp(b->dir));
        free(b->c.state_dir);
        b->c.state_dir = strdup(b->dir);
        b->c.host_job_limit = 64 * MIB;
        list_init(&b->r.jobs);
        list_init(&b->r.dying_jobs);
        b->r.config = &b->c;
        b->r.capacity[LEVEL_VRAM] = 32 * MIB;
        b->r.capacity[LEVEL_HOST] = 64 * MIB;
        b->r.capacity[LEVEL_NVME] = GIB;
        assert_int_equal(quota_store_new(&b->r, &b->c, &b->s), 0);
        *state = b;
        return 0;
}

static int books_teardown(void **state) {
        Books *b = *state;
        char cmd[128];

        quota_store_free(b->s);
        config_deinit(&b->c);
        (void) snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b->dir);
        assert_int_equal(system(cmd), 0);
        free(b);
        return 0;
}

static int set(Books *b, const char *text, char *why, size_t size, char *warn) {
        _cleanup_(quota_rules_clear) QuotaRules one = QUOTA_RULES_NULL;
        _cleanup_free_ char *err = NULL;

        assert_int_equal(quota_rules_parse_text(&one, text, "change", &err), 0);
        assert_int_equal(one.n, 1);
        why[0] = '\0';
        return quota_store_set(b->s, &one.rules[0], false, why, size, warn, 512);
}

/* A reload names an owner of a running job's name that is not its uid: the rule stops governing that job (logged). */
static void test_owner_reload(void **state) {
        Books *b = *state;
        _cleanup_free_ char *err = NULL;
        Job j = { .name = (char *) "nightly", .uid = 65534, .weight = 1 };

        list_add_tail(&b->r.jobs, &j.link);
        assert_int_equal(config_parse_text(&b->c, "[quota]\njob = nightly\nhost = 48M\n", "test.conf", &err), 0);
        assert_true(quota_apply_all(b->s, NULL, 0));
        assert_int_equal(j.limit[LEVEL_HOST], 48 * MIB);
        assert_false(j.not_owner);
        b->c.quotas.rules[0].has_owner = true;          /* as a reload's new tierd.conf says it */
        b->c.quotas.rules[0].owner = 1000;
        assert_true(quota_apply_all(b->s, NULL, 0));
        assert_int_equal(j.limit[LEVEL_HOST], 64 * MIB);        /* the default: the rule is not its */
        assert_true(j.not_owner);
        b->c.quotas.rules[0].owner = 65534;             /* its own uid again */
        assert_true(quota_apply_all(b->s, NULL, 0));
        assert_int_equal(j.limit[LEVEL_HOST], 48 * MIB);
        assert_false(j.not_owner);
        list_del(&j.link);
        free(j.totals);         /* quota_apply_all() resolved its uid's totals */
}

/*
 * A job of another uid holds an owned name (restored, or running when a reload named the owner): the name's
 * guarantee is still its owner's, kept for the job the owner creates once that one ends.  Found by the
 * owner review: check() counted a name's rule only while no job of that name ran, so with the name held
 * by uid 65534 a set of 30M more was taken, and the owner's job would then be refused (-ENOSPC).
 */
static void test_owner_guarantee_held(void **state) {
        Books *b = *state;
        _cleanup_free_ char *err = NULL;
        char why[1024], warn[512];
        Job j = { .name = (char *) "nightly", .uid = 65534, .weight = 1 };

        list_add_tail(&b->r.jobs, &j.link);
        assert_int_equal(config_parse_text(&b->c, "[quota]\njob = nightly\nowner = 1000\nhost_min = 40M\n",
                                           "test.conf", &err), 0);
        (void) quota_apply_all(b->s, NULL, 0);
        assert_true(j.not_owner);
        assert_int_equal(j.guarantee[LEVEL_HOST], 0);
        /* 40M (the owner's, held for it) + 30M > 64M */
        assert_int_equal(set(b, "[quota]\njob = other\nhost_min = 30M\n", why, sizeof(why), warn), -ENOSPC);
        assert_non_null(strstr(why, "job 'nightly' 40.0 MiB"));
        /* the owner's own job counts once (as it runs), not twice */
        j.uid = 1000;
        (void) quota_apply_all(b->s, NULL, 0);
        assert_int_equal(j.guarantee[LEVEL_HOST], 40 * MIB);
        assert_int_equal(set(b, "[quota]\njob = other\nhost_min = 24M\n", why, sizeof(why), warn), 0);
        list_del(&j.link);
        free(j.totals);
}

/* Run quota_warn_unowned() on @text's tierd.conf (and drop-in @more, if any); its log (stderr) in @buf. */
static void warn_unowned(const char *text, const char *more, char *buf, size_t size) {
        _cleanup_(config_deinitp) Config c;
        _cleanup_free_ char *err = NULL;
        int fd, saved;
        ssize_t n;

        config_init(&c);
        assert_int_equal(config_parse_text(&c, text, "test.conf", &err), 0);
        if (more)
                assert_int_equal(config_parse_text(&c, more, "drop-in.conf", &err), 0);
        fd = memfd_create("quota-warn", MFD_CLOEXEC);
        assert_true(fd >= 0);
        saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        assert_true(saved >= 0);
        log_setup(LOG_TARGET_STDERR);
        fflush(stderr);
        assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
        quota_warn_unowned(&c);
        fflush(stderr);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
        close(saved);
        n = pread(fd, buf, size - 1, 0);
        close(fd);
        assert_true(n >= 0);
        buf[n] = '\0';
}

/*
 * The warning of a job-name rule without an owner: found by the owner review, the case the owner rule was
 * made for (a name's host 48M over uid 65534's 16M: uid 65534 escapes its maximum by naming a job so) was
 * not warned of, as 48M is below the default; and a name of two sections (a drop-in) was warned of twice.
 */
static void test_owner_warning(void **state) {
        char buf[4096];
        const char *g;

        warn_unowned("[host]\njob_limit = 64M\n"
                     "[quota]\nuid = 65534\nhost = 16M\n"
                     "[quota]\ngroup = 27\nhost_min = 1M\nhost = 12M\n"
                     "[quota]\njob = nightly\nhost = 48M\n"
                     "[quota]\njob = g\nhost_min = 8M\n"
                     "[quota]\njob = small\nhost = 8M\nweight = 1\n"
                     "[quota]\njob = owned\nowner = 1000\nhost = 60M\n",
                     "[quota]\njob = g\nweight = 3\n[quota]\ngroup = 27\nhost = 40M\n", buf, sizeof(buf));
        /* (group 27's 12M is not its host: a later section of it says 40M) */
        if (!strstr(buf, "[quota] job = nightly has no owner: any user who names a job so first gets its host 48M "
                         "(above uid 65534's 16M), escaping its own uid's and groups' quotas"))
                fail_msg("log: %s", buf);
        g = strstr(buf, "[quota] job = g has no owner");
        assert_non_null(g);
        assert_null(strstr(g + 1, "[quota] job = g has no owner"));     /* once per name */
        assert_non_null(strstr(g, "gets its host_min 8M (a guarantee), weight 3 (above the default 1)"));
        assert_null(strstr(buf, "job = small"));        /* below every rule and the default: nothing to take */
        assert_null(strstr(buf, "job = owned"));
        warn_unowned("[quota]\njob = big\nhost = 4G\n", NULL, buf, sizeof(buf));
        assert_non_null(strstr(buf, "gets its host 4G (above the default 512M)"));
}

static void test_store_checks_and_file(void **state) {
        Books *b = *state;
        char why[1024], warn[512], path[128];
        _cleanup_(quota_rules_clear) QuotaRules one = QUOTA_RULES_NULL;
        _cleanup_free_ char *err = NULL;
        QuotaStore *s2;
        struct stat st;
        Job j = { .name = (char *) "running", .uid = 1000, .weight = 1 };

        /* a running job, using 40M of host */
        list_add_tail(&b->r.jobs, &j.link);
        j.used[LEVEL_HOST] = 40 * MIB;
        assert_true(quota_apply_all(b->s, NULL, 0));    /* the defaults */
        assert_int_equal(j.limit[LEVEL_HOST], 64 * MIB);
        assert_false(quota_apply_all(b->s, NULL, 0));

        assert_int_equal(set(b, "[quota]\nuid = 1000\nhost = 1T\n", why, sizeof(why), warn), -EINVAL);
        assert_non_null(strstr(why, "host max 1.0 TiB is above the host tier's capacity of 64.0 MiB"));
        /* a total too (it would never bind: 0 is none), before anything changes; one at the capacity is taken */
        assert_int_equal(set(b, "[quota]\nuid = 1000\nhost_total = 1T\n", why, sizeof(why), warn), -EINVAL);
        assert_non_null(strstr(why, "host total 1.0 TiB is above the host tier's capacity of 64.0 MiB: a total "
                                    "that large never binds; 0 is none"));
        assert_int_equal(set(b, "[quota]\ngroup = 27\nvram_total = 33M\n", why, sizeof(why), warn), -EINVAL);
        assert_non_null(strstr(why, "vram total 33.0 MiB is above the vram tier's capacity of 32.0 MiB"));
        assert_null(quota_rules_find(&b->s->runtime, QUOTA_UID, 1000, NULL));
        assert_null(quota_rules_find(&b->s->runtime, QUOTA_GROUP, 27, NULL));
        assert_int_equal(set(b, "[quota]\nuid = 2000\nhost_total = 64M\nnvme_total = 1G\n", why, sizeof(why), warn),
                         0);
        assert_int_equal(set(b, "[quota]\nuid = 2000\nhost_total = 0\n", why, sizeof(why), warn), 0);
        /* min above max, each from another set */
        assert_int_equal(set(b, "[quota]\njob = zz\nnvme_min = 50M\n", why, sizeof(why), warn), 0);
        assert_int_equal(set(b, "[quota]\njob = zz\nnvme = 40M\n", why, sizeof(why), warn), -EINVAL);
        assert_non_null(strstr(why, "job 'zz' would get a nvme min of 50.0 MiB (from: job 'zz') above its max of "
                                    "40.0 MiB (from: job 'zz')"));
        assert_int_equal(set(b, "[quota]\njob = a\nhost_min = 40M\n", why, sizeof(why), warn), 0);
        assert_int_equal(set(b, "[quota]\njob = b\nhost_min = 30M\n", why, sizeof(why), warn), -ENOSPC);
        assert_non_null(strstr(why, "host guarantees would add up to 70.0 MiB of 64.0 MiB capacity: job 'a' 40.0 MiB, "
                                    "job 'b' 30.0 MiB"));
        /* the running job's guarantee counts too */
        assert_int_equal(set(b, "[quota]\nuid = 1000\nhost_min = 30M\n", why, sizeof(why), warn), -ENOSPC);
        assert_non_null(strstr(why, "job 'running' 30.0 MiB"));

        /* a max below the job's use: accepted, with a warning; the job gets it at once */
        assert_int_equal(set(b, "[quota]\nuid = 1000\nhost = 16M\nweight = 3\n", why, sizeof(why), warn), 1);
        assert_non_null(strstr(warn, "job 'running' uses 40.0 MiB of host, above its new max of 16.0 MiB"));
        assert_int_equal(j.limit[LEVEL_HOST], 16 * MIB);
        assert_int_equal(j.weight, 3);
        assert_true(j.limit_set & (1u << LEVEL_HOST));
        /* the job's own name wins over its uid */
        assert_int_equal(set(b, "[quota]\njob = running\nhost = 20M\n", why, sizeof(why), warn), 1);
        assert_int_equal(j.limit[LEVEL_HOST], 20 * MIB);

        /* the state file holds what was set; a second store reads it back */
        (void) snprintf(path, sizeof(path), "%s/quotas", b->dir);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(quota_store_new(&b->r, &b->c, &s2), 0);
        assert_int_equal(quota_store_load(s2), 0);
        assert_int_equal(s2->runtime.n, 5);
        assert_int_equal(quota_rules_find(&s2->runtime, QUOTA_UID, 2000, NULL)->value[QUOTA_TOTAL(LEVEL_NVME)], GIB);
        assert_non_null(quota_rules_find(&s2->runtime, QUOTA_JOB, 0, "a"));
        assert_int_equal(quota_rules_find(&s2->runtime, QUOTA_UID, 1000, NULL)->value[QUOTA_MAX(LEVEL_HOST)], 16 * MIB);
        quota_store_free(s2);

        /* clearing drops the run-time rule: back to the default */
        assert_int_equal(quota_rules_parse_text(&one, "[quota]\njob = running\nweight = 1\n", "x", &err), 0);
        one.rules[0].set = 0;
        assert_int_equal(quota_store_set(b->s, &one.rules[0], true, why, sizeof(why), warn, sizeof(warn)), 1);
        assert_int_equal(j.limit[LEVEL_HOST], 16 * MIB);         /* uid 1000's again */

        list_del(&j.link);
        free(j.totals);         /* quota_apply_all() resolved its uid's totals */
}

/* A lingering job yields its claim: its guarantee does not count against the others' (it does once it is back). */
static void test_lingering_yields(void **state) {
        Books *b = *state;
        char why[1024], warn[512];
        Job j = { .name = (char *) "lingers", .uid = 7, .weight = 1, .linger_until = 1 };

        list_add_tail(&b->r.jobs, &j.link);
        assert_int_equal(set(b, "[quota]\nuid = 7\nhost_min = 40M\n", why, sizeof(why), warn), 1);
        assert_int_equal(j.guarantee[LEVEL_HOST], 40 * MIB);
        assert_int_equal(set(b, "[quota]\njob = other\nhost_min = 30M\n", why, sizeof(why), warn), 0);
        /* back: 40M + 30M + 1M > 64M */
        j.linger_until = 0;
        assert_int_equal(set(b, "[quota]\njob = third\nhost_min = 1M\n", why, sizeof(why), warn), -ENOSPC);
        assert_non_null(strstr(why, "job 'lingers' 40.0 MiB"));
        list_del(&j.link);
        free(j.totals);
}

/*
 * An NVMe guarantee is room kept free (NVMe copies are never taken back from a job): a claim on more than is
 * free now is refused, naming who holds the rest, whether it comes from a set or a lingering job attaching.
 * Before, only the sum against the capacity was checked: 'a' was told it had 128M while 'b' held all but 100M.
 */
static void test_nvme_claims_fit_free(void **state) {
        Books *b = *state;
        char why[1024], warn[512];
        Job a = { .name = (char *) "a", .uid = 7, .weight = 1 };
        Job h = { .name = (char *) "b", .uid = 8, .weight = 1 };

        list_add_tail(&b->r.jobs, &a.link);
        list_add_tail(&b->r.jobs, &h.link);
        h.used[LEVEL_NVME] = b->r.used[LEVEL_NVME] = GIB - 100 * MIB;
        assert_int_equal(set(b, "[quota]\njob = a\nnvme_min = 128M\n", why, sizeof(why), warn), -ENOSPC);
        if (!strstr(why, "nvme guarantees not used yet would need 128.0 MiB, but only 100.0 MiB of the nvme tier's "
                         "1.0 GiB is free: job 'a' 128.0 MiB (of 128.0 MiB); NVMe copies are never taken back") ||
            !strstr(why, "the rest holds the data of job 'b' 924.0 MiB"))
                fail_msg("why: %s", why);
        assert_int_equal(a.guarantee[LEVEL_NVME], 0);
        /* what the job uses itself counts toward its own guarantee */
        a.used[LEVEL_NVME] = 28 * MIB;
        b->r.used[LEVEL_NVME] += 28 * MIB;
        assert_int_equal(set(b, "[quota]\njob = a\nnvme_min = 100M\n", why, sizeof(why), warn), 1);
        assert_int_equal(a.guarantee[LEVEL_NVME], 100 * MIB);
        /* the sum against the capacity, as for the other tiers */
        assert_int_equal(set(b, "[quota]\njob = c\nnvme_min = 950M\n", why, sizeof(why), warn), -ENOSPC);
        assert_non_null(strstr(why, "nvme guarantees would add up to 1.0 GiB of 1.0 GiB capacity"));

        /* lingering, 'a' claims nothing; 'b' takes the room meanwhile; 'a' cannot claim it back */
        a.linger_until = 1;
        h.used[LEVEL_NVME] += 60 * MIB;
        b->r.used[LEVEL_NVME] += 60 * MIB;
        assert_int_equal(quota_job_attach_check(b->s, &a, why, sizeof(why)), -ENOSPC);
        assert_non_null(strstr(why, "would need 72.0 MiB, but only 12.0 MiB"));
        assert_int_equal(a.linger_until, 1);
        h.used[LEVEL_NVME] -= 60 * MIB;
        b->r.used[LEVEL_NVME] -= 60 * MIB;
        assert_int_equal(quota_job_attach_check(b->s, &a, why, sizeof(why)), 0);

        b->r.used[LEVEL_NVME] = 0;
        list_del(&a.link);
        list_del(&h.link);
        free(a.totals);
        free(h.totals);
}

static void test_store_corrupt_file(void **state) {
        Books *b = *state;
        char path[128], cmd[256];
        char why[256], warn[256];
        size_t n_before;
        FILE *f;

        (void) snprintf(path, sizeof(path), "%s/quotas", b->dir);
        f = fopen(path, "w");
        assert_non_null(f);
        fputs("[quota]\nuid = 1000\nhost = 8 gigabytes\n", f);
        fclose(f);
        assert_int_equal(quota_store_load(b->s), 0);
        assert_int_equal(b->s->runtime.n, 0);
        assert_false(b->s->read_only);
        /* the bad file is kept aside, not lost */
        assert_int_equal(access(path, F_OK), -1);
        (void) snprintf(cmd, sizeof(cmd), "test $(ls '%s' | grep -c '^quotas\\.corrupt\\.') = 1", b->dir);
        assert_int_equal(system(cmd), 0);
        /* and a new set writes a fresh one */
        assert_int_equal(set(b, "[quota]\ngroup = 5\nweight = 2\n", why, sizeof(why), warn), 0);
        assert_int_equal(access(path, F_OK), 0);

        /* a second corrupt file (the same second, likely) is kept beside the first, not over it */
        f = fopen(path, "w");
        assert_non_null(f);
        fputs("[quota]\nbogus = 1\n", f);
        fclose(f);
        assert_int_equal(quota_store_load(b->s), 0);
        assert_int_equal(access(path, F_OK), -1);
        (void) snprintf(cmd, sizeof(cmd), "test $(ls '%s' | grep -c '^quotas\\.corrupt\\.') = 2", b->dir);
        assert_int_equal(system(cmd), 0);

        /* a FIFO planted as the file: the load does not block; it is set aside too */
        assert_int_equal(mkfifo(path, 0600), 0);
        assert_int_equal(quota_store_load(b->s), 0);
        assert_false(b->s->read_only);
        assert_int_equal(access(path, F_OK), -1);
        (void) snprintf(cmd, sizeof(cmd), "test $(ls '%s' | grep -c '^quotas\\.corrupt\\.') = 3", b->dir);
        assert_int_equal(system(cmd), 0);

        /* and so is a symbolic link (not followed) */
        assert_int_equal(symlink("/etc/passwd", path), 0);
        assert_int_equal(quota_store_load(b->s), 0);
        assert_false(b->s->read_only);
        assert_int_equal(access(path, F_OK), -1);
        (void) snprintf(cmd, sizeof(cmd), "test $(ls '%s' | grep -c '^quotas\\.corrupt\\.') = 4", b->dir);
        assert_int_equal(system(cmd), 0);

        /*
         * Cut short (tierd writes every line whole, with its newline): "host = 8G" cut to
         * "host = 8" is 8 bytes, not a quota to read back; nor is an empty file the quotas set
         */
        f = fopen(path, "w");
        assert_non_null(f);
        fputs("[quota]\nuid = 1000\nhost = 8", f);
        fclose(f);
        n_before = b->s->runtime.n;
        assert_int_equal(quota_store_load(b->s), 0);
        assert_int_equal(b->s->runtime.n, n_before);
        assert_int_equal(access(path, F_OK), -1);
        (void) snprintf(cmd, sizeof(cmd), "test $(ls '%s' | grep -c '^quotas\\.corrupt\\.') = 5", b->dir);
        assert_int_equal(system(cmd), 0);
        f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
        assert_int_equal(quota_store_load(b->s), 0);
        assert_int_equal(access(path, F_OK), -1);
        (void) snprintf(cmd, sizeof(cmd), "test $(ls '%s' | grep -c '^quotas\\.corrupt\\.') = 6", b->dir);
        assert_int_equal(system(cmd), 0);
}

static void test_store_refuses(void **state) {
        Books *b = *state;
        QuotaRule def = { .kind = QUOTA_DEFAULT, .set = 1u << QUOTA_WEIGHT, .value[QUOTA_WEIGHT] = 2 };
        QuotaRule none = { .kind = QUOTA_UID, .id = 3 };
        QuotaRule blank = { .kind = QUOTA_JOB, .job = (char *) " x", .set = 1u << QUOTA_WEIGHT, .value[QUOTA_WEIGHT] = 2 };
        QuotaRule heavy = { .kind = QUOTA_UID, .id = 3, .set = 1u << QUOTA_WEIGHT, .value[QUOTA_WEIGHT] = 1001 };
        char why[512], warn[256];

        assert_int_equal(quota_store_set(b->s, &def, false, why, sizeof(why), warn, sizeof(warn)), -EINVAL);
        assert_non_null(strstr(why, "the default quota is tierd.conf's"));
        assert_int_equal(quota_store_set(b->s, &none, false, why, sizeof(why), warn, sizeof(warn)), -EINVAL);
        assert_non_null(strstr(why, "nothing to set"));
        assert_int_equal(quota_store_set(b->s, &blank, false, why, sizeof(why), warn, sizeof(warn)), -EINVAL);
        assert_non_null(strstr(why, "not a job name"));
        assert_int_equal(quota_store_set(b->s, &heavy, false, why, sizeof(why), warn, sizeof(warn)), -EINVAL);
        assert_non_null(strstr(why, "weight 1001 out of range"));
        /* an unreadable state file at start: never overwritten */
        b->s->read_only = true;
        heavy.value[QUOTA_WEIGHT] = 5;
        assert_int_equal(quota_store_set(b->s, &heavy, false, why, sizeof(why), warn, sizeof(warn)), -EIO);
        assert_non_null(strstr(why, "does not overwrite it"));
        assert_int_equal(b->s->runtime.n, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rules_parse_format),
                cmocka_unit_test(test_rules_errors),
                cmocka_unit_test(test_config_sections),
                cmocka_unit_test(test_precedence),
                cmocka_unit_test(test_owner),
                cmocka_unit_test_setup_teardown(test_store_checks_and_file, books_setup, books_teardown),
                cmocka_unit_test_setup_teardown(test_lingering_yields, books_setup, books_teardown),
                cmocka_unit_test_setup_teardown(test_nvme_claims_fit_free, books_setup, books_teardown),
                cmocka_unit_test_setup_teardown(test_store_corrupt_file, books_setup, books_teardown),
                cmocka_unit_test_setup_teardown(test_store_refuses, books_setup, books_teardown),
                cmocka_unit_test_setup_teardown(test_owner_reload, books_setup, books_teardown),
                cmocka_unit_test_setup_teardown(test_owner_guarantee_held, books_setup, books_teardown),
                cmocka_unit_test(test_owner_warning),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
