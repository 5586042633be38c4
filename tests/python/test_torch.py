#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tier.torch against plain PyTorch: the same model, seed and data give the same losses and parameters.

Placement C under the suite's small budgets: every block's parameters and
AdamW state go down to NVMe and come back every step.  On the CPU the
engine runs the operations plain PyTorch runs, on the same bits (parameters
64-byte aligned as torch's allocator aligns them, AdamW's own
single-tensor code), so the comparison is exact, not within a tolerance.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import unittest

import tierd

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None

EXAMPLES = os.path.join(tierd.source_dir(), "client", "python", "examples")
STEPS = 6


def lm_module():
    sys.path.insert(0, EXAMPLES)
    import train_lm

    return train_lm


def run_plain(model, batches, lr: float) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestOffload(tierd.DaemonTestCase):
    def setUp(self) -> None:
        lm = lm_module()
        torch.manual_seed(3)
        self.model = lm.ByteLM(dim=64, layers=3, heads=4, context=32)
        text = torch.randint(0, 256, (1 << 16,))
        gen = lm.batches(text, batch=8, context=32, seed=5, rank=0, world=1)
        self.batches = [next(gen) for _ in range(STEPS)]
        self.reference = copy.deepcopy(self.model)
        self.ref_losses = run_plain(self.reference, self.batches, 1e-3)

    def train(self, placement: str, **kw) -> tuple[list[float], dict, dict, list[dict]]:
        import tier.torch

        c = self.client()
        eng = tier.torch.Offload(self.model, c, lr=1e-3, placement=placement, **kw)
        self.engine = eng
        # bytes NVMe moves for one copy of each kind of every block (whole 4 KiB units)
        self.nvme_bytes = {k: sum(-(-b.tensors[k].size // 4096) * 4096 for b in eng.blocks) for k in "pmv"}
        self.on_nvme: list[dict[str, bool]] = []
        losses, per_step = [], []
        before = c.moved()
        for x, y in self.batches:
            loss = torch.nn.functional.cross_entropy(self.model(x).reshape(-1, 256), y.reshape(-1))
            loss.backward()
            eng.step()
            eng.zero_grad()
            losses.append(loss.item())
            eng.flush()                 # every write-down of this step has ended: they count in it
            now = c.moved()
            per_step.append({k: now[k] - before[k] for k in now})
            before = now
            # which kinds are on NVMe, in every block, after the step's write-downs
            self.on_nvme.append({k: all(b.tensors[k].stat().state["nvme"] == "resident" for b in eng.blocks)
                                 for k in "pmv"})
        state = self.model.state_dict()       # the real values, read from tierd
        eng.close()
        return losses, state, {n: p.detach().clone() for n, p in self.model.named_parameters()}, per_step

    def check_equal(self, losses, state, restored) -> None:
        self.assertEqual(losses, self.ref_losses)       # bit for bit
        for n, p in self.reference.named_parameters():
            self.assertTrue(torch.equal(state[n], p.detach()), f"{n} differs from plain PyTorch's")
            self.assertTrue(torch.equal(restored[n], p.detach()), f"{n} was not given back")

    def test_placement_c_through_nvme(self) -> None:
        losses, state, restored, per_step = self.train("C")
        self.check_equal(losses, state, restored)
        mv, p = self.nvme_bytes["m"] + self.nvme_bytes["v"], self.nvme_bytes["p"]
        print(f"placement C: {self.engine.kept_up} parameter write-downs overtaken by the plan in "
              f"{STEPS} steps of {len(self.engine.blocks)} blocks; moved per step: {per_step[-1]}")
        for i, moved in enumerate(per_step, 1):
            # every step writes both moments of every block down, once, and the parameters once, but
            # for those the plan needed back first (a prefetch for the next step: Offload.kept_up):
            # bounds that hold however fast the links are
            self.assertGreaterEqual(moved["host->nvme"], mv, f"step {i}: {moved}")
            self.assertLessEqual(moved["host->nvme"], mv + p, f"step {i}: {moved}")
            self.assertEqual(self.on_nvme[i - 1]["m"], True, f"step {i}")
            self.assertEqual(self.on_nvme[i - 1]["v"], True, f"step {i}")
        self.assertLessEqual(self.engine.kept_up, len(self.engine.blocks) * (STEPS - 1))
        # the moments of steps 2..N come back up from NVMe (in their step or the tail of the one
        # before: the boundary is a matter of timing, the sum is not)
        self.assertGreaterEqual(sum(m["nvme->host"] for m in per_step), (STEPS - 1) * mv)

    def test_activations_through_tierd(self) -> None:
        losses, state, restored, per_step = self.train("C", offload_activations=True,
                                                       activation_min_bytes=16 << 10)
        self.check_equal(losses, state, restored)
        eng = self.engine
        self.assertGreater(eng.activations_stashed, 0)
        self.assertEqual(eng.activations_kept, 0)

    def test_placement_a_in_host(self) -> None:
        losses, state, restored, per_step = self.train("A")
        self.check_equal(losses, state, restored)
        for moved in per_step:
            self.assertEqual(moved["host->nvme"] + moved["nvme->host"], 0, moved)

    def test_placement_b(self) -> None:
        losses, state, restored, per_step = self.train("B")
        self.check_equal(losses, state, restored)
        mv = self.nvme_bytes["m"] + self.nvme_bytes["v"]
        # no write-down is ever refused: nothing in the plan needs a block's moments back before the
        # next step's optimizer phase (a refusal, -EBUSY, would leave them in host memory)
        self.assertEqual(self.engine.kept_up, 0)
        for i, moved in enumerate(per_step, 1):
            # exactly both moments of every block, once, in the step that wrote them; nothing else
            self.assertEqual(moved["host->nvme"], mv, f"step {i}: {moved}")
            self.assertEqual(self.on_nvme[i - 1], {"p": False, "m": True, "v": True}, f"step {i}")
        self.assertGreaterEqual(sum(m["nvme->host"] for m in per_step), (STEPS - 1) * mv)

    def test_bfloat16_with_float32_master_weights(self) -> None:
        """Against the mixed-precision recipe in plain PyTorch: float32 master weights, AdamW on them."""
        import tier.torch

        ref = copy.deepcopy(self.model).to(torch.bfloat16)
        model = copy.deepcopy(self.model).to(torch.bfloat16)
        master = [p.detach().float().clone().requires_grad_() for p in ref.parameters()]
        opt = torch.optim.AdamW(master, lr=1e-3)
        ref_losses = []
        for x, y in self.batches:
            loss = torch.nn.functional.cross_entropy(ref(x).reshape(-1, 256).float(), y.reshape(-1))
            loss.backward()
            for w, p in zip(master, ref.parameters()):
                w.grad = p.grad.float()
                p.grad = None
            opt.step()
            for w, p in zip(master, ref.parameters()):
                p.data.copy_(w.detach())
            ref_losses.append(loss.item())

        c = self.client()
        # in parts of 16 KiB of float32: the master weights and p written a part at a time
        eng = tier.torch.Offload(model, c, lr=1e-3, placement="C", optimizer_part_bytes=16 << 10)
        self.assertTrue(any(len(b.parts) > 1 for b in eng.blocks))
        losses = []
        for x, y in self.batches:
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256).float(), y.reshape(-1))
            loss.backward()
            eng.step()
            eng.zero_grad()
            losses.append(loss.item())
        state = eng.parameters_state_dict()
        eng.close()
        self.assertEqual(losses, ref_losses)
        for n, p in ref.named_parameters():
            self.assertEqual(state[n].dtype, torch.bfloat16)
            self.assertTrue(torch.equal(state[n], p.detach()), f"{n} differs")
            self.assertEqual(dict(model.named_parameters())[n].dtype, torch.bfloat16)

    def test_float32_checkpoint_into_bfloat16(self) -> None:
        """A float32 checkpoint loads into a bfloat16 model cast, as torch's load casts (copy_()): the same
        parameters as the plain model's load.  It failed after part of the model was written."""
        import tier.torch

        src = copy.deepcopy(self.model)
        for p in src.parameters():
            p.data.add_(0.25)                   # other values than the model's
        ref = copy.deepcopy(self.model).to(torch.bfloat16)
        ref.load_state_dict(src.state_dict())
        model = copy.deepcopy(self.model).to(torch.bfloat16)
        eng = tier.torch.Offload(model, self.client("bf16-load"), lr=1e-3)
        model.load_state_dict(src.state_dict())
        state = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.named_parameters():
            self.assertEqual(state[n].dtype, torch.bfloat16)
            self.assertTrue(torch.equal(state[n], p.detach()), n)

    def test_load_into_a_block_of_mixed_dtypes(self) -> None:
        """model.load_state_dict() into a block holding a bfloat16 Linear and a float32 LayerNorm (a model
        made bfloat16 but its norms): the plain model's values.  It failed after the block before was
        written (the float32 values were compared as 16-bit words)."""
        import tier.torch

        def make():
            torch.manual_seed(4)
            m = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)),
                                    torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)))
            for blk in m:
                blk[0].to(torch.bfloat16)
            return m

        src = make()
        for p in src.parameters():
            p.data.add_(0.5)
        ref, model = make(), make()
        ref.load_state_dict(src.state_dict())
        eng = tier.torch.Offload(model, self.client("mixed-load"), lr=1e-3, blocks=[model[0], model[1]])
        model.load_state_dict(src.state_dict())
        state = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.named_parameters():
            self.assertEqual(state[n].dtype, p.dtype, n)
            self.assertTrue(torch.equal(state[n], p.detach()), n)

    def test_bfloat16_checkpoint_either_order(self) -> None:
        """bfloat16 with float32 master weights: model.state_dict() and engine.state_dict() saved mid-run
        and loaded into a new engine, in either order, go on bit for bit as the run that was not stopped
        (loading the model after the optimizer kept the masters its rounded values match)."""
        import tier.torch

        def step(m, eng, x, y):
            loss = torch.nn.functional.cross_entropy(m(x).reshape(-1, 256).float(), y.reshape(-1))
            loss.backward()
            eng.step()
            eng.zero_grad()
            return loss.item()

        first, rest = self.batches[:2], self.batches[2:4]
        model = copy.deepcopy(self.model).to(torch.bfloat16)
        eng = tier.torch.Offload(model, self.client("bf16-whole"), lr=1e-3)
        for x, y in first:
            step(model, eng, x, y)
        saved_model = {k: v.clone() for k, v in model.state_dict().items()}
        saved_opt = copy.deepcopy(eng.state_dict())
        ref_losses = [step(model, eng, x, y) for x, y in rest]
        ref = eng.parameters_state_dict()
        eng.close()
        for order in ("optimizer first", "model first"):
            m2 = copy.deepcopy(self.model).to(torch.bfloat16)
            eng2 = tier.torch.Offload(m2, self.client(f"bf16-{order.split()[0]}"), lr=1e-3)
            if order == "optimizer first":
                eng2.load_state_dict(saved_opt)
                m2.load_state_dict(saved_model)
            else:
                m2.load_state_dict(saved_model)
                eng2.load_state_dict(saved_opt)
            losses = [step(m2, eng2, x, y) for x, y in rest]
            now = eng2.parameters_state_dict()
            eng2.close()
            self.assertEqual(losses, ref_losses, order)
            for n, p in ref.items():
                self.assertTrue(torch.equal(now[n], p), f"{order}: {n} differs")

    def test_refusals(self) -> None:
        import tier.torch

        c = self.client()
        m = torch.nn.Sequential(torch.nn.Linear(4, 4).double())
        with self.assertRaises(TypeError):
            tier.torch.Offload(m, c)
        lin = torch.nn.Linear(4, 4)
        shared = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)
        with self.assertRaises(ValueError) as cm:
            tier.torch.Offload(shared, c, blocks=[shared[0], shared[2]])
        self.assertIn("block '0' is given twice", str(cm.exception))     # one module: one block
        with self.assertRaises(ValueError):
            tier.torch.Offload(torch.nn.Linear(4, 4), c, placement="D")
        nested = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)))
        with self.assertRaises(ValueError):
            tier.torch.Offload(nested, c, blocks=[nested[0], nested[0][0]])

        class Twice(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                return self.lin(self.lin(x))

        m = Twice()
        eng = tier.torch.Offload(m, c, blocks=[m.lin])
        with self.assertRaises(RuntimeError) as cm:
            m(torch.ones(2, 4))
        self.assertIn("twice", str(cm.exception))


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestProcesses(tierd.DaemonTestCase):
    """train_lm.py as users run it: two jobs at once, and two ranks under torchrun."""

    ARGS = ["--steps", "5", "--layers", "2", "--dim", "64", "--context", "32", "--batch", "8",
            "--text-bytes", "262144", "--threads", "1"]

    def run_lm(self, *extra: str, job: str = "lm") -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=os.path.join(tierd.source_dir(), "client", "python"))
        return subprocess.Popen([sys.executable, os.path.join(EXAMPLES, "train_lm.py"), *self.ARGS,
                                 "--socket", self.socket, "--job", job, *extra],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def losses(self, p: subprocess.Popen) -> list[float]:
        out, _ = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, out)
        return [float(x) for x in re.findall(r"loss (\S+)", out)]

    def test_two_jobs_with_quotas(self) -> None:
        alone = self.losses(self.run_lm("--plain"))
        admin = self.client("quota-admin")
        # the jobs exist while these clients hold them: their quotas are set before the training starts,
        # below what their state takes (2.1 MiB), so both go through NVMe at once
        holders = [self.client(j) for j in ("lm-a", "lm-b")]
        for h in holders:
            admin.set_quota(h.job, host=1536 << 10, vram=1 << 20)
            self.assertEqual(admin.quota(h.job).limits["host"], 1536 << 10)
        procs = [self.run_lm(job=h.job) for h in holders]
        a, b = (self.losses(p) for p in procs)
        self.assertEqual(len(alone), 5)
        self.assertEqual(a, alone)
        self.assertEqual(b, alone)
        for h in holders:
            job = [j for j in admin.status()["jobs"] if j["name"] == h.job][0]
            self.assertGreater(job["moved"]["nvme->host"], 0, job)

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "under a preloaded ASan runtime, libtorch's C++ exceptions (gloo's, at the ranks' exit) "
                     "abort in ASan's __cxa_throw interceptor, which finds no real __cxa_throw")
    def test_torchrun_two_ranks(self) -> None:
        one = self.losses(self.run_lm(job="lm-1"))
        env = dict(os.environ, PYTHONPATH=os.path.join(tierd.source_dir(), "client", "python"))
        # --redirects/--tee 2: Debian 12's torchrun (torch 1.13 on Python 3.11) cannot parse their
        # default, 0 (Std.from_str() finds no IntFlag member for 0 there)
        p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                              "--redirects", "2", "--tee", "2",
                              "--master_port", str(29500 + os.getpid() % 1000),
                              os.path.join(EXAMPLES, "train_lm.py"), *self.ARGS, "--socket", self.socket,
                              "--job", "lm-2"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        two = self.losses(p)
        self.assertEqual(len(two), len(one))
        # the same 8 sequences per step, as 2 x 4: the mean of two means and an all-reduced gradient
        # round differently from one mean over 8; the difference stays at float32's rounding
        for i, (x, y) in enumerate(zip(one, two)):
            self.assertAlmostEqual(x, y, delta=1e-4 * abs(x), msg=f"step {i + 1}: {one} vs {two}")

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "under a preloaded ASan runtime, libtorch's C++ exceptions (gloo's, at the ranks' exit) "
                     "abort in ASan's __cxa_throw interceptor, which finds no real __cxa_throw")
    def test_unused_parameter_on_one_rank(self) -> None:
        """Two ranks, one block of two experts, rank r routed to expert r only: each rank's gradient of
        the expert it did not use is zero (DDP with find_unused_parameters=True), so both ranks update
        both experts alike, as one process whose loss is the ranks' mean.  The ranks used to reduce
        different lists (one's expert 0 summed with the other's expert 1) and drift apart, silently."""
        import tempfile

        import tier.torch

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(tierd.source_dir(), "client", "python"),
                                                           os.path.dirname(os.path.abspath(__file__))]))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "params")
            p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "--redirects", "2", "--tee", "2", "--master_port", str(30500 + os.getpid() % 1000),
                                os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_unused.py"),
                                self.socket, "unused", out], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout)
            ranks = [torch.load(f"{out}.{r}") for r in range(2)]
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import rank_unused

        torch.manual_seed(1)
        ref = rank_unused.Net()
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        gens = [torch.Generator().manual_seed(10 + r) for r in range(2)]
        for _ in range(3):
            xs = [torch.randn(2, 4, generator=gens[r]) for r in range(2)]
            # each expert's gradient is one rank's over 2: exactly what the mean of the ranks gives
            for r in range(2):
                (ref(xs[r], r).pow(2).mean() / 2).backward()
            opt.step()
            opt.zero_grad()
        for n, v in ref.state_dict().items():
            self.assertTrue(torch.equal(ranks[0][n], ranks[1][n]), f"{n}: the ranks differ")
            self.assertTrue(torch.equal(ranks[0][n], v), f"{n}: not plain PyTorch's")
        _ = tier.torch


if __name__ == "__main__":
    tierd.main()
