/* SPDX-License-Identifier: MIT */
/* no-odirect.c: LD_PRELOAD shim: open() with O_DIRECT under $TIER_NO_ODIRECT fails with EINVAL, as on an old tmpfs. */

/*
 * Linux 6.6 and later let tmpfs take O_DIRECT, so the refusal tierd and
 * tierctl bench must explain in words cannot be had from a real tmpfs on
 * every machine.  Preloaded into the program under test, this makes every
 * open() or openat() with O_DIRECT of a path that starts with
 * $TIER_NO_ODIRECT fail the way such a filesystem does (EINVAL); any other
 * open goes to libc unchanged.
 */

/* open() and open64() are two symbols here, not one name redirected to the other */
#undef _FILE_OFFSET_BITS

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

static int refused(const char *path, int flags) {
        const char *prefix = getenv("TIER_NO_ODIRECT");

        return (flags & O_DIRECT) && prefix && *prefix && path && strncmp(path, prefix, strlen(prefix)) == 0;
}

#define SHIM_OPEN(name)                                                                         \
        __attribute__((visibility("default"))) int name(const char *path, int flags, ...);     \
        int name(const char *path, int flags, ...) {                                            \
                static open_fn next;                                                            \
                mode_t mode = 0;                                                                \
                va_list ap;                                                                     \
                                                                                                \
                va_start(ap, flags);                                                            \
                if (flags & (O_CREAT | O_TMPFILE))                                              \
                        mode = va_arg(ap, mode_t);                                              \
                va_end(ap);                                                                     \
                if (refused(path, flags)) {                                                     \
                        errno = EINVAL;                                                         \
                        return -1;                                                              \
                }                                                                               \
                if (!next)                                                                      \
                        next = (open_fn) dlsym(RTLD_NEXT, #name);                               \
                return next(path, flags, mode);                                                 \
        }

#define SHIM_OPENAT(name)                                                                               \
        __attribute__((visibility("default"))) int name(int dirfd, const char *path, int flags, ...);  \
        int name(int dirfd, const char *path, int flags, ...) {                                         \
                static openat_fn next;                                                                  \
                mode_t mode = 0;                                                                        \
                va_list ap;                                                                             \
                                                                                                        \
                va_start(ap, flags);                                                                    \
                if (flags & (O_CREAT | O_TMPFILE))                                                      \
                        mode = va_arg(ap, mode_t);                                                      \
                va_end(ap);                                                                             \
                if (refused(path, flags)) {                                                             \
                        errno = EINVAL;                                                                 \
                        return -1;                                                                      \
                }                                                                                       \
                if (!next)                                                                              \
                        next = (openat_fn) dlsym(RTLD_NEXT, #name);                                     \
                return next(dirfd, path, flags, mode);                                                  \
        }

SHIM_OPEN(open)
SHIM_OPEN(open64)
SHIM_OPENAT(openat)
SHIM_OPENAT(openat64)
