/* SPDX-License-Identifier: MIT */
/* test-memstore.c: the memory store's start: what the last run left and this one cannot use goes at once. */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>
#include <systemd/sd-event.h>

#include "daemon/state/memstore.h"

#define SEG (1u << 20)

/* The service manager's notify socket: a datagram socket at a temporary path. */
static int notify_open(char *path, size_t size) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

        assert_true(fd >= 0);
        snprintf(path, size, "/tmp/tierd-test-memstore.%d", (int) getpid());
        (void) unlink(path);
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        return fd;
}

/* How many FDSTOREREMOVE=1 messages are waiting on @fd, and whether one names @name. */
static unsigned removes(int fd, const char *name, bool *named) {
        char buf[512];
        unsigned n = 0;
        ssize_t l;

        while ((l = recv(fd, buf, sizeof(buf) - 1, 0)) > 0) {
                buf[l] = 0;
                if (strncmp(buf, "FDSTOREREMOVE=1", 15) == 0) {
                        n++;
                        if (strstr(buf, name))
                                *named = true;
                }
        }
        return n;
}

/*
 * The last run's segments, with no sound table to say what they hold: closed and out of the store
 * when the table is found unusable, before the pools are made.  They stayed open until
 * memstore_begin(), after the new pools had taken their memory: a restart held the host pool twice.
 */
static void test_unusable_segments_go_at_load(void **state) {
        char path[108];
        int nfd = notify_open(path, sizeof(path)), seg[2];
        sd_event *event = NULL;
        MemStore *ms = NULL;
        bool named = false;

        assert_int_equal(setenv("NOTIFY_SOCKET", path, 1), 0);
        assert_int_equal(setenv("FDSTORE", "64", 1), 0);
        assert_int_equal(sd_event_new(&event), 0);
        assert_int_equal(memstore_new(event, true, SEG, 2, 0, 0, &ms), 0);
        assert_non_null(ms);
        for (int i = 0; i < 2; i++) {
                char name[64];

                seg[i] = memfd_create("seg", MFD_CLOEXEC);
                assert_true(seg[i] >= 0);
                assert_int_equal(ftruncate(seg[i], SEG), 0);
                snprintf(name, sizeof(name), MEMSTORE_FD_PREFIX "host-%d", i);
                assert_int_equal(memstore_inherit(ms, name, seg[i]), 1);
        }
        assert_int_equal(fcntl(seg[0], F_GETFD), FD_CLOEXEC);   /* the store's now */
        memstore_load(ms);
        for (int i = 0; i < 2; i++) {
                errno = 0;
                assert_int_equal(fcntl(seg[i], F_GETFD), -1);
                assert_int_equal(errno, EBADF);
        }
        assert_int_equal(removes(nfd, MEMSTORE_FD_PREFIX "host-1", &named), 2);
        assert_true(named);
        memstore_free(ms);
        sd_event_unref(event);
        close(nfd);
        unlink(path);
        unsetenv("NOTIFY_SOCKET");
        unsetenv("FDSTORE");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_unusable_segments_go_at_load),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
