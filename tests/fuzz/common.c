/* SPDX-License-Identifier: MIT */
/* common.c: helpers of every fuzz target, in both builds (libFuzzer's main and replay.c's). */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

int fuzz_write_file(const char *dir, const char *name, const void *data, size_t size) {
        char path[4096];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        f = fopen(path, "we");
        if (!f)
                return -errno;
        if (size > 0 && fwrite(data, size, 1, f) != 1) {
                fclose(f);
                return -EIO;
        }
        return fclose(f) == 0 ? 0 : -errno;
}

int fuzz_count_fds(void) {
        int n = 0;

        for (int fd = 0; fd < 1024; fd++)
                if (fcntl(fd, F_GETFD) >= 0)
                        n++;
        return n;
}

int fuzz_make_fd(int kind) {
        int fd = -1, sv[2], p[2];

        switch (kind) {
        case FD_MEMFD:
        case FD_SEALED_MEMFD:
        case FD_MEMFD_BIG:
                fd = memfd_create("fuzz", MFD_CLOEXEC | (kind == FD_SEALED_MEMFD ? MFD_ALLOW_SEALING : 0));
                FUZZ_CHECK(fd >= 0 && ftruncate(fd, kind == FD_MEMFD_BIG ? 1 << 20 : 4096) == 0);
                if (kind == FD_SEALED_MEMFD)
                        FUZZ_CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0);
                break;
        case FD_EVENTFD:
                fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
                break;
        case FD_DEVNULL:
                fd = open("/dev/null", O_RDWR | O_CLOEXEC);
                break;
        case FD_DIR_PATH:
                fd = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
                break;
        case FD_SOCKET:
                FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
                close(sv[1]);
                fd = sv[0];
                break;
        case FD_PIPE:
                FUZZ_CHECK(pipe2(p, O_CLOEXEC) == 0);
                close(p[1]);
                fd = p[0];
                break;
        case FD_DIR:
        default:
                fd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                break;
        }
        FUZZ_CHECK(fd >= 0);
        return fd;
}
