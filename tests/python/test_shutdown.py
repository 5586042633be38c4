#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""When tierd stops: every call raises ShutdownError, waits return, a pin that may write holds the stop
until it is let go, the Client still closes."""

from __future__ import annotations

import errno
import signal
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
        self.d.proc.send_signal(signal.SIGTERM)
        self.d.wait_notify("STOPPING=1", 10)

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
            # libtier heard Event.shutdown (client/transport.c), or tierd refused the request itself:
            # either way it says that tierd is stopping
            self.assertIn("tierd is stopping", cm.exception.strerror)
        # the pin may write: tierd waits for it (up to its drain bound), so what is written through it
        # is in memory when the stop writes it down
        self.assertIsNone(self.d.proc.poll(), "tierd went while a pin that may write was held")
        self.assertTrue(g.pinned)
        mv[0] = 1
        g.unpin(dirty=True)     # letting go is still sent: tierd closes the connection and stops
        self.assertEqual(self.d.stop(), 0, "tierd's exit status")
        self.assertIn("STOPPING=1", "".join(self.d.notes))
        log = self.d.log_text()
        self.assertNotIn("Stopping with", log)         # not at its bound: when the pin went
        with self.assertRaises(tier.TierError):
            tier.Client("stop", socket=self.d.socket)
        c.close()
        with self.assertRaises(ValueError):
            mv[0]
        self.assertTrue(t.closed and big.closed)

    def test_idle_client_does_not_hold_the_stop(self) -> None:
        """A client that holds no pin that may write (a read-only one) does not keep tierd: it stops at once."""
        c = tier.Client("idle", socket=self.d.socket)
        self.addCleanup(c.close)
        t = c.create("t", 1 * MiB)
        g = t.pin(tier.HOST)
        g.unpin(dirty=True)
        r = t.pin(tier.HOST, tier.READ)
        self.assertEqual(self.d.stop(), 0)
        self.assertNotIn("Stopping with", self.d.log_text())
        self.assertTrue(r.pinned)
        with self.assertRaises(tier.ShutdownError):
            t.stat()

    def test_stop_cut_short_says_what_is_lost(self) -> None:
        """A stop cut short (SIGTERM again) while a client still holds a pin that may write: the write-down of what
        is only in memory never began (it waits for every client), and the log says that it is lost, and how
        much, not only that a client held on (it used to say nothing of the lost tensors)."""
        c = tier.Client("held", socket=self.d.socket)
        self.addCleanup(c.close)
        dirty = c.create("dirty", 1 * MiB)
        g = dirty.pin(tier.HOST)
        g.memoryview()[0] = 1
        g.unpin(dirty=True)                     # its newest data is only in host memory
        held = c.create("held", 1 * MiB)
        w = held.pin(tier.HOST)                 # may write: the stop waits for it
        w.memoryview()[0] = 2
        self.d.proc.send_signal(signal.SIGTERM)
        self.d.wait_notify("STOPPING=1", 10)
        self.d.proc.send_signal(signal.SIGTERM)  # the wait ends at once
        self.assertEqual(self.d.stop(), 0)
        log = self.d.log_text()
        self.assertIn("received again", log)
        self.assertNotIn("Stopping: writing", log)     # the write-down never began
        self.assertIn("Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe (their "
                      "write-down waits for every client to let go, and some still held pins): they are lost", log)

    def test_bad_message_after_stop(self) -> None:
        """EBADMSG once the connection is unusable (tierd gone) raises ShutdownError (on a connection
        that works on it is a plain TierError: test_client's TestBadMessage)."""
        c = tier.Client("badmsg", socket=self.d.socket)
        self.addCleanup(c.close)
        t = c.create("t", 4096)
        self.assertEqual(self.d.stop(), 0)
        real = tier._tensor._L

        class Stub:
            def __getattr__(self, attr: str) -> object:
                return (lambda *args: -errno.EBADMSG) if attr == "tier_tensor_stat" else getattr(real, attr)

        tier._tensor._L = Stub()
        try:
            with self.assertRaises(tier.ShutdownError) as cm:
                t.stat()
        finally:
            tier._tensor._L = real
        self.assertEqual(cm.exception.errno, errno.EBADMSG)


if __name__ == "__main__":
    tierd.main()
