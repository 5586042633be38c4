/* SPDX-License-Identifier: MIT */
/* test-activation.c: socket activation for real, through systemd-socket-activate. */

/*
 * systemd-socket-activate binds the socket, waits for the first connection
 * and then execs tierd in its own process with LISTEN_FDS=1, as PID 1 does
 * for tierd.socket.  The configuration names a different socket path: tierd
 * must serve on the inherited socket and never create, bind, unlink or
 * listen on anything else.
 */

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB (1024u * 1024u)
/* [host] capacity below: locked and registered with io_uring by tierd. */
#define HOST_CAPACITY (32 * MiB)
#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* The Flags column of /proc/net/unix: __SO_ACCEPTCON, a listening socket. */
#define UNIX_FLAG_LISTENING 0x10000u

static const char *const CONFIG =
        "[daemon]\n"
        "socket = @DIR@/config.sock\n"
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 8M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n";

static TestDaemon d;

static int setup(void **state) {
        if (!test_have_program("systemd-socket-activate")) {
                printf("systemd-socket-activate not found: skipped\n");
                exit(TEST_SKIP);
        }
        return 0;
}

static int teardown(void **state) {
        test_daemon_cleanup(&d);
        return 0;
}

/* Base name of /proc/PID/exe. */
static void exe_of(pid_t pid, char *buf, size_t size) {
        char p[64], target[PATH_MAX];
        const char *base;
        ssize_t n;

        snprintf(p, sizeof(p), "/proc/%d/exe", (int) pid);
        n = readlink(p, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = 0;
        base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
        n = (ssize_t) MIN(strlen(base), size - 1);
        memcpy(buf, base, (size_t) n);
        buf[n] = 0;
}

/*
 * The listening AF_UNIX sockets among @pid's fds: their paths, joined by
 * '\n' into @paths, and how many.  Matches the socket inodes of
 * /proc/PID/fd against /proc/net/unix.
 */
static unsigned listening_sockets(pid_t pid, char *paths, size_t size, int *ret_fd) {
        char dir[64], line[1024];
        unsigned long inodes[256];
        int fds[256];
        size_t n_inodes = 0;
        unsigned n = 0;
        struct dirent *de;
        FILE *f;
        DIR *dp;

        paths[0] = 0;
        snprintf(dir, sizeof(dir), "/proc/%d/fd", (int) pid);
        dp = opendir(dir);
        assert_non_null(dp);
        while ((de = readdir(dp)) && n_inodes < 256) {
                char p[64 + sizeof(de->d_name)], target[128];
                unsigned long ino;
                ssize_t l;

                if (de->d_name[0] == '.')
                        continue;
                snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
                l = readlink(p, target, sizeof(target) - 1);
                if (l <= 0)
                        continue;
                target[l] = 0;
                if (sscanf(target, "socket:[%lu]", &ino) == 1) {
                        fds[n_inodes] = atoi(de->d_name);
                        inodes[n_inodes++] = ino;
                }
        }
        closedir(dp);

        f = fopen("/proc/net/unix", "re");
        assert_non_null(f);
        while (fgets(line, sizeof(line), f)) {
                unsigned flags, type, st;
                unsigned long ino;
                char path[512] = "";

                /* Num RefCount Protocol Flags Type St Inode Path */
                if (sscanf(line, "%*s %*s %*s %x %x %x %lu %511s", &flags, &type, &st, &ino, path) < 4)
                        continue;
                if (!(flags & UNIX_FLAG_LISTENING))
                        continue;
                for (size_t i = 0; i < n_inodes; i++)
                        if (inodes[i] == ino) {
                                size_t len = strlen(paths);

                                snprintf(paths + len, size - len, "%s%s", len ? "\n" : "", path);
                                if (ret_fd)
                                        *ret_fd = fds[i];
                                n++;
                        }
        }
        fclose(f);
        return n;
}

static void test_activation(void **state) {
        char exe[256], paths[2048], config_sock[400];
        TestDaemonOptions o = { .activate = true, .watchdog_usec = 1000000, .log_level = "debug" };
        uint64_t moved[TIER_LINK_SLOTS];
        struct tier_grant g;
        struct tier_stat st;
        struct stat before, after;
        tier_tensor *t = NULL;
        tier_client *c = NULL;
        char *text = NULL;
        json_t *status;
        int fd = -1, r;

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        snprintf(config_sock, sizeof(config_sock), "%s/config.sock", d.dir);
        /* no --socket (.activate): the configuration names config.sock, which must never appear */
        assert_int_equal(test_daemon_spawn(&d, &o), 0);

        /* systemd-socket-activate has bound the socket; tierd is not running yet */
        for (int i = 0; i < 200 && stat(d.socket, &before) < 0; i++)
                usleep(25000);
        assert_int_equal(stat(d.socket, &before), 0);
        assert_true(S_ISSOCK(before.st_mode));
        exe_of(d.pid, exe, sizeof(exe));
        printf("before the first connection pid %d runs %s\n", (int) d.pid, exe);
        assert_string_equal(exe, "systemd-socket-activate");
        assert_true(test_daemon_wait_notify(&d, "READY=1", 300) < 0);

        /* the first connection starts tierd, which answers it */
        r = tier_client_new(d.socket, "activated", 0, &c);
        if (r < 0) {
                fprintf(stderr, "connect: %s (%s)\n", tier_strerror(r), tier_client_last_error(NULL));
                test_daemon_dump_log(&d);
        }
        assert_int_equal(r, 0);
        assert_true(test_daemon_wait_notify(&d, "READY=1", 10000) >= 0);
        exe_of(d.pid, exe, sizeof(exe));
        printf("after it, pid %d runs %s\n", (int) d.pid, exe);
        assert_string_equal(exe, "tierd");
        assert_true(test_daemon_log_contains(&d, "(inherited)"));
        assert_true(test_daemon_log_contains(&d, "is not used"));

        /* it works: a tensor through host, NVMe and back */
        assert_int_equal(tier_tensor_create(c, "t", 2 * MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x3c, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_evict(t, TIER_NVME), 0);
        assert_int_equal(tier_tensor_stat(t, &st), 0);
        assert_int_equal(st.state[TIER_HOST], 0);      /* NVMe holds the only copy */
        assert_int_equal(st.state[TIER_NVME], 2);
        assert_int_equal(tier_client_moved(c, moved), 0);
        assert_true(moved[TIER_LINK_HOST_TO_NVME] >= 2 * MiB);
        assert_int_equal(moved[TIER_LINK_NVME_TO_HOST], 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        /* the bytes came back up from NVMe */
        assert_int_equal(tier_client_moved(c, moved), 0);
        assert_true(moved[TIER_LINK_NVME_TO_HOST] >= 2 * MiB);
        assert_int_equal(((uint8_t *) g.ptr)[0], 0x3c);
        assert_int_equal(((uint8_t *) g.ptr)[g.length - 1], 0x3c);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        assert_int_equal(tier_client_status(c, TIER_STATUS_JSON, &text), 0);
        status = test_json_parse(text);
        free(text);
        assert_non_null(status);
        assert_non_null(test_json_job(status, "activated"));
        assert_int_equal(json_integer_value(json_object_get(test_json_job(status, "activated"), "tensors")), 1);
        json_decref(status);

        /* and tierctl, a second client */
        {
                char tierctl[512], cmd[1500];

                test_tierctl_path(tierctl, sizeof(tierctl));
                snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' status >/dev/null", tierctl, d.socket);
                assert_int_equal(system(cmd), 0);
        }

        /* one listening socket, the inherited fd 3, at the activation path: nothing bound by tierd */
        assert_int_equal(listening_sockets(d.pid, paths, sizeof(paths), &fd), 1);
        printf("tierd listens on fd %d: %s\n", fd, paths);
        assert_int_equal(fd, 3);
        assert_string_equal(paths, d.socket);
        assert_int_equal(access(config_sock, F_OK), -1);
        assert_int_equal(errno, ENOENT);
        /* the socket file is the one systemd-socket-activate made: never unlinked and re-bound */
        assert_int_equal(stat(d.socket, &after), 0);
        assert_true(before.st_ino == after.st_ino && before.st_dev == after.st_dev);
        assert_false(test_daemon_log_contains(&d, "Cannot bind"));

        /* the watchdog works through activation too (WATCHDOG_USEC=1 s, no WATCHDOG_PID) */
        assert_true(test_daemon_wait_notify(&d, "WATCHDOG=1", 2000) >= 0);

        tier_tensor_close(t);
        tier_client_free(c);
        r = test_daemon_kill(&d, SIGTERM, 15000);
        assert_int_equal(r, 0);
        /* the socket is not ours to remove: it stays for the next activation */
        assert_int_equal(stat(d.socket, &after), 0);
        assert_int_equal(access(config_sock, F_OK), -1);
}

/*
 * A socket of the wrong type (ListenStream=): tierd refuses it with a reason and exits 1, before it
 * makes anything (it used to make the pools, the target file and the NVMe index first).
 */
static void test_activation_wrong_type(void **state) {
        TestDaemonOptions o = { .activate = true, .stream = true };
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        char path[600];
        int fd, r;

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        for (int i = 0; i < 200 && access(d.socket, F_OK) < 0; i++)
                usleep(25000);

        /* the first connection starts tierd */
        strcpy(sa.sun_path, d.socket);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        r = test_daemon_kill(&d, 0, 15000);       /* signal 0: only wait for it to exit */
        close(fd);
        printf("tierd with a stream socket exited with status %d\n", r);
        assert_int_equal(r, 1);
        assert_true(test_daemon_log_contains(&d, "is not SOCK_SEQPACKET"));
        assert_true(test_daemon_wait_notify(&d, "READY=1", 0) < 0);
        snprintf(path, sizeof(path), "%s/t0.img", d.dir);
        assert_int_equal(access(path, F_OK), -1);
        snprintf(path, sizeof(path), "%s/nvme-index.0", d.dir);
        assert_int_equal(access(path, F_OK), -1);
}

/*
 * Two sockets of the wrong type (two ListenStream=): refused as one is, before anything is made.  tierd
 * closed both, bound the configuration's socket itself and served there, where no client of the socket
 * unit looks, while their connections waited in the unit's queue for ever.
 */
static void test_activation_two_wrong_type(void **state) {
        TestDaemonOptions o = { .activate = true, .stream = true };
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        char path[600], second[600];
        int fd, r;

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        snprintf(second, sizeof(second), "%s/second.sock", d.dir);
        o.listen2 = second;
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        for (int i = 0; i < 200 && access(second, F_OK) < 0; i++)
                usleep(25000);

        strcpy(sa.sun_path, d.socket);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
        r = test_daemon_kill(&d, 0, 15000);       /* signal 0: only wait for it to exit */
        close(fd);
        printf("tierd with two stream sockets exited with status %d\n", r);
        if (r != 1)
                test_daemon_dump_log(&d);
        assert_int_equal(r, 1);
        assert_true(test_daemon_log_contains(&d, "is not SOCK_SEQPACKET"));
        assert_true(test_daemon_wait_notify(&d, "READY=1", 0) < 0);
        snprintf(path, sizeof(path), "%s/config.sock", d.dir);
        assert_int_equal(access(path, F_OK), -1);
        snprintf(path, sizeof(path), "%s/t0.img", d.dir);
        assert_int_equal(access(path, F_OK), -1);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_activation, teardown),
                cmocka_unit_test_teardown(test_activation_wrong_type, teardown),
                cmocka_unit_test_teardown(test_activation_two_wrong_type, teardown),
        };

        if (!test_can_lock_memory(HOST_CAPACITY))
                return TEST_SKIP;
        return cmocka_run_group_tests_name("activation", tests, setup, NULL);
}
