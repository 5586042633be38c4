/* SPDX-License-Identifier: MIT */
/* statefile.h: write a file atomically (temp file, fsync, rename), read a small one whole. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/*
 * statefile_write() - replace @path by @len bytes at @data, atomically:
 * readers see the old file or the new one, never part of one.  The bytes go
 * to a temporary file "PATH.XXXXXX" in the same directory, which is
 * fsync()ed, given @mode and
 * renamed over @path; then the directory is fsync()ed.  0 or -errno; on
 * failure @path is unchanged and no temporary file is left.  1 when @path
 * was replaced but the directory's fsync() failed: readers see the new
 * file, which a power loss may yet take back (the caller keeps the new
 * state, as the file holds it, and may say so).
 */
int statefile_write(const char *path, const void *data, size_t len, mode_t mode);

/*
 * statefile_read() - the whole of @path (at most @max bytes) into a
 * malloc()ed, NUL-terminated buffer.  -ENOENT if it does not exist,
 * -EFBIG if it is larger than @max, -EINVAL if it is not a regular file (a
 * FIFO, a socket, a device, a directory or a symbolic link, which is not
 * followed); opened O_NONBLOCK, so nothing planted there can block it.
 */
int statefile_read(const char *path, size_t max, char **ret, size_t *ret_len);

/* How many set-aside copies of one file are kept (the oldest beyond it are removed). */
#define STATEFILE_ASIDE_MAX 8

/*
 * statefile_set_aside() - rename @path to "PATH.corrupt.YYYYMMDDTHHMMSSZ"
 * (UTC; ".1", ".2", ... after it when that name is taken: never over an
 * older copy) so that a file that cannot be read is kept for a person to
 * look at; then remove the oldest copies beyond STATEFILE_ASIDE_MAX.  The
 * new name (with @path's directory) is written to @ret_name.  0 or -errno;
 * on failure @path is where it was.
 */
int statefile_set_aside(const char *path, char *ret_name, size_t size);

/*
 * statefile_dir_trusted() - may a tierd of effective @uid and @gid keep its
 * state in the directory @st describes?  Only when nobody else can put a
 * name in it (a symbolic link to a file of root's as an NVMe target, a hard
 * link as the index): a directory, owned by @uid or root, writable by its
 * group only when that is @gid, never by others (sticky or not).  0, or
 * -EPERM with @why (of @size bytes; NULL when @size is 0) saying what is
 * wrong; -ENOTDIR when it is not a directory.
 */
int statefile_dir_trusted(const struct stat *st, uid_t uid, gid_t gid, char *why, size_t size);
/*
 * statefile_dir_acl_trusted() - the same for the directory's POSIX access
 * ACL (@acl, @len bytes: the system.posix_acl_access extended attribute as
 * the kernel gives it): with an ACL the mode's group bits are its mask, so
 * a named user or group entry other than @uid / @gid that may write (its
 * bits and the mask's) passes statefile_dir_trusted() unseen.  0, or
 * -EPERM with @why; -EINVAL for an ACL it cannot read (refused: not judged).
 */
int statefile_dir_acl_trusted(const void *acl, size_t len, uid_t uid, gid_t gid, char *why, size_t size);

/*
 * statefile_remove_temps() - remove from the directory @dir_fd (named @dir,
 * for the log) the temporary files statefile_write() leaves when killed
 * between making one and renaming it: the names "BASE.XXXXXX" (six letters
 * or digits, as mkostemp() makes them) for a BASE among @bases (NULL-ended)
 * that are regular files (not followed: a link of that name stays) owned
 * by @uid; each is logged.  For the state directory (trusted, locked) and
 * the metrics file's (core/monitor.c): unlinkat() on @dir_fd removes a
 * name there and follows none.  The count removed, or -errno when the
 * directory cannot be read.
 */
int statefile_remove_temps(int dir_fd, const char *dir, const char *const *bases, uid_t uid);

/*
 * statefile_dir_fd_trusted() - statefile_dir_acl_trusted() and
 * statefile_dir_trusted() for the open directory @fd (O_PATH too: its ACL
 * is then read through /proc/self/fd).  0; -EPERM with @why;
 * -errno when it cannot be looked at.
 */
int statefile_dir_fd_trusted(int fd, uid_t uid, gid_t gid, char *why, size_t size);

/*
 * statefile_resolve_trusted() - the directory and name that @path stands
 * for, for a tierd of @uid and @gid to open (or create) as root without a
 * link planted by another user aiming it elsewhere: the directory holding
 * the last component must pass statefile_dir_fd_trusted(); a symbolic link,
 * there or in a directory above it (the path is walked a component at a
 * time, O_NOFOLLOW), is followed only when the directory holding it passes
 * too (the link is its owner's, as the directory is), at most 8.  Search
 * permission on the way suffices (each directory is opened and judged
 * O_PATH, its ACL read through /proc/self/fd), as for the open itself: a
 * tierd not run as root needs no read permission on them.  On success
 * *@ret_dir_fd is that directory, open O_PATH|O_CLOEXEC (for openat(),
 * fstatat(), unlinkat()), and @ret_base (@base_size bytes) the name in it, which
 * is not a link or does not exist: open it with openat(..., O_NOFOLLOW).
 * -EPERM or -ELOOP with @why naming the directory and what is wrong
 * (@why is "" on any other error); -EINVAL for a path ending in '/';
 * -ENOENT when a directory does not exist; -errno.
 */
int statefile_resolve_trusted(const char *path, uid_t uid, gid_t gid, int *ret_dir_fd, char *ret_base,
                              size_t base_size, char *why, size_t why_size);
