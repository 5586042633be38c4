/* SPDX-License-Identifier: MIT */
/* fake-cuda-private.h: what the files of the fake CUDA driver share (the lock, counts, injected failures). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

#include "tests/helpers/fake-cuda.h"

/* Exported: the project builds with -fvisibility=hidden. */
#define FAKE_API __attribute__((visibility("default")))
/* Shared by the fake's files, not seen from outside. */
#define FAKE_HIDDEN __attribute__((visibility("hidden")))

/* All state is behind this one mutex. */
extern pthread_mutex_t fake_lock FAKE_HIDDEN;
extern bool fake_initialized FAKE_HIDDEN;      /* cuInit() succeeded */
extern FakeCudaStats fake_counts FAKE_HIDDEN;  /* what fake_cuda_stats() shows */

/* Called with the lock held: an injected failure of @function (fake_cuda_fail()), or CUDA_SUCCESS. */
CUresult fake_injected(const char *function) FAKE_HIDDEN;

/* Called with the lock held: queue a copy or a memset on @stream (NULL: the NULL stream), in order. */
CUresult fake_submit_copy(CUstream stream, void *dst, const void *src, size_t n) FAKE_HIDDEN;
CUresult fake_submit_set(CUstream stream, void *dst, unsigned char value, size_t n) FAKE_HIDDEN;

/* Every driver call: an injected failure or no cuInit() returns at once, else it runs under the lock... */
#define ENTER(name)                                     \
        CUresult _r;                                    \
        pthread_mutex_lock(&fake_lock);                 \
        _r = fake_injected(name);                       \
        if (_r == CUDA_SUCCESS && !fake_initialized)    \
                _r = CUDA_ERROR_NOT_INITIALIZED;        \
        if (_r != CUDA_SUCCESS) {                       \
                pthread_mutex_unlock(&fake_lock);       \
                return _r;                              \
        }
/* ...and returns through this, @r worked out still under the lock. */
#define LEAVE(r)                                        \
        do {                                            \
                CUresult _l = (r);                      \
                pthread_mutex_unlock(&fake_lock);       \
                return _l;                              \
        } while (0)
