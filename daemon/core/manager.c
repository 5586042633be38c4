/* SPDX-License-Identifier: MIT */
/* manager.c: the daemon's root object: event loop, config and every subsystem. */

/*
 * Theory of operation: the Manager owns the one sd_event loop and builds the
 * subsystems in dependency order: the io_uring (so the host pool can
 * register its segments as fixed buffers as it makes them), the VRAM
 * backend (so the host pool is placed on the GPU's NUMA node and registered
 * with CUDA as it is made), the host pool, the NVMe targets (registered as
 * fixed files), then the server.  Everything runs on the loop thread; the
 * only other thread is the VRAM backend's (the emulated mover, or the CUDA
 * copy completion thread), which talks back through an eventfd.
 *
 * The op engine runs from a defer source that manager_kick() arms, so ops
 * queued while handling one packet are advanced once that handler returns,
 * and io_uring submissions made by them are flushed by uring's post source
 * in the same iteration (one io_uring_enter for the whole batch).
 */

#include <errno.h>
#include <numa.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/tiers/memfd-seg.h"
#include "daemon/engine/mover.h"
#include "daemon/ipc/revoke.h"
#include "daemon/ipc/server.h"
#include "daemon/tiers/tier-nvme.h"
#include "daemon/tiers/uring.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"

static const char *const link_names[_LINK_MAX] = {
        [LINK_NVME_TO_HOST] = "nvme->host",
        [LINK_HOST_TO_NVME] = "host->nvme",
        [LINK_HOST_TO_VRAM] = "host->vram",
        [LINK_VRAM_TO_HOST] = "vram->host",
};

static MemfdSegConfig host_memfd;       /* userdata of the host pool */

const char *link_name(LinkDir d) {
        return d < _LINK_MAX ? link_names[d] : "?";
}

uint64_t now_usec(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000ull + (uint64_t) ts.tv_nsec / 1000;
}

static int on_run(sd_event_source *s, void *userdata) {
        Manager *m = userdata;

        mover_run(m);
        return 0;
}

void manager_kick(Manager *m) {
        if (m->run_source)
                (void) sd_event_source_set_enabled(m->run_source, SD_EVENT_ONESHOT);
}

static int host_register_buffer(Segment *seg, void *userdata) {
        Manager *m = userdata;

        /* DMA registration with the GPU is best effort: without it copies are slower, not wrong */
        (void) vram_host_register(m->vram, seg);
        return uring_set_buffer(m->uring, seg->id, seg->map, seg->pool->seg_size);
}

static void host_unregister_buffer(Segment *seg, void *userdata) {
        Manager *m = userdata;

        vram_host_unregister(m->vram, seg);
}

static int on_stop_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata);

static int on_sighup(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        (void) manager_reload(userdata);
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

int manager_new(Manager **ret, Config *config) {
        _cleanup_(manager_freep) Manager *m = NULL;
        _cleanup_free_ char *err = NULL;
        int r;

        m = calloc(1, sizeof(*m));
        if (!m)
                return log_error_errno(ENOMEM, "Out of memory");
        m->config = *config;
        *config = (Config) {};          /* consumed */
        m->start_usec = now_usec();
        list_init(&m->jobs);
        list_init(&m->dying_jobs);
        list_init(&m->run_queue);
        list_init(&m->space_waiters);
        list_init(&m->vram_waiting[0]);
        list_init(&m->vram_waiting[1]);
        for (int i = 0; i < TIERS; i++)
                list_init(&m->lru[i]);

        r = sd_event_new(&m->event);
        if (r < 0)
                return log_error_errno(r, "Cannot create the event loop: %m");
        r = sd_event_add_signal(m->event, &m->sigterm, SIGTERM, on_stop_signal, m);
        if (r >= 0)
                r = sd_event_add_signal(m->event, &m->sigint, SIGINT, on_stop_signal, m);
        if (r >= 0)
                r = sd_event_add_signal(m->event, &m->sighup, SIGHUP, on_sighup, m);
        if (r < 0)
                return log_error_errno(r, "Cannot watch signals: %m");
        r = sd_event_set_watchdog(m->event, true);
        if (r < 0)
                log_warning_errno(r, "Cannot enable the watchdog, ignoring: %m");
        r = sd_event_add_defer(m->event, &m->run_source, on_run, m);
        if (r < 0)
                return log_error_errno(r, "Cannot add the op engine source: %m");
        (void) sd_event_source_set_enabled(m->run_source, SD_EVENT_OFF);
        (void) sd_event_source_set_description(m->run_source, "op-engine");

        r = uring_new(m->event, m->config.nvme_queue_depth, &m->uring);
        if (r < 0)
                return r;

        /* the VRAM backend first: the host pool goes on its GPU's NUMA node and is registered with it */
        r = vram_backend_new(&m->config, m->event, &m->vram, &err);
        if (r < 0)
                return log_error_errno(r, "%s", err ? err : "Cannot set up the VRAM tier: %m");
        m->vram->pool.tier = TIER_VRAM;
        m->vram->pool.id_base = 1u << 16;
        if (!m->vram->emulated) {
                /* device memory stays allocated while a client maps it: take chunks back cooperatively */
                m->vram->pool.revoke = revoke_segment;
                m->vram->pool.revoke_userdata = m;
        }

        /* host tier: one memfd per segment, NUMA-bound, locked, registered as a fixed buffer */
        r = uring_register_buffers(m->uring, (unsigned) (m->config.host_capacity / m->config.host_segment_size));
        if (r < 0)
                return log_error_errno(r, "Cannot register io_uring buffers: %m");
        m->host.numa_node = pick_numa_node(&m->config, m->vram);
        host_memfd = (MemfdSegConfig) {
                .name = "tierd-host",
                .numa_node = m->host.numa_node,
                .lock = true,
                .on_make = host_register_buffer,
                .on_drop = host_unregister_buffer,
                .userdata = m,
        };
        r = segpool_init(&m->host.pool, "memfd", &memfd_seg_ops, &host_memfd,
                         m->config.host_capacity, m->config.host_segment_size);
        if (r < 0)
                return log_error_errno(r, "Cannot set up the host pool of %" PRIu64 " bytes: %m "
                                       "(locked memory needs CAP_IPC_LOCK or a higher RLIMIT_MEMLOCK)",
                                       m->config.host_capacity);
        m->host.pool.tier = TIER_HOST;
        m->host.pool.id_base = 0;
        m->host.locked = !host_memfd.lock_failed;

        r = nvme_tier_new(&m->config, m->uring, &m->nvme, &err);
        if (r < 0)
                return log_error_errno(r, "%s", err ? err : "Cannot set up the NVMe tier: %m");

        m->capacity[TIER_VRAM] = (uint64_t) m->vram->pool.n_segs * m->vram->pool.seg_size;
        m->capacity[TIER_HOST] = (uint64_t) m->host.pool.n_segs * m->host.pool.seg_size;
        m->capacity[TIER_NVME] = m->nvme->capacity;

        r = mover_init(m);
        if (r < 0)
                return r;
        r = server_new(m, &m->server);
        if (r < 0)
                return log_error_errno(r, "Out of memory");

        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        m->server = server_free(m->server);
        list_for_each_safe(n, tmp, &m->jobs)
                job_destroy(list_entry(n, Job, link));
        mover_deinit(m);
        if (m->n_xfers > 0)
                log_warning("%u transfer(s) still running at exit; their memory is not freed", m->n_xfers);
        m->uring = uring_free(m->uring);
        segpool_deinit(&m->host.pool);         /* before the VRAM backend: it unregisters from it */
        m->vram = vram_backend_free(m->vram);
        m->nvme = nvme_tier_free(m->nvme);
        sd_event_source_disable_unref(m->run_source);
        sd_event_source_disable_unref(m->sigterm);
        sd_event_source_disable_unref(m->sigint);
        sd_event_source_disable_unref(m->sighup);
        sd_event_unref(m->event);
        config_deinit(&m->config);
        free(m->config_path);
        free(m);
        return NULL;
}

int manager_start(Manager *m) {
        return 0;
}

/* ---- stopping ------------------------------------------------------------------------ */

/*
 * SIGTERM and SIGINT start a drain inside the loop instead of leaving it at
 * once: after sd_event_exit() the loop dispatches nothing but exit sources
 * (and sd_event_run() on a finished loop is -ESTALE), so transfers could
 * not complete and queued packets could not be written any more.
 */

/* How long a stop waits for running transfers and for clients to read their last packets. */
#define MANAGER_DRAIN_USEC (10ull * 1000000ull)

static bool drain_done(Manager *m) {
        return m->n_xfers == 0 && (!m->server || server_n_conns(m->server) == 0);
}

/* After every loop iteration of the drain. */
static int on_drain_post(sd_event_source *s, void *userdata) {
        Manager *m = userdata;

        if (!drain_done(m))
                return 0;
        log_debug("Drained: no transfer in flight, no client left");
        return sd_event_exit(m->event, 0);
}

static int on_drain_timeout(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;

        log_warning("Stopping with %u transfer(s) still in flight and %u client(s) not done reading after "
                    "%" PRIu64 " ms, ignoring", m->n_xfers, m->server ? server_n_conns(m->server) : 0,
                    m->drain_usec / 1000);
        return sd_event_exit(m->event, 0);
}

static int on_stop_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;
        const char *sig = si->ssi_signo == SIGINT ? "SIGINT" : "SIGTERM";

        if (m->stopping) {
                log_notice("%s received again, stopping without waiting any longer", sig);
                return sd_event_exit(m->event, 0);
        }
        log_info("%s received, stopping", sig);
        manager_drain(m, MANAGER_DRAIN_USEC);
        return 0;
}

void manager_drain(Manager *m, uint64_t timeout_usec) {
        uint64_t now = 0;
        int r;

        if (m->stopping)
                return;
        m->stopping = true;
        m->drain_usec = timeout_usec;
        (void) sd_notifyf(false, "STOPPING=1\nSTATUS=Stopping: %u transfer(s) in flight, %u connection(s)",
                          m->n_xfers, m->server ? server_n_conns(m->server) : 0);

        /*
         * Persistent state: there is none to write yet.  Quotas set at run
         * time live only in their Job (they are not kept under state_dir
         * yet), and tensors do not outlive tierd: their NVMe extents are not
         * indexed on disk, so the backing targets are scratch space.  When
         * either changes, the state is written here, before the loop exits.
         */

        if (m->server) {
                /* no more accept()s; Event.shutdown queued to every client */
                server_broadcast_shutdown(m->server, "tierd is stopping");
                list_for_each_safe(n, tmp, server_conns(m->server)) {
                        Conn *c = list_entry(n, Conn, link);

                        /*
                         * Read no more requests; write what is queued (the shutdown
                         * event last), then close, as after a protocol error: the
                         * connection's requests are cancelled and its pins dropped.
                         */
                        c->closing = true;
                        if (sd_event_source_set_io_events(c->io, EPOLLOUT) < 0)
                                conn_close(c);
                }
        }

        if (drain_done(m)) {
                (void) sd_event_exit(m->event, 0);
                return;
        }
        /* floating sources: the loop owns them and frees them with itself */
        r = sd_event_add_post(m->event, NULL, on_drain_post, m);
        if (r >= 0)
                r = sd_event_now(m->event, CLOCK_MONOTONIC, &now);
        if (r >= 0)
                r = sd_event_add_time(m->event, NULL, CLOCK_MONOTONIC, now + timeout_usec, 0, on_drain_timeout, m);
        if (r < 0) {
                log_warning_errno(r, "Cannot wait for transfers and clients, stopping now: %m");
                (void) sd_event_exit(m->event, 0);
        }
}

int manager_status_line(Manager *m, char *buf, size_t size) {
        const double mib = 1048576.0;

        return snprintf(buf, size,
                        "vram %.0f/%.0f MiB (%s), host %.0f/%.0f MiB%s, nvme %.0f/%.0f MiB on %u target(s); "
                        "%u job(s), %u connection(s)",
                        (double) m->used[TIER_VRAM] / mib, (double) m->capacity[TIER_VRAM] / mib,
                        m->vram->ops->name,
                        (double) m->used[TIER_HOST] / mib, (double) m->capacity[TIER_HOST] / mib,
                        m->host.locked ? " locked" : " NOT locked",
                        (double) m->used[TIER_NVME] / mib, (double) m->capacity[TIER_NVME] / mib,
                        m->nvme->n_targets, m->n_jobs, m->server ? server_n_conns(m->server) : 0);
}

int manager_run(Manager *m) {
        return sd_event_loop(m->event);
}
