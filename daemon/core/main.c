/* SPDX-License-Identifier: MIT */
/* main.c: tierd's entry point: arguments, config, inherited fds, the loop. */

/*
 * Theory of operation: nothing but the order of start-up (STYLE.md, after
 * systemd-oomd): close what the parent left open, parse the arguments, load
 * and validate the configuration, check that the kernel has what tierd
 * needs (kernel.c; --check-config stops here, after the
 * capacity check the manager runs before it makes its pools and the NVMe
 * index's extent size check book_open() runs, read only), take the
 * socket systemd passed and check it (or, without one, that no other daemon
 * answers at the socket path) before anything is made, create the state
 * directory, block the signals the
 * loop will read, build the Manager, listen, send READY=1 with STATUS=, run
 * the loop; STOPPING=1 is sent on the way out whatever the path.
 */

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include "daemon/base/config.h"
#include "daemon/base/statefile.h"
#include "daemon/base/log.h"
#include "daemon/core/capacity.h"
#include "daemon/core/kernel.h"
#include "daemon/core/manager.h"
#include "daemon/core/reload.h"
#include "daemon/ipc/server.h"
#include "daemon/state/book.h"
#include "daemon/state/memstore.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"

/*
 * The configuration was refused (invalid, a -c file missing, capacities the machine cannot give,
 * [quota] guarantees that do not fit), or the kernel is too old for tierd: LSB's "program is not
 * configured".  The unit lists it in RestartPreventExitStatus=: restarting cannot help until someone
 * changes the file or the kernel.
 */
#define EXIT_CONFIG_REFUSED 6

static const char *arg_config = NULL;
static const char *arg_socket = NULL;
static const char *arg_state_dir = NULL;
static LogTarget arg_log_target = LOG_TARGET_AUTO;
static int arg_log_level = -1;
static bool arg_check_config = false;

static void help(void) {
        printf("Usage: tierd [OPTIONS]\n\n"
               "Manage GPU memory, pinned host memory and NVMe as one memory hierarchy\n"
               "for training jobs, shared between jobs.  See tierd(8).\n\n"
               "  -c --config FILE        configuration file (default %s)\n"
               "  -s --socket PATH        listening socket (overrides [daemon] socket)\n"
               "  -S --state-dir DIR      state directory (overrides [daemon] state_dir)\n"
               "     --log-target TARGET  auto, journal or stderr\n"
               "     --log-level LEVEL    err, warning, notice, info or debug\n"
               "     --check-config       validate the configuration, print it and exit\n"
               "  -h --help               show this help\n"
               "     --version            show the version\n",
               TIERD_DEFAULT_CONFIG);
}

enum {
        ARG_VERSION = 0x100,
        ARG_LOG_TARGET,
        ARG_LOG_LEVEL,
        ARG_CHECK_CONFIG,
};

/* 0 to go on, > 0 to exit successfully, < 0 on a usage error (message printed). */
static int parse_argv(int argc, char *argv[]) {
        static const struct option options[] = {
                { "config", required_argument, NULL, 'c' },
                { "socket", required_argument, NULL, 's' },
                { "state-dir", required_argument, NULL, 'S' },
                { "log-target", required_argument, NULL, ARG_LOG_TARGET },
                { "log-level", required_argument, NULL, ARG_LOG_LEVEL },
                { "check-config", no_argument, NULL, ARG_CHECK_CONFIG },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "c:s:S:h", options, NULL)) >= 0) {
                switch (c) {
                case 'c':
                        arg_config = optarg;
                        break;
                case 's':
                        arg_socket = optarg;
                        break;
                case 'S':
                        arg_state_dir = optarg;
                        break;
                case ARG_LOG_TARGET:
                        arg_log_target = log_target_from_string(optarg);
                        if (arg_log_target < 0) {
                                fprintf(stderr, "tierd: invalid --log-target '%s' (auto, journal, stderr)\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_LOG_LEVEL:
                        arg_log_level = log_level_from_string(optarg);
                        if (arg_log_level < 0) {
                                fprintf(stderr, "tierd: invalid --log-level '%s' (err, warning, notice, info, debug)\n",
                                        optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_CHECK_CONFIG:
                        arg_check_config = true;
                        break;
                case 'h':
                        help();
                        return 1;
                case ARG_VERSION:
                        printf("tierd %s\n", TIERD_VERSION);
                        return 1;
                default:
                        fprintf(stderr, "Try 'tierd --help'.\n");
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "tierd: unexpected argument '%s' (try --help)\n", argv[optind]);
                return -EINVAL;
        }
        /* an empty path ("$UNSET") names no file: it was ": No such file or directory", or the cwd */
        if ((arg_config && !arg_config[0]) || (arg_socket && !arg_socket[0]) || (arg_state_dir && !arg_state_dir[0])) {
                fprintf(stderr, "tierd: --%s is empty: give a path (try --help)\n",
                        arg_config && !arg_config[0] ? "config" : arg_socket && !arg_socket[0] ? "socket" : "state-dir");
                return -EINVAL;
        }
        return 0;
}

/* Sent when run() returns after READY=1, whatever the path; a repeated STOPPING=1 is harmless. */
static void notify_stopping(const char **p) {
        if (*p)
                (void) sd_notify(false, *p);
}

/*
 * The fds passed by the service manager (LISTEN_FDS): the listening socket,
 * the first AF_UNIX SOCK_SEQPACKET listener, returned; the memory store's
 * (named MEMSTORE_FD_PREFIX..., from its fd store) handed to the manager.
 * Any other fd passed is closed with a warning, so none leaks into the
 * daemon.  When sockets were passed but none is such a listener, the first
 * is returned anyway, for server_check_listen() to refuse with its reason:
 * binding a socket of its own instead, tierd served where no client of the
 * socket unit looks.  Returns the fd (owned by the caller), -1 for none
 * (nothing passed but the memory store's), or -errno.
 */
static int inherit_listen_fd(void) {
        char **names = NULL;
        int n, fd = -1, *mem = NULL;
        char **mem_names = NULL;
        size_t n_mem = 0;

        n = sd_listen_fds_with_names(true, &names);
        if (n < 0)
                return log_error_errno(n, "Cannot read the sockets passed by the service manager: %m");
        if (n > 0) {
                mem = calloc((size_t) n, sizeof(int));
                mem_names = calloc((size_t) n, sizeof(char *));
                if (!mem || !mem_names) {
                        free(mem);
                        free(mem_names);
                        return log_error_errno(ENOMEM, "Out of memory");
                }
        }
        for (int i = 0; i < n; i++)
                if (names && names[i] && strncmp(names[i], MEMSTORE_FD_PREFIX, strlen(MEMSTORE_FD_PREFIX)) == 0) {
                        mem_names[n_mem] = names[i];
                        mem[n_mem++] = SD_LISTEN_FDS_START + i;
                }
        for (int i = 0; i < n; i++)
                if (fd < 0 && sd_is_socket_unix(SD_LISTEN_FDS_START + i, SOCK_SEQPACKET, 1, NULL, 0) > 0)
                        fd = SD_LISTEN_FDS_START + i;
        if (fd < 0)
                for (int i = 0; i < n && fd < 0; i++) {
                        bool stored = false;

                        for (size_t k = 0; k < n_mem; k++)
                                stored = stored || mem[k] == SD_LISTEN_FDS_START + i;
                        if (!stored)
                                fd = SD_LISTEN_FDS_START + i;
                }
        for (int i = 0; i < n; i++) {
                bool stored = false;

                for (size_t k = 0; k < n_mem; k++)
                        stored = stored || mem[k] == SD_LISTEN_FDS_START + i;
                if (!stored && SD_LISTEN_FDS_START + i != fd) {
                        log_warning("Closing fd %d (\"%s\") passed by the service manager: not a listening "
                                    "SOCK_SEQPACKET socket, or not the first one, ignoring",
                                    SD_LISTEN_FDS_START + i, names && names[i] ? names[i] : "?");
                        safe_close(SD_LISTEN_FDS_START + i);
                }
        }
        if (n_mem > 0 && manager_stored_fds(mem_names, mem, n_mem) < 0)
                log_warning("Out of memory: the memory the service manager kept for tierd is not used");
        for (int i = 0; i < n; i++)
                if (names)
                        free(names[i]);
        free(names);
        free(mem);
        free(mem_names);
        return fd;
}

/*
 * Nothing that the parent left open (without CLOEXEC) stays with the daemon:
 * it would pin files, sockets or pipes of whoever started us.  Runs first
 * thing, before anything of ours (the journal connection) holds an fd.
 */
static void close_inherited_fds(void) {
        int n = sd_listen_fds(false);
        unsigned first = n > 0 ? (unsigned) (SD_LISTEN_FDS_START + n) : 3u;

        if (close_range(first, ~0u, 0) < 0)
                for (unsigned i = first; i < 4096; i++)
                        (void) close((int) i);
}

/* The path a listening socket is bound to, for messages. */
static const char *socket_path_of(int fd, char *buf, size_t size) {
        struct sockaddr_un sa = {};
        socklen_t l = sizeof(sa);

        if (getsockname(fd, (struct sockaddr *) &sa, &l) < 0 || l <= offsetof(struct sockaddr_un, sun_path) ||
            sa.sun_path[0] == '\0')
                return "an inherited socket";
        snprintf(buf, size, "%.*s (inherited)", (int) (l - offsetof(struct sockaddr_un, sun_path)), sa.sun_path);
        return buf;
}

/*
 * --check-config: the capacity check a start would run before making its
 * pools (capacity.c), with backend = auto guessed from the CUDA driver.
 * 0 when it passes; else logged, the same line a start would log.
 */
static int check_capacity(const Config *c) {
        _cleanup_free_ char *why = NULL;
        CapacityFacts facts;
        int r;

        r = capacity_facts_read(c, -1, &facts);
        if (r >= 0)
                r = capacity_check(c, &facts, &why);
        if (r < 0)
                return log_error_errno(r, "Cannot check the capacities: %m");
        if (r > 0)
                log_error("%s", why);
        return r;
}

/*
 * Start and --check-config, before anything is made: this kernel has what tierd uses without a fallback
 * (kernel.c).  0 when it does; 1 (logged: what is missing, the kernel that needs) when not; < 0 when it
 * could not be checked (logged).
 */
static int check_kernel(void) {
        _cleanup_free_ char *why = NULL;
        KernelFacts facts;
        int r;

        r = kernel_facts_read(&facts);
        if (r >= 0)
                r = kernel_check(&facts, &why);
        if (r < 0)
                return log_error_errno(r, "Cannot check the kernel: %m");
        if (r > 0)
                log_error("%s", why);
        return r > 0 ? 1 : 0;
}

/*
 * --check-config: the file's [quota] guarantees must fit the capacities as a start checks them (no job
 * runs yet; a capacity known only at start, a device's, is not checked here).  1 (logged) when not.
 */
static int check_quotas(const Config *c) {
        QuotaRules none = QUOTA_RULES_NULL;
        Registry reg = {};
        QuotaStore qs = { .registry = &reg };
        char why[1024];
        int r;

        list_init(&reg.jobs);
        reg.capacity[LEVEL_HOST] = c->host_capacity;
        reg.capacity[LEVEL_VRAM] = c->vram_backend == VRAM_BACKEND_EMULATED ? vram_emul_capacity(c) :
                                   c->vram_capacity ? c->vram_capacity : UINT64_MAX;
        for (size_t i = 0; i < c->n_targets; i++)
                reg.capacity[LEVEL_NVME] = c->targets[i].size && reg.capacity[LEVEL_NVME] != UINT64_MAX ?
                                           reg.capacity[LEVEL_NVME] + c->targets[i].size : UINT64_MAX;
        r = quota_check(&qs, c, &none, why, sizeof(why));
        if (r == -ENOMEM)
                return log_error_errno(r, "Out of memory");
        if (r < 0) {
                log_error("Invalid configuration: [quota]: %s", why);
                return 1;
        }
        quota_warn_unowned(c);
        return 0;
}

/*
 * --check-config: the NVMe index a start would read, read only (book_check(): nothing set aside or
 * written): a start refuses an [nvme] extent_size that is not the index's (exit status 6), and so does
 * this, with the same words.  0 when a start would read it (or it cannot be read by this user, said),
 * 1 when refused, < 0 when a start would fail on it too (logged).
 */
static int check_index(const Config *c) {
        _cleanup_free_ char *err = NULL;
        int r;

        if (!c->nvme_persist)
                return 0;
        r = book_check(c->state_dir, c->nvme_extent_size, &err);
        if (r == -ESTALE) {
                log_error("%s", err ? err : "The NVMe index was written with another [nvme] extent_size");
                return 1;
        }
        if (r == -EACCES || r == -EPERM) {
                log_warning("%s: the NVMe index's [nvme] extent_size is not checked (run --check-config as "
                            "tierd's user to check it)", err ? err : "Cannot read the NVMe index");
                return 0;
        }
        if (r < 0)
                return log_error_errno(r, "%s", err ? err : "Cannot read the NVMe index: %m");
        return 0;
}

/*
 * The soft RLIMIT_NOFILE up to the hard one (systemd's default soft limit is 1024): tierd keeps an fd per
 * host segment (up to 16384) and two or more per connection (up to max_connections), all in epoll, none
 * in select().
 */
static void raise_nofile(void) {
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
                return;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                log_warning_errno(errno, "Cannot raise RLIMIT_NOFILE to its hard limit, ignoring: %m");
}

/*
 * One tierd per state directory, locked before anything in it is read: a second one (given another
 * socket, or refused at the socket only after its start had replayed and rewritten the NVMe index)
 * would rewind what the first keeps.  The fd is held until exit; -errno, logged, when it is taken.
 */
static int lock_state_dir(const char *dir) {
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

        if (fd < 0)
                return log_error_errno(errno, "Cannot open state directory \"%s\": %m", dir);
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                int r = errno;

                safe_close(fd);
                if (r == EWOULDBLOCK)
                        return log_error_errno(EBUSY, "Another tierd runs on the state directory \"%s\" (it holds "
                                               "its lock): stop it first, or give this one its own --state-dir "
                                               "and NVMe targets", dir);
                return log_error_errno(r, "Cannot lock state directory \"%s\": %m", dir);
        }
        return fd;
}

/*
 * Does the state directory (@fd, open) let nobody but tierd's user put a name in it?  tierd, as
 * root, opens, creates, truncates and writes the files named there (the NVMe index, a relative NVMe
 * target, the quotas): a link planted by another user would aim that at a file of root's.  Checked
 * on the directory opened (and locked), before anything in it is read; 0, 1 refused (logged), -errno.
 */
static int check_state_dir(int fd, const char *dir) {
        unsigned char acl[4096];
        char why[256];
        struct stat st;
        ssize_t n;

        if (fstat(fd, &st) < 0)
                return log_error_errno(errno, "Cannot stat state directory \"%s\": %m", dir);
        n = fgetxattr(fd, "system.posix_acl_access", acl, sizeof(acl));
        if (n < 0 && errno != ENODATA && errno != EOPNOTSUPP) {
                log_error_errno(errno, "Refusing the state directory \"%s\": its POSIX ACL cannot be read "
                                "(%m): remove it (setfacl -b)", dir);
                return 1;
        }
        if (n >= 0 && statefile_dir_acl_trusted(acl, (size_t) n, geteuid(), getegid(), why, sizeof(why)) < 0) {
                log_error("Refusing the state directory \"%s\": %s", dir, why);
                return 1;
        }
        if (statefile_dir_trusted(&st, geteuid(), getegid(), why, sizeof(why)) < 0) {
                /* judged for this process's user: say so where a tierd of root's (the service) would take it */
                if (geteuid() != 0 && statefile_dir_trusted(&st, 0, 0, NULL, 0) == 0)
                        log_error("Refusing the state directory \"%s\" for a tierd run as uid %u, gid %u, as this "
                                  "one is: %s. Run as root (as tierd.service runs it), tierd would accept it: run "
                                  "tierd --check-config as root to check it for the service", dir,
                                  (unsigned) geteuid(), (unsigned) getegid(), why);
                else
                        log_error("Refusing the state directory \"%s\": %s", dir, why);
                return 1;
        }
        return 0;
}

/* check_state_dir() for --check-config: one not made yet (tierd makes it, 0750) or not seen passes. */
static int check_state_dir_path(const char *dir) {
        _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

        if (fd < 0 && errno == ENOENT)
                return 0;
        if (fd < 0 && errno == ENOTDIR) {
                log_error("Refusing the state directory \"%s\": it is not a directory", dir);
                return 1;
        }
        if (fd < 0) {
                log_warning_errno(errno, "Cannot open state directory \"%s\", not checked: %m", dir);
                return 0;
        }
        return check_state_dir(fd, dir);
}

/*
 * Is each NVMe target's directory one nobody but tierd's user can put a name in?  tierd, as root,
 * creates, truncates and writes the target: a link planted there by another user would aim that at a
 * file of root's (nvme_check_trusted(): statefile_resolve_trusted(), which follows a link only in such
 * a directory and judges where it leads the same; the target itself is opened O_NOFOLLOW in the
 * directory judged; a reload judges the new configuration's the same, reload.c).
 * A directory that does not exist is left to the open; one that cannot be looked at is, for
 * --check-config (@check_only), not checked, and at start refused by the open.  0, 1 refused (logged).
 */
static int check_targets(const Config *c, bool check_only) {
        char why[1024];

        if (nvme_check_trusted(c, check_only, why, sizeof(why)) < 0) {
                log_error("%s", why);
                return 1;
        }
        return 0;
}

static int run(int argc, char *argv[]) {
        /* declared first, so closed last: held while the manager is freed, which saves the wear book
         * and marks the NVMe index stopped (cleanups run in the reverse order of the declarations) */
        _unused_ _cleanup_close_ int state_lock = -1;
        _cleanup_(manager_freep) Manager *m = NULL;
        _unused_ _cleanup_(notify_stopping) const char *notify_stop = NULL;
        _cleanup_free_ char *err = NULL;
        ConfigArgs args;
        Config config;
        sigset_t ss;
        int inherited, r;
        char status[512], where[sizeof(((struct sockaddr_un *) NULL)->sun_path) + 16];

        r = parse_argv(argc, argv);
        if (r != 0)
                return r > 0 ? EXIT_SUCCESS : 2;

        log_setup(arg_log_target);

        args = (ConfigArgs) {
                .config_path = (char *) (arg_config ? arg_config : TIERD_DEFAULT_CONFIG),
                .config_must_exist = arg_config != NULL,
                .socket_path = arg_socket,
                .state_dir = arg_state_dir,
                .log_level = arg_log_level,
        };
        r = reload_config_load(&args, &config, &err);
        if (r < 0) {
                log_error("%s", err ? err : strerror(-r));
                return r == -ENOMEM ? 1 : EXIT_CONFIG_REFUSED;
        }
        log_set_level(config.log_level);

        r = check_kernel();
        if (r != 0) {
                config_deinit(&config);
                return r > 0 ? EXIT_CONFIG_REFUSED : 1;
        }
        if (arg_check_config) {
                /*
                 * In a start's order: the state directory and the targets' trust first, so that a target
                 * refused as untrusted is never looked at by its path (the capacity check stat()s it, and
                 * opens a device, through a link planted there) nor its capacity said.
                 */
                r = check_state_dir_path(config.state_dir);
                if (r == 0)
                        r = check_targets(&config, true);
                if (r == 0)
                        r = check_capacity(&config);
                if (r == 0)
                        r = check_quotas(&config);
                if (r == 0)
                        r = check_index(&config);
                if (r != 0) {
                        config_deinit(&config);
                        return r > 0 ? EXIT_CONFIG_REFUSED : 1;        /* < 0: could not check */
                }
                r = config_print(stdout, &config);
                config_deinit(&config);
                if (r < 0) {
                        log_error_errno(r, "Cannot print the configuration: %m");
                        return 1;
                }
                return EXIT_SUCCESS;
        }

        inherited = inherit_listen_fd();
        if (inherited < -1) {
                config_deinit(&config);
                return 1;
        }
        /* a socket tierd cannot serve on is refused before the state directory, the pools and the targets */
        if (server_check_listen(inherited, config.socket_path) < 0) {
                safe_close(inherited);
                config_deinit(&config);
                return 1;
        }

        if (mkdir(config.state_dir, 0750) < 0 && errno != EEXIST) {
                log_error_errno(errno, "Cannot create state directory \"%s\": %m", config.state_dir);
                safe_close(inherited);
                config_deinit(&config);
                return 1;
        }
        raise_nofile();
        state_lock = lock_state_dir(config.state_dir);
        if (state_lock < 0) {
                safe_close(inherited);
                config_deinit(&config);
                return 1;
        }
        r = check_state_dir(state_lock, config.state_dir);
        if (r == 0)
                r = check_targets(&config, false);
        if (r != 0) {
                safe_close(inherited);
                config_deinit(&config);
                return r > 0 ? EXIT_CONFIG_REFUSED : 1;
        }
        /* what a tierd killed while replacing a state file left (the directory is trusted and locked) */
        (void) statefile_remove_temps(state_lock, config.state_dir,
                                      (const char *const[]) { QUOTA_STATE_FILE, WEAR_FILE, NULL }, geteuid());

        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGHUP);
        sigprocmask(SIG_BLOCK, &ss, NULL);
        signal(SIGPIPE, SIG_IGN);

        r = manager_new(&m, &config, &args);            /* consumes config */
        if (r < 0) {
                safe_close(inherited);
                return r == MANAGER_CONFIG_REFUSED ? EXIT_CONFIG_REFUSED : 1;
        }
        if (inherited >= 0 && strcmp(m->config.socket_path, TIERD_DEFAULT_SOCKET) != 0)
                log_info("Serving on the socket passed by the service manager; [daemon] socket \"%s\" is not used",
                         m->config.socket_path);
        r = server_listen(m->server, inherited, m->config.socket_path);         /* consumes inherited */
        if (r < 0)
                return 1;

        manager_status_line(m, status, sizeof(status));
        log_info("tierd %s ready on %s: %s%s", TIERD_VERSION,
                 inherited >= 0 ? socket_path_of(inherited, where, sizeof(where)) : m->config.socket_path, status,
                 m->vram->emulated ? " [VRAM IS EMULATED]" : "");
        (void) sd_notifyf(false, "READY=1\nSTATUS=%s", status);
        notify_stop = "STOPPING=1";

        r = manager_run(m);
        if (r < 0) {
                log_error_errno(r, "Event loop failed: %m");
                return 1;
        }
        log_info("Stopped");
        return EXIT_SUCCESS;
}

int main(int argc, char *argv[]) {
        close_inherited_fds();
        return run(argc, argv);
}
