/* SPDX-License-Identifier: MIT */
/* test-quota.c: quotas of job names, uids and groups against a real tierd, through libtier and tierctl. */

/*
 * Each test starts its own tierd on a temporary directory with tierd.conf
 * [quota] sections for this test's uid and group and for a job name.
 * Setting quotas needs root (or group tier-admin, which test machines
 * lack): those tests skip in the unprivileged pass, saying why.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include <tier.h>

#include "proto/macro.h"
#include "tests/helpers/harness.h"
#include "tests/integration/test-quota.h"

TestDaemon daemon_;                     /* (quota-nvme.c too) */
static tier_client *volatile roots_;     /* volatile: a store the optimizer must keep */
static char config_[2048];

static int setup(void **state) {
        if (!test_can_lock_memory(64 * MiB))
                return -1;
        (void) snprintf(config_, sizeof(config_),
                        "[daemon]\n"
                        "linger_sec = 60\n"
                        "[host]\n"
                        "capacity = 64M\n"
                        "segment_size = 4M\n"
                        "job_limit = 32M\n"
                        "uid_share = 50\n"
                        "[vram]\n"
                        "backend = emulated\n"
                        "capacity = 32M\n"
                        "chunk_size = 4M\n"
                        "job_limit = 16M\n"
                        "[nvme]\n"
                        "target = @DIR@/t0.img:256M\n"
                        "[quota]\n"
                        "uid = %u\n"
                        "host = 24M\n"
                        "weight = 3\n"
                        "[quota]\n"
                        "group = %u\n"
                        "vram = 8M\n"
                        "host = 30M\n"
                        "[quota]\n"
                        "job = named\n"
                        "nvme = 100M\n"
                        "host_min = 4M\n",
                        (unsigned) getuid(), (unsigned) getgid());
        return test_daemon_start(&daemon_, config_) < 0 ? -1 : 0;
}

static int teardown(void **state) {
        return test_daemon_stop(&daemon_) == 0 ? 0 : -1;
}

bool is_root(const char *what) {
        if (geteuid() == 0)
                return true;
        printf("%s needs root (setting quotas needs root or group tier-admin): skipped\n", what);
        return false;
}

tier_client *connect_job(const char *job) {
        tier_client *c = NULL;
        int r = tier_client_new(daemon_.socket, job, 0, &c);

        if (r < 0)
                fprintf(stderr, "connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(c));
        assert_int_equal(r, 0);
        return c;
}

/*
 * Run "tierctl --socket SOCK ARGS": its exit status; its stdout and stderr
 * in *@out and *@err (malloc'ed, may be NULL arguments).
 */
int tierctl(char **out, char **err, const char *fmt, ...) {
        char path[512], args[1024], cmd[2048], errpath[400], buf[4096];
        size_t len = 0;
        char *o = NULL;
        va_list ap;
        FILE *f;
        int st;

        va_start(ap, fmt);
        (void) vsnprintf(args, sizeof(args), fmt, ap);
        va_end(ap);
        (void) snprintf(errpath, sizeof(errpath), "%s/tierctl.err", daemon_.dir);
        (void) snprintf(cmd, sizeof(cmd), "%s --socket %s %s 2>%s", test_tierctl_path(path, sizeof(path)),
                        daemon_.socket, args, errpath);
        f = popen(cmd, "r");
        assert_non_null(f);
        for (;;) {
                size_t n = fread(buf, 1, sizeof(buf), f);

                if (n == 0)
                        break;
                o = realloc(o, len + n + 1);
                assert_non_null(o);
                memcpy(o + len, buf, n);
                len += n;
        }
        if (!o)
                o = strdup("");
        o[len] = '\0';
        st = pclose(f);
        if (out)
                *out = o;
        else
                free(o);
        if (err) {
                f = fopen(errpath, "r");
                assert_non_null(f);
                len = fread(buf, 1, sizeof(buf) - 1, f);
                buf[len] = '\0';
                fclose(f);
                *err = strdup(buf);
        }
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void assert_contains(const char *haystack, const char *needle) {
        if (!strstr(haystack, needle))
                fail_msg("'%s' lacks '%s'", haystack, needle);
}

/* ---- a per-uid (and per-group) default applies to a new job ------------------------------------- */

static void test_uid_default_applies(void **state) {
        tier_client *c = connect_job("fresh");
        struct tier_quota q;
        char uid_from[64], gid_from[64];

        (void) snprintf(uid_from, sizeof(uid_from), "uid %u (tierd.conf)", (unsigned) getuid());
        (void) snprintf(gid_from, sizeof(gid_from), "group %u (tierd.conf)", (unsigned) getgid());
        assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
        assert_true(q.running);
        assert_int_equal(q.max[TIER_HOST], 24 * MiB);           /* uid over group's 30M */
        assert_string_equal(q.max_from[TIER_HOST], uid_from);
        assert_int_equal(q.max[TIER_VRAM], 8 * MiB);            /* group */
        assert_string_equal(q.max_from[TIER_VRAM], gid_from);
        assert_int_equal(q.max[TIER_NVME], 2048 * MiB);         /* default */
        assert_string_equal(q.max_from[TIER_NVME], "default");
        assert_int_equal(q.weight, 3);
        assert_int_equal(q.min[TIER_HOST], 0);
        /* the handshake told the client the same limits */
        assert_int_equal(tier_client_limit(c, TIER_HOST), 24 * MiB);
        assert_int_equal(tier_client_limit(c, TIER_VRAM), 8 * MiB);
        /* and tierd said at creation which quota applies and from where */
        assert_true(test_daemon_log_contains(&daemon_, "Job 'fresh' quota: vram max 8.0 MiB (from: group"));
        assert_true(test_daemon_log_contains(&daemon_, "host max 24.0 MiB (from: uid"));
        tier_client_free(c);
}

/*
 * A peer in more supplementary groups than the first look at them holds
 * (here 300, the test's group the last): its group's quota applies all the
 * same.  SO_PEERGROUPS refuses a short buffer (ERANGE) rather than cutting
 * the list, so such a peer used to count as in no group: its jobs escaped
 * their group's quotas, and an admin group did not count.
 */
static void test_many_groups(void **state) {
        int st;
        pid_t pid;

        if (!is_root("test_many_groups (setgroups)"))
                return;
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                gid_t groups[300];
                tier_client *c = NULL;

                for (unsigned i = 0; i < 299; i++)
                        groups[i] = 40000 + i;
                groups[299] = getgid();
                /* the test's group only as the last supplementary one (uid 0 stays: the socket is root's) */
                if (setgroups(300, groups) < 0 || setresgid(65534, 65534, 65534) < 0)
                        _exit(3);
                if (tier_client_new(daemon_.socket, "many-groups", 0, &c) < 0)
                        _exit(4);
                if (tier_client_limit(c, TIER_VRAM) != 8 * MiB)         /* the group's, not the 16M default */
                        _exit(5);
                tier_client_free(c);
                _exit(0);
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        assert_true(test_daemon_log_contains(&daemon_, "Job 'many-groups' quota: vram max 8.0 MiB (from: group"));
}

/* ---- precedence, field by field, through tierctl's JSON --------------------------------------------- */

static void test_precedence(void **state) {
        _cleanup_free_ char *out = NULL, *err = NULL;
        json_t *j, *from;
        json_error_t je;
        tier_client *c;
        char uid_from[64];

        if (!is_root("test_precedence"))
                skip();
        /* run time over tierd.conf for the uid; the job name over both */
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid %u --vram 12M", (unsigned) getuid()), 0);
        assert_int_equal(tierctl(NULL, NULL, "quota set prec --host 20M"), 0);
        c = connect_job("prec");
        assert_int_equal(tierctl(&out, &err, "--json quota get prec"), 0);
        j = json_loads(out, 0, &je);
        assert_non_null(j);
        from = json_object_get(j, "from");
        assert_non_null(from);
        assert_int_equal(json_integer_value(json_object_get(j, "host")), 20 * MiB);
        assert_string_equal(json_string_value(json_object_get(from, "host")), "job 'prec'");
        assert_int_equal(json_integer_value(json_object_get(j, "vram")), 12 * MiB);
        (void) snprintf(uid_from, sizeof(uid_from), "uid %u", (unsigned) getuid());
        assert_string_equal(json_string_value(json_object_get(from, "vram")), uid_from);
        assert_int_equal(json_integer_value(json_object_get(j, "weight")), 3);
        (void) snprintf(uid_from, sizeof(uid_from), "uid %u (tierd.conf)", (unsigned) getuid());
        assert_string_equal(json_string_value(json_object_get(from, "weight")), uid_from);
        assert_string_equal(json_string_value(json_object_get(from, "nvme")), "default");
        assert_true(json_is_true(json_object_get(j, "running")));
        json_decref(j);
        /* the text form says it in words */
        free(out);
        assert_int_equal(tierctl(&out, NULL, "quota get prec"), 0);
        assert_contains(out, "host   max 20.0 MiB (from: job 'prec')");
        /* the group's quota, as a job of a member sees it */
        free(out);
        assert_int_equal(tierctl(&out, NULL, "quota get --group %u", (unsigned) getgid()), 0);
        assert_contains(out, "host   max 30.0 MiB (from: group");
        tier_client_free(c);
}

/* ---- a change applies live ------------------------------------------------------------------------- */

static void test_live_change(void **state) {
        _cleanup_free_ char *err = NULL;
        struct tier_grant g;
        tier_tensor *a, *b;
        tier_client *c;

        if (!is_root("test_live_change"))
                skip();
        c = connect_job("live");
        /* one host segment each (4M): one piece, one mapping */
        assert_int_equal(tier_tensor_create(c, "a", 4 * MiB, &a), 0);
        assert_int_equal(tier_tensor_create(c, "b", 4 * MiB, &b), 0);
        assert_int_equal(tier_pin(a, TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(a, TIER_HOST, 1), 0);

        /* below what it uses: accepted, with a warning in the reply and the log */
        assert_int_equal(tierctl(NULL, &err, "quota set live --host 2M"), 0);
        assert_contains(err, "warning: job 'live' uses 4.0 MiB of host, above its new max of 2.0 MiB");
        assert_true(test_daemon_log_contains(&daemon_, "Quota of job 'live' set with a warning"));
        /* a pin now fails: over the job's limit */
        assert_int_equal(tier_pin(b, TIER_HOST, TIER_READ_WRITE, &g), -EDQUOT);
        /* raised again: the same pin succeeds */
        assert_int_equal(tierctl(NULL, NULL, "quota set live --host 24M"), 0);
        assert_int_equal(tier_pin(b, TIER_HOST, TIER_READ_WRITE, &g), 0);
        assert_int_equal(tier_unpin(b, TIER_HOST, 0), 0);
        tier_tensor_close(a);
        tier_tensor_close(b);
        tier_client_free(c);
}

/* ---- refused and warned, each in words ------------------------------------------------------------- */

static void test_refused(void **state) {
        _cleanup_free_ char *err = NULL;
        struct tier_quota q = {}, now;
        tier_client *c;

        if (!is_root("test_refused"))
                skip();
        assert_int_equal(tierctl(NULL, &err, "quota set jobA --host 10T"), 1);
        assert_contains(err, "host max 10.0 TiB is above the host tier's capacity of 64.0 MiB");
        free(err);
        assert_int_equal(tierctl(NULL, &err, "quota set --uid 0 --host-total 10T"), 1);  /* as a max is */
        assert_contains(err, "host total 10.0 TiB is above the host tier's capacity of 64.0 MiB: a total that large "
                             "never binds; 0 is none");
        free(err);
        assert_int_equal(tierctl(NULL, &err, "quota set jobA --host-min 40M"), 1);   /* max 32M (default) */
        assert_contains(err, "job 'jobA' would get a host min of 40.0 MiB (from: job 'jobA') above its max of 32.0 MiB");
        free(err);
        assert_int_equal(tierctl(NULL, &err, "quota set jobA --host-min 30M"), 0);
        free(err);
        /* 30M (jobA) + 4M (named, tierd.conf) + 31M > 64M */
        assert_int_equal(tierctl(NULL, &err, "quota set jobB --host-min 31M"), 1);
        assert_contains(err, "host guarantees would add up to 65.0 MiB of 64.0 MiB capacity: ");
        assert_contains(err, "job 'jobA' 30.0 MiB");
        assert_contains(err, "job 'named' 4.0 MiB");
        free(err);
        assert_int_equal(tierctl(NULL, &err, "quota set jobA --weight 1001"), 2);
        assert_contains(err, "--weight must be a number from 1 to 1000");
        free(err);
        assert_int_equal(tierctl(NULL, &err, "quota set jobA --host lots"), 2);
        assert_contains(err, "--host must be a positive size like 512M");
        /* the daemon checks as well, whatever the client */
        c = connect_job("");
        q.weight = 1001;
        assert_int_equal(tier_quota_set(c, TIER_QUOTA_JOB, 0, "jobA", &q, &now), -EINVAL);
        assert_contains(tier_client_last_error(c), "weight 1001 out of range (1..1000)");
        q.weight = 0;
        assert_int_equal(tier_quota_set(c, TIER_QUOTA_DEFAULT, 0, NULL, &q, &now), -EINVAL);
        assert_true(test_daemon_log_contains(&daemon_, "Quota of job 'jobB' not set"));
        tier_client_free(c);
}

/* ---- a new job whose guarantees do not fit beside the others' is refused ------------------------------ */

static void test_admission(void **state) {
        tier_client *c[3] = {}, *x = NULL;
        char name[32];

        if (!is_root("test_admission"))
                skip();
        /* every job of this uid is guaranteed 20M of host; 'named' (tierd.conf) 4M */
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid %u --host-min 20M", (unsigned) getuid()), 0);
        for (int i = 0; i < 3; i++) {
                (void) snprintf(name, sizeof(name), "adm%d", i);
                c[i] = connect_job(name);       /* 3 x 20M + 4M = 64M: fits */
        }
        assert_int_equal(tier_client_new(daemon_.socket, "adm3", 0, &x), -ENOSPC);
        assert_contains(tier_client_last_error(x), "cannot create job 'adm3': host guarantees would add up to "
                                                   "84.0 MiB of 64.0 MiB capacity");
        tier_client_free(x);
        assert_true(test_daemon_log_contains(&daemon_, "Job 'adm3' refused: host guarantees"));
        for (int i = 0; i < 3; i++)
                tier_client_free(c[i]);
}

/* ---- kept across a restart; a corrupt file is set aside ----------------------------------------------- */

static void restart(void) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };

        assert_int_equal(test_daemon_kill(&daemon_, SIGTERM, 10000), 0);
        assert_int_equal(test_daemon_spawn(&daemon_, &o), 0);
}

static void test_restart(void **state) {
        char path[400];
        tier_client *c;
        struct tier_quota q;
        FILE *f;

        if (!is_root("test_restart"))
                skip();
        assert_int_equal(tierctl(NULL, NULL, "quota set later --host 6M --host-min 2M --weight 9"), 0);
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid 4242 --vram 4M"), 0);
        restart();
        assert_true(test_daemon_log_contains(&daemon_, "Loaded 2 quota(s) set at run time"));
        c = connect_job("later");
        assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
        assert_int_equal(q.max[TIER_HOST], 6 * MiB);
        assert_int_equal(q.min[TIER_HOST], 2 * MiB);
        assert_int_equal(q.weight, 9);
        assert_string_equal(q.min_from[TIER_HOST], "job 'later'");
        assert_int_equal(tier_quota_get(c, TIER_QUOTA_UID, 4242, NULL, &q), 0);
        assert_int_equal(q.max[TIER_VRAM], 4 * MiB);
        tier_client_free(c);

        /* a corrupt state file: said in words, kept aside, and tierd starts */
        (void) snprintf(path, sizeof(path), "%s/quotas", daemon_.dir);
        f = fopen(path, "w");
        assert_non_null(f);
        fputs("[quota]\njob = x\nhost = a lot\n", f);
        fclose(f);
        restart();
        assert_true(test_daemon_log_contains(&daemon_, "is corrupt ("));
        assert_true(test_daemon_log_contains(&daemon_, "quotas:3: host: invalid size 'a lot'"));
        assert_true(test_daemon_log_contains(&daemon_, "moved it aside to"));
        assert_int_equal(access(path, F_OK), -1);

        /* run-time guarantees that no longer fit: kept, and the log says the job they name is refused (it is) */
        f = fopen(path, "w");
        assert_non_null(f);
        fputs("[quota]\njob = greedy\nhost_min = 200G\nhost = 200G\n", f);
        fclose(f);
        restart();
        assert_true(test_daemon_log_contains(&daemon_, "they are kept, and a job whose guarantee does not fit is "
                                                       "refused when it starts"));
        /* and a reload still applies the file (it was refused for them, whatever it changed) */
        assert_int_equal(kill(daemon_.pid, SIGHUP), 0);
        assert_true(test_daemon_wait_notify(&daemon_, "READY=1", 10000) >= 0);
        assert_true(test_daemon_log_contains(&daemon_, "Reload: the quotas set at run time"));
        assert_true(test_daemon_log_contains(&daemon_, "Configuration reloaded"));
        {
                tier_client *g = NULL;

                assert_int_equal(tier_client_new(daemon_.socket, "greedy", 0, &g), -ENOSPC);
                assert_non_null(strstr(tier_client_last_error(g), "guarantees would add up to"));
                assert_non_null(strstr(tier_client_last_error(g), "tierctl quota set"));
                tier_client_free(g);
        }
        assert_int_equal(tierctl(NULL, NULL, "quota set greedy --host-min 1M --host 8M"), 0);
        c = connect_job("greedy");
        tier_client_free(c);
        assert_int_equal(tierctl(NULL, NULL, "quota set greedy --clear"), 0);
}

/* ---- a reload re-applies tierd.conf's quotas ---------------------------------------------------- */

static void test_reload(void **state) {
        char body[2300];
        tier_client *c = connect_job("reloaded");
        struct tier_quota q;

        assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
        assert_int_equal(q.max[TIER_HOST], 24 * MiB);
        (void) snprintf(body, sizeof(body), "[quota]\njob = reloaded\nhost = 12M\nweight = 5\n");
        assert_int_equal(test_daemon_write_config(&daemon_, "50-quota.conf", body), 0);
        assert_int_equal(kill(daemon_.pid, SIGHUP), 0);
        assert_true(test_daemon_wait_notify(&daemon_, "READY=1", 10000) >= 0);
        assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
        assert_int_equal(q.max[TIER_HOST], 12 * MiB);
        assert_int_equal(q.weight, 5);
        assert_string_equal(q.max_from[TIER_HOST], "job 'reloaded' (tierd.conf)");
        assert_true(test_daemon_log_contains(&daemon_, "Job 'reloaded': host limit 24M -> 12M (job 'reloaded' "
                                                       "(tierd.conf))"));
        /* guarantees over the capacity: the reload is refused, the running quotas stay */
        assert_int_equal(test_daemon_write_config(&daemon_, "50-quota.conf",
                                                  "[quota]\njob = reloaded\nhost_min = 70M\nhost = 12M\n"), 0);
        assert_int_equal(kill(daemon_.pid, SIGHUP), 0);
        assert_true(test_daemon_wait_notify(&daemon_, "READY=1", 10000) >= 0);
        assert_true(test_daemon_log_contains(&daemon_, "Invalid configuration, keeping the running one"));
        assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
        assert_int_equal(q.max[TIER_HOST], 12 * MiB);

        /* a FIFO as a drop-in (nobody writes it): the reload is refused, not hung; tierd answers */
        {
                char fifo[700];

                assert_int_equal(test_daemon_write_config(&daemon_, "50-quota.conf",
                                                          "[quota]\njob = reloaded\nhost = 12M\n"), 0);
                (void) snprintf(fifo, sizeof(fifo), "%s.d/60-fifo.conf", daemon_.config);
                assert_int_equal(mkfifo(fifo, 0644), 0);
                assert_int_equal(kill(daemon_.pid, SIGHUP), 0);
                assert_true(test_daemon_wait_notify(&daemon_, "READY=1", 10000) >= 0);
                assert_true(test_daemon_log_contains(&daemon_, "60-fifo.conf: not a regular file"));
                assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
                assert_int_equal(q.max[TIER_HOST], 12 * MiB);
                assert_int_equal(unlink(fifo), 0);
        }
        tier_client_free(c);
}

/* ---- a quota set during linger carries into the re-run, and says so -------------------------------- */

static void test_linger_rerun(void **state) {
        tier_client *c = connect_job("rerun");
        struct tier_quota q;
        tier_tensor *t;

        if (geteuid() != 0) {
                tier_client_free(c);
                is_root("test_linger_rerun");
                skip();
        }
        assert_int_equal(tier_tensor_create(c, "kept", 1 * MiB, &t), 0);
        tier_tensor_close(t);
        tier_client_free(c);
        /* lingering now (linger_sec = 60): set a quota on its name */
        assert_int_equal(tierctl(NULL, NULL, "quota set rerun --host 16M"), 0);
        c = connect_job("rerun");
        assert_true(test_daemon_log_contains(&daemon_, "Job 'rerun' resumed: 1 tensor(s) kept from its previous run"));
        assert_int_equal(tier_quota_get(c, TIER_QUOTA_JOB, 0, NULL, &q), 0);
        assert_int_equal(q.max[TIER_HOST], 16 * MiB);
        assert_string_equal(q.max_from[TIER_HOST], "job 'rerun'");
        tier_client_free(c);
}

/*
 * A lingering job yields its guarantee (other jobs may take it meanwhile); a rank attaching to it claims it
 * again, which must fit: refused, the job keeps lingering with its tensors.  It was taken back unchecked, and
 * the guarantees added up past the tier.
 */
static void test_linger_reattach_checked(void **state) {
        tier_client *a, *o[3];
        tier_tensor *t;
        char *err = NULL;

        if (!is_root("test_linger_reattach_checked"))
                skip();
        /* every job of uid 0 is guaranteed 20M of the 64M host tier; 'named' (tierd.conf) 4M */
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid 0 --host-min 20M"), 0);
        a = connect_job("yielder");
        assert_int_equal(tier_tensor_create(a, "kept", 1 * MiB, &t), 0);
        tier_tensor_close(t);
        tier_client_free(a);                    /* lingers (linger_sec = 60): its 20M yielded */
        for (unsigned i = 0; i < 3; i++) {
                char job[16];

                (void) snprintf(job, sizeof(job), "taker-%u", i);
                o[i] = connect_job(job);        /* 3 x 20M + 4M = 64M */
        }
        a = NULL;
        assert_int_equal(tier_client_new(daemon_.socket, "yielder", 0, &a), -ENOSPC);
        assert_null(a);
        err = strdup(tier_client_last_error(NULL));     /* (a failed tier_client_new() leaves its error there) */
        assert_non_null(strstr(err, "cannot attach to job 'yielder'"));
        assert_non_null(strstr(err, "it keeps its tensors while it lingers"));
        free(err);
        tier_client_free(o[2]);                 /* one ends (it lingers too, yielding): now it fits */
        a = connect_job("yielder");
        assert_true(test_daemon_log_contains(&daemon_, "Job 'yielder' resumed: 1 tensor(s) kept from its previous run"));
        tier_client_free(a);
        tier_client_free(o[0]);
        tier_client_free(o[1]);
}

/* ---- only admins set; anyone reads their own ------------------------------------------------------- */

static void test_non_admin(void **state) {
        tier_client *a;
        pid_t pid;
        int st;

        if (geteuid() != 0) {
                /* we are the non-admin: setting is refused, reading our own works */
                struct tier_quota q = { .weight = 2 }, now;

                a = connect_job("mine");
                assert_int_equal(tier_quota_set(a, TIER_QUOTA_JOB, 0, "mine", &q, &now), -EPERM);
                assert_contains(tier_client_last_error(a), "may not set the quota of job 'mine'");
                assert_int_equal(tier_quota_get(a, TIER_QUOTA_UID, (uint32_t) getuid(), NULL, &now), 0);
                assert_int_equal(tier_quota_get(a, TIER_QUOTA_UID, 0, NULL, &now), -EPERM);
                tier_client_free(a);
                return;
        }
        /* held in a global: the forked child leaves it alone, and valgrind sees it reachable there */
        a = roots_ = connect_job("roots");
        assert_int_equal(chmod(daemon_.dir, 0711), 0);
        assert_int_equal(chmod(daemon_.socket, 0666), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                struct tier_quota q = { .weight = 2 }, now;
                tier_client *x = NULL;

                if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
                        _exit(3);
                if (tier_client_new(daemon_.socket, "", 0, &x) < 0)
                        _exit(4);
                if (tier_quota_set(x, TIER_QUOTA_JOB, 0, "roots", &q, &now) != -EPERM ||
                    !strstr(tier_client_last_error(x), "uid 65534 (pid "))
                        _exit(5);
                if (tier_quota_set(x, TIER_QUOTA_UID, 65534, NULL, &q, &now) != -EPERM)
                        _exit(6);
                if (tier_quota_get(x, TIER_QUOTA_JOB, 0, "roots", &now) != -EPERM ||
                    !strstr(tier_client_last_error(x), "read the quota of job 'roots'"))
                        _exit(7);
                if (tier_quota_get(x, TIER_QUOTA_UID, 0, NULL, &now) != -EPERM)
                        _exit(8);
                if (tier_quota_get(x, TIER_QUOTA_UID, 65534, NULL, &now) != 0)
                        _exit(9);
                if (tier_quota_get(x, TIER_QUOTA_DEFAULT, 0, NULL, &now) != 0)
                        _exit(10);
                tier_client_free(x);
                _exit(0);
        }
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        assert_true(test_daemon_log_contains(&daemon_, "(uid 65534, pid "));
        assert_true(test_daemon_log_contains(&daemon_, "denied: set the quota of job 'roots' needs root or membership "
                                                       "of group tier-admin"));
        tier_client_free(a);
        roots_ = NULL;
}

/* ---- a uid's jobs together: at most its total; root's job then gets what it needs ---------------- */

/* In a child of uid 65534: 8 jobs pin 4M tensors in host until refused; what they hold, to @out; then wait on @in. */
static int hog(int out, int in) {
        tier_client *c[9] = {};
        uint64_t held = 0;
        int r = 0, last = 0;
        char msg[1024] = "", go;
        tier_tensor *handles[64];
        unsigned n_held = 0;

        if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
                return 3;
        for (unsigned i = 0; i < 8; i++) {
                char name[16];

                (void) snprintf(name, sizeof(name), "hog-%u", i);
                if (tier_client_new(daemon_.socket, name, 0, &c[i]) < 0)
                        return 4;
                for (unsigned k = 0;; k++) {
                        struct tier_grant g;
                        tier_tensor *t;

                        (void) snprintf(name, sizeof(name), "t%u", k);
                        if (n_held == ELEMENTSOF(handles) || tier_tensor_create(c[i], name, 4 * MiB, &t) < 0)
                                return 5;
                        handles[n_held++] = t;
                        last = tier_pin(t, TIER_HOST, TIER_WRITE, &g);
                        if (last < 0) {
                                (void) snprintf(msg, sizeof(msg), "%s", tier_client_last_error(c[i]));
                                break;
                        }
                        held += 4 * MiB;
                }
        }
        /* four of them end and linger (60 s): what they hold still counts */
        for (unsigned i = 4; i < 8; i++) {
                tier_client_free(c[i]);
                c[i] = NULL;
        }
        if (tier_client_new(daemon_.socket, "hog-8", 0, &c[8]) < 0)
                return 6;
        {
                struct tier_grant g;
                tier_tensor *t;

                if (n_held == ELEMENTSOF(handles) || tier_tensor_create(c[8], "t", 4 * MiB, &t) < 0)
                        return 7;
                handles[n_held++] = t;
                r = tier_pin(t, TIER_HOST, TIER_WRITE, &g);
        }
        if (dprintf(out, "%" PRIu64 " %d %d %s\n", held, last, r, msg) < 0)
                return 8;
        if (read(in, &go, 1) != 1)
                return 9;
        for (unsigned i = 0; i < n_held; i++)
                tier_tensor_close(handles[i]);         /* before their clients go (valgrind counts them) */
        for (unsigned i = 0; i < 9; i++)
                tier_client_free(c[i]);
        return 0;
}

static void test_uid_total(void **state) {
        int up[2], down[2], st, last = 0, r = 0;
        char line[1400] = "", *msg;
        unsigned long long held = 0;
        tier_client *root;
        pid_t pid;
        FILE *f;

        if (!is_root("test_uid_total"))
                skip();
        assert_int_equal(chmod(daemon_.dir, 0711), 0);
        assert_int_equal(chmod(daemon_.socket, 0666), 0);
        assert_int_equal(pipe2(up, O_CLOEXEC), 0);
        assert_int_equal(pipe2(down, O_CLOEXEC), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                _exit(hog(up[1], down[0]));
        close(up[1]);
        close(down[0]);
        f = fdopen(up[0], "r");
        assert_non_null(f);
        if (!fgets(line, sizeof(line), f)) {
                assert_int_equal(waitpid(pid, &st, 0), pid);
                fail_msg("the hog said nothing (exit %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        }
        assert_int_equal(sscanf(line, "%llu %d %d", &held, &last, &r), 3);
        msg = strchr(line, ' ');
        /* [host] uid_share = 50 of 64M: the eight jobs hold 32M between them, and are told why not more */
        assert_true(held <= 32 * MiB);
        assert_int_equal(held, 32 * MiB);
        assert_int_equal(last, -EDQUOT);
        assert_non_null(strstr(msg, "uid 65534 is at its host total: its 8 job(s) use 32.0 MiB of 32.0 MiB "
                                    "([host] uid_share, 50 % of 64.0 MiB)"));
        assert_non_null(strstr(msg, "tierctl quota set --uid 65534 --host-total SIZE"));
        /* lingering jobs count: a ninth job gets nothing (what the first job holds is pinned) */
        assert_int_equal(r, -EDQUOT);

        /* root's job (not held to the share) pins what its own limit allows, 24M */
        root = connect_job("root-needs");
        for (unsigned k = 0; k < 6; k++) {
                struct tier_grant g;
                tier_tensor *t;
                char name[16];

                (void) snprintf(name, sizeof(name), "r%u", k);
                assert_int_equal(tier_tensor_create(root, name, 4 * MiB, &t), 0);
                assert_int_equal(tier_pin(t, TIER_HOST, TIER_WRITE, &g), 0);
                tier_tensor_close(t);
        }
        tier_client_free(root);
        assert_int_equal(write(down[1], "x", 1), 1);
        close(down[1]);
        fclose(f);
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
}

/* A total set at run time holds for root too (configured, not a default), names itself, and 0 lifts it. */
static void test_total_set(void **state) {
        tier_client *c;
        tier_tensor *t[3];
        struct tier_grant g;
        char *out = NULL;

        if (!is_root("test_total_set"))
                skip();
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid 0 --host-total 8M"), 0);
        assert_int_equal(tierctl(&out, NULL, "quota get --uid 0"), 0);
        assert_non_null(strstr(out, "host   total 8.0 MiB for all its jobs (from: uid 0)"));
        free(out);
        c = connect_job("capped");
        for (unsigned k = 0; k < 3; k++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "c%u", k);
                assert_int_equal(tier_tensor_create(c, name, 4 * MiB, &t[k]), 0);
        }
        assert_int_equal(tier_pin(t[0], TIER_HOST, TIER_WRITE, &g), 0);
        assert_int_equal(tier_pin(t[1], TIER_HOST, TIER_WRITE, &g), 0);
        assert_int_equal(tier_pin(t[2], TIER_HOST, TIER_WRITE, &g), -EDQUOT);
        assert_non_null(strstr(tier_client_last_error(c), "uid 0 is at its host total: its 1 job(s) use 8.0 MiB of "
                                                          "8.0 MiB (host_total of its [quota])"));
        /* an unpinned copy of its own makes way (it goes to NVMe) */
        assert_int_equal(tier_unpin(t[0], TIER_HOST, 1), 0);
        assert_int_equal(tier_pin(t[2], TIER_HOST, TIER_WRITE, &g), 0);
        assert_int_equal(tier_unpin(t[2], TIER_HOST, 1), 0);
        /* lifted: all three fit */
        assert_int_equal(tierctl(&out, NULL, "quota set --uid 0 --host-total 0 --json"), 0);
        assert_non_null(strstr(out, "\"host\":{\"total\":0,"));
        free(out);
        assert_int_equal(tier_pin(t[0], TIER_HOST, TIER_READ, &g), 0);
        assert_int_equal(tier_pin(t[2], TIER_HOST, TIER_READ, &g), 0);
        /* and refused where it means nothing */
        assert_int_equal(tierctl(NULL, NULL, "quota set capped --host-total 4M"), 2);
        for (unsigned k = 0; k < 3; k++)
                tier_tensor_close(t[k]);
        tier_client_free(c);
}

/*
 * Jobs under one total share it as they share the pool: a job's cache (copies it does not pin) that fills
 * the total gives way to another job of the uid below its part, written down to NVMe and not lost; what is
 * pinned does not.
 */
static void test_total_shared(void **state) {
        tier_client *a, *b;
        tier_tensor *ta[2], *tb;
        struct tier_grant g;

        if (!is_root("test_total_shared"))
                skip();
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid 0 --host-total 8M"), 0);
        a = connect_job("cache-a");
        b = connect_job("cache-b");
        for (unsigned k = 0; k < 2; k++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "a%u", k);
                assert_int_equal(tier_tensor_create(a, name, 4 * MiB, &ta[k]), 0);
                assert_int_equal(tier_pin(ta[k], TIER_HOST, TIER_WRITE, &g), 0);
                memset(g.ptr, 'a' + (int) k, 4 * MiB);
        }
        assert_int_equal(tier_tensor_create(b, "b", 4 * MiB, &tb), 0);
        /* a's copies pinned: nothing to give */
        assert_int_equal(tier_pin(tb, TIER_HOST, TIER_WRITE, &g), -EDQUOT);
        assert_non_null(strstr(tier_client_last_error(b), "uid 0 is at its host total: its 2 job(s) use 8.0 MiB"));
        /* unpinned, they are a cache: b (below its part, 4M of 8M) takes the room */
        assert_int_equal(tier_unpin(ta[0], TIER_HOST, 1), 0);
        assert_int_equal(tier_unpin(ta[1], TIER_HOST, 1), 0);
        assert_int_equal(tier_pin(tb, TIER_HOST, TIER_WRITE, &g), 0);
        memset(g.ptr, 'b', 4 * MiB);
        /* a's bytes came through NVMe whole; b's pin holds, so a makes room among its own copies */
        for (unsigned k = 0; k < 2; k++) {
                unsigned char *p;

                assert_int_equal(tier_pin(ta[k], TIER_HOST, TIER_READ, &g), 0);
                p = g.ptr;
                assert_int_equal(p[0], 'a' + k);
                assert_int_equal(p[4 * MiB - 1], 'a' + k);
                assert_int_equal(tier_unpin(ta[k], TIER_HOST, 0), 0);
        }
        assert_int_equal(tier_unpin(tb, TIER_HOST, 1), 0);
        for (unsigned k = 0; k < 2; k++)
                tier_tensor_close(ta[k]);
        tier_tensor_close(tb);
        tier_client_free(a);
        tier_client_free(b);
}

/* In a child: job 'planned' submits a plan of one phase that writes a 4M tensor in host and enters it. */
static int planned_child(int out) {
        tier_client *c = NULL;
        tier_tensor *t;
        tier_plan *p;
        int r;

        if (tier_client_new(daemon_.socket, "planned", 0, &c) < 0 || tier_tensor_create(c, "p", 4 * MiB, &t) < 0 ||
            tier_plan_new(c, &p) < 0 || tier_plan_add(p, 0, t, TIER_HOST, TIER_WRITE) < 0 || tier_plan_submit(p) < 0)
                return 3;
        if (write(out, "e", 1) != 1)
                return 4;
        r = tier_phase_enter(c, 0);
        if (dprintf(out, "%d\n", r) < 0)
                return 5;
        tier_tensor_close(t);   /* (the plan is the client's once submitted) */
        tier_client_free(c);
        return 0;
}

/*
 * A plan's phase refused room because its uid's total is full of what another job pins waits for that job
 * to let go (a phase that fits the total alone); it used to fail the plan for good with -EDQUOT.
 */
static void test_total_plan_waits(void **state) {
        tier_client *a;
        tier_tensor *ta[2];
        struct tier_grant g;
        int up[2], st, r = 1;
        char ch, line[32] = "";
        pid_t pid;
        FILE *f;

        if (!is_root("test_total_plan_waits"))
                skip();
        assert_int_equal(tierctl(NULL, NULL, "quota set --uid 0 --host-total 8M"), 0);
        a = connect_job("holder");
        for (unsigned k = 0; k < 2; k++) {
                char name[8];

                (void) snprintf(name, sizeof(name), "h%u", k);
                assert_int_equal(tier_tensor_create(a, name, 4 * MiB, &ta[k]), 0);
                assert_int_equal(tier_pin(ta[k], TIER_HOST, TIER_WRITE, &g), 0);
        }
        assert_int_equal(pipe2(up, O_CLOEXEC), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
                _exit(planned_child(up[1]));
        close(up[1]);
        f = fdopen(up[0], "r");
        assert_non_null(f);
        assert_int_equal(fread(&ch, 1, 1, f), 1);
        /* tierd has tried the phase's pin and holds it back (or, before, failed the plan: the child says so) */
        for (unsigned i = 0; i < 2000 && !test_daemon_log_contains(&daemon_, "waits for room under a total for 'p'");
             i++) {
                struct timeval tv = { 0, 10000 };
                fd_set fds;

                FD_ZERO(&fds);
                FD_SET(up[0], &fds);
                if (select(up[0] + 1, &fds, NULL, NULL, &tv) > 0)
                        break;          /* the child returned: the plan failed */
        }
        assert_true(test_daemon_log_contains(&daemon_, "waits for room under a total for 'p'"));
        /* the holder lets go of one: the phase gets its room */
        assert_int_equal(tier_unpin(ta[0], TIER_HOST, 1), 0);
        assert_non_null(fgets(line, sizeof(line), f));
        assert_int_equal(sscanf(line, "%d", &r), 1);
        assert_int_equal(r, 0);
        fclose(f);
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        for (unsigned k = 0; k < 2; k++)
                tier_tensor_close(ta[k]);
        tier_client_free(a);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_uid_default_applies, setup, teardown),
                cmocka_unit_test_setup_teardown(test_many_groups, setup, teardown),
                cmocka_unit_test_setup_teardown(test_precedence, setup, teardown),
                cmocka_unit_test_setup_teardown(test_live_change, setup, teardown),
                cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_admission, setup, teardown),
                cmocka_unit_test_setup_teardown(test_restart, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reload, setup, teardown),
                cmocka_unit_test_setup_teardown(test_linger_rerun, setup, teardown),
                cmocka_unit_test_setup_teardown(test_linger_reattach_checked, setup, teardown),
                cmocka_unit_test_setup_teardown(test_nvme_min_kept, setup, teardown),
                cmocka_unit_test_setup_teardown(test_nvme_min_reload, setup, teardown),
                cmocka_unit_test_setup_teardown(test_non_admin, setup, teardown),
                cmocka_unit_test_setup_teardown(test_uid_total, setup, teardown),
                cmocka_unit_test_setup_teardown(test_total_set, setup, teardown),
                cmocka_unit_test_setup_teardown(test_total_shared, setup, teardown),
                cmocka_unit_test_setup_teardown(test_total_plan_waits, setup, teardown),
        };

        return cmocka_run_group_tests_name("quota", tests, NULL, NULL);
}
