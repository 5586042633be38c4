#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""When tierd stops: every call raises ShutdownError, waits return, a pin that may write holds the stop
until it is let go, the Client still closes.  When tierd stops answering (SIGSTOP): a Client with a
timeout= raises TimedOutError, then ShutdownError, instead of waiting for ever."""

from __future__ import annotations

import errno
import os
import signal
import time
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
        """A stop cut short (SIGTERM again) while a client still holds a pin that may write a tensor whose newest
        data is only in memory: the log says that it is lost, how much, and why (it used to say nothing of the lost
        tensors)."""
        c = tier.Client("held", socket=self.d.socket)
        self.addCleanup(c.close)
        held = c.create("held", 1 * MiB)
        g = held.pin(tier.HOST)
        g.memoryview()[0] = 1
        g.unpin(dirty=True)                     # its newest data is only in host memory
        w = held.pin(tier.HOST)                 # may write: the stop waits for it, and does not write it down
        w.memoryview()[0] = 2
        self.d.proc.send_signal(signal.SIGTERM)
        self.d.wait_notify("STOPPING=1", 10)
        self.d.proc.send_signal(signal.SIGTERM)  # the wait ends at once
        self.assertEqual(self.d.stop(), 0)
        log = self.d.log_text()
        self.assertIn("received again", log)
        self.assertNotIn("Stopping: writing", log)     # nothing else to write down
        self.assertIn("Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe (1 held for "
                      "writing by a client that had not let go): they are lost", log)

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

    def test_timeout_on_a_stopped_tierd(self) -> None:
        """Client(timeout=): a request a stopped tierd (SIGSTOP, waitpid() says it is) does not answer
        raises TimedOutError (not when, only that it returns), the connection is closed, later calls raise
        ShutdownError (ECONNRESET), the Client closes; tierd, continued, lets the job's connection go."""
        with self.assertRaises(ValueError):
            tier.Client("stopped", socket=self.d.socket, timeout=-1)
        c = tier.Client("stopped", socket=self.d.socket, timeout=0.1)
        self.addCleanup(c.close)
        t = c.create("t", 1 * MiB)
        g = t.pin(tier.HOST)
        pid = self.d.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            _, st = os.waitpid(pid, os.WUNTRACED)
            self.assertTrue(os.WIFSTOPPED(st))
            with self.assertRaises(tier.TimedOutError) as cm:
                t.stat()
            self.assertIn("did not answer", cm.exception.strerror)
            with self.assertRaises(tier.ShutdownError) as cm:
                t.stat()
            self.assertEqual(cm.exception.errno, errno.ECONNRESET)
            self.assertLess(c.fileno(), 0)
            c.close()           # its unpin is not sent: nothing waits for the stopped tierd
            self.assertFalse(g.pinned)
        finally:
            os.kill(pid, signal.SIGCONT)
        with tier.Client("", socket=self.d.socket) as ctl:
            for _ in range(500):    # until tierd read the connection's end (no bound asserted on when)
                job = next((j for j in ctl.status()["jobs"] if j["name"] == "stopped"), None)
                if job is None or job["connections"] == 0:  # (linger_sec = 0: the job goes with it)
                    break
                time.sleep(0.02)
            self.assertTrue(job is None or job["connections"] == 0, job)
        self.assertEqual(self.d.stop(), 0, "tierd's exit status")



class TestStopWritesDown(unittest.TestCase):
    """What a stop writes down to NVMe does not wait for every client to let go."""

    config = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300")  # the jobs wait for their clients again

    def setUp(self) -> None:
        why = tierd.can_lock_memory(tierd.HOST_CAPACITY)
        if why:
            self.skipTest(why)
        self.d = tierd.Tierd(self.config)         # no fd store: the next start has only what is on NVMe
        self.addCleanup(self.d.cleanup)
        self.d.start()

    def test_written_down_while_another_client_holds_on(self) -> None:
        """A client holds a pin that may write through the whole stop and never lets go: another job's data held
        only in memory is written down to NVMe at once, and the next start without tierd's memory finds it.  The
        write-down began only once every client was gone, so one client that held on made every job's data that
        was only in memory come back lost."""
        other = tier.Client("other", socket=self.d.socket)
        self.addCleanup(other.close)
        data = other.create("data", 1 * MiB)
        g = data.pin(tier.HOST)
        g.memoryview()[0:4] = b"keep"
        g.unpin(dirty=True)                     # its newest data is only in host memory
        c = tier.Client("holder", socket=self.d.socket)
        self.addCleanup(c.close)
        held = c.create("held", 1 * MiB)
        g = held.pin(tier.HOST)
        g.memoryview()[0] = 1
        g.unpin(dirty=True)
        w = held.pin(tier.HOST)                 # may write: never let go
        w.memoryview()[0] = 2

        self.d.proc.send_signal(signal.SIGTERM)
        self.d.wait_notify("STOPPING=1", 10)
        # written while the holder still holds on (before the fix no such STATUS came: tierd left at its bound)
        self.d.wait_notify("STATUS=Stopping: 1 tensor(s) written down to NVMe, 0 in flight, 1 held for writing by "
                           "clients", 10)
        self.assertIsNone(self.d.proc.poll(), "tierd went while a pin that may write was held")
        self.assertTrue(w.pinned)
        self.d.proc.send_signal(signal.SIGTERM)  # the holder never lets go: cut the stop short
        self.assertEqual(self.d.stop(), 0)
        log = self.d.log_text()
        self.assertIn("Stopping: writing 1 tensor(s), 1 MiB, held only in memory down to NVMe, so that the next "
                      "start finds them; 1 more once their clients let go of them", log)
        self.assertIn("Stopping: 1 tensor(s), 1 MiB, held only in memory were not written down to NVMe (1 held for "
                      "writing by a client that had not let go)", log)
        other.close()
        c.close()

        self.d.start()
        other = tier.Client("other", socket=self.d.socket)
        self.addCleanup(other.close)
        g = other.open("data").pin(tier.HOST, tier.READ)
        self.assertEqual(bytes(g.memoryview()[0:4]), b"keep")
        g.unpin()
        c = tier.Client("holder", socket=self.d.socket)
        self.addCleanup(c.close)
        with self.assertRaises(tier.LostError):
            c.open("held").pin(tier.HOST, tier.READ)
        self.assertEqual(self.d.stop(), 0)


if __name__ == "__main__":
    tierd.main()
