#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Real training loops through tier.torch, bit for bit against the same loop in plain PyTorch.

The parts of a loop beyond ``loss.backward(); step()``: gradient clipping
(``torch.nn.utils.clip_grad_norm_`` itself, a max norm that clips and one
that does not, and its return value), gradient accumulation (2 and 4
micro-batches), two parameter groups with their own weight decay,
schedulers (LambdaLR, cosine, transformers' linear warm-up), activation
checkpointing (torch.utils.checkpoint, reentrant and not; Hugging Face's
gradient_checkpointing_enable()), SGD with momentum, model.state_dict() and
load_state_dict() on a live engine, save and resume in a new process (the
torch.optim way and the streamed one), Hugging Face's Trainer, and what is
refused.  Placement C under a host budget below the state: every block
goes through NVMe every step.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import tierd
import venv

NO_VENV = venv.enter()

try:
    import torch
    from torch.nn.utils import clip_grad_norm_ as EARLY_CLIP     # imported by name before any engine
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None
try:
    import transformers
except ImportError:
    transformers = None

EXAMPLES = os.path.join(tierd.source_dir(), "client", "python", "examples")
VOCAB = 256
CONFIG = """\
[daemon]
linger_sec = 0
[host]
capacity = 128M
segment_size = 16M
job_limit = 96M
[vram]
backend = emulated
capacity = 64M
chunk_size = 8M
job_limit = 32M
[nvme]
target = @DIR@/t0.img:1G
extent_size = 1M
"""


def lm():
    sys.path.insert(0, EXAMPLES)
    import train_lm

    torch.manual_seed(3)
    return train_lm.ByteLM(dim=32, layers=3, heads=2, context=16)


def batches(n: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (4, 17), generator=g) for _ in range(n)]


def lm_loss(m, x):
    return torch.nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, VOCAB), x[:, 1:].reshape(-1))


class Checkpointed(torch.nn.Module if torch else object):
    """ByteLM with each transformer block's forward recomputed in the backward."""

    def __init__(self, inner, reentrant: bool) -> None:
        super().__init__()
        self.inner = inner
        self.reentrant = reentrant

    def forward(self, idx):
        import torch.utils.checkpoint as cp

        m = self.inner
        x = m.tok(idx) + m.pos(torch.arange(idx.shape[1]))
        for b in m.blocks:
            x = cp.checkpoint(b, x, use_reentrant=self.reentrant)
        return m.head(m.ln(x))


def no_grad_forward(model, x):
    with torch.no_grad():
        return lm_loss(model, x)


def groups_of(model, decay: float = 0.1):
    """Hugging Face's two groups: weight decay for matrices, none for biases and norms."""
    dec = [p for n, p in model.named_parameters() if p.ndim >= 2]
    nodec = [p for n, p in model.named_parameters() if p.ndim < 2]
    return [{"params": dec, "weight_decay": decay}, {"params": nodec, "weight_decay": 0.0}]


def loop(model, opt, data, *, accumulate: int = 1, clip: float | None = None, sched=None, engine=None):
    """The same loop for plain PyTorch (opt a torch.optim optimizer) and tier.torch (opt the engine):
    losses and clip norms per step."""
    losses, norms = [], []
    torch.manual_seed(11)
    for i in range(0, len(data), accumulate):
        for x in data[i:i + accumulate]:
            loss = lm_loss(model, x) / accumulate
            loss.backward()
            losses.append(loss.item())
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad()
    return losses, norms


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestLoops(tierd.DaemonTestCase):
    config = CONFIG

    def engine(self, model, job: str, params=None, **kw):
        import tier.torch

        c = self.client(job)
        state = sum(p.numel() * 16 for p in model.parameters())
        c.set_quota(host=max(state // 2, 1 << 20))          # below the state: through NVMe
        kw = {"lr": 1e-3, "placement": "C", **kw}
        eng = tier.torch.Offload(model, c, params if params is not None else model.parameters(), **kw)
        # closed even where the test fails before its own close(): an open engine keeps torch's
        # clip_grad_norm_ replaced, and the next test that checks it fails as well
        self.addCleanup(eng.close, restore=False)
        return eng, c

    def compare(self, name, make, *, steps=4, accumulate=1, clip=None, groups=False, sched=None, rule="adamw",
                **kw):
        """Plain vs tier.torch on the same loop; returns the engine (closed) for more checks."""
        data = batches(steps * accumulate)
        ref = make()
        model = copy.deepcopy(ref)
        if rule == "sgd":
            opt = torch.optim.SGD(groups_of(ref) if groups else ref.parameters(), lr=1e-2, momentum=0.9)
        else:
            opt = torch.optim.AdamW(groups_of(ref) if groups else ref.parameters(), lr=1e-3)
        rs = sched(opt) if sched else None
        ref_losses, ref_norms = loop(ref, opt, data, accumulate=accumulate, clip=clip, sched=rs)
        hyper = {"optimizer": "sgd", "lr": 1e-2, "momentum": 0.9} if rule == "sgd" else {}
        eng, c = self.engine(model, name, groups_of(model) if groups else None, **hyper, **kw)
        es = sched(eng) if sched else None
        losses, norms = loop(model, eng, data, accumulate=accumulate, clip=clip, sched=es, engine=eng)
        self.assertEqual(losses, ref_losses, f"{name}: losses")
        self.assertEqual(norms, ref_norms, f"{name}: clip_grad_norm_'s return values")
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), f"{name}: {n} differs from plain PyTorch's")
        if rs is not None:
            self.assertEqual(es.get_last_lr(), rs.get_last_lr())
        osd, rsd = eng.state_dict(), opt.state_dict()       # the optimizer's too, torch.optim's format
        self.assertEqual(osd["param_groups"], rsd["param_groups"], f"{name}: param_groups")
        for i, st in rsd["state"].items():
            self.assertEqual({k: v.tolist() for k, v in osd["state"][i].items()},
                             {k: v.tolist() for k, v in st.items()}, f"{name}: state {i}")
        eng.close()
        return eng

    # ---- clipping --------------------------------------------------------------------------------

    def test_clip_that_clips(self) -> None:
        eng = self.compare("clip-small", lm, clip=0.05)
        self.assertEqual(eng.mode, "deferred")

    def test_clip_imported_by_name(self) -> None:
        """clip_grad_norm_ imported by name before the engine was made clips through the engine too: it
        was torch's own code, which saw no .grad, returned 0 and clipped nothing (and the first step then
        chose fused mode), silently.  Once the engine is closed it is torch's own again."""
        data = batches(3)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "clip-early")
        rn, tn = [], []
        for x in data:
            lm_loss(ref, x).backward()
            rn.append(EARLY_CLIP(ref.parameters(), 0.05).item())
            opt.step()
            opt.zero_grad()
            lm_loss(model, x).backward()
            tn.append(EARLY_CLIP(model.parameters(), 0.05).item())
            eng.step()
            eng.zero_grad()
        self.assertEqual(tn, rn)
        self.assertEqual(eng.mode, "deferred")
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()
        self.assertIs(torch.nn.utils.clip_grad_norm_, EARLY_CLIP)
        lm_loss(ref, data[0]).backward()
        self.assertGreater(EARLY_CLIP(ref.parameters(), 1e9).item(), 0)

    def test_clip_that_does_not(self) -> None:
        self.compare("clip-large", lm, clip=1e6)

    def test_clip_engine_call_and_inf_norm(self) -> None:
        """engine.clip_grad_norm_() is the same call; the inf-norm too."""
        data = batches(3)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "clip-inf")
        for x in data:
            lm_loss(ref, x).backward()
            lm_loss(model, x).backward()
            a = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01, norm_type=math.inf)
            b = eng.clip_grad_norm_(model.parameters(), 0.01, norm_type=math.inf)
            self.assertTrue(torch.equal(a, b))
            opt.step()
            opt.zero_grad()
            eng.step()
            eng.zero_grad()
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    # ---- accumulation, groups, schedulers, SGD ----------------------------------------------------

    def test_accumulate_2(self) -> None:
        self.compare("acc2", lm, accumulate=2)

    def test_accumulate_4_with_clipping(self) -> None:
        self.compare("acc4", lm, accumulate=4, clip=0.1, steps=2)

    def test_two_groups(self) -> None:
        self.compare("groups", lm, groups=True)

    def test_lambda_lr(self) -> None:
        self.compare("lambda", lm, sched=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + s)))

    def test_cosine(self) -> None:
        self.compare("cosine", lm, groups=True, sched=lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 3))

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_linear_warmup(self) -> None:
        self.compare("warmup", lm, clip=1.0, sched=lambda o: transformers.get_linear_schedule_with_warmup(o, 2, 6))

    def test_sgd_momentum(self) -> None:
        self.compare("sgd", lm, rule="sgd", groups=True)

    # ---- activation checkpointing -------------------------------------------------------------------

    def test_checkpoint_reentrant(self) -> None:
        self.compare("ckpt-re", lambda: Checkpointed(lm(), True))

    def test_checkpoint_non_reentrant(self) -> None:
        self.compare("ckpt-nonre", lambda: Checkpointed(lm(), False), accumulate=2, clip=0.5)

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_hf_gradient_checkpointing(self) -> None:
        def make():
            torch.manual_seed(4)
            m = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32))
            m.gradient_checkpointing_enable()
            return m

        data = batches(3)
        ref = make()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        torch.manual_seed(11)
        rl = []
        for x in data:
            loss = ref(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            rl.append(loss.item())
        eng, _ = self.engine(model, "hf-ckpt")
        torch.manual_seed(11)
        tl = []
        for x in data:
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            eng.step()
            eng.zero_grad()
            tl.append(loss.item())
        self.assertEqual(tl, rl)
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    # ---- state dicts -----------------------------------------------------------------------------------

    def test_model_state_dict_live_and_load(self) -> None:
        """model.state_dict() holds the real values while the engine runs, every name; loading into a
        live engine changes what it trains from, as in plain PyTorch."""
        data = batches(4)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "sd-live")
        sd = model.state_dict()
        self.assertTrue(all(sd[n].numel() == p.numel() for n, p in ref.state_dict().items()))
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        self.assertEqual(model.blocks[0].ln1.state_dict()["weight"].shape, (32,))   # a submodule's too
        # new values into both, mid-training
        loop(ref, opt, data[:2])
        loop(model, eng, data[:2])
        torch.manual_seed(99)
        other = lm().state_dict()
        for k in other:
            other[k] = other[k] * 0.5
        ref.load_state_dict(other)
        model.load_state_dict(other)
        a, _ = loop(ref, opt, data[2:])
        b, _ = loop(model, eng, data[2:])
        self.assertEqual(a, b)
        # a wrong shape is refused, nothing written
        bad = dict(other)
        bad["head.weight"] = torch.zeros(3, 3)
        before = model.state_dict()
        with self.assertRaises(RuntimeError) as cm:
            model.load_state_dict(bad)
        self.assertIn("size mismatch for head.weight", str(cm.exception))
        after = model.state_dict()
        for n in before:
            self.assertTrue(torch.equal(before[n], after[n]), n)
        eng.close()

    def test_optimizer_state_dict_format(self) -> None:
        """engine.state_dict() is torch.optim's, value for value, and loads into a torch AdamW."""
        data = batches(3)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(groups_of(ref), lr=1e-3)
        eng, _ = self.engine(model, "sd-opt", groups_of(model))
        loop(ref, opt, data)
        loop(model, eng, data)
        a, b = opt.state_dict(), eng.state_dict()
        self.assertEqual(sorted(a["state"]), sorted(b["state"]))
        for k in a["state"]:
            for f in ("step", "exp_avg", "exp_avg_sq"):
                self.assertTrue(torch.equal(a["state"][k][f], b["state"][k][f]), (k, f))
        self.assertEqual([{x: y for x, y in g.items() if x != "initial_lr"} for g in a["param_groups"]],
                         [{x: y for x, y in g.items() if x != "initial_lr"} for g in b["param_groups"]])
        fresh = torch.optim.AdamW(groups_of(copy.deepcopy(ref)), lr=1e-3)
        fresh.load_state_dict(b)
        eng.close()

    def test_resume_in_a_new_process(self) -> None:
        """Save after 2 steps, resume in another process, 2 more: the 4 uninterrupted steps' bits; the
        torch.optim way (torch.save of both state dicts) and the streamed one (engine.save)."""
        with tempfile.TemporaryDirectory() as d:
            out = {}
            for how in ("torch", "stream"):
                ckpt = os.path.join(d, how)
                for phase in ("first", "rest"):
                    p = subprocess.run([sys.executable, __file__, "--child", phase, how, ckpt, self.socket],
                                       capture_output=True, text=True, timeout=300)
                    self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                with open(os.path.join(d, how, "result.json")) as f:
                    out[how] = json.load(f)
            whole = subprocess.run([sys.executable, __file__, "--child", "whole", "-", os.path.join(d, "w"),
                                    self.socket], capture_output=True, text=True, timeout=300)
            self.assertEqual(whole.returncode, 0, whole.stdout + whole.stderr)
            with open(os.path.join(d, "w", "result.json")) as f:
                ref = json.load(f)
            for how in ("torch", "stream"):
                self.assertEqual(out[how]["losses"], ref["losses"][2:], how)
                self.assertEqual(out[how]["digest"], ref["digest"], how)

    # ---- refusals ------------------------------------------------------------------------------------

    def test_refusals(self) -> None:
        model = lm()
        eng, _ = self.engine(model, "refuse")
        x = batches(1)[0]
        lm_loss(model, x).backward()
        eng.step()                              # one micro-batch, no clip: fused from now on
        eng.zero_grad()
        self.assertEqual(eng.mode, "fused")
        lm_loss(model, x).backward()
        with self.assertRaises(RuntimeError) as cm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        self.assertIn("optimizer_in_backward=False", str(cm.exception))
        with self.assertRaises(RuntimeError):
            torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
        with self.assertRaises(RuntimeError) as cm:
            lm_loss(model, x).backward()        # accumulation after a fused first step
        self.assertIn("second forward", str(cm.exception))
        eng.step()              # (a closure is taken: test_loops_sched.test_step_with_closure)
        with self.assertRaises(RuntimeError):
            eng.add_param_group({"params": []})
        # a parameter that is not the model's
        import tier.torch

        with self.assertRaises(ValueError):
            tier.torch.Offload(lm(), self.client("refuse2"), [torch.nn.Parameter(torch.zeros(3))])
        m3 = lm()
        with self.assertRaises(ValueError) as cm:
            tier.torch.Offload(m3, self.client("refuse3"), [{"params": list(m3.parameters()), "amsgrad": True}])
        self.assertIn("amsgrad", str(cm.exception))
        self.assertNotEqual(m3.head.weight.numel(), 0)         # refused before anything was taken
        eng.close()
        # torch's own clip_grad_norm_ is back for models without an engine
        plain = lm()
        lm_loss(plain, x).backward()
        self.assertGreater(torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0).item(), 0)

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "under a preloaded ASan runtime, the C++ exception libtorch makes of an error raised in "
                     "__torch_function__ aborts in ASan's __cxa_throw interceptor, which finds no real __cxa_throw")
    def test_grad_read_or_changed_refused(self) -> None:
        """Between backward() and the next forward a parameter's .grad is not None (as after torch's
        backward) and any use of it raises, naming the parameter and what to do: it was None, so a loop
        that scaled or clamped .grad (`if p.grad is not None: p.grad.mul_(0.01)`), or logged its norm,
        silently did nothing.  zero_grad() leaves torch's zeros, the next forward drops it; on, deferred and
        fused."""
        data = batches(3)
        for clip in (1e9, None):        # deferred (a clip), then fused (no clip, one micro-batch)
            ref = lm()
            model = copy.deepcopy(ref)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
            eng, _ = self.engine(model, f"grad-{clip is None:d}")
            for x in data:
                lm_loss(ref, x).backward()
                lm_loss(model, x).backward()
                touched = [p for p in model.parameters() if p.grad is not None]
                self.assertEqual(len(touched), len(list(ref.parameters())))
                with self.assertRaises(RuntimeError) as cm:
                    touched[0].grad.mul_(0.01)
                self.assertIn("is in tierd, not in .grad", str(cm.exception))
                self.assertIn("'tok.weight'", str(cm.exception))
                with self.assertRaises(RuntimeError):
                    sum(p.grad.norm() for p in touched)
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                eng.step()
                opt.zero_grad()
                model.zero_grad()               # (the model's: the engine's too)
                self.assertTrue(all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters())))
            self.assertEqual(eng.mode, "deferred" if clip is not None else "fused")
            sd = model.state_dict()
            for n, p in ref.state_dict().items():
                self.assertTrue(torch.equal(sd[n], p), n)
            eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser, which "
                     "turns it into a C++ throw that ASan's runtime, preloaded into Python, cannot intercept")
    def test_copies_of_the_model(self) -> None:
        """A snapshot taken from the parameters themselves is empty (they are placeholders outside their
        phases): its clone() is refused at once, and loading one of p.detach() is refused as torch refuses
        a size mismatch, with the hint, and changes nothing; it was accepted and restored nothing.  copy.deepcopy(model) (AveragedModel) and
        torch.save(model) are refused with what to do; they made a model of empty parameters whose use
        failed far away.  model.state_dict() is the copy that works."""
        import io

        model = lm()
        eng, _ = self.engine(model, "copies")
        x = batches(1)[0]
        with self.assertRaisesRegex(RuntimeError, r"clone\(\) reading parameter tok\.weight outside its block's "
                                                  r"forward or backward.*model\.state_dict\(\)"):
            {n: p.detach().clone() for n, p in model.named_parameters()}       # (refused at once now)
        best = {n: p.detach() for n, p in model.named_parameters()}    # (empty: tier.torch.guards.Placeholder)
        good = model.state_dict()
        lm_loss(model, x).backward()
        eng.step()
        eng.zero_grad()
        after = model.state_dict()
        with self.assertRaisesRegex(RuntimeError, r"size mismatch for tok\.weight.*model\.state_dict\(\)"):
            model.load_state_dict(best)
        for n, p in model.state_dict().items():
            self.assertTrue(torch.equal(p, after[n]), n)        # nothing changed
        for what in (lambda: copy.deepcopy(model), lambda: torch.save(model, io.BytesIO())):
            with self.assertRaisesRegex(RuntimeError, "cannot be copied or pickled whole"):
                what()
        model.load_state_dict(good)                             # the real values: restored
        for n, p in model.state_dict().items():
            self.assertTrue(torch.equal(p, good[n]), n)
        eng.close()

    def test_step_skipped_by_zero_grad(self) -> None:
        """A step skipped after its backward (a loss that was not finite: zero_grad() instead of step()),
        in the first (traced) step and in a later one, deferred: plain PyTorch's run, bit for bit.  In
        the first step it was refused at the next forward, as a block run twice in one step."""
        for skip_at in (0, 2):
            data = batches(4)
            ref = lm()
            model = copy.deepcopy(ref)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
            eng, _ = self.engine(model, f"skip{skip_at}", optimizer_in_backward=False)
            for i, x in enumerate(data):
                for m, o in ((ref, opt), (model, eng)):
                    lm_loss(m, x).backward()
                    if i != skip_at:
                        o.step()
                    o.zero_grad()
            sd = model.state_dict()
            for n, p in ref.state_dict().items():
                self.assertTrue(torch.equal(sd[n], p), (skip_at, n))
            eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "under a preloaded ASan runtime, the C++ exception libtorch makes of an error raised in an "
                     "autograd hook aborts in ASan's __cxa_throw interceptor, which finds no real __cxa_throw")
    def test_loss_over_two_forwards_refused(self) -> None:
        """A backward must be one forward's: a loss over two forwards (Siamese, contrastive), or after an
        evaluation forward with gradients on, and a second backward over one forward, are refused as the
        backward begins, saying what to do, with nothing of the model changed; zero_grad() and the run goes
        on as plain PyTorch's skipping those steps.  They used to fail inside the backward, as "a block run
        twice" or "parameters outside a phase"."""
        data = batches(5)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "two-forwards", optimizer_in_backward=False)
        for i, x in enumerate(data):
            if i == 0:          # the first step (traced): refused as the backward begins
                with self.assertRaisesRegex(RuntimeError, r"backward\(\) with 2 forwards of this step not yet "
                                            r"backpropagated: .*torch\.cat"):
                    (lm_loss(model, x) + lm_loss(model, data[4])).backward()
                eng.zero_grad()
                continue
            if i == 2:          # planned: refused at the second forward, before it runs
                lm_loss(model, x)
                with self.assertRaisesRegex(RuntimeError, r"micro-batch 2 of this step, where the first step .* had "
                                            r"1: .*torch\.no_grad\(\)"):
                    lm_loss(model, data[4])
                eng.zero_grad()
                continue
            if i == 3:
                loss = lm_loss(model, x)
                loss.backward(retain_graph=True)
                with self.assertRaisesRegex(RuntimeError, "a second backward over the same forward"):
                    loss.backward()
                eng.zero_grad()
                continue
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    def test_step_before_any_backward(self) -> None:
        """step() before the first backward (an accumulation loop off by one, a skipped first batch) does
        nothing, as torch.optim's: the run is plain PyTorch's.  It submitted an empty plan, and every later
        forward was refused as a block that had not run in the first step."""
        data = batches(3)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "step-first")
        for m, o in ((ref, opt), (model, eng)):
            o.step()
            o.zero_grad()
            for x in data:
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
        self.assertEqual(eng.steps, len(data))
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "under a preloaded ASan runtime, the C++ exception libtorch makes of an error raised in an "
                     "autograd hook aborts in ASan's __cxa_throw interceptor, which finds no real __cxa_throw")
    def test_backward_that_raised(self) -> None:
        """A backward that raises partway (a tensor hook, a NaN check).  Deferred, nothing changed:
        zero_grad() drops the partial gradients and the run goes on as plain PyTorch's that skips the
        same steps; anything else first is refused, saying to call zero_grad().  Fused, the blocks whose
        backward ended were updated already: every call is refused, naming them, and close() warns.  The
        engine used to stay "in a backward" for good, with messages about a backward in progress."""
        import tier.torch

        def boom(grad):
            raise ValueError("boom")

        def arm(mod, args, out):
            out.register_hook(boom)             # (returns None: the output stays)

        def raising_backward(m, x):
            h = m.tok.register_forward_hook(arm)
            try:
                with self.assertRaisesRegex(ValueError, "boom"):
                    lm_loss(m, x).backward()
            finally:
                h.remove()

        data = batches(5)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "bwd-raised", optimizer_in_backward=False)
        for i, x in enumerate(data):
            for m, o in ((ref, opt), (model, eng)):
                if i in (0, 3):
                    raising_backward(m, x)
                    if o is eng:
                        for call in (eng.step, lambda: lm_loss(model, x), model.state_dict):
                            with self.assertRaisesRegex(RuntimeError, "after a backward that raised: no "
                                                        r"parameter changed.*call zero_grad\(\)"):
                                call()
                    o.zero_grad()
                    continue
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

        model = lm()
        eng, _ = self.engine(model, "bwd-raised-fused")
        for x in data[:2]:
            lm_loss(model, x).backward()
            eng.step()
            eng.zero_grad()
        self.assertEqual(eng.mode, "fused")
        raising_backward(model, data[2])
        for call in (eng.step, eng.zero_grad, lambda: lm_loss(model, data[3]), model.state_dict, eng.state_dict):
            with self.assertRaisesRegex(RuntimeError, r"after a backward that raised: .* were updated \(.*'head'.*"
                                        r"\), the others not: this step is partly applied"):
                call()
        with self.assertWarnsRegex(tier.torch.TierTorchWarning, "partway through a fused step"):
            eng.close()

    def test_lr_set_between_backward_and_step(self) -> None:
        """llm.c's loop sets each step's learning rate after backward(), before step(), where torch.optim
        reads it: the engine sees the change in its first step and runs the optimizer after the backward
        from then on (deferred), bit for bit as plain PyTorch."""
        data = batches(4)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "lr-late")
        for i, x in enumerate(data):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                for g in o.param_groups:
                    g["lr"] = 1e-3 * (i + 2) / 4
                o.step()
                o.zero_grad()
        self.assertEqual(eng.mode, "deferred")
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    def test_late_changes_refused(self) -> None:
        """What the engine cannot honour raises instead of training something else: a learning rate changed
        between backward() and step() once the optimizer runs in the backward (fused), and an optimizer
        state dict with amsgrad=True (before anything of it is taken)."""
        x = batches(1)[0]
        model = lm()
        eng, _ = self.engine(model, "late-fused")
        lm_loss(model, x).backward()
        eng.step()
        eng.zero_grad()
        self.assertEqual(eng.mode, "fused")
        lm_loss(model, x).backward()
        eng.param_groups[0]["lr"] = 5e-4
        with self.assertRaisesRegex(RuntimeError, r"changed since backward\(\) \(group 0 lr 0.001 -> 0.0005\)"
                                    r".*optimizer_in_backward=False"):
            eng.step()
        eng.close()

        model = lm()
        eng, _ = self.engine(model, "late-amsgrad")
        lm_loss(model, x).backward()
        eng.step()
        before = {k: v for k, v in eng.param_groups[0].items() if k != "params"}
        other = torch.optim.AdamW(lm().parameters(), lr=3e-4, amsgrad=True)
        with self.assertRaisesRegex(ValueError, "amsgrad"):
            eng.load_state_dict(other.state_dict())
        self.assertEqual({k: v for k, v in eng.param_groups[0].items() if k != "params"}, before)
        eng.close()

    def test_fused_step_between_backward_and_step(self) -> None:
        """Fused, the optimizer runs in the backward: between backward() and step() the parameters are this
        step's already.  What would show or skip that (a state dict of the model, of a submodule, of the
        optimizer, a load, zero_grad() to skip the step, an evaluation forward under no_grad, which gave
        the next step's loss) is refused and changes nothing; after step() the
        state dicts match plain PyTorch's, a submodule's too (it was read before the backward)."""
        data = batches(3)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "fused-between")
        for i, x in enumerate(data):
            lm_loss(ref, x).backward()
            opt.step()
            opt.zero_grad()
            if i == 2:
                self.assertEqual(eng.mode, "fused")
                before = model.blocks[0].state_dict()     # read (and kept) before the backward
            lm_loss(model, x).backward()
            if i == 2:
                grads = [p.grad for p in model.parameters()]
                for what, call in (("model.state_dict()", model.state_dict),
                                   ("model.state_dict()", model.blocks[0].state_dict),
                                   ("state_dict()", eng.state_dict),
                                   ("model.load_state_dict()", lambda: model.load_state_dict(ref.state_dict())),
                                   ("zero_grad()", eng.zero_grad), ("zero_grad()", model.zero_grad),
                                   ("a forward", lambda: no_grad_forward(model, x))):
                    with self.assertRaisesRegex(RuntimeError, rf"^{re.escape(what)} between backward\(\) and "
                                                r"step\(\): .*optimizer_in_backward=False"):
                        call()
                self.assertEqual([p.grad for p in model.parameters()], grads)
            eng.step()
            eng.zero_grad()
        sd = model.blocks[0].state_dict()
        for n, p in ref.blocks[0].state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
            self.assertFalse(torch.equal(before[n], p), n)
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    def test_engine_load_refusals(self) -> None:
        """engine.load() refuses, before anything changes, a checkpoint whose parameters sit elsewhere in the
        parameter groups (their hyperparameters would go to other parameters) or whose buffers differ in
        shape; it loads the model's persistent buffers only, as model.load_state_dict() does."""
        def model_with_buffers(n: int) -> torch.nn.Module:
            torch.manual_seed(4)
            m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
            m.register_buffer("scale", torch.full((n,), 2.0))
            m.register_buffer("cache", torch.zeros(3), persistent=False)
            return m

        def halves(m: torch.nn.Module) -> tuple[list, list]:
            ps = list(m.parameters())
            return ps[:2], ps[2:]

        x = torch.randn(2, 8)
        with tempfile.TemporaryDirectory() as d:
            m = model_with_buffers(3)
            a, b = halves(m)
            eng, _ = self.engine(m, "load-src", [{"params": a, "weight_decay": 0.1}, {"params": b, "weight_decay": 0.0}])
            m(x).sum().backward()
            eng.step()
            eng.save(os.path.join(d, "ck"))
            eng.close()

            for n, swap, what in ((3, True, "was number 0 of the saved parameter groups, it is number 2"),
                                  (4, False, r"buffer scale is \(4,\) torch.float32, \(3,\) torch.float32 saved")):
                m2 = model_with_buffers(n)
                a2, b2 = halves(m2)
                first, second = (b2, a2) if swap else (a2, b2)
                eng2, _ = self.engine(m2, f"load-{n}-{swap}", [{"params": first, "weight_decay": 0.1},
                                                               {"params": second, "weight_decay": 0.0}])
                before = eng2.parameters_state_dict()
                groups = [{k: v for k, v in g.items() if k != "params"} for g in eng2.param_groups]
                with self.assertRaisesRegex(ValueError, what):
                    eng2.load(os.path.join(d, "ck"))
                after = eng2.parameters_state_dict()
                self.assertTrue(all(torch.equal(before[k], after[k]) for k in before))
                self.assertEqual([{k: v for k, v in g.items() if k != "params"} for g in eng2.param_groups], groups)
                self.assertTrue(torch.equal(m2.scale, torch.full((n,), 2.0)))
                eng2.close()

            m3 = model_with_buffers(3)
            a3, b3 = halves(m3)
            eng3, _ = self.engine(m3, "load-ok", [{"params": a3, "weight_decay": 0.1},
                                                  {"params": b3, "weight_decay": 0.0}])
            m3.cache.fill_(7.0)
            eng3.load(os.path.join(d, "ck"))
            self.assertTrue(torch.equal(m3.cache, torch.full((3,), 7.0)))     # not persistent: not loaded
            eng3.close()

    def test_optimizer_in_backward_refusals(self) -> None:
        """optimizer_in_backward=True: a clip or a second forward in the first step is refused at once, before
        the step's optimizer phases change anything."""
        x = batches(1)[0]
        for what in ("clip", "accumulate"):
            model = lm()
            eng, _ = self.engine(model, f"oib-{what}", optimizer_in_backward=True)
            before = {k: v.clone() for k, v in eng.parameters_state_dict().items()}
            lm_loss(model, x).backward()
            with self.assertRaisesRegex(RuntimeError, "optimizer_in_backward"):
                if what == "clip":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
                else:
                    lm_loss(model, x)
            after = eng.parameters_state_dict()
            self.assertTrue(all(torch.equal(before[k], after[k]) for k in before))
            eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "under a preloaded ASan runtime, the C++ exception libtorch makes of an error raised in an "
                     "autograd hook aborts in ASan's __cxa_throw interceptor, which finds no real __cxa_throw")
    def test_backward_after_clip_refused(self) -> None:
        """A backward() after this step's clip is refused (torch scales only the gradients before the clip;
        the engine applies the factor to the sum in the optimizer phases)."""
        x = batches(1)[0]
        model = lm()
        eng, _ = self.engine(model, "late-clip")
        lm_loss(model, x).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        with self.assertRaisesRegex(RuntimeError, r"backward\(\) after clip_grad_norm_ in the same step"):
            lm_loss(model, x).backward()
        eng.close()

    def test_deferred_budget_in_the_model_words(self) -> None:
        """A host budget one optimizer phase fits, but not the two that clipping pins at once: the plan
        is refused at the first step's end, naming the phases' blocks, not tierd's phase numbers."""
        import tier

        model = lm()
        c = self.client("deferred-budget")
        import tier.torch

        blocks = tier.torch.layout.build(model, tier.torch.auto_blocks(model))
        largest = max(b.opt_host_bytes(2) for b in blocks)
        c.set_quota(host=largest * 3 // 2)
        eng = tier.torch.Offload(model, c, lr=1e-3, placement="C")
        lm_loss(model, batches(1)[0]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with self.assertRaises(tier.NoSpaceError) as cm:
            eng.step()
        text = str(cm.exception)
        self.assertRegex(text, r"phases \d+ \(optimizer of block \d+ '[a-z.0-9]+' \(\w+\)\) and \d+ \(optimizer of")
        self.assertIn("two blocks' optimizer phases are pinned at once", text)
        eng.close(restore=False)

    def test_write_down_refused_is_counted(self) -> None:
        """A write-down tierd refuses for want of room is counted and warned about once, not raised: the
        copy it would have moved stays valid (what the engine does with such a fence's error).  The warning
        speaks of the block, not of tierd's name of the engine's tensor (it quoted tierd's text as it was)."""
        import errno
        import warnings

        import tier
        import tier.torch

        class Refused:
            def done(self):
                raise tier.NoSpaceError(errno.ENOSPC, "no room to write 'torch.0.0.m' through", "evict")

            wait = done

        eng, _ = self.engine(lm(), "refused")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.assertTrue(eng._fence_done(Refused(), False))
            self.assertTrue(eng._fence_done(Refused(), True))
        self.assertEqual(eng.write_downs_refused, 2)
        said = [str(x.message) for x in w if issubclass(x.category, tier.torch.TierTorchWarning)]
        self.assertEqual(len(said), 1)
        self.assertIn("no room to write m of block 0 'tok' (Embedding) through", said[0])
        self.assertNotIn("torch.0.0.m", said[0])
        eng.close()

    # ---- Hugging Face Trainer -------------------------------------------------------------------------

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_hf_trainer(self) -> None:
        """transformers.Trainer(optimizers=(engine, scheduler)) with max_grad_norm, gradient accumulation
        and save_steps: the same losses, parameters and checkpoints as the same Trainer run without tierd."""
        import tier.torch

        class Data(torch.utils.data.Dataset):
            def __init__(self) -> None:
                self.x = batches(8, seed=21)

            def __len__(self) -> int:
                return 32

            def __getitem__(self, i):
                ids = self.x[i // 4][i % 4]
                return {"input_ids": ids, "labels": ids}

        def make():
            torch.manual_seed(6)
            return transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32))

        def run(use_tier: bool, out: str):
            model = make()
            if use_tier:
                c = self.client("trainer")
                opt = tier.torch.Offload(model, c, groups_of(model, 0.01), lr=5e-4, placement="C")
            else:
                opt = torch.optim.AdamW(groups_of(model, 0.01), lr=5e-4)
            sched = transformers.get_linear_schedule_with_warmup(opt, 2, 4)
            args = transformers.TrainingArguments(
                output_dir=out, max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                max_grad_norm=0.5, save_steps=2, logging_steps=1, seed=7, report_to=[], use_cpu=True,
                dataloader_num_workers=0, disable_tqdm=True, save_safetensors=False)
            tr = transformers.Trainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, sched))
            tr.train()
            losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
            sd = model.state_dict()
            if use_tier:
                opt.close()
            return losses, sd

        with tempfile.TemporaryDirectory() as d:
            ref_losses, ref_sd = run(False, os.path.join(d, "plain"))
            losses, sd = run(True, os.path.join(d, "tier"))
            self.assertEqual(losses, ref_losses)
            for n, p in ref_sd.items():
                self.assertTrue(torch.equal(sd[n], p), n)
            for step in (2, 4):
                a = torch.load(os.path.join(d, "plain", f"checkpoint-{step}", "pytorch_model.bin"))
                b = torch.load(os.path.join(d, "tier", f"checkpoint-{step}", "pytorch_model.bin"))
                self.assertEqual(sorted(a), sorted(b))
                for n in a:
                    self.assertTrue(torch.equal(a[n], b[n]), (step, n))
                oa = torch.load(os.path.join(d, "plain", f"checkpoint-{step}", "optimizer.pt"))
                ob = torch.load(os.path.join(d, "tier", f"checkpoint-{step}", "optimizer.pt"))
                for k in oa["state"]:
                    self.assertTrue(torch.equal(oa["state"][k]["exp_avg_sq"], ob["state"][k]["exp_avg_sq"]))


# ---- the resume test's processes ---------------------------------------------------------------

def child(phase: str, how: str, ckpt: str, socket: str) -> int:
    """first: 2 steps, save; rest: load, 2 steps; whole: 4 steps.  Writes result.json beside ckpt."""
    import hashlib

    import tier
    import tier.torch

    os.makedirs(ckpt, exist_ok=True)
    data = batches(4)
    model = lm()
    c = tier.Client(f"resume-{how}-{phase}", socket=socket)
    eng = tier.torch.Offload(model, c, groups_of(model), lr=1e-3, placement="C")
    sched = torch.optim.lr_scheduler.LambdaLR(eng, lambda s: 0.9 ** s)
    if phase == "rest":
        if how == "torch":
            saved = torch.load(os.path.join(ckpt, "both.pt"))
            model.load_state_dict(saved["model"])
            eng.load_state_dict(saved["opt"])
            sched.load_state_dict(saved["sched"])
        else:
            eng.load(os.path.join(ckpt, "engine"))
            sched.load_state_dict(torch.load(os.path.join(ckpt, "sched.pt")))
        todo = data[2:]
    else:
        todo = data[:2] if phase == "first" else data
    losses, _ = loop(model, eng, todo, clip=0.5, sched=sched)
    if phase == "first":
        if how == "torch":
            torch.save({"model": model.state_dict(), "opt": eng.state_dict(), "sched": sched.state_dict()},
                       os.path.join(ckpt, "both.pt"))
        else:
            eng.save(os.path.join(ckpt, "engine"))
            torch.save(sched.state_dict(), os.path.join(ckpt, "sched.pt"))
    h = hashlib.sha256()
    for n, t in sorted(model.state_dict().items()):
        h.update(n.encode())
        h.update(t.contiguous().numpy().tobytes())
    for k, st in sorted(eng.state_dict()["state"].items()):
        for f in ("exp_avg", "exp_avg_sq"):
            h.update(st[f].contiguous().numpy().tobytes())
        h.update(str(float(st["step"])).encode())
    with open(os.path.join(ckpt, "result.json"), "w") as f:
        json.dump({"losses": losses, "digest": h.hexdigest()}, f)
    eng.close()
    c.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(*sys.argv[2:6]))
    tierd.main()
