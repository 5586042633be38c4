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
