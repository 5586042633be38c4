/* SPDX-License-Identifier: MIT */
/* reload.h: loading the configuration with the command line's overrides, at start and on SIGHUP. */
#pragma once

#include <stdbool.h>

typedef struct Config Config;
typedef struct Manager Manager;

/* Where the configuration comes from: the file, and the command line's overrides. */
typedef struct ConfigArgs {
        char *config_path;
        bool config_must_exist;
        const char *socket_path;        /* NULL: not overridden; borrowed from argv */
        const char *state_dir;
        int log_level;                  /* -1: from the config */
} ConfigArgs;

/*
 * reload_config_load() - defaults, the file @args->config_path, its .d/
 * drop-ins, then the command line's overrides (--socket, --state-dir,
 * --log-level), then config_finish().  The one way tierd reads its
 * configuration, so that a reload sees exactly what a start would.
 * Once the file was read, it must exist (@args->config_must_exist is set):
 * a reload after it was removed is refused rather than falling back to the
 * built-in defaults.
 * @ret:        overwritten; valid only on success (the caller deinits it).
 * @ret_error:  on failure a malloc'ed reason naming FILE:LINE: [section] key
 *              (or, for constraints across keys, [section] key), or NULL on
 *              -ENOMEM.
 */
int reload_config_load(ConfigArgs *args, Config *ret, char **ret_error);

/* Copy @from into @to: the file name is duplicated, the overrides are borrowed (argv outlives tierd). */
int config_args_copy(ConfigArgs *to, const ConfigArgs *from);
void config_args_done(ConfigArgs *a);

/*
 * reload_run() - re-read the configuration (SIGHUP): validate it into a
 * new Config, apply what can change live, keep the old one if it is
 * invalid (the reason is kept in m->reload_error).  Tells the service
 * manager RELOADING=1; the caller sends READY=1 afterwards.
 */
int reload_run(Manager *m);
