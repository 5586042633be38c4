/* SPDX-License-Identifier: MIT */
/* kernel.c: is this kernel new enough for tierd?  At start and --check-config, before anything is made. */

/*
 * Theory of operation: tierd uses these without a fallback (mainline
 * version that brought each; a vendor kernel may have backported them):
 *
 *   - io_uring sparse fixed-buffer registration
 *     (io_uring_register_buffers_sparse(), IORING_RSRC_REGISTER_SPARSE for
 *     buffers): 5.19, the newest, so KERNEL_MIN_VERSION.  Older kernels
 *     answer EINVAL, which the start reported as a bare "Cannot register
 *     io_uring buffers: Invalid argument";
 *   - io_uring fixed buffers in shmem (the host pool's memfds): 5.14;
 *   - preadv2(RWF_NOWAIT) on an eventfd (plan_read_marker(): the marker
 *     eventfd's open file description is shared with the client, who may
 *     clear O_NONBLOCK, so only a per-call flag keeps the loop from
 *     blocking): 5.12; EOPNOTSUPP before;
 *   - io_uring buffer updates (IORING_REGISTER_BUFFERS_UPDATE): 5.13;
 *     IORING_OP_READ / IORING_OP_WRITE: 5.6; registered eventfd: 5.2;
 *     registered files, READ_FIXED / WRITE_FIXED: 5.1;
 *   - F_SEAL_FUTURE_WRITE (the fence page): 5.1;
 *   - memfd_create() and sealing, getrandom(): 3.17; renameat2(): 3.15.
 *
 * Used with a fallback, so not required: close_range() (5.9; else
 * close() in a loop), GRND_INSECURE (5.6; else GRND_NONBLOCK),
 * MADV_POPULATE_WRITE (5.14; else pages fault in on first use), mbind().
 *
 * Rather than compare uname's version (vendor kernels backport), the two
 * decisive features are tried: sparse registration (the newest) and
 * RWF_NOWAIT on an eventfd (without it a client can stop tierd's loop).
 * The check is split as capacity.c's is: kernel_facts_read() probes,
 * kernel_check(), a pure function, decides and words the refusal, so a
 * test gives it any kernel.
 */

#include <errno.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "daemon/core/kernel.h"
#include "proto/macro.h"

static int probe_eventfd_nowait(void) {
        uint64_t v = 0;
        ssize_t n;
        int fd, r;

        /* non-blocking and holding a count: a kernel that took the flag reads it, none can block */
        fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0)
                return -errno;
        n = preadv2(fd, &(struct iovec) { .iov_base = &v, .iov_len = sizeof(v) }, 1, -1, RWF_NOWAIT);
        r = n == (ssize_t) sizeof(v) ? 0 : n < 0 ? -errno : -EIO;
        safe_close(fd);
        return r;
}

static int probe_uring_sparse_buffers(void) {
        struct io_uring ring;
        int r;

        r = io_uring_queue_init(1, &ring, 0);
        if (r == -EPERM || r == -EACCES || r == -ENOSYS)
                return r;               /* io_uring itself is off here: kernel_check() says where to turn it on */
        if (r < 0)
                return KERNEL_UNPROBED;
        r = io_uring_register_buffers_sparse(&ring, 1);
        io_uring_queue_exit(&ring);
        return r < 0 ? r : 0;
}

int kernel_facts_read(KernelFacts *ret) {
        struct utsname u;

        *ret = (KernelFacts) {};
        if (uname(&u) == 0)
                snprintf(ret->release, sizeof(ret->release), "%s", u.release);
        ret->eventfd_nowait = probe_eventfd_nowait();
        ret->uring_sparse_buffers = probe_uring_sparse_buffers();
        return 0;
}

int kernel_check(const KernelFacts *f, char **ret_why) {
        char missing[512] = "";
        size_t l = 0;

        *ret_why = NULL;
        if (f->uring_sparse_buffers == -EPERM || f->uring_sparse_buffers == -EACCES ||
            f->uring_sparse_buffers == -ENOSYS) {
                if (asprintf(ret_why, "io_uring is turned off for tierd here (io_uring_setup: %s): tierd moves all "
                             "NVMe data with io_uring. On Linux 6.6 or newer the sysctl kernel.io_uring_disabled "
                             "must be 0 (or 1 with tierd in the group kernel.io_uring_group); in a container, its "
                             "seccomp profile must allow io_uring_setup, io_uring_enter and io_uring_register; a "
                             "kernel built without CONFIG_IO_URING cannot run tierd.",
                             strerror(-f->uring_sparse_buffers)) < 0) {
                        *ret_why = NULL;
                        return -ENOMEM;
                }
                return KERNEL_REFUSED;
        }
        if (f->uring_sparse_buffers < 0)
                l += (size_t) snprintf(missing + l, sizeof(missing) - l, "%ssparse io_uring buffer registration "
                                       "(Linux 5.19; %s)", l ? ", " : "", strerror(-f->uring_sparse_buffers));
        if (f->eventfd_nowait < 0 && l < sizeof(missing))
                l += (size_t) snprintf(missing + l, sizeof(missing) - l, "%spreadv2(RWF_NOWAIT) on an eventfd "
                                       "(Linux 5.12; %s)", l ? ", " : "", strerror(-f->eventfd_nowait));
        if (l == 0)
                return 0;
        if (asprintf(ret_why, "This kernel (Linux %s) lacks %s: tierd needs Linux %s or newer; boot a newer "
                     "kernel.", f->release[0] ? f->release : "of unknown version", missing,
                     KERNEL_MIN_VERSION) < 0) {
                *ret_why = NULL;
                return -ENOMEM;
        }
        return KERNEL_REFUSED;
}
