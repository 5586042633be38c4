#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""1000 cycles of create/open/close and pin/unpin: no fd, mapping or memory growth; tierd's RSS over 10,000 jobs."""

from __future__ import annotations

import ctypes
import gc
import os
import time
import tracemalloc
import unittest

import tierd

import tier

CYCLES = 1000
WARMUP = 50
SIZE = 256 * 1024


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def c_heap() -> int:
    """Bytes malloc()ed in the C heap (glibc's mallinfo2(): libtier's handles); 0 if unknown."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return 0
    f.restype = _Mallinfo2
    m = f()
    return m.uordblks + m.hblkhd


def sanitized() -> bool:
    """Does ASan run in this process (preloaded for an ASan build's libtier)?"""
    with open("/proc/self/maps") as f:
        return any("libasan" in line for line in f)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TestLeaks(tierd.DaemonTestCase):
    def cycle(self, c: tier.Client, i: int) -> None:
        t = c.create(f"t{i % 7}", SIZE)
        u = c.open(t.name)
        with t.pin(tier.HOST) as g:
            mv = g.memoryview()
            mv[:] = bytes([i & 0xFF]) * SIZE
        with u.pin(tier.HOST, tier.READ) as g:
            if g.memoryview()[SIZE - 1] != i & 0xFF:
                raise AssertionError(f"cycle {i}: wrong byte")
        g2, f = u.pin_async(tier.HOST, tier.READ)
        f.wait()
        u.unpin(tier.HOST)
        u.close()
        with c.tensor(t.name, SIZE) as v:  # open through tensor(), closed by the with block
            v.stat()
        t.destroy()
        if g2.pinned:
            raise AssertionError("a grant survived its unpin")
        try:
            mv[0]
        except ValueError:
            pass  # released at the unpin
        else:
            raise AssertionError("a memoryview survived its unpin")

    def test_cycles(self) -> None:
        c = self.client()
        for i in range(WARMUP):
            self.cycle(c, i)
        gc.collect()
        fd0, maps0, rss0, heap0 = fds(), mappings(), rss(), c_heap()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        for i in range(WARMUP, WARMUP + CYCLES):
            self.cycle(c, i)
        gc.collect()
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        fd1, maps1, rss1, heap1 = fds(), mappings(), rss(), c_heap()

        self.assertEqual(fd1, fd0, "file descriptors grew")
        self.assertLessEqual(maps1 - maps0, 4, "mappings grew")
        diff = snap1.compare_to(snap0, "filename")
        grown = sum(d.size_diff for d in diff if d.size_diff > 0)
        top = "\n".join(str(d) for d in diff[:5])
        self.assertLess(grown, 64 * 1024, f"Python memory grew by {grown} bytes:\n{top}")
        # a leaked mapping or copy per cycle would be 256 KiB x 1000 (under ASan, its
        # quarantine of freed memory, 256 MiB by default, grows the RSS: not checked there)
        if not sanitized():
            self.assertLess(rss1 - rss0, 16 << 20, f"RSS grew from {rss0 >> 10} to {rss1 >> 10} KiB")
        # libtier's handles and buffers (tracemalloc sees only Python's); 0 when unknown (ASan)
        if heap0 and heap1:
            self.assertLess(heap1 - heap0, 128 * 1024, f"the C heap grew from {heap0} to {heap1} bytes")
        self.assertEqual(len(c._tensors), 0)
        print(f"{CYCLES} cycles: fds {fd0} -> {fd1}, mappings {maps0} -> {maps1}, "
              f"RSS {rss0 >> 10} -> {rss1 >> 10} KiB, Python heap +{grown} bytes, C heap {heap0} -> {heap1}")

    def test_clients(self) -> None:
        # clients opened and dropped without close(): __del__ frees them
        gc.collect()
        fd0 = fds()
        for i in range(100):
            c = tier.Client("leak-clients", rank=i, socket=self.socket)
            t = c.create(f"t{i}", 4096)
            t.pin(tier.HOST)
            del c, t  # the Tensor keeps the Client; both go together
        gc.collect()
        self.assertEqual(fds(), fd0)


def tierd_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class TestJobChurn(unittest.TestCase):
    """10,000 jobs, a thousand connected at once: tierd's RSS after them is within 2 MiB of after the first
    thousand (each connection's 64 KiB receive buffer once fragmented the heap: +10-17 MiB)."""

    ROUNDS, BATCH = 10000, 1000

    def test_rss_after_10000_jobs(self) -> None:
        if os.environ.get("TIER_TIERD_ASAN_OPTIONS"):
            self.skipTest("tierd under ASan: its quarantine of freed memory grows the RSS")
        why = tierd.can_lock_memory(tierd.HOST_CAPACITY)
        if why:
            self.skipTest(why)
        # meson's MALLOC_PERTURB_ fills every block malloc hands out: the whole heap would be resident
        # from the start and its growth, which is pages first touched, would not show
        perturb = os.environ.pop("MALLOC_PERTURB_", None)
        if perturb is not None:
            self.addCleanup(os.environ.__setitem__, "MALLOC_PERTURB_", perturb)
        config = tierd.CONFIG.replace("[daemon]\n", "[daemon]\nmax_connections = 4096\n"
                                      "max_connections_per_uid = 4096\n")
        with tierd.Tierd(config, log_level="info") as d:
            assert d.proc is not None
            ctl = tier.Client("", socket=d.socket)
            base = None
            for first in range(0, self.ROUNDS, self.BATCH):
                clients = []
                for i in range(first, first + self.BATCH):
                    c = tier.Client(f"churn-{i}", socket=d.socket)
                    c.create("a", 256 << 10)
                    c.create(f"b{i % 5}", 64 << 10).destroy()
                    clients.append(c)
                for c in clients:
                    c.close()
                # the jobs are gone once tierd has seen every hang-up (linger_sec = 0): wait for that
                for _ in range(6000):
                    if not ctl.status().get("jobs"):
                        break
                    time.sleep(0.01)
                else:
                    raise AssertionError(f"jobs left after round {first}: {ctl.status().get('jobs')}")
                kib = tierd_rss_kib(d.proc.pid)
                if base is None:
                    base = kib
            ctl.close()
            print(f"tierd VmRSS after {self.BATCH} jobs {base} KiB, after {self.ROUNDS} {kib} KiB "
                  f"({kib - base:+d} KiB)")
            self.assertLessEqual(kib - base, 2048, f"tierd's RSS grew from {base} to {kib} KiB")


if __name__ == "__main__":
    tierd.main()
