#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""When tierd stops: every call raises ShutdownError, waits return, the Client still closes."""

from __future__ import annotations

import errno
import unittest

import tierd
from tierd import MiB

import tier

GONE = (errno.ESHUTDOWN, errno.ECONNRESET, errno.ENOTCONN, errno.EPIPE)


class TestShutdown(unittest.TestCase):
    def setUp(self) -> None:
        why = tierd.can_lock_memory(tierd.HOST_CAPACITY)
        if why:
            self.skipTest(why)
        self.d = tierd.Tierd()
        self.addCleanup(self.d.cleanup)
        self.d.start()

    def test_calls_after_stop(self) -> None:
        c = tier.Client("stop", socket=self.d.socket)
        self.addCleanup(c.close)
        t = c.create("t", 1 * MiB)
        big = c.create("big", 16 * MiB)
        g = t.pin(tier.HOST)
        mv = g.memoryview()
        big.prefetch(tier.HOST)
        f = big.prefetch_async(tier.VRAM)  # half a second on the throttled link: in flight
        self.assertEqual(self.d.stop(), 0, "tierd's exit status")
        self.assertIn("STOPPING=1", "".join(self.d.notes))

        # the fence: done before tierd went, or failed with it; never a hang
        try:
            f.wait(timeout=10)
        except tier.ShutdownError as e:
            self.assertIn(e.errno, GONE)
        for call in (lambda: t.pin(tier.HOST), lambda: big.evict(tier.NVME), c.moved, c.status,
                     lambda: c.create("u", 4096), c.process, lambda: t.stat()):
            with self.assertRaises(tier.ShutdownError) as cm:
                call()
            self.assertIn(cm.exception.errno, GONE)
            # libtier heard Event.shutdown before the end of the connection: it says so, with
            # tierd's reason (client/transport.c), whichever way the call found the connection gone
            self.assertEqual(cm.exception.strerror, "tierd is shutting down: tierd is stopping")
        self.assertTrue(g.pinned)  # nothing unpinned it; its mapping is still ours until close
        mv[0] = 1
        with self.assertRaises(tier.TierError):
            tier.Client("stop", socket=self.d.socket)
        c.close()
        with self.assertRaises(ValueError):
            mv[0]
        self.assertTrue(t.closed and big.closed)


if __name__ == "__main__":
    tierd.main()
