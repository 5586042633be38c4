/* SPDX-License-Identifier: MIT */
/* tier-nvme.c: NVMe backing targets, extent allocation, striped O_DIRECT I/O. */

/*
 * Theory of operation: each target is a block device or a preallocated
 * file, opened O_DIRECT and registered with the ring as a fixed file (index
 * = target number).  Space is cut into extents of extent_size bytes, each
 * tracked by one bit of the target's ExtentAlloc.  A tensor's image is a
 * list of extents: extent i lives on target (first + i) mod n, so a large
 * tensor is striped over every target and k drives give about k times the
 * bandwidth.  Extents need not be contiguous on a target.  The I/O itself
 * (one UringReq per extent, crc32c per extent) is driven by the engine (daemon/engine/xfer.c); this
 * module owns the targets and the space, and finds the NVMe controller under
 * each target for its SMART figures (smart.c, read by nvme_smart_refresh()).
 */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/base/statefile.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/macro.h"
#include "util/uring.h"

static int errorf(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int errorf(char **ret_error, int r, const char *fmt, ...) {
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        free(*ret_error);
        *ret_error = s;
        return r;
}

/* @ct's file or device: @base in the directory @dir_fd (statefile_resolve_trusted(), never through a link). */
static int target_open_one(NvmeTarget *t, const ConfigTarget *ct, int dir_fd, const char *base, uint64_t extent_size,
                           bool *created, char **ret_error) {
        struct stat st;
        int fd, r;

        t->fd = t->lock_fd = -1;
        t->path = strdup(ct->path);
        if (!t->path)
                return -ENOMEM;

        /* O_NONBLOCK for the open only (a FIFO planted there must not hang tierd): cleared below,
         * as io_uring would answer -EAGAIN on a block device opened non-blocking */
        fd = openat(dir_fd, base, O_RDWR | O_CLOEXEC | O_DIRECT | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
        if (fd < 0 && errno == ENOENT) {
                if (ct->size == 0)
                        return errorf(ret_error, -ENOENT,
                                      "NVMe target %s does not exist and has no size to create it with (use PATH:SIZE)",
                                      ct->path);
                fd = openat(dir_fd, base, O_RDWR | O_CLOEXEC | O_DIRECT | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
                *created = fd >= 0;
        }
        if (fd < 0) {
                r = negative_errno();
                if (r == -ELOOP)        /* made a link since statefile_resolve_trusted() looked */
                        return errorf(ret_error, r, "NVMe target %s is a symbolic link: not followed", ct->path);
                if (r == -EINVAL && fstatat(dir_fd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) &&
                    !S_ISBLK(st.st_mode))
                        return errorf(ret_error, r, "NVMe target %s is neither a regular file nor a block device",
                                      ct->path);
                if (r == -EINVAL)
                        return errorf(ret_error, r,
                                      "NVMe target %s: the filesystem does not support O_DIRECT (tmpfs?); "
                                      "put the target on a local disk filesystem or use a block device",
                                      ct->path);
                return errorf(ret_error, r, "Cannot open NVMe target %s: %s", ct->path, strerror(-r));
        }
        t->fd = fd;

        if (fstat(fd, &st) < 0)
                return errorf(ret_error, negative_errno(), "Cannot stat %s: %m", ct->path);
        if (!S_ISBLK(st.st_mode) && !S_ISREG(st.st_mode))
                return errorf(ret_error, -EINVAL, "NVMe target %s is neither a regular file nor a block device",
                              ct->path);
        {
                int fl = fcntl(fd, F_GETFL);

                if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
                        return errorf(ret_error, negative_errno(), "Cannot clear O_NONBLOCK on %s: %m", ct->path);
        }
        /* one writer per target: another tierd's lock, or this one's under another name (a second
         * open of the same file or device conflicts with the first), before anything is written */
        t->lock_fd = openat(dir_fd, base, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW);
        if (t->lock_fd < 0)
                return errorf(ret_error, negative_errno(), "Cannot open NVMe target %s to lock it: %m", ct->path);
        if (flock(t->lock_fd, LOCK_EX | LOCK_NB) < 0) {
                r = negative_errno();
                if (r == -EWOULDBLOCK)
                        return errorf(ret_error, -EBUSY,
                                      "NVMe target %s is in use: another tierd holds it, or [nvme] target names "
                                      "the same file or device twice (under two paths); give each tierd its own "
                                      "targets and list each once", ct->path);
                return errorf(ret_error, r, "Cannot lock NVMe target %s: %s", ct->path, strerror(-r));
        }

        if (S_ISBLK(st.st_mode)) {
                uint64_t bytes = 0;

                if (ioctl(fd, BLKGETSIZE64, &bytes) < 0)
                        return errorf(ret_error, negative_errno(), "Cannot get the size of %s: %m", ct->path);
                t->blockdev = true;
                t->size = ct->size > 0 ? MIN(ct->size, bytes) : bytes;
        } else if (S_ISREG(st.st_mode)) {
                uint64_t want = ct->size > 0 ? ct->size : (uint64_t) st.st_size;
                struct statfs sf;

                if (want == 0)
                        return errorf(ret_error, -EINVAL, "NVMe target %s is empty; give a size (PATH:SIZE)", ct->path);
                if (fstatfs(fd, &sf) < 0)
                        return errorf(ret_error, negative_errno(), "Cannot statfs NVMe target %s: %m", ct->path);
                if ((uint64_t) sf.f_type == TMPFS_MAGIC || (uint64_t) sf.f_type == RAMFS_MAGIC)
                        return errorf(ret_error, -EINVAL,
                                      "NVMe target %s is on a %s: that is memory, not a drive (tierd would count "
                                      "it twice against RAM, and it is gone at reboot); put the target on a disk "
                                      "filesystem or use a block device",
                                      ct->path, (uint64_t) sf.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
                /*
                 * Back every byte, holes included: a file made with truncate(1), or one whose
                 * blocks were punched out, would take writes until the filesystem fills and then
                 * fail every write-down.  fallocate() over blocks already there changes nothing.
                 * Not when the free space cannot cover the holes: a failing fallocate() keeps
                 * what it allocated, and would leave the filesystem full.
                 */
                if ((uint64_t) st.st_blocks * 512 < want &&
                    want - (uint64_t) st.st_blocks * 512 > (uint64_t) sf.f_bavail * (uint64_t) sf.f_bsize)
                        return errorf(ret_error, -ENOSPC,
                                      "NVMe target %s: cannot back its %" PRIu64 " bytes: %" PRIu64 " are allocated "
                                      "and its filesystem has %" PRIu64 " free for the other %" PRIu64 "; free "
                                      "space, or give a smaller size (PATH:SIZE)",
                                      ct->path, want, (uint64_t) st.st_blocks * 512,
                                      (uint64_t) sf.f_bavail * (uint64_t) sf.f_bsize,
                                      want - (uint64_t) st.st_blocks * 512);
                if (fallocate(fd, 0, 0, (off_t) want) < 0) {
                        r = negative_errno();
                        if (r != -EOPNOTSUPP)
                                return errorf(ret_error, r,
                                              "NVMe target %s: cannot back its %" PRIu64 " bytes (%" PRIu64
                                              " allocated, %" PRIu64 " free on its filesystem): %s; free space, "
                                              "or give a smaller size (PATH:SIZE)",
                                              ct->path, want, (uint64_t) st.st_blocks * 512,
                                              (uint64_t) sf.f_bavail * (uint64_t) sf.f_bsize, strerror(-r));
                        if ((uint64_t) st.st_blocks * 512 < want)
                                return errorf(ret_error, -ENOSPC,
                                              "NVMe target %s: %" PRIu64 " of its %" PRIu64 " bytes are allocated "
                                              "and its filesystem cannot preallocate the rest (no fallocate); "
                                              "write the file whole first (dd) or use a block device",
                                              ct->path, (uint64_t) st.st_blocks * 512, want);
                }
                t->size = want;
        } else
                return errorf(ret_error, -EINVAL, "NVMe target %s is neither a regular file nor a block device",
                              ct->path);

        t->size = t->size / extent_size * extent_size;
        if (t->size == 0)
                return errorf(ret_error, -EINVAL, "NVMe target %s is smaller than one extent (%" PRIu64 " bytes)",
                              ct->path, extent_size);

        /* Prove O_DIRECT works here: an aligned read of the first 4 KiB. */
        {
                void *probe;

                if (posix_memalign(&probe, 4096, 4096) != 0)
                        return -ENOMEM;
                r = (int) pread(fd, probe, 4096, 0);
                if (r < 0)
                        r = negative_errno();
                free(probe);
                if (r < 0)
                        return errorf(ret_error, r, "NVMe target %s refuses O_DIRECT reads: %s", ct->path, strerror(-r));
        }

        r = extent_alloc_init(&t->extents, t->size / extent_size);
        if (r < 0)
                return r;

        /* the drive under it, for its wear (SMART): read later, by nvme_smart_refresh() */
        if (smart_locate("/sys", S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev, t->smart_ctrl,
                         sizeof(t->smart_ctrl), t->smart_na, sizeof(t->smart_na)) > 0)
                t->smart_na[0] = '\0';
        return 0;
}

unsigned nvme_check_backed(const NvmeTier *n) {
        unsigned bad = 0;

        for (unsigned i = 0; n && i < n->n_targets; i++) {
                const NvmeTarget *t = &n->targets[i];
                struct stat st;

                if (t->blockdev || t->fd < 0)
                        continue;
                if (fstat(t->fd, &st) < 0) {
                        log_error_errno(negative_errno(), "Cannot stat NVMe target %s: %m", t->path);
                        bad++;
                } else if ((uint64_t) st.st_blocks * 512 < t->size) {
                        log_error("NVMe target %s: only %" PRIu64 " of its %" PRIu64 " bytes are allocated on its "
                                  "filesystem (a hole punched in it?): write-downs may fail when the filesystem "
                                  "fills; restart tierd to allocate it again",
                                  t->path, (uint64_t) st.st_blocks * 512, t->size);
                        bad++;
                }
        }
        return bad;
}

int nvme_check_trusted(const Config *c, bool warn_unchecked, char *why, size_t size) {
        for (size_t i = 0; i < c->n_targets; i++) {
                _cleanup_close_ int dir_fd = -1;
                char base[NAME_MAX + 1], inner[768];
                int r = statefile_resolve_trusted(c->targets[i].path, geteuid(), getegid(), &dir_fd, base,
                                                  sizeof(base), inner, sizeof(inner));

                if (r == -EPERM || r == -ELOOP) {
                        (void) snprintf(why, size, "Refusing NVMe target %s: %s", c->targets[i].path, inner);
                        return r;
                }
                if (r < 0 && r != -ENOENT && warn_unchecked)
                        log_warning_errno(r, "Cannot look at the directory of NVMe target %s, not checked: %m",
                                          c->targets[i].path);
        }
        return 0;
}

/*
 * target_open_one(), in the directory statefile_resolve_trusted() judged: one another user can write
 * could hold a link aiming root's tierd at a file to create, truncate and write over; and a file it
 * made removed again when the target is refused (nothing left behind).
 */
static int target_open(NvmeTarget *t, const ConfigTarget *ct, uint64_t extent_size, char **ret_error) {
        _cleanup_close_ int dir_fd = -1;
        char base[NAME_MAX + 1], why[768];
        bool created = false;
        int r;

        t->fd = t->lock_fd = -1;
        r = statefile_resolve_trusted(ct->path, geteuid(), getegid(), &dir_fd, base, sizeof(base), why, sizeof(why));
        if (r == -EPERM || r == -ELOOP)
                return errorf(ret_error, r, "Refusing NVMe target %s: %s", ct->path, why);
        if (r < 0)
                return errorf(ret_error, r, "Cannot open NVMe target %s: %s", ct->path, strerror(-r));
        r = target_open_one(t, ct, dir_fd, base, extent_size, &created, ret_error);
        if (r < 0 && created)
                (void) unlinkat(dir_fd, base, 0);
        return r;
}

void nvme_smart_refresh(NvmeTarget *t, uint64_t now_usec, uint64_t max_age_usec) {
        char why[sizeof(t->smart_na)] = "";
        SmartLog log;

        if (!t->smart_ctrl[0])
                return;                 /* not NVMe: smart_na says why */
        if (t->smart_usec && now_usec - t->smart_usec < max_age_usec)
                return;
        t->smart_usec = now_usec;       /* a failure is not retried before max_age either */
        if (smart_read(t->smart_ctrl, &log, why, sizeof(why)) < 0) {
                if (strcmp(why, t->smart_na) != 0)
                        log_warning("NVMe target %s: no drive wear figures: %s, ignoring", t->path, why);
                (void) snprintf(t->smart_na, sizeof(t->smart_na), "%s", why);
                return;
        }
        t->smart = log;
        t->smart_na[0] = '\0';
}

int nvme_tier_new(const Config *c, Uring *uring, NvmeTier **ret, char **ret_error) {
        _cleanup_free_ int *fds = NULL;
        NvmeTier *n;
        int r;

        n = calloc(1, sizeof(*n));
        if (!n)
                return -ENOMEM;
        n->extent_size = c->nvme_extent_size;
        n->uring = uring;
        n->targets = calloc(c->n_targets, sizeof(NvmeTarget));
        fds = calloc(c->n_targets, sizeof(int));
        if (!n->targets || !fds) {
                r = -ENOMEM;
                goto fail;
        }
        for (size_t i = 0; i < c->n_targets; i++) {
                n->n_targets++;
                r = target_open(&n->targets[i], &c->targets[i], n->extent_size, ret_error);
                if (r < 0)
                        goto fail;
                fds[i] = n->targets[i].fd;
                n->capacity += n->targets[i].size;
        }
        r = uring_register_files(uring, fds, n->n_targets);
        if (r < 0) {
                errorf(ret_error, r, "Cannot register NVMe targets with io_uring: %s", strerror(-r));
                goto fail;
        }
        nvme_set_bandwidth(n, c->nvme_bandwidth);
        *ret = n;
        return 0;
fail:
        nvme_tier_free(n);
        return r;
}

NvmeTier *nvme_tier_free(NvmeTier *n) {
        if (!n)
                return NULL;
        for (unsigned i = 0; i < n->n_targets; i++) {
                safe_close(n->targets[i].fd);
                safe_close(n->targets[i].lock_fd);
                free(n->targets[i].path);
                extent_alloc_deinit(&n->targets[i].extents);
        }
        free(n->targets);
        free(n);
        return NULL;
}

void nvme_set_bandwidth(NvmeTier *n, uint64_t bytes_per_sec) {
        for (unsigned i = 0; i < n->n_targets; i++)
                (void) uring_set_throttle(n->uring, i, bytes_per_sec);
}

int nvme_alloc(NvmeTier *n, uint64_t size, unsigned first, NvmeExtent **ret, uint32_t *ret_n) {
        uint64_t count = DIV_ROUND_UP(size, n->extent_size);
        NvmeExtent *ext;
        int r;

        if (count == 0 || count > UINT32_MAX)
                return -EINVAL;
        ext = calloc(count, sizeof(*ext));
        if (!ext)
                return -ENOMEM;
        /* striped round-robin from target @first; a full target's extent goes to the next one with room
         * (targets of unequal sizes: the capacity is their sum) */
        for (uint64_t i = 0; i < count; i++) {
                r = -ENOSPC;
                for (unsigned k = 0; k < n->n_targets && r < 0; k++) {
                        unsigned ti = (unsigned) ((first + i + k) % n->n_targets);

                        r = extent_alloc_get(&n->targets[ti].extents, 1, &ext[i].unit);
                        ext[i].target = ti;
                }
                if (r < 0) {
                        nvme_free(n, ext, (uint32_t) i);
                        return r;
                }
        }
        *ret = ext;
        *ret_n = (uint32_t) count;
        return 0;
}

void nvme_free(NvmeTier *n, NvmeExtent *ext, uint32_t n_ext) {
        for (uint32_t i = 0; i < n_ext; i++) {
                ExtentAlloc *a = &n->targets[ext[i].target].extents;

                if (extent_alloc_put(a, ext[i].unit, 1) < 0)
                        continue;
                /*
                 * Reuse the lowest free extents first: the written area of a target
                 * stays compact, and on a file target never-written regions are
                 * unwritten extents whose first write costs the filesystem a
                 * metadata update.
                 */
                if (ext[i].unit < a->hint)
                        a->hint = ext[i].unit;
        }
        free(ext);
}
