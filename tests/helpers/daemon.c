/* SPDX-License-Identifier: MIT */
/* daemon.c: start a real tierd on a temporary directory for integration tests. */

/*
 * The daemon is the installed program, not a library copy: tests see what
 * users see.  Readiness comes from sd_notify: the helper binds a datagram
 * socket, passes it as NOTIFY_SOCKET and waits for READY=1 (so these tests
 * also check that tierd sends it).
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
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/daemon.h"

const char *test_build_path(const char *rel, char *buf, size_t size) {
        const char *b = getenv("TIER_BUILD");

        snprintf(buf, size, "%s/%s", b ? b : "build", rel);
        return buf;
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

static void dump_log(const TestDaemon *d) {
        char buf[4096];
        FILE *f = fopen(d->log, "re");
        size_t n;

        if (!f)
                return;
        fprintf(stderr, "---- tierd log (%s) ----\n", d->log);
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
                fwrite(buf, 1, n, stderr);
        fprintf(stderr, "---- end of log ----\n");
        fclose(f);
}

int test_daemon_start(TestDaemon *d, const char *config_body) {
        char notify_path[320], tierd[512], *body;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int nfd, r;
        FILE *f;

        memset(d, 0, sizeof(*d));
        snprintf(d->dir, sizeof(d->dir), "/var/tmp/tierd-test.XXXXXX");
        if (!mkdtemp(d->dir))
                return -errno;
        snprintf(d->socket, sizeof(d->socket), "%s/tierd.sock", d->dir);
        snprintf(d->config, sizeof(d->config), "%s/tierd.conf", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/tierd.log", d->dir);
        snprintf(notify_path, sizeof(notify_path), "%s/notify", d->dir);

        body = replace_dir(config_body, d->dir);
        f = fopen(d->config, "we");
        if (!body || !f) {
                free(body);
                if (f)
                        fclose(f);
                return -ENOMEM;
        }
        fputs(body, f);
        fclose(f);
        free(body);

        nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (nfd < 0)
                return -errno;
        strcpy(sa.sun_path, notify_path);
        if (bind(nfd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                r = -errno;
                close(nfd);
                return r;
        }

        test_build_path("daemon/tierd", tierd, sizeof(tierd));
        d->pid = fork();
        if (d->pid < 0) {
                r = -errno;
                close(nfd);
                return r;
        }
        if (d->pid == 0) {
                int lfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

                if (lfd >= 0) {
                        dup2(lfd, STDOUT_FILENO);
                        dup2(lfd, STDERR_FILENO);
                }
                /* if the test dies (a timeout), its daemon goes with it */
                (void) prctl(PR_SET_PDEATHSIG, SIGTERM);
                setenv("NOTIFY_SOCKET", notify_path, 1);
                unsetenv("LISTEN_FDS");
                unsetenv("LISTEN_PID");
                execl(tierd, tierd, "--config", d->config, "--socket", d->socket, "--state-dir", d->dir,
                      "--log-target", "stderr", "--log-level", "debug", (char *) NULL);
                fprintf(stderr, "cannot execute %s: %m\n", tierd);
                _exit(127);
        }

        /* wait for READY=1 (pool allocation and preallocation take a moment) */
        for (int waited = 0; waited < 30000;) {
                struct pollfd p = { .fd = nfd, .events = POLLIN };
                char msg[4096];
                int st;

                if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                        fprintf(stderr, "tierd exited during start-up (status %d)\n", st);
                        dump_log(d);
                        d->pid = 0;
                        close(nfd);
                        return -ECHILD;
                }
                r = poll(&p, 1, 100);
                waited += 100;
                if (r <= 0)
                        continue;
                ssize_t n = recv(nfd, msg, sizeof(msg) - 1, 0);
                if (n <= 0)
                        continue;
                msg[n] = 0;
                if (strstr(msg, "READY=1")) {
                        close(nfd);
                        return 0;
                }
        }
        close(nfd);
        dump_log(d);
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
        return -ETIMEDOUT;
}

int test_daemon_stop(TestDaemon *d) {
        int st = 0, ret = -1;
        char cmd[600];

        if (d->pid > 0) {
                kill(d->pid, SIGTERM);
                for (int i = 0; i < 200; i++) {
                        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                                ret = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                                break;
                        }
                        usleep(50000);
                }
                if (ret < 0) {
                        kill(d->pid, SIGKILL);
                        waitpid(d->pid, NULL, 0);
                }
                if (ret != 0)
                        dump_log(d);
        }
        d->pid = 0;
        if (d->dir[0] && !getenv("TIER_TEST_KEEP")) {
                snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
                if (system(cmd) != 0)
                        fprintf(stderr, "cannot remove %s\n", d->dir);
        }
        return ret;
}

char *test_tierctl_json(TestDaemon *d) {
        char tierctl[512], cmd[1200], *out = NULL;
        size_t len = 0, cap = 0;
        FILE *p;
        int c;

        test_build_path("client/tierctl", tierctl, sizeof(tierctl));
        snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --json status", tierctl, d->socket);
        p = popen(cmd, "re");
        if (!p)
                return NULL;
        while ((c = fgetc(p)) != EOF) {
                if (len + 2 > cap) {
                        char *n = realloc(out, cap = cap ? cap * 2 : 4096);
                        if (!n) {
                                free(out);
                                pclose(p);
                                return NULL;
                        }
                        out = n;
                }
                out[len++] = (char) c;
        }
        if (pclose(p) != 0 || !out) {
                free(out);
                return NULL;
        }
        out[len] = 0;
        return out;
}

unsigned long long test_json_sum(const char *json, const char *key) {
        char pat[64];
        unsigned long long sum = 0;

        snprintf(pat, sizeof(pat), "\"%s\":", key);
        for (const char *p = json; (p = strstr(p, pat)); p += strlen(pat))
                sum += strtoull(p + strlen(pat), NULL, 10);
        return sum;
}
