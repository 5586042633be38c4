/* SPDX-License-Identifier: MIT */
/* fake-cuda.h: controls of the fake CUDA driver (libcuda-fake.so) for tests. */
#pragma once

#include <stdint.h>

/*
 * The fake is loaded like the real driver (TIER_LIBCUDA=.../libcuda-fake.so)
 * by tierd and libtier; a test dlopen()s the same path to reach these
 * functions, which then act on the very instance the code under test uses.
 *
 * Environment, read at cuInit():
 *   FAKE_CUDA_MEM=BYTES       device memory (default 1 GiB)
 *   FAKE_CUDA_DEVICES=N       number of devices (default 1)
 *   FAKE_CUDA_NO_FD=1         no POSIX fd export (HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 0)
 *   FAKE_CUDA_INIT_ERROR=N    cuInit returns CUresult N
 */

typedef struct FakeCudaStats {
        uint64_t creates, releases, live_allocs, live_bytes;
        uint64_t exports, imports;
        uint64_t maps, unmaps, reserved;        /* reserved: address ranges held now */
        uint64_t htod_calls, htod_bytes, dtoh_calls, dtoh_bytes;
        uint64_t memsets, memset_bytes;
        uint64_t stream_waits;                  /* cuStreamWaitEvent calls */
        uint64_t streams, events;               /* live objects */
        uint64_t ipc_gets, ipc_opens;
        uint64_t host_registered, host_registered_bytes;       /* live registrations */
} FakeCudaStats;

/* Symbol names, for dlsym(). */
#define FAKE_CUDA_STATS "fake_cuda_stats"
#define FAKE_CUDA_HOLD "fake_cuda_hold"
#define FAKE_CUDA_RELEASE "fake_cuda_release"
#define FAKE_CUDA_HOLD_EVENT "fake_cuda_hold_event"
#define FAKE_CUDA_RELEASE_EVENT "fake_cuda_release_event"
#define FAKE_CUDA_FAIL "fake_cuda_fail"
#define FAKE_CUDA_PCI_BUS_ID "0000:3B:00.0"

typedef void (*fake_cuda_stats_t)(FakeCudaStats *ret);
/* Events recorded from now on stay pending (cuEventQuery: not ready; cuEventSynchronize blocks)... */
typedef void (*fake_cuda_hold_t)(void);
/* ...until this completes them all. */
typedef void (*fake_cuda_release_t)(void);
/*
 * One event (a CUevent of this process: not one opened from a handle), recorded already or later, stays
 * pending, and what a stream queued after a wait for it stays queued (cuStreamWaitEvent() returns at
 * once, as the driver's), until fake_cuda_release_event() of it, which runs what then can run.
 */
typedef void (*fake_cuda_hold_event_t)(void *event);
typedef void (*fake_cuda_release_event_t)(void *event);
/* After @skip more successful calls, the next @count calls of @function (its cuda.h name, e.g.
 * "cuMemCreate") return @result. */
typedef void (*fake_cuda_fail_t)(const char *function, int result, unsigned skip, unsigned count);
