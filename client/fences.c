/* SPDX-License-Identifier: MIT */
/* fences.c: fences: the fence page, waiting for fences, failed fences and tierd's copy events. */

/*
 * Theory of operation
 *
 * Fences: the job's fence page holds, per connection slot, a "done"
 * watermark and a "failed" counter.  tier_fence_done() reads both with
 * acquire loads and, when every fence up to the one asked about is done and
 * each counted failure has been matched by a FenceFailed event, answers
 * without a system call.  Only when the counter runs ahead of the events
 * does it drain the socket (non-blocking) to learn which fence failed.
 * tier_fence_wait() sleeps in poll() on the connection's wakeup fd (tierd
 * writes a token to it after advancing the slot) and on the socket (events,
 * or tierd gone).  The wakeup fd is the read end of a pipe whose tokens are
 * 8 bytes (an older tierd sent an eventfd: one 8-byte read clears it);
 * client_wakeup_drain() takes every token pending in one read, and only then
 * does the caller look at the page again, so no wakeup is missed.
 *
 * A connection libtier closed for a timeout (transport.c) stops following the
 * page: tierd gives the slot to the job's next connection once it sees the
 * close, so the watermark and counter at the close are kept (fence_freeze())
 * and a fence not done by then never reads as done.  A connection tierd closed
 * (a protocol error, a revoke not answered) may have its slot taken before the
 * client looks: tierd bumps the slot's failed counter before it resets the
 * watermark for the next connection (registry.c), so a done read here that is
 * the next connection's comes with a failure this client has no event for
 * (both loads acquire, done first): the drain below finds the socket closed and
 * the fence fails with the connection's error.
 *
 * FenceFailed events (handled by the transport as they arrive) go into a
 * small ring of remembered failures, newest last; a fence older than the
 * ring's reach that failed reads as done.
 *
 * The fences a caller sees carry the client's tag in their top 16 bits
 * (fence_out()), distinct among any 65535 clients made one after another
 * in the process: a fence passed
 * to another client than the one that returned it is refused (-EINVAL)
 * rather than read as that client's fence of the same number.  Inside
 * libtier fences are the untagged numbers.
 *
 * A PinReply may carry the CUDA interprocess event of tierd's copy along
 * with its fence; the last few are kept in a second ring, so that
 * tier_fence_stream_wait() can make a CUDA stream wait for the copy instead of
 * the host waiting for the fence.
 */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/random.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-cuda.h"
#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/fence.h"
#include "proto/macro.h"
#include "util/time-util.h"

/* Without a wakeup fd tier_fence_wait() can only poll the fence page, this often. */
#define CLIENT_FENCE_POLL_MS 1

void client_wakeup_drain(tier_client *c) {
        uint64_t tokens[CLIENT_WAKEUP_TOKENS];

        if (client_forked(c))
                return;         /* the tokens are the parent's */

        /*
         * Every token pending, in one read (this tierd leaves one at most;
         * tokens beyond the buffer would only make the next poll() return at
         * once).  An eventfd (an older tierd) gives its 8 bytes and is clear.
         * Called after poll() said POLLIN: it does not block.
         */
        if (c->event_fd >= 0)
                (void) !read(c->event_fd, tokens, sizeof(tokens));
}

int fence_map_page(tier_client *c, int fd) {
        struct stat st;
        void *p;

        if (fstat(fd, &st) < 0)
                return client_error(c, negative_errno(), "cannot stat the fence page: %m");
        if (st.st_size < (off_t) sizeof(FencePage))
                return client_error(c, -EPROTO, "fence page is %lld bytes, expected %zu",
                                    (long long) st.st_size, sizeof(FencePage));
        p = mmap(NULL, sizeof(FencePage), PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return client_error(c, negative_errno(), "cannot map the fence page: %m");
        c->fence_page = p;
        return 0;
}

void fence_record_failure(tier_client *c, tier_fence fence, int status) {
        c->failures[c->n_failures % CLIENT_FAILURES_MAX] = (FenceFailure) {
                .fence = fence,
                .status = status,
        };
        c->n_failures++;
}

/* The failure of tierd's fence @fence, last_error set to it; 0 when none is known. */
static int fence_lookup_failure(tier_client *c, tier_fence fence) {
        uint64_t n = MIN(c->n_failures, (uint64_t) CLIENT_FAILURES_MAX);
        char event[64];

        for (uint64_t i = 0; i < n; i++) {
                const FenceFailure *f = &c->failures[(c->n_failures - 1 - i) % CLIENT_FAILURES_MAX];
                if (f->fence != fence)
                        continue;
                /* tierd's reason, as its event left it, unless a later call's text took its place */
                (void) snprintf(event, sizeof(event), "fence %#" PRIx64 " failed: ",
                                fence_out(c, fence + c->fence_offset));
                if (strncmp(c->last_error, event, strlen(event)) == 0)
                        return f->status;
                return client_error(c, f->status, "%s%s", event, tier_strerror(f->status));
        }
        return 0;
}

void fence_saw(tier_client *c, tier_fence f) {
        c->fence_max = MAX(c->fence_max, f);
}

uint64_t fence_new_tag(void) {
        static uint32_t seed;   /* 1 + a random start, set once */
        static uint32_t next;   /* the process's clients take tags in turn from there */
        uint32_t s = __atomic_load_n(&seed, __ATOMIC_ACQUIRE), n;

        if (s == 0) {
                uint16_t r = 0;
                uint32_t expected = 0;

                (void) !getrandom(&r, sizeof(r), GRND_NONBLOCK);
                s = (uint32_t) r + 1;
                if (!__atomic_compare_exchange_n(&seed, &expected, s, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                        s = expected;   /* another thread's came first */
        }
        n = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
        return ((uint64_t) ((s - 1 + n) % 0xffffu) + 1) << CLIENT_FENCE_TAG_SHIFT;
}

tier_fence fence_out(const tier_client *c, tier_fence f) {
        return f ? f | c->fence_tag : 0;
}

/* The untagged number of the caller's fence @f in *@ret; -EINVAL if another client handed it out. */
static int fence_in(tier_client *c, tier_fence f, tier_fence *ret) {
        if (f == 0) {
                *ret = 0;
                return 0;
        }
        if ((f & CLIENT_FENCE_TAG_MASK) != c->fence_tag)
                return client_error(c, -EINVAL, "fence %#" PRIx64 " was not handed out by this client "
                                    "(fences are numbered per tier_client)", f);
        *ret = f & ~CLIENT_FENCE_TAG_MASK;
        return 0;
}

/* Remember tierd's copy event @handle (a PinReply's ipc_event) of @fence for tier_fence_stream_wait(). */
void fence_add_event(tier_client *c, tier_fence fence, const uint8_t handle[CLIENT_CUDA_EVENT_SIZE]) {
        FenceEvent *fe = &c->fence_events[c->n_fence_events++ % CLIENT_FENCE_EVENTS];

        fe->fence = fence;
        memcpy(fe->handle, handle, CLIENT_CUDA_EVENT_SIZE);
}

void fence_freeze(tier_client *c) {
        if (!c->fence_page || c->fences_frozen)
                return;
        c->frozen_done = __atomic_load_n(&c->fence_page->done[c->fence_slot], __ATOMIC_ACQUIRE);
        c->frozen_failed = __atomic_load_n(&c->fence_page->failed[c->fence_slot], __ATOMIC_ACQUIRE);
        c->fences_frozen = true;
}

int fence_done(tier_client *c, tier_fence f) {
        uint64_t done, failed;
        int r;

        if (f == 0)
                return 1;
        if (f > c->fence_max)
                return client_error(c, -EINVAL, "fence %#" PRIx64 " was never issued on this connection",
                                    fence_out(c, f));
        if (f <= c->fence_floor && c->floor_error < 0 && c->floor_error != -ERESTART)
                return client_error(c, c->floor_error, "fence %#" PRIx64 " was handed out before the connection to "
                                    "tierd broke (%s), and no tierd came back: what it stood for may or may not "
                                    "have happened", fence_out(c, f), tier_strerror(c->floor_error));
        if (f <= c->fence_floor)
                return client_error(c, -ERESTART, "fence %#" PRIx64 " was handed out before tierd restarted: what it "
                                    "stood for may or may not have happened", fence_out(c, f));
        f -= c->fence_offset;           /* tierd's number for it (reconnect.c) */
        if (c->n_failures > 0) {
                r = fence_lookup_failure(c, f);
                if (r < 0)
                        return r;
        }
        if (!c->fence_page)
                return client_error(c, -EOPNOTSUPP, "tierd gave this connection no fence page");

        /* a slot libtier gave up (fence_freeze()) may be another connection's now: what it said then */
        done = c->fences_frozen ? c->frozen_done : __atomic_load_n(&c->fence_page->done[c->fence_slot],
                                                                    __ATOMIC_ACQUIRE);
        if (done < f)
                return 0;

        /*
         * Done, but maybe with an error: every failure the page counts comes with
         * a FenceFailed event.  Fast path: no failure we have not heard of.
         */
        failed = c->fences_frozen ? c->frozen_failed : __atomic_load_n(&c->fence_page->failed[c->fence_slot],
                                                                        __ATOMIC_ACQUIRE);
        if (failed - c->failed_base <= c->failed_events)
                return 1;

        /* A failure's event may still be queued: read what is there, without blocking. */
        (void) transport_drain(c);
        r = fence_lookup_failure(c, f);
        if (r < 0)
                return r;
        if (failed - c->failed_base <= c->failed_events)
                return 1;
        /* The event is still on its way (or never comes: tierd is gone): not known to be good. */
        return c->broken < 0 ? transport_broken(c) : 0;
}

int fence_wait(tier_client *c, tier_fence f, int timeout_ms) {
        uint64_t deadline = 0;
        int r;

        r = fence_done(c, f);
        if (r != 0)
                return r > 0 ? 0 : r;
        if (timeout_ms >= 0)
                deadline = now_ms() + (uint64_t) timeout_ms;

        for (;;) {
                struct pollfd pfd[2] = {
                        { .fd = c->event_fd, .events = POLLIN },
                        { .fd = c->fd, .events = POLLIN },
                };
                int t = -1, n;

                if (c->broken < 0)
                        return client_reconnect(c, transport_broken(c));
                if (timeout_ms >= 0) {
                        uint64_t now = now_ms();
                        if (now >= deadline)
                                return client_error(c, -ETIMEDOUT, "fence %#" PRIx64 " not done after %d ms",
                                                    fence_out(c, f), timeout_ms);
                        t = (int) MIN(deadline - now, (uint64_t) INT_MAX);
                }
                if (c->event_fd < 0)
                        t = t < 0 ? CLIENT_FENCE_POLL_MS : MIN(t, CLIENT_FENCE_POLL_MS);

                /* pfd[0] with fd -1 is ignored by poll(). */
                n = poll(pfd, 2, t);
                if (n < 0 && errno != EINTR)
                        return client_error(c, negative_errno(), "waiting for fence %#" PRIx64 " failed: %m",
                                            fence_out(c, f));
                if (n > 0 && (pfd[0].revents & POLLIN))
                        client_wakeup_drain(c);
                if (n > 0 && pfd[1].revents) {
                        r = transport_drain(c);
                        if (r < 0) {
                                /* tierd gone: the fence may still have finished before it went. */
                                int d = fence_done(c, f);
                                return d != 0 ? (d > 0 ? 0 : d) : client_reconnect(c, r);
                        }
                }

                r = fence_done(c, f);
                if (r != 0)
                        return r > 0 ? 0 : r;
        }
}

_public_ int tier_fence_stream_wait(tier_client *c, tier_fence f, void *stream) {
        ClientCuda *cc;
        int r;

        if (!c)
                return -EINVAL;
        r = client_check_fork(c);
        if (r < 0)
                return r;
        r = fence_in(c, f, &f);
        if (r < 0)
                return r;
        r = fence_done(c, f);
        if (r != 0)
                return r > 0 ? 0 : r;
        /* newest first: a fence is in the ring once, unless it wrapped */
        for (uint64_t i = 0; i < MIN(c->n_fence_events, (uint64_t) CLIENT_FENCE_EVENTS); i++) {
                const FenceEvent *fe = &c->fence_events[(c->n_fence_events - 1 - i) % CLIENT_FENCE_EVENTS];

                if (fe->fence != f)
                        continue;
                cc = client_get_cuda(c);
                if (!cc)
                        break;
                r = client_cuda_stream_wait(cc, fe->handle, stream);
                if (r >= 0)
                        return 0;
                break;          /* the fence still tells when it is done */
        }
        /* no event for it (its copy was not queued when tierd answered): wait here */
        return fence_wait(c, f, -1);
}

_public_ int tier_fence_done(tier_client *c, tier_fence f) {
        int r;

        if (!c)
                return -EINVAL;
        r = client_check_fork(c);
        if (r < 0)
                return r;
        r = fence_in(c, f, &f);
        if (r < 0)
                return r;
        r = fence_done(c, f);
        if (r != 0)
                return r;
        /*
         * Not done, so a system call is allowed: is tierd still there?  A fence of
         * a connection that is gone never completes, and a caller that polls it
         * would poll for ever; it gets the connection's error instead, as every
         * call after the break does (libtier(3)).  The read does not block.  A
         * client that reconnects joins the next tierd here, as every call that
         * finds tierd gone does (and tier_fence_wait()): -ERESTART, or the error
         * when none came back (which, for it, is what that error means).
         */
        if (c->broken == 0)
                (void) transport_drain(c);
        if (c->broken < 0) {
                r = fence_done(c, f);           /* it may have finished before tierd went */
                return r != 0 ? r : client_reconnect(c, transport_check(c));
        }
        return 0;
}

_public_ int tier_fence_wait(tier_client *c, tier_fence f, int timeout_ms) {
        int r;

        if (!c)
                return -EINVAL;
        r = client_check_fork(c);
        if (r < 0)
                return r;
        r = fence_in(c, f, &f);
        return r < 0 ? r : fence_wait(c, f, timeout_ms);
}
