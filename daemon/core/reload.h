/* SPDX-License-Identifier: MIT */
/* reload.h: loading the configuration with the command line's overrides, at start and on SIGHUP. */
#pragma once

#include "daemon/core/manager.h"

/*
 * manager_config_load() - defaults, the file @args->config_path, its .d/
 * drop-ins, then the command line's overrides (--socket, --state-dir,
 * --log-level), then config_finish().  The one way tierd reads its
 * configuration, so that a reload sees exactly what a start would.
 * @ret:        overwritten; valid only on success (the caller deinits it).
 * @ret_error:  on failure a malloc'ed reason naming FILE:LINE: [section] key
 *              (or, for constraints across keys, [section] key), or NULL on
 *              -ENOMEM.
 */
int manager_config_load(const ManagerArgs *args, Config *ret, char **ret_error);

/*
 * manager_set_args() - remember how the configuration was loaded, for
 * manager_reload().  The file name is copied; the override strings are
 * borrowed and must outlive @m (they point into argv).
 */
int manager_set_args(Manager *m, const ManagerArgs *args);
