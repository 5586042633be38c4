/* SPDX-License-Identifier: MIT */
/* reload.c: SIGHUP re-reads the configuration. */

/*
 * Theory of operation: `systemctl reload tierd` sends SIGHUP (ExecReload=),
 * which lands here from the event loop.  tierd tells the service manager
 * RELOADING=1 (with MONOTONIC_USEC=, as Type=notify-reload wants), reads the
 * configuration exactly as at start-up (reload_config_load(): same file,
 * same drop-ins, same command-line overrides) into a new Config and only
 * then compares it with the running one, key by key, along config.c's
 * table of keys (which says of each whether it is live):
 *
 *   - live keys are copied into the running Config and applied: the log
 *     level, the per-job default limits and the [quota] sections (to
 *     running jobs too, along the quotas' order of precedence: a quota
 *     set with tierctl for the same target stays), the emulated VRAM
 *     link's bandwidth, and limits that are only read when they are
 *     needed (linger, connection counts);
 *   - restart keys (capacities, segment and chunk sizes, targets, extent
 *     size, queue depth, socket, state directory, backend, protocol limits
 *     told to clients at their handshake) keep their running value: each
 *     change is logged as needing a restart, and when the machine could not
 *     give what the file now asks (capacity.c, the check a start runs),
 *     a warning says so.
 *
 * Before anything looks at a target of the new file by its path (the
 * capacity check stat()s each, and opens a device, following links), each
 * is judged as a start judges it (nvme_check_trusted(): its directory, and
 * every link on its way, only tierd's user or root can write): one a
 * restart would refuse as untrusted, named anew or running in a directory
 * opened to others since, refuses the reload, with the start's message.
 *
 * A reload also checks that every file target is still backed by its
 * filesystem's blocks (nvme_check_backed(): an fstat each) and logs one that
 * is not.
 *
 * Quotas that would not fit (guarantees adding up to more than a tier's
 * capacity, a minimum above a maximum) make the file invalid.
 * An invalid file (or an untrusted target) changes nothing at all: the
 * reason (FILE:LINE: [section] key: why) is logged, kept for STATUS=, and
 * the running Config stays whole.  Either way the manager ends the reload
 * with READY=1 and a fresh STATUS=.  Besides reading a few small files, a
 * reload looks up the admin group again (NSS), which is the one lookup
 * that may block: it is done here and at start, never per request.
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
#include "daemon/core/capacity.h"
#include "daemon/core/manager.h"
#include "daemon/core/reload.h"
#include "daemon/engine/engine.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "util/size.h"
#include "util/time-util.h"

/* ---- loading ---------------------------------------------------------------------- */

int reload_config_load(ConfigArgs *args, Config *ret, char **ret_error) {
        bool found;
        Config c;
        int r;

        if (ret_error)
                *ret_error = NULL;
        r = config_load_files(&c, args->config_path, args->config_must_exist, ret_error);
        if (r < 0)
                return r;
        found = r > 0;
        /* checked as the file's keys are: an absolute path, a socket path that fits */
        if (args->socket_path)
                r = config_set_key(&c, "daemon", "socket", args->socket_path, "--socket", ret_error);
        if (r >= 0 && args->state_dir)
                r = config_set_key(&c, "daemon", "state_dir", args->state_dir, "--state-dir", ret_error);
        if (r >= 0)
                r = config_finish(&c, ret_error);
        if (r < 0) {
                config_deinit(&c);
                return r;
        }
        if (args->log_level >= 0)
                c.log_level = args->log_level;
        /* the default file, read once: removing it later is a mistake to refuse, not "use the defaults" */
        if (found)
                args->config_must_exist = true;
        *ret = c;
        return 0;
}

int config_args_copy(ConfigArgs *to, const ConfigArgs *from) {
        char *p = from->config_path ? strdup(from->config_path) : NULL;

        if (from->config_path && !p)
                return -ENOMEM;
        config_args_done(to);
        *to = *from;
        to->config_path = p;
        return 0;
}

void config_args_done(ConfigArgs *a) {
        a->config_path = mfree(a->config_path);
}

/* ---- applying ---------------------------------------------------------------------- */

/*
 * tierd.conf's [quota] sections as a reload found them: swapped into the
 * running Config whole (they are rules, not keys), logged when they
 * changed.  quota_apply_all() then gives every running job what the rules
 * and the new defaults resolve to.
 */
static unsigned reload_quotas(Manager *m, Config *next) {
        _cleanup_free_ char *was = quota_rules_format(&m->config.quotas), *now = quota_rules_format(&next->quotas);
        QuotaRules tmp;

        tmp = m->config.quotas;
        m->config.quotas = next->quotas;
        next->quotas = tmp;     /* freed with @next */
        if (was && now && strcmp(was, now) == 0)
                return 0;
        log_info("Reload: [quota] sections: %zu (were %zu)", m->config.quotas.n, next->quotas.n);
        quota_warn_unowned(&m->config);
        return 1;
}

/*
 * Apply the live keys of @next to the running config and log the rest.
 * Cannot fail: nothing is allocated on the way (a value that cannot be
 * formatted for the log shows as "?").  Returns the number of changed keys,
 * *@ret_restart of them kept until a restart.
 */
static unsigned reload_apply(Manager *m, Config *next, unsigned *ret_restart) {
        const int old_log_level = m->config.log_level;
        const uint64_t old_vram_bandwidth = m->config.vram_bandwidth;
        unsigned n_live = 0, n_restart = 0;
        const ConfigKey *k;

        for (size_t i = 0; (k = config_key_at(i)); i++) {
                _cleanup_free_ char *was = NULL, *now = NULL;

                if (config_value_equal(k, &m->config, next))
                        continue;
                was = config_value_format(k, &m->config);
                now = config_value_format(k, next);
                if (!k->live || config_value_copy(k, &m->config, next) < 0) {
                        log_warning("Reload: [%s] %s = %s takes effect only after a restart; keeping %s, ignoring",
                                    k->section, k->name, now ? now : "?", was ? was : "?");
                        n_restart++;
                        continue;
                }
                log_info("Reload: [%s] %s = %s (was %s)", k->section, k->name, now ? now : "?", was ? was : "?");
                n_live++;
        }

        n_live += reload_quotas(m, next);
        if (m->config.log_level != old_log_level)
                log_set_level(m->config.log_level);
        /* the default limits and the [quota] rules, to every running job */
        if (quota_apply_all(m->quotas, NULL, 0))
                engine_limits_changed(m->engine);      /* ops waiting for space re-check their room */
        nvme_set_bandwidth(m->nvme, m->config.nvme_bandwidth);
        if (m->config.vram_bandwidth != old_vram_bandwidth && vram_set_bandwidth(m->vram, m->config.vram_bandwidth) < 0)
                log_tier(LOG_NOTICE, 0, "vram", "Reload: [vram] bandwidth only throttles the emulated backend; "
                         "the %s backend is not throttled, ignoring", m->vram->ops->name);
        rpc_resolve_admin_group(&m->rpc);

        *ret_restart = n_restart;
        return n_live + n_restart;
}

/*
 * A restart checks the capacities of the new file against the machine
 * (capacity.c) and refuses what it cannot give; a reload keeps the running
 * pools, so it only warns.  What the running pools hold counts as there:
 * a restart gives it back before it makes the new ones.
 */
static void reload_check_capacity(Manager *m, const Config *next) {
        _cleanup_free_ char *why = NULL;
        CapacityFacts facts;
        int emulated = -1, r;

        /* backend = auto then and now: a restart would pick what this start picked */
        if (next->vram_backend == VRAM_BACKEND_AUTO && m->config.vram_backend == VRAM_BACKEND_AUTO)
                emulated = m->vram->emulated;
        r = capacity_facts_read(next, emulated, &facts);
        if (r >= 0) {
                facts.held = capacity_host_bytes(&m->config, m->vram->emulated);
                r = capacity_check(next, &facts, &why);
        }
        if (r < 0)
                log_warning_errno(r, "Reload: cannot check the capacities, ignoring: %m");
        else if (r > 0)
                log_warning("Reload: %s; this takes effect only after a restart, which would refuse it, ignoring",
                            why);
}

/*
 * The new file's targets, judged before reload_check_capacity() stat()s them (and opens a device) by
 * their paths: through a link another user planted, that would look at whatever it aims at, as root.
 * 0, or -EPERM/-ELOOP with the reason logged and kept for STATUS=.
 */
static int reload_check_trust(Manager *m, const Config *next) {
        char why[1024];
        int r = nvme_check_trusted(next, true, why, sizeof(why));

        if (r < 0) {
                log_error("Reload refused, keeping the running configuration: %s", why);
                (void) snprintf(m->reload_error, sizeof(m->reload_error), "%.500s", why);
        }
        return r;
}

/* ---- SIGHUP ----------------------------------------------------------------------- */

int reload_run(Manager *m) {
        _cleanup_free_ char *err = NULL;
        unsigned n_changed, n_restart = 0;
        Config next;
        int r;

        if (!m->args.config_path) {
                log_warning("SIGHUP received, but the configuration's source is not known, ignoring");
                return 0;
        }

        (void) sd_notifyf(false, "RELOADING=1\nSTATUS=Reloading the configuration\nMONOTONIC_USEC=%" PRIu64,
                          now_usec());
        log_info("Reloading the configuration from \"%s\"", m->args.config_path);

        r = reload_config_load(&m->args, &next, &err);
        if (r < 0) {
                const char *why = err ? err : strerror(-r);

                log_error("Invalid configuration, keeping the running one: %s", why);
                (void) snprintf(m->reload_error, sizeof(m->reload_error), "%s", why);
                for (char *p = m->reload_error; *p; p++)
                        if (*p == '\n')
                                *p = ' ';       /* STATUS= is one line */
                return r;
        }
        r = reload_check_trust(m, &next);
        if (r < 0) {
                config_deinit(&next);
                return r;
        }

        /*
         * The file's quotas that do not fit (guarantees over a capacity, min above max) make it invalid;
         * with the run-time ones (checked when they were set: only a smaller tier, restart-only, makes
         * them not fit) it is warned about, as at start: a start that tolerated them made every later
         * reload fail, whatever it changed.  The NVMe room free now is for the guarantees as they apply,
         * the run-time rules over the file's (one may lower a job's nvme_min below the file's): those
         * must fit it, or the room kept (state/space.c) was promised twice.
         */
        {
                QuotaRules none = QUOTA_RULES_NULL;
                char why[1024];

                r = quota_check_rules(m->quotas, &next, &none, why, sizeof(why));
                if (r >= 0 && quota_check_rules(m->quotas, &next, &m->quotas->runtime, why, sizeof(why)) < 0)
                        log_warning("Reload: the quotas set at run time (\"%s\") do not fit the tiers: %s; they are "
                                    "kept (tierctl quota set lowers them)", m->quotas->path, why);
                if (r >= 0)
                        r = quota_check_room(m->quotas, &next, &m->quotas->runtime, why, sizeof(why));
                if (r < 0) {
                        if (r != -ENOMEM)
                                r = -EINVAL;
                        log_error("Invalid configuration, keeping the running one: [quota]: %s", why);
                        (void) snprintf(m->reload_error, sizeof(m->reload_error), "[quota]: %.480s", why);
                        config_deinit(&next);
                        return r;
                }
        }
        n_changed = reload_apply(m, &next, &n_restart);
        reload_check_capacity(m, &next);
        (void) nvme_check_backed(m->nvme);
        config_deinit(&next);
        m->reload_error[0] = '\0';
        if (n_changed == 0)
                log_info("Configuration reloaded: nothing changed");
        else
                log_info("Configuration reloaded: %u key(s) changed, %u of them kept until a restart",
                         n_changed, n_restart);
        return 0;
}
