/* SPDX-License-Identifier: MIT */
/* reload.c: SIGHUP re-reads the configuration. */

/*
 * Theory of operation: `systemctl reload tierd` sends SIGHUP (ExecReload=),
 * which lands here from the event loop.  tierd tells the service manager
 * RELOADING=1 (with MONOTONIC_USEC=, as Type=notify-reload wants), reads the
 * configuration exactly as at start-up (manager_config_load(): same file,
 * same drop-ins, same command-line overrides) into a new Config and only
 * then compares it with the running one, key by key, along reload_keys[]:
 *
 *   - live keys are copied into the running Config and applied: the log
 *     level, the per-job default limits (also to running jobs that still
 *     use the default), the emulated VRAM link's bandwidth, and limits that
 *     are only read when they are needed (linger, connection counts);
 *   - restart keys (capacities, segment and chunk sizes, targets, extent
 *     size, queue depth, socket, state directory, backend, protocol limits
 *     told to clients at their handshake) keep their running value: each
 *     change is logged as needing a restart.
 *
 * An invalid file changes nothing at all: the reason (FILE:LINE: [section]
 * key: why) is logged, kept for STATUS=, and the running Config stays
 * whole.  Either way READY=1 and a fresh STATUS= end the reload.  Nothing
 * here blocks: reading a few small files is the only I/O.
 */

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/core/manager.h"
#include "daemon/state/registry.h"
#include "daemon/core/reload.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"

typedef enum ReloadType {
        RELOAD_STRING,          /* char * */
        RELOAD_UNSIGNED,        /* unsigned, a count */
        RELOAD_UNSIGNED_SIZE,   /* unsigned, bytes */
        RELOAD_SIZE,            /* uint64_t, bytes */
        RELOAD_SECONDS,         /* uint64_t, microseconds shown as seconds */
        RELOAD_NUMA_NODE,       /* int, -1 auto */
        RELOAD_LOG_LEVEL,       /* int, syslog level */
        RELOAD_BACKEND,         /* VramBackendKind */
        RELOAD_POLICY,          /* SchedPolicyKind */
        RELOAD_TARGETS,         /* targets[] and n_targets */
} ReloadType;

typedef struct ReloadKey {
        const char *section;
        const char *name;
        size_t offset;
        size_t size;
        ReloadType type;
        bool live;              /* applied by a reload; else kept until a restart */
} ReloadKey;

#define RKEY(section, name, field, type, live) \
        { section, name, offsetof(Config, field), sizeof(((Config *) NULL)->field), type, live }

/* Every key of tierd.conf(5), in its order there. */
static const ReloadKey reload_keys[] = {
        /* the listener and the state directory are set up once */
        RKEY("daemon", "socket",                  socket_path,             RELOAD_STRING,        false),
        RKEY("daemon", "state_dir",               state_dir,               RELOAD_STRING,        false),
        RKEY("daemon", "log_level",               log_level,               RELOAD_LOG_LEVEL,     true),
        /* read when a job's last connection closes */
        RKEY("daemon", "linger_sec",              linger_usec,             RELOAD_SECONDS,       true),
        /* read at accept() and at the handshake */
        RKEY("daemon", "max_connections",         max_connections,         RELOAD_UNSIGNED,      true),
        RKEY("daemon", "max_connections_per_uid", max_connections_per_uid, RELOAD_UNSIGNED,      true),
        /* told to each client at its handshake and sizing per-connection buffers */
        RKEY("limits", "max_message",             max_message,             RELOAD_UNSIGNED_SIZE, false),
        RKEY("limits", "max_tensors",             max_tensors,             RELOAD_UNSIGNED,      false),
        RKEY("limits", "max_inflight",            max_inflight,            RELOAD_UNSIGNED,      false),
        RKEY("limits", "max_name",                max_name,                RELOAD_UNSIGNED,      false),
        /* pools are allocated, locked and registered with io_uring at start */
        RKEY("host",   "capacity",                host_capacity,           RELOAD_SIZE,          false),
        RKEY("host",   "segment_size",            host_segment_size,       RELOAD_SIZE,          false),
        RKEY("host",   "numa_node",               numa_node,               RELOAD_NUMA_NODE,     false),
        RKEY("host",   "job_limit",               host_job_limit,          RELOAD_SIZE,          true),
        RKEY("vram",   "backend",                 vram_backend,            RELOAD_BACKEND,       false),
        RKEY("vram",   "capacity",                vram_capacity,           RELOAD_SIZE,          false),
        RKEY("vram",   "chunk_size",              vram_chunk_size,         RELOAD_SIZE,          false),
        RKEY("vram",   "job_limit",               vram_job_limit,          RELOAD_SIZE,          true),
        RKEY("vram",   "bandwidth",               vram_bandwidth,          RELOAD_SIZE,          true),
        /* targets are opened and registered as fixed files, extents laid out, the ring sized */
        RKEY("nvme",   "target",                  targets,                 RELOAD_TARGETS,       false),
        RKEY("nvme",   "extent_size",             nvme_extent_size,        RELOAD_SIZE,          false),
        RKEY("nvme",   "queue_depth",             nvme_queue_depth,        RELOAD_UNSIGNED,      false),
        RKEY("nvme",   "job_limit",               nvme_job_limit,          RELOAD_SIZE,          true),
        RKEY("nvme",   "bandwidth",               nvme_bandwidth,          RELOAD_SIZE,          true),
        /* plans in flight keep the holds their policy built: a new policy needs a restart */
        RKEY("sched",  "policy",                  sched_policy,            RELOAD_POLICY,        false),
        RKEY("sched",  "default_weight",          default_weight,          RELOAD_UNSIGNED,      true),
};

/* ---- loading ---------------------------------------------------------------------- */

static int set_string(char **p, const char *v) {
        char *s = strdup(v);

        if (!s)
                return -ENOMEM;
        free(*p);
        *p = s;
        return 0;
}

int manager_config_load(const ManagerArgs *args, Config *ret, char **ret_error) {
        Config c;
        int r;

        if (ret_error)
                *ret_error = NULL;
        r = config_load_files(&c, args->config_path, args->config_must_exist, ret_error);
        if (r < 0)
                return r;
        if (args->socket_path)
                r = set_string(&c.socket_path, args->socket_path);
        if (r >= 0 && args->state_dir)
                r = set_string(&c.state_dir, args->state_dir);
        if (r >= 0)
                r = config_finish(&c, ret_error);
        if (r < 0) {
                config_deinit(&c);
                return r;
        }
        if (args->log_level >= 0)
                c.log_level = args->log_level;
        *ret = c;
        return 0;
}

int manager_set_args(Manager *m, const ManagerArgs *args) {
        char *p = strdup(args->config_path);

        if (!p)
                return -ENOMEM;
        free(m->config_path);
        m->config_path = p;
        m->config_must_exist = args->config_must_exist;
        m->arg_socket_path = args->socket_path;
        m->arg_state_dir = args->state_dir;
        m->arg_log_level = args->log_level;
        return 0;
}

/* ---- comparing -------------------------------------------------------------------- */

/* "64M" for exact multiples of 1024, else bytes: how tierd.conf writes sizes. */
static void format_size(char *buf, size_t n, uint64_t v) {
        static const char suffix[] = "KMGT";

        for (int i = (int) sizeof(suffix) - 2; i >= 0; i--) {
                unsigned shift = 10 * (unsigned) (i + 1);

                if (v != 0 && (v & ((UINT64_C(1) << shift) - 1)) == 0) {
                        (void) snprintf(buf, n, "%" PRIu64 "%c", v >> shift, suffix[i]);
                        return;
                }
        }
        (void) snprintf(buf, n, "%" PRIu64, v);
}

/* The value of @k in @c as tierd.conf would spell it (malloc'ed), or NULL on -ENOMEM. */
static char *format_value(const ReloadKey *k, const Config *c) {
        const void *field = (const uint8_t *) c + k->offset;
        char buf[64], *s = NULL;

        switch (k->type) {
        case RELOAD_STRING:
                return strdup(*(char *const *) field);
        case RELOAD_UNSIGNED:
                (void) snprintf(buf, sizeof(buf), "%u", *(const unsigned *) field);
                break;
        case RELOAD_UNSIGNED_SIZE:
                format_size(buf, sizeof(buf), *(const unsigned *) field);
                break;
        case RELOAD_SIZE:
                format_size(buf, sizeof(buf), *(const uint64_t *) field);
                break;
        case RELOAD_SECONDS:
                (void) snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *) field / 1000000);
                break;
        case RELOAD_NUMA_NODE:
                if (*(const int *) field < 0)
                        return strdup("auto");
                (void) snprintf(buf, sizeof(buf), "%d", *(const int *) field);
                break;
        case RELOAD_LOG_LEVEL:
                return strdup(log_level_to_string(*(const int *) field));
        case RELOAD_BACKEND: {
                const char *b = vram_backend_to_string(*(const VramBackendKind *) field);

                return strdup(b ? b : "?");
        }
        case RELOAD_POLICY: {
                const char *b = sched_policy_to_string(*(const SchedPolicyKind *) field);

                return strdup(b ? b : "?");
        }
        case RELOAD_TARGETS: {
                size_t len = 1;
                char *p;

                for (size_t i = 0; i < c->n_targets; i++)
                        len += strlen(c->targets[i].path) + 32;
                s = p = malloc(len);
                if (!s)
                        return NULL;
                *p = '\0';
                for (size_t i = 0; i < c->n_targets; i++) {
                        format_size(buf, sizeof(buf), c->targets[i].size);
                        p += sprintf(p, "%s%s:%s", i ? ", " : "", c->targets[i].path,
                                     c->targets[i].size ? buf : "(its size)");
                }
                return s;
        }
        }
        return strdup(buf);
}

/*
 * Does job @j still use the configured default limit in @tier?  Job has no
 * "set by a quota" mark yet, so a limit equal to the old default counts as
 * the default; a quota set (QuotaSet) to exactly that value is taken for
 * it too.  With a per-tier mark in Job, set by the quota code, this test
 * becomes exact.
 */
static bool job_limit_is_default(const Job *j, int tier, uint64_t old_default) {
        return !(j->limit_set & (1u << tier)) && j->limit[tier] == old_default;
}

/* Jobs that use the default limit of a tier follow its new value; a job with a quota of its own keeps it. */
static void reload_job_limits(Manager *m, const uint64_t old_default[TIERS], const uint64_t new_default[TIERS]) {
        bool changed = false;

        list_for_each_safe(n, tmp, &m->jobs) {
                Job *j = list_entry(n, Job, link);

                for (int t = 0; t < TIERS; t++) {
                        char a[32], b[32], u[32];

                        if (old_default[t] == new_default[t] || !job_limit_is_default(j, t, old_default[t]))
                                continue;
                        j->limit[t] = new_default[t];
                        changed = true;
                        format_size(a, sizeof(a), old_default[t]);
                        format_size(b, sizeof(b), new_default[t]);
                        if (j->used[t] > new_default[t]) {
                                format_size(u, sizeof(u), j->used[t]);
                                log_job_tier(LOG_NOTICE, 0, j->name, tier_to_string(t),
                                             "Job '%s': %s limit %s -> %s (the default); it uses %s, so its "
                                             "own unpinned copies make way as it allocates more",
                                             j->name, tier_to_string(t), a, b, u);
                        } else
                                log_job_tier(LOG_INFO, 0, j->name, tier_to_string(t),
                                             "Job '%s': %s limit %s -> %s (the default)",
                                             j->name, tier_to_string(t), a, b);
                }
        }
        if (changed)
                manager_kick(m);        /* ops waiting for space may fit now */
}

/* Does @k have the same value in @a and @b? */
static bool value_equal(const ReloadKey *k, const Config *a, const Config *b) {
        const void *fa = (const uint8_t *) a + k->offset, *fb = (const uint8_t *) b + k->offset;

        switch (k->type) {
        case RELOAD_STRING:
                return strcmp(*(char *const *) fa, *(char *const *) fb) == 0;
        case RELOAD_TARGETS:
                if (a->n_targets != b->n_targets)
                        return false;
                for (size_t i = 0; i < a->n_targets; i++)
                        if (strcmp(a->targets[i].path, b->targets[i].path) != 0 ||
                            a->targets[i].size != b->targets[i].size)
                                return false;
                return true;
        default:
                return memcmp(fa, fb, k->size) == 0;    /* scalars */
        }
}

/*
 * Apply the live keys of @next to the running config and log the rest.
 * Cannot fail: nothing is allocated on the way (a value that cannot be
 * formatted for the log shows as "?").  Returns the number of changed keys,
 * *@ret_restart of them kept until a restart.
 */
static unsigned reload_apply(Manager *m, const Config *next, unsigned *ret_restart) {
        const uint64_t old_limit[TIERS] = {
                [TIER_VRAM] = m->config.vram_job_limit,
                [TIER_HOST] = m->config.host_job_limit,
                [TIER_NVME] = m->config.nvme_job_limit,
        };
        const int old_log_level = m->config.log_level;
        const uint64_t old_vram_bandwidth = m->config.vram_bandwidth;
        unsigned n_live = 0, n_restart = 0;

        for (size_t i = 0; i < ELEMENTSOF(reload_keys); i++) {
                const ReloadKey *k = &reload_keys[i];
                _cleanup_free_ char *was = NULL, *now = NULL;

                if (value_equal(k, &m->config, next))
                        continue;
                was = format_value(k, &m->config);
                now = format_value(k, next);
                if (!k->live) {
                        log_warning("Reload: [%s] %s = %s takes effect only after a restart; keeping %s, ignoring",
                                    k->section, k->name, now ? now : "?", was ? was : "?");
                        n_restart++;
                        continue;
                }
                /* live keys are scalars: copy the field */
                memcpy((uint8_t *) &m->config + k->offset, (const uint8_t *) next + k->offset, k->size);
                log_info("Reload: [%s] %s = %s (was %s)", k->section, k->name, now ? now : "?", was ? was : "?");
                n_live++;
        }

        if (m->config.log_level != old_log_level)
                log_set_level(m->config.log_level);
        reload_job_limits(m, old_limit, (const uint64_t[TIERS]) {
                [TIER_VRAM] = m->config.vram_job_limit,
                [TIER_HOST] = m->config.host_job_limit,
                [TIER_NVME] = m->config.nvme_job_limit,
        });
        nvme_set_bandwidth(m->nvme, m->config.nvme_bandwidth);
        if (m->config.vram_bandwidth != old_vram_bandwidth && vram_set_bandwidth(m->vram, m->config.vram_bandwidth) < 0)
                log_tier(LOG_NOTICE, 0, "vram", "Reload: [vram] bandwidth only throttles the emulated backend; "
                         "the %s backend is not throttled, ignoring", m->vram->ops->name);

        *ret_restart = n_restart;
        return n_live + n_restart;
}

/* ---- SIGHUP ----------------------------------------------------------------------- */

static void notify_ready(Manager *m) {
        char status[512];

        (void) manager_status_line(m, status, sizeof(status));
        if (m->reload_error[0])
                (void) sd_notifyf(false, "READY=1\nSTATUS=%s; last reload refused: %s", status, m->reload_error);
        else
                (void) sd_notifyf(false, "READY=1\nSTATUS=%s", status);
}

int manager_reload(Manager *m) {
        _cleanup_free_ char *err = NULL;
        const ManagerArgs args = {
                .config_path = m->config_path,
                .config_must_exist = m->config_must_exist,
                .socket_path = m->arg_socket_path,
                .state_dir = m->arg_state_dir,
                .log_level = m->arg_log_level,
        };
        unsigned n_changed, n_restart = 0;
        Config next;
        int r;

        if (m->stopping) {
                log_notice("SIGHUP received while stopping, ignoring");
                return 0;
        }
        if (!m->config_path) {
                log_warning("SIGHUP received, but the configuration's source is not known, ignoring");
                return 0;
        }

        (void) sd_notifyf(false, "RELOADING=1\nSTATUS=Reloading the configuration\nMONOTONIC_USEC=%" PRIu64,
                          now_usec());
        log_info("Reloading the configuration from \"%s\"", m->config_path);

        r = manager_config_load(&args, &next, &err);
        if (r < 0) {
                const char *why = err ? err : strerror(-r);

                log_error("Invalid configuration, keeping the running one: %s", why);
                (void) snprintf(m->reload_error, sizeof(m->reload_error), "%s", why);
                for (char *p = m->reload_error; *p; p++)
                        if (*p == '\n')
                                *p = ' ';       /* STATUS= is one line */
                notify_ready(m);
                return r;
        }

        n_changed = reload_apply(m, &next, &n_restart);
        config_deinit(&next);
        m->reload_error[0] = '\0';
        if (n_changed == 0)
                log_info("Configuration reloaded: nothing changed");
        else
                log_info("Configuration reloaded: %u key(s) changed, %u of them kept until a restart",
                         n_changed, n_restart);
        notify_ready(m);
        return 0;
}
