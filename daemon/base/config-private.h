/* SPDX-License-Identifier: MIT */
/* config-private.h: what config.c (files, lines, validation) and config-keys.c (the keys) share. */
#pragma once

#include <stdbool.h>

#include "daemon/base/config.h"
#include "proto/macro.h"

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)

/* linger_sec above a year is a typo, not a policy. */
#define CONFIG_LINGER_SEC_MAX (365u * 24 * 3600)

/* io_uring registered (fixed) buffers are limited to 1 GiB each. */
#define CONFIG_SEGMENT_MAX GIB
/* Direct I/O alignment; also the page size all pools are carved in. */
#define CONFIG_ALIGN 4096u
#define CONFIG_EXTENT_MAX (64 * MIB)

#define CONFIG_DEFAULT_TARGET "nvme0.img"
#define CONFIG_DEFAULT_TARGET_SIZE (4 * GIB)

/*
 * config_error_printf() - store a formatted message in *@ret (if @ret is
 * not NULL) and return @r, or -ENOMEM if the message cannot be allocated.
 */
int config_error_printf(char **ret, int r, const char *fmt, ...) _printf_(3, 4);

/* Is @section the section of some key? */
bool config_section_known(const char *section);
/* The key @name of @section, or NULL. */
const ConfigKey *config_key_find(const char *section, const char *name);
/* Most rows config_keys[] may have (config-keys.c checks it): config.c keeps a line per key. */
#define CONFIG_KEYS_MAX 64
/* @k's index in the table, below CONFIG_KEYS_MAX. */
size_t config_key_index(const ConfigKey *k);
/* Drop every target (an empty "target =", and config_deinit()). */
void config_clear_targets(Config *c);
