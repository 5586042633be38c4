/* SPDX-License-Identifier: MIT */
/* sd-helper.h: run a real tierd the way systemd would, and watch what it tells systemd. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Most sd_notify messages one test keeps. */
#define SD_NOTIFY_MAX 4096

typedef struct SdNotify {
        uint64_t usec;          /* CLOCK_MONOTONIC when received */
        char *text;
} SdNotify;

typedef struct SdDaemon {
        pid_t pid;
        char dir[256];          /* temporary; removed by sd_daemon_cleanup() */
        char socket[300];       /* where clients connect */
        char config[300];       /* DIR/tierd.conf; drop-ins in DIR/tierd.conf.d/ */
        char log[300];          /* tierd's stdout and stderr */
        char notify_path[300];
        int notify_fd;          /* our NOTIFY_SOCKET */
        SdNotify notes[SD_NOTIFY_MAX];
        size_t n_notes;
        size_t seen;            /* notes[] before this were consumed by sd_daemon_wait_notify() */
} SdDaemon;

typedef struct SdStart {
        /* Start through "systemd-socket-activate --seqpacket -l SOCKET": tierd is
         * exec'ed (same pid) on the first connection and inherits the socket. */
        bool activate;
        /* With .activate: a stream socket (ListenStream=) instead of SOCK_SEQPACKET. */
        bool stream;
        /* WATCHDOG_USEC for tierd (and WATCHDOG_PID = its pid); 0: none. */
        uint64_t watchdog_usec;
        /* WATCHDOG_PID to set instead of tierd's own pid (0: tierd's). */
        pid_t watchdog_pid;
        /* Extra arguments for tierd after --config, NULL-terminated (may be NULL);
         * --log-target stderr comes first unless the list names a target. */
        const char *const *args;
        /* Wait for READY=1 (not possible with .activate before a client connects). */
        bool wait_ready;
} SdStart;

/*
 * sd_daemon_init() - make a temporary directory, write @config_body (with
 * "@DIR@" replaced by the directory) to DIR/tierd.conf, bind the notify socket.
 * Returns 0 or -errno.
 */
int sd_daemon_init(SdDaemon *d, const char *config_body);
/* (Re)write DIR/tierd.conf (@dropin NULL) or DIR/tierd.conf.d/@dropin; @body NULL removes the drop-in. */
int sd_daemon_write_config(SdDaemon *d, const char *dropin, const char *body);
/* Start tierd from $TIER_BUILD as @o says.  Returns 0 or -errno (its log printed). */
int sd_daemon_start(SdDaemon *d, const SdStart *o);
/*
 * sd_daemon_wait_notify() - the first message not consumed yet that contains
 * @needle, waiting up to @timeout_ms; messages before it are consumed too.
 * Returns its index in d->notes[], or -ETIMEDOUT / -ECHILD (tierd exited).
 */
int sd_daemon_wait_notify(SdDaemon *d, const char *needle, int timeout_ms);
/* Receive whatever arrives during @ms milliseconds. */
void sd_daemon_collect(SdDaemon *d, int ms);
/* Value of "KEY=" in one notify message, copied to @buf; NULL if absent. */
const char *sd_notify_field(const char *text, const char *key, char *buf, size_t size);
/* Send @sig and wait up to @timeout_ms for the exit; the exit status, 128+signal, or -1 (then killed). */
int sd_daemon_stop(SdDaemon *d, int sig, int timeout_ms);
/* Kill tierd if it still runs, close everything, remove the directory (unless $TIER_TEST_KEEP). */
void sd_daemon_cleanup(SdDaemon *d);
/* Does tierd's log contain @needle? */
bool sd_daemon_log_contains(const SdDaemon *d, const char *needle);
void sd_daemon_dump_log(const SdDaemon *d);

/* Path of a built program under $TIER_BUILD. */
const char *sd_build_path(const char *rel, char *buf, size_t size);
/* Is @prog in $PATH? */
bool sd_have_program(const char *prog);
/* The number of bytes of @json's job @job, tier @tier, field @field ("limit", "used"); -1 if not found. */
long long sd_json_job_tier(const char *json, const char *job, const char *tier, const char *field);
/* The number after "@tier" ... "@field": of the tier list ("capacity"); -1 if not found. */
long long sd_json_tier(const char *json, const char *tier, const char *field);
