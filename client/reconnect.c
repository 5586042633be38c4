/* SPDX-License-Identifier: MIT */
/* reconnect.c: a client that finds tierd gone connects to the next one (tier_client_set_reconnect()). */

/*
 * Theory of operation: tierd restarts (an upgrade, a crash) and keeps its
 * jobs: what was on NVMe from its index, what was in memory from the
 * service manager's fd store (or written down at a clean stop).  A client
 * that opted in (tier_client_set_reconnect()) lives through that: the call
 * that finds the connection gone (ECONNRESET, or ESHUTDOWN after tierd
 * announced its stop) closes it, connects again until the timeout, says
 * Hello as the same job and rank and opens every tensor handle again by
 * name (their ids are the new tierd's).  The call then fails with
 * -ERESTART: it may or may not have happened before tierd went, so it is
 * not repeated for the caller.  What the connection held is gone with it:
 * pins (the caller pins again), the plan (submitted again by the caller)
 * and fences (waiting on one of before fails with -ERESTART; new fences
 * are numbered after them).  Mappings of before stay mapped until the
 * client is freed, so that what the caller still reads through an old grant
 * is still there; its new grants are new mappings.  A handle whose tensor
 * the new tierd does not have fails every call with -ESTALE.
 *
 * The same path serves a connection libtier closed itself, because tierd did
 * not answer a request within the client's timeout (tier_client_set_timeout(),
 * transport.c): tierd did not restart, but what the connection held is gone
 * all the same (tierd lets go of it once it sees the connection end), and it
 * counts in tier_client_restarts() (callers that count restarts to forget their
 * pins must see it).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/fence.h"
#include "proto/macro.h"

/* How long to wait between attempts to connect while tierd starts. */
#define RECONNECT_POLL_MS 50

_public_ int tier_client_set_reconnect(tier_client *c, int timeout_ms) {
        if (!c)
                return -EINVAL;
        if (timeout_ms < 0)
                return client_error(c, -EINVAL, "the reconnect timeout is %d ms: it must be 0 (never) or more",
                                    timeout_ms);
        if (c->control)
                return client_error(c, -EINVAL, "a control connection (no job) does not reconnect");
        c->reconnect_ms = timeout_ms;
        return 0;
}

_public_ unsigned tier_client_restarts(const tier_client *c) {
        return c ? c->restarts : 0;
}

static uint64_t mono_ms(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

/* Keep the mappings of before (segments and views): the caller may still read through them. */
static int retire_mappings(tier_client *c) {
        size_t n = 0, nv = 0;
        ClientSegment *rs;
        ClientView *rv;

        for (size_t i = 0; i < c->n_segments; i++)
                n += c->segments[i].kind != SEGMENT_NONE;
        for (tier_tensor *t = c->tensors; t; t = t->next)
                for (int tier = 0; tier < 2; tier++)
                        nv += t->views[tier].base || t->views[tier].device_base;
        rs = reallocarray(c->retired, c->n_retired + n + 1, sizeof(ClientSegment));
        if (!rs)
                return -ENOMEM;
        c->retired = rs;
        rv = reallocarray(c->retired_views, c->n_retired_views + nv + 1, sizeof(ClientView));
        if (!rv)
                return -ENOMEM;
        c->retired_views = rv;
        for (size_t i = 0; i < c->n_segments; i++)
                if (c->segments[i].kind != SEGMENT_NONE) {
                        c->retired[c->n_retired++] = c->segments[i];
                        c->segments[i] = (ClientSegment) { .kind = SEGMENT_NONE, .fd = -1 };
                }
        for (tier_tensor *t = c->tensors; t; t = t->next)
                for (int tier = 0; tier < 2; tier++)
                        if (t->views[tier].base || t->views[tier].device_base) {
                                c->retired_views[c->n_retired_views++] = t->views[tier];
                                t->views[tier] = (ClientView) {};
                        } else
                                view_clear(c, &t->views[tier]);
        return 0;
}

/*
 * Everything of the connection goes, but the mappings and the handles: the old
 * connection's (its mappings retired first), and a reconnect attempt's that failed.
 */
static void drop_connection(tier_client *c) {
        c->fd = safe_close(c->fd);
        c->event_fd = safe_close(c->event_fd);
        if (c->fence_page)
                (void) munmap((void *) c->fence_page, sizeof(FencePage));
        c->fence_page = NULL;
        plan_forget(c);
        free(c->vram_backend);
        free(c->vram_device);
        c->vram_backend = c->vram_device = NULL;
        c->failed_base = c->failed_events = 0;
        c->fences_frozen = false;
        c->n_failures = 0;
        c->n_fence_events = 0;
        c->broken = 0;
        c->broken_reason[0] = 0;
        c->shutdown = false;
        c->shutdown_reason[0] = 0;
        c->timed_out = false;
        c->seq = 0;
}

/*
 * A reconnect attempt failed after its Hello: what it mapped goes (no grant of
 * it reached the caller), lest the next tierd's segments of the same id and
 * generation find it mapped (segment_add()) and the caller read and write a
 * dead tierd's memory.
 */
static void drop_attempt_mappings(tier_client *c) {
        for (tier_tensor *t = c->tensors; t; t = t->next)
                for (int tier = 0; tier < 2; tier++)
                        view_clear(c, &t->views[tier]);
        for (size_t i = 0; i < c->n_segments; i++)
                segment_clear(c, &c->segments[i]);
        c->seg_error = 0;
}

/*
 * Open every handle again by name; a tensor the new tierd lacks, or has of
 * another size (another one of that name: its handle's grants would not fit),
 * marks its handle gone, once every open went through (an attempt that fails
 * marks none: the next tierd may have the tensor).
 */
static int reopen_tensors(tier_client *c, unsigned *ret_gone) {
        _cleanup_free_ bool *lost = NULL;
        unsigned gone = 0;
        size_t n = 0, i = 0;

        for (tier_tensor *t = c->tensors; t; t = t->next)
                n++;
        lost = calloc(n + 1, sizeof(bool));
        if (!lost)
                return -ENOMEM;
        for (tier_tensor *t = c->tensors; t; t = t->next, i++) {
                uint64_t size = 0;
                int r;

                if (t->gone)
                        continue;
                r = tensor_open_raw(c, t->name, &t->id, &size);
                if (r == -ENOENT || (r >= 0 && size != t->size)) {
                        lost[i] = true;
                        continue;
                }
                if (r < 0)
                        return r;
        }
        i = 0;
        for (tier_tensor *t = c->tensors; t; t = t->next, i++)
                if (lost[i]) {
                        t->gone = true;
                        gone++;
                }
        *ret_gone = gone;
        return 0;
}

int client_reconnect(tier_client *c, int r) {
        uint64_t deadline;
        unsigned gone = 0;
        char why[CLIENT_ERROR_MAX];
        bool timed_out;
        int q;

        if (c->reconnect_ms <= 0 || c->reconnecting || !client_gone(r) || !c->socket_path)
                return r;
        /* an earlier call's attempts gave up: the cause is still the first one's */
        if (!*c->gone_why) {
                (void) snprintf(c->gone_why, sizeof(c->gone_why), "%s", c->last_error);
                c->gone_timed_out = c->timed_out;       /* no restart: libtier closed the connection (transport.c) */
        }
        (void) snprintf(why, sizeof(why), "%s", c->gone_why);
        timed_out = c->gone_timed_out;
        c->reconnecting = true;
        q = retire_mappings(c);
        if (q < 0) {
                c->reconnecting = false;
                return r;
        }
        drop_connection(c);
        /* fences of before: up to the highest handed out; the next ones are numbered after it */
        c->fence_floor = c->fence_max;
        c->fence_offset = c->fence_max;
        c->floor_error = r;     /* until a tierd comes back: the fences of before went with the connection */
        deadline = mono_ms() + (uint64_t) c->reconnect_ms;
        for (;;) {
                q = transport_connect(c, c->socket_path);
                if (q >= 0)
                        q = client_hello(c, c->job, c->rank);
                if (q >= 0)
                        q = reopen_tensors(c, &gone);
                if (q >= 0) {
                        /* named in the Hello that worked (a failed attempt's next one names them again); the
                         * pins went with the connection */
                        held_clear(c);
                        break;
                }
                drop_attempt_mappings(c);
                drop_connection(c);
                if (mono_ms() >= deadline) {
                        c->reconnecting = false;
                        (void) transport_break(c, r, "tierd went away (%s) and did not come back within %d ms",
                                               why, c->reconnect_ms);
                        return r;
                }
                (void) usleep(RECONNECT_POLL_MS * 1000);
        }
        c->reconnecting = false;
        c->floor_error = -ERESTART;
        c->restarts++;
        c->gone_why[0] = 0;
        return client_error(c, -ERESTART, "%s (%s): the connection, the job and its tensors' handles "
                            "are back%s; pins, the plan, phases and fences of before are gone (pin, submit the "
                            "plan and enter the phase again)",
                            timed_out ? "connected to tierd again" : "tierd restarted", why,
                            gone ? " (some tensors are not: their handles fail with ESTALE)" : "");
}
