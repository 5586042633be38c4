/* SPDX-License-Identifier: MIT */
/* harness.c: run a real tierd from this build on a temporary directory, the way systemd would. */

/*
 * Theory of operation
 *
 * Every test that needs a daemon runs the real program from the build tree
 * ($TIER_BUILD/daemon/tierd), not a library copy: tests see what users see.
 * The harness plays the service manager's part.  It owns NOTIFY_SOCKET (a
 * datagram socket in the test's temporary directory) and keeps every
 * message with its arrival time, so tests can check order and intervals;
 * "started" means READY=1 arrived, which also checks that tierd sends it.
 * It sets WATCHDOG_USEC and WATCHDOG_PID as systemd does for WatchdogSec=,
 * and it starts tierd either directly or through systemd-socket-activate,
 * which binds the socket and execs tierd with LISTEN_FDS on the first
 * connection, as a .socket unit does.
 *
 * tierd's stdout and stderr go to DIR/tierd.log, which is printed when
 * tierd fails to start, exits while a test waits for it, stops with a
 * non-zero status, or is still running at clean-up (the test failed
 * half-way).  The directory goes away at clean-up unless $TIER_TEST_KEEP
 * is set.  It lives under /var/tmp, not $TMPDIR: tierd opens its NVMe
 * target files there with O_DIRECT, which a tmpfs may refuse.
 *
 * Nothing here parses JSON or uses cmocka, so that a benchmark can start
 * a tierd with it too (bench/bench-vram-cuda.c); tests/helpers/json.[ch]
 * read tierd's status.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/macro.h"
#include "tests/helpers/harness.h"
#include "util/time-util.h"

/* Where the programs are, relative to $TIER_BUILD: the only place tests name them. */
#define TIERD_PATH "daemon/tierd"
#define TIERCTL_PATH "client/tierctl"

/* Start-up (pool allocation, target preallocation) takes a moment, more under valgrind or ASan. */
#define READY_TIMEOUT_MS 30000
/* tierd's own bound on the drain at SIGTERM is 10 s. */
#define STOP_TIMEOUT_MS 10000

#define CAP_IPC_LOCK_BIT 14

static const char *build_path(const char *rel, char *buf, size_t size) {
        const char *b = getenv("TIER_BUILD");

        snprintf(buf, size, "%s/%s", b && *b ? b : "build", rel);
        return buf;
}

const char *test_tierd_path(char *buf, size_t size) {
        return build_path(TIERD_PATH, buf, size);
}

const char *test_tierctl_path(char *buf, size_t size) {
        return build_path(TIERCTL_PATH, buf, size);
}

bool test_have_program(const char *prog) {
        const char *path = getenv("PATH");
        _cleanup_free_ char *copy = NULL;
        char *save = NULL;

        copy = strdup(path ? path : "/usr/local/bin:/usr/bin:/bin");
        if (!copy)
                return false;
        for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
                char p[1024];

                snprintf(p, sizeof(p), "%s/%s", dir, prog);
                if (access(p, X_OK) == 0)
                        return true;
        }
        return false;
}

/* The capability set @name ("CapAmb", "CapBnd") of this process, from /proc/self/status; 0 if unknown. */
static uint64_t cap_set(const char *name) {
        size_t n = strlen(name);
        uint64_t v = 0;
        char line[256];
        FILE *f;

        f = fopen("/proc/self/status", "re");
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, name, n) == 0 && line[n] == ':') {
                        v = strtoull(line + n + 1, NULL, 16);
                        break;
                }
        fclose(f);
        return v;
}

bool test_can_lock_memory(uint64_t bytes) {
        const uint64_t ipc_lock = UINT64_C(1) << CAP_IPC_LOCK_BIT;
        struct rlimit rl;

        /* what tierd will have after exec: root gets its bounding set, others their ambient set */
        if (geteuid() == 0 ? (cap_set("CapBnd") & ipc_lock) : (cap_set("CapAmb") & ipc_lock))
                return true;
        if (getrlimit(RLIMIT_MEMLOCK, &rl) < 0)
                return false;
        if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= bytes + (UINT64_C(1) << 20))
                return true;
        printf("tierd's host pool of %" PRIu64 " MiB needs CAP_IPC_LOCK or RLIMIT_MEMLOCK above it "
               "(io_uring fixed buffers count against it); the limit here is %" PRIu64 " KiB "
               "(ulimit -l): skipped\n", bytes >> 20, (uint64_t) rl.rlim_cur >> 10);
        return false;
}

static char *replace_dir(const char *body, const char *dir) {
        size_t n = strlen(body) + 1;
        char *out, *o;

        for (const char *p = body; (p = strstr(p, "@DIR@")); p += 5)
                n += strlen(dir);
        out = o = malloc(n);
        if (!out)
                return NULL;
        while (*body) {
                if (strncmp(body, "@DIR@", 5) == 0) {
                        o = stpcpy(o, dir);
                        body += 5;
                } else
                        *o++ = *body++;
        }
        *o = 0;
        return out;
}

int test_daemon_write_config(TestDaemon *d, const char *dropin, const char *body) {
        _cleanup_free_ char *text = NULL;
        char path[600], tmp[620];
        FILE *f;

        if (dropin) {
                snprintf(path, sizeof(path), "%s.d", d->config);
                if (mkdir(path, 0755) < 0 && errno != EEXIST)
                        return -errno;
                snprintf(path, sizeof(path), "%s.d/%s", d->config, dropin);
                if (!body)
                        return unlink(path) < 0 ? -errno : 0;
        } else
                snprintf(path, sizeof(path), "%s", d->config);

        text = replace_dir(body, d->dir);
        if (!text)
                return -ENOMEM;
        /* write and rename, so that a reload never reads half a file */
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        f = fopen(tmp, "we");
        if (!f)
                return -errno;
        fputs(text, f);
        if (fclose(f) != 0 || rename(tmp, path) < 0)
                return -errno;
        return 0;
}

int test_daemon_init(TestDaemon *d, const char *config_body) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int r;

        *d = (TestDaemon) { .notify_fd = -1 };
        snprintf(d->dir, sizeof(d->dir), "/var/tmp/tierd-test.XXXXXX");
        if (!mkdtemp(d->dir)) {
                d->dir[0] = 0;
                return -errno;
        }
        snprintf(d->socket, sizeof(d->socket), "%s/tierd.sock", d->dir);
        snprintf(d->config, sizeof(d->config), "%s/tierd.conf", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/tierd.log", d->dir);
        snprintf(d->notify_path, sizeof(d->notify_path), "%s/notify", d->dir);

        r = test_daemon_write_config(d, NULL, config_body);
        if (r < 0)
                return r;

        d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (d->notify_fd < 0)
                return -errno;
        strcpy(sa.sun_path, d->notify_path);
        if (bind(d->notify_fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
                return -errno;
        return 0;
}

/* In the child: the environment systemd would give tierd, then exec. */
_Noreturn static void exec_child(const TestDaemon *d, const TestDaemonOptions *o, const char *const *argv) {
        int lfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

        if (lfd >= 0) {
                dup2(lfd, STDOUT_FILENO);
                dup2(lfd, STDERR_FILENO);
        }
        (void) prctl(PR_SET_PDEATHSIG, SIGTERM);        /* dies with a timed-out test */
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDNAMES");
        if (d->fd_store && d->n_stored > 0 && !o->activate) {
                /* the fd store's fds, as systemd passes them: from fd 3 on, named, for this pid */
                size_t len = 1;
                char *names, v[32];
                int high[TEST_STORE_MAX];

                for (size_t i = 0; i < d->n_stored; i++) {
                        high[i] = fcntl(d->stored[i].fd, F_DUPFD, 3 + (int) d->n_stored);
                        len += strlen(d->stored[i].name) + 1;
                }
                names = calloc(1, len);
                for (size_t i = 0; i < d->n_stored; i++) {
                        dup2(high[i], 3 + (int) i);
                        close(high[i]);
                        if (names) {
                                if (i)
                                        strcat(names, ":");
                                strcat(names, d->stored[i].name);
                        }
                }
                snprintf(v, sizeof(v), "%zu", d->n_stored);
                setenv("LISTEN_FDS", v, 1);
                snprintf(v, sizeof(v), "%d", (int) getpid());
                setenv("LISTEN_PID", v, 1);
                if (names)
                        setenv("LISTEN_FDNAMES", names, 1);
        }
        unsetenv("JOURNAL_STREAM");
        setenv("NOTIFY_SOCKET", d->notify_path, 1);
        if (d->fd_store)
                setenv("FDSTORE", TEST_STORE_MAX_STR, 1);       /* what systemd >= 254 sets: the store's size */
        else
                unsetenv("FDSTORE");
        if (o->watchdog_usec) {
                char v[32];

                snprintf(v, sizeof(v), "%" PRIu64, o->watchdog_usec);
                setenv("WATCHDOG_USEC", v, 1);
                /* what systemd sets: the main pid, which stays ours across exec */
                snprintf(v, sizeof(v), "%d", o->watchdog_pid > 0 ? (int) o->watchdog_pid : (int) getpid());
                setenv("WATCHDOG_PID", v, 1);
        } else {
                unsetenv("WATCHDOG_USEC");
                unsetenv("WATCHDOG_PID");
        }
        execvp(argv[0], (char *const *) argv);
        fprintf(stderr, "cannot execute %s: %m\n", argv[0]);
        _exit(127);
}

int test_daemon_spawn(TestDaemon *d, const TestDaemonOptions *o) {
        static const char *const pass_env[] = {
                "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TIER_BUILD", "TIER_LIBCUDA",
        };
        char tierd[512], env_notify[400], env_wd[64];
        const char *argv[64];
        bool has_target = false;
        size_t n = 0;
        int r;

        test_tierd_path(tierd, sizeof(tierd));
        if (o->activate) {
                /* systemd-socket-activate passes on only what -E names */
                snprintf(env_notify, sizeof(env_notify), "NOTIFY_SOCKET=%s", d->notify_path);
                argv[n++] = "systemd-socket-activate";
                if (!o->stream)
                        argv[n++] = "--seqpacket";
                argv[n++] = "-l";
                argv[n++] = d->socket;
                if (o->listen2) {
                        argv[n++] = "-l";
                        argv[n++] = o->listen2;
                }
                argv[n++] = "-E";
                argv[n++] = env_notify;
                if (o->watchdog_usec) {
                        snprintf(env_wd, sizeof(env_wd), "WATCHDOG_USEC=%" PRIu64, o->watchdog_usec);
                        argv[n++] = "-E";
                        argv[n++] = env_wd;
                }
                for (size_t i = 0; i < ELEMENTSOF(pass_env); i++)
                        if (getenv(pass_env[i])) {
                                argv[n++] = "-E";
                                argv[n++] = pass_env[i];
                        }
        }
        argv[n++] = tierd;
        argv[n++] = "--config";
        argv[n++] = d->config;
        argv[n++] = "--state-dir";
        argv[n++] = d->dir;
        if (!o->activate) {
                argv[n++] = "--socket";
                argv[n++] = d->socket;
        }
        if (o->log_level) {
                argv[n++] = "--log-level";
                argv[n++] = o->log_level;
        }
        for (const char *const *a = o->args; a && *a; a++)
                if (strncmp(*a, "--log-target", 12) == 0)
                        has_target = true;
        if (!has_target) {
                argv[n++] = "--log-target";
                argv[n++] = "stderr";
        }
        for (const char *const *a = o->args; a && *a; a++) {
                if (n >= ELEMENTSOF(argv) - 1)
                        return -E2BIG;
                argv[n++] = *a;
        }
        argv[n] = NULL;

        d->pid = fork();
        if (d->pid < 0) {
                r = -errno;
                d->pid = 0;
                return r;
        }
        if (d->pid == 0)
                exec_child(d, o, argv);

        if (o->wait_ready) {
                r = test_daemon_wait_notify(d, "READY=1", READY_TIMEOUT_MS);
                if (r < 0) {
                        fprintf(stderr, "tierd did not send READY=1: %s\n", strerror(-r));
                        if (r != -ECHILD)       /* else printed already */
                                test_daemon_dump_log(d);
                        return r;
                }
        }
        return 0;
}

int test_daemon_start(TestDaemon *d, const char *config_body) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };
        int r;

        r = test_daemon_init(d, config_body);
        if (r >= 0)
                r = test_daemon_spawn(d, &o);
        if (r < 0) {
                /* the log is printed already: no second copy from the clean-up */
                if (d->pid > 0) {
                        kill(d->pid, SIGKILL);
                        waitpid(d->pid, NULL, 0);
                        d->pid = 0;
                }
                test_daemon_cleanup(d);
        }
        return r;
}

static void stored_drop(TestDaemon *d, const char *name) {
        size_t k = 0;

        for (size_t i = 0; i < d->n_stored; i++) {
                if (strcmp(d->stored[i].name, name) == 0) {
                        close(d->stored[i].fd);
                        free(d->stored[i].name);
                        continue;
                }
                d->stored[k++] = d->stored[i];
        }
        d->n_stored = k;
}

/* What a service manager does with a message's FDSTORE= / FDSTOREREMOVE= and the fds that came with it. */
static void fd_store_message(TestDaemon *d, const char *text, const int *fds, size_t n_fds) {
        char name[256] = "stored";

        (void) test_notify_field(text, "FDNAME", name, sizeof(name));
        if (strstr(text, "FDSTOREREMOVE=1"))
                stored_drop(d, name);
        for (size_t i = 0; i < n_fds; i++) {
                if (!d->fd_store || !strstr(text, "FDSTORE=1") || d->n_stored == TEST_STORE_MAX) {
                        close(fds[i]);
                        continue;
                }
                d->stored[d->n_stored].name = strdup(name);
                d->stored[d->n_stored++].fd = fds[i];
        }
}

/* Read every message waiting on the notify socket. */
static void notify_drain(TestDaemon *d) {
        for (;;) {
                char buf[4096];
                union {
                        struct cmsghdr h;
                        uint8_t buf[CMSG_SPACE(sizeof(int) * 64)];
                } control;
                struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) - 1 };
                struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                                     .msg_controllen = sizeof(control.buf) };
                int fds[64];
                size_t n_fds = 0;
                ssize_t n = recvmsg(d->notify_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

                if (n < 0)
                        return;
                buf[n] = 0;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
                        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

                                for (size_t i = 0; i < k && n_fds < 64; i++)
                                        memcpy(&fds[n_fds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                        }
                fd_store_message(d, buf, fds, n_fds);
                /* the fd store's own traffic (tens per start with the memory store) is not kept as notes */
                if (d->n_notes >= TEST_NOTIFY_MAX || strstr(buf, "FDSTORE=1") || strstr(buf, "FDSTOREREMOVE=1"))
                        continue;
                if (d->n_notes % 64 == 0) {
                        TestNotify *a = reallocarray(d->notes, d->n_notes + 64, sizeof(TestNotify));

                        if (!a)
                                continue;
                        d->notes = a;
                }
                d->notes[d->n_notes].usec = now_usec();
                d->notes[d->n_notes].text = strdup(buf);
                if (d->notes[d->n_notes].text)
                        d->n_notes++;
        }
}

void test_daemon_drain(TestDaemon *d) {
        notify_drain(d);
}

int test_daemon_wait_stored(TestDaemon *d, const char *prefix, size_t n, int timeout_ms) {
        uint64_t end = now_usec() + (uint64_t) timeout_ms * 1000u;

        for (;;) {
                struct pollfd p = { .fd = d->notify_fd, .events = POLLIN };

                notify_drain(d);
                if (test_daemon_stored(d, prefix) >= n)
                        return 0;
                if (now_usec() >= end)
                        return -ETIMEDOUT;
                (void) poll(&p, 1, 100);
        }
}

size_t test_daemon_stored(const TestDaemon *d, const char *prefix) {
        size_t n = 0;

        for (size_t i = 0; i < d->n_stored; i++)
                n += strncmp(d->stored[i].name, prefix, strlen(prefix)) == 0;
        return n;
}

void test_daemon_collect(TestDaemon *d, int ms) {
        uint64_t until = now_usec() + (uint64_t) ms * 1000u;

        for (uint64_t now = now_usec(); now < until; now = now_usec()) {
                struct pollfd p = { .fd = d->notify_fd, .events = POLLIN };

                (void) poll(&p, 1, (int) ((until - now) / 1000u) + 1);
                notify_drain(d);
        }
}

int test_daemon_wait_notify(TestDaemon *d, const char *needle, int timeout_ms) {
        uint64_t until = now_usec() + (uint64_t) timeout_ms * 1000u;

        for (;;) {
                struct pollfd p = { .fd = d->notify_fd, .events = POLLIN };
                uint64_t now;
                int st;

                notify_drain(d);
                for (; d->seen < d->n_notes; d->seen++)
                        if (strstr(d->notes[d->seen].text, needle))
                                return (int) d->seen++;
                now = now_usec();
                if (now >= until)
                        return -ETIMEDOUT;
                if (d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == d->pid) {
                        fprintf(stderr, "tierd exited (wait status %d) while we waited for \"%s\"\n", st, needle);
                        d->exited = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                        d->pid = 0;
                        notify_drain(d);
                        test_daemon_dump_log(d);
                        return -ECHILD;
                }
                (void) poll(&p, 1, (until - now) / 1000u + 1 < 100 ? (int) ((until - now) / 1000u + 1) : 100);
        }
}

int test_daemon_find_notify(const TestDaemon *d, const char *needle) {
        for (size_t i = 0; i < d->n_notes; i++)
                if (strstr(d->notes[i].text, needle))
                        return (int) i;
        return -1;
}

const char *test_notify_field(const char *text, const char *key, char *buf, size_t size) {
        size_t k = strlen(key);

        for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
                if (strncmp(l, key, k) == 0 && l[k] == '=') {
                        const char *v = l + k + 1, *e = strchr(v, '\n');
                        size_t len = e ? (size_t) (e - v) : strlen(v);

                        if (len >= size)
                                len = size - 1;
                        memcpy(buf, v, len);
                        buf[len] = 0;
                        return buf;
                }
        return NULL;
}

int test_daemon_kill(TestDaemon *d, int sig, int timeout_ms) {
        int st = 0;

        if (d->pid <= 0)
                return -1;
        if (sig)
                kill(d->pid, sig);
        for (int waited = 0; waited < timeout_ms; waited += 20) {
                if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                        d->pid = 0;
                        notify_drain(d);
                        d->exited = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                        return d->exited;
                }
                /* keep reading: STOPPING=1 and the last WATCHDOG=1 come now */
                notify_drain(d);
                usleep(20000);
        }
        fprintf(stderr, "tierd did not exit within %d ms: killed\n", timeout_ms);
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
        return -1;
}

int test_daemon_stop(TestDaemon *d) {
        int r = test_daemon_kill(d, SIGTERM, STOP_TIMEOUT_MS);

        if (r != 0 && d->dir[0])
                test_daemon_dump_log(d);
        test_daemon_cleanup(d);
        return r;
}

void test_daemon_cleanup(TestDaemon *d) {
        char cmd[600];

        if (d->pid <= 0 && !d->dir[0])
                return;         /* never initialised, or cleaned up already */
        if (d->pid > 0) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, NULL, 0);
                d->pid = 0;
                fprintf(stderr, "tierd was still running at clean-up: killed\n");
                test_daemon_dump_log(d);
        }
        d->notify_fd = safe_close(d->notify_fd);
        for (size_t i = 0; i < d->n_stored; i++) {
                close(d->stored[i].fd);
                free(d->stored[i].name);
        }
        d->n_stored = 0;
        for (size_t i = 0; i < d->n_notes; i++)
                free(d->notes[i].text);
        free(d->notes);
        d->notes = NULL;
        d->n_notes = d->seen = 0;
        if (d->dir[0] && getenv("TIER_TEST_KEEP"))
                fprintf(stderr, "kept %s\n", d->dir);
        else if (d->dir[0]) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
                if (system(cmd) != 0)
                        fprintf(stderr, "cannot remove %s\n", d->dir);
        }
        d->dir[0] = 0;
}

static char *read_file(const char *path) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0, n;
        FILE *f;

        f = fopen(path, "re");
        if (!f)
                return NULL;
        for (;;) {
                if (cap - len < 4096) {
                        char *p = realloc(buf, cap = cap ? cap * 2 : 8192);

                        if (!p) {
                                fclose(f);
                                return NULL;
                        }
                        buf = p;
                }
                n = fread(buf + len, 1, cap - len - 1, f);
                if (n == 0)
                        break;
                len += n;
        }
        fclose(f);
        buf[len] = 0;
        return TAKE_PTR(buf);
}

bool test_daemon_log_contains(const TestDaemon *d, const char *needle) {
        _cleanup_free_ char *text = read_file(d->log);

        return text && strstr(text, needle);
}

void test_daemon_dump_log(const TestDaemon *d) {
        _cleanup_free_ char *text = read_file(d->log);

        fprintf(stderr, "---- tierd log (%s) ----\n%s---- end of log ----\n", d->log, text ? text : "(none)\n");
}

char *test_daemon_tierctl_json(const TestDaemon *d) {
        _cleanup_free_ char *out = NULL;
        char tierctl[512], cmd[1200];
        size_t len = 0, cap = 0;
        FILE *p;
        int c;

        test_tierctl_path(tierctl, sizeof(tierctl));
        snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --json status", tierctl, d->socket);
        p = popen(cmd, "re");
        if (!p)
                return NULL;
        while ((c = fgetc(p)) != EOF) {
                if (len + 2 > cap) {
                        char *a = realloc(out, cap = cap ? cap * 2 : 4096);

                        if (!a) {
                                pclose(p);
                                return NULL;
                        }
                        out = a;
                }
                out[len++] = (char) c;
        }
        if (pclose(p) != 0 || !out) {
                fprintf(stderr, "%s failed\n", cmd);
                return NULL;
        }
        out[len] = 0;
        return TAKE_PTR(out);
}

int test_raw_connect(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd;

        if (strlen(path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        strcpy(sa.sun_path, path);
        if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                int r = -errno;

                close(fd);
                return r;
        }
        return fd;
}
