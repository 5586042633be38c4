/* SPDX-License-Identifier: MIT */
/* monitor.c: what tierd writes for monitoring: the metrics text file and the drive wear book. */

/*
 * Theory of operation: two timers on the manager's loop.
 *
 * The metrics file ([metrics] textfile = PATH): every interval_sec the
 * status is rendered as Prometheus text (ipc/metrics.c, the same text
 * `tierctl status --prometheus` prints) and written atomically (base/
 * statefile.c: a temporary file in the same directory, fsync, rename), so
 * node_exporter's textfile collector, which may read at any moment, sees
 * the old file or the new one and never part of one.  A failure is logged
 * once per kind (stage and errno), not at every tick, and its end is
 * logged too; the next tick tries again.  A clean stop removes the file
 * (monitor_remove_metrics()): a file left behind would go on showing jobs
 * and a growing uptime that no tierd has.  After a crash it stays, and its
 * modification time says how old it is; a temporary copy a crash left
 * (PATH.XXXXXX) is removed by the next start (metrics_remove_temps()).
 *
 * The drive wear book (state/wear.c, STATE_DIR/wear): loaded here at start
 * (before any job exists, so every job and target starts from its past),
 * saved every MONITOR_WEAR_SAVE_USEC when NVMe was written to, and once
 * more when tierd stops (manager_free(): after the transfers have ended,
 * before the registry goes; the book itself is freed after the registry,
 * whose ending jobs add their bytes to it).
 * A book that cannot be read (as opposed to a corrupt one, which is set
 * aside) is not overwritten: the wear is counted from zero and said so.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/base/statefile.h"
#include "daemon/core/monitor.h"
#include "daemon/ipc/metrics.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/tier-nvme.h"

static uint64_t targets_written(const NvmeTier *n) {
        uint64_t sum = 0;

        for (unsigned i = 0; n && i < n->n_targets; i++)
                sum += n->targets[i].bytes_written;
        return sum;
}

/* Log a failure of @stage once while it stays the same, and its end. */
static void metrics_outcome(Monitor *mo, char stage, int r) {
        const char *path = mo->config->metrics_textfile;

        if (r >= 0) {
                if (mo->metrics_error < 0)
                        log_notice("Metrics file %s is written again", path);
                mo->metrics_error = 0;
                return;
        }
        if (mo->metrics_error == r && mo->metrics_stage == stage)
                return;
        mo->metrics_error = r;
        mo->metrics_stage = stage;
        if (stage == 'b')
                log_warning_errno(r, "Cannot render the metrics for %s: %m; trying again every %llu s, "
                                  "said once", path, (unsigned long long) (mo->config->metrics_interval_usec / 1000000));
        else
                log_warning_errno(r, "Cannot write the metrics file %s: %m (is its directory there and writable "
                                  "by tierd? see [metrics] textfile in tierd.conf(5)); trying again every %llu s, "
                                  "said once", path, (unsigned long long) (mo->config->metrics_interval_usec / 1000000));
}

int monitor_write_metrics(Monitor *mo) {
        _cleanup_free_ char *text = NULL;
        size_t len = 0;
        int r;

        r = metrics_build(mo->rpc, &text, &len);
        if (r < 0) {
                metrics_outcome(mo, 'b', r);
                return r;
        }
        /* world-readable: node_exporter runs as its own user */
        r = statefile_write(mo->config->metrics_textfile, text, len, 0644);
        metrics_outcome(mo, 'w', r);
        if (r >= 0)
                mo->metrics_written = true;
        return r;
}

void monitor_remove_metrics(Monitor *mo) {
        const char *path = mo->config->metrics_textfile;

        if (!mo->metrics_written)
                return;         /* none of ours: another tierd's, or one a failed start must not take away */
        mo->metrics_timer = sd_event_source_disable_unref(mo->metrics_timer);
        if (unlink(path) < 0 && errno != ENOENT)
                log_warning_errno(-errno, "Cannot remove the metrics file %s: %m; it keeps this tierd's last "
                                  "values, ignoring", path);
        mo->metrics_written = false;
}

int monitor_save_wear(Monitor *mo, bool force) {
        uint64_t now = targets_written(mo->nvme);
        int r;

        if (!mo->wear_save || (!force && now == mo->wear_saved))
                return 0;
        r = wear_save(mo->wear, mo->nvme, mo->registry);
        if (r < 0) {
                if (r != mo->wear_error)
                        log_warning_errno(r, "Cannot write the drive wear book %s: %m; trying again later, ignoring",
                                          mo->wear->path);
                mo->wear_error = r;
                return r;
        }
        if (mo->wear_error < 0)
                log_notice("Drive wear book %s is written again", mo->wear->path);
        mo->wear_error = 0;
        mo->wear_saved = now;
        if (mo->wear->forgot) {
                log_notice("Drive wear book %s holds at most %d job names: those with the fewest bytes were "
                           "forgotten", mo->wear->path, WEAR_JOBS_MAX);
                mo->wear->forgot = false;
        }
        return 0;
}

static int rearm(sd_event_source *s, uint64_t usec) {
        uint64_t now = 0;
        int r;

        r = sd_event_now(sd_event_source_get_event(s), CLOCK_MONOTONIC, &now);
        if (r >= 0)
                r = sd_event_source_set_time(s, now + usec);
        if (r >= 0)
                r = sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        return r;
}

static int on_metrics_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Monitor *mo = userdata;

        (void) monitor_write_metrics(mo);
        (void) rearm(s, mo->config->metrics_interval_usec);
        return 0;
}

static int on_wear_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        Monitor *mo = userdata;

        (void) monitor_save_wear(mo, false);
        (void) rearm(s, MONITOR_WEAR_SAVE_USEC);
        return 0;
}

/*
 * What a tierd killed between making the metrics file's temporary copy (PATH.XXXXXX) and renaming it
 * left next to it, which node_exporter ignores and nothing else would ever remove: removed at start,
 * before this tierd's first write (statefile_remove_temps(): that pattern only, a regular file of
 * tierd's user, unlinkat() on the directory opened).  The directory is the collector's, which other
 * users may write: unlinkat() removes a name there and follows none.
 */
static void metrics_remove_temps(const char *path) {
        const char *slash = strrchr(path, '/');         /* an absolute path (config.c) */
        _cleanup_free_ char *dir = NULL;
        _cleanup_close_ int fd = -1;

        if (!slash)
                return;
        dir = strndup(path, slash == path ? 1 : (size_t) (slash - path));
        if (!dir)
                return;
        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
                log_debug_errno(errno, "Cannot open %s to look for temporary metrics files left there, ignoring: %m",
                                dir);
                return;
        }
        (void) statefile_remove_temps(fd, dir, (const char *const[]) { slash + 1, NULL }, geteuid());
}

static int load_wear(Monitor *mo) {
        char why[1024] = "";
        int r;

        r = wear_new(mo->config->state_dir, &mo->wear);
        if (r < 0)
                return r;
        r = wear_load(mo->wear, mo->nvme, why, sizeof(why));
        if (r == -ENOMEM)
                return r;
        mo->wear_save = r >= 0;
        if (r < 0)
                log_warning("Drive wear book %s: %s; counting wear from zero and not writing the book, "
                            "so that it is not lost (fix it and restart tierd)", mo->wear->path, why);
        else if (r == 2)
                log_warning("Drive wear book %s is corrupt: %s; counting wear from zero", mo->wear->path, why);
        else if (r == 1)
                log_info("Drive wear book %s does not exist yet: counting wear from zero", mo->wear->path);
        mo->registry->wear = mo->wear;
        return 0;
}

int monitor_new(sd_event *event, const Config *config, const Rpc *rpc, NvmeTier *nvme, Registry *registry,
                Monitor **ret) {
        _cleanup_(monitor_freep) Monitor *mo = NULL;
        int r;

        mo = calloc(1, sizeof(*mo));
        if (!mo)
                return -ENOMEM;
        *mo = (Monitor) {
                .event = event,
                .config = config,
                .rpc = rpc,
                .nvme = nvme,
                .registry = registry,
        };
        r = load_wear(mo);
        if (r < 0)
                return r;

        r = sd_event_add_time_relative(event, &mo->wear_timer, CLOCK_MONOTONIC, MONITOR_WEAR_SAVE_USEC, 0,
                                       on_wear_timer, mo);
        if (r < 0)
                return r;
        (void) sd_event_source_set_description(mo->wear_timer, "wear-save");

        if (config->metrics_textfile[0]) {
                metrics_remove_temps(config->metrics_textfile);
                /* the first file at once, so that node_exporter finds one as soon as tierd runs */
                r = sd_event_add_time_relative(event, &mo->metrics_timer, CLOCK_MONOTONIC, 0, 0,
                                               on_metrics_timer, mo);
                if (r < 0)
                        return r;
                (void) sd_event_source_set_description(mo->metrics_timer, "metrics-textfile");
        }
        *ret = TAKE_PTR(mo);
        return 0;
}

Monitor *monitor_free(Monitor *mo) {
        if (!mo)
                return NULL;
        mo->metrics_timer = sd_event_source_disable_unref(mo->metrics_timer);
        mo->wear_timer = sd_event_source_disable_unref(mo->wear_timer);
        mo->wear = wear_free(mo->wear);
        free(mo);
        return NULL;
}
