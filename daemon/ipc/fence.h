/* SPDX-License-Identifier: MIT */
/* fence.h: a connection's fences (the job's fence page, its wakeup pipe) and the pins it holds (pins.c). */
#pragma once

#include <stdint.h>

typedef struct Conn Conn;
typedef struct Tensor Tensor;

/*
 * fence_complete() - fence @fence of @c ended with @status (0 or -errno,
 * reason @error): advance the connection's watermark on the job's fence
 * page as far as the fences completed in order allow, remember one that
 * completed out of order (at most @max_pending of them), send
 * Event.fence_failed on an error, and wake the client (its wakeup pipe).
 */
void fence_complete(Conn *c, uint64_t fence, int status, const char *error, unsigned max_pending);

#include <stdbool.h>

/*
 * Remember that @c holds a pin of @t in @tier (@write_only, @rw: see PinRec;
 * @rw counts in Tensor.rw_pins; either counts in Copy.writers, which the
 * memory store records before the grant goes out).  -ENOMEM.
 */
int pin_record(Conn *c, Tensor *t, int tier, bool write_only, bool rw);
#define PIN_WRITE_ONLY 1
#define PIN_WRITER 2
/*
 * Forget one such pin: PIN_WRITE_ONLY and PIN_WRITER as it was, -ENOENT when
 * @c holds none.  A PIN_WRITER's caller calls copy_writers(t, tier, -1, c->rank)
 * once the pin is dropped (after a dirty tensor_unpin(): the memory store
 * must never see the written copy as the old version).
 */
int pin_forget(Conn *c, Tensor *t, int tier);
/*
 * Drop every pin @c holds: dirty where it may have written before it went,
 * clean where it only read; @changed (may be NULL) hears of each tensor
 * made dirty.
 */
void pin_drop_all(Conn *c, void (*changed)(Tensor *t, void *userdata), void *userdata);
/* Free what records @c's pins (its pins were dropped, or are forgotten with it). */
void pins_free(Conn *c);

typedef struct Plan Plan;
/*
 * pin_plan_attach() - @c's plan @p learns the pins @c holds outside it, and
 * tells @c's client through Event.phase_refused when it refuses a marker's
 * phase (sched/selfpin.c).  @c outlives @p (it frees its plan first).
 */
void pin_plan_attach(Conn *c, Plan *p);
