/* SPDX-License-Identifier: MIT */
/* monitor.h: what tierd writes for monitoring: the metrics text file and the drive wear book. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto/macro.h"

typedef struct Config Config;
typedef struct NvmeTier NvmeTier;
typedef struct Registry Registry;
typedef struct Rpc Rpc;
typedef struct Wear Wear;
typedef struct sd_event sd_event;
typedef struct sd_event_source sd_event_source;

/* How often the drive wear book is written when NVMe was written to (and at a clean stop). */
#define MONITOR_WEAR_SAVE_USEC (60ull * 1000000ull)

typedef struct Monitor {
        sd_event *event;
        const Config *config;   /* borrowed, like everything below */
        const Rpc *rpc;
        NvmeTier *nvme;
        Registry *registry;

        Wear *wear;             /* owned; registry->wear points to it */
        bool wear_save;         /* false when the book could not be read: it is not overwritten */
        uint64_t wear_saved;    /* the targets' bytes written since start at the last save */
        int wear_error;         /* the last save's error, logged once */
        sd_event_source *wear_timer;

        sd_event_source *metrics_timer;
        int metrics_error;      /* the last error writing the text file (logged once per kind); 0: none */
        char metrics_stage;     /* where it failed: 'b'uild, 'w'rite */
        bool metrics_written;   /* this tierd wrote the text file (at least once) */
} Monitor;

/*
 * monitor_new() - load the drive wear book from the state directory (a
 * corrupt one is set aside and said so in the log) and hand it to
 * @registry; arm the timers that save it and, with [metrics] textfile,
 * write the metrics file (at once, then every interval_sec).  Everything
 * passed is borrowed and outlives the monitor.
 */
int monitor_new(sd_event *event, const Config *config, const Rpc *rpc, NvmeTier *nvme, Registry *registry,
                Monitor **ret);
/* Free it all, the wear book too: after the registry (its jobs add to the book as they end). */
Monitor *monitor_free(Monitor *mo);
DEFINE_TRIVIAL_CLEANUP_FUNC(Monitor *, monitor_free);

/* Write the metrics text file now (the timer's work); 0 or -errno, logged once per kind. */
int monitor_write_metrics(Monitor *mo);
/*
 * At a clean stop: remove the metrics text file this tierd wrote, so that
 * node_exporter does not go on serving its last values as if tierd ran.
 * (After a crash it stays: its mtime tells how old it is.)
 */
void monitor_remove_metrics(Monitor *mo);
/* Write the wear book now if anything was written since the last save (the timer's work); @force:
 * whatever was written (at stop: after the transfers end, before the registry goes). */
int monitor_save_wear(Monitor *mo, bool force);
