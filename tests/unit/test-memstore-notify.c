/* SPDX-License-Identifier: MIT */
/* test-memstore-notify.c: the memory store's messages when the service manager does not read: a bounded queue, the same end state. */

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
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/state/memstore-private.h"

/*
 * The table's side (memstore.c), here a record of each call: a segment's
 * FDSTORE that went out names its inode current.  (Defined here, it keeps
 * memstore.c out of the link.)
 */
static struct { int k; uint32_t id; uint64_t ino; } stored[64];
static unsigned n_stored;

void ms_segment_stored(MemStore *ms, int k, uint32_t id, uint64_t ino) {
        (void) ms;
        assert_true(n_stored < 64);
        stored[n_stored].k = k;
        stored[n_stored].id = id;
        stored[n_stored++].ino = ino;
}

/* What the service manager's fd store holds: name -> inodes, in the order stored. */
#define STORE_MAX 4096
typedef struct Store {
        char name[STORE_MAX][64];
        uint64_t ino[STORE_MAX];
        unsigned n;
} Store;

static void store_apply(Store *st, const char *text, int fd) {
        const char *name = strstr(text, "FDNAME=");
        struct stat sb;

        assert_non_null(name);
        name += strlen("FDNAME=");
        if (strncmp(text, "FDSTOREREMOVE=1", 15) == 0) {
                unsigned k = 0;

                assert_true(fd < 0);
                for (unsigned i = 0; i < st->n; i++)
                        if (strcmp(st->name[i], name) != 0) {
                                memmove(st->name[k], st->name[i], sizeof(st->name[k]));
                                st->ino[k++] = st->ino[i];
                        }
                st->n = k;
                return;
        }
        assert_true(strncmp(text, "FDSTORE=1", 9) == 0);
        assert_true(fd >= 0);
        assert_int_equal(fstat(fd, &sb), 0);
        assert_true(st->n < STORE_MAX);
        snprintf(st->name[st->n], sizeof(st->name[st->n]), "%s", name);
        st->ino[st->n++] = (uint64_t) sb.st_ino;
        close(fd);
}

/* Take every datagram waiting on @sm into @st; how many. */
static unsigned store_read(int sm, Store *st) {
        unsigned n = 0;

        for (;;) {
                char text[256];
                union {
                        struct cmsghdr h;
                        uint8_t buf[CMSG_SPACE(sizeof(int))];
                } control;
                struct iovec iov = { .iov_base = text, .iov_len = sizeof(text) - 1 };
                struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                                     .msg_controllen = sizeof(control.buf) };
                struct cmsghdr *c;
                ssize_t l = recvmsg(sm, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                int fd = -1;

                if (l < 0) {
                        assert_true(errno == EAGAIN);
                        return n;
                }
                text[l] = 0;
                c = CMSG_FIRSTHDR(&mh);
                if (c && c->cmsg_type == SCM_RIGHTS)
                        memcpy(&fd, CMSG_DATA(c), sizeof(int));
                store_apply(st, text, fd);
                n++;
        }
}

/* A service manager that reads only when told to, and tierd's side of it. */
typedef struct ServiceManager {
        char dir[40];
        struct sockaddr_un sa;
        int sm;                 /* the manager's socket */
        MemStore ms;
} ServiceManager;

static void sm_open(ServiceManager *m) {
        *m = (ServiceManager) { .dir = "/tmp/test-memstore-notify.XXXXXX", .sa = { .sun_family = AF_UNIX },
                         .ms = { .notify_fd = -1 } };
        assert_non_null(mkdtemp(m->dir));
        snprintf(m->sa.sun_path, sizeof(m->sa.sun_path), "%s/notify", m->dir);
        m->sm = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        assert_true(m->sm >= 0);
        assert_int_equal(bind(m->sm, (struct sockaddr *) &m->sa, sizeof(m->sa)), 0);
        m->ms.notify_fd = ms_notify_open(m->sa.sun_path);
        assert_true(m->ms.notify_fd >= 0);
}

/* Store memfds under fill-N until the manager's socket is full (the last one waits in tierd's queue); how many. */
static int sm_fill(ServiceManager *m) {
        int n = 0;

        while (m->ms.n_queue == 0) {
                char name[32];
                int fd = memfd_create("fill", MFD_CLOEXEC);

                assert_true(fd >= 0 && n < 10000);
                snprintf(name, sizeof(name), "fill-%d", n++);
                ms_store_put(&m->ms, name, fd, -1, 0, 0);
                close(fd);
        }
        return n;
}

/* The manager reads again until tierd has sent everything; the messages it took. */
static unsigned sm_drain(ServiceManager *m, Store *st) {
        unsigned got = 0;

        while (m->ms.n_queue > 0) {
                got += store_read(m->sm, st);
                (void) ms_queue_wait(&m->ms, 10 * 1000);
        }
        return got + store_read(m->sm, st);
}

static void sm_close(ServiceManager *m) {
        free(m->ms.queue);
        close(m->ms.notify_fd);
        close(m->sm);
        assert_int_equal(unlink(m->sa.sun_path), 0);
        assert_int_equal(rmdir(m->dir), 0);
}

static int open_fds(void) {
        int n = 0;

        for (int fd = 0; fd < 4096; fd++)
                n += fcntl(fd, F_GETFD) >= 0;
        return n;
}

/*
 * The service manager stops reading, with its queue full; one name is then
 * renewed (removed and stored again) 200 times, another stored once.  tierd
 * keeps at most one removal and one store of each name waiting (it held an
 * fd per renewal before); once the manager reads again it gets, in order,
 * what leaves its store as the whole sequence would: the other names as
 * they were, the renewed one with the last memfd only.
 */
static void test_queue_bounded(void **state) {
        static Store st;
        uint64_t last_ino = 0;
        int fds_before, queued;
        struct stat sb;
        ServiceManager m;

        (void) state;
        sm_open(&m);
        fds_before = open_fds();
        queued = sm_fill(&m);
        assert_int_equal(m.ms.n_queue, 1);      /* the last fill waits */

        for (int i = 0; i < 200; i++) {
                int fd = memfd_create("renewed", MFD_CLOEXEC);

                assert_true(fd >= 0);
                assert_int_equal(fstat(fd, &sb), 0);
                last_ino = (uint64_t) sb.st_ino;
                ms_store_remove(&m.ms, "seg");
                ms_store_put(&m.ms, "seg", fd, -1, 0, 0);
                close(fd);
                assert_true(m.ms.n_queue <= 3); /* the fill, one removal, one store */
        }
        {
                int fd = memfd_create("other", MFD_CLOEXEC);

                ms_store_put(&m.ms, "other", fd, -1, 0, 0);
                close(fd);
        }
        assert_int_equal(m.ms.n_queue, 4);
        /* what tierd holds: an fd per waiting store, no more */
        assert_int_equal(open_fds(), fds_before + 3);

        /* the manager reads again: everything goes out, in order */
        assert_int_equal(sm_drain(&m, &st), (unsigned) queued + 3);
        assert_int_equal(open_fds(), fds_before);
        {
                unsigned seg = 0, other = 0;

                for (unsigned i = 0; i < st.n; i++) {
                        if (strcmp(st.name[i], "seg") == 0) {
                                assert_int_equal(st.ino[i], last_ino);
                                seg++;
                        }
                        other += strcmp(st.name[i], "other") == 0;
                }
                assert_int_equal(seg, 1);
                assert_int_equal(other, 1);
                assert_int_equal(st.n, (unsigned) queued + 2);
        }
        sm_close(&m);
}

/*
 * One segment renewed twice while the manager does not read: the first
 * renewal's FDSTORE must never go out after the second began, or the table
 * would name the first memfd's inode current for a segment whose memory is
 * the second's (a kill then would put the first memfd's bytes back under
 * copies written in the second).  Only the second's goes out, and only its
 * inode is named.
 */
static void test_renewed_twice_while_full(void **state) {
        static Store st;
        uint64_t ino[2];
        ServiceManager m;

        (void) state;
        n_stored = 0;
        sm_open(&m);
        (void) sm_fill(&m);
        for (int i = 0; i < 2; i++) {
                int fd = memfd_create("seg", MFD_CLOEXEC);
                struct stat sb;

                assert_true(fd >= 0);
                assert_int_equal(fstat(fd, &sb), 0);
                ino[i] = (uint64_t) sb.st_ino;
                ms_store_remove(&m.ms, "tierd-mem-host-7");
                ms_store_put(&m.ms, "tierd-mem-host-7", fd, 0, 7, ino[i]);
                close(fd);
        }
        (void) sm_drain(&m, &st);
        assert_int_equal(n_stored, 1);
        assert_int_equal(stored[0].k, 0);
        assert_int_equal(stored[0].id, 7);
        assert_int_equal(stored[0].ino, ino[1]);
        assert_int_equal(st.ino[st.n - 1], ino[1]);
        sm_close(&m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_queue_bounded),
                cmocka_unit_test(test_renewed_twice_while_full),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
