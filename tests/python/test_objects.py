#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The binding's objects as Python objects: what a view keeps alive, copy and pickle, who may
construct them, which numbers they take."""

from __future__ import annotations

import importlib.util
import signal

import tierd

import tier
from test_client import run_child


class TestObjects(tierd.DaemonTestCase):
    def child(self, *parts: str) -> str:
        """Run @parts in a fresh interpreter (``run_child``): a crash there fails this test only."""
        r = run_child(self.socket, *parts)
        self.assertNotEqual(r.returncode, -signal.SIGSEGV, f"the child crashed:\n{r.stdout}{r.stderr}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_arrays_keep_their_client(self) -> None:
        """A numpy array or torch tensor of a grant kept, everything else dropped (a newcomer's
        ``return g.numpy()`` from the function that made the Client): the Client, Tensor and Grant
        are a cycle, the cyclic GC closed the Client, libtier unmapped the memory and the next read
        of the array killed the interpreter (SIGSEGV).  Now an array (and a memoryview) holds its
        Grant, and through it the Tensor and the Client, as any exporter of a buffer is held."""
        for view in ("numpy('float32')", "torch('float32')", "memoryview().cast('f')"):
            with self.subTest(view=view):
                module = view.split("(")[0]
                if module != "memoryview" and importlib.util.find_spec(module) is None:
                    self.skipTest(f"no {module}")
                out = self.child(f"""
                    del c
                    def load():
                        c = tier.Client("arrays", socket={self.socket!r})
                        t = c.create("big", 32 * MiB)   # two 16M segments: one range the handle maps
                        a = t.pin(tier.HOST).{view}
                        a[0] = 1.5
                        a[-1] = 2.5
                        return a
                    a = load()
                    gc.collect()
                    print(float(a[0]), float(a[-1]))
                """)
                self.assertEqual(out, "1.5 2.5\n")

    def test_copy_and_pickle_refused(self) -> None:
        """copy.copy() of a Client or a Tensor made a second Python object owning the same libtier
        handle: both freed it (SIGSEGV, or glibc's "double free" abort); a copied Grant unpinned twice
        (NotFoundError for the pin the copy had dropped), and pickle said "cannot pickle
        '_thread.RLock' object".  Now copying or pickling a Client, Tensor, Grant, Plan or Fence raises
        TypeError saying what to do, and nothing is freed."""
        out = self.child("""
            import copy, pickle
            t = c.create("t", MiB)
            g, f = t.pin_async(tier.HOST)
            p = c.plan()
            for name, obj in (("Client", c), ("Tensor", t), ("Grant", g), ("Plan", p), ("Fence", f)):
                for how in (copy.copy, copy.deepcopy, pickle.dumps):
                    try:
                        how(obj)
                        print(name, how.__name__, "copied")
                    except TypeError as e:
                        assert f"a tier.{name} cannot be copied or pickled" in str(e), e
            gc.collect()
            f.wait()
            g.unpin()
            p.add(0, t, tier.HOST).submit()
            c.end_plan()
            print(t.stat().pins["host"])
            t.destroy()
            c.close()
            print("done")
        """)
        self.assertEqual(out, "0\ndone\n")

    def test_constructors_refuse_what_they_cannot_check(self) -> None:
        """tier.Tensor(client, handle) and tier.Grant(...) are public names whose constructors took
        a libtier pointer: a newcomer's ``tier.Tensor(c, "w")`` (or any int) crashed the interpreter
        (SIGSEGV in tier_tensor_name()); ``tier.Fence(c, 2**70)`` was fence 0 (ctypes wrapped the
        value), always done.  Now Tensor() and Grant() are made by the package only (TypeError
        naming the call to use), and a Fence's client and value are checked."""
        out = self.child("""
            for what, make in (("tensor str", lambda: tier.Tensor(c, "w")),
                               ("tensor int", lambda: tier.Tensor(c, 4096)),
                               ("grant", lambda: tier.Grant(None, None, tier.READ)),
                               ("fence big", lambda: tier.Fence(c, 1 << 70)),
                               ("fence str", lambda: tier.Fence(c, "1")),
                               ("fence client", lambda: tier.Fence("c", 1))):
                try:
                    make()
                    print(what, "made")
                except (TypeError, ValueError) as e:
                    print(what, type(e).__name__, "c.open(name)" in str(e) or "pin()" in str(e))
            gc.collect()
            print(tier.Fence(c, 0).done(), c.create("t", 16))
        """)
        self.assertEqual(out, "tensor str TypeError True\ntensor int TypeError True\ngrant TypeError True\n"
                         "fence big ValueError False\nfence str TypeError False\nfence client TypeError False\n"
                         "True <tier.Tensor 't' 16 bytes>\n")

    def test_numpy_integers_taken(self) -> None:
        """A size computed by numpy (``np.prod(shape) * 4`` is a numpy.int64, not an int) was refused
        ("tensor size must be an int, not int64"), and so were numpy tiers, modes, steps and
        timeouts; now every integral number is taken as the int it is (a bool, numpy's too, and a
        float still are not)."""
        try:
            import numpy as np
        except ImportError:
            self.skipTest("no numpy")
        c = tier.Client(self.id().rsplit(".", 1)[-1], np.int64(2), socket=self.socket, reconnect=np.float32(0))
        self.addCleanup(c.close)
        t = c.create("t", np.prod((4, 4)) * 4)
        self.assertEqual(t.size, 64)
        self.assertEqual((c.rank, type(c.rank)), (2, int))
        with t.pin(np.int32(1), np.uint8(3)) as g:
            self.assertEqual((g.tier, g.mode), (tier.HOST, tier.READ_WRITE))
        c.wait(t.evict_async(np.int64(2)), timeout=np.int64(5))
        t.prefetch_async("host").wait(np.float64(5.0))
        c.commit(np.uint64(7))
        self.assertEqual(c.rollback().step, 7)
        self.assertEqual(tier.strerror(np.int64(2)), tier.strerror(2))
        for bad in (np.bool_(True), np.float64(64.0), 64.0, True):
            with self.subTest(bad=bad), self.assertRaises(TypeError):
                c.create("u", bad)
        t.destroy()


if __name__ == "__main__":
    tierd.main()
