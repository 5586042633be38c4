#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tier.Client, Tensor, Grant, Fence against a real tierd: every call, and its errors."""

from __future__ import annotations

import errno
import gc
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import tierd
from tierd import MiB

import tier


def pattern(n: int, seed: int) -> bytes:
    """@n bytes that differ between seeds and offsets."""
    block = bytes((i * 31 + seed * 7) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def run_child(socket: str, *parts: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run @parts (each dedented) in a fresh interpreter with ``tier``, ``gc``, ``MiB`` and ``c`` (a
    Client of job "child") defined: a crash there is a return code, not the end of the suite."""
    code = f"import gc, sys, tier\nMiB = 1 << 20\nc = tier.Client('child', socket={socket!r})\n"
    code += "".join(textwrap.dedent(p) for p in parts)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


class TestClient(tierd.DaemonTestCase):
    def test_properties(self) -> None:
        c = self.client("props", rank=3)
        self.assertEqual(c.job, "props")
        self.assertEqual(c.rank, 3)
        self.assertEqual(c.vram_backend, "emulated")
        self.assertEqual(c.vram_device, "")
        self.assertEqual(c.limit(tier.HOST), 48 * MiB)
        self.assertEqual(c.limit("vram"), 16 * MiB)
        self.assertEqual(c.tensor_max(tier.HOST), 48 * MiB)
        self.assertEqual(c.tensor_max(tier.VRAM), 16 * MiB)
        self.assertEqual(c.segment_size(tier.HOST), 16 * MiB)
        self.assertEqual(c.segment_size(tier.VRAM), 8 * MiB)
        self.assertEqual(c.segment_size(tier.NVME), 1 * MiB)
        fd = c.fileno()
        self.assertGreaterEqual(fd, 0)
        os.fstat(fd)
        self.assertEqual(c.last_error, "")
        self.assertEqual(c.phase_stall, 0.0)
        self.assertIn("props", repr(c))

    def test_context_manager_and_close(self) -> None:
        with tier.Client("cm", socket=self.socket) as c:
            t = c.create("t", 4096)
            u = c.create("u", 4096)
            g = t.pin(tier.HOST)
            mv = g.memoryview()
            self.assertFalse(c.closed)
        self.assertTrue(c.closed)
        self.assertTrue(t.closed and u.closed)  # its handles were closed first
        self.assertFalse(g.pinned)
        with self.assertRaises(ValueError):
            mv[0]
        c.close()  # idempotent
        t.close()
        with self.assertRaises(tier.TierError) as cm:
            c.create("x", 1)
        self.assertEqual(cm.exception.errno, errno.EBADF)
        with self.assertRaises(tier.TierError):
            t.pin(tier.HOST)
        with self.assertRaises(tier.TierError):
            g.memoryview()

    def test_create_open_tensor(self) -> None:
        c = self.client()
        t = c.create("w0", 3 * 4096)
        self.assertEqual((t.name, t.size, t.client), ("w0", 3 * 4096, c))
        other = self.client(c.job, rank=1)  # another rank of the job
        u = other.open("w0")
        self.assertEqual(u.size, t.size)
        with t.pin(tier.HOST) as g:
            g.memoryview()[:5] = b"hello"
        with u.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[:5]), b"hello")
            self.assertFalse(g.dirty)
        # tensor(): open when there, create when not
        v = c.tensor("w0", 3 * 4096)
        self.assertEqual(v.size, t.size)
        w = c.tensor("w1", 8192)
        self.assertEqual(w.stat().size, 8192)
        with self.assertRaises(tier.ExistsError) as cm:
            c.tensor("w1", 4096)
        self.assertIn("8192", str(cm.exception))
        with u:
            pass
        self.assertTrue(u.closed)
        for x in (t, w):
            x.destroy()
            self.assertTrue(x.closed)
        v.close()
        with self.assertRaises(tier.NotFoundError):
            c.open("w0")

    def test_argument_errors(self) -> None:
        c = self.client()
        t = c.create("t", 4096)
        with self.assertRaises(ValueError):
            c.create("", 1)
        with self.assertRaises(ValueError):
            c.create("x", 0)
        with self.assertRaises(ValueError):
            c.create("x", (1 << 40) + 1)
        with self.assertRaises(TypeError):
            c.create("x", 1.5)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            c.open(b"t")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            t.pin("disk")
        with self.assertRaises(ValueError):
            t.pin(tier.HOST, 0)
        with self.assertRaises(ValueError):
            t.pin(tier.HOST, 4)
        with self.assertRaises(TypeError):
            t.evict(None)  # type: ignore[arg-type]
        # a tier the call never takes is an invalid argument too: ValueError, before libtier
        # (README, Errors), not tierd's EINVAL (or ENOENT for an unpin) as a TierError
        for call, bad in ((t.pin, tier.NVME), (t.pin_async, "nvme"), (t.unpin, tier.NVME),
                          (t.prefetch, tier.NVME), (t.prefetch_async, "nvme"),
                          (t.evict, tier.VRAM), (t.evict_async, "vram")):
            with self.subTest(call=call.__name__, tier=bad), self.assertRaises(ValueError):
                call(bad)
        self.assertEqual(t.stat().pins, {"vram": 0, "host": 0, "nvme": 0})
        with self.assertRaises(ValueError):
            t.unpin_after(tier.HOST, True, None)
        f = t.prefetch_async(tier.HOST)
        with self.assertRaises(ValueError):
            c.wait(f, timeout=-1)
        with self.assertRaises(TypeError):
            c.wait([1])  # type: ignore[list-item]
        with self.assertRaises(ValueError):
            c.set_quota(vram=0)
        with self.assertRaises(ValueError):
            c.set_quota(weight=1001)
        with self.assertRaises(ValueError):
            c.phase(-1)
        other = self.client("other-args")
        with self.assertRaises(ValueError):
            other.wait(f)
        with self.assertRaises(ValueError):
            other.phase_grant(t, tier.HOST)
        with self.assertRaises(ValueError):
            c.phase_grant(t, tier.NVME)
        c.wait(f)  # (a tensor with a request in flight cannot be destroyed)
        t.destroy()

    def test_stat_and_pins(self) -> None:
        c = self.client()
        t = c.create("t", 1 * MiB)
        st = t.stat()
        self.assertEqual(st.size, 1 * MiB)
        self.assertEqual(dict(st.state), {"vram": "absent", "host": "absent", "nvme": "absent"})
        g = t.pin(tier.HOST)
        self.assertEqual((g.tier, g.length, g.mode), (tier.HOST, 1 * MiB, tier.READ_WRITE))
        self.assertIsNotNone(g.ptr)
        self.assertIsNone(g.device_ptr)
        self.assertTrue(g.dirty)
        # where it lies: 4 KiB aligned (O_DIRECT's unit) inside one of the pool's 16 MiB segments
        seg = c.segment_size(tier.HOST)
        self.assertEqual(seg, 16 * MiB)
        self.assertEqual(g.offset % 4096, 0)
        self.assertLessEqual(g.offset + g.length, seg)
        self.assertLess(g.segment, tierd.HOST_CAPACITY // seg)
        st = t.stat()
        self.assertEqual(st.state[tier.HOST], "resident")
        self.assertEqual(st.state["host"], "resident")
        self.assertEqual(st.pins[tier.HOST], 1)
        self.assertIn(tier.HOST, st.pins)
        g2 = t.pin(tier.HOST, tier.READ)
        self.assertEqual(t.stat().pins["host"], 2)
        mv1, mv2 = g.memoryview(), g2.memoryview()
        t.unpin(tier.HOST)  # drops the newest grant's pin: g2's
        self.assertFalse(g2.pinned)
        self.assertTrue(g.pinned)
        with self.assertRaises(ValueError):
            mv2[0]
        mv1[0] = 1
        g.unpin()
        g.unpin()  # idempotent
        st = t.stat()
        self.assertEqual(st.pins[tier.HOST], 0)
        self.assertTrue(st.dirty[tier.HOST])
        with self.assertRaises(tier.TierError):
            t.unpin(tier.HOST)  # no pin left: tierd says so
        self.assertNotEqual(c.last_error, "")
        t.destroy()

    def test_memoryview_lifetime(self) -> None:
        c = self.client()
        t = c.create("t", 64 * 1024)
        with t.pin(tier.HOST) as g:
            mv = g.memoryview()
            self.assertEqual((mv.format, mv.itemsize, mv.nbytes, mv.readonly), ("B", 1, 64 * 1024, False))
            mv[:] = pattern(64 * 1024, 1)
            again = g.memoryview()
            self.assertEqual(again.tobytes(), pattern(64 * 1024, 1))
            # the same memory, no copy: a write through one view shows through the other
            again[0] ^= 0xFF
            self.assertEqual(mv[0], pattern(64 * 1024, 1)[0] ^ 0xFF)
            mv[0] ^= 0xFF
            self.assertEqual(again[0], pattern(64 * 1024, 1)[0])
        self.assertFalse(g.pinned)
        for v in (mv, again):
            with self.assertRaises(ValueError):
                v[0]
            with self.assertRaises(ValueError):
                bytes(v)
        with self.assertRaises(tier.TierError) as cm:
            g.memoryview()
        self.assertIn("unpinned", str(cm.exception))
        with self.assertRaises(tier.TierError):
            g.numpy()
        with self.assertRaises(tier.TierError):
            g.torch()
        # the with block unpinned dirty: the data is the tensor's
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(g.memoryview().tobytes(), pattern(64 * 1024, 1))
        t.destroy()

    def test_clean_unpin_override(self) -> None:
        c = self.client()
        t = c.create("t", 4096)
        with t.pin(tier.HOST) as g:
            g.dirty = False
        self.assertFalse(t.stat().dirty["host"])
        t.destroy()

    def test_tensor_unpin_follows_the_grant(self) -> None:
        """Tensor.unpin(tier) without dirty= takes the Grant's dirty: a READ_WRITE pin written and let go
        that way is dirty (it was clean, and the write was dropped as if nothing had changed); a READ
        pin's is clean; dirty= given wins."""
        c = self.client()
        t = c.create("t", 4096)
        g = t.pin(tier.HOST)
        g.memoryview()[:4] = b"abcd"
        t.unpin(tier.HOST)
        self.assertTrue(t.stat().dirty["host"])
        t.evict(tier.NVME)
        g = t.pin(tier.HOST, tier.READ)
        self.assertEqual(bytes(g.memoryview()[:4]), b"abcd")
        t.unpin(tier.HOST)
        self.assertFalse(t.stat().dirty["host"])
        t.pin(tier.HOST)
        t.unpin(tier.HOST, False)
        self.assertFalse(t.stat().dirty["host"])
        t.destroy()

    def test_unpin_through_another_handle(self) -> None:
        """t2.unpin(tier) of a pin taken and written through t1 (same tensor, same client) was sent
        clean, so the write was dropped, and t1's grant stayed pinned; now any handle's unpin ends
        the client's most recent grant of that tensor and tier, dirty as it says, also where its
        handle was closed (a write pin there: dirty)."""
        c = self.client()
        t1 = c.create("t", 4096)
        t2 = c.open("t")
        g = t1.pin(tier.HOST)
        mv = g.memoryview()
        mv[:4] = b"abcd"
        t2.unpin(tier.HOST)
        self.assertFalse(g.pinned)
        with self.assertRaises(ValueError):
            mv[0]
        g.unpin()  # nothing left to do
        st = t1.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (0, True))
        t1.evict(tier.NVME)
        with t2.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[:4]), b"abcd")
        t1.evict(tier.NVME)
        t3 = c.open("t")
        t3.pin(tier.HOST).memoryview()[:4] = b"efgh"
        t3.close()  # the grant goes, the pin stays
        t1.unpin(tier.HOST)
        self.assertEqual(t1.stat().dirty["host"], True)
        t1.evict(tier.NVME)
        with t1.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[:4]), b"efgh")
        t2.close()
        t1.destroy()

    def test_read_pin_of_a_closed_handle_unpinned_clean(self) -> None:
        """A READ pin whose handle was closed, unpinned through another handle, was sent dirty (the
        default with no Grant known): the version went up and the NVMe copy was thrown away.  Now
        the client keeps the pin's dirty when the handle closes, and that unpin is clean; a write
        pin's, kept the same way, stays dirty, and the most recent pin of the tier goes first."""
        c = self.client()
        t = c.create("t", MiB)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:] = pattern(MiB, 4)
        t.evict(tier.NVME)
        g = t.pin(tier.HOST, tier.READ)
        mv = g.memoryview()
        t.close()
        self.assertFalse(g.pinned)
        with self.assertRaises(ValueError):
            mv[0]
        t2 = c.open("t")
        self.assertEqual(t2.stat().pins["host"], 1)
        t2.unpin(tier.HOST)
        st = t2.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (0, False))
        self.assertEqual((st.state["host"], st.state["nvme"]), ("resident", "resident"))
        t3 = c.open("t")
        t3.pin(tier.HOST, tier.READ)
        t3.pin(tier.HOST, tier.READ_WRITE).memoryview()[:4] = b"abcd"
        t3.close()
        t2.unpin(tier.HOST)  # the READ_WRITE pin, the most recent
        self.assertTrue(t2.stat().dirty["host"])
        t2.unpin(tier.HOST)
        st = t2.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (0, True))
        t2.evict(tier.NVME)
        with t2.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[:4]), b"abcd")
        t2.destroy()

    def test_write_only_pin_moves_nothing(self) -> None:
        c = self.client()
        t = c.create("t", 8 * MiB)
        with t.pin(tier.HOST) as g:
            g.memoryview()[:] = pattern(8 * MiB, 5)
        t.evict(tier.NVME)
        st = t.stat()
        self.assertEqual((st.state["host"], st.state["nvme"]), ("absent", "resident"))
        before = c.moved()
        self.assertEqual(set(before), set(tier.LINKS))
        self.assertEqual(before["host->nvme"], 8 * MiB)
        with t.pin(tier.HOST, tier.WRITE) as g:
            self.assertTrue(g.dirty)
            g.memoryview()[:] = b"\x77" * (8 * MiB)
        after = c.moved()
        self.assertEqual(after["nvme->host"] - before["nvme->host"], 0)
        self.assertEqual(after, before)
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(g.memoryview().tobytes(), b"\x77" * (8 * MiB))
        self.assertEqual(c.moved()["nvme->host"] - before["nvme->host"], 8 * MiB)
        t.destroy()

    def test_async_pin_evict_prefetch(self) -> None:
        c = self.client()
        t = c.create("t", 2 * MiB)
        g, f = t.pin_async(tier.HOST)
        self.assertIsInstance(f, tier.Fence)
        f.wait()
        self.assertTrue(f.done())
        g.memoryview()[:] = pattern(2 * MiB, 9)
        g.unpin()
        f = t.evict_async(tier.NVME)
        c.wait(f)
        self.assertEqual(t.stat().state["host"], "absent")
        f = t.prefetch_async(tier.HOST)
        c.wait([f], timeout=10)
        self.assertEqual(t.stat().state["host"], "resident")
        t.evict(tier.NVME)
        t.prefetch(tier.VRAM)  # nvme -> host -> vram
        st = t.stat()
        self.assertEqual(st.state["vram"], "resident")
        with t.pin(tier.VRAM, tier.READ) as g:  # emulated VRAM: host memory, a ptr
            self.assertEqual(g.tier, tier.VRAM)
            self.assertIsNotNone(g.ptr)
            self.assertEqual(g.memoryview().tobytes(), pattern(2 * MiB, 9))
        self.assertEqual(int(tier.Fence(c, 0)), 0)
        self.assertTrue(tier.Fence(c, 0).done())
        t.destroy()

    def test_fence_timeouts(self) -> None:
        # the emulated host<->VRAM link is throttled to 32M/s: 16M takes half a second
        c = self.client()
        t = c.create("t", 16 * MiB)
        u = c.create("u", 8 * MiB)
        t.prefetch(tier.HOST)
        u.prefetch(tier.HOST)
        t_issue = time.monotonic()
        f = t.prefetch_async(tier.VRAM)
        # the throttle ends the copy 0.5 s after it began at the earliest: not done before then
        # (done() is read first, the clock after it)
        done = f.done()
        self.assertTrue(not done or time.monotonic() - t_issue >= 0.5)
        t0 = time.monotonic()
        with self.assertRaises(tier.TimedOutError) as cm:
            f.wait(timeout=0.05)
        done = f.done()
        now = time.monotonic()
        # it waited its timeout (libtier counts whole milliseconds), and timed out for real
        self.assertGreaterEqual(now - t0, 0.049)
        self.assertTrue(not done or now - t_issue >= 0.5)
        self.assertEqual(cm.exception.errno, errno.ETIMEDOUT)
        self.assertIn("not done after", cm.exception.strerror)
        with self.assertRaises(tier.TimedOutError):
            c.wait([f], timeout=0)
        f.wait(timeout=10)
        self.assertTrue(f.done())
        # several at once: one deadline for all
        t.evict(tier.HOST)
        fs = [t.prefetch_async(tier.VRAM), u.evict_async(tier.NVME)]
        with self.assertRaises(tier.TimedOutError):
            c.wait(fs, timeout=0.02)
        c.wait(fs, timeout=10)
        self.assertTrue(all(x.done() for x in fs))
        # an infinite timeout waits as None does (it raised OverflowError)
        c.wait(t.evict_async(tier.HOST), float("inf"))
        t.prefetch_async(tier.VRAM).wait(timeout=float("inf"))
        self.assertEqual(t.stat().state["vram"], "resident")
        # tier_fence_stream_wait() without a device event waits on the host
        g, f = t.pin_async(tier.HOST)
        f.stream_wait(None)
        self.assertTrue(f.done())
        g.unpin()
        for x in (t, u):
            x.destroy()

    def test_process_and_fileno(self) -> None:
        c = self.client()
        c.process()  # nothing pending
        t = c.create("t", 4096)
        f = t.prefetch_async(tier.HOST)
        # a fence completes through the fence page and its eventfd, not the socket: tierd sent this
        # connection nothing unasked, so fileno() is not readable and process() has nothing to do
        r, _, _ = select.select([c.fileno()], [], [], 0)
        self.assertEqual(r, [])
        c.process()
        self.assertEqual(c.last_error, "")
        f.wait(5)
        self.assertTrue(f.done())
        self.assertEqual(t.stat().state["host"], "resident")
        t.destroy()

    def test_status(self) -> None:
        c = self.client()
        t = c.create("t", 1 * MiB)
        s = c.status()
        self.assertEqual(
            set(s), {"version", "uptime_s", "connections", "policy", "tiers", "links", "targets", "sched", "jobs"}
        )
        jobs = {j["name"]: j for j in s["jobs"]}
        self.assertIn(c.job, jobs)
        self.assertEqual(jobs[c.job]["tensors"], 1)
        self.assertEqual(set(jobs[c.job]["moved"]), set(tier.LINKS))
        prom = c.status_prometheus()
        self.assertIn("# TYPE tierd_job_used_bytes gauge\n", prom)
        self.assertIn('tierd_job_tensors{job_name="%s"} 1\n' % c.job, prom)
        table = c.status_table()
        self.assertIn("VRAM is EMULATED", table)
        self.assertIn(c.job, table)
        t.destroy()

    def test_control_connection(self) -> None:
        c = self.client("")
        self.assertEqual(c.job, "")
        self.assertIn("jobs", c.status())
        with self.assertRaises(tier.PermissionDeniedError) as cm:
            c.create("t", 4096)
        self.assertIn("control connection", cm.exception.strerror)
        with self.assertRaises(ValueError):
            c.set_quota(host=1 * MiB)
        with self.assertRaises(tier.PermissionDeniedError):
            c.plan()

    def test_quota(self) -> None:
        c = self.client("quota-job")
        q = c.quota()
        self.assertEqual(dict(q.limits), {"vram": 16 * MiB, "host": 48 * MiB, "nvme": 2 << 30})
        self.assertEqual(q.limits[tier.HOST], 48 * MiB)
        self.assertEqual(q.weight, 1)
        self.assertTrue(q.running)                  # (it said False: quota() filled limits and weight only)
        self.assertEqual(q, c.get_quota())
        self.assertEqual(c.quota("quota-job"), q)
        with self.assertRaises(tier.NotFoundError):
            c.quota("no-such-job")
        admin = os.geteuid() == 0  # (or group tier-admin, which test machines lack)
        if admin:
            c.set_quota(host=32 * MiB, weight=5)
            q = c.quota()
            self.assertEqual((q.limits["host"], q.limits["vram"], q.weight), (32 * MiB, 16 * MiB, 5))
            ctl = self.client("")
            ctl.set_quota("quota-job", vram=8 * MiB)
            self.assertEqual(c.quota().limits["vram"], 8 * MiB)
            # a job name that does not run gets a quota of its own, for when it starts
            q = ctl.set_quota("not-yet", vram=8 * MiB, host_min=2 * MiB)
            self.assertFalse(q.running)
            self.assertEqual((q.limits["vram"], q.minimums["host"]), (8 * MiB, 2 * MiB))
            self.assertEqual(q.sources["vram"], "job 'not-yet'")
            self.assertEqual(q.sources["host"], "default")
            self.assertEqual(ctl.get_quota("not-yet"), q)
            # a uid's quota, and where a job's values come from
            q = ctl.set_quota(uid=os.geteuid(), nvme=64 * MiB, weight=2)
            self.assertEqual(q.sources["nvme"], f"uid {os.geteuid()}")
            q = c.get_quota()
            self.assertTrue(q.running)
            self.assertEqual(q.limits["nvme"], 64 * MiB)
            self.assertEqual(q.weight, 5)  # the job's own (set above) wins over its uid's
            self.assertEqual(q.sources["weight"], "job 'quota-job'")
            self.assertEqual(q.minimums["vram"], 0)
            with self.assertRaises(tier.TierError) as cm:
                ctl.set_quota("not-yet", host=1 << 50)
            self.assertIn("above the host tier's capacity", cm.exception.strerror)
            q = ctl.set_quota("not-yet", clear=True)
            with self.assertRaises(tier.NotFoundError):
                ctl.get_quota("not-yet")
            with self.assertRaises(ValueError):
                ctl.set_quota("x", uid=0, weight=1)
        else:
            with self.assertRaises(tier.PermissionDeniedError) as cm:
                c.set_quota(host=32 * MiB)
            self.assertIn("tier-admin", cm.exception.strerror)


class TestErrors(tierd.DaemonTestCase):
    """Each failure as its exception class, with tierd's text."""

    def test_not_found_exists_busy(self) -> None:
        c = self.client()
        with self.assertRaises(tier.NotFoundError) as cm:
            c.open("nope")
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        self.assertIn("no tensor 'nope'", cm.exception.strerror)
        self.assertEqual(cm.exception.operation, "open 'nope'")
        t = c.create("t", 4096)
        with self.assertRaises(tier.ExistsError) as cm:
            c.create("t", 4096)
        self.assertEqual(cm.exception.errno, errno.EEXIST)
        g = t.pin(tier.HOST)
        with self.assertRaises(tier.BusyError) as cm:
            t.destroy()
        self.assertEqual(cm.exception.errno, errno.EBUSY)
        self.assertFalse(t.closed)  # the handle stays on failure
        g.unpin()
        t.destroy()

    def test_too_large_and_quota(self) -> None:
        c = self.client()
        with self.assertRaises(tier.TooLargeError) as cm:
            c.create("huge", 49 * MiB)  # above both host (48M) and VRAM (16M) tensor_max
        self.assertEqual(cm.exception.errno, errno.EFBIG)
        big = c.create("big", 40 * MiB)
        with self.assertRaises(tier.TooLargeError) as cm:
            big.pin(tier.VRAM)  # the whole VRAM tier is 32M
        self.assertIn("larger than the whole vram tier", cm.exception.strerror)
        big.destroy()
        over = c.create("over", 20 * MiB)
        with self.assertRaises(tier.QuotaError) as cm:
            over.pin(tier.VRAM)  # the job may have 16M there
        self.assertEqual(cm.exception.errno, errno.EDQUOT)
        self.assertIn("may use in vram", cm.exception.strerror)
        over.destroy()

    def test_no_space_and_retry_later(self) -> None:
        c = self.client("space-a")
        ts = [c.create(f"s{i}", 16 * MiB) for i in range(3)]
        gs = [t.pin(tier.HOST) for t in ts]
        more = c.create("more", 4 * MiB)
        with self.assertRaises(tier.NoSpaceError) as cm:
            more.pin(tier.HOST)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertIn("is at its host limit", cm.exception.strerror)
        self.assertIn("pinned", str(cm.exception))
        # job a holds 3 of the pool's 4 segments; b gets the last one, then no more
        b = self.client("space-b")
        b0, b1 = b.create("b0", 16 * MiB), b.create("b1", 16 * MiB)
        gb = b0.pin(tier.HOST)
        with self.assertRaises(tier.RetryLaterError) as cm:
            b1.pin(tier.HOST)
        self.assertEqual(cm.exception.errno, errno.EAGAIN)
        self.assertIn("has no segment left for job 'space-b'", cm.exception.strerror)
        self.assertIn("'space-a'", cm.exception.strerror)
        gb.unpin()
        for g in gs:
            g.unpin()
        for t in ts + [more, b0, b1]:
            t.destroy()

    def test_cuda_calls_without_cuda(self) -> None:
        c = self.client()
        t = c.create("t", 4096)
        g = t.pin(tier.VRAM)
        with self.assertRaises(tier.TierError) as cm:
            t.unpin_after(tier.VRAM, True, 0)
        self.assertEqual(cm.exception.errno, errno.EOPNOTSUPP)
        self.assertIn("not cuda", cm.exception.strerror)
        self.assertTrue(g.pinned)  # the pin is kept on failure
        with self.assertRaises(AttributeError):
            g.__cuda_array_interface__
        self.assertFalse(hasattr(g, "__cuda_array_interface__"))
        t.unpin(tier.VRAM)
        self.assertFalse(g.pinned)
        if not os.environ.get("TIER_LIBCUDA"):
            h = c.create("h", 4096)
            gh = h.pin(tier.HOST)  # the one host segment this client maps
            try:
                n = c.register_cuda_host()
            except tier.TierError as e:  # no CUDA driver in this process
                self.assertEqual(e.errno, errno.ENODEV)
            else:  # a machine with a CUDA driver: gh's segment is registered, once
                self.assertEqual(n, 1)
                self.assertEqual(c.register_cuda_host(), 0)
            gh.unpin()
            h.destroy()
        t.destroy()


MANY_SEGMENTS = """\
[daemon]
linger_sec = 0
[host]
capacity = 128M
segment_size = 1M
job_limit = 128M
[vram]
backend = emulated
capacity = 8M
chunk_size = 2M
[nvme]
target = @DIR@/t0.img:256M
extent_size = 1M
"""


class TestLifetime(tierd.DaemonTestCase):
    def child(self, *parts: str, args: tuple[str, ...] = ()) -> str:
        r = run_child(self.socket, *parts, args=args)
        self.assertNotEqual(r.returncode, -signal.SIGSEGV, f"the child crashed:\n{r.stdout}{r.stderr}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_memoryview_of_collected_grant(self) -> None:
        """A memoryview kept, its Tensor and Grant (a cycle) dropped: the cyclic GC closed the handle,
        or the Client with it, and unmapped the memory under the live memoryview (SIGSEGV); now the
        Client keeps a pinned Grant and its Tensor, and invalidates them before any unmapping."""
        made = """
            def view(name, size):
                t = c.create(name, size)
                return t.pin(tier.HOST).memoryview()
            mv = view("big", 32 * MiB)    # two 16M segments: one range the handle maps
            mv[0] = 7
            gc.collect()
        """
        def read(what: str) -> str:
            return f"""
            try:
                print("{what}", mv[0], mv[-1])
            except ValueError:
                print("{what} released")
            """
        self.assertEqual(self.child(made, read("gc")), "gc 7 0\n")
        self.assertEqual(self.child(made, "c.close()\n", read("close")), "close released\n")
        # the memoryview holds its Grant, and so its Tensor and Client (test_objects): nothing unmapped
        self.assertEqual(self.child(made, "del c\ngc.collect()\n", read("client gc")), "client gc 7 0\n")


    def test_fork_child_refused(self) -> None:
        """A child of fork() using the parent's Client shared its connection: it got the parent's
        replies (EPROTO) or took them, and the parent hung; now the child finds every Client of the
        parent, its Tensors and grants dropped (the parent's connection untouched) and told to make
        its own."""
        out = self.child("""
            import os
            t = c.create("t", MiB)
            g = t.pin(tier.HOST)
            mv = g.memoryview()
            mv[0] = 5
            pid = os.fork()
            if pid == 0:
                lines = []
                for what, call in (("client", c.status), ("tensor", t.stat), ("grant", g.memoryview)):
                    try:
                        call()
                        lines.append(f"{what} used")
                    except tier.TierError as e:
                        lines.append(f"{what} refused" if "fork()" in str(e) else f"{what} {e}")
                lines.append(f"grant pinned {g.pinned}")
                c.close()                          # nothing to do, nothing sent
                with tier.Client("child", socket=sys.argv[1]) as d:
                    lines.append(f"own client {d.open('t').size}")
                os.write(1, ("\\n".join(lines) + "\\n").encode())
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            for _ in range(20):
                t.stat()
            print("parent", status, mv[0], t.stat().pins["host"])
        """, args=(self.socket,))
        self.assertEqual(out, "client refused\ntensor refused\ngrant refused\ngrant pinned False\n"
                              f"own client {MiB}\nparent 0 5 1\n")

    def test_collected_handles_freed_by_the_clients_thread(self) -> None:
        """A Tensor (or Plan) collected by the GC in another thread freed its handle there, into the
        client another thread may be inside of (libtier: one thread per client at a time); now the
        handle waits for the client's next call, in the thread that uses it."""
        c = self.client()
        lib = tier._base._L
        calls: list[str] = []
        for name in ("tier_tensor_close", "tier_plan_free"):
            real = getattr(lib, name)
            self.addCleanup(setattr, lib, name, real)

            def spy(h: int, real=real, name=name) -> None:
                calls.append(f"{name} in {threading.current_thread().name}")
                real(h)
            setattr(lib, name, spy)
        gc.disable()
        self.addCleanup(gc.enable)
        t = c.create("t", 4096)
        p = c.plan()
        t.me, p.me = t, p  # cycles: only the GC frees them
        del t, p
        collector = threading.Thread(target=gc.collect, name="collector")
        collector.start()
        collector.join()
        self.assertEqual(calls, [])
        c.moved()
        self.assertEqual(sorted(calls), ["tier_plan_free in MainThread", "tier_tensor_close in MainThread"])
        c.open("t").destroy()


class TestRestart(tierd.DaemonTestCase):
    config = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300")  # the job waits for the client

    def test_old_fence_keeps_new_grants(self) -> None:
        """A fence of before a restart fails with RestartedError at every check; each such check took
        the restart for a new one and invalidated the grants taken since (their unpin() did nothing:
        the pin leaked, a dirty one was never sent); now only a restart counted by restarts is."""
        c = tier.Client("restart", socket=self.socket, reconnect=30)
        self.addCleanup(c.close)
        t = c.create("t", MiB)
        t.evict(tier.NVME)
        old, fence = t.pin_async(tier.HOST, tier.READ)
        old_mv = old.memoryview()
        self.assertEqual(self.d.restart(), 0)
        with self.assertRaises(tier.RestartedError):
            t.stat()
        self.assertEqual(c.restarts, 1)
        self.assertFalse(old.pinned)
        with self.assertRaises(ValueError):
            old_mv[0]
        g = t.pin(tier.HOST)
        mv = g.memoryview()
        for check in (fence.done, fence.wait):
            with self.assertRaises(tier.RestartedError):
                check()
        self.assertTrue(g.pinned)
        mv[0:4] = b"new!"
        g.unpin()
        st = t.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (0, True))
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[0:4]), b"new!")
        t.destroy()

    def test_failed_attempt_leaves_no_mapping(self) -> None:
        """A reconnect attempt whose Hello worked but whose Open failed kept the segments it mapped; the
        next tierd's of the same id and generation were taken as mapped already: the client wrote u into
        the dead tierd's memfd.  tierd 2 refuses the Open (max_name), tierd 3 starts with no memory."""
        d = tierd.Tierd(self.config, fd_store=True)
        self.addCleanup(d.cleanup)
        d.start()
        c = tier.Client("attempt", socket=d.socket, reconnect=30)
        self.addCleanup(c.close)
        t = c.create("a-name-longer-than-sixteen", MiB)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:] = b"1" * MiB
        with open(d.config, "w") as f:
            f.write(self.config.replace("[host]", "max_name = 16\n[host]", 1).replace("@DIR@", d.dir))
        d.kill_and_start()
        mark, err = len(d.log_text()), []

        def stat() -> None:
            try:
                t.stat()
            except tier.TierError as e:
                err.append(e)
        th = threading.Thread(target=stat)
        th.start()
        deadline = time.monotonic() + 20
        while "has no connection left" not in d.log_text()[mark:] and time.monotonic() < deadline:
            time.sleep(0.02)    # an attempt said Hello (and mapped tierd 2's segments), then its Open failed
        d.kill()
        with d._store_lock:
            for _, fd in d.stored:
                os.close(fd)
            d.stored = []
        with open(d.config, "w") as f:
            f.write(self.config.replace("@DIR@", d.dir))
        d.start()
        th.join(60)
        self.assertEqual([type(e) for e in err], [tier.RestartedError], err)
        u = c.create("u", MiB)
        with u.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:] = b"3" * MiB
        with tier.Client("attempt", 1, socket=d.socket) as c2, c2.open("u").pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[:4]), b"3333")


class TestFaults(tierd.DaemonTestCase):
    """Requests that fail in tierd (TIERD_TEST_FAULTS): the first NVMe read of each job named here fails, and its retry."""

    FAULTS = ("nvme-read-eio:job=failed-async-pin,count=2;nvme-read-eio:job=unchecked-async-pin,count=2;"
              "nvme-read-eio:job=closed-async-pin,count=2;nvme-bitflip:job=crc-mismatch,count=1")

    @classmethod
    def setUpClass(cls) -> None:
        old = os.environ.get("TIERD_TEST_FAULTS")
        os.environ["TIERD_TEST_FAULTS"] = cls.FAULTS
        try:
            super().setUpClass()
        finally:
            if old is None:
                del os.environ["TIERD_TEST_FAULTS"]
            else:
                os.environ["TIERD_TEST_FAULTS"] = old

    def written(self, c: tier.Client, name: str, seed: int) -> tier.Tensor:
        """A tensor of @c holding pattern(MiB, @seed) on NVMe only: a pin in host reads it."""
        t = c.create(name, MiB)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:] = pattern(MiB, seed)
        t.evict(tier.NVME)
        return t

    def test_failed_async_pin_forgets_its_grant(self) -> None:
        """A pin_async whose fence failed (tierd holds no pin) left its Grant pinned in the client,
        keeping the Tensor alive; its unpin() then unpinned, clean, the pin taken next (a write),
        and a failed unpin (ENOENT) put the Grant back.  Now the failed fence invalidates and
        forgets the Grant: its unpin() does nothing."""
        c = self.client("failed-async-pin")
        t = self.written(c, "t", 1)
        g, f = t.pin_async(tier.HOST, tier.READ)
        mv = g.memoryview()
        with self.assertRaises(tier.TierError) as cm:
            f.wait(30)
        self.assertEqual(cm.exception.errno, errno.EIO)
        self.assertEqual(t.stat().pins["host"], 0)
        self.assertFalse(g.pinned)
        with self.assertRaises(ValueError):
            mv[0]
        w = t.pin(tier.HOST, tier.READ_WRITE)  # the read works now (count=2: the read and its retry failed)
        self.assertEqual(bytes(w.memoryview()[:4096]), pattern(MiB, 1)[:4096])
        w.memoryview()[:4] = b"new!"
        g.unpin()  # nothing to do: it sent the write pin's unpin, clean
        st = t.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (1, False))
        t.unpin(tier.HOST)  # the write pin's: dirty
        st = t.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (0, True))
        t.evict(tier.NVME)
        with t.pin(tier.HOST, tier.READ) as r:
            self.assertEqual(bytes(r.memoryview()[:4]), b"new!")
        ref = weakref.ref(t)
        del t, g, f, w, r
        gc.collect()
        self.assertIsNone(ref(), "the failed pin's grant kept its Tensor")

    def test_unpin_of_a_pin_tierd_does_not_hold(self) -> None:
        """An unpin that fails with ENOENT (tierd holds no such pin: here the fence of a failed
        pin_async checked through another Fence object, so the Grant never heard of it) put the
        Grant back, pinned for ever; now it stays unpinned and forgotten."""
        c = self.client("unchecked-async-pin")
        t = self.written(c, "t", 2)
        g, f = t.pin_async(tier.HOST, tier.READ)
        with self.assertRaises(tier.TierError):
            tier.Fence(c, f.value).wait(30)  # knows no Grant
        self.assertTrue(g.pinned)
        with self.assertRaises(tier.NotFoundError):
            g.unpin()
        self.assertFalse(g.pinned)
        g.unpin()  # forgotten: nothing to do
        w = t.pin(tier.HOST, tier.WRITE)
        w.memoryview()[:4] = b"last"
        t.unpin(tier.HOST)  # the write pin's, not the failed one's
        st = t.stat()
        self.assertEqual((st.pins["host"], st.dirty["host"]), (0, True))
        t.destroy()


    def test_failed_async_pin_of_a_closed_handle(self) -> None:
        """A handle closed while its pin_async is under way keeps what the unpin needs of the pin;
        when the fence then fails (tierd holds no pin) that goes too."""
        c = self.client("closed-async-pin")
        t = self.written(c, "t", 3)
        g, f = t.pin_async(tier.HOST, tier.READ)
        t.close()
        self.assertFalse(g.pinned)
        self.assertIn("t", c._grants)  # the pin is the connection's: its unpin is clean
        with self.assertRaises(tier.TierError):
            f.wait(30)
        self.assertNotIn("t", c._grants)
        t2 = c.open("t")
        with self.assertRaises(tier.NotFoundError):
            t2.unpin(tier.HOST)
        self.assertNotIn("t", c._grants)
        t2.destroy()


    def test_crc_mismatch_is_no_connection_gone(self) -> None:
        """A crc32c mismatch reading NVMe back (a tierd of before EIO for it sends EBADMSG, on a
        connection that works on) raised ShutdownError, as if the connection were gone; now only
        an EBADMSG that leaves the connection unusable does."""
        c = self.client("crc-mismatch")
        t = self.written(c, "t", 5)
        with self.assertRaises(tier.TierError) as cm:
            t.pin(tier.HOST, tier.READ)
        self.assertNotIsInstance(cm.exception, tier.ShutdownError)
        self.assertIn("crc32c", cm.exception.strerror)
        self.assertEqual(t.stat().pins["host"], 0)  # the connection works on
        t.destroy()


def stub_lib(module: object, name: str, r: int) -> object:
    """Make @module's libtier function @name return @r (the others as they are); returns the real
    library, to be put back with ``module._L = real``."""
    real = module._L

    class Stub:
        def __getattr__(self, attr: str) -> object:
            return (lambda *args: r) if attr == name else getattr(real, attr)

    module._L = Stub()
    return real


class TestBadMessage(tierd.DaemonTestCase):
    def test_bad_message_on_a_working_connection(self) -> None:
        """EBADMSG raised ShutdownError whatever the connection's state; a connection that works on
        (libtier does not call it broken) gives a plain TierError."""
        c = self.client()
        t = c.create("t", 4096)
        real = stub_lib(tier._tensor, "tier_tensor_stat", -errno.EBADMSG)
        try:
            with self.assertRaises(tier.TierError) as cm:
                t.stat()
        finally:
            tier._tensor._L = real
        self.assertNotIsInstance(cm.exception, tier.ShutdownError)
        self.assertEqual(cm.exception.errno, errno.EBADMSG)
        self.assertEqual(t.stat().size, 4096)
        self.assertIs(tier.errors.error_class(-errno.EBADMSG), tier.ShutdownError)  # no client to ask
        t.destroy()


class TestManySegments(tierd.DaemonTestCase):
    config = MANY_SEGMENTS

    def test_late_segment_of_a_crowded_job(self) -> None:
        """A second rank joins a job holding 110 segments and pins the tensor in the last one: the segment
        it asks for comes first in the reply (each reply carries 16 fds; the one asked for came only in
        list order, after all the others, and the pin failed with EPROTO, "tierd granted segment ...
        which it did not send")."""
        a = self.client("crowded", 0)
        ts = [a.create(f"t{i}", 1 * MiB) for i in range(110)]
        for i, t in enumerate(ts):
            g = t.pin(tier.HOST)
            g.memoryview()[:] = pattern(1 * MiB, i)
        b = self.client("crowded", 1)
        t = b.open("t109")
        with t.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()), pattern(1 * MiB, 109))


class TestLargeTensor(tierd.DaemonTestCase):
    def test_spanning_segments_is_one_range(self) -> None:
        c = self.client()
        seg = c.segment_size(tier.HOST)
        size = seg + seg // 2  # 24M over 16M segments: a whole segment and a tail
        t = c.create("large", size)
        data = pattern(size, 3)
        with t.pin(tier.HOST) as g:
            self.assertEqual(g.length, size)
            mv = g.memoryview()
            self.assertEqual(len(mv), size)
            mv[:] = data
            mv[size - 1] = 0xAB  # the last byte, in the second segment
        t.evict(tier.NVME)
        self.assertEqual(t.stat().state["host"], "absent")
        with t.pin(tier.HOST, tier.READ) as g:
            got = g.memoryview()
            self.assertEqual(got[size - 1], 0xAB)
            self.assertEqual(got[: size - 1].tobytes(), data[: size - 1])
        t.destroy()


if __name__ == "__main__":
    tierd.main()
