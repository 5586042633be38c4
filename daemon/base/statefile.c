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
 * "PATH.XXXXXX" (mkostemp), removed on every error path, and by the next
 * start when a crash (SIGKILL, power) came between mkostemp and rename
 * (statefile_remove_temps(), of the state directory's files).  The state
 * directory itself is trusted only when nobody but tierd's user can put a
 * name in it (statefile_dir_trusted(), checked at start).
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "daemon/base/log.h"
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
        /* replaced: an error now would have the caller keep the old state while the file holds the new */
        return sync_dir_of(path) < 0 ? 1 : 0;
}

int statefile_read(const char *path, size_t max, char **ret, size_t *ret_len) {
        /* O_NONBLOCK: a FIFO planted here must not hang the open; O_NOFOLLOW: nor a link lead elsewhere */
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t done = 0;

        if (fd < 0 && errno == ELOOP)
                return -EINVAL;         /* a symbolic link: not a regular file */
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

/*
 * "BASE.corrupt.STAMP[.N]": the length up to STAMP's end, and N (0 when there
 * is none).  STAMP ends in 'Z' (UTC); a name of any other form is all stamp.
 */
static size_t aside_split(const char *name, unsigned long *ret_n) {
        const char *dot = strrchr(name, '.');
        size_t len = strlen(name);

        *ret_n = 0;
        if (!dot || dot == name || dot[-1] != 'Z' || dot[1] == '\0' || dot[1 + strspn(dot + 1, "0123456789")] != '\0')
                return len;
        errno = 0;
        *ret_n = strtoul(dot + 1, NULL, 10);
        if (errno != 0) {
                *ret_n = 0;
                return len;
        }
        return (size_t) (dot - name);
}

/* Oldest first: by STAMP (fixed width), then by N as a number (".10" after ".9"). */
static int aside_compare(const void *a, const void *b) {
        const char *x = *(char *const *) a, *y = *(char *const *) b;
        unsigned long nx, ny;
        size_t lx = aside_split(x, &nx), ly = aside_split(y, &ny);
        int c = memcmp(x, y, MIN(lx, ly));

        if (c != 0)
                return c;
        if (lx != ly)
                return lx < ly ? -1 : 1;
        return nx < ny ? -1 : nx > ny;
}

/* Remove the oldest "BASE.corrupt.*" in @dir_fd beyond the newest STATEFILE_ASIDE_MAX. */
static void aside_prune(int dir_fd, const char *base) {
        char prefix[NAME_MAX + 16];
        char **names = NULL;
        size_t n = 0, alloc = 0, plen;
        DIR *d;
        int fd;

        if (snprintf(prefix, sizeof(prefix), "%s.corrupt.", base) >= (int) sizeof(prefix))
                return;
        plen = strlen(prefix);
        fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0)
                return;
        d = fdopendir(fd);
        if (!d) {
                (void) close(fd);
                return;
        }
        rewinddir(d);
        for (struct dirent *de; (de = readdir(d));) {
                if (strncmp(de->d_name, prefix, plen) != 0)
                        continue;
                if (n == alloc) {
                        size_t na = alloc ? alloc * 2 : 16;
                        char **p = na > 4096 ? NULL : realloc(names, na * sizeof(*names));

                        if (!p)
                                break;
                        names = p;
                        alloc = na;
                }
                names[n] = strdup(de->d_name);
                if (!names[n])
                        break;
                n++;
        }
        (void) closedir(d);
        /* by time: UTC timestamps of fixed width, then ".N" (a number) for a second one in a second */
        qsort(names, n, sizeof(*names), aside_compare);
        for (size_t i = 0; i < n; i++) {
                if (i + STATEFILE_ASIDE_MAX < n)
                        (void) unlinkat(dir_fd, names[i], 0);
                free(names[i]);
        }
        free(names);
}

int statefile_set_aside(const char *path, char *ret_name, size_t size) {
        char dir[PATH_MAX], stamp[32];
        const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
        _cleanup_close_ int dir_fd = -1;
        struct tm tm;
        time_t now = time(NULL);
        int r = -EEXIST;

        if (!slash)
                (void) snprintf(dir, sizeof(dir), ".");
        else if (slash == path)
                (void) snprintf(dir, sizeof(dir), "/");
        else if (snprintf(dir, sizeof(dir), "%.*s", (int) (slash - path), path) >= (int) sizeof(dir))
                return -ENAMETOOLONG;
        dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0)
                return negative_errno();
        if (!gmtime_r(&now, &tm) || strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm) == 0)
                return -EINVAL;

        /* never over an older copy: PATH.corrupt.STAMP, else PATH.corrupt.STAMP.1, .2, ... */
        for (unsigned k = 0; k < 1000 && r == -EEXIST; k++) {
                char name[NAME_MAX + 1];

                if ((k == 0 ? snprintf(name, sizeof(name), "%s.corrupt.%s", base, stamp) :
                              snprintf(name, sizeof(name), "%s.corrupt.%s.%u", base, stamp, k)) >= (int) sizeof(name))
                        return -ENAMETOOLONG;
                if (snprintf(ret_name, size, "%s%s%s", slash ? dir : "", slash ? (slash == path ? "" : "/") : "",
                             name) >= (int) size)
                        return -ENAMETOOLONG;
                r = renameat2(dir_fd, base, dir_fd, name, RENAME_NOREPLACE) < 0 ? negative_errno() : 0;
        }
        if (r < 0)
                return r;
        aside_prune(dir_fd, base);
        (void) fsync(dir_fd);
        return 0;
}

int statefile_dir_trusted(const struct stat *st, uid_t uid, gid_t gid, char *why, size_t size) {
        if (!S_ISDIR(st->st_mode)) {
                (void) snprintf(why, size, "it is not a directory");
                return -ENOTDIR;
        }
        if (st->st_uid != uid && st->st_uid != 0) {
                (void) snprintf(why, size, "it belongs to uid %u, not to tierd's user (uid %u) or root: whoever "
                                "owns it can plant links to other files there (chown it to tierd's user)",
                                (unsigned) st->st_uid, (unsigned) uid);
                return -EPERM;
        }
        if (st->st_mode & S_IWOTH) {
                /* sticky and open to all: a directory users share (/tmp), not one to chmod */
                (void) snprintf(why, size, "it is writable by every user (mode %04o): anyone can plant links to "
                                "other files there (%s)", (unsigned) (st->st_mode & 07777),
                                st->st_mode & S_ISVTX ? "a directory all users share, as /tmp is: make one of "
                                "tierd's own in it, 0750, and name that; else chmod o-w it" : "chmod o-w it, as 0750");
                return -EPERM;
        }
        if ((st->st_mode & S_IWGRP) && st->st_gid != gid) {
                (void) snprintf(why, size, "it is writable by group %u, not tierd's (gid %u; mode %04o): its "
                                "members can plant links to other files there (chmod g-w it, as 0750)",
                                (unsigned) st->st_gid, (unsigned) gid, (unsigned) (st->st_mode & 07777));
                return -EPERM;
        }
        return 0;
}

/* The kernel's posix_acl_xattr layout (linux/posix_acl_xattr.h): a version, then entries, little-endian. */
#define ACL_XATTR_VERSION 2u
#define ACL_TAG_USER 0x02u
#define ACL_TAG_GROUP 0x08u
#define ACL_TAG_MASK 0x10u
#define ACL_PERM_WRITE 0x02u

static uint32_t le32_at(const unsigned char *p) {
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24;
}

int statefile_dir_acl_trusted(const void *acl, size_t len, uid_t uid, gid_t gid, char *why, size_t size) {
        const unsigned char *b = acl;
        unsigned mask = 07;

        if (len < 4 || (len - 4) % 8 != 0 || le32_at(b) != ACL_XATTR_VERSION) {
                (void) snprintf(why, size, "its POSIX ACL is not one tierd can read (%zu bytes): remove it "
                                "(setfacl -b)", len);
                return -EINVAL;
        }
        for (size_t o = 4; o < len; o += 8)             /* the mask bounds every named entry */
                if ((unsigned) (b[o] | b[o + 1] << 8) == ACL_TAG_MASK)
                        mask = (unsigned) (b[o + 2] | b[o + 3] << 8);
        for (size_t o = 4; o < len; o += 8) {
                unsigned tag = (unsigned) (b[o] | b[o + 1] << 8), perm = (unsigned) (b[o + 2] | b[o + 3] << 8);
                uint32_t id = le32_at(b + o + 4);

                if (!(perm & mask & ACL_PERM_WRITE))
                        continue;
                if ((tag == ACL_TAG_USER && id != (uint32_t) uid && id != 0) ||
                    (tag == ACL_TAG_GROUP && id != (uint32_t) gid)) {
                        (void) snprintf(why, size, "its POSIX ACL lets %s %" PRIu32 " write it: they can plant "
                                        "links to other files there (setfacl -x %s:%" PRIu32 " it, or setfacl -b)",
                                        tag == ACL_TAG_USER ? "user" : "group", id,
                                        tag == ACL_TAG_USER ? "u" : "g", id);
                        return -EPERM;
                }
        }
        return 0;
}

/* "BASE.XXXXXX" as mkostemp() fills it (six of [A-Za-z0-9]) for one of @bases? */
static bool is_temp_of(const char *name, const char *const *bases) {
        static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

        for (const char *const *b = bases; *b; b++) {
                size_t n = strlen(*b);

                if (strncmp(name, *b, n) == 0 && name[n] == '.' && strlen(name + n + 1) == 6 &&
                    strspn(name + n + 1, alnum) == 6)
                        return true;
        }
        return false;
}

int statefile_remove_temps(int dir_fd, const char *dir, const char *const *bases, uid_t uid) {
        int fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 3), removed = 0;
        DIR *d;

        if (fd < 0)
                return negative_errno();
        d = fdopendir(fd);
        if (!d) {
                int r = negative_errno();

                (void) close(fd);
                return r;
        }
        rewinddir(d);
        for (struct dirent *de; (de = readdir(d));) {
                struct stat st;

                if (!is_temp_of(de->d_name, bases))
                        continue;
                /* never through a link, never a directory or another user's file */
                if (fstatat(dir_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
                    st.st_uid != uid)
                        continue;
                if (unlinkat(dir_fd, de->d_name, 0) < 0) {
                        log_warning_errno(errno, "Cannot remove \"%s/%s\", a temporary file left by a tierd "
                                          "stopped while writing a state file, ignoring: %m", dir, de->d_name);
                        continue;
                }
                log_info("Removed \"%s/%s\", a temporary file left by a tierd stopped while writing a state file",
                         dir, de->d_name);
                removed++;
        }
        (void) closedir(d);
        return removed;
}

/*
 * The POSIX ACL of the directory @fd, O_PATH (search permission on the way to it suffices, as for
 * the open of a name in it) or not: fgetxattr() refuses an O_PATH fd (-EBADF), getxattr() through
 * /proc/self/fd takes it, and reading the system.posix_acl_access attribute needs no permission on
 * the directory.  Without /proc, the directory opened O_RDONLY (read permission, then).
 */
static ssize_t dir_acl_get(int fd, void *acl, size_t size) {
        char proc[64];
        ssize_t n = fgetxattr(fd, "system.posix_acl_access", acl, size);
        _cleanup_close_ int rd = -1;

        if (n >= 0 || errno != EBADF)
                return n;
        (void) snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        n = getxattr(proc, "system.posix_acl_access", acl, size);
        if (n >= 0 || errno != ENOENT)
                return n;
        rd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (rd < 0)
                return -1;
        return fgetxattr(rd, "system.posix_acl_access", acl, size);
}

int statefile_dir_fd_trusted(int fd, uid_t uid, gid_t gid, char *why, size_t size) {
        unsigned char acl[4096];
        struct stat st;
        ssize_t n;

        if (fstat(fd, &st) < 0)
                return negative_errno();
        n = dir_acl_get(fd, acl, sizeof(acl));
        if (n < 0 && errno != ENODATA && errno != EOPNOTSUPP) {
                (void) snprintf(why, size, "its POSIX ACL cannot be read (%s): remove it (setfacl -b)",
                                strerror(errno));
                return -EPERM;
        }
        if (n >= 0 && statefile_dir_acl_trusted(acl, (size_t) n, uid, gid, why, size) < 0)
                return -EPERM;
        return statefile_dir_trusted(&st, uid, gid, why, size) < 0 ? -EPERM : 0;
}

/* The symbolic links statefile_resolve_trusted() follows, at most. */
#define RESOLVE_LINKS_MAX 8

/* @shown, the directory walked so far (for messages), with @comp appended. */
static void shown_append(char *shown, size_t size, const char *comp) {
        size_t n = strlen(shown);

        (void) snprintf(shown + n, size - n, "%s%s", n > 0 && shown[n - 1] == '/' ? "" : "/", comp);
}

/*
 * Walked one component at a time from "/" (or "."), never through a link unjudged: each directory is
 * opened O_PATH|O_NOFOLLOW in the one before it; a symbolic link met there, above the last directory
 * as in it, is followed only when the directory holding it passes statefile_dir_fd_trusted() (a link
 * another user planted in /tmp/x would otherwise lead to any trusted directory, where the name would
 * be created or written over).
 */
int statefile_resolve_trusted(const char *path, uid_t uid, gid_t gid, int *ret_dir_fd, char *ret_base,
                              size_t base_size, char *why, size_t why_size) {
        char rest[PATH_MAX], shown[PATH_MAX], inner[384];
        _cleanup_close_ int cur = -1;
        unsigned links = 0;
        size_t len = strlen(path);

        if (why_size > 0)
                why[0] = '\0';
        if (len == 0 || path[len - 1] == '/')
                return -EINVAL;
        if (snprintf(rest, sizeof(rest), "%s", path) >= (int) sizeof(rest))
                return -ENAMETOOLONG;
        (void) snprintf(shown, sizeof(shown), "%s", path[0] == '/' ? "/" : ".");
        cur = open(shown, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (cur < 0)
                return negative_errno();
        for (;;) {
                char comp[NAME_MAX + 1], link[PATH_MAX];
                const char *p = rest + strspn(rest, "/");
                size_t n = strcspn(p, "/");
                _cleanup_close_ int dir_fd = -1;
                bool last;
                ssize_t k = -1;
                int r;

                if (n == 0)             /* a link to "/" or ending in '/' */
                        return -EINVAL;
                if (n >= sizeof(comp))
                        return -ENAMETOOLONG;
                memcpy(comp, p, n);
                comp[n] = '\0';
                memmove(rest, p + n, strlen(p + n) + 1);
                last = rest[strspn(rest, "/")] == '\0';
                if (last && rest[0] != '\0')
                        return -EINVAL;
                if (!last) {
                        int fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

                        if (fd >= 0) {
                                safe_close(cur);
                                cur = fd;
                                shown_append(shown, sizeof(shown), comp);
                                continue;
                        }
                        if (errno != ENOTDIR && errno != ELOOP)
                                return negative_errno();
                        k = readlinkat(cur, comp, link, sizeof(link));
                        if (k < 0)
                                return errno == EINVAL ? -ENOTDIR : negative_errno();
                }
                /* the last component, or a link above it: judge the directory holding it */
                /* O_PATH, as @cur: search permission on the way suffices, as for the open of the name itself
                 * (an O_RDONLY open here needed read permission: a 0711 directory refused a non-root tierd) */
                dir_fd = fcntl(cur, F_DUPFD_CLOEXEC, 3);
                if (dir_fd < 0)
                        return negative_errno();
                r = statefile_dir_fd_trusted(dir_fd, uid, gid, inner, sizeof(inner));
                if (r == -EPERM)
                        (void) snprintf(why, why_size, "the directory \"%s\" holding \"%s\"%s is not trusted: %s",
                                        shown, comp, links > 0 ? " (where a link leads)" : "", inner);
                if (r < 0)
                        return r;
                if (last) {
                        k = readlinkat(dir_fd, comp, link, sizeof(link));
                        if (k < 0 && errno != EINVAL && errno != ENOENT)
                                return negative_errno();
                        if (k < 0) {    /* not a link, or not there yet: the name to open (O_NOFOLLOW) */
                                if (strlen(comp) >= base_size)
                                        return -EINVAL;
                                (void) snprintf(ret_base, base_size, "%s", comp);
                                *ret_dir_fd = TAKE_FD(dir_fd);
                                return 0;
                        }
                }
                if ((size_t) k >= sizeof(link))
                        return -ENAMETOOLONG;
                link[k] = '\0';
                if (++links > RESOLVE_LINKS_MAX) {
                        (void) snprintf(why, why_size, "more than %d symbolic links lead to it", RESOLVE_LINKS_MAX);
                        return -ELOOP;
                }
                /* a link in a directory only trusted users can write is theirs: follow it, judging where it leads */
                if (strlen(link) + strlen(rest) >= sizeof(rest))
                        return -ENAMETOOLONG;
                memmove(rest + strlen(link), rest, strlen(rest) + 1);
                memcpy(rest, link, strlen(link));
                if (link[0] == '/') {
                        safe_close(cur);
                        cur = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
                        if (cur < 0)
                                return negative_errno();
                        (void) snprintf(shown, sizeof(shown), "/");
                }
        }
}
