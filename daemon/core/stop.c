/* SPDX-License-Identifier: MIT */
/* stop.c: a graceful stop (SIGTERM, SIGINT): the clients let go, what is only in memory goes down to NVMe. */

/*
 * SIGTERM and SIGINT start a drain inside the loop instead of leaving it at
 * once: after sd_event_exit() the loop dispatches nothing but exit sources
 * (and sd_event_run() on a finished loop is -ESTALE), so transfers could
 * not complete and queued packets could not be written any more.
 *
 * Two bounds.  The clients get MANAGER_DRAIN_USEC to let go of what they may
 * still write through (a pin that may write, their plan's phase) and to read
 * their last packets; the transfers running then get as long.  The
 * write-down of what is held only in memory (host, emulated VRAM) to NVMe
 * begins at once for every tensor nothing holds for writing, and for the
 * others as their pins go (or once the clients are gone); it has a bound of
 * its own: it goes on past the clients' bound for as long as it progresses
 * (NVMe writes end) and gives up once nothing has for
 * MANAGER_WRITE_IDLE_USEC, and the service manager is asked to wait that
 * long (EXTEND_TIMEOUT_USEC=) whenever it progresses, so that its
 * TimeoutStopSec= does not kill it.  The signal again ends the stop at once.
 */

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>

#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/ipc/server.h"
#include "daemon/sched/sched.h"
#include "daemon/state/registry.h"
#include "daemon/tiers/tier-nvme.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* How long a stop waits for the clients to let go and read their last packets, and for running transfers. */
#define MANAGER_DRAIN_USEC (10 * USEC_PER_SEC)
/* How long the write-down to NVMe goes on with no NVMe write ending before the stop gives up on it. */
#define MANAGER_WRITE_IDLE_USEC (10 * USEC_PER_SEC)
/* How much longer the service manager is asked to wait, each time the write-down progressed. */
#define MANAGER_WRITE_EXTEND_USEC (MANAGER_WRITE_IDLE_USEC + 10 * USEC_PER_SEC)
/* How often the bounds are looked at. */
#define MANAGER_STOP_TICK_USEC USEC_PER_SEC

static unsigned n_xfers(const Manager *m) {
        return m->engine ? m->engine->n_xfers : 0;
}

static unsigned n_conns(const Manager *m) {
        return m->server ? server_n_conns(m->server) : 0;
}

static uint64_t stop_now(const Manager *m) {
        uint64_t now = 0;

        if (sd_event_now(m->event, CLOCK_MONOTONIC, &now) < 0)
                now = now_usec();
        return now;
}

/*
 * Its newest copy has a record in this run's memory store table (memstore_note()): the service manager keeps
 * it for the next start when it keeps tierd's memory (systemctl restart; systemctl stop empties the store).
 */
static bool kept_in_memory_store(const Manager *m, const Tensor *t) {
        return m->memstore && t->mem_slot != 0;
}

static void on_stop_written(Op *op, int status, const char *error) {
        Manager *m = op->userdata;

        op->tensor->stop_op = NULL;
        m->stop_writes--;
        m->stop_rescan = true;          /* (a newer version overtook it: written again) */
        if (status < 0) {
                m->stop_failed++;
                log_job(LOG_WARNING, 0, op->tensor->job->name, "Stopping: tensor '%s' of job '%s' could not be "
                        "written down to NVMe (%s): %s", op->tensor->name, op->tensor->job->name,
                        error ? error : strerror(-status), kept_in_memory_store(m, op->tensor) ?
                        "only the memory store keeps it for the next start" : "it is lost when tierd has stopped");
        } else
                m->stop_written++;
}

/* Its tensor went meanwhile (its job's linger ended, so it was destroyed): nothing left to write or lose. */
static void on_stop_write_cancelled(Op *op) {
        op->tensor->stop_op = NULL;
        ((Manager *) op->userdata)->stop_writes--;
}

/* A tensor of the NVMe index whose newest data is only in memory (host, emulated VRAM): lost unless written down. */
static bool held_only_in_memory(const Tensor *t) {
        return t->version > 0 && !t->dead && !t->lost && t->book_key && !copy_valid(t, LEVEL_NVME) &&
               (copy_valid(t, LEVEL_HOST) || copy_valid(t, LEVEL_VRAM));
}

/* Something of this run may still write it: a pin that may write (a client's, a plan hold's); it may let go. */
static bool held_for_writing(const Tensor *t) {
        return tensor_writers(t) > 0;
}

/*
 * The drain ends (a bound, the signal again, or done): say what is held only in memory and so not on NVMe
 * now, why (a client still held it for writing; a client of before a restart may (a ghost, never written
 * down: stop_write_down()); its write-down had not ended, had not begun, or failed) and whether it is lost:
 * the memory store keeps what has a record in its table (kept_in_memory_store()).
 */
static void stop_report_unwritten(Manager *m) {
        unsigned n = 0, held = 0, ghosts = 0, running = 0, unasked = 0, kept = 0;
        uint64_t bytes = 0;
        char why[512], fate[256];
        size_t k = 0;

        if (!m->book)
                return;
        list_for_each_safe(jn, jtmp, &m->registry->jobs) {
                Job *j = list_entry(jn, Job, link);

                if (!j->book_key)
                        continue;
                list_for_each_safe(tn, ttmp, &j->tensors) {
                        Tensor *t = list_entry(tn, Tensor, job_link);

                        if (!held_only_in_memory(t))
                                continue;
                        n++;
                        bytes += t->alloc_size;
                        kept += kept_in_memory_store(m, t);
                        if (t->stop_op)
                                running++;
                        else if (t->ghost)
                                ghosts++;
                        else if (held_for_writing(t) && !m->stop_final)
                                held++;
                        else if (t->stop_version != t->version + 1)
                                unasked++;      /* changed since the last look, which the stop did not get to */
                }
        }
        if (n == 0)
                return;
        why[0] = '\0';
        if (held)
                k += (size_t) snprintf(why + k, sizeof(why) - k, "%u held for writing by a client that had not let "
                                       "go", held);
        if (ghosts && k < sizeof(why))
                k += (size_t) snprintf(why + k, sizeof(why) - k, "%s%u held for writing by a client of before tierd's "
                                       "restart whose rank had not attached again, not written down since that client "
                                       "may still be writing it", k ? ", " : "", ghosts);
        if (running && k < sizeof(why))
                k += (size_t) snprintf(why + k, sizeof(why) - k, "%s%u whose write-down had not ended", k ? ", " : "",
                                       running);
        if (unasked && k < sizeof(why))
                k += (size_t) snprintf(why + k, sizeof(why) - k, "%s%u whose write-down had not begun", k ? ", " : "",
                                       unasked);
        if (n - held - ghosts - running - unasked > 0 && k < sizeof(why))
                (void) snprintf(why + k, sizeof(why) - k, "%s%u whose write-down failed", k ? ", " : "",
                                n - held - ghosts - running - unasked);
        if (kept == n)
                (void) snprintf(fate, sizeof(fate), "they stay in the memory store, and the next start puts them back "
                                "if the service manager keeps tierd's memory (systemctl restart does; systemctl stop "
                                "does not: it empties the store)");
        else if (kept > 0)
                (void) snprintf(fate, sizeof(fate), "%u of them stay in the memory store (the next start puts them "
                                "back if the service manager keeps tierd's memory: systemctl restart does, systemctl "
                                "stop empties the store), the others are lost (the next start reports them)", kept);
        else
                (void) snprintf(fate, sizeof(fate), "they are lost (the next start reports them)");
        log_warning("Stopping: %u tensor(s), %" PRIu64 " MiB, held only in memory were not written down to NVMe (%s): "
                    "%s", n, bytes >> 20, why, fate);
}

/*
 * With the NVMe index, what is only in memory (host, emulated VRAM) goes to
 * NVMe before tierd stops, so that the next start finds every tensor: at
 * once what nothing holds for writing, the rest as its pins go, and
 * whatever is left once the clients are gone.  It looks again only when a
 * pin went, a write-down ended or the last client went.  One write-down per
 * tensor at a time, and one per version: a newer version written while it
 * ran is written again once it ended (the engine books nothing of a
 * write-down that a newer version overtook, and pins that may write wait
 * for it); one that failed is not asked again.  While clients are left a
 * write-down keeps the copies it writes (a client may hold them for
 * reading); the last, with none left, drops them as before.
 *
 * Never a ghost (Tensor.ghost: a copy put back from the memory store held
 * for writing by a client of before a restart, which the Hello of each rank
 * it waits for releases, and no Hello comes during a stop): that client may still be
 * writing into it (it maps the memfd), so NVMe would get a torn copy booked
 * as the newest version, and a write-only pin's room holds garbage until it
 * writes.  The memory store keeps it (its table records it held for writing,
 * as it was); without one it is lost, and stop_report_unwritten() says so.
 */
static void stop_write_down(Manager *m) {
        bool final = n_conns(m) == 0;
        unsigned n = 0, held = 0;
        uint64_t bytes = 0;

        if (!m->book || !m->engine)
                return;
        if (!m->stop_rescan && m->registry->unpins == m->stop_unpins && (!final || m->stop_final))
                return;
        m->stop_rescan = false;
        m->stop_unpins = m->registry->unpins;
        m->stop_final = final;
        list_for_each_safe(jn, jtmp, &m->registry->jobs) {
                Job *j = list_entry(jn, Job, link);

                if (!j->book_key)
                        continue;
                list_for_each_safe(tn, ttmp, &j->tensors) {
                        Tensor *t = list_entry(tn, Tensor, job_link);
                        Op *op;

                        if (!held_only_in_memory(t) || t->stop_op || t->stop_version == t->version + 1 ||
                            t->ghost)
                                continue;
                        if (!final && held_for_writing(t)) {
                                held++;
                                continue;
                        }
                        t->stop_version = t->version + 1;
                        if (op_submit(m->engine, final ? OP_EVICT : OP_PREFETCH, t, LEVEL_NVME, on_stop_written,
                                      NULL, m, &op) < 0) {
                                m->stop_failed++;
                                continue;
                        }
                        op->cancelled = on_stop_write_cancelled;
                        t->stop_op = op;
                        n++;
                        bytes += t->alloc_size;
                }
        }
        m->stop_held = held;
        if (n == 0)
                return;
        if (m->stop_writes == 0)
                m->stop_progress_at = stop_now(m);      /* its bound counts from here */
        m->stop_writes += n;
        m->stop_bytes += bytes;
        if (held)
                log_info("Stopping: writing %u tensor(s), %" PRIu64 " MiB, held only in memory down to NVMe, so that "
                         "the next start finds them; %u more once their clients let go of them", n, bytes >> 20,
                         held);
        else
                log_info("Stopping: writing %u tensor(s), %" PRIu64 " MiB, held only in memory down to NVMe, so that "
                         "the next start finds them", n, bytes >> 20);
}

/* What grows as the write-down progresses: NVMe bytes written, write-downs ended. */
static uint64_t stop_progress_mark(const Manager *m) {
        uint64_t mark = m->stop_written + m->stop_failed;

        for (unsigned i = 0; m->nvme && i < m->nvme->n_targets; i++)
                mark += m->nvme->targets[i].bytes_written;
        return mark;
}

/* The next tick: in a second, or at the clients' bound if that comes first. */
static uint64_t stop_next_tick(const Manager *m, uint64_t now) {
        uint64_t next = now + MANAGER_STOP_TICK_USEC;

        if (!m->stop_clients_over && next > m->stop_start + m->drain_usec)
                next = MAX(m->stop_start + m->drain_usec, now);
        return next;
}

/* STATUS= says how far the write-down is (systemctl status; a test waits for it). */
static void stop_tell(Manager *m) {
        m->stop_told = m->stop_written + m->stop_failed;
        (void) sd_notifyf(false, "STATUS=Stopping: %u tensor(s) written down to NVMe, %u in flight, %u held for "
                          "writing by clients, %u failed", m->stop_written, m->stop_writes, m->stop_held,
                          m->stop_failed);
}

static bool drain_done(Manager *m) {
        stop_write_down(m);
        if (m->stop_writes > 0)
                return false;
        if (m->stop_clients_over)
                return true;    /* what the clients still hold stays as it is */
        return n_xfers(m) == 0 && n_conns(m) == 0;
}

static void drain_end(Manager *m) {
        if (m->stop_clients_over)
                log_warning("Stopping with %u transfer(s) still in flight and %u client(s) still holding pins or "
                            "not done reading after %" PRIu64 " ms, ignoring", n_xfers(m), n_conns(m),
                            m->drain_usec / 1000);
        else
                log_debug("Drained: no transfer in flight, no client left");
        if (m->stop_written || m->stop_failed)
                log_info("Stopping: %u tensor(s) written down to NVMe, %u could not be", m->stop_written,
                         m->stop_failed);
        stop_report_unwritten(m);       /* (a ghost, a failed write-down: a drain that ended in time leaves them too) */
        (void) sd_event_exit(m->event, 0);
}

/* After every loop iteration of the drain. */
static int on_drain_post(sd_event_source *s, void *userdata) {
        Manager *m = userdata;

        if (m->server)
                server_reap(m->server);
        if (drain_done(m))
                drain_end(m);
        else if (m->stop_writes == 0 && m->stop_told != m->stop_written + m->stop_failed)
                stop_tell(m);   /* each write-down asked so far ended */
        return 0;
}

/* Once a second while stopping: the clients' bound, the write-down's progress and bound. */
static int on_stop_tick(sd_event_source *s, uint64_t usec, void *userdata) {
        Manager *m = userdata;
        uint64_t now = stop_now(m), mark = stop_progress_mark(m);

        if (mark != m->stop_mark) {
                m->stop_mark = mark;
                m->stop_progress_at = now;
                if (m->stop_writes > 0) {
                        /* a no-op without $NOTIFY_SOCKET: past TimeoutStopSec= only while it progresses */
                        (void) sd_notifyf(false, "EXTEND_TIMEOUT_USEC=%" PRIu64, MANAGER_WRITE_EXTEND_USEC);
                        stop_tell(m);
                }
        }
        if (!m->stop_clients_over && now >= m->stop_start + m->drain_usec) {
                m->stop_clients_over = true;
                if (m->stop_writes > 0 && (n_conns(m) > 0 || n_xfers(m) > m->stop_writes))
                        log_warning("Stopping: %u client(s) still holding pins or not done reading after %" PRIu64
                                    " ms: no longer waiting for them; the write-down of what is only in memory "
                                    "goes on while it progresses", n_conns(m), m->drain_usec / 1000);
        }
        if (m->stop_writes > 0 && now >= m->stop_progress_at + MANAGER_WRITE_IDLE_USEC) {
                log_warning("Stopping: no write-down to NVMe progressed for %" PRIu64 " s, giving up on %u of them",
                            (uint64_t) (MANAGER_WRITE_IDLE_USEC / USEC_PER_SEC), m->stop_writes);
                m->stop_clients_over = true;
                drain_end(m);
                return 0;
        }
        if (drain_done(m)) {
                drain_end(m);
                return 0;
        }
        (void) sd_event_source_set_time(s, stop_next_tick(m, now));
        (void) sd_event_source_set_enabled(s, SD_EVENT_ONESHOT);
        return 0;
}

int manager_on_stop_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        Manager *m = userdata;
        const char *sig = si->ssi_signo == SIGINT ? "SIGINT" : "SIGTERM";

        if (m->stopping) {
                log_notice("%s received again, stopping without waiting any longer", sig);
                stop_report_unwritten(m);
                return sd_event_exit(m->event, 0);
        }
        log_info("%s received, stopping", sig);
        manager_drain(m, MANAGER_DRAIN_USEC);
        return 0;
}

void manager_drain(Manager *m, uint64_t timeout_usec) {
        int r;

        if (m->stopping)
                return;
        m->stopping = true;
        m->registry->stopping = true;  /* jobs no longer linger */
        m->drain_usec = timeout_usec;
        m->stop_start = stop_now(m);
        m->stop_progress_at = m->stop_start;
        m->stop_unpins = m->registry->unpins;
        m->stop_rescan = true;          /* the first look */
        m->stop_mark = stop_progress_mark(m);

        /*
         * Persistent state: the drive wear book is written by manager_free()
         * (core/monitor.c), once no transfer can complete.  Quotas set at run
         * time are written to state_dir when they are set (daemon/state/
         * quota.c).  What is on NVMe is in the NVMe index as it is written
         * (daemon/state/book.c; [nvme] persist = no: scratch).
         */

        /*
         * No more accept()s; Event.shutdown to every client, which is closed once
         * it has read it, or, where it holds what it may still be writing through,
         * once it has let go (at its next phase, at its unpin): what it wrote is
         * then in memory, and written down then (stop_write_down())
         */
        if (m->sched)
                sched_stop(m->sched);
        if (m->server)
                server_stop(m->server, "tierd is stopping");
        /*
         * STOPPING=1 after the Event.shutdowns went out: whoever waits for it
         * (the service manager, a test) finds every client told, unless a
         * client's queue was backed up.
         */
        (void) sd_notifyf(false, "STOPPING=1\nSTATUS=Stopping: %u transfer(s) in flight, %u connection(s)",
                          n_xfers(m), n_conns(m));

        if (drain_done(m)) {
                drain_end(m);
                return;
        }
        /* the post source floats: the loop owns it and frees it with itself */
        r = sd_event_add_post(m->event, NULL, on_drain_post, m);
        if (r >= 0)
                r = sd_event_add_time(m->event, &m->stop_timer, CLOCK_MONOTONIC,
                                      stop_next_tick(m, m->stop_start), 0, on_stop_tick, m);
        if (r < 0) {
                log_warning_errno(r, "Cannot wait for transfers and clients, stopping now: %m");
                stop_report_unwritten(m);
                (void) sd_event_exit(m->event, 0);
        }
}
