/* SPDX-License-Identifier: MIT */
/* kernel.h: is this kernel new enough for tierd?  At start and --check-config, before anything is made. */
#pragma once

/*
 * The oldest mainline Linux that has everything tierd uses without a
 * fallback: sparse io_uring fixed-buffer registration (kernel.c lists the
 * rest, each older).
 */
#define KERNEL_MIN_VERSION "5.19"

/* kernel_check()'s outcome besides 0 and -errno: this kernel lacks what tierd needs; the message says what. */
#define KERNEL_REFUSED 1

/*
 * KernelFacts.uring_sparse_buffers: no ring could be made to try it, for a reason other than io_uring being
 * off (-EPERM, -EACCES, -ENOSYS: refused); the start says why when it makes its own.
 */
#define KERNEL_UNPROBED 1

/* What the checks look at, read by kernel_facts_read() or made up by a test. */
typedef struct KernelFacts {
        char release[65];               /* uname's release ("6.1.0-18-amd64"); "": unknown */
        int eventfd_nowait;             /* preadv2(RWF_NOWAIT) on an eventfd: 0 works, else -errno */
        int uring_sparse_buffers;       /* io_uring_register_buffers_sparse(): 0 works, -errno, KERNEL_UNPROBED */
} KernelFacts;

/* Probe this kernel: uname, then each decisive feature tried once (no state kept: every fd closed). */
int kernel_facts_read(KernelFacts *ret);

/*
 * 0 when @f has what tierd needs; KERNEL_REFUSED with *@ret_why (malloc'd)
 * naming what is missing, the kernel that has it and the one tierd needs;
 * -ENOMEM.
 */
int kernel_check(const KernelFacts *f, char **ret_why);
