/* SPDX-License-Identifier: MIT */
/* fixture.h: an in-process tierd core (Manager without a socket) for the unit tests of the rooms. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/base/config.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/registry.h"

#define MiB (1024ull * 1024ull)

struct CMUnitTest;

/*
 * fixture_new() - a Manager on the emulated VRAM backend with one NVMe
 * target file of @target_size bytes in the test's temporary directory.
 * @setup changes the configuration first (NULL: the defaults below).
 * Defaults: host 8M in 4M segments, 4M per job; vram 4M in 2M chunks, 2M
 * per job; nvme 16M per job; policy timeline.
 */
Manager *fixture_new(uint64_t target_size, void (*setup)(Config *c, void *userdata), void *userdata);
/* Let running transfers end (FIXTURE_RUN_UNTIL()), then free everything. */
void fixture_free(Manager *m);

/*
 * Run @rounds iterations of the event loop: each dispatches one event, or
 * waits up to 2 ms for one (sd_event_run() takes microseconds).
 */
void fixture_run(Manager *m, unsigned rounds);

/*
 * How long the loop may take to bring about what a test waits for: a bound
 * for "it never happens", not a measurement.  A count of rounds is none:
 * how many a transfer takes depends on the machine (ASan, valgrind, load).
 */
#define FIXTURE_NEVER_USEC (30ull * 1000000ull)

/* CLOCK_MONOTONIC µs FIXTURE_NEVER_USEC from now. */
uint64_t fixture_deadline(void);
/* Run one round of the loop unless @deadline (fixture_deadline()) passed; false once it has. */
bool fixture_run_before(Manager *m, uint64_t deadline);

/*
 * FIXTURE_RUN_UNTIL() - run the loop of @m round by round until @cond holds
 * or FIXTURE_NEVER_USEC passed; the caller asserts @cond afterwards.
 */
#define FIXTURE_RUN_UNTIL(m, cond)                                                                      \
        do {                                                                                            \
                uint64_t fixture_until_ = fixture_deadline();                                           \
                while (!(cond) && fixture_run_before((m), fixture_until_))                              \
                        ;                                                                               \
        } while (0)

/* Submit an op and run the loop until it completes; returns its status. */
int fixture_op(Manager *m, OpKind kind, Tensor *t, int tier);
/* Give @t data: pinned in host, every byte set to @v, unpinned dirty (its sole copy is in host). */
void fixture_host_data(Manager *m, Tensor *t, uint8_t v);
/* Give @t data (version 1) and leave it only on NVMe. */
void fixture_on_nvme(Manager *m, Tensor *t);
/* Bring @t into @tier (pinned, then unpinned; @dirty: as written). */
void fixture_touch(Manager *m, Tensor *t, int tier, bool dirty);
/* A new tensor of @j. */
Tensor *fixture_tensor(Job *j, const char *name, uint64_t size);
/* Set every byte of @t's copy in @tier (host or vram), all its pieces, to @v. */
void fixture_fill(Tensor *t, int tier, uint8_t v);
/* The byte at @off of @t's copy in @tier (host or vram). */
uint8_t fixture_byte(const Tensor *t, int tier, uint64_t off);

/*
 * fixture_main() - run @tests as cmocka group @name with the signals the
 * Manager watches blocked, in a fresh temporary directory (removed after).
 */
int fixture_main(const char *name, const struct CMUnitTest *tests, size_t n);
