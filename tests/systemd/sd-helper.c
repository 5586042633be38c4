/* SPDX-License-Identifier: MIT */
/* sd-helper.c: run a real tierd the way systemd would, and watch what it tells systemd. */

/*
 * The tests here play the service manager's part: they own NOTIFY_SOCKET (a
 * datagram socket in the test's temporary directory), set WATCHDOG_USEC and
 * WATCHDOG_PID as systemd does for WatchdogSec=, and either start tierd
 * directly or through systemd-socket-activate, which binds the socket and
 * execs tierd with LISTEN_FDS on the first connection, as a .socket unit
 * does.  Every notify message is kept with its arrival time, so tests can
 * check order and intervals.
 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/systemd/sd-helper.h"

static uint64_t mono_usec(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

const char *sd_build_path(const char *rel, char *buf, size_t size) {
        const char *b = getenv("TIER_BUILD");

        snprintf(buf, size, "%s/%s", b ? b : "build", rel);
        return buf;
}

bool sd_have_program(const char *prog) {
        const char *path = getenv("PATH");
        char *copy, *save = NULL;
        bool found = false;

        if (!path)
                path = "/usr/local/bin:/usr/bin:/bin";
        copy = strdup(path);
        if (!copy)
                return false;
        for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
                char p[1024];

                snprintf(p, sizeof(p), "%s/%s", dir, prog);
                found = access(p, X_OK) == 0;
        }
        free(copy);
        return found;
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

int sd_daemon_write_config(SdDaemon *d, const char *dropin, const char *body) {
        char path[600], tmp[620], *text;
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
        if (!f) {
                free(text);
                return -errno;
        }
        fputs(text, f);
        free(text);
        if (fclose(f) != 0 || rename(tmp, path) < 0)
                return -errno;
        return 0;
}

int sd_daemon_init(SdDaemon *d, const char *config_body) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int r;

        memset(d, 0, sizeof(*d));
        d->notify_fd = -1;
        snprintf(d->dir, sizeof(d->dir), "/var/tmp/tierd-sd-test.XXXXXX");
        if (!mkdtemp(d->dir))
                return -errno;
        snprintf(d->socket, sizeof(d->socket), "%s/tierd.sock", d->dir);
        snprintf(d->config, sizeof(d->config), "%s/tierd.conf", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/tierd.log", d->dir);
        snprintf(d->notify_path, sizeof(d->notify_path), "%s/notify", d->dir);

        r = sd_daemon_write_config(d, NULL, config_body);
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

int sd_daemon_start(SdDaemon *d, const SdStart *o) {
        char tierd[512], env_notify[400], env_wd[64];
        const char *argv[64];
        size_t n = 0;
        bool has_target = false;

        sd_build_path("daemon/tierd", tierd, sizeof(tierd));
        snprintf(env_notify, sizeof(env_notify), "NOTIFY_SOCKET=%s", d->notify_path);

        if (o->activate) {
                /* systemd-socket-activate passes on only what -E names */
                argv[n++] = "systemd-socket-activate";
                if (!o->stream)
                        argv[n++] = "--seqpacket";
                argv[n++] = "-l";
                argv[n++] = d->socket;
                argv[n++] = "-E";
                argv[n++] = env_notify;
                if (o->watchdog_usec) {
                        snprintf(env_wd, sizeof(env_wd), "WATCHDOG_USEC=%llu",
                                 (unsigned long long) o->watchdog_usec);
                        argv[n++] = "-E";
                        argv[n++] = env_wd;
                }
                static const char *const pass[] = {
                        "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TIER_BUILD",
                };
                for (size_t i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
                        if (getenv(pass[i])) {
                                argv[n++] = "-E";
                                argv[n++] = pass[i];
                        }
        }
        argv[n++] = tierd;
        argv[n++] = "--config";
        argv[n++] = d->config;
        for (const char *const *a = o->args; a && *a; a++)
                if (strncmp(*a, "--log-target", 12) == 0)
                        has_target = true;
        if (!has_target) {
                argv[n++] = "--log-target";
                argv[n++] = "stderr";
        }
        for (const char *const *a = o->args; a && *a && n < 60; a++)
                argv[n++] = *a;
        argv[n] = NULL;

        d->pid = fork();
        if (d->pid < 0)
                return -errno;
        if (d->pid == 0) {
                int lfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

                if (lfd >= 0) {
                        dup2(lfd, STDOUT_FILENO);
                        dup2(lfd, STDERR_FILENO);
                }
                (void) prctl(PR_SET_PDEATHSIG, SIGTERM);        /* dies with a timed-out test */
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_PID");
                unsetenv("LISTEN_FDNAMES");
                unsetenv("JOURNAL_STREAM");
                setenv("NOTIFY_SOCKET", d->notify_path, 1);
                if (o->watchdog_usec) {
                        char v[32];

                        snprintf(v, sizeof(v), "%llu", (unsigned long long) o->watchdog_usec);
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

        if (o->wait_ready && sd_daemon_wait_notify(d, "READY=1", 30000) < 0) {
                fprintf(stderr, "tierd did not send READY=1\n");
                sd_daemon_dump_log(d);
                return -ETIMEDOUT;
        }
        return 0;
}

/* Read every message waiting on the notify socket. */
static void notify_drain(SdDaemon *d) {
        for (;;) {
                char buf[4096];
                ssize_t n = recv(d->notify_fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

                if (n < 0)
                        return;
                buf[n] = 0;
                if (d->n_notes < SD_NOTIFY_MAX) {
                        d->notes[d->n_notes].usec = mono_usec();
                        d->notes[d->n_notes].text = strdup(buf);
                        if (d->notes[d->n_notes].text)
                                d->n_notes++;
                }
        }
}

void sd_daemon_collect(SdDaemon *d, int ms) {
        uint64_t until = mono_usec() + (uint64_t) ms * 1000u;

        for (uint64_t now = mono_usec(); now < until; now = mono_usec()) {
                struct pollfd p = { .fd = d->notify_fd, .events = POLLIN };

                (void) poll(&p, 1, (int) ((until - now) / 1000u) + 1);
                notify_drain(d);
        }
}

int sd_daemon_wait_notify(SdDaemon *d, const char *needle, int timeout_ms) {
        uint64_t until = mono_usec() + (uint64_t) timeout_ms * 1000u;

        for (;;) {
                struct pollfd p = { .fd = d->notify_fd, .events = POLLIN };
                uint64_t now;
                int st;

                notify_drain(d);
                for (; d->seen < d->n_notes; d->seen++)
                        if (strstr(d->notes[d->seen].text, needle))
                                return (int) d->seen++;
                now = mono_usec();
                if (now >= until)
                        return -ETIMEDOUT;
                if (d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == d->pid) {
                        fprintf(stderr, "tierd exited (wait status %d) while we waited for \"%s\"\n", st, needle);
                        d->pid = 0;
                        notify_drain(d);
                        return -ECHILD;
                }
                (void) poll(&p, 1, (until - now) / 1000u + 1 < 100 ? (int) ((until - now) / 1000u + 1) : 100);
        }
}

const char *sd_notify_field(const char *text, const char *key, char *buf, size_t size) {
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

int sd_daemon_stop(SdDaemon *d, int sig, int timeout_ms) {
        int st = 0;

        if (d->pid <= 0)
                return -1;
        kill(d->pid, sig);
        for (int waited = 0; waited < timeout_ms; waited += 20) {
                if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                        d->pid = 0;
                        notify_drain(d);
                        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                }
                /* keep reading: STOPPING=1 and the last WATCHDOG=1 come now */
                notify_drain(d);
                usleep(20000);
        }
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
        return -1;
}

void sd_daemon_cleanup(SdDaemon *d) {
        char cmd[600];

        if (d->pid > 0) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, NULL, 0);
                d->pid = 0;
        }
        if (d->notify_fd >= 0)
                close(d->notify_fd);
        d->notify_fd = -1;
        for (size_t i = 0; i < d->n_notes; i++)
                free(d->notes[i].text);
        d->n_notes = d->seen = 0;
        if (d->dir[0] && !getenv("TIER_TEST_KEEP")) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
                if (system(cmd) != 0)
                        fprintf(stderr, "cannot remove %s\n", d->dir);
        }
        d->dir[0] = 0;
}

static char *read_file(const char *path) {
        FILE *f = fopen(path, "re");
        char *buf = NULL;
        size_t len = 0, cap = 0, n;

        if (!f)
                return NULL;
        for (;;) {
                if (cap - len < 4096) {
                        char *p = realloc(buf, cap = cap ? cap * 2 : 8192);

                        if (!p) {
                                free(buf);
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
        if (!buf)
                return NULL;
        buf[len] = 0;
        return buf;
}

bool sd_daemon_log_contains(const SdDaemon *d, const char *needle) {
        char *text = read_file(d->log);
        bool found = text && strstr(text, needle);

        free(text);
        return found;
}

void sd_daemon_dump_log(const SdDaemon *d) {
        char *text = read_file(d->log);

        fprintf(stderr, "---- tierd log (%s) ----\n%s---- end of log ----\n", d->log, text ? text : "(none)\n");
        free(text);
}

long long sd_json_job_tier(const char *json, const char *job, const char *tier, const char *field) {
        char pat[300];
        const char *p, *end;

        snprintf(pat, sizeof(pat), "\"name\":\"%s\"", job);
        p = strstr(json, pat);
        if (!p)
                return -1;
        end = strstr(p + 1, "\"name\":");      /* the next job, if any */
        snprintf(pat, sizeof(pat), "\"%s\":{", tier);
        p = strstr(p, pat);
        if (!p || (end && p > end))
                return -1;
        snprintf(pat, sizeof(pat), "\"%s\":", field);
        p = strstr(p, pat);
        if (!p || (end && p > end))
                return -1;
        return strtoll(p + strlen(pat), NULL, 10);
}

long long sd_json_tier(const char *json, const char *tier, const char *field) {
        char pat[300];
        const char *p;

        snprintf(pat, sizeof(pat), "\"tier\":\"%s\"", tier);
        p = strstr(json, pat);
        if (!p)
                return -1;
        snprintf(pat, sizeof(pat), "\"%s\":", field);
        p = strstr(p, pat);
        if (!p)
                return -1;
        return strtoll(p + strlen(pat), NULL, 10);
}
