/* SPDX-License-Identifier: MIT */
/* fence.h: a connection's fences (the job's fence page, its eventfd) and the pins it holds. */
#pragma once

#include <stdint.h>

typedef struct Conn Conn;
typedef struct Tensor Tensor;

/*
 * fence_complete() - fence @fence of @c ended with @status (0 or -errno,
 * reason @error): advance the connection's watermark on the job's fence
 * page as far as the fences completed in order allow, remember one that
 * completed out of order (at most @max_pending of them), send
 * Event.fence_failed on an error, and wake the client's eventfd.
 */
void fence_complete(Conn *c, uint64_t fence, int status, const char *error, unsigned max_pending);

#include <stdbool.h>

/* Remember that @c holds a pin of @t in @tier (@write_only, @rw: see PinRec; @rw counts in Tensor.rw_pins).  -ENOMEM. */
int pin_record(Conn *c, Tensor *t, int tier, bool write_only, bool rw);
/* Forget one such pin: 1 when it was write-only, 0 when not, -ENOENT when @c holds none. */
int pin_forget(Conn *c, Tensor *t, int tier);
/* Drop every pin @c holds: dirty where it may have written before it went, clean where it only read. */
void pin_drop_all(Conn *c);
