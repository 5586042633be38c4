/* SPDX-License-Identifier: MIT */
/* timeline-status.h: the link counters bench-timeline reads from tierd's status JSON. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Link counters from tierd's status (bytes). */
typedef struct Counters {
        uint64_t nvme_read, nvme_write, to_vram, from_vram;
        uint64_t target_read, target_written;
} Counters;

/*
 * counters_parse() - the global link counters and the sum of the NVMe
 * targets' counters of @text, tier_client_status(TIER_STATUS_JSON) output, into
 * *@ret; with @policy, also the scheduling policy's name (truncated to
 * @policy_size, "" when there is none).  -EBADMSG when @text is not JSON or
 * lacks a link counter; *@ret is left alone then.  Does not log.
 */
int counters_parse(const char *text, Counters *ret, char *policy, size_t policy_size);
