/* SPDX-License-Identifier: MIT */
/* common.c: helpers of every fuzz target, in both builds (libFuzzer's main and replay.c's). */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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

        for (int fd = 0; fd < 4096; fd++)
                if (fcntl(fd, F_GETFD) >= 0)
                        n++;
        return n;
}
