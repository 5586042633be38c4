/* SPDX-License-Identifier: MIT */
/* level.h: the hierarchy's vocabulary: tier levels (vram, host, nvme) and the links between them. */
#pragma once

#include "proto/level.h"

/* Tier levels, numbered as on the wire (proto/level.h): LEVEL_VRAM (0), LEVEL_HOST, LEVEL_NVME. */
#define TIERS _LEVEL_MAX

/* "vram", "host", "nvme"; "?" for anything else.  (tier_level_name() is libtier's.) */
static inline const char *level_to_string(int level) {
        static const char *const names[TIERS] = { "vram", "host", "nvme" };

        return level >= 0 && level < TIERS ? names[level] : "?";
}

/* "nvme->host", ...; "?" for anything else. */
static inline const char *link_to_string(LinkDir d) {
        static const char *const names[_LINK_MAX] = {
                [LINK_NVME_TO_HOST] = "nvme->host",
                [LINK_HOST_TO_NVME] = "host->nvme",
                [LINK_HOST_TO_VRAM] = "host->vram",
                [LINK_VRAM_TO_HOST] = "vram->host",
        };

        return d >= 0 && d < _LINK_MAX ? names[d] : "?";
}
