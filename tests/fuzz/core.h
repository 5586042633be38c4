/* SPDX-License-Identifier: MIT */
/* core.h: an in-process tierd core for the fuzz targets, and fds of every kind a client could pass. */
#pragma once

#include <stdint.h>

#include "daemon/core/manager.h"

/*
 * core_new() - a Manager without a listening socket: emulated VRAM (1M in
 * 256K chunks, 768K per job), a host pool of 2M in 256K segments (memfds,
 * 1.5M per job), one 4M NVMe target file (64K extents, 3M per job) in a
 * temporary directory made once per process, policy @policy
 * (SchedPolicyKind), no linger, logging off, 64 tensors a job and 96 a
 * uid, the job name "owned" owned by uid 1000 ([quota] owner =).  Aborts
 * on failure.  Small, so that a fresh core per input is quick to make.
 */
Manager *core_new(int policy);
/* Let transfers in flight finish (bounded), then free everything. */
void core_free(Manager *m);
/* One pass of the event loop, waiting at most @timeout_usec. */
void core_run(Manager *m, uint64_t timeout_usec);
/* Run the loop until no transfer is in flight (at most 2000 passes of up to 10 ms). */
void core_settle(Manager *m);
