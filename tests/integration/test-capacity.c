/* SPDX-License-Identifier: MIT */
/* test-capacity.c: a real tierd refuses, before making any pool, capacities this machine cannot give. */

/*
 * Each refusal is checked end to end: tierd exits soon with status 6, the
 * configuration refused, which the unit does not restart (not 1, a failure
 * Restart=on-failure retries; not 137: nothing was allocated for the OOM
 * killer to find), its log has the
 * one line naming the key, no target file was created, and --check-config
 * prints the same line.  The rules and their exact messages are the unit
 * test's (tests/unit/test-capacity.c); here the facts are this machine's.
 *
 * The memory cgroup case needs root and cgroup v1's memory controller at
 * /sys/fs/cgroup/memory (the test makes a cgroup there with a 256M limit
 * and starts tierd in it); it is skipped otherwise.  On a cgroup v2 machine
 * check it by hand with systemd:
 *
 *     systemd-run --user --scope -p MemoryMax=256M \
 *             build/daemon/tierd --config my.conf --check-config
 *
 * with "[host] capacity = 512M" in my.conf: tierd must print "... is more
 * than tierd's memory cgroup allows: limit 256.0 MiB (.../memory.max) ..."
 * and exit 6.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <cmocka.h>

#include "proto/macro.h"
#include "tests/helpers/harness.h"

#define MiB (UINT64_C(1024) * 1024)
#define GiB (MiB * 1024)
#define TiB (GiB * 1024)

/* How long a refusal may take: it comes before any pool is made. */
#define REFUSE_TIMEOUT_MS 10000

/* A config whose host pool is @HOST; everything else small. */
#define CONFIG(HOST, TARGET)                    \
        "[host]\n"                              \
        "capacity = " HOST "\n"                 \
        "segment_size = 8M\n"                   \
        "job_limit = 8M\n"                      \
        "[vram]\n"                              \
        "backend = emulated\n"                  \
        "capacity = 16M\n"                      \
        "chunk_size = 4M\n"                     \
        "job_limit = 8M\n"                      \
        "[nvme]\n"                              \
        "target = @DIR@/t0.img:" TARGET "\n"

static TestDaemon d;

static int teardown(void **state) {
        test_daemon_cleanup(&d);
        return 0;
}

static uint64_t meminfo(const char *key) {
        char line[256], k[64];
        uint64_t kb, v = 0;
        FILE *f = fopen("/proc/meminfo", "re");

        assert_non_null(f);
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "%63[^:]: %" SCNu64, k, &kb) == 2 && strcmp(k, key) == 0)
                        v = kb * 1024;
        fclose(f);
        return v;
}

/* How many lines of tierd's log contain @needle. */
static unsigned log_count(const char *needle) {
        char line[4096];
        unsigned n = 0;
        FILE *f = fopen(d.log, "re");

        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strstr(line, needle))
                        n++;
        fclose(f);
        return n;
}

/* tierd(8) EXIT STATUS: the configuration refused (RestartPreventExitStatus= in the unit). */
#define EXIT_CONFIG_REFUSED 6

/*
 * A start that cannot give the capacities asked exits 1, not EXIT_CONFIG_REFUSED: what is free may
 * change (memory in use, free space), and Restart= may try again; --check-config says 6.
 */
#define EXIT_CAPACITY 1

/* Start tierd (with @args) and expect it to exit with @want soon, without READY=1. */
static void expect_exit(const char *const *args, int want) {
        TestDaemonOptions o = { .args = args };
        int status;

        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        status = test_daemon_kill(&d, 0, REFUSE_TIMEOUT_MS);
        if (status != want)
                test_daemon_dump_log(&d);
        assert_int_equal(status, want);
        assert_int_equal(test_daemon_find_notify(&d, "READY=1"), -1);
}

/* tierd's log has @line exactly once; then run --check-config, whose output must have it once more. */
static void expect_refusal_line(const char *line) {
        static const char *const check[] = { "--check-config", NULL };

        if (log_count(line) != 1) {
                test_daemon_dump_log(&d);
                fail_msg("the log does not have \"%s\" once", line);
        }
        expect_exit(check, EXIT_CONFIG_REFUSED);
        assert_int_equal(log_count(line), 2);
}

/* The value tierd's log suggests for "set [host] capacity = ", into @buf. */
static void suggested_host_capacity(char *buf, size_t size) {
        static const char key[] = "set [host] capacity = ";
        char line[4096], *p = NULL;
        FILE *f = fopen(d.log, "re");

        assert_non_null(f);
        while (!p && fgets(line, sizeof(line), f))
                p = strstr(line, key);
        fclose(f);
        assert_non_null(p);
        p += strlen(key);
        p[strcspn(p, " ;,\n")] = '\0';
        snprintf(buf, size, "%s", p);
}

static void test_host_above_ram(void **state) {
        static const char *const check[] = { "--check-config", NULL };
        TestDaemonOptions o = { .args = check };
        char target[300], suggested[32], config[1024];

        if (meminfo("MemAvailable") / 10 * 9 >= TiB)
                skip();         /* this machine can give 1T */

        assert_int_equal(test_daemon_init(&d, CONFIG("1T", "64M")), 0);
        expect_exit(NULL, EXIT_CAPACITY);
        expect_refusal_line("[host] capacity = 1T with the emulated [vram] capacity = 16M (host memory too) is "
                            "more than this machine can hold: MemAvailable ");
        assert_true(test_daemon_log_contains(&d, "for both (90% of MemAvailable); set [host] capacity = "));
        snprintf(target, sizeof(target), "%s/t0.img", d.dir);
        assert_int_equal(access(target, F_OK), -1);

        /* the value it suggests passes (checked only: a pool that big is not made here) */
        suggested_host_capacity(suggested, sizeof(suggested));
        snprintf(config, sizeof(config), CONFIG("%s", "64M"), suggested);
        assert_int_equal(test_daemon_write_config(&d, NULL, config), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        assert_int_equal(test_daemon_kill(&d, 0, REFUSE_TIMEOUT_MS), 0);
}

static void test_target_above_free_space(void **state) {
        char config[1024], size[32], target[300], line[700];
        struct statvfs vfs;
        uint64_t free_bytes;

        assert_int_equal(test_daemon_init(&d, ""), 0);
        assert_int_equal(statvfs(d.dir, &vfs), 0);
        free_bytes = (uint64_t) vfs.f_bavail * vfs.f_frsize;
        /* well above what is free, whatever else writes meanwhile */
        snprintf(size, sizeof(size), "%" PRIu64 "G", free_bytes / GiB + 64);
        snprintf(config, sizeof(config), CONFIG("64M", "%s"), size);
        assert_int_equal(test_daemon_write_config(&d, NULL, config), 0);

        expect_exit(NULL, EXIT_CAPACITY);
        snprintf(target, sizeof(target), "%s/t0.img", d.dir);
        snprintf(line, sizeof(line), "[nvme] target = %s:%s is more than the filesystem can hold: ", target, size);
        expect_refusal_line(line);
        snprintf(line, sizeof(line), " free on %s; at most about ", d.dir);
        assert_true(test_daemon_log_contains(&d, line));
        assert_int_equal(access(target, F_OK), -1);
}

static void test_capacity_that_passes(void **state) {
        static const char *const check[] = { "--check-config", NULL };
        TestDaemonOptions o = { .args = check };

        /* --check-config first: exit 0, nothing refused */
        assert_int_equal(test_daemon_init(&d, CONFIG("64M", "64M")), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        assert_int_equal(test_daemon_kill(&d, 0, REFUSE_TIMEOUT_MS), 0);
        assert_false(test_daemon_log_contains(&d, "is more than"));
        test_daemon_cleanup(&d);

        assert_int_equal(test_daemon_start(&d, CONFIG("64M", "64M")), 0);
        assert_false(test_daemon_log_contains(&d, "is more than"));
        assert_int_equal(test_daemon_stop(&d), 0);
}

/* A reload keeps the running pools; it says that a restart would refuse the new file. */
/* --check-config checks that [quota]'s guarantees fit, as the start does (it said the file was fine). */
static void test_check_config_quotas(void **state) {
        static const char *const check[] = { "--check-config", NULL };

        assert_int_equal(test_daemon_init(&d, CONFIG("64M", "64M") "[quota]\njob = big\nhost_min = 100M\nhost = 100M\n"),
                         0);
        expect_exit(check, EXIT_CONFIG_REFUSED);
        assert_true(test_daemon_log_contains(&d, "Invalid configuration: [quota]: host guarantees would add up to "
                                                 "100.0 MiB of 64.0 MiB"));
        expect_exit(NULL, EXIT_CONFIG_REFUSED);           /* and a start */
        assert_int_equal(test_daemon_write_config(&d, NULL, CONFIG("64M", "64M") "[quota]\njob = big\n"
                                                                                   "host_min = 60M\nhost = 60M\n"), 0);
        {
                TestDaemonOptions o = { .args = check };

                assert_int_equal(test_daemon_spawn(&d, &o), 0);
                assert_int_equal(test_daemon_kill(&d, 0, REFUSE_TIMEOUT_MS), 0);
        }
}

static char *slurp(const char *path, size_t *len) {
        FILE *f = fopen(path, "re");
        char *buf = NULL;

        *len = 0;
        if (!f)
                return NULL;
        buf = malloc(1 << 20);
        assert_non_null(buf);
        *len = fread(buf, 1, 1 << 20, f);
        fclose(f);
        return buf;
}

/*
 * An invalid file, and a file named with --config that is missing, are refused with the same status.
 * The invalid value is of a key CONFIG() does not set: "[host] job_limit = lots" after CONFIG()'s own
 * job_limit line was refused as a key set twice, never reaching the value.
 */
static void test_invalid_config_refused(void **state) {
        static const char *const missing[] = { "--config", "/nonexistent/tierd.conf", NULL };

        assert_int_equal(test_daemon_init(&d, CONFIG("64M", "64M") "job_limit = lots\n"), 0);
        expect_exit(NULL, EXIT_CONFIG_REFUSED);
        assert_true(test_daemon_log_contains(&d, "[nvme] job_limit: invalid size 'lots'"));
        expect_exit(missing, EXIT_CONFIG_REFUSED);
}

/* Spawn @x (@args) and expect exit status 1 with @line in its log, before READY=1. */
static void refused(TestDaemon *x, const char *const *args, const char *line) {
        TestDaemonOptions o = { .args = args };

        assert_int_equal(test_daemon_spawn(x, &o), 0);
        if (test_daemon_kill(x, 0, REFUSE_TIMEOUT_MS) != 1 || !test_daemon_log_contains(x, line)) {
                test_daemon_dump_log(x);
                fail_msg("tierd did not exit 1 with \"%s\"", line);
        }
        assert_int_equal(test_daemon_find_notify(x, "READY=1"), -1);
}

/*
 * One tierd per state directory and per target.  A second tierd on a running one's state directory
 * (another socket) is refused before it reads anything there: it used to replay and rewrite the NVMe
 * index, rewinding the running one's.  A second one with its own state directory but the running
 * one's target is refused, and so is a configuration naming one target twice under two paths (two
 * targets striped over one file: each overwrote the other's extents).
 */
static void test_one_tierd_per_state_dir_and_target(void **state) {
        TestDaemon d2 = {}, d3 = {};
        char body[1024], path[600];
        char *idx0, *idx1, *after0, *after1;
        size_t n0, n1, m0, m1;

        assert_int_equal(test_daemon_start(&d, CONFIG("64M", "64M")), 0);
        snprintf(path, sizeof(path), "%s/nvme-index.0", d.dir);
        idx0 = slurp(path, &n0);
        snprintf(path, sizeof(path), "%s/nvme-index.1", d.dir);
        idx1 = slurp(path, &n1);

        {
                const char *const args[] = { "--state-dir", d.dir, NULL };

                snprintf(body, sizeof(body), CONFIG("64M", "64M"));
                assert_int_equal(test_daemon_init(&d2, body), 0);
                refused(&d2, args, "Another tierd runs on the state directory");
        }
        snprintf(path, sizeof(path), "%s/nvme-index.0", d.dir);
        after0 = slurp(path, &m0);
        snprintf(path, sizeof(path), "%s/nvme-index.1", d.dir);
        after1 = slurp(path, &m1);
        assert_true(n0 == m0 && (!n0 || memcmp(idx0, after0, n0) == 0));
        assert_true(n1 == m1 && (!n1 || memcmp(idx1, after1, n1) == 0));

        /* its own state directory, the running one's target */
        snprintf(body, sizeof(body), CONFIG("64M", "64M") "target = %s/t0.img\n", d.dir);
        assert_int_equal(test_daemon_write_config(&d2, NULL, body), 0);
        refused(&d2, NULL, "/t0.img is in use: another tierd holds it");

        /* one target under two paths */
        assert_int_equal(test_daemon_init(&d3, CONFIG("64M", "64M") "target = @DIR@/./t0.img\n"), 0);
        refused(&d3, NULL, "/./t0.img is in use: another tierd holds it, or [nvme] target names the same file");

        /* the running one is untouched */
        {
                char *st = test_daemon_tierctl_json(&d);

                assert_non_null(st);
                free(st);
        }
        assert_int_equal(test_daemon_stop(&d), 0);
        test_daemon_cleanup(&d2);
        test_daemon_cleanup(&d3);
        free(idx0);
        free(idx1);
        free(after0);
        free(after1);
}

/* Nothing in @x's state directory but what the harness put there: no target, no NVMe index, no wear book. */
static void made_nothing(const TestDaemon *x) {
        static const char *const files[] = { "t0.img", "nvme-index.0", "nvme-index.1", "wear" };
        char path[600];

        for (size_t i = 0; i < ELEMENTSOF(files); i++) {
                snprintf(path, sizeof(path), "%s/%s", x->dir, files[i]);
                if (access(path, F_OK) == 0)
                        fail_msg("%s was made by a tierd that refused to start", path);
        }
}

/*
 * A socket tierd cannot serve on is refused before it makes anything: another tierd answering at
 * the path (its own state directory and target), or a file that is not a socket there.  Both were
 * found only once the pools, the target file, the NVMe index and the wear book were made: a
 * preallocated target left behind, and a large host pool locked (seconds a GiB) for nothing.
 */
static void test_busy_socket_refused_first(void **state) {
        TestDaemon d2 = {};
        char sock[300];
        int fd;

        assert_int_equal(test_daemon_start(&d, CONFIG("64M", "64M")), 0);
        {
                const char *const args[] = { "--socket", d.socket, NULL };

                assert_int_equal(test_daemon_init(&d2, CONFIG("64M", "64M")), 0);
                refused(&d2, args, "Another tierd is already listening on");
                made_nothing(&d2);
        }
        snprintf(sock, sizeof(sock), "%s/not-a-socket", d2.dir);
        fd = open(sock, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);
        {
                const char *const args[] = { "--socket", sock, NULL };

                refused(&d2, args, "exists and is not a socket");
                made_nothing(&d2);
        }
        assert_int_equal(access(sock, F_OK), 0);
        test_daemon_cleanup(&d2);
        assert_int_equal(test_daemon_stop(&d), 0);
}

static void test_reload_warns(void **state) {
        _cleanup_free_ char *status = NULL;

        if (meminfo("MemAvailable") / 10 * 9 >= TiB)
                skip();

        assert_int_equal(test_daemon_start(&d, CONFIG("64M", "64M")), 0);
        assert_int_equal(test_daemon_write_config(&d, NULL, CONFIG("1T", "64M")), 0);
        kill(d.pid, SIGHUP);
        assert_true(test_daemon_wait_notify(&d, "RELOADING=1", 10000) >= 0);
        assert_true(test_daemon_wait_notify(&d, "READY=1", 10000) >= 0);
        assert_int_equal(log_count("tierd[warning]: Reload: [host] capacity = 1T with the emulated [vram] capacity "
                                   "= 16M (host memory too) is more than this machine can hold: MemAvailable "), 1);
        assert_int_equal(log_count("plus the 80.0 MiB tierd's running pools hold"), 1);
        assert_int_equal(log_count("; this takes effect only after a restart, which would refuse it, ignoring"), 1);
        /* still serving, with the old pool */
        status = test_daemon_tierctl_json(&d);
        assert_non_null(status);
        assert_int_equal(test_daemon_stop(&d), 0);
}

/* ---- the memory cgroup (v1), as root -------------------------------------------------------- */

#define CGROUP_V1 "/sys/fs/cgroup/memory"

static char cgroup[256];        /* the test's cgroup, "" when none */
static char home[512];          /* the cgroup.procs this process came from */

static int write_file(const char *path, const char *value) {
        int fd = open(path, O_WRONLY | O_CLOEXEC), r = 0;

        if (fd < 0)
                return -errno;
        if (write(fd, value, strlen(value)) < 0)
                r = -errno;
        close(fd);
        return r;
}

/* Move this process into the cgroup.procs file @procs. */
static int move_self(const char *procs) {
        char pid[32];

        snprintf(pid, sizeof(pid), "%d", (int) getpid());
        return write_file(procs, pid);
}

/* Where this process is in the v1 memory hierarchy ("/a/b"), into @buf; false if not v1. */
static bool memory_cgroup_of_self(char *buf, size_t size) {
        char line[1024];
        bool found = false;
        FILE *f = fopen("/proc/self/cgroup", "re");

        if (!f)
                return false;
        while (!found && fgets(line, sizeof(line), f)) {
                char *ctrl = strchr(line, ':'), *path;

                if (!ctrl || !(path = strchr(ctrl + 1, ':')))
                        continue;
                *path++ = '\0';
                path[strcspn(path, "\n")] = '\0';
                for (char *w = ctrl + 1, *save = NULL; (w = strtok_r(w, ",", &save)); w = NULL)
                        if (strcmp(w, "memory") == 0) {
                                snprintf(buf, size, "%s", path);
                                found = true;
                        }
        }
        fclose(f);
        return found;
}

static int cgroup_teardown(void **state) {
        if (home[0])
                (void) move_self(home);
        test_daemon_cleanup(&d);        /* tierd out of the cgroup first */
        if (cgroup[0])
                (void) rmdir(cgroup);
        cgroup[0] = home[0] = '\0';
        return 0;
}

static void test_cgroup_limit(void **state) {
        char self[256], file[320], line[512];
        struct stat st;
        int r;

        if (geteuid() != 0 || stat(CGROUP_V1 "/memory.limit_in_bytes", &st) < 0 ||
            !memory_cgroup_of_self(self, sizeof(self)))
                skip();         /* needs root and cgroup v1's memory controller: see the top of this file */

        snprintf(cgroup, sizeof(cgroup), CGROUP_V1 "/tierd-test-capacity-%d", (int) getpid());
        if (mkdir(cgroup, 0755) < 0) {
                cgroup[0] = '\0';
                skip();         /* a read-only or delegated hierarchy */
        }
        snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", cgroup);
        assert_int_equal(write_file(file, "268435456"), 0);
        snprintf(home, sizeof(home), CGROUP_V1 "%s/cgroup.procs", strcmp(self, "/") == 0 ? "" : self);

        assert_int_equal(test_daemon_init(&d, CONFIG("512M", "64M")), 0);
        /* tierd is forked in the cgroup; this process goes back at once */
        snprintf(file, sizeof(file), "%s/cgroup.procs", cgroup);
        assert_int_equal(move_self(file), 0);
        {
                TestDaemonOptions o = {};

                r = test_daemon_spawn(&d, &o);
        }
        assert_int_equal(move_self(home), 0);
        assert_int_equal(r, 0);
        r = test_daemon_kill(&d, 0, REFUSE_TIMEOUT_MS);
        if (r != EXIT_CAPACITY)
                test_daemon_dump_log(&d);
        assert_int_equal(r, EXIT_CAPACITY);

        snprintf(line, sizeof(line), "[host] capacity = 512M with the emulated [vram] capacity = 16M (host memory "
                 "too) is more than tierd's memory cgroup allows: limit 256.0 MiB (%s/memory.limit_in_bytes), ",
                 cgroup);
        if (log_count(line) != 1) {
                test_daemon_dump_log(&d);
                fail_msg("the log does not have \"%s\" once", line);
        }
        assert_true(test_daemon_log_contains(&d, "for both (90% of what the limit leaves); set "));
}

/* Make the test's cgroup, limited to @limit bytes; false (skip) when this machine has no v1 memory controller. */
static bool cgroup_make(const char *limit) {
        char self[256], file[320];
        struct stat st;

        if (geteuid() != 0 || stat(CGROUP_V1 "/memory.limit_in_bytes", &st) < 0 ||
            !memory_cgroup_of_self(self, sizeof(self)))
                return false;
        snprintf(cgroup, sizeof(cgroup), CGROUP_V1 "/tierd-test-capacity-%d", (int) getpid());
        if (mkdir(cgroup, 0755) < 0) {
                cgroup[0] = '\0';
                return false;
        }
        snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", cgroup);
        assert_int_equal(write_file(file, limit), 0);
        snprintf(home, sizeof(home), CGROUP_V1 "%s/cgroup.procs", strcmp(self, "/") == 0 ? "" : self);
        return true;
}

/* Spawn tierd in the test's cgroup (this process goes back at once). */
static int spawn_in_cgroup(const TestDaemonOptions *o) {
        char file[320];
        int r;

        snprintf(file, sizeof(file), "%s/cgroup.procs", cgroup);
        assert_int_equal(move_self(file), 0);
        r = test_daemon_spawn(&d, o);
        assert_int_equal(move_self(home), 0);
        return r;
}

/*
 * A restart with the memory store: the last run's pools, kept in the fd store, are in the cgroup's
 * usage still, and this start takes them back: the capacity check counts them as tierd's own.  A pool
 * above about half of what the limit leaves passed the first start and was refused at every restart
 * (systemctl restart, Restart=on-failure) until the start limit emptied the store.  Restarted with
 * persist = no, the store's memory is removed from the service manager's store, not left there.
 */
static void test_restart_with_store_in_cgroup(void **state) {
        TestDaemonOptions o = { .wait_ready = true };

        if (!cgroup_make("268435456"))
                skip();         /* needs root and cgroup v1's memory controller */
        assert_int_equal(test_daemon_init(&d, CONFIG("128M", "64M")), 0);      /* 144M of 256M */
        d.fd_store = true;
        assert_int_equal(spawn_in_cgroup(&o), 0);
        assert_int_equal(test_daemon_wait_stored(&d, "tierd-mem-host-", 16, 10000), 0);
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        if (spawn_in_cgroup(&o) != 0)
                fail_msg("the restart was refused");
        assert_false(test_daemon_log_contains(&d, "is more than tierd's memory cgroup allows"));
        assert_int_equal(test_daemon_kill(&d, SIGKILL, 10000), 128 + SIGKILL);
        assert_true(test_daemon_stored(&d, "tierd-mem-") > 0);

        assert_int_equal(test_daemon_write_config(&d, "nopersist.conf", "[nvme]\npersist = no\n"), 0);
        assert_int_equal(spawn_in_cgroup(&o), 0);
        test_daemon_drain(&d);
        assert_int_equal(test_daemon_stored(&d, "tierd-mem-"), 0);
        assert_int_equal(test_daemon_stop(&d), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_host_above_ram, teardown),
                cmocka_unit_test_teardown(test_target_above_free_space, teardown),
                cmocka_unit_test_teardown(test_capacity_that_passes, teardown),
                cmocka_unit_test_teardown(test_one_tierd_per_state_dir_and_target, teardown),
                cmocka_unit_test_teardown(test_busy_socket_refused_first, teardown),
                cmocka_unit_test_teardown(test_check_config_quotas, teardown),
                cmocka_unit_test_teardown(test_invalid_config_refused, teardown),
                cmocka_unit_test_teardown(test_reload_warns, teardown),
                cmocka_unit_test_teardown(test_cgroup_limit, cgroup_teardown),
                cmocka_unit_test_teardown(test_restart_with_store_in_cgroup, cgroup_teardown),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
