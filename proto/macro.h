/* SPDX-License-Identifier: MIT */
/* macro.h: cleanup and small helpers shared by tierd, libtier and tests. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)
#define _fallthrough_ __attribute__((__fallthrough__))

#define PID_FMT "%d"
#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
#define ALIGN_UP(n, a) (((n) + (a) - 1) / (a) * (a))

#define container_of(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* Hand ownership over: return the value and reset the variable. */
#define TAKE_PTR(p)                                     \
        ({                                              \
                __typeof__(p) *_pp_ = &(p);             \
                __typeof__(p) _p_ = *_pp_;              \
                *_pp_ = NULL;                           \
                _p_;                                    \
        })
#define TAKE_FD(fd)                                     \
        ({                                              \
                int *_pfd_ = &(fd);                     \
                int _fd_ = *_pfd_;                      \
                *_pfd_ = -1;                            \
                _fd_;                                   \
        })

static inline int safe_close(int fd) {
        if (fd >= 0) {
                int saved = errno;
                (void) close(fd);
                errno = saved;
        }
        return -1;
}

static inline void closep(int *fd) {
        safe_close(*fd);
}

static inline void freep(void *p) {
        free(*(void **) p);
}

#define _cleanup_free_ _cleanup_(freep)
#define _cleanup_close_ _cleanup_(closep)

/* free() that returns NULL, for "p = mfree(p)". */
static inline void *mfree(void *p) {
        free(p);
        return NULL;
}

/* Return -errno from the last failed libc call, never 0. */
static inline int negative_errno(void) {
        return errno > 0 ? -errno : -EIO;
}

#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)         \
        static inline void func##p(type *p) {           \
                if (*p)                                 \
                        func(*p);                       \
        }
