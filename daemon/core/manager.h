/* SPDX-License-Identifier: MIT */
/* manager.h: the daemon's root object: event loop, config and every subsystem. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "daemon/base/config.h"
#include "proto/macro.h"
#include "daemon/base/list.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/segpool.h"

typedef struct Server Server;
typedef struct Uring Uring;
typedef struct NvmeTier NvmeTier;
typedef struct VramBackend VramBackend;

/* Directions of data movement, for accounting ("links"). */
typedef enum LinkDir {
        LINK_NVME_TO_HOST,
        LINK_HOST_TO_NVME,
        LINK_HOST_TO_VRAM,
        LINK_VRAM_TO_HOST,
        _LINK_MAX,
} LinkDir;

typedef struct LinkStats {
        uint64_t bytes;
        uint64_t ops;
} LinkStats;

typedef struct HostTier {
        SegPool pool;
        int numa_node;
        bool locked;            /* mlock succeeded */
} HostTier;

struct Manager {
        sd_event *event;
        sd_event_source *sigterm, *sigint, *sighup;
        sd_event_source *run_source;    /* defer: runs queued ops */
        Config config;
        char *config_path;
        uint64_t start_usec;

        Server *server;
        Uring *uring;
        HostTier host;
        VramBackend *vram;
        NvmeTier *nvme;

        List jobs;              /* Job.link */
        List dying_jobs;        /* jobs waiting for transfers before being freed */
        uint64_t next_job_id;
        unsigned n_jobs;

        List lru[TIERS];        /* Copy.lru, least recently used first */
        uint64_t capacity[TIERS];
        uint64_t used[TIERS];
        uint64_t pinned[TIERS];

        List run_queue;         /* Op.wait_link: ops to advance */
        List space_waiters;     /* Op.wait_link: ops waiting for space */

        LinkStats links[_LINK_MAX];
        unsigned n_xfers;       /* transfers in flight (or waiting for the VRAM link) */
        /* the VRAM link, per VramDir (mover.c) */
        List vram_waiting[2];   /* Xfer.vlink: copies waiting for the backend, by fair tag */
        unsigned vram_active[2];/* copies with the backend */
        double vram_vtime[2];   /* virtual time */
        bool stopping;

        /* Reload (reload.c): how the running configuration was loaded, so that
         * SIGHUP reads the same file with the same command-line overrides.
         * config_path (above) is the file.  The override strings are borrowed
         * from argv, which outlives the Manager; NULL: not overridden. */
        bool config_must_exist;
        const char *arg_socket_path;
        const char *arg_state_dir;
        int arg_log_level;              /* -1: from the config */
        char reload_error[512];         /* why the last reload was refused, "" if it was not */
        /* Stop (manager_drain()): how long the drain waits at most. */
        uint64_t drain_usec;
};

/* Options that come from the command line and override the config file. */
typedef struct ManagerArgs {
        const char *config_path;
        bool config_must_exist;
        const char *socket_path;
        const char *state_dir;
        int log_level;          /* -1: from config */
} ManagerArgs;

int manager_new(Manager **ret, Config *config /* consumed */);
Manager *manager_free(Manager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Manager *, manager_free);
int manager_start(Manager *m);
int manager_run(Manager *m);
/*
 * manager_reload() - re-read the configuration (SIGHUP): validate it into a
 * new Config, apply what can change live, keep the old one if it is invalid.
 * Implemented in reload.c.
 */
int manager_reload(Manager *m);

/*
 * manager_drain() - begin a graceful stop (SIGTERM, SIGINT): send STOPPING=1,
 * accept no more connections, tell every client (Event.shutdown), let each
 * read what is queued for it and close it (which cancels its requests and
 * drops its pins), and let the transfers already running end.  Returns at
 * once; the event loop exits with 0 when all of that is done or after
 * @timeout_usec, whichever comes first.  Idempotent.
 */
void manager_drain(Manager *m, uint64_t timeout_usec);
/* One line describing the tiers, for STATUS= and the start-up log. */
int manager_status_line(Manager *m, char *buf, size_t size);
uint64_t now_usec(void);

/* Queue the run source so the op engine runs once the current handler returns. */
void manager_kick(Manager *m);
const char *link_name(LinkDir d);
