/* SPDX-License-Identifier: MIT */
/* test-log.c: daemon/base/log.c: a message's control characters are written as text. */

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

/* A job named with CSI, ESC, DEL and a byte that is not UTF-8: its log line holds their escapes. */
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
        log_warning("plain %d", 7);
        fflush(stderr);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
        close(saved);
        n = pread(fd, buf, sizeof(buf) - 1, 0);
        close(fd);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_string_equal(buf, "tierd[warning]: job 'evil\\u009b31m\\u001b[2J\\u007f\\xff caf\xc3\xa9' restored\n"
                                 "tierd[warning]: plain 7\n");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_log_escapes_names),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
