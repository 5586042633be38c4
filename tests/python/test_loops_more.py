#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""More of a training loop through tier.torch, against the same loop in plain PyTorch.

An evaluation (``model.eval()`` under ``torch.no_grad()``) inside a step,
between micro-batches, between ``backward()`` and ``step()``, or between a
forward and its backward: bit for bit, and pinned outside the plan (tierd
takes the plan's phases in order: entering the forward phases again there
took it through the step's other phases, and it dropped their gradients as
dead, some of the time).  ``optimizer=`` given a torch.optim optimizer
(class or instance) or an object that is no StepRule: refused before
anything is made, saying what to pass; a torch.optim optimizer kept beside
the engine over its parameters: refused at its step() naming it (one wrapping
the engine, or over other parameters, is not that one).  .grad
after zero_grad(set_to_none=False): torch's zeros, a change in place through
its .data or a view refused as on .grad.  A OneCycleLR checkpoint (its
state_dict() pickles the engine in torch 1.13): refused in the engine's
words, with what to drop, and resumed bit for bit so.  torch.autograd.grad() through the
model or with respect to a parameter: refused before anything runs (a saliency map between fused
steps applied an update from no gradients); a torch.jit.script calling it compiles while an engine
lives; after such a refusal with retain_graph=True the forward's own backward is the step's.  A plain optimizer's state dict over a model with a
frozen parameter: the engine's refusal says why and what to pass.  Placement C under a host budget
below the state, as test_loops.
"""

from __future__ import annotations

import copy
import os
import unittest
import numpy

import tierd
from test_loops import CONFIG, NO_VENV, VOCAB, batches, lm, lm_loss  # noqa: F401  (NO_VENV: the venv is entered)

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None


def evaluate(model, x) -> float:
    model.eval()
    with torch.no_grad():
        loss = lm_loss(model, x).item()
    model.train()
    return loss


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestLoopsMore(tierd.DaemonTestCase):
    config = CONFIG

    def engine(self, model, job: str, **kw):
        import tier.torch

        c = self.client(job)
        state = sum(p.numel() * 16 for p in model.parameters())
        c.set_quota(host=max(state // 2, 1 << 20))          # below the state: through NVMe
        eng = tier.torch.Offload(model, c, **{"lr": 1e-3, "placement": "C", **kw})
        self.addCleanup(eng.close, restore=False)
        return eng, c

    def test_evaluation_inside_a_step(self) -> None:
        """Evaluations where plain PyTorch sees the last step's parameters: after each micro-batch's
        backward (accumulation, clipping: deferred), and between a forward and its backward (fused, with
        activations in tierd).  Every loss, evaluation, norm and parameter equal; and no plan phase is
        entered for such an evaluation (tierd would go on through the step's other phases: gradients and
        activations still to be read dropped as dead)."""
        held = batches(1, seed=9)[0]
        cases = {"deferred": (2, "after backward", {}),
                 "fused": (1, "before backward", {"offload_activations": True, "activation_min_bytes": 256})}
        for name, (accumulate, where, kw) in cases.items():
            with self.subTest(name):
                data = batches(4 * accumulate)
                ref = lm()
                model = copy.deepcopy(ref)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng, c = self.engine(model, f"eval-{name}", **kw)
                entered: list[int] = []
                phase = c.phase
                c.phase = lambda k: (entered.append(k), phase(k))[1]

                def run(m, o, in_step: list[int] | None):
                    out = []
                    torch.manual_seed(11)
                    for i in range(0, len(data), accumulate):
                        for x in data[i:i + accumulate]:
                            loss = lm_loss(m, x) / accumulate
                            if where == "before backward":
                                n = len(entered)
                                out.append(evaluate(m, held))
                                if in_step is not None:
                                    in_step += entered[n:]
                            loss.backward()
                            out.append(loss.item())
                            if where == "after backward":
                                n = len(entered)
                                out.append(evaluate(m, held))
                                if in_step is not None:
                                    in_step += entered[n:]
                        if accumulate > 1:
                            out.append(torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5).item())
                        o.step()
                        o.zero_grad()
                    return out

                want = run(ref, opt, None)
                in_step: list[int] = []
                got = run(model, eng, in_step)
                self.assertEqual(eng.mode, name)
                self.assertEqual(in_step, [], f"{name}: plan phases entered for an evaluation inside a step")
                self.assertEqual(got, want, f"{name}: losses, evaluations, norms")
                sd = model.state_dict()
                for n, p in ref.state_dict().items():
                    self.assertTrue(torch.equal(sd[n], p), f"{name}: {n} differs from plain PyTorch's")
                # an evaluation after step() still goes by the plan (its forward phases come next)
                n = len(entered)
                self.assertEqual(evaluate(model, held), evaluate(ref, held))
                self.assertGreater(len(entered), n)
                eng.close()

    def test_zero_grad_of_a_module_around_the_model(self) -> None:
        """zero_grad() of a module around the engine's model (DistributedDataParallel's kind: the model as
        .module, and a parameter of its own): set_to_none=False failed on the first parameter whose gradient
        is in tierd ("... to drop them, zero_grad()"), after zeroing the parameters before it; and at the top
        of the loop, either set_to_none, the engine never heard of it (the forward had dropped the .grad it
        would zero), refusing the backward as a loop without zero_grad().  It drops the engine's gradients
        now, as the model's zero_grad() does, then zeroes the rest as torch's: bit for bit, fused and
        deferred, top and bottom.  One holding only some of the engine's parameters (a block, and a
        parameter of its own) is refused with set_to_none=False where a gradient is in tierd, before
        anything changes."""
        class Around(torch.nn.Module):
            def __init__(self, module) -> None:
                super().__init__()
                self.gain = torch.nn.Parameter(torch.ones(()))
                self.module = module

            def forward(self, x):
                return self.module(x) * self.gain

        for kw, top, none in [(kw, top, none) for kw in ({}, {"optimizer_in_backward": False})
                              for top in (False, True) for none in (False, True)]:
            what = f"{kw} {'top' if top else 'bottom'} set_to_none={none}"
            ref = lm()
            model = copy.deepcopy(ref)
            eng, _ = self.engine(model, "around", **kw)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
            wref, wmodel = Around(ref), Around(model)
            for i, x in enumerate(batches(3)):
                for w, o in ((wref, opt), (wmodel, eng)):
                    loss = lm_loss(w, x)
                    if top:
                        w.zero_grad(set_to_none=none)
                    loss.backward()
                    o.step()
                    if not top:
                        w.zero_grad(set_to_none=none)
                    if w is wref:
                        want, gain = loss.item(), wref.gain.grad
                self.assertEqual(loss.item(), want, f"step {i}: {what}")
                self.assertTrue(gain is None and wmodel.gain.grad is None or torch.equal(wmodel.gain.grad, gain),
                                f"step {i}: {what}")
            sd = model.state_dict()
            for n, p in ref.state_dict().items():
                self.assertTrue(torch.equal(sd[n], p), f"{n} differs from plain PyTorch's: {what}")
            eng.close()

        model = lm()
        eng, _ = self.engine(model, "around-part")
        part = Around(model.blocks[0])
        lm_loss(model, batches(1)[0]).backward()
        eng.step()
        part.gain.grad = torch.ones(())
        with self.assertRaisesRegex(RuntimeError, r"zero_grad\(set_to_none=False\) on a module holding some of a "
                                                  r"tier.torch engine's parameters.*nothing changed"):
            part.zero_grad()
        self.assertTrue(torch.equal(part.gain.grad, torch.ones(())))
        part.zero_grad(set_to_none=True)            # (as .grad = None by hand)
        self.assertIsNone(part.gain.grad)
        eng.zero_grad()

    def test_torch_optimizer_as_optimizer_refused(self) -> None:
        """optimizer=torch.optim.AdamW (the class), an instance, or an object that is no StepRule: a
        ValueError saying what to pass (AttributeError, or "lr= go to the StepRule", before), raised before
        anything is made: the model keeps its parameters, tierd has none of its tensors.  LBFGS (class or
        "lbfgs"), which calls the closure several times per step, says so."""
        import tier.torch

        model = lm()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        c = self.client("optimizer-given")
        for given, kw, say in ((torch.optim.AdamW, {"lr": 1e-3}, r"optimizer='adamw'"),
                               (torch.optim.SGD, {}, r"optimizer='sgd'"),
                               (torch.optim.Adam(lm().parameters()), {}, r"'adamw' or 'sgd'"),
                               # (several closure calls a step: named, not "it has 'adamw' or 'sgd'" alone)
                               (torch.optim.LBFGS, {}, r"LBFGS calls its closure several times per step"),
                               ("lbfgs", {}, r"LBFGS calls its closure several times per step"),
                               (object(), {}, r"not a StepRule: it lacks name, state_kinds, defaults")):
            with self.subTest(given=given):
                with self.assertRaisesRegex(ValueError, say):
                    tier.torch.Offload(model, c, optimizer=given, **kw)
                for n, p in model.named_parameters():
                    self.assertTrue(torch.equal(p, before[n]), n)
        eng = tier.torch.Offload(model, c, optimizer="adamw", lr=1e-3)     # and the way it says works
        eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser")
    def test_torch_optimizer_beside_the_engine_refused(self) -> None:
        """A torch.optim optimizer kept over model.parameters() beside the engine (the loop's old one): its
        step() was refused as a use of .grad ("to clip, call clip_grad_norm_ ... scale the loss") or as
        weight clipping, where what is wrong is that optimizer.  Refused now naming it and the parameter,
        saying to give the parameters to the engine's groups; the engine's step goes on bit for bit."""
        data = batches(3)
        for kind in ("AdamW", "SGD"):
            with self.subTest(kind):
                ref = lm()
                model = copy.deepcopy(ref)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng, _ = self.engine(model, f"beside-{kind}")
                other = torch.optim.AdamW(model.parameters(), lr=1e-3) if kind == "AdamW" else \
                    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
                for i, x in enumerate(data):
                    lm_loss(ref, x).backward()
                    lm_loss(model, x).backward()
                    if i == 1:
                        for what, call in (("step", other.step), ("zero_grad", other.zero_grad)):
                            with self.assertRaisesRegex(RuntimeError, rf"^{kind}\.{what}\(\) on parameter "
                                                        r"tok\.weight, which a tier\.torch engine holds .* belongs to "
                                                        r"the engine.* give it to the engine's parameter groups"):
                                call()
                    opt.step()
                    eng.step()
                    opt.zero_grad()
                    eng.zero_grad()
                sd = model.state_dict()
                for n, p in ref.state_dict().items():
                    self.assertTrue(torch.equal(sd[n], p), f"{kind}: {n}")
                eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser")
    def test_optimizer_around_or_apart_from_the_engine_keeps_its_words(self) -> None:
        """A torch.optim.Optimizer that wraps the engine (accelerate's AcceleratedOptimizer: its step() reads
        the gradients, for its GradScaler, before it calls the engine's) or one over other parameters (a
        GAN's other model's, whose step(closure) reads this model's .grad) was taken for an optimizer beside
        the engine: "give it to the engine's parameter groups and call the engine's step() instead", where
        the engine's step() is called and what is wrong is the read of .grad.  Their refusal says that now
        (clip with clip_grad_norm_, scale the loss); the run goes on bit for bit."""

        class Wrapping(torch.optim.Optimizer):
            def __init__(self, inner) -> None:          # (no super().__init__(), as accelerate's)
                self.optimizer = inner

            @property
            def param_groups(self):
                return self.optimizer.param_groups

            def step(self, closure=None):
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.norm()           # (a GradScaler's unscale_() reads them so)
                return self.optimizer.step(closure)

            def zero_grad(self, set_to_none: bool = False) -> None:
                self.optimizer.zero_grad(set_to_none)

        data = batches(3)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "around")
        wrapped = Wrapping(eng)
        other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        p = next(model.parameters())
        words = r"^the gradient of parameter 'tok\.weight' is in tierd, not in \.grad.*To clip, call"
        for i, x in enumerate(data):
            lm_loss(ref, x).backward()
            lm_loss(model, x).backward()
            if i == 1:
                with self.assertRaisesRegex(RuntimeError, words):
                    wrapped.step()
                with self.assertRaisesRegex(RuntimeError, words):
                    other.step(lambda: p.grad.norm())
            opt.step()
            eng.step()
            opt.zero_grad()
            wrapped.zero_grad()
        sd = model.state_dict()
        for n, q in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], q), n)
        eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser")
    def test_grad_after_zero_grad_reads_zeros(self) -> None:
        """zero_grad(set_to_none=False) (torch 1.13's default, the engine's or the model's): torch leaves
        zeros in each .grad that was a tensor; the engine left None.  Now .grad reads as torch's (None or
        zeros, the same norm), a change in place of it is refused saying why, zero_() passes; a step() with
        no backward after it updates with zeros as torch's does, and set_to_none=True leaves None: bit for
        bit, fused and deferred."""
        data = batches(4)
        for clip in (None, 1e9):
            with self.subTest(clip=clip):
                ref = lm()
                model = copy.deepcopy(ref)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng, _ = self.engine(model, f"zeroed-{clip}")
                for i, x in enumerate(data):
                    for m, o in ((ref, opt), (model, eng)):
                        lm_loss(m, x).backward()
                        if clip is not None:
                            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
                        o.step()
                        if i == 2:
                            o.zero_grad(set_to_none=True)
                        (m if i % 2 else o).zero_grad(set_to_none=False)
                    for (n, q), p in zip(ref.named_parameters(), model.parameters()):
                        self.assertEqual(p.grad is None, q.grad is None, n)
                        if q.grad is not None:
                            self.assertTrue(torch.equal(p.grad, q.grad), n)
                            self.assertEqual(p.grad.norm().item(), 0.0)
                    p = next(model.parameters())
                    if p.grad is None:
                        continue                # (after set_to_none=True: None in both)
                    p.grad.zero_()
                    with self.assertRaisesRegex(RuntimeError, r"parameter 'tok\.weight''s \.grad holds the zeros "
                                                r"zero_grad\(set_to_none=False\) left.*add_\(\) is refused"):
                        p.grad.add_(1.0)
                    with self.assertRaisesRegex(RuntimeError, r"__setitem__\(\) is refused"):
                        p.grad[0] = 1.0
                opt.step()                      # (no backward: zeros, AdamW's moments and weight decay move)
                eng.step()
                sd = model.state_dict()
                for n, p in ref.state_dict().items():
                    self.assertTrue(torch.equal(sd[n], p), n)
                self.assertEqual(eng.mode, "fused" if clip is None else "deferred")
                eng.zero_grad(set_to_none=True)
                self.assertTrue(all(p.grad is None for p in model.parameters()))
                eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser")
    def test_grad_zeroed_through_views_and_keywords(self) -> None:
        """.grad after zero_grad(set_to_none=False) through what shares its memory in torch (.data,
        detach(), an index, view()): a change in place there changed zeros made for that one read and was
        lost silently (p.grad.data.fill_(1): torch's step() used the ones, the engine's zeros); refused now
        as on .grad itself.  Another tensor changed in place reading .grad (buf.copy_(p.grad)) passes, as
        torch's (it was refused as a change of .grad).  A .grad in a keyword's list
        (torch.stack(tensors=[...])) was the placeholder's empty tensor: now the zeros, as torch's.  The
        run goes on bit for bit."""
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "zeroed-views")
        for x in batches(2):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad(set_to_none=False)
            for (n, q), p in zip(ref.named_parameters(), model.parameters()):
                self.assertTrue(torch.equal(torch.cat(tensors=[p.grad.reshape(-1)]), q.grad.reshape(-1)), n)
                self.assertTrue(torch.equal(p.grad.data, q.grad.data), n)
                self.assertEqual(torch.stack(tensors=[p.grad]).shape, (1, *q.shape), n)
            p = next(model.parameters())
            for what, change in (("fill_", lambda: p.grad.data.fill_(1.0)),
                                 ("__setitem__", lambda: p.grad.data.__setitem__(0, 1.0)),
                                 ("fill_", lambda: p.grad[0].fill_(1.0)),
                                 ("add_", lambda: p.grad.detach()[0, 0].add_(1.0)),
                                 ("__setitem__", lambda: p.grad.view(-1).__setitem__(0, 1.0)),
                                 ("copy_", lambda: p.grad.data.copy_(torch.ones(p.shape)))):
                with self.subTest(what):
                    with self.assertRaisesRegex(RuntimeError, r"parameter 'tok\.weight''s \.grad holds the zeros "
                                                rf"zero_grad\(set_to_none=False\) left.*{what}\(\) is refused"):
                        change()
            a = p.grad.numpy()                      # the zeros read, read-only: a write there would be lost
            self.assertTrue(numpy.array_equal(a, q_grad_numpy := next(ref.parameters()).grad.numpy()))
            self.assertEqual(q_grad_numpy.shape, a.shape)
            with self.assertRaisesRegex(ValueError, "read-only"):
                a[0, 0] = 1.0
            p.grad.data.zero_()                     # (zeros stay zeros: passes, as on .grad)
            self.assertEqual(p.grad.norm().item(), 0.0)
            # another tensor changed in place reading .grad reads its zeros (it was refused as a change of .grad)
            q = next(ref.parameters())
            for what, read in (("copy_", lambda g, b: b.copy_(g)),
                               ("add_", lambda g, b: b.mul_(0.9).add_(g, alpha=0.1)),
                               ("out=", lambda g, b: torch.add(torch.ones(g.shape), g, out=b)),
                               ("__setitem__", lambda g, b: b.__setitem__(slice(None), g)),
                               ("_foreach_add_", lambda g, b: torch._foreach_add_([b], [g]))):
                with self.subTest(what):
                    mine, theirs = torch.full(p.shape, 2.0), torch.full(p.shape, 2.0)
                    read(p.grad, mine)
                    read(q.grad, theirs)
                    self.assertTrue(torch.equal(mine, theirs), what)
        sd = model.state_dict()
        for n, q in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], q), n)
        eng.close()

    def test_hyperparameters_by_name(self) -> None:
        """torch.optim's other hyperparameters given to Offload by name, as to torch.optim.SGD and AdamW
        (the classic ResNet recipe's nesterov=True, maximize=): a TypeError "unexpected keyword argument"
        before, with no word of what to do.  Taken now as the parameter groups' defaults, bit for bit; one
        the rule cannot honour refused as a group's is (amsgrad=True), and one neither knows still a
        TypeError, naming the rule's hyperparameters; the model keeps its parameters."""
        import tier.torch

        for rule, kw in (("sgd", {"lr": 1e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
                         ("adamw", {"lr": 1e-3, "maximize": True, "foreach": True})):   # (foreach: the same bits)
            with self.subTest(rule=rule):
                ref = lm()
                model = copy.deepcopy(ref)
                cls = torch.optim.SGD if rule == "sgd" else torch.optim.AdamW
                opt = cls(ref.parameters(), **kw)
                eng, _ = self.engine(model, f"by-name-{rule}", optimizer=rule, **kw)
                for x in batches(3):
                    for m, o in ((ref, opt), (model, eng)):
                        lm_loss(m, x).backward()
                        o.step()
                        o.zero_grad()
                sd = model.state_dict()
                for n, p in ref.state_dict().items():
                    self.assertTrue(torch.equal(sd[n], p), n)
                self.assertEqual(eng.state_dict()["param_groups"], opt.state_dict()["param_groups"])
        model = lm()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        c = self.client("by-name-refused")
        with self.assertRaisesRegex(ValueError, r"amsgrad=True: tier\.torch's AdamW keeps no max_exp_avg_sq"):
            tier.torch.Offload(model, c, lr=1e-3, amsgrad=True)
        with self.assertRaisesRegex(TypeError, r"unexpected keyword argument 'nesterov'.*AdamW's hyperparameters "
                                               r"are lr, betas"):
            tier.torch.Offload(model, c, lr=1e-3, nesterov=True)
        # torch.optim's keys the rules take and cannot honour: differentiable=True (torch 1.13's SGD records
        # its update in autograd; tier.torch's runs outside it) and fused=True (torch 2's fused kernels): they
        # were taken and ignored, silently, by name or in a group
        with self.assertRaisesRegex(ValueError, r"differentiable=True: tier\.torch's optimizer step is not recorded"):
            tier.torch.Offload(model, c, optimizer="sgd", lr=1e-2, differentiable=True)
        for rule in ("sgd", "adamw"):
            with self.subTest(rule=rule), self.assertRaisesRegex(ValueError, r"fused=True: tier\.torch's "):
                tier.torch.Offload(model, c, [{"params": list(model.parameters()), "fused": True}], optimizer=rule,
                                   lr=1e-2)
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p, before[n]), n)

    def test_one_cycle_checkpoint(self) -> None:
        """torch 1.13's OneCycleLR keeps a method of itself in its state_dict(), so saving that pickles the
        engine: refused in the engine's words (before: the model's, "a model ... cannot be copied"), saying to
        drop 'anneal_func'; done so, a checkpoint of the model, the engine and the scheduler taken after 2
        steps and loaded into a new model, engine and scheduler goes on as 4 steps uninterrupted, bit for
        bit (losses, parameters, the scheduler's lr and betas).  torch.save(engine) says the same;
        torch.save(model) still says the model's."""
        import io

        data = batches(4)

        def sched(o):
            return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-2, total_steps=4)

        def steps(m, o, s, xs):
            out = []
            for x in xs:
                loss = lm_loss(m, x)
                loss.backward()
                o.step()
                s.step()
                o.zero_grad()
                out.append((loss.item(), s.get_last_lr(), o.param_groups[0]["betas"]))
            return out

        ref = lm()
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        torch.manual_seed(11)
        want = steps(ref, opt, sched(opt), data)

        model = lm()
        eng, _ = self.engine(model, "onecycle-1")
        s = sched(eng)
        torch.manual_seed(11)
        got = steps(model, eng, s, data[:2])
        rng = torch.get_rng_state()                 # (lm() seeds its own)
        with self.assertRaisesRegex(RuntimeError, r"a tier.torch engine cannot be copied or pickled.*"
                                                  r"sd.pop\('anneal_func'\)"):
            torch.save(s.state_dict(), io.BytesIO())
        with self.assertRaisesRegex(RuntimeError, r"save engine.state_dict\(\)"):
            torch.save(eng, io.BytesIO())
        with self.assertRaisesRegex(RuntimeError, r"a model offloaded by tier.torch cannot be copied"):
            torch.save(model, io.BytesIO())
        sd = s.state_dict()
        sd.pop("anneal_func")
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": eng.state_dict(), "sched": sd}, buf)
        eng.close()
        buf.seek(0)
        ck = torch.load(buf)
        model2 = lm()
        eng2, _ = self.engine(model2, "onecycle-2")
        s2 = sched(eng2)
        model2.load_state_dict(ck["model"])
        eng2.load_state_dict(ck["opt"])
        s2.load_state_dict(ck["sched"])
        torch.set_rng_state(rng)
        got += steps(model2, eng2, s2, data[2:])
        self.assertEqual(got, want)
        sd = model2.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), f"{n} differs from plain PyTorch's")
        eng2.close()


    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in autograd's hook or end-of-backward callback, through C++, which "
                     "ASan's runtime, preloaded into Python, cannot intercept")
    def test_sparse_gradient_refused(self) -> None:
        """A sparse gradient from the functional ``F.embedding(..., sparse=True)`` (an nn.Embedding with
        sparse=True is refused at Offload(), a function cannot be seen there) failed in autograd's
        end-of-backward callback in torch's words, "copy_() between dense and sparse Tensors is not
        implemented", the engine left as if the backward had ended.  Refused now, naming the parameter,
        before its block's gradients go into tierd, and saying what state the step is in: deferred, nothing
        applied, zero_grad() skips the step and training goes on as plain PyTorch's; fused, a later step
        whose sparse gradient comes after other blocks were updated is partly applied, said so."""
        import torch.nn.functional as F

        class Emb(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(VOCAB, 16))
                self.sparse = True

            def forward(self, x):
                return F.embedding(x, self.weight, sparse=self.sparse)

        class Net(torch.nn.Module):
            def __init__(self, mid: bool) -> None:
                super().__init__()
                self.l0 = torch.nn.Embedding(VOCAB, 16)
                self.emb, self.l1, self.l2 = Emb(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
                self.mid = mid

            def forward(self, x):
                h = self.l1(self.l0(x) + self.emb(x)) if self.mid else self.l1(self.emb(x))
                return self.l2(torch.relu(h))

        def run(m, o, x) -> None:
            m(x).pow(2).mean().backward()
            o.step()
            o.zero_grad()

        data = [torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(i)) for i in range(4)]
        torch.manual_seed(1)
        ref = Net(False)
        ref.emb.sparse = False
        model = copy.deepcopy(ref)
        model.emb.sparse = True
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "sparse")
        with self.assertRaisesRegex(RuntimeError, r"^a torch\.sparse_coo gradient of parameter emb\.weight \(block "
                                                  r"\d 'emb' \(Emb\).*F\.embedding\(\.\.\., sparse=True\).*then call "
                                                  r"zero_grad\(\) .*nothing was applied"):
            model(data[0]).pow(2).mean().backward()
        with self.assertRaisesRegex(RuntimeError, r"^step\(\) after a backward that raised"):
            eng.step()
        eng.zero_grad()
        model.emb.sparse = False
        for x in data[1:]:
            for m, o in ((ref, opt), (model, eng)):
                run(m, o, x)
        sd, rsd = model.state_dict(), ref.state_dict()
        self.assertEqual([k for k in rsd if not torch.equal(sd[k], rsd[k])], [], "the refused step skipped")
        # fused (one forward and backward in the first step): a later sparse gradient after blocks were updated
        model = Net(True)
        model.emb.sparse = False
        eng, _ = self.engine(model, "sparse-fused")
        run(model, eng, data[0])
        self.assertEqual(eng.mode, "fused")
        model.emb.sparse = True
        with self.assertRaisesRegex(RuntimeError, r"^a torch\.sparse_coo gradient of parameter emb\.weight .*the "
                                                  r"blocks whose backward had ended were updated \(block \d 'l2'"
                                                  r".*this step is partly applied"):
            model(data[1]).pow(2).mean().backward()
        with self.assertRaisesRegex(RuntimeError, r"^zero_grad\(\) after a backward that raised: .*partly applied"):
            eng.zero_grad()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "raises through torch's C++ (autograd's hooks), which ASan's interceptors abort on")
    def test_autograd_grad_through_the_model_refused(self) -> None:
        """torch.autograd.grad() (a saliency map between steps, through the embedding's output) ran a
        backward that the engine took for the next step's: fused, every block reached ran its optimizer
        phase, an AdamW update from the zeros zero_grad() left (plain PyTorch made none), and the next
        forward was refused saying that update came from the first micro-batch's gradients; deferred, that
        forward was refused as a second micro-batch.  With respect to a parameter it was refused as a read
        of the placeholder, advising an EMA.  Both are refused now, in their own words, before anything is
        computed or applied; zero_grad() drops the open forward and the run goes on as plain PyTorch's.
        torch.autograd.grad() over another model while the engine's forward is open is not refused."""
        from torch.autograd import grad as early_grad      # (bound before the engine: refused too)

        def saliency(model, x, grad_fn):
            model.eval()
            cap = {}
            h = model.tok.register_forward_hook(lambda mod, inp, out: cap.setdefault("e", out))
            try:
                out = lm_loss(model, x)
            finally:
                h.remove()
                model.train()
            return grad_fn(out, cap["e"])[0]

        data = batches(4)
        for name, kw in (("fused", {}), ("deferred", {"optimizer_in_backward": False})):
            with self.subTest(name):
                ref = lm()
                model = copy.deepcopy(ref)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng, _ = self.engine(model, f"agrad-{name}", **kw)
                for i, x in enumerate(data):
                    grad_fn = (torch.autograd.grad, early_grad)[i % 2]
                    opt.zero_grad()
                    lm_loss(ref, x).backward()
                    opt.step()
                    loss = lm_loss(model, x)
                    if i >= 2:
                        # another model's gradient while the engine's forward is open (a discriminator's
                        # gradient penalty): torch's, and the step goes on
                        z = torch.ones(3, requires_grad=True)
                        self.assertTrue(torch.equal(grad_fn((z * z).sum(), z)[0], 2 * z.detach()))
                    loss.backward()
                    eng.step()
                    eng.zero_grad()
                    self.assertEqual(eng.mode, name)
                    if i == 0:
                        saliency(ref, x, torch.autograd.grad)          # (plain PyTorch: changes nothing)
                        with self.assertRaisesRegex(RuntimeError, r"^a backward through a tier\.torch engine's "
                                                                  r"model that puts no gradient into its "
                                                                  r"parameters.*nothing was computed or applied.*"
                                                                  r"zero_grad\(\) drops it"):
                            saliency(model, x, grad_fn)
                        eng.zero_grad()
                    elif i == 1:
                        loss = lm_loss(model, x)
                        with self.assertRaisesRegex(RuntimeError, r"^torch\.autograd\.grad\(\) with respect to "
                                                                  r"parameter head\.weight of a tier\.torch engine"):
                            grad_fn(loss, [model.head.weight])
                        eng.zero_grad()
                sd, rsd = model.state_dict(), ref.state_dict()
                self.assertEqual([k for k in rsd if not torch.equal(sd[k], rsd[k])], [])


    def test_autograd_grad_scripted_while_an_engine_lives(self) -> None:
        """torch.jit.script of a function calling torch.autograd.grad() (a gradient penalty, a force as
        the gradient of an energy), over tensors outside the model, while an engine lived: the engine had put
        its wrapper in torch.autograd.grad's place, which TorchScript compiles to aten::grad only by the
        identity of torch's own function object, so every such script failed ("Compiled functions can't take
        variable number of arguments").  It compiles now, and the engine trains on as plain PyTorch."""
        def penalty(x: torch.Tensor) -> torch.Tensor:
            g = torch.autograd.grad([(x * x * x).sum()], [x], create_graph=True)[0]
            assert g is not None
            return (g * g).sum()

        x, y = batches(2)
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng, _ = self.engine(model, "agrad-jit")
        scripted = torch.jit.script(penalty)
        z = torch.arange(3.0, requires_grad=True)
        self.assertTrue(torch.equal(scripted(z), penalty(z)))
        for m, o in ((ref, opt), (model, eng)):
            for b in (x, y):
                lm_loss(m, b).backward()
                o.step()
                o.zero_grad()
        sd, rsd = model.state_dict(), ref.state_dict()
        self.assertEqual([k for k in rsd if not torch.equal(sd[k], rsd[k])], [])

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "raises through torch's C++ (autograd's hooks), which ASan's interceptors abort on")
    def test_autograd_grad_scripted_through_the_model_refused(self) -> None:
        """A TorchScript function calling torch.autograd.grad() (compiled to aten::grad, past tier.torch's
        Python wrapper) through the model (a saliency map: the gradient of the embedding's output): fused,
        every block reached ran its optimizer phase, an AdamW update from the zeros zero_grad() left, silently;
        deferred, the next forward was refused as a second micro-batch.  The engine itself now tells, in its
        first backward hook, a backward that puts no gradient into any of its parameters (autograd.grad(), or
        backward(inputs=...) without one of them) and refuses it before any phase is entered; zero_grad()
        drops the open forward and the run goes on as plain PyTorch's.  backward(inputs=[some parameters])
        and torch.autograd.backward() are not refused."""
        @torch.jit.script
        def scripted_grad(out: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
            g = torch.autograd.grad([out], [e])[0]
            assert g is not None
            return g

        def with_embedding(model, x):
            cap = {}
            h = model.tok.register_forward_hook(lambda mod, inp, out: cap.setdefault("e", out))
            try:
                return lm_loss(model, x), cap["e"]
            finally:
                h.remove()

        nothing = r"a backward through a tier\.torch engine's model that puts no gradient into its parameters"
        data = batches(4)
        for name, kw in (("fused", {}), ("deferred", {"optimizer_in_backward": False})):
            with self.subTest(name):
                ref = lm()
                model = copy.deepcopy(ref)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng, _ = self.engine(model, f"agrad-jit-{name}", **kw)
                for i, x in enumerate(data):
                    opt.zero_grad()
                    for m in (ref, model):
                        if i == 1:      # (a partial backward: the parameters named get their gradients)
                            lm_loss(m, x).backward(inputs=[m.head.weight, m.tok.weight])
                        else:
                            torch.autograd.backward(lm_loss(m, x))
                    opt.step()
                    eng.step()
                    eng.zero_grad()
                    self.assertEqual(eng.mode, name)
                    if i == 0:
                        # (TorchScript's interpreter puts its traceback before the message)
                        with self.assertRaisesRegex(RuntimeError, rf"(?m)^RuntimeError: {nothing}.*nothing was "
                                                                  r"computed or applied.*zero_grad\(\) drops it"):
                            scripted_grad(*with_embedding(model, x))
                        eng.zero_grad()
                        with self.assertRaisesRegex(RuntimeError, r"torch\.autograd\.grad\(\) with respect to "
                                                                  r"parameter head\.weight of a tier\.torch engine"):
                            scripted_grad(lm_loss(model, x), model.head.weight)
                        eng.zero_grad()
                        out, e = with_embedding(model, x)
                        with self.assertRaisesRegex(RuntimeError, f"^{nothing}"):
                            out.backward(inputs=[e])
                        eng.zero_grad()
                sd, rsd = model.state_dict(), ref.state_dict()
                self.assertEqual([k for k in rsd if not torch.equal(sd[k], rsd[k])], [])

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "raises through torch's C++ (autograd's hooks), which ASan's interceptors abort on")
    def test_refused_backward_then_the_forwards_own(self) -> None:
        """A backward through the model refused for putting no gradient into its parameters (autograd.grad()
        of the embedding's output, backward(inputs=[it])) with retain_graph=True, then the forward's own
        loss.backward(), as plain PyTorch allows: the refusal says the forward stays open, but the last
        block's gradient hook had noted itself as run before the engine refused, so that backward skipped
        the last block's backward phase and failed in torch's words on its empty placeholder parameters
        ("The size of tensor a (0) must match ...").  Now it is the step's backward: bit for bit plain
        PyTorch's after 3 steps."""
        nothing = r"^a backward through a tier\.torch engine's model that puts no gradient into its parameters"
        data = batches(3)
        for name, kw in (("fused", {}), ("deferred", {"optimizer_in_backward": False})):
            with self.subTest(name):
                ref = lm()
                model = copy.deepcopy(ref)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng, _ = self.engine(model, f"refused-then-own-{name}", **kw)
                for i, x in enumerate(data):
                    for m in (ref, model):
                        cap = {}
                        h = m.tok.register_forward_hook(lambda mod, inp, out: cap.setdefault("e", out))
                        try:
                            loss = lm_loss(m, x)
                        finally:
                            h.remove()
                        other = (lambda: torch.autograd.grad(loss, cap["e"], retain_graph=True),
                                 lambda: loss.backward(inputs=[cap["e"]], retain_graph=True))[i % 2]
                        if m is ref:
                            other()
                        else:
                            with self.assertRaisesRegex(RuntimeError, nothing):
                                other()
                        loss.backward()
                    opt.step()
                    opt.zero_grad()
                    eng.step()
                    eng.zero_grad()
                    self.assertEqual(eng.mode, name)
                sd, rsd = model.state_dict(), ref.state_dict()
                self.assertEqual([k for k in rsd if not torch.equal(sd[k], rsd[k])], [])

    def test_plain_checkpoint_with_frozen_parameters(self) -> None:
        """torch.optim.AdamW(model.parameters()) numbers a frozen parameter too, the engine's default group
        holds the trainable ones only: loading the first's state dict into the engine was refused in torch's
        words ("doesn't match the size of optimizer's group"), with nothing on why.  It says so now, and
        what to pass; an engine made with params=model.parameters() loads it, and trains as plain PyTorch."""
        ref = lm()
        ref.pos.weight.requires_grad_(False)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        x, y = batches(2)
        lm_loss(ref, x).backward()
        opt.step()
        opt.zero_grad()
        model = lm()
        model.load_state_dict(ref.state_dict())
        model.pos.weight.requires_grad_(False)
        eng, _ = self.engine(model, "frozen-default")
        with self.assertRaisesRegex(ValueError, r"doesn't match the size of optimizer's group \(group 0: 42 "
                                                r"parameters saved, 41 here\): .*1 frozen parameter.*"
                                                r"params=model\.parameters\(\)"):
            eng.load_state_dict(opt.state_dict())
        eng.close()
        model = lm()
        model.load_state_dict(ref.state_dict())
        model.pos.weight.requires_grad_(False)
        eng, _ = self.engine(model, "frozen-all", params=model.parameters())
        eng.load_state_dict(opt.state_dict())
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, y).backward()
            o.step()
            o.zero_grad()
        sd, rsd = model.state_dict(), ref.state_dict()
        self.assertEqual([k for k in rsd if not torch.equal(sd[k], rsd[k])], [])



class TestGradWrapperInputs(unittest.TestCase):
    """No tierd: what the autograd.grad wrapper (tier.torch.gradcall) hands torch."""

    def test_one_gradient_edge_passed_whole(self) -> None:
        """torch >= 2.3 takes a GradientEdge, a named tuple (node, output_nr), as one input: the wrapper,
        live while an engine is, took it apart with list() into two "inputs".  A named tuple with
        node and output_nr stands in for it (torch 1.13 has none); a generator is read once and
        passed on as the list looked at."""
        import collections
        from unittest import mock

        import torch
        from tier.torch import gradcall

        class FakeEngine:
            _closed = False
            slot_of: dict = {}

        edge_type = collections.namedtuple("GradientEdge", ["node", "output_nr"])
        edge = edge_type(object(), 0)
        engine = FakeEngine()
        gradcall._engines.add(engine)
        seen = []
        try:
            with mock.patch.object(gradcall, "_orig_grad", lambda outputs, inputs, *a, **k: seen.append(inputs)):
                gradcall._wrapper(None, edge)
                t = torch.zeros(1)
                gradcall._wrapper(None, (x for x in [t]))
        finally:
            gradcall._engines.discard(engine)
        self.assertIs(seen[0], edge)
        self.assertEqual(len(seen[1]), 1)
        self.assertIs(seen[1][0], t)

if __name__ == "__main__":
    tierd.main()
