/* SPDX-License-Identifier: MIT */
/* test-log.c: daemon/base/log.c: a message's control (and bidi) characters are written as text; a cut says so. */

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/log.h"

/*
 * A job named with CSI, ESC, DEL and a byte that is not UTF-8, or with a bidirectional format character
 * (U+202E), which reorders the rest of the line: its log line holds their escapes.
 */
static void test_log_escapes_names(void **state) {
        static const char evil[] = "evil\xc2\x9b" "31m\x1b[2J\x7f\xff caf\xc3\xa9";
        char buf[4096];
        int fd, saved;
        ssize_t n;

        fd = memfd_create("test-log", MFD_CLOEXEC);
        assert_true(fd >= 0);
        saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        assert_true(saved >= 0);
        log_setup(LOG_TARGET_STDERR);
        fflush(stderr);
        assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
        log_job(LOG_WARNING, 0, evil, "job '%s' restored", evil);
        log_warning("job '%s' restored", "abc\xe2\x80\xae" "gpj.exe");      /* U+202E (RLO): reads "abcexe.jpg" */
        log_warning("plain %d", 7);
        fflush(stderr);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
        close(saved);
        n = pread(fd, buf, sizeof(buf) - 1, 0);
        close(fd);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_string_equal(buf, "tierd[warning]: job 'evil\\u009b31m\\u001b[2J\\u007f\\xff caf\xc3\xa9' restored\n"
                                 "tierd[warning]: job 'abc\\u202egpj.exe' restored\n"
                                 "tierd[warning]: plain 7\n");
}

/* Messages longer than the 2 KiB of a line (a long name, or one whose escapes make it so) end saying they were cut. */
static void test_log_cut_says_so(void **state) {
        static char buf[16384], name[4097];
        char *line, *next;
        int fd, saved;
        ssize_t n;

        fd = memfd_create("test-log", MFD_CLOEXEC);
        assert_true(fd >= 0);
        saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        assert_true(saved >= 0);
        log_setup(LOG_TARGET_STDERR);
        fflush(stderr);
        assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
        memset(name, 'j', 4000);
        name[4000] = '\0';
        log_warning("Job restored as '%s~1f2e3d4c'", name);       /* raw text over 2 KiB */
        memset(name, '\x1b', 1000);
        name[1000] = '\0';
        log_warning("Job restored as '%s'", name);                /* 1000 bytes, 6000 escaped */
        memset(name, 'k', 2000);
        name[2000] = '\0';
        log_warning("%s", name);                                  /* fits: not cut */
        fflush(stderr);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
        close(saved);
        n = pread(fd, buf, sizeof(buf) - 1, 0);
        close(fd);
        assert_true(n > 0);
        buf[n] = '\0';
        line = buf;
        for (int i = 0; i < 3; i++, line = next + 1) {
                next = strchr(line, '\n');
                assert_non_null(next);
                *next = '\0';
                assert_true(strlen(line) - strlen("tierd[warning]: ") <= 2047);
                if (i == 1)
                        assert_non_null(strstr(line, "\\u001b\\u001b [cut"));    /* never in an escape */
                if (i < 2)
                        assert_string_equal(line + strlen(line) - strlen(" [cut: longer than 2 KiB]"),
                                            " [cut: longer than 2 KiB]");
                else
                        assert_null(strstr(line, "[cut"));
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_log_escapes_names),
                cmocka_unit_test(test_log_cut_says_so),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
