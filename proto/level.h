/* SPDX-License-Identifier: MIT */
/* level.h: tier levels and the links between them, numbered as on the wire. */
#pragma once

/*
 * The numbers are the protocol's: tier.proto's enum Tier, the tier arrays of
 * the status and quota replies, and the link field of a trace record
 * (proto/trace.h).  libtier's <tier.h> gives the same numbers public names
 * (TIER_VRAM..., TIER_LINK_...); tests/unit/test-vocab.c checks that both agree.
 */
typedef enum Level {
        LEVEL_VRAM = 0,
        LEVEL_HOST = 1,
        LEVEL_NVME = 2,
        _LEVEL_MAX = 3,
        _LEVEL_INVALID = -22,   /* -EINVAL */
} Level;

/* Directions of data movement, for accounting ("links"). */
typedef enum LinkDir {
        LINK_NVME_TO_HOST = 0,
        LINK_HOST_TO_NVME = 1,
        LINK_HOST_TO_VRAM = 2,
        LINK_VRAM_TO_HOST = 3,
        _LINK_MAX = 4,
        _LINK_INVALID = -22,    /* -EINVAL */
} LinkDir;
