/* SPDX-License-Identifier: MIT */
/* test-client-hostile-quota.c: tierctl quota get against a fake tierd (test-client-hostile.h) with an old name. */

#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/test-client-hostile.h"

/* The tierctl of this build: the test runs as build/tests/unit/test-client-hostile. */
static void tierctl_path(char *buf, size_t size) {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        char *slash;

        assert_true(n > 0);
        self[n] = '\0';
        slash = strrchr(self, '/');
        assert_non_null(slash);
        *slash = '\0';
        assert_true((size_t) snprintf(buf, size, "%s/../../client/tierctl", self) < size);
        if (access(buf, X_OK) != 0)
                fail_msg("%s: not built (ninja -C build tierctl)", buf);
}

/* Everything @fd gives until its end, NUL-terminated, into @buf. */
static void read_all(int fd, char *buf, size_t size) {
        size_t used = 0;
        ssize_t n;

        while (used < size - 1 && (n = read(fd, buf + used, size - 1 - used)) > 0)
                used += (size_t) n;
        buf[used] = '\0';
}

/*
 * tierctl quota get (every job) listed the jobs through the status's JSON
 * text, and skipped in silence a name whose text it could not decode: one with
 * a C1 control ("\u009b") or a byte that is not UTF-8 ("\ufffd"), which a tierd
 * older than its name checks holds.  "no jobs", exit 0, for a tierd with one.
 * Now the names come exact (tier_job_list()): the job is asked for, and what
 * the fake answers (its QuotaGet is not scripted: ENOSYS) is said with the
 * name escaped.
 */
void test_quota_get_lists_every_name(void **state) {
        char tierctl[PATH_MAX + 32], out[4096], err[4096];
        int po[2], pe[2], st;
        Fake f = { .job_name = "evil\xc2\x9b" "31m" };
        pid_t pid;

        (void) state;
        tierctl_path(tierctl, sizeof(tierctl));
        fake_start(&f, SC_REPLIES);
        assert_int_equal(pipe2(po, O_CLOEXEC), 0);
        assert_int_equal(pipe2(pe, O_CLOEXEC), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                if (dup2(po[1], STDOUT_FILENO) < 0 || dup2(pe[1], STDERR_FILENO) < 0)
                        _exit(120);
                execl(tierctl, "tierctl", "--socket", f.path, "--timeout", "10", "quota", "get", (char *) NULL);
                _exit(121);
        }
        close(po[1]);
        close(pe[1]);
        read_all(po[0], out, sizeof(out));
        read_all(pe[0], err, sizeof(err));
        close(po[0]);
        close(pe[0]);
        assert_int_equal(waitpid(pid, &st, 0), pid);
        fake_stop(&f);
        print_message("stdout: %s\nstderr: %s\n", out, err);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 1);   /* 0 before, and "no jobs" */
        assert_null(strstr(out, "no jobs"));
        assert_non_null(strstr(err, "cannot get the quota of job 'evil\\u009b31m': fake tierd: not scripted"));
}
