#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What a resume=True engine checks before it takes a job over: the hyperparameters, and a commit tierd lost.

The training "process" here is a Client closed without the engine's close()
(the job lingers with its commit, as after a SIGKILL); tierd's own deaths
come from the harness.  Every kill falls between two known calls.
"""

from __future__ import annotations

import unittest

import tierd

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None

LINGER = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300")


def model():
    torch.manual_seed(4)
    return torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))


def batch(i: int):
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(i))


def train(eng, sched, m, upto: int) -> None:
    """Two micro-batches, clipping, a scheduler step: the deferred path."""
    for i in range(eng.steps, upto):
        for k in range(2):
            (m(batch(2 * i + k)).square().mean() / 2).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        eng.step()
        sched.step()
        eng.zero_grad()


def schedule(eng):
    return torch.optim.lr_scheduler.LambdaLR(eng, lambda s: min(1.0, (s + 1) / 3), last_epoch=eng.steps - 1)


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestResumeChecks(tierd.DaemonTestCase):
    config = LINGER

    def test_other_hyperparameters_refused(self) -> None:
        """A resume made with another weight_decay, betas or lr than the run: the engine took the run's
        values over without a word, so the user's were ignored.  Refused now, naming each, before
        anything changes: the right resume then ends bit for bit where an uninterrupted run does, its
        learning rate schedule with it."""
        import tier
        import tier.torch

        kw = dict(lr=1e-2, weight_decay=0.05)
        ref = model()
        eng = tier.torch.Offload(ref, self.client("hyper-ref"), **kw)
        sched = schedule(eng)
        train(eng, sched, ref, 4)
        want, want_opt, want_lr = eng.parameters_state_dict(), eng.state_dict(), sched.get_last_lr()
        eng.close()

        m = model()
        c = tier.Client("hyper", socket=self.socket)
        eng = tier.torch.Offload(m, c, resume=True, **kw)
        sched = schedule(eng)
        train(eng, sched, m, 2)
        c.close()               # the process is gone after its commit of step 2: the job lingers
        for other, said in ((dict(weight_decay=0.1), r"weight_decay=0\.05 then, 0\.1 now"),
                            (dict(betas=(0.8, 0.99)), r"betas=\(0\.9, 0\.999\) then, \(0\.8, 0\.99\) now"),
                            (dict(lr=5e-3), r"lr=0\.01 then, 0\.005 now")):
            c2 = tier.Client("hyper", socket=self.socket)
            with self.subTest(other=other), self.assertRaisesRegex(ValueError, "other hyperparameters.*" + said):
                tier.torch.Offload(model(), c2, resume=True, **{**kw, **other})
            c2.close()
        m = model()
        eng = tier.torch.Offload(m, self.client("hyper"), resume=True, **kw)
        self.assertEqual((eng.resumed, eng.steps), (True, 2))
        sched = schedule(eng)
        train(eng, sched, m, 4)
        self.assertEqual(sched.get_last_lr(), want_lr)
        got, got_opt = eng.parameters_state_dict(), eng.state_dict()
        eng.close()
        for n, p in want.items():
            self.assertTrue(torch.equal(p, got[n]), n)
        for i, st in want_opt["state"].items():
            for k, v in st.items():
                self.assertTrue(torch.equal(v, got_opt["state"][i][k]), f"{i}.{k}")
        self.assertEqual(want_opt["param_groups"], got_opt["param_groups"])

    def test_run_again_after_a_closed_run(self) -> None:
        """The same script run again after a run that ended (close()) while its job still lingers
        (linger_sec): close() destroys the resume record and every tensor, not the job's commit, so
        resume=True refused the new run as a stale commit ("end the job first"), until linger_sec ran out.
        Nothing of the ended run is left to pair with: the new run starts afresh, and its own commits
        are what a resume comes back to."""
        import tier
        import tier.torch

        for run in range(2):
            m = model()
            c = tier.Client("closed-run", socket=self.socket)
            eng = tier.torch.Offload(m, c, lr=1e-2, resume=True)
            self.assertEqual((eng.resumed, eng.steps), (False, 0), f"run {run}")
            sched = schedule(eng)
            train(eng, sched, m, 2 if run == 0 else 1)
            if run == 0:
                eng.close()
            else:
                committed = {n: t.clone() for n, t in eng.parameters_state_dict().items()}
            c.close()               # run 1: killed after its commit of step 1
        m = model()
        eng = tier.torch.Offload(m, self.client("closed-run"), lr=1e-2, resume=True)
        self.assertEqual((eng.resumed, eng.steps), (True, 1))
        now = eng.parameters_state_dict()
        for n, t in committed.items():
            self.assertTrue(torch.equal(t, now[n]), n)
        eng.close()


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestResumeLostCommit(tierd.DaemonTestCase):
    # lru: no write-behind, so what the commit holds lies in memory only when tierd is killed
    config = LINGER.replace("[nvme]", "[sched]\npolicy = lru\n[nvme]")

    def test_lost_commit_said(self) -> None:
        """tierd SIGKILLed without an fd store after a commit that lay in memory only: a resume read the
        resume record first, which was lost too, and failed with the bare LostError of its pin ("write it
        whole (a TIER_WRITE pin) or destroy it").  It says now that the commit cannot be resumed, why, and
        what to do; starting afresh, as it says, works."""
        import tier
        import tier.torch

        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        d.start()
        m = model()
        c = tier.Client("lost-commit", socket=d.socket)
        eng = tier.torch.Offload(m, c, lr=1e-2, resume=True)
        sched = schedule(eng)
        train(eng, sched, m, 1)
        c.close()
        d.kill_and_start()
        c2 = tier.Client("lost-commit", socket=d.socket)
        self.addCleanup(c2.close)
        with self.assertRaisesRegex(RuntimeError, r"nothing to go back to at its last commit \(step 1\).*killed "
                                    r"without a service manager keeping its memory.*cannot be resumed; start it "
                                    r"afresh") as cm:
            tier.torch.Offload(model(), c2, lr=1e-2, resume=True)
        self.assertNotIsInstance(cm.exception, tier.LostError)
        m = model()
        eng = tier.torch.Offload(m, c2, lr=1e-2)
        self.assertFalse(eng.resumed)
        train(eng, schedule(eng), m, 1)
        self.assertEqual(eng.steps, 1)
        eng.close()
        c2.close()
        self.assertEqual(d.stop(), 0)

    def test_lost_in_a_resume_engine_advice(self) -> None:
        """A step of a resume=True engine that finds its data lost (tierd killed under it, no fd store): the
        LostError advised "make engines with resume=True", which this one is.  It says what resume=True
        does for it now: start the process again."""
        import tier
        import tier.torch

        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        d.start()
        m = model()
        c = tier.Client("lost-advice", socket=d.socket, reconnect=60)
        self.addCleanup(c.close)
        eng = tier.torch.Offload(m, c, lr=1e-2, resume=True, optimizer_in_backward=False)
        sched = schedule(eng)
        train(eng, sched, m, 1)
        m(batch(9)).square().mean().backward()
        d.kill_and_start()
        with self.assertRaises(tier.LostError) as cm:
            eng.step()
        self.assertIn("this engine commits every step (resume=True): end this process and start it again",
                      str(cm.exception))
        self.assertNotIn("make engines with resume=True", str(cm.exception))
        c.close()
        self.assertEqual(d.stop(), 0)


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestCleanRestartKeepsDead(tierd.DaemonTestCase):
    config = LINGER

    def test_unreached_block_after_a_clean_restart(self) -> None:
        """tierd stopped cleanly (SIGTERM, no service manager keeping its memory) and started again
        between two steps of a loop whose backward does not reach one block (its output unused in some
        steps): that block's gradient is dead between steps (its plan writes it whole next), and came back
        "lost: its newest data was in memory" (a clean stop was to lose nothing), so its optimizer phase,
        which reads it as zeros, failed with LostError.  The index says it was dead now: the run goes on
        and ends bit for bit where an uninterrupted one does."""
        import signal
        import threading

        import tier
        import tier.torch

        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a, self.aux, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

            def forward(self, x, use: bool):
                h = self.a(x)
                z = self.aux(h)             # computed in every step, used in some
                return self.out(z if use else h)

        def run(job: str, socket: str, between=None):
            torch.manual_seed(1)
            m = M()
            c = tier.Client(job, socket=socket, reconnect=60)
            eng = tier.torch.Offload(m, c, lr=1e-2, blocks=[m.a, m.aux, m.out])
            for i, use in enumerate((True, True, False, False, True)):
                if i == 2 and between:
                    between()
                m(batch(i)[:, :8], use).sum().backward()
                eng.step()
                eng.zero_grad()
            got, restarts = eng.parameters_state_dict(), eng.restarts
            eng.close()
            c.close()
            return got, restarts

        want, _ = run("unreached-ref", self.socket)
        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        d.start()
        stopped, done = threading.Event(), threading.Event()

        def restarter() -> None:
            # tierd dies with the thread that started it (PR_SET_PDEATHSIG): this one lives to the end
            stopped.wait()
            d.proc.wait()
            d.stop()
            d.start()
            done.wait()

        th = threading.Thread(target=restarter)
        th.start()

        def stop() -> None:
            d.proc.send_signal(signal.SIGTERM)      # the next call finds tierd stopping, then reconnects
            stopped.set()
        try:
            got, restarts = run("unreached", d.socket, stop)
            self.assertEqual(d.stop(), 0)
        finally:
            stopped.set()
            done.set()
            th.join()
        self.assertEqual(restarts, 1)
        self.assertNotIn("is lost", d.log_text())
        for n, p in want.items():
            self.assertTrue(torch.equal(p, got[n]), n)


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestStateAfterRestart(tierd.DaemonTestCase):
    config = LINGER

    def test_state_dicts_after_a_restart(self) -> None:
        """tierd restarted (stopped cleanly, started again) between a step and the engine's state_dict(): a
        step reconnects and goes on (the phase entered again), but state_dict(), model.state_dict() and
        parameters_state_dict() failed with RestartedError, the read that found tierd gone not tried
        again.  Each reads the same values as before the restart now, and training goes on."""
        import tier
        import tier.torch

        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        d.start()
        m = model()
        c = tier.Client("state-restart", socket=d.socket, reconnect=60)
        self.addCleanup(c.close)
        eng = tier.torch.Offload(m, c, lr=1e-2)
        for i in range(2):
            m(batch(i)).square().mean().backward()
            eng.step()
            eng.zero_grad()
        want, want_m, want_p = eng.state_dict(), m.state_dict(), eng.parameters_state_dict()
        for reads in ((eng.state_dict, want), (m.state_dict, want_m), (eng.parameters_state_dict, want_p)):
            self.assertEqual(d.restart(), 0)
            got = reads[0]()
            if reads[1] is want:
                self.assertEqual(got["param_groups"], want["param_groups"])
                got, exp = got["state"], want["state"]
                self.assertEqual(sorted(got), sorted(exp))
                for k in exp:
                    for n, v in exp[k].items():
                        self.assertTrue(torch.equal(got[k][n], v), f"state {k} {n}")
            else:
                self.assertEqual(sorted(got), sorted(reads[1]))
                for n, v in reads[1].items():
                    self.assertTrue(torch.equal(got[n], v), n)
        self.assertEqual(eng.restarts, 3)
        m(batch(2)).square().mean().backward()
        eng.step()
        eng.zero_grad()
        eng.close()
        self.assertEqual(d.stop(), 0)


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestResumeAcrossRestart(tierd.DaemonTestCase):
    config = LINGER

    def resumed_across(self, fd_store: bool, again, policy: str = "timeline", **kw) -> None:
        """A run killed in the middle of step 3 (its backward ran: every block's gradient written since the
        commit of step 2, at which they were dead, consumed by the update), tierd restarted by again(d),
        then a process resuming the job: it ends bit for bit where an uninterrupted run does."""
        import tier
        import tier.torch

        def run(c, upto: int):
            m = model()
            eng = tier.torch.Offload(m, c, lr=1e-2, resume=True, **kw)
            for i in range(eng.steps, upto):
                m(batch(i)).square().mean().backward()
                eng.step()
                eng.zero_grad()
            return m, eng

        d = tierd.Tierd(self.config.replace("[nvme]", f"[sched]\npolicy = {policy}\n[nvme]"), fd_store=fd_store)
        self.addCleanup(d.cleanup)
        d.start()
        c = tier.Client("across-ref", socket=d.socket)
        _, eng = run(c, 4)
        if kw.get("offload_activations"):
            self.assertGreater(eng.activations_stashed, 0)
        want = eng.parameters_state_dict()
        eng.close()
        c.close()
        c = tier.Client("across", socket=d.socket)
        m, eng = run(c, 2)
        m(batch(2)).square().mean().backward()          # step 3's gradients written (fused: updates too)
        c.close()                                       # killed here: the job lingers with its commit of step 2
        again(d)
        c = tier.Client("across", socket=d.socket)
        self.addCleanup(c.close)
        m, eng = run(c, 4)
        self.assertTrue(eng.resumed)
        got = eng.parameters_state_dict()
        eng.close()
        for n, p in want.items():
            self.assertTrue(torch.equal(got[n], p), n)
        self.assertEqual(d.stop(), 0)

    def test_resumed_across_a_clean_restart(self) -> None:
        """The commit lives through tierd's stop (it writes down what is only in memory) and start: the
        resume was refused, "N tensor(s) have nothing to go back to", the gradients counted lost.  A
        commit's dead tensors were dead only in tierd's memory (Tensor.commit_dead), not in its NVMe index:
        after the restart the rollback had nothing to say of the ones written since but lost."""
        self.resumed_across(False, lambda d: self.assertEqual(d.restart(), 0))

    def test_resumed_across_a_kill_with_the_fd_store(self) -> None:
        """The same with tierd SIGKILLed and started again with what the fd store kept of its memory."""
        self.resumed_across(True, lambda d: d.kill_and_start())

    def test_activations_resumed_across_restarts(self) -> None:
        """The same with offload_activations under lru and ondemand, whose holds keep an activation's last
        version until the next step's forward pins it to be written whole: the commit of step 2 found that
        activation held so and kept it as dead (Tensor.commit_dead), which the index learnt only from a
        later snapshot.  Under lru its version lay in memory only: after the restart the rollback counted it
        lost and the resume was refused ("1 tensor(s) ... have nothing to go back to"), the parameters and
        optimizer state intact.  (Under ondemand it lay on NVMe too, whose image the rollback takes.)"""
        for policy in ("lru", "ondemand"):
            for fd_store, again in ((False, lambda d: self.assertEqual(d.restart(), 0)),
                                    (True, lambda d: d.kill_and_start())):
                with self.subTest(policy=policy, fd_store=fd_store):
                    self.resumed_across(fd_store, again, policy, offload_activations=True,
                                        activation_min_bytes=64)


if __name__ == "__main__":
    tierd.main()
