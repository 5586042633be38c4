/* SPDX-License-Identifier: MIT */
/* core.c: an in-process tierd core for the fuzz targets, and fds of every kind a client could pass. */

/*
 * Theory of operation: the Manager is built as tierd builds it, from a
 * Config, but without a listener (manager_new() with no ConfigArgs), as
 * the unit tests' fixture does; a fuzz target makes its connections with
 * conn_new() over socketpairs and runs the loop itself.  The pools are
 * small so that each input starts from a fresh daemon quickly; the
 * temporary directory holding the NVMe target file is made once per
 * process and removed at exit.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "tests/fuzz/core.h"
#include "tests/fuzz/fuzz.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static char dir[] = "/var/tmp/tierd-fuzz.XXXXXX";
static char target[sizeof(dir) + 16];

/* The target and whatever tierd keeps in its state directory (wear and quotas books, set-aside copies). */
static void core_cleanup(void) {
        DIR *d = opendir(dir);
        struct dirent *e;

        if (d) {
                while ((e = readdir(d)))
                        if (e->d_type == DT_REG)
                                (void) unlinkat(dirfd(d), e->d_name, 0);
                closedir(d);
        }
        (void) rmdir(dir);
}

static void core_once(void) {
        static int done;
        sigset_t ss;

        if (done)
                return;
        done = 1;
        /* the manager watches these through signalfd, which needs them blocked */
        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigaddset(&ss, SIGHUP);
        sigprocmask(SIG_BLOCK, &ss, NULL);
        signal(SIGPIPE, SIG_IGN);
        FUZZ_CHECK(mkdtemp(dir));
        snprintf(target, sizeof(target), "%s/t0.img", dir);
        atexit(core_cleanup);
        log_set_level(getenv("TIER_FUZZ_LOG") ? LOG_DEBUG : LOG_EMERG);
}

Manager *core_new(int policy) {
        Manager *m = NULL;
        char *err = NULL;
        Config c;
        int r;

        core_once();
        config_init(&c);
        c.host_capacity = 2 * MiB;
        c.host_segment_size = 256 * KiB;
        c.host_job_limit = 1536 * KiB;
        c.vram_backend = VRAM_BACKEND_EMULATED;
        c.vram_capacity = 1 * MiB;
        c.vram_chunk_size = 256 * KiB;
        c.vram_job_limit = 768 * KiB;
        c.nvme_extent_size = 64 * KiB;
        c.nvme_job_limit = 3 * MiB;
        c.linger_usec = 0;
        c.max_inflight = 16;
        c.max_tensors = 64;
        c.max_tensors_per_uid = 96;     /* below two full jobs: uid 0's two jobs can reach it */
        c.sched_policy = policy;
        free(c.state_dir);
        c.state_dir = strdup(dir);
        c.targets[0].path = strdup(target);
        c.targets[0].size = 4 * MiB;
        c.n_targets = 1;
        FUZZ_CHECK(c.state_dir && c.targets[0].path);
        /* a job name only uid 1000 may take ([quota] owner =), as the seeds' second client is */
        if (config_parse_text(&c, "[quota]\njob = owned\nowner = 1000\nweight = 2\n", "core.conf", &err) < 0 ||
            config_finish(&c, &err) < 0) {
                fprintf(stderr, "config: %s\n", err ? err : "?");
                abort();
        }
        r = manager_new(&m, &c, NULL);
        if (r < 0) {
                fprintf(stderr, "manager_new: %s\n", strerror(-r));
                abort();
        }
        return m;
}

void core_run(Manager *m, uint64_t timeout_usec) {
        FUZZ_CHECK(sd_event_run(m->event, timeout_usec) >= 0);
}

void core_settle(Manager *m) {
        for (int i = 0; i < 2000 && m->engine->n_xfers > 0; i++)      /* one event source per pass */
                core_run(m, 10000);
        core_run(m, 0);
}

void core_free(Manager *m) {
        core_settle(m);
        manager_free(m);
}
