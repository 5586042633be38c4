/* SPDX-License-Identifier: MIT */
/* harness.h: run a real tierd from this build on a temporary directory, the way systemd would. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The exit status meson reports as SKIP. */
#define TEST_SKIP 77

/* Most sd_notify messages one TestDaemon keeps. */
#define TEST_NOTIFY_MAX 4096

typedef struct TestNotify {
        uint64_t usec;          /* CLOCK_MONOTONIC when received */
        char *text;
} TestNotify;

/* Most fds the harness keeps for tierd as a service manager's fd store would (FDSTORE=1). */
#define TEST_STORE_MAX 1024
#define TEST_STORE_MAX_STR "1024"

typedef struct TestStored {
        char *name;
        int fd;
} TestStored;

typedef struct TestDaemon {
        pid_t pid;              /* tierd (or systemd-socket-activate before it execs tierd); 0: none */
        char dir[256];          /* temporary; removed by test_daemon_cleanup() */
        char socket[300];       /* DIR/tierd.sock, where clients connect */
        char config[300];       /* DIR/tierd.conf; drop-ins in DIR/tierd.conf.d/ */
        char log[300];          /* tierd's stdout and stderr */
        char notify_path[300];  /* DIR/notify */
        int notify_fd;          /* our NOTIFY_SOCKET */
        TestNotify *notes;      /* every message received, in order */
        size_t n_notes;
        size_t seen;            /* notes[] before this were consumed by test_daemon_wait_notify() */
        int exited;             /* how tierd last exited, as test_daemon_kill() returns it, when something reaped it */
        /*
         * The fd store, as systemd's with FileDescriptorStoreMax= (off unless a
         * test sets @fd_store): fds tierd sends with FDSTORE=1 are kept under
         * their FDNAME=, FDSTOREREMOVE=1 drops them, and the next spawn passes
         * them on as LISTEN_FDS with LISTEN_FDNAMES.  Off, they are closed.
         */
        bool fd_store;
        TestStored stored[TEST_STORE_MAX];
        size_t n_stored;
} TestDaemon;

typedef struct TestDaemonOptions {
        /* Start through "systemd-socket-activate --seqpacket -l DIR/tierd.sock": tierd is
         * exec'ed (same pid) on the first connection and inherits the socket.  tierd then
         * gets no --socket: the configuration's socket must stay unused. */
        bool activate;
        /* With .activate: a stream socket (ListenStream=) instead of SOCK_SEQPACKET. */
        bool stream;
        /* With .activate: a second socket, of the same type, at this path (fd 4; NULL: none). */
        const char *listen2;
        /* WATCHDOG_USEC for tierd (and WATCHDOG_PID = its pid); 0: none. */
        uint64_t watchdog_usec;
        /* WATCHDOG_PID to set instead of tierd's own pid (0: tierd's). */
        pid_t watchdog_pid;
        /* --log-level LEVEL; NULL: none, the configuration decides. */
        const char *log_level;
        /* More arguments after the harness's own, NULL-terminated (may be NULL).  The
         * harness passes --config, --state-dir DIR, --socket DIR/tierd.sock (unless
         * .activate) and --log-target stderr (unless these name a --log-target). */
        const char *const *args;
        /* Wait for READY=1 (not possible with .activate before a client connects). */
        bool wait_ready;
} TestDaemonOptions;

/*
 * test_daemon_init() - make a temporary directory, write @config_body (with
 * "@DIR@" replaced by the directory) to DIR/tierd.conf and bind the notify
 * socket.  Nothing runs yet.  Returns 0 or -errno; test_daemon_cleanup()
 * undoes a half-done init too.
 */
int test_daemon_init(TestDaemon *d, const char *config_body);
/* Start tierd from $TIER_BUILD as @o says.  Returns 0, or -errno after printing its log. */
int test_daemon_spawn(TestDaemon *d, const TestDaemonOptions *o);
/*
 * test_daemon_start() - test_daemon_init() and test_daemon_spawn() with
 * --log-level debug, waiting for READY=1: the usual way to get a tierd.
 * On failure, everything is cleaned up already.
 */
int test_daemon_start(TestDaemon *d, const char *config_body);

/* (Re)write DIR/tierd.conf (@dropin NULL) or DIR/tierd.conf.d/@dropin; @body NULL removes the drop-in. */
int test_daemon_write_config(TestDaemon *d, const char *dropin, const char *body);

/*
 * test_daemon_wait_notify() - the first message not consumed yet that
 * contains @needle, waiting up to @timeout_ms; messages before it are
 * consumed too.  Returns its index in d->notes[], or -ETIMEDOUT / -ECHILD
 * (tierd exited; its log is printed).
 */
int test_daemon_wait_notify(TestDaemon *d, const char *needle, int timeout_ms);
/* Receive whatever arrives during @ms milliseconds. */
void test_daemon_collect(TestDaemon *d, int ms);
/* Receive what is queued now, without waiting (the fd store's messages among it). */
void test_daemon_drain(TestDaemon *d);
/* How many fds the fd store holds whose name starts with @prefix. */
size_t test_daemon_stored(const TestDaemon *d, const char *prefix);
/* Wait up to @timeout_ms until the fd store holds at least @n fds named @prefix...: 0, or -ETIMEDOUT. */
int test_daemon_wait_stored(TestDaemon *d, const char *prefix, size_t n, int timeout_ms);
/* Index of the first message received so far (consumed or not) containing @needle, or -1. */
int test_daemon_find_notify(const TestDaemon *d, const char *needle);
/* Value of "KEY=" in one notify message, copied to @buf; NULL if absent. */
const char *test_notify_field(const char *text, const char *key, char *buf, size_t size);

/*
 * test_daemon_kill() - send @sig (0: none, only wait) and wait up to
 * @timeout_ms for tierd to exit, reading notify messages meanwhile.
 * Returns the exit status, 128 + signal, or -1 (then it was SIGKILLed).
 */
int test_daemon_kill(TestDaemon *d, int sig, int timeout_ms);

/* A connection to tierd's socket @path that has said nothing yet (raw packets follow): the fd, or -errno. */
int test_raw_connect(const char *path);
/*
 * test_daemon_stop() - SIGTERM, wait up to 10 s, print the log unless the
 * exit status is 0, then test_daemon_cleanup().  Returns what
 * test_daemon_kill() returned (-1 when nothing ran).
 */
int test_daemon_stop(TestDaemon *d);
/*
 * test_daemon_cleanup() - SIGKILL tierd if it still runs (and print its log:
 * a test that did not stop it failed half-way), close everything, remove
 * the directory (unless $TIER_TEST_KEEP is set).  Safe to call twice.
 */
void test_daemon_cleanup(TestDaemon *d);

/* Does tierd's log contain @needle? */
bool test_daemon_log_contains(const TestDaemon *d, const char *needle);
void test_daemon_dump_log(const TestDaemon *d);

/* Run "tierctl --socket DIR/tierd.sock --json status": its stdout (malloc'ed), or NULL if it failed. */
char *test_daemon_tierctl_json(const TestDaemon *d);

/* $TIER_BUILD/daemon/tierd and $TIER_BUILD/client/tierctl (TIER_BUILD defaults to "build"). */
const char *test_tierd_path(char *buf, size_t size);
const char *test_tierctl_path(char *buf, size_t size);
/* Is @prog in $PATH? */
bool test_have_program(const char *prog);

/*
 * test_can_lock_memory() - can a tierd started by this process set up a
 * host pool of @bytes?  tierd registers the pool with io_uring as fixed
 * buffers, which counts against RLIMIT_MEMLOCK (per user) unless it has
 * CAP_IPC_LOCK; a failed mlock() alone is only a warning.  True for root,
 * with CAP_IPC_LOCK as an ambient capability, or with a limit above @bytes
 * (plus 1 MiB for the ring).  Prints why not.
 */
bool test_can_lock_memory(uint64_t bytes);
