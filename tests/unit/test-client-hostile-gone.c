/* SPDX-License-Identifier: MIT */
/* test-client-hostile-gone.c: libtier against a fake tierd that goes away (test-client-hostile.h). */

#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include <tier.h>

#include "tests/unit/test-client-hostile.h"

static int fence_after_gone(const char *path) {
        struct pollfd pfd = { .events = POLLIN };
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        tier_fence fence;
        int r, again;

        if (tier_client_new(path, "job", 0, &c) < 0 || tier_tensor_create(c, "w", 4096, &t) < 0 ||
            tier_pin_async(t, TIER_HOST, TIER_READ, &g, &fence) < 0)
                return 2;
        /* the fake closes the connection after its answer: wait until the socket says so */
        pfd.fd = tier_client_fd(c);
        if (poll(&pfd, 1, -1) != 1)
                return 3;
        /* no other call came between: tier_fence_done() itself must find tierd gone */
        r = tier_fence_done(c, fence);
        again = tier_fence_done(c, fence);
        fprintf(stderr, "tier_fence_done: %d, then %d (%s)\n", r, again, tier_client_last_error(c));
        tier_tensor_close(t);
        tier_client_free(c);
        return r == -ECONNRESET && again == -ECONNRESET ? 0 : 4;
}

/*
 * libtier(3): once tierd is gone "every later call fails the same way", never
 * hangs.  A fence it left unfinished never completes: tier_fence_done() said
 * 0 ("not yet") for ever, so a caller polling it polled for ever.
 */
void test_fence_done_after_tierd_gone(void **state) {
        Fake f = {};
        int st;

        (void) state;
        fake_start(&f, SC_GONE);
        st = in_child(fence_after_gone, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* failed with 4 (0, then 0) before the fix */
}

static int fence_after_gone_reconnects(const char *path) {
        struct pollfd pfd = { .events = POLLIN };
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        tier_fence fence;
        int r, again;

        /* the fake listens already: the first attempt connects; the timeout only bounds a failure */
        if (tier_client_new(path, "job", 0, &c) < 0 || tier_client_set_reconnect(c, 5000) < 0 ||
            tier_tensor_create(c, "w", 4096, &t) < 0 || tier_pin_async(t, TIER_HOST, TIER_READ, &g, &fence) < 0)
                return 2;
        pfd.fd = tier_client_fd(c);
        if (poll(&pfd, 1, -1) != 1)
                return 3;
        r = tier_fence_done(c, fence);
        fprintf(stderr, "tier_fence_done: %d (%s), restarts %u\n", r, tier_client_last_error(c),
                tier_client_restarts(c));
        again = tier_fence_done(c, fence);
        tier_tensor_close(t);
        if (r != -ERESTART || tier_client_restarts(c) != 1)
                r = 4;
        else
                r = again == -ERESTART ? 0 : 5;
        tier_client_free(c);
        return r;
}

/*
 * A client that reconnects (tier_client_set_reconnect(3)): "a call that finds
 * tierd gone" joins the next one and fails with -ERESTART; tier_fence_done()
 * found it gone but answered -ECONNRESET, which for such a client means "no
 * tierd came back" (tier.torch's write-down fences raised ShutdownError out of
 * a phase's hook instead of living through the restart).
 */
void test_fence_done_reconnects(void **state) {
        Fake f = {};
        int st;

        (void) state;
        fake_start(&f, SC_GONE_BACK);
        st = in_child(fence_after_gone_reconnects, f.path);
        fake_stop(&f);
        assert_int_equal(st, 0);        /* failed with 4 (-ECONNRESET, no restart) before the fix */
}
