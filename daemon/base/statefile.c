/* SPDX-License-Identifier: MIT */
/* statefile.c: write a file atomically (temp file, fsync, rename), read a small one whole. */

/*
 * Theory of operation: the files tierd keeps (the drive wear book under the
 * state directory, the metrics text file node_exporter reads) must never be
 * seen half-written, by tierd after a crash or by another reader at any
 * time.  So a file is written in full under a temporary name in its own
 * directory (a rename within one file system is atomic), flushed to the
 * device, and renamed over the old one; the directory is flushed last, so
 * that the rename itself survives a power cut.  The temporary file is
 * "PATH.XXXXXX" (mkostemp), removed on every error path.
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/base/statefile.h"
#include "proto/macro.h"

static int write_all(int fd, const void *data, size_t len) {
        const char *p = data;

        while (len > 0) {
                ssize_t n = write(fd, p, len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return negative_errno();
                if (n == 0)
                        return -EIO;
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

/* fsync() the directory holding @path. */
static int sync_dir_of(const char *path) {
        char dir[PATH_MAX];
        const char *slash = strrchr(path, '/');
        _cleanup_close_ int fd = -1;

        if (!slash)
                (void) snprintf(dir, sizeof(dir), ".");
        else if (slash == path)
                (void) snprintf(dir, sizeof(dir), "/");
        else
                (void) snprintf(dir, sizeof(dir), "%.*s", (int) (slash - path), path);
        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        return fsync(fd) < 0 ? negative_errno() : 0;
}

int statefile_write(const char *path, const void *data, size_t len, mode_t mode) {
        char tmp[PATH_MAX];
        _cleanup_close_ int fd = -1;
        int r;

        if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int) sizeof(tmp))
                return -ENAMETOOLONG;
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        r = write_all(fd, data, len);
        if (r >= 0 && fchmod(fd, mode) < 0)
                r = negative_errno();
        if (r >= 0 && fsync(fd) < 0)
                r = negative_errno();
        if (r >= 0 && rename(tmp, path) < 0)
                r = negative_errno();
        if (r < 0) {
                (void) unlink(tmp);
                return r;
        }
        return sync_dir_of(path);
}

int statefile_read(const char *path, size_t max, char **ret, size_t *ret_len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t done = 0;

        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        if ((uint64_t) st.st_size > max)
                return -EFBIG;
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (done < (size_t) st.st_size) {
                ssize_t n = read(fd, buf + done, (size_t) st.st_size - done);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return negative_errno();
                if (n == 0)
                        break;          /* shrank meanwhile: what is there */
                done += (size_t) n;
        }
        buf[done] = '\0';
        *ret = TAKE_PTR(buf);
        if (ret_len)
                *ret_len = done;
        return 0;
}

int statefile_set_aside(const char *path, char *ret_name, size_t size) {
        if (snprintf(ret_name, size, "%s.corrupt", path) >= (int) size)
                return -ENAMETOOLONG;
        return rename(path, ret_name) < 0 ? negative_errno() : 0;
}
