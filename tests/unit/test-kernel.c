/* SPDX-License-Identifier: MIT */
/* test-kernel.c: the kernel check on made-up kernels, its exact messages, and probing this one. */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/core/kernel.h"
#include "proto/macro.h"

/* A kernel with everything tierd needs. */
static KernelFacts kernel(const char *release) {
        KernelFacts f = {};

        strncpy(f.release, release, sizeof(f.release) - 1);
        return f;
}

static void expect_refused(const KernelFacts *f, const char *want) {
        _cleanup_free_ char *why = NULL;

        assert_int_equal(kernel_check(f, &why), KERNEL_REFUSED);
        assert_non_null(why);
        assert_string_equal(why, want);
}

static void test_new_enough(void **state) {
        KernelFacts f = kernel("6.1.0-18-amd64");
        char *why = (char *) "untouched";

        assert_int_equal(kernel_check(&f, &why), 0);
        assert_null(why);
}

/* 5.13 to 5.18 have IORING_REGISTER_BUFFERS2 but not sparse buffers: EINVAL.  The decisive feature. */
static void test_no_sparse_buffers(void **state) {
        KernelFacts f = kernel("5.15.0-91-generic");

        f.uring_sparse_buffers = -EINVAL;
        expect_refused(&f, "This kernel (Linux 5.15.0-91-generic) lacks sparse io_uring buffer registration "
                           "(Linux 5.19; Invalid argument): tierd needs Linux 5.19 or newer; boot a newer kernel.");
}

/* Before 5.12 an eventfd has no RWF_NOWAIT: a client could block tierd's loop through its marker. */
static void test_no_eventfd_nowait(void **state) {
        KernelFacts f = kernel("5.10.0-28-amd64");

        f.uring_sparse_buffers = -EINVAL;
        f.eventfd_nowait = -EOPNOTSUPP;
        expect_refused(&f, "This kernel (Linux 5.10.0-28-amd64) lacks sparse io_uring buffer registration "
                           "(Linux 5.19; Invalid argument), preadv2(RWF_NOWAIT) on an eventfd (Linux 5.12; "
                           "Operation not supported): tierd needs Linux 5.19 or newer; boot a newer kernel.");
        /* a kernel that had the one backported and not the other is refused for the other alone */
        f.uring_sparse_buffers = 0;
        expect_refused(&f, "This kernel (Linux 5.10.0-28-amd64) lacks preadv2(RWF_NOWAIT) on an eventfd "
                           "(Linux 5.12; Operation not supported): tierd needs Linux 5.19 or newer; boot a newer "
                           "kernel.");
}

/* What was tried decides, not the version: a vendor kernel with the features backported passes. */
static void test_backported(void **state) {
        KernelFacts f = kernel("5.14.0-362.8.1.el9_3.x86_64");
        _cleanup_free_ char *why = NULL;

        assert_int_equal(kernel_check(&f, &why), 0);
        f = kernel("");
        f.eventfd_nowait = -EOPNOTSUPP;
        expect_refused(&f, "This kernel (Linux of unknown version) lacks preadv2(RWF_NOWAIT) on an eventfd "
                           "(Linux 5.12; Operation not supported): tierd needs Linux 5.19 or newer; boot a newer "
                           "kernel.");
}

/* No ring to try it on (io_uring off, a seccomp filter): not the kernel's age; the start's own ring says why. */
static void test_uring_unprobed(void **state) {
        KernelFacts f = kernel("6.8.0");
        _cleanup_free_ char *why = NULL;

        f.uring_sparse_buffers = KERNEL_UNPROBED;
        assert_int_equal(kernel_check(&f, &why), 0);
}

/*
 * io_uring turned off (kernel.io_uring_disabled, a container's seccomp filter, a kernel without it): refused
 * before anything is made, with where to turn it on (it was a start that failed with status 1, which
 * Restart=on-failure repeats).
 */
static void test_uring_off(void **state) {
        static const int errs[] = { EPERM, EACCES, ENOSYS };

        for (size_t i = 0; i < ELEMENTSOF(errs); i++) {
                KernelFacts f = kernel("6.8.0");
                _cleanup_free_ char *why = NULL;

                f.uring_sparse_buffers = -errs[i];
                assert_int_equal(kernel_check(&f, &why), KERNEL_REFUSED);
                assert_non_null(why);
                assert_non_null(strstr(why, "io_uring is turned off for tierd here (io_uring_setup: "));
                assert_non_null(strstr(why, strerror(errs[i])));
                assert_non_null(strstr(why, "kernel.io_uring_disabled"));
                assert_non_null(strstr(why, "seccomp"));
        }
}

/* This machine runs tierd's tests, so it has what tierd needs; the probes leave no fd behind. */
static void test_this_kernel(void **state) {
        _cleanup_free_ char *why = NULL;
        KernelFacts f;
        int before, after;

        before = dup(0);                /* the lowest free fd, before and after: the probes closed theirs */
        assert_true(before >= 0);
        close(before);
        assert_int_equal(kernel_facts_read(&f), 0);
        after = dup(0);
        assert_true(after >= 0);
        close(after);
        assert_int_equal(after, before);
        assert_true(f.release[0] != '\0');
        assert_int_equal(f.eventfd_nowait, 0);
        assert_true(f.uring_sparse_buffers == 0 || f.uring_sparse_buffers == KERNEL_UNPROBED);
        assert_int_equal(kernel_check(&f, &why), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_new_enough),
                cmocka_unit_test(test_uring_off),
                cmocka_unit_test(test_no_sparse_buffers),
                cmocka_unit_test(test_no_eventfd_nowait),
                cmocka_unit_test(test_backported),
                cmocka_unit_test(test_uring_unprobed),
                cmocka_unit_test(test_this_kernel),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
