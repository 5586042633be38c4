/* SPDX-License-Identifier: MIT */
/* manager.h: the daemon's root object: the event loop, the config, and every subsystem, in order. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base/config.h"
#include "daemon/core/reload.h"
#include "daemon/ipc/rpc.h"
#include "daemon/tiers/memfd-seg.h"
#include "daemon/tiers/segpool.h"
#include "proto/macro.h"

typedef struct Csum Csum;
typedef struct Engine Engine;
typedef struct MemStore MemStore;
typedef struct Monitor Monitor;
typedef struct NvmeTier NvmeTier;
typedef struct QuotaStore QuotaStore;
typedef struct Registry Registry;
typedef struct Revoke Revoke;
typedef struct Sched Sched;
typedef struct Server Server;
typedef struct FaultSet FaultSet;
struct signalfd_siginfo;
typedef struct Uring Uring;
typedef struct VramBackend VramBackend;
typedef struct sd_event sd_event;
typedef struct sd_event_source sd_event_source;

typedef struct HostTier {
        SegPool pool;
        MemfdSegConfig memfd;   /* the pool's userdata */
        int numa_node;
        bool locked;            /* mlock succeeded */
} HostTier;

typedef struct Book Book;

typedef struct Manager {
        sd_event *event;
        sd_event_source *sigterm, *sigint, *sighup;
        Config config;
        uint64_t start_usec;

        /* the rooms, from the bottom up (built in this order, freed in reverse) */
        Uring *uring;
        Csum *csum;             /* the NVMe extents' crc32c, on [nvme] checksum_threads workers */
        FaultSet *faults;       /* injected faults (TIERD_TEST_FAULTS, tests only); NULL: none */
        VramBackend *vram;
        HostTier host;
        NvmeTier *nvme;
        Book *book;             /* the NVMe index ([nvme] persist); NULL: scratch */
        MemStore *memstore;     /* host and emulated VRAM memory in the service manager's fd store; NULL: none */
        Registry *registry;
        QuotaStore *quotas;
        Engine *engine;
        Sched *sched;
        Revoke *revoke;
        Rpc rpc;
        Server *server;
        Monitor *monitor;       /* the metrics text file and the drive wear book */

        /* reload (reload.c): how the running configuration was loaded */
        ConfigArgs args;
        char reload_error[512];         /* why the last reload was refused, "" if it was not */

        /* a stop (stop.c) */
        bool stopping;
        uint64_t drain_usec;            /* how long manager_drain() waits for the clients at most */
        uint64_t stop_start;            /* when it began (CLOCK_MONOTONIC usec) */
        bool stop_clients_over;         /* the clients' bound passed: no longer waited for */
        sd_event_source *stop_timer;    /* once a second: the bounds, the service manager told */
        /* it writes what is only in memory down to NVMe (the NVMe index then has it) */
        unsigned stop_writes;           /* those write-downs in flight */
        unsigned stop_written, stop_failed;
        uint64_t stop_bytes;
        unsigned stop_held;             /* held only in memory and for writing by a client: the last look left them */
        bool stop_rescan;               /* a write-down ended: look again */
        bool stop_final;                /* looked with no client left (held or not, all of it) */
        uint64_t stop_unpins;           /* Registry.unpins at the last look */
        uint64_t stop_mark;             /* NVMe bytes written and write-downs ended, at the last tick */
        uint64_t stop_progress_at;      /* when that last changed, or the write-down began again */
        unsigned stop_told;             /* write-downs ended, as STATUS= last said */
} Manager;

/*
 * manager_new()'s error when it refuses the configuration: capacities the
 * machine cannot give (capacity.c), or tierd.conf's [quota] guarantees that
 * do not fit the tiers.  An errno nothing else there returns: tierd exits
 * with its "configuration refused" status then, which systemd does not
 * restart.
 */
#define MANAGER_CONFIG_REFUSED (-EKEYREJECTED)

/*
 * manager_new() - build every subsystem from @config (consumed, also on
 * failure) and @args (copied: how the configuration was loaded, for
 * reloads).  Logs what failed; MANAGER_CONFIG_REFUSED when it is the
 * configuration that is refused.
 */
int manager_new(Manager **ret, Config *config, const ConfigArgs *args);
/*
 * The fds the service manager's store passed back (LISTEN_FDNAMES starting
 * with MEMSTORE_FD_PREFIX), for the next manager_new(): consumed there (or
 * closed).  @names and @fds are copied / taken.
 */
int manager_stored_fds(char **names, const int *fds, size_t n);
Manager *manager_free(Manager *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Manager *, manager_free);
int manager_run(Manager *m);

/*
 * manager_drain() - begin a graceful stop (SIGTERM, SIGINT): send STOPPING=1,
 * accept no more connections, tell every client (Event.shutdown), let each
 * read what is queued for it and close it (which cancels its requests and
 * drops its pins), let the transfers already running end, and write what is
 * held only in memory down to NVMe (stop.c).  Returns at once; the event
 * loop exits with 0 when all of that is done; it waits for the clients and
 * their transfers @timeout_usec at most, for the write-down as long as it
 * progresses.  Idempotent.
 */
void manager_drain(Manager *m, uint64_t timeout_usec);
/* SIGTERM, SIGINT: manager_drain(), or, the second time, exit at once. */
int manager_on_stop_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata);
/* One line describing the tiers, for STATUS= and the start-up log. */
int manager_status_line(Manager *m, char *buf, size_t size);
