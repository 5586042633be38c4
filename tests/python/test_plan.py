#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Iteration plans through tier.Plan: submit, phase, phase_grant, phase_stall; refusals."""

from __future__ import annotations

import errno
import faulthandler
import threading
import time
import unittest

import tierd
from tierd import MiB

import tier

SIZE = 1 * MiB
PH_FWD, PH_BWD, PH_OPT = 0, 1, 2


class TestPlan(tierd.DaemonTestCase):
    def test_training_steps(self) -> None:
        c = self.client()
        w = c.create("w", SIZE)
        grad = c.create("grad", SIZE)
        with c.plan() as p:
            p.add(PH_FWD, w, tier.VRAM, tier.READ)
            p.add(PH_BWD, w, "vram", tier.READ)
            p.add(PH_BWD, grad, tier.VRAM, tier.WRITE)
            p.add(PH_OPT, grad, tier.HOST, tier.READ)
            p.add(PH_OPT, w, tier.HOST)  # READ_WRITE
            self.assertFalse(p.submitted)
            p.submit()
            self.assertTrue(p.submitted)
            self.assertIn("submitted", repr(p))
            with self.assertRaises(tier.TierError) as cm:
                p.add(PH_FWD, w, tier.VRAM)
            self.assertEqual(cm.exception.errno, errno.EBADF)

        # tier_phase_stall(): seconds waited in tier_phase_enter() so far, sampled after every phase
        stalls = [c.phase_stall]
        t0 = time.monotonic()
        for step in range(3):
            c.phase(PH_FWD)
            stalls.append(c.phase_stall)
            g = c.phase_grant(w, tier.VRAM)
            self.assertTrue(g.phase)
            self.assertEqual((g.tier, g.length, g.mode), (tier.VRAM, SIZE, tier.READ))
            fwd_view = g.memoryview()
            self.assertEqual(fwd_view.tobytes(), bytes([step]) * SIZE, f"step {step}: w in VRAM")

            c.phase(PH_BWD)
            stalls.append(c.phase_stall)
            with self.assertRaises(ValueError):
                fwd_view[0]  # the phase is over: its grants' views are released
            self.assertFalse(g.pinned)
            with self.assertRaises(tier.TierError):
                g.memoryview()
            with c.phase_grant(grad, tier.VRAM) as gg:
                self.assertEqual(gg.mode, tier.WRITE)
                gg.memoryview()[:] = bytes([100 + step]) * SIZE
            self.assertFalse(gg.pinned)  # the with block only invalidates a phase grant

            c.phase(PH_OPT)
            stalls.append(c.phase_stall)
            gh = c.phase_grant(grad, tier.HOST)
            self.assertEqual(gh.mode, tier.READ)
            self.assertEqual(gh.memoryview().tobytes(), bytes([100 + step]) * SIZE)
            wh = c.phase_grant(w, tier.HOST)
            self.assertEqual(wh.mode, tier.READ_WRITE)
            wh.memoryview()[:] = bytes([step + 1]) * SIZE
            self.assertEqual(w.stat().pins["host"], 1)

        c.phase(PH_FWD)
        stall = c.phase_stall
        elapsed = time.monotonic() - t0
        stalls.append(stall)
        self.assertEqual(c.phase_grant(w, tier.VRAM).memoryview()[SIZE - 1], 3)
        self.assertIsInstance(stall, float)
        # a running total: it never goes back, and it is part of the time the phases took
        self.assertEqual(stalls, sorted(stalls))
        self.assertLessEqual(stall, elapsed)
        # the job's books: what moved for the plan
        moved = c.moved()
        self.assertGreater(moved["host->vram"], 0)
        self.assertGreater(moved["vram->host"], 0)
        plans = [j["plans"] for j in c.status()["jobs"] if j["name"] == c.job][0]
        self.assertEqual(len(plans), 1)
        # a planned tensor cannot be destroyed
        with self.assertRaises(tier.BusyError) as cm:
            w.destroy()
        self.assertIn("plan", cm.exception.strerror)
        with self.assertRaises(tier.TierError) as cm:
            c.phase(7)
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn("not in the plan", cm.exception.strerror)

        # ended: the tensors may go, another plan may come
        c.end_plan()
        with self.assertRaises(tier.NotFoundError):
            c.end_plan()
        with self.assertRaises(tier.TierError):
            c.phase(PH_FWD)
        with c.plan() as p:
            p.add(0, w, tier.HOST, tier.READ)
            p.submit()
        c.phase(0)
        self.assertEqual(c.phase_grant(w, tier.HOST).memoryview()[0], 3)
        c.end_plan()
        w.destroy()
        grad.destroy()

    def test_phase_grant_unpin_dirty(self) -> None:
        """unpin(dirty=True) of a phase grant did nothing: the plan releases the pin, as written only where the
        phase's access has WRITE, so what a READ access's grant was said to have written was not kept, and
        nothing said so.  It is refused (the grant as it was), saying how to plan the write; a grant of a
        WRITE access takes it (the plan releases it written)."""
        c = self.client()
        w = c.create("w", SIZE)
        out = c.create("out", SIZE)
        with c.plan() as p:
            p.add(0, w, tier.HOST, tier.READ)
            p.add(0, out, tier.HOST, tier.WRITE)
            p.submit()
        c.phase(0)
        g = c.phase_grant(w, tier.HOST)
        view = g.memoryview()
        with self.assertRaisesRegex(ValueError, r"'w' in host is a phase grant of a READ access.*READ_WRITE"):
            g.unpin(dirty=True)
        self.assertTrue(g.pinned)
        self.assertEqual(view[0], 0)                # its views stay
        g.dirty = True
        with self.assertRaisesRegex(ValueError, r"phase grant of a READ access"):
            with g:
                pass
        self.assertTrue(g.pinned)
        g.dirty = False
        g.unpin()                                   # clean, as the plan releases it: invalidated
        self.assertFalse(g.pinned)
        with c.phase_grant(out, tier.HOST) as go:
            go.memoryview()[:] = b"\x05" * SIZE
            go.unpin(dirty=True)
        self.assertFalse(go.pinned)
        c.end_plan()
        with out.pin(tier.HOST, tier.READ) as r:
            self.assertEqual(r.memoryview()[SIZE - 1], 5)

    def test_refused_plans(self) -> None:
        c = self.client()
        with self.assertRaises(tier.TierError) as cm:
            c.phase(0)
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn("no plan was submitted", cm.exception.strerror)
        ts = [c.create(f"x{i}", 8 * MiB) for i in range(3)]
        with self.assertRaises(ValueError):
            c.plan().add(0, ts[0], tier.NVME)
        with self.assertRaises(TypeError):
            c.plan().add(0, "x0", tier.HOST)  # type: ignore[arg-type]
        # one phase needs 24M of VRAM; the job may use 16M
        with c.plan() as p:
            for t in ts:
                p.add(0, t, tier.VRAM, tier.READ)
            with self.assertRaises(tier.NoSpaceError) as cm:
                p.submit()
            self.assertIn("vram", cm.exception.strerror)
            self.assertFalse(p.submitted)
        self.assertIn("freed", repr(p))
        with self.assertRaises(tier.TierError):
            p.submit()
        # tensors of another client are refused in Python
        other = self.client("plan-other")
        with self.assertRaises(ValueError):
            other.plan().add(0, ts[0], tier.HOST)
        with self.assertRaises(tier.TierError) as cm:
            c.phase_grant(ts[0], tier.HOST)  # no plan runs: refused
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn("no plan was submitted", cm.exception.strerror)
        for t in ts:
            t.destroy()

    def test_plan_above_max_message_says_what_to_do(self) -> None:
        # tier_plan_new(3): a plan larger than [limits] max_message (64K here, the default) is refused
        # before anything is sent, naming the setting to raise; the client goes on
        c = self.client()
        t = c.create("many", SIZE)
        with c.plan() as p:
            for i in range(6000):
                p.add(i % 4096, t, tier.HOST, tier.READ)
            with self.assertRaises(tier.TierError) as cm:
                p.submit()
            self.assertEqual(cm.exception.errno, errno.EMSGSIZE)
            self.assertIn("max_message", cm.exception.strerror)     # it said only "request of N bytes"
        with c.plan() as p:
            p.add(0, t, tier.HOST, tier.READ)
            p.submit()
        c.end_plan()

    def test_grant_only_of_the_phase_entered(self) -> None:
        """phase_grant() handed out the plan page's slot of any planned tensor: tierd never clears a slot,
        so outside the phases that access the tensor there it named where an earlier phase had the copy
        (room another tensor may have now) or, never written, offset 0 of segment 0 (another tensor's
        bytes), and writes through it corrupted other tensors.  Now only the phase entered gives grants,
        of what it accesses, in its own mode."""
        c = self.client()
        a = c.create("a", SIZE)
        with a.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:] = b"A" * SIZE
        t = c.create("t", SIZE)
        x = c.create("x", SIZE)
        with c.plan() as p:
            p.add(0, x, tier.HOST, tier.READ)
            p.add(1, t, tier.HOST, tier.WRITE)   # written in host, then read in VRAM
            p.add(2, t, tier.VRAM, tier.READ)
            p.add(3, x, tier.HOST, tier.READ)
            p.submit()
        with self.assertRaises(tier.TierError) as cm:
            c.phase_grant(t, tier.HOST)         # no phase entered yet
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn("no phase is entered", cm.exception.strerror)
        c.phase(0)
        with self.assertRaises(tier.NotFoundError) as cm:
            c.phase_grant(t, tier.HOST)         # its slot never written: segment 0, offset 0
        self.assertIn("phase 0 does not access it there", cm.exception.strerror)
        self.assertIn("the phases that do: 1", cm.exception.strerror)
        # the operation once: libtier's text starts with it too ("phase grant of 't' in host: ...")
        self.assertEqual(str(cm.exception).count("phase grant of"), 1, str(cm.exception))
        c.phase(1)
        g = c.phase_grant(t, tier.HOST)
        self.assertEqual(g.mode, tier.WRITE)
        g.memoryview()[:] = b"T" * SIZE
        with self.assertRaises(tier.NotFoundError):
            c.phase_grant(t, tier.VRAM)
        c.phase(2)
        self.assertEqual(bytes(c.phase_grant(t, tier.VRAM).memoryview()[:4]), b"TTTT")
        with self.assertRaises(tier.NotFoundError):
            c.phase_grant(t, tier.HOST)         # phase 1's slot: not pinned for phase 2
        with self.assertRaises(tier.TierError):
            c.phase(9)
        with self.assertRaises(tier.TierError) as cm:
            c.phase_grant(t, tier.VRAM)         # the last phase() failed: none is entered
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        c.phase(3)
        c.end_plan()
        with a.pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[:4]), b"AAAA")

    def test_phase_refused_while_its_own_pins_hold_the_room(self) -> None:
        """A phase whose room only its own client's pin (outside the plan) could give waited in phase() forever:
        the client, the only one who can unpin, waited there (and the Client's lock kept another thread's unpin
        out).  Now tierd refuses that phase (ENOSPC) naming the pin, as it refuses an ordinary pin; the plan
        lives on, and after the unpin the phase is entered."""
        faulthandler.dump_traceback_later(120, exit=True)      # a safety net only: the refusal is awaited
        self.addCleanup(faulthandler.cancel_dump_traceback_later)
        c = self.client()
        x = c.create("x", 16 * MiB)
        y = c.create("y", 8 * MiB)
        g = x.pin(tier.VRAM)                    # the job's whole VRAM limit
        p = c.plan()
        p.add(0, y, tier.VRAM, tier.READ)
        p.add(1, y, tier.HOST, tier.READ)
        p.submit()
        with self.assertRaises(tier.NoSpaceError) as cm:
            c.phase(0)
        msg = str(cm.exception)
        self.assertIn("tier_phase_enter(0) refused: phase 0 of job", msg)
        self.assertIn("can never be pinned in vram while this client's own pins there stay", msg)
        self.assertIn("'x' (16.0 MiB)", msg)
        self.assertIn("beyond the job's vram limit (16.0 MiB)", msg)
        self.assertIn("unpin them before entering the phase, or add them to the plan", msg)
        with self.assertRaises(tier.TierError) as cm:
            c.phase_grant(y, tier.VRAM)         # refused: no phase is entered
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        with self.assertRaises(tier.NoSpaceError):
            c.phase(0)                          # again, while the pin stays
        g.unpin()
        c.phase(0)                              # the plan lives on
        self.assertTrue(c.phase_grant(y, tier.VRAM).phase)
        c.phase(1)
        self.assertTrue(c.phase_grant(y, tier.HOST).phase)
        c.phase(0)
        c.end_plan()

    def test_phase_waits_for_the_pins_of_another_rank(self) -> None:
        """Room another rank of the job pins may come: the phase waits for it, even while its own client pins
        some of the job's limit too (the two pins with the phase fit it), and is entered after that unpin."""
        job = "other-rank-pins"
        c = self.client(job)
        other = self.client(job, 1)
        a = c.create("a", 4 * MiB)
        b = other.create("b", 8 * MiB)
        y = c.create("y", 8 * MiB)
        ga = a.pin(tier.VRAM)                   # its own: 4M + the phase's 8M fit the 16M limit
        gb = b.pin(tier.VRAM)                   # another rank's: 4M + 8M + 8M do not
        with c.plan() as p:
            p.add(0, y, tier.VRAM, tier.READ)
            p.add(1, y, tier.HOST, tier.READ)
            p.submit()
        failed: list[BaseException] = []

        def enter() -> None:
            try:
                c.phase(0)
            except BaseException as e:          # (a refusal would fail the test below)
                failed.append(e)

        th = threading.Thread(target=enter)
        th.start()
        try:
            deadline = time.monotonic() + 30
            while not next(j for j in other.status()["jobs"] if j["name"] == job)["plans"][0]["waiting"]:
                self.assertEqual(failed, [])
                self.assertTrue(th.is_alive(), "the phase was entered while the other rank pinned")
                self.assertLess(time.monotonic(), deadline, "the phase never waited")
                time.sleep(0.01)
        finally:
            gb.unpin()                          # the room comes: the phase goes on
            th.join(30)
        self.assertFalse(th.is_alive())
        self.assertEqual(failed, [])
        self.assertNotIn("Phase 0 of job 'other-rank-pins' refused", self.d.log_text())
        ga.unpin()

    def test_phase_grant_walks_no_plan(self) -> None:
        """phase_grant() found the grant's mode by walking every entry of the submitted plan, at every
        grant: a step's grants cost the square of the plan's size (tier.torch grants a few tensors in each
        of its phases).  Looked up now, the same modes."""
        c = self.client()
        ts = [c.create(f"t{i}", 4096) for i in range(3)]
        modes = (tier.READ, tier.WRITE, tier.READ_WRITE)
        with c.plan() as p:
            for i, t in enumerate(ts):
                p.add(i, t, tier.HOST, modes[i])
            p.submit()

        class NoWalk(list):
            def __iter__(self):
                raise AssertionError("the whole plan walked")

        c._planned = NoWalk(c._planned)         # (resubmit_plan() walks it, after a restart only)
        for i, t in enumerate(ts):
            c.phase(i)
            self.assertEqual(c.phase_grant(t, tier.HOST).mode, modes[i])
        c.end_plan()

    def test_plan_freed_with_its_client(self) -> None:
        c = tier.Client("plan-free", socket=self.socket)
        t = c.create("t", 4096)
        p = c.plan()
        p.add(0, t, tier.HOST)
        c.close()
        self.assertIn("freed", repr(p))
        with self.assertRaises(tier.TierError):
            p.add(0, t, tier.HOST)


GUARANTEE_CONFIG = """\
[daemon]
linger_sec = 0
[host]
capacity = 64M
segment_size = 16M
job_limit = 48M
[vram]
backend = emulated
capacity = 32M
chunk_size = 8M
job_limit = 16M
[nvme]
target = @DIR@/t0.img:256M
extent_size = 1M
[quota]
job = guaranteed
host_min = 32M
host = 48M
"""


class TestPlanGuarantee(unittest.TestCase):
    def test_phase_waits_for_room_kept_for_a_guarantee(self) -> None:
        """A phase pinning into room kept for another job's guarantee while a third job pins waits (it fits
        beside the guarantee alone), said once at warning level and in the status, and runs once the guaranteed
        job ends."""
        with tierd.Tierd(GUARANTEE_CONFIG) as d:
            g = tier.Client("guaranteed", socket=d.socket)
            other = tier.Client("other", socket=d.socket)
            hog = tier.Client("hog", socket=d.socket)
            og = other.create("o", 16 * MiB).pin(tier.HOST, tier.WRITE)
            ts = [hog.create(f"h{i}", 16 * MiB) for i in range(2)]
            with hog.plan() as p:
                for t in ts:                    # 32M: what the 32M kept for 'guaranteed' leave, less what 'other' pins
                    p.add(0, t, tier.HOST, tier.WRITE)
                p.submit()
            entered: list[bool] = []
            th = threading.Thread(target=lambda: (hog.phase(0), entered.append(True)))
            th.start()
            warning = "tierd[warning]: Phase 0 of job 'hog' waits for room in host kept for other jobs' guarantees"
            refused = "sched: job 'hog' waits for room for"
            try:
                while refused not in d.log_text():     # (said after the warning, by the same refusal)
                    self.assertTrue(th.is_alive(), "the phase was entered while 'other' pinned")
                    time.sleep(0.01)
                self.assertIn(warning, d.log_text())
                self.assertIn("kept for the guaranteed minimum of 'guaranteed'", d.log_text())
                # (the refusal may come first, of the phase pinned ahead: the status says it once the rank waits)
                deadline = time.monotonic() + 30
                while not (plan := next(j for j in g.status()["jobs"] if j["name"] == "hog")["plans"][0])["waiting"]:
                    self.assertLess(time.monotonic(), deadline, "the status never said why the phase waits")
                    time.sleep(0.01)
                self.assertIn("phase 0, tensor 'h1' in host: ", plan["waiting"])
                self.assertIn("kept for the guaranteed minimum of 'guaranteed'", plan["waiting"])
                self.assertIn("plan of hog, rank 0, waits: phase 0", g.status_table())
                # an unpin elsewhere retries the pin: refused again, not said again
                n = d.log_text().count(refused)
                g.create("a", 16 * MiB).pin(tier.HOST, tier.WRITE).unpin()     # within its guarantee
                while d.log_text().count(refused) <= n:
                    time.sleep(0.01)
                self.assertEqual(d.log_text().count(warning), 1)
                self.assertEqual(entered, [])
            finally:
                g.close()                       # its guarantee goes with it: the phase's pin is retried, and fits
                th.join(30)
            self.assertEqual(entered, [True])
            for t in ts:
                self.assertTrue(hog.phase_grant(t, tier.HOST).phase)
            self.assertEqual(next(j for j in other.status()["jobs"] if j["name"] == "hog")["plans"][0]["waiting"], "")
            og.unpin()
            hog.end_plan()
            hog.close()
            other.close()

    def test_phase_that_never_fits_fails(self) -> None:
        """A phase that needs more than the room the live jobs' guarantees leave fails the plan (ENOSPC), naming
        them, rather than hang its rank for as long as they run."""
        with tierd.Tierd(GUARANTEE_CONFIG) as d:
            g = tier.Client("guaranteed", socket=d.socket)
            hog = tier.Client("hog", socket=d.socket)
            ts = [hog.create(f"h{i}", 16 * MiB) for i in range(3)]
            with hog.plan() as p:
                for t in ts:                    # 48M: its limit, but 32M of the 64M are kept for 'guaranteed'
                    p.add(0, t, tier.HOST, tier.WRITE)
                p.submit()
            failed: list[BaseException] = []

            def enter() -> None:
                try:
                    hog.phase(0)
                except tier.TierError as e:
                    failed.append(e)

            th = threading.Thread(target=enter)
            th.start()
            try:
                while "Plan of job 'hog' failed" not in d.log_text():
                    self.assertNotIn("sched: job 'hog' waits for room", d.log_text(), "the phase waits")
                    self.assertTrue(th.is_alive() or failed, "the phase was entered while 'guaranteed' ran")
                    time.sleep(0.01)
            finally:
                g.close()                       # (what let a waiting phase go on)
                th.join(30)
            self.assertEqual(len(failed), 1)
            self.assertIsInstance(failed[0], tier.NoSpaceError)
            self.assertIn("tierd[err]: Plan of job 'hog' failed: job 'hog' would pin 48.0 MiB in host at once",
                          d.log_text())
            self.assertIn("for the guaranteed minimum of 'guaranteed' (32.0 MiB)", d.log_text())
            hog.close()


if __name__ == "__main__":
    tierd.main()
