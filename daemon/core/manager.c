/* SPDX-License-Identifier: MIT */
/* manager.c: the daemon's root object: the event loop, the config, and every subsystem, in order. */

/*
 * Theory of operation: the Manager owns the one sd_event loop and builds
 * the rooms from the bottom up, each from the ones below it: the io_uring
 * (so the host pool can register its segments as fixed buffers as it makes
 * them), the VRAM backend (so the host pool is placed on the GPU's NUMA
 * node and registered with CUDA as it is made), the host pool, the NVMe
 * targets (registered as fixed files); then the books (registry), the op
 * engine, the scheduler (which registers its ops with the engine), the
 * revoker (the cuda pool's hook), the request layer and the server.  It
 * frees them top down.  Everything runs on the loop thread; the only other
 * thread is the VRAM backend's (the emulated mover, or the CUDA copy
 * completion thread), which talks back through an eventfd.
 *
 * Before any pool of host memory or target space is made, capacity.c
 * checks that the machine has what the configuration asks for, and the
 * manager refuses to start if it has not: pools asked beyond it would get
 * tierd OOM-killed half-way.  The check needs to know whether the VRAM
 * backend is emulated (its pool is host memory), so the cuda backend, whose
 * pool is device memory, is tried first.
 *
 * The manager also owns the signals: SIGHUP reloads the configuration
 * (reload.c), SIGTERM and SIGINT drain (stop.c).
 */

#include <errno.h>
#include <numa.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>

#include "daemon/base/log.h"
#include "daemon/core/capacity.h"
#include "daemon/core/manager.h"
#include "daemon/core/monitor.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/revoke.h"
#include "daemon/ipc/rpc.h"
#include "daemon/ipc/server.h"
#include "daemon/sched/sched.h"
#include "daemon/state/book.h"
#include "daemon/state/memstore.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/csum.h"
#include "daemon/tiers/fault.h"
#include "daemon/tiers/memfd-seg.h"
#include "daemon/tiers/renew.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/uring-faults.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#include "util/time-util.h"
#include "util/uring.h"

static int host_register_buffer(Segment *seg, void *userdata) {
        Manager *m = userdata;
        int r;

        /* DMA registration with the GPU is best effort: without it copies are slower, not wrong */
        (void) vram_host_register(m->vram, seg);
        r = uring_set_buffer(m->uring, seg->id, seg->map, seg->pool->seg_size);
        if (r < 0)
                vram_host_unregister(m->vram, seg);     /* the memory goes: so does its registration */
        return r;
}

static void host_unregister_buffer(Segment *seg, void *userdata) {
        Manager *m = userdata;

        vram_host_unregister(m->vram, seg);
        /* the ring lets go of the old pages now, not when the new memory is registered in their place */
        if (m->uring)
                (void) uring_set_buffer(m->uring, seg->id, NULL, 0);
}

/*
 * The memory store (state/memstore.c): the fds the service manager passed
 * back (main.c hands them over before manager_new()), and the pools' hooks.
 */
static struct {
        char **names;
        int *fds;
        size_t n;
} stored;

int manager_stored_fds(char **names, const int *fds, size_t n) {
        stored.names = calloc(MAX(n, (size_t) 1), sizeof(char *));
        stored.fds = calloc(MAX(n, (size_t) 1), sizeof(int));
        if (!stored.names || !stored.fds) {
                for (size_t i = 0; i < n; i++)
                        safe_close(fds[i]);
                return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                stored.names[i] = strdup(names[i] ? names[i] : "");
                stored.fds[i] = fds[i];
        }
        stored.n = n;
        return 0;
}

static void stored_forget(void) {
        for (size_t i = 0; i < stored.n; i++) {
                safe_close(stored.fds[i]);
                free(stored.names[i]);
        }
        free(stored.names);
        free(stored.fds);
        stored.names = NULL;
        stored.fds = NULL;
        stored.n = 0;
}

static int store_adopt_host(Segment *seg, uint64_t size, void *userdata) {
        return memstore_take_segment(((Manager *) userdata)->memstore, LEVEL_HOST, seg->id, size);
}

static int store_adopt_vram(Segment *seg, uint64_t size, void *userdata) {
        return memstore_take_segment(((Manager *) userdata)->memstore, LEVEL_VRAM, seg->id, size);
}

static void store_made_host(Segment *seg, void *userdata) {
        memstore_segment_made(((Manager *) userdata)->memstore, LEVEL_HOST, seg);
}

static void store_made_vram(Segment *seg, void *userdata) {
        memstore_segment_made(((Manager *) userdata)->memstore, LEVEL_VRAM, seg);
}

/*
 * Memory the last run's pools hold in the service manager's fd store (the memory store's memfds):
 * this start takes it back, adopted or dropped, so the capacity check counts it as tierd's own, as a
 * reload counts the running pools (it is in the cgroup's usage and out of MemAvailable already).
 */
static uint64_t stored_memory(void) {
        uint64_t sum = 0;

        for (size_t i = 0; i < stored.n; i++) {
                struct stat st;

                if (stored.fds[i] >= 0 && stored.names[i] &&
                    strncmp(stored.names[i], MEMSTORE_FD_PREFIX, strlen(MEMSTORE_FD_PREFIX)) == 0 &&
                    fstat(stored.fds[i], &st) == 0 && S_ISREG(st.st_mode))
                        sum += (uint64_t) st.st_blocks * 512;
        }
        return sum;
}

/* The memory store, before the pools: what the last run left is adopted as they are made. */
static int manager_setup_memstore(Manager *m, bool vram_emulated) {
        int r;

        r = memstore_new(m->event, m->config.nvme_persist, m->config.host_segment_size,
                         (uint32_t) (m->config.host_capacity / m->config.host_segment_size),
                         m->config.vram_chunk_size,
                         vram_emulated ? (uint32_t) (vram_emul_capacity(&m->config) / m->config.vram_chunk_size) : 0,
                         &m->memstore);
        if (r < 0) {
                stored_forget();
                return log_error_errno(r, "Out of memory");
        }
        for (size_t i = 0; i < stored.n; i++) {
                if (memstore_inherit(m->memstore, stored.names[i], stored.fds[i]) == 0) {
                        log_warning("Closing fd \"%s\" passed by the service manager: not one of tierd's", stored.names[i]);
                        safe_close(stored.fds[i]);
                }
                stored.fds[i] = -1;
        }
        stored_forget();
        memstore_load(m->memstore);
        return 0;
}

/* Segments came back from the renewer: ops waiting for room may run. */
static void on_segments_renewed(SegPool *p, void *userdata) {
        Manager *m = userdata;

        if (m->engine)
                engine_wake_space_waiters(m->engine);
}

static void manager_notify_ready(Manager *m) {
        char status[512];

        (void) manager_status_line(m, status, sizeof(status));
        if (m->reload_error[0])
                (void) sd_notifyf(false, "READY=1\nSTATUS=%s; last reload refused: %s", status, m->reload_error);
        else
                (void) sd_notifyf(false, "READY=1\nSTATUS=%s", status);
}

static int on_sighup(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;

        if (m->stopping) {
                log_notice("SIGHUP received while stopping, ignoring");
                return 0;
        }
        (void) reload_run(m);
        manager_notify_ready(m);
        return 0;
}

static int pick_numa_node(const Config *c, const VramBackend *vram) {
        if (numa_available() < 0)
                return -1;
        if (c->numa_node >= 0)
                return c->numa_node;
        /* auto: the GPU's node (from its PCI sysfs entry), node 0 without one */
        return MAX(vram_numa_node(vram), 0);
}

static int manager_setup_loop(Manager *m) {
        int r;

        r = sd_event_new(&m->event);
        if (r < 0)
                return log_error_errno(r, "Cannot create the event loop: %m");
        r = sd_event_add_signal(m->event, &m->sigterm, SIGTERM, manager_on_stop_signal, m);
        if (r >= 0)
                r = sd_event_add_signal(m->event, &m->sigint, SIGINT, manager_on_stop_signal, m);
        if (r >= 0)
                r = sd_event_add_signal(m->event, &m->sighup, SIGHUP, on_sighup, m);
        if (r < 0)
                return log_error_errno(r, "Cannot watch signals: %m");
        /* a stop request goes before queued work, however busy the engine is */
        (void) sd_event_source_set_priority(m->sigterm, SD_EVENT_PRIORITY_IMPORTANT);
        (void) sd_event_source_set_priority(m->sigint, SD_EVENT_PRIORITY_IMPORTANT);
        r = sd_event_set_watchdog(m->event, true);
        if (r < 0)
                log_warning_errno(r, "Cannot enable the watchdog, ignoring: %m");
        return 0;
}

/*
 * Tests only: TIERD_TEST_FAULTS injects faults into NVMe I/O (daemon/tiers/fault.h).
 * The service unit unsets it (UnsetEnvironment=), so only a tierd started by hand
 * or by the test harness sees it; an invalid value stops tierd at start.
 */
static int manager_setup_faults(Manager *m) {
        const char *spec = getenv("TIERD_TEST_FAULTS");
        char err[256] = "";
        int r;

        if (!spec || !*spec)
                return 0;
        m->faults = calloc(1, sizeof(*m->faults));
        if (!m->faults)
                return log_error_errno(-ENOMEM, "Out of memory.");
        r = fault_set_parse(spec, m->faults, err, sizeof(err));
        if (r < 0)
                return log_error_errno(r, "Invalid TIERD_TEST_FAULTS='%s': %s. Unset it: it is for tests only.",
                                       spec, err);
        log_warning("*** TIERD_TEST_FAULTS is set: %u injected fault rule(s) (%s) WILL make NVMe I/O "
                    "(and emulated VRAM copies) fail. This is for tests only; never run a production tierd "
                    "with it. ***", m->faults->n_rules, spec);
        uring_faults_attach(m->uring, m->faults);
        return 0;
}

/* The tiers: io_uring, the VRAM backend, the host pool, the NVMe targets. */
static int manager_setup_tiers(Manager *m) {
        _cleanup_free_ char *err = NULL;
        CapacityFacts facts;
        int r;

        /* what the machine has, read before any pool takes from it (capacity.c) */
        r = capacity_facts_read(&m->config, 0, &facts);       /* .vram_emulated: set below */
        if (r < 0)
                return log_error_errno(r, "Cannot read what this machine has: %m");
        facts.held = stored_memory();

        r = uring_new(m->event, m->config.nvme_queue_depth, &m->uring);
        if (r < 0)
                return log_error_errno(r, "Failed to set up io_uring with %u entries: %m", m->config.nvme_queue_depth);
        uring_faults_attach(m->uring, NULL);
        r = csum_new(m->event, m->config.nvme_checksum_threads, &m->csum);
        if (r < 0)
                return log_error_errno(r, "Cannot start %u checksum thread(s): %m", m->config.nvme_checksum_threads);
        r = manager_setup_faults(m);
        if (r < 0)
                return r;

        /*
         * The VRAM backend first: the host pool goes on its GPU's NUMA node and
         * is registered with it.  The emulated backend's pool is host memory:
         * the capacities are checked once it is known whether it is the one.
         */
        r = vram_backend_device_new(&m->config, m->event, &m->vram, &err);
        if (r < 0)
                return log_error_errno(r, "%s", err ? err : "Cannot set up the VRAM tier: %m");
        facts.vram_emulated = r == 0;
        r = capacity_check(&m->config, &facts, &err);
        if (r < 0)
                return log_error_errno(r, "Cannot check the capacities: %m");
        if (r > 0) {
                /* not MANAGER_CONFIG_REFUSED: what is free may change (memory in use, free space), Restart= may try again */
                log_error("%s", err);
                return -E2BIG;
        }
        r = manager_setup_memstore(m, !m->vram);
        if (r < 0)
                return r;
        memstore_set_faults(m->memstore, m->faults);
        if (!m->vram) {
                MemfdSegConfig store = {
                        .adopt = store_adopt_vram,
                        .made = store_made_vram,
                        .store_userdata = m,
                        .adopting = m->memstore != NULL,
                };

                r = vram_emul_new_stored(&m->config, m->event, m->memstore ? &store : NULL, &m->vram);
                if (r < 0)
                        return log_error_errno(r, "Cannot set up the emulated VRAM tier: %m");
        }
        m->vram->faults = m->faults;   /* the emulated backend injects them; cuda ignores them */
        m->vram->pool.tier = LEVEL_VRAM;
        m->vram->pool.id_base = 1u << 16;

        /* host tier: one memfd per segment, NUMA-bound, locked, registered as a fixed buffer */
        r = uring_register_buffers(m->uring, (unsigned) (m->config.host_capacity / m->config.host_segment_size));
        if (r < 0)
                return log_error_errno(r, "Cannot register io_uring buffers: %m");
        m->host.numa_node = pick_numa_node(&m->config, m->vram);
        m->host.memfd = (MemfdSegConfig) {
                .name = "tierd-host",
                .numa_node = m->host.numa_node,
                .lock = true,
                .on_make = host_register_buffer,
                .on_drop = host_unregister_buffer,
                .userdata = m,
                .adopt = m->memstore ? store_adopt_host : NULL,
                .made = m->memstore ? store_made_host : NULL,
                .store_userdata = m,
                .adopting = m->memstore != NULL,
        };
        r = segpool_init(&m->host.pool, "memfd", &memfd_seg_ops, &m->host.memfd,
                         m->config.host_capacity, m->config.host_segment_size);
        m->host.memfd.adopting = false;
        if (r < 0)
                return log_error_errno(r, "Cannot set up the host pool of %" PRIu64 " bytes: %m "
                                       "(locked memory needs CAP_IPC_LOCK or a higher RLIMIT_MEMLOCK)",
                                       m->config.host_capacity);
        m->host.pool.tier = LEVEL_HOST;
        m->host.pool.id_base = 0;
        m->host.locked = !m->host.memfd.lock_failed;

        err = mfree(err);
        r = nvme_tier_new(&m->config, m->uring, &m->nvme, &err);
        if (r < 0)
                return log_error_errno(r, "%s", err ? err : "Cannot set up the NVMe tier: %m");

        /* what is on the targets, from the NVMe index (restored once the books exist) */
        if (m->config.nvme_persist) {
                err = mfree(err);
                r = book_open(m->config.state_dir, m->nvme, m->event, m->faults, &m->book, &err);
                if (r < 0) {
                        log_error_errno(r, "%s", err ? err : "Cannot read the NVMe index: %m");
                        /* -ESTALE: [nvme] extent_size is not the index's, which only the file can change */
                        return r == -ESTALE ? MANAGER_CONFIG_REFUSED : r;
                }
        } else {
                log_info("[nvme] persist = no: the NVMe targets are scratch space, nothing on them survives a "
                         "restart");
                book_void_files(m->config.state_dir, "[nvme] persist = no reuses the extents it lists");
        }
        return 0;
}

/*
 * A job the NVMe index had: its owner's quota, as when it was made (book_restore()'s callback).  One
 * restored under its escaped text (@was: its name from an older tierd) keeps its quota rule and its
 * drive wear: they follow the name.
 */
static int restored_job_made(Job *j, const char *was, gid_t gid, const gid_t *groups, size_t n, bool admin,
                             void *userdata) {
        Manager *m = userdata;
        char why[1024] = "";
        int r;

        j->admin = admin;
        if (was) {
                r = quota_store_rename_job(m->quotas, was, j->name);
                if (r >= 0)
                        r = wear_job_rename(m->registry->wear, was, j->name);
                if (r < 0)
                        return r;
        }
        /*
         * Not checked: it lingers (claims nothing) until a rank attaches, which checks then.  A check here
         * (a capacity made smaller for one start) dropped the job and its tensors from the index for good.
         */
        r = quota_job_created(m->quotas, j, gid, groups, n, false, why, sizeof(why));
        if (r < 0 && why[0])
                log_warning("Job '%s' from the NVMe index: %s", j->name, why);
        return r;
}

static int manager_restore(Manager *m) {
        BookFound f = {};
        uint64_t t0 = now_usec();
        int r;

        if (m->book) {
                r = book_restore(m->book, m->registry, restored_job_made, m, &f);
                if (r < 0)
                        return log_error_errno(r, "Cannot write the NVMe index in %s: %m", m->config.state_dir);
        }
        /* the quota rules and wear of names from an older tierd that no restored job took: their escaped text */
        r = quota_store_rename_old(m->quotas);
        if (r >= 0)
                r = wear_rename_old(m->registry->wear, m->config.max_name);
        if (r < 0)
                return log_error_errno(r, "Out of memory");
        if (r > 0)
                log_warning("Drive wear book: %d job name(s) from an older tierd, with control or bidirectional "
                            "format characters or bytes not UTF-8, counted under their escaped text from now on", r);
        if (!m->book)
                return 0;
        if (f.records == 0 && f.jobs == 0)
                log_info("NVMe index: none yet in %s, starting empty", m->config.state_dir);
        else
                log_info("NVMe index (generation %u, %" PRIu64 " records%s%s): %u job(s), %u tensor(s) restored "
                         "(%" PRIu64 " MiB on NVMe), %u with newer data kept in memory, %u never written, %u dead "
                         "(written whole next), %u lost, in %" PRIu64 " ms",
                         f.generation, f.records, f.clean ? ", clean stop" : ", after a crash",
                         f.torn_bytes ? ", a last record cut short" : "", f.jobs, f.tensors,
                         f.bytes >> 20, f.in_memory, f.blank, f.dead, f.lost, (now_usec() - t0) / 1000);
        return 0;
}

/*
 * tierd.conf's quotas must fit the tiers as they are (a start refuses them
 * otherwise); those set at run time were checked when they were set, and
 * only a smaller tier makes them not fit: then tierd starts and says so.
 */
static int manager_check_quotas(Manager *m) {
        QuotaRules none = QUOTA_RULES_NULL;
        char why[1024];
        int r;

        r = quota_check(m->quotas, &m->config, &none, why, sizeof(why));
        if (r == -ENOMEM)
                return log_error_errno(r, "Out of memory");
        if (r < 0) {
                log_error("Invalid configuration: [quota]: %s", why);
                return MANAGER_CONFIG_REFUSED;
        }
        quota_warn_unowned(&m->config);
        r = quota_check(m->quotas, &m->config, &m->quotas->runtime, why, sizeof(why));
        if (r == -ENOMEM)
                return log_error_errno(r, "Out of memory");
        if (r < 0)
                log_warning("The quotas set at run time (\"%s\") do not fit the tiers as configured now: %s; "
                            "they are kept, and a job whose guarantee does not fit is refused when it starts "
                            "until they are lowered with tierctl quota set (tierctl quota get JOB shows where each value comes from)",
                            m->quotas->path, why);
        return 0;
}

int manager_new(Manager **ret, Config *config, const ConfigArgs *args) {
        _cleanup_(manager_freep) Manager *m = NULL;
        SegRenewer *renewer;
        int r;

        m = calloc(1, sizeof(*m));
        if (!m) {
                config_deinit(config);
                return log_error_errno(ENOMEM, "Out of memory");
        }
        m->config = *config;
        *config = (Config) {};          /* consumed */
        m->start_usec = now_usec();
        if (args && config_args_copy(&m->args, args) < 0)
                return log_error_errno(ENOMEM, "Out of memory");

        r = manager_setup_loop(m);
        if (r < 0)
                return r;
        r = manager_setup_tiers(m);
        if (r < 0)
                return r;

        r = registry_new(&m->config, m->event, &m->host.pool, &m->vram->pool, m->nvme, &m->registry);
        if (r >= 0) {
                m->registry->book = m->book;
                m->registry->memstore = m->memstore;
        }
        if (r >= 0)
                r = engine_new(m->event, m->registry, m->uring, m->nvme, m->vram, &m->engine);
        if (r >= 0)
                m->engine->csum = m->csum;
        if (r >= 0)
                r = sched_new(m->event, &m->config, m->registry, m->engine, m->uring, m->vram, &m->sched);
        if (r >= 0)
                r = revoke_new(m->event, m->engine, &m->revoke);
        /*
         * Segments a job gives back get their new memory on a thread of their own: making and locking
         * gigabytes would hold every job's requests (the cuda backend, without make_memory, renews on the loop)
         */
        if (r >= 0 && !getenv("TIERD_TEST_RENEW_ON_LOOP"))     /* set: on the loop (bench/bench_churn.py's "loop") */
                r = segrenewer_new(&m->host.pool, m->event, on_segments_renewed, m, &renewer);   /* the pool's */
        if (r >= 0 && m->vram->pool.ops->make_memory && !getenv("TIERD_TEST_RENEW_ON_LOOP"))
                r = segrenewer_new(&m->vram->pool, m->event, on_segments_renewed, m, &renewer);
        if (r >= 0)
                r = quota_store_new(m->registry, &m->config, &m->quotas);
        if (r >= 0)
                r = quota_store_load(m->quotas);
        if (r < 0)
                return log_error_errno(r, "Cannot set up the daemon's state: %m");
        r = manager_check_quotas(m);
        if (r < 0)
                return r;
        if (!m->vram->emulated) {
                /* device memory stays allocated while a client maps it: take chunks back cooperatively */
                m->vram->pool.revoke = revoke_segment;
                m->vram->pool.revoke_userdata = m->revoke;
        }

        m->rpc = (Rpc) {
                .config = &m->config,
                .registry = m->registry,
                .engine = m->engine,
                .sched = m->sched,
                .vram = m->vram,
                .nvme = m->nvme,
                .revoke = m->revoke,
                .quotas = m->quotas,
                .start_usec = m->start_usec,
        };
        list_init(&m->rpc.evicts);
        rpc_resolve_admin_group(&m->rpc);
        r = server_new(m->event, &m->config, &rpc_server_ops, &m->rpc, &m->server);
        if (r < 0)
                return log_error_errno(r, "Out of memory");
        m->rpc.server = m->server;

        r = monitor_new(m->event, &m->config, &m->rpc, m->nvme, m->registry, &m->monitor);
        if (r < 0)
                return log_error_errno(r, "Cannot set up monitoring (metrics, drive wear): %m");

        /* the jobs and tensors the NVMe index holds (after the wear book: a job's past comes with its name) */
        r = manager_restore(m);
        if (r < 0)
                return r;
        /* what the memory store put back is in its new table; the rest of the last run's memory is renewed */
        (void) memstore_begin(m->memstore, m->registry);

        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        bool quiet;

        if (!m)
                return NULL;
        /*
         * The memory store's table stays as it is now, for the next start: what
         * the connections held for writing is recorded so (dropping them below
         * changes nothing there), and so are the copies the pools take with them
         */
        memstore_freeze(m->memstore);
        /* top down: the connections (their plans, requests and pins), the plans, the revokes */
        m->server = server_free(m->server);
        m->sched = sched_free(m->sched);
        if (m->vram)
                m->vram->pool.revoke = NULL;
        m->revoke = revoke_free(m->revoke);
        /*
         * Then the transfers: the VRAM backend's copies read and write the host
         * pool from another thread (or the device), the ring's from the kernel.
         * Once both have stopped nothing completes a transfer any more: the
         * engine abandons what is left, the books are freed, and then the
         * pools, the host pool before the backend, which it unregisters from.
         */
        quiet = vram_backend_stop(m->vram);
        m->uring = uring_free(m->uring);
        m->csum = csum_free(m->csum);          /* its workers stopped, no callback of it runs any more */
        if (m->monitor) {
                (void) monitor_save_wear(m->monitor, true);     /* no NVMe write completes any more */
                if (m->stopping)
                        monitor_remove_metrics(m->monitor);
        }
        if (quiet) {
                m->engine = engine_free(m->engine);
                if (m->stopping)
                        book_note_dead(m->book);        /* (before the registry detaches it) */
                m->registry = registry_free(m->registry);
                segpool_deinit(&m->host.pool);
        } else
                log_warning("VRAM copies are still running; leaving the host pool and the tensors as they are");
        m->quotas = quota_store_free(m->quotas);
        /* after the engine: no write to NVMe ends any more; a clean stop says so in the index */
        m->book = book_free(m->book, quiet && m->stopping);
        free(m->faults);                /* the NVMe index's last record may ask them */
        m->vram = vram_backend_free(m->vram);
        m->monitor = monitor_free(m->monitor);  /* after the registry: ending jobs add to its book */
        m->nvme = nvme_tier_free(m->nvme);
        m->memstore = memstore_free(m->memstore);
        sd_event_source_disable_unref(m->sigterm);
        sd_event_source_disable_unref(m->sigint);
        sd_event_source_disable_unref(m->sighup);
        sd_event_source_disable_unref(m->stop_timer);
        sd_event_unref(m->event);
        config_deinit(&m->config);
        config_args_done(&m->args);
        free(m);
        return NULL;
}

static unsigned n_conns(const Manager *m) {
        return m->server ? server_n_conns(m->server) : 0;
}

int manager_status_line(Manager *m, char *buf, size_t size) {
        const double mib = 1048576.0;
        const Registry *r = m->registry;

        return snprintf(buf, size,
                        "vram %.0f/%.0f MiB (%s), host %.0f/%.0f MiB%s, nvme %.0f/%.0f MiB on %u target(s); "
                        "%u job(s), %u connection(s)",
                        (double) r->used[LEVEL_VRAM] / mib, (double) r->capacity[LEVEL_VRAM] / mib,
                        m->vram->ops->name,
                        (double) r->used[LEVEL_HOST] / mib, (double) r->capacity[LEVEL_HOST] / mib,
                        m->host.locked ? " locked" : " NOT locked",
                        (double) r->used[LEVEL_NVME] / mib, (double) r->capacity[LEVEL_NVME] / mib,
                        m->nvme->n_targets, r->n_jobs, n_conns(m));
}

int manager_run(Manager *m) {
        return sd_event_loop(m->event);
}
