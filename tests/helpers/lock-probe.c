/* SPDX-License-Identifier: MIT */
/* lock-probe.c: LD_PRELOAD shim: at each rename() into $TIER_LOCK_PROBE, note whether that directory is locked. */

/*
 * tierd holds the state directory's flock while anything in it is written,
 * so that a second tierd on the same directory (which removes the
 * temporary files a killed one left, then reads the state files) never
 * meets a write in progress.  Preloaded into tierd, this asks at exactly the
 * point of each rename() whose new name is in $TIER_LOCK_PROBE: a fresh
 * open of the directory tries flock(LOCK_EX | LOCK_NB), which fails while
 * tierd's own open file description holds it; "locked NAME" or "UNLOCKED
 * NAME" is appended to $TIER_LOCK_PROBE_LOG (a lock taken here is let go at
 * once).  Then the rename goes to libc unchanged.
 */

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

typedef int (*rename_fn)(const char *, const char *);

static void probe(const char *newpath) {
        const char *dir = getenv("TIER_LOCK_PROBE"), *log = getenv("TIER_LOCK_PROBE_LOG");
        size_t n = dir ? strlen(dir) : 0;
        int fd, held;
        FILE *f;

        if (n == 0 || !log || strncmp(newpath, dir, n) != 0 || newpath[n] != '/')
                return;
        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return;
        held = flock(fd, LOCK_EX | LOCK_NB) < 0;
        (void) close(fd);               /* lets go of a lock taken here */
        f = fopen(log, "ae");
        if (!f)
                return;
        (void) fprintf(f, "%s %s\n", held ? "locked" : "UNLOCKED", newpath);
        (void) fclose(f);
}

__attribute__((visibility("default"))) int rename(const char *oldpath, const char *newpath);
int rename(const char *oldpath, const char *newpath) {
        static rename_fn next;

        if (!next)
                next = (rename_fn) dlsym(RTLD_NEXT, "rename");
        if (newpath)
                probe(newpath);
        return next(oldpath, newpath);
}
