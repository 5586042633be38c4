#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A training process SIGKILLed at chosen points resumes from tierd, without a checkpoint, bit for bit.

A child process trains the example byte LM through tier.torch (placement C,
budgets that send every block through NVMe) with ``resume=True``: the job is
committed at every step's end.  It SIGKILLs itself at a point of its step the
test names (KILL_PLAN: a block's forward, the optimizer before or after a
block's update, each side of the resume record and of the commit, a resume
half done), and is started again, once per point; the new process rolls the
job back to its last commit, checks the layout and goes on from
``engine.steps``, which must be the step the point says.  Its final
parameters and optimizer state must equal an uninterrupted run's (the same
script, never killed) with ``==``.  The tierd tests stop (SIGTERM) or SIGKILL
tierd at such points (RESTART_POINTS) of one run, which waits there until the
test lets it go on.  The order is the test's, never the clock's.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import unittest

import tierd

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None

STEPS = 14

# The child: python3 test_resume.py --child SOCKET JOB OUT [STEPS [MODE [POINTS]]]; prints "ready N R",
# then "step N U" per step (U: the optimizer updates it ran), and "restarts N M" at the end.  POINTS (JSON):
# [where, step, k] triples; at each the child prints "at WHERE STEP K", then SIGKILLs itself (MODE
# resume) or waits for a line on its stdin (MODE reconnect: the parent restarts tierd meanwhile).
#   fwd k       after block k's forward (model.blocks[k])
#   upd k       in the optimizer, after k updates of the step and before the next (update_part)
#   upd_done k  right after the k-th update of the step (its result in memory only)
#   commit 0/1/2  at the step's end: before the resume record, between it and the commit, after the commit
#   step, zero  after engine.step(), after engine.zero_grad()
#   rollback, ready  (step null) in the engine's making: after its rollback, once made
CHILD = "--child"
UPDATES = 7     # optimizer updates a step: tok, pos, the 3 blocks, ln, head (the child's "step N U")
# (point, the step the next run resumes at); each run goes one or two steps past its start (its first
# step is traced again, the ones after run the plan, fused)
KILL_PLAN = [
    (("fwd", 0, 1), 0),                     # the first step's forward: nothing committed yet
    (("upd_done", 0, 3), 0),                # its optimizer (deferred, unplanned) half done
    (("commit", 0, 1), 0),                  # its resume record written, not committed
    (("commit", 0, 2), 1),                  # just committed
    (("rollback", None, None), 1),          # the next run rolled the job back, took nothing over yet
    (("ready", None, None), 1),             # took it over, ran nothing
    (("upd", 1, 0), 1),                     # a resumed run's first (traced) step: before its first update
    (("fwd", 3, 2), 3),                     # a planned step's forward
    (("upd", 4, 0), 4),                     # fused: the backward ended a block, before its update
    (("upd_done", 5, 1), 5),                # one block updated (in memory only), the others not
    (("upd", 6, 4), 6),                     # four updated, the fifth's phase entered
    (("upd_done", 7, UPDATES), 7),          # all updated, step() not called
    (("commit", 8, 0), 8),                  # the next step's first phase entered, write-downs issued
    (("commit", 9, 1), 9),                  # the record written, not committed
    (("commit", 10, 2), 11),                # committed
    (("upd_done", 12, 5), 12),
]
RESTART_STEPS = 10
# where tierd is stopped (or killed) under the run: every step has one or more, the first (traced) one too
RESTART_POINTS = [
    ("fwd", 0, 1), ("upd_done", 0, 2),                  # the traced first step: pins, no plan
    ("fwd", 1, 0), ("upd", 1, 0), ("upd_done", 1, 3), ("step", 1, None),  # the first planned step
    ("upd", 2, 2), ("zero", 2, None),
    ("fwd", 3, 2), ("upd_done", 3, 1),
    ("upd", 4, 1), ("upd_done", 4, 4),
    ("fwd", 5, 1), ("step", 5, None),
    ("upd_done", 6, UPDATES),
    ("upd", 7, 4), ("zero", 7, None),
    ("fwd", 8, 0), ("upd_done", 8, 2),
    ("upd", 9, 3),      # (none after the last step's end: the run's state_dict() does not go through a restart)
]


def child(socket: str, job: str, out: str, steps: str = str(STEPS), mode: str = "resume", points: str = "[]") -> int:
    n_steps = int(steps)
    sys.path.insert(0, os.path.join(tierd.source_dir(), "client", "python", "examples"))
    import tier
    import tier.torch
    import train_lm
    from tier.torch import optim as optim_mod
    from tier.torch import resume as resume_mod

    torch.manual_seed(3)
    model = train_lm.ByteLM(dim=64, layers=3, heads=4, context=32)
    text = torch.randint(0, 256, (1 << 16,), generator=torch.Generator().manual_seed(11))
    gen = train_lm.batches(text, batch=8, context=32, seed=5, rank=0, world=1)
    data = [next(gen) for _ in range(n_steps)]
    todo = [tuple(p) for p in json.loads(points)]
    now = {"step": None, "updates": 0}

    def at(where: str, k: int | None = None) -> None:
        point = (where, now["step"], k)
        if point not in todo:
            return
        todo.remove(point)
        print(f"at {where} {now['step']} {k}", flush=True)
        if mode == "resume":
            os.kill(os.getpid(), signal.SIGKILL)
        if sys.stdin.readline() != "go\n":      # the parent did what it does here
            raise RuntimeError(f"the parent did not say go at {point}")

    # the points, in this process only: the engine calls these through their modules
    real_update, real_write_meta, real_commit = optim_mod.update_part, resume_mod.write_meta, resume_mod.commit

    def update_part(*a, **kw):
        at("upd", now["updates"])
        real_update(*a, **kw)
        now["updates"] += 1
        at("upd_done", now["updates"])

    def write_meta(eng):
        at("commit", 0)
        real_write_meta(eng)
        at("commit", 1)

    def commit(eng):
        real_commit(eng)
        at("commit", 2)

    optim_mod.update_part, resume_mod.write_meta, resume_mod.commit = update_part, write_meta, commit
    for i, blk in enumerate(model.blocks):
        blk.register_forward_hook(lambda m, a, o, i=i: at("fwd", i))
    c = tier.Client(job, socket=socket, reconnect=60 if mode == "reconnect" else None)
    real_rollback = c.rollback

    def rollback():
        r = real_rollback()
        at("rollback")
        return r

    c.rollback = rollback
    eng = tier.torch.Offload(model, c, lr=1e-3, weight_decay=0.01, placement="C", resume=mode == "resume")
    print(f"ready {eng.steps} {int(eng.resumed)}", flush=True)
    at("ready")
    for step in range(eng.steps, n_steps):
        now["step"], now["updates"] = step, 0
        x, y = data[step]
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        eng.step()
        at("step")
        eng.zero_grad()
        at("zero")
        print(f"step {eng.steps} {now['updates']}", flush=True)
    if todo:
        raise RuntimeError(f"points never reached: {todo}")
    # (the engine's parameters: the model's are placeholders between its phases, empty)
    torch.save({"params": eng.parameters_state_dict(), "optim": eng.state_dict(), "steps": eng.steps}, out)
    print(f"restarts {eng.restarts} {c.restarts}", flush=True)
    eng.close()
    c.close()
    return 0


class Lines:
    """The lines a child writes on a pipe, each as soon as it is whole.  select() says only whether the pipe
    holds more: a buffered readline() may take two lines out of it at once, and a select() for the second
    then waits for output that came already (the child, which prints "at ..." and waits for "go", says
    nothing more).  So the fd is read raw and split here."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def next(self, timeout: float) -> str | None:
        """The next line, without its newline (None at the end); TimeoutError when none is whole and
        nothing comes for @timeout seconds."""
        while b"\n" not in self.buf and not self.eof:
            r, _, _ = select.select([self.fd], [], [], timeout)
            if not r:
                raise TimeoutError(f"nothing for {timeout} s")
            chunk = os.read(self.fd, 65536)
            self.eof = not chunk
            self.buf += chunk
        if not self.buf:
            return None
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()


class TestHarness(unittest.TestCase):
    def test_lines_that_came_together(self) -> None:
        """Two lines the child wrote while the parent was busy ("step 5 7", then "at fwd 5 1" a forward or
        two later): both are read, the second without waiting for more output, which never comes while
        the child waits for the parent's "go" (test_tierd_killed_at_each_point hung so, once in ~40 runs,
        the parent's select() on its buffered readline()'s pipe waiting out its 120 s)."""
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        os.write(w, b"step 5 7\nat fwd 5 1\n")
        lines = Lines(r)
        self.assertEqual(lines.next(0), "step 5 7")
        self.assertEqual(lines.next(0), "at fwd 5 1")      # no output after it: the child waits
        with self.assertRaises(TimeoutError):
            lines.next(0)
        os.write(w, b"partial")
        os.close(w)
        self.assertEqual(lines.next(0), "partial")
        self.assertIsNone(lines.next(0))


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestResume(tierd.DaemonTestCase):
    # jobs linger (a killed process's job waits for its successor); small pools, NVMe for the rest
    config = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300").replace(
        "job_limit = 48M", "job_limit = 4M", 1)

    def run_child(self, job: str, out: str, args=(), socket: str | None = None,
                  at=None) -> tuple[int, list[str]]:
        """Run the child to its end (an exit, or its own SIGKILL); at(line), for each "at ..." line it says,
        does what the point asks (the child waits for it: "go" on its stdin once at() returned), and
        returns what is to be done once the child goes on (None: nothing).  Returns
        its exit status and its lines.  The 120 s are only for a hang."""
        p = subprocess.Popen([sys.executable, __file__, CHILD, socket or self.socket, job, out, *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        out_lines = Lines(p.stdout.fileno())    # (never p.stdout's own buffer: see Lines)
        try:
            while True:
                try:
                    line = out_lines.next(120.0)
                except TimeoutError:
                    raise AssertionError(f"the child said nothing for 120 s: {lines}") from None
                if line is None:
                    break
                lines.append(line.strip())
                if line.startswith("at ") and at is not None:
                    then = at(line.strip())
                    p.stdin.write("go\n")
                    p.stdin.flush()
                    if then is not None:
                        then()
            status = p.wait(60)
            if status not in (0, -signal.SIGKILL):
                err = p.stderr.read()
                raise AssertionError(f"the child failed ({status}): {lines} {err[:3000]} ... {err[-3000:]}")
            return status, lines
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()

    def test_killed_at_each_point(self) -> None:
        """KILL_PLAN: each run is SIGKILLed at its point and the next one resumes at the step that point
        says (the last commit before it), to the end, bit for bit as the uninterrupted run."""
        tmp = tempfile.mkdtemp(prefix="tier-resume-")
        self.addCleanup(lambda: __import__("shutil").rmtree(tmp, ignore_errors=True))
        ref, out = os.path.join(tmp, "ref.pt"), os.path.join(tmp, "out.pt")
        status, lines = self.run_child("resume-ref", ref)
        self.assertEqual(status, 0)
        self.assertEqual(lines[0], "ready 0 0")
        self.assertEqual(lines[1:1 + STEPS], [f"step {i + 1} {UPDATES}" for i in range(STEPS)])
        at = 0
        for point, then in KILL_PLAN:
            status, lines = self.run_child("resume-killed", out, args=(str(STEPS), "resume", json.dumps([point])))
            if point[0] != "rollback":      # (killed before it said "ready")
                self.assertEqual(lines[0], f"ready {at} {int(at > 0)}", f"killed before {point}")
            self.assertEqual((status, lines[-1]), (-signal.SIGKILL, "at %s %s %s" % point), lines)
            at = then
        status, lines = self.run_child("resume-killed", out)
        self.assertEqual(status, 0)
        self.assertEqual(lines[0], f"ready {at} 1")
        self.same(ref, out, STEPS)

    def same(self, ref: str, out: str, steps: int) -> None:
        a, b = torch.load(ref), torch.load(out)
        self.assertEqual(sorted(a["params"]), sorted(b["params"]))
        self.assertTrue(a["params"] and all(p.numel() > 0 for p in a["params"].values()))
        self.assertEqual(a["steps"], steps)
        self.assertEqual(b["steps"], steps)
        for n, p in a["params"].items():
            self.assertTrue(torch.equal(p, b["params"][n]), f"parameter {n} differs from the uninterrupted run's")
        sa, sb = a["optim"]["state"], b["optim"]["state"]
        self.assertEqual(sorted(sa), sorted(sb))
        for i in sa:
            for k, v in sa[i].items():
                self.assertTrue(torch.equal(v, sb[i][k]), f"optimizer state {i}.{k} differs")
        self.assertEqual(a["optim"]["param_groups"], b["optim"]["param_groups"])

    def tierd_under_run(self, d: tierd.Tierd, name: str, again) -> list[str]:
        """A run (a Client with reconnect=) that waits at each of RESTART_POINTS while again() stops or
        kills tierd and starts it again (again() returns what is left to do once the run goes on, or None):
        it carries on by itself and ends where an uninterrupted run does."""
        tmp = tempfile.mkdtemp(prefix="tier-restart-")
        self.addCleanup(lambda: __import__("shutil").rmtree(tmp, ignore_errors=True))
        ref, out = os.path.join(tmp, "ref.pt"), os.path.join(tmp, "out.pt")
        status, _ = self.run_child(f"{name}-ref", ref, args=(str(RESTART_STEPS), "plain"), socket=d.socket)
        self.assertEqual(status, 0)
        seen = []

        def at(line: str):
            seen.append(line)
            return again()

        status, lines = self.run_child(f"{name}-run", out, args=(str(RESTART_STEPS), "reconnect",
                                                                  json.dumps(RESTART_POINTS)),
                                       socket=d.socket, at=at)
        self.assertEqual(status, 0)
        self.assertEqual(seen, ["at %s %s %s" % p for p in RESTART_POINTS])
        self.assertEqual(lines[-1], f"restarts {len(RESTART_POINTS)} {len(RESTART_POINTS)}")
        self.same(ref, out, RESTART_STEPS)
        return lines

    def test_tierd_restarted_at_each_point(self) -> None:
        """tierd stopped (SIGTERM) and started again at each of RESTART_POINTS under a training process.  A
        stop waits (10 s at most) for the clients to let their pins go, which the run does once it goes on,
        at its next call (it sees the shutdown tierd sent before STOPPING=1): the order is SIGTERM,
        STOPPING=1, the run goes on, tierd's exit, the start."""
        d = self.d

        def again():
            since = len(d.notes)
            d.proc.send_signal(signal.SIGTERM)
            d.wait_notify("STOPPING=1", 30, since)

            def then() -> None:
                d.proc.wait(60)                 # (d.stop() would signal it again: a stop without waiting)
                self.assertEqual(d.stop(), 0)
                d.start()
            return then

        before = len(d.log_text())
        self.tierd_under_run(d, "restart", again)
        log = d.log_text()[before:]
        self.assertNotIn(" is lost", log)
        self.assertNotIn("still holding pins", log)     # the run let them go: no stop waited them out

    def test_tierd_killed_at_each_point(self) -> None:
        """tierd SIGKILLed at each of RESTART_POINTS and started again with what the service manager's fd
        store kept of its memory (the harness plays the store): nothing is lost, and at the points right
        after an update (upd_done) its result lay in memory only, kept."""
        d = tierd.Tierd(self.config, fd_store=True)
        self.addCleanup(d.cleanup)
        d.start()
        self.tierd_under_run(d, "kill", lambda: d.kill_and_start() and None)
        log = d.log_text()
        self.assertEqual([line for line in log.splitlines() if " is lost" in line], [],
                         "tensors were lost to a kill")
        kept = [int(n) for n in re.findall(r"(\d+) with newer data kept in memory", log)]
        print(f"tensors with newer data kept in memory at each kill: {kept}", file=sys.stderr)
        self.assertEqual(len(kept), len(RESTART_POINTS), "a start from the store per kill")
        self.assertTrue(all(kept[i] > 0 for i, p in enumerate(RESTART_POINTS) if p[0] == "upd_done"), kept)
        self.assertEqual(d.stop(), 0)       # and a clean stop after the last start from the store

    def test_lost_data_said_as_lost(self) -> None:
        """tierd SIGKILLed without its memory kept (no fd store) while a step's gradients lay in memory only:
        the step fails with LostError, as documented, but its message advised a larger budget and a
        quota (the advice for want of room); it says the data was lost and what to do now."""
        import tier
        import tier.torch
        import torch

        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        d.start()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
        c = tier.Client("lost-said", socket=d.socket, reconnect=60)
        self.addCleanup(c.close)
        eng = tier.torch.Offload(model, c, lr=1e-2, optimizer_in_backward=False)
        x = torch.randint(0, 64, (4, 8))
        for _ in range(2):
            torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), x.reshape(-1)).backward()
            if eng.steps == 0:
                eng.step()
                eng.zero_grad()
        d.kill_and_start()
        with self.assertRaises(tier.LostError) as cm:
            eng.step()
        self.assertIn("a tensor's data is gone, tierd's log says which and why", str(cm.exception))
        self.assertNotIn("raise the job's quota", str(cm.exception))
        self.assertEqual(d.stop(), 0)

    def test_resumed_parameter_with_zeroed_grad(self) -> None:
        """A parameter that got a gradient in the first step only: torch 1.13's zero_grad() leaves zeros in
        its .grad, so AdamW goes on updating it.  A run resumed after step 2 does the same, bit for bit as
        the uninterrupted one; the resume record did not say the parameter had had a gradient, and the
        resumed run left it alone."""
        import tier.torch

        class Br(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.l1 = torch.nn.Linear(8, 8)
                self.l2 = torch.nn.Linear(8, 8)

            def forward(self, x, use2: bool):
                return self.l2(x) if use2 else self.l1(x)

        class Branchy(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.br = Br()
                self.out = torch.nn.Linear(8, 4)

            def forward(self, x, use2: bool):
                return self.out(self.br(x, use2))

        def model():
            torch.manual_seed(1)
            return Branchy()

        xs = [torch.randn(2, 8, generator=torch.Generator().manual_seed(i)) for i in range(4)]
        ref = model()
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        for i, x in enumerate(xs):
            ref(x, i == 0).sum().backward()
            opt.step()
            opt.zero_grad()
        m = model()
        c = tier.Client("zeroed", socket=self.socket)
        eng = tier.torch.Offload(m, c, lr=1e-2, resume=True, blocks=[m.br, m.out])
        for i, x in enumerate(xs[:2]):
            m(x, i == 0).sum().backward()
            eng.step()
            eng.zero_grad()
        c.close()               # killed after its commit of step 2: the job lingers
        m = model()
        eng = tier.torch.Offload(m, self.client("zeroed"), lr=1e-2, resume=True, blocks=[m.br, m.out])
        self.assertTrue(eng.resumed)
        for i in range(eng.steps, 4):
            m(xs[i], i == 0).sum().backward()
            eng.step()
            eng.zero_grad()
        got = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(got[n], p.detach()), n)

    def test_refused_layout(self) -> None:
        """A model that does not match the stored layout is refused, in words, before anything of it changes;
        the right one resumes with the parameters as they were committed."""
        import copy

        import tier
        import tier.torch

        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        twin = copy.deepcopy(m)
        c = tier.Client("resume-layout", socket=self.socket)
        eng = tier.torch.Offload(m, c, lr=1e-3, resume=True)
        self.assertFalse(eng.resumed)
        m(torch.randn(2, 8)).sum().backward()
        eng.step()
        saved = {n: t.clone() for n, t in eng.parameters_state_dict().items()}
        c.close()               # the process is gone: its job lingers with its tensors
        c2 = self.client("resume-layout")
        other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 5))
        mine = {n: p.detach().clone() for n, p in other.named_parameters()}
        with self.assertRaisesRegex(ValueError, r"does not match the job's stored layout"):
            tier.torch.Offload(other, c2, lr=1e-3, resume=True)
        for n, p in other.named_parameters():
            self.assertTrue(torch.equal(p.detach(), mine[n]), f"{n} of the refused model changed")
        eng2 = tier.torch.Offload(twin, c2, lr=1e-3, resume=True)
        self.assertTrue(eng2.resumed)
        self.assertEqual(eng2.steps, 1)
        now = eng2.parameters_state_dict()
        for n, t in saved.items():
            self.assertTrue(torch.equal(t, now[n]), f"{n} is not what was committed")
        eng2.close()

    def test_stale_commit_refused(self) -> None:
        """A run that started the job afresh (resume=False) after a committed one left that commit behind; a
        later resume=True must not pair the old record with the new tensors (the rollback gives tensors made
        after a commit back as zeros): it is refused, in words, and nothing of the model changes."""
        import tier
        import tier.torch

        def model() -> torch.nn.Module:
            torch.manual_seed(2)
            return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))

        c = tier.Client("resume-stale", socket=self.socket)
        eng = tier.torch.Offload(model(), c, lr=1e-3, resume=True)
        for _ in range(2):
            eng.model(torch.randn(2, 8)).sum().backward()
            eng.step()
            eng.zero_grad()
        c.close()               # killed after its commit of step 2: the job lingers
        c2 = self.client("resume-stale")
        eng2 = tier.torch.Offload(model(), c2, lr=1e-3)       # afresh, no commits
        self.assertFalse(eng2.resumed)
        eng2.model(torch.randn(2, 8)).sum().backward()
        eng2.step()
        c2.close()              # killed too
        c3 = self.client("resume-stale")
        m3 = model()
        mine = {n: p.detach().clone() for n, p in m3.named_parameters()}
        with self.assertRaisesRegex(ValueError, r"has a commit \(step 2\) but no resume record.*stale"):
            tier.torch.Offload(m3, c3, lr=1e-3, resume=True)
        for n, p in m3.named_parameters():
            self.assertTrue(torch.equal(p.detach(), mine[n]), f"{n} of the refused model changed")
        c3.close()

    def test_restart_in_the_first_step(self) -> None:
        """tierd restarting while the first (traced) step pins a phase: the engine enters that phase again,
        and the trace counts it once (it used to refuse it as a block run twice in one step)."""
        import errno
        from unittest import mock

        import tier
        import tier._tensor
        import tier.torch

        torch.manual_seed(3)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        c = self.client("resume-first-step")
        eng = tier.torch.Offload(m, c, lr=1e-3)
        real_pin = tier._tensor.Tensor.pin
        failed = []

        def pin_once_restarted(t, *a, **kw):
            if not failed:
                failed.append(t.name)
                raise tier.RestartedError(errno.ERESTART, "tierd restarted (simulated)", f"pin {t.name!r}")
            return real_pin(t, *a, **kw)

        with mock.patch.object(tier._tensor.Tensor, "pin", pin_once_restarted):
            m(torch.randn(2, 8)).sum().backward()
            eng.step()
            eng.zero_grad()
        self.assertEqual(len(failed), 1)
        self.assertEqual(eng.restarts, 1)
        m(torch.randn(2, 8)).sum().backward()       # the plan the first step traced runs
        eng.step()
        self.assertEqual(eng.steps, 2)
        eng.close()

    def test_fence_check_that_reconnected(self) -> None:
        """A write-down's check that found tierd gone and joined the next one (tier_fence_done() reconnects
        too, as every call that finds tierd gone): the engine's pins and phase went with the connection, so
        the check raises for the phase's entry to go again, and forward_begins() and flush() take the restart
        themselves (Offload._restarted()).  It was counted as a write-down the plan overtook, the phase left
        mapped through the tierd that went."""
        import errno
        from unittest import mock

        import tier
        import tier.torch

        torch.manual_seed(3)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        c = self.client("resume-fence-reconnects")
        eng = tier.torch.Offload(m, c, lr=1e-3)
        restarts = [0]

        class Reconnects:               # a check that joined the next tierd: the client's count moved
            def done(self):
                restarts[0] += 1
                raise tier.RestartedError(errno.ERESTART, "tierd restarted (simulated)", "fence")

            wait = done

        with mock.patch.object(type(c), "restarts", property(lambda _: restarts[0])):
            with self.assertRaises(tier.RestartedError):
                eng._fence_done(Reconnects(), False)        # (was True: "overtaken")
            self.assertEqual(eng.kept_up, 0)
            eng._fences = [Reconnects(), Reconnects()]
            eng.flush()
            self.assertEqual((eng.restarts, eng._fences), (1, []))
            eng._fences = [Reconnects()]
            m(torch.randn(2, 8)).sum().backward()           # forward_begins() takes it: the first step goes on
            self.assertEqual(eng.restarts, 2)
            eng.step()
            self.assertEqual(eng.steps, 1)
            eng.close()                 # (its count is the patched one)

    def test_commit_waits_for_a_rank_of_before(self) -> None:
        """After tierd restarted, another rank's tensor held for writing at the kill (a ghost copy) makes tierd
        refuse commits (EBUSY) until that rank attaches again: the step's end raised that at once.  The commit
        is now tried again with pauses (resume.COMMIT_PAUSES), then refused saying what it waited for and
        what to do.  The pauses are the test's: the first time no rank attaches, the second time rank 3
        attaches in the first pause, and the commit goes."""
        from unittest import mock

        import tier
        import tier.torch
        from tier.torch import resume

        d = tierd.Tierd(self.config, fd_store=True)
        self.addCleanup(d.cleanup)
        d.start()
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        c = tier.Client("ghost-commit", socket=d.socket, reconnect=60)
        self.addCleanup(c.close)
        eng = tier.torch.Offload(m, c, lr=1e-3, resume=True)
        m(torch.randn(2, 8)).sum().backward()
        eng.step()
        eng.zero_grad()
        c3 = tier.Client("ghost-commit", 3, socket=d.socket)
        self.addCleanup(c3.close)
        x = c3.create("x", 1 << 20)
        x.pin(tier.VRAM, tier.WRITE).torch().fill_(7)      # held for writing when tierd dies
        d.kill_and_start()
        slept: list[float] = []
        with mock.patch.object(resume, "_sleep", slept.append):
            m(torch.randn(2, 8)).sum().backward()
            with self.assertRaisesRegex(tier.BusyError, r"committing step 2: tensor 'x' is held in vram for the "
                                                        r"client of rank 3 of before tierd restarted.*refused for "
                                                        r"\d+ s.*Step 2 is applied but not committed"):
                eng.step()
        eng.zero_grad()
        self.assertEqual(slept, list(resume.COMMIT_PAUSES))
        self.assertEqual(eng.steps, 2)
        slept.clear()
        attached = []

        def attach(pause: float) -> None:
            slept.append(pause)
            if not attached:
                attached.append(tier.Client("ghost-commit", 3, socket=d.socket))   # its Hello lets x go
        with mock.patch.object(resume, "_sleep", attach):
            m(torch.randn(2, 8)).sum().backward()
            eng.step()
        self.assertEqual(slept, [resume.COMMIT_PAUSES[0]])      # refused once, then committed
        self.assertEqual(eng.steps, 3)
        eng.close()
        attached[0].close()

    def test_several_ranks_refused(self) -> None:
        """resume=True with several ranks is refused before anything is made: a commit takes every rank's
        tensors at once."""
        from unittest import mock

        import tier
        import tier.torch

        m = torch.nn.Sequential(torch.nn.Linear(8, 8))
        c = self.client("resume-ranks")
        with mock.patch.object(torch.distributed, "is_initialized", return_value=True), \
                mock.patch.object(torch.distributed, "get_world_size", return_value=2):
            with self.assertRaisesRegex(ValueError, r"resume=True is for a job of one rank, and this one has 2"):
                tier.torch.Offload(m, c, lr=1e-3, resume=True)
        with self.assertRaises(tier.NotFoundError):
            c.open("torch.0.0.p")
        c.close()

    def test_other_connection_of_the_job_refused(self) -> None:
        """resume=True in a job with another connection (a rank of its own process, no torch.distributed)
        was not refused: the engine rolled the job back, the other rank's tensors written since the last
        commit with it (here: x, made after it, zeros), while that rank ran on.  It is refused before
        anything changes, saying what to do; alone again, the job resumes."""
        import tier
        import tier.torch

        def model() -> torch.nn.Module:
            torch.manual_seed(4)
            return torch.nn.Sequential(torch.nn.Linear(8, 8))

        c = tier.Client("resume-other-rank", socket=self.socket)
        eng = tier.torch.Offload(model(), c, lr=1e-3, resume=True)
        eng.model(torch.randn(2, 8)).sum().backward()
        eng.step()              # committed: step 1
        c.close()               # killed: the job lingers
        c1 = self.client("resume-other-rank", 1)        # rank 1, another process of the job, runs on
        x = c1.create("x", 4096)
        with x.pin(tier.HOST, tier.WRITE) as g:
            g.torch().fill_(7)
        c0 = self.client("resume-other-rank")
        m = model()
        mine = {n: p.detach().clone() for n, p in m.named_parameters()}
        with self.assertRaisesRegex(ValueError, r"resume=True is for a job of one connection, and job "
                                                r"'resume-other-rank' has 2.*save checkpoints.*close the "
                                                r"job's other connections"):
            tier.torch.Offload(m, c0, lr=1e-3, resume=True)
        for n, p in m.named_parameters():
            self.assertTrue(torch.equal(p.detach(), mine[n]), f"{n} of the refused model changed")
        with x.pin(tier.HOST, tier.READ) as g:
            self.assertTrue(bool((g.torch() == 7).all()), "rank 1's tensor was rolled back")
        x.destroy()
        c1.close()
        eng2 = tier.torch.Offload(model(), c0, lr=1e-3, resume=True)
        self.assertTrue(eng2.resumed)
        self.assertEqual(eng2.steps, 1)
        eng2.close()


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestResumeOtherPolicies(tierd.DaemonTestCase):
    """resume=True with offload_activations under lru (and ondemand), whose holds keep an activation
    tensor's last version when the next step's first phase pins it to be written whole: tierd refused
    the commit of step 2 ("in memory only"), after that step's update had been applied."""

    config = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300").replace(
        "[nvme]", "[sched]\npolicy = lru\n[nvme]")

    def test_activations_with_resume(self) -> None:
        sys.path.insert(0, os.path.join(tierd.source_dir(), "client", "python", "examples"))
        import tier
        import tier.torch
        import train_lm

        def model():
            torch.manual_seed(3)
            return train_lm.ByteLM(dim=64, layers=3, heads=4, context=32)

        def loss(m, i):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randint(0, 256, (8, 32), generator=g), torch.randint(0, 256, (8, 32), generator=g)
            return torch.nn.functional.cross_entropy(m(x).reshape(-1, 256), y.reshape(-1))

        ref = model()
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
        for i in range(4):
            loss(ref, i).backward()
            opt.step()
            opt.zero_grad()
        kw = dict(lr=1e-3, weight_decay=0.01, placement="C", resume=True, offload_activations=True,
                  activation_min_bytes=1024)
        m = model()
        c = tier.Client("act-resume", socket=self.socket)
        eng = tier.torch.Offload(m, c, **kw)
        for i in range(3):
            loss(m, i).backward()
            eng.step()
            eng.zero_grad()
        self.assertGreater(eng.activations_stashed, 0)
        c.close()               # killed after its commit of step 3: the job lingers
        m = model()
        eng = tier.torch.Offload(m, self.client("act-resume"), **kw)
        self.assertTrue(eng.resumed)
        self.assertEqual(eng.steps, 3)
        loss(m, 3).backward()
        eng.step()
        got = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(got[n], p.detach()), n)


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestResumeMixed(tierd.DaemonTestCase):
    """resume=True with a bfloat16 model (float32 master weights): each optimizer phase pins the block's
    parameters to be written whole, and tierd first writes their committed version to NVMe as an image.
    With host memory short, the host copy had been dropped (VRAM held the parameters too), and the image
    was taken from the write-only pin's own reservation, garbage: killed after a backward, the run
    resumed with garbage in the embedding's parameters."""

    # host room for about half the model's state: copies are dropped and written down as the step goes
    config = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300").replace(
        "job_limit = 48M", "job_limit = 1357K", 1)

    def test_killed_after_backward_bf16(self) -> None:
        sys.path.insert(0, os.path.join(tierd.source_dir(), "client", "python", "examples"))
        import tier
        import tier.torch
        import train_lm

        def model():
            torch.manual_seed(3)
            return train_lm.ByteLM(dim=32, layers=2, heads=2, context=16).to(torch.bfloat16)

        g = torch.Generator().manual_seed(5)
        data = [torch.randint(0, 256, (4, 17), generator=g) for _ in range(3)]

        def loss(m, x):
            return torch.nn.functional.cross_entropy(m(x[:, :-1]).float().reshape(-1, 256), x[:, 1:].reshape(-1))

        def run(job, steps):
            m = model()
            c = tier.Client(job, socket=self.socket)
            eng = tier.torch.Offload(m, c, lr=1e-3, placement="C", resume=True)
            self.assertEqual(eng.steps, 0)
            for x in data[:steps]:
                loss(m, x).backward()
                eng.step()
                eng.zero_grad()
            return m, c, eng

        _, c, eng = run("mixed-ref", 2)
        ref = eng.parameters_state_dict()
        eng.close()
        c.close()
        m, c, eng = run("mixed", 2)
        loss(m, data[2]).backward()     # fused: step 3's optimizer phases ran
        c.close()                       # killed here: the job lingers
        m = model()
        eng = tier.torch.Offload(m, self.client("mixed"), lr=1e-3, placement="C", resume=True)
        self.assertTrue(eng.resumed)
        self.assertEqual(eng.steps, 2)
        got = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.items():
            self.assertTrue(torch.equal(got[n], p), n)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        sys.exit(child(*sys.argv[2:]))
    tierd.main()
