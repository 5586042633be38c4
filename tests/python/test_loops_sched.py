#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The parameter groups through a training loop: every torch.optim.lr_scheduler of torch 1.13, hand
written hyperparameters, and the groups' members, against the same loop in plain PyTorch.

Each scheduler (StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR,
PolynomialLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR with
SGD's momentum cycled, OneCycleLR with AdamW's betas cycled,
ReduceLROnPlateau, SequentialLR, ChainedScheduler, MultiplicativeLR and
swa_utils.SWALR) drives the engine bit for bit (losses, the groups after each
step, parameters, the optimizer's and the scheduler's state_dict()), and a
checkpoint of model, engine and scheduler taken halfway resumes so;
``group["lr"]``, ``"weight_decay"``, ``"betas"``, ``"eps"``, SGD's
``"momentum"`` and ``"nesterov"`` set by hand mid-training.  Parameters moved
between the groups, taken out of one, or a group deleted from
``param_groups``: refused in words before anything changes (they were updated
with their old group's hyperparameters, silently, or failed with an
IndexError); a parameter twice in a group, refused.  ``step(closure)``, as torch.optim and Lightning call it;
a closure raising after its backward leaves the update undone, as torch's; one on a fused engine, refused.
A deferred engine's budget refusal says why it is deferred (a closure, a clip, micro-batches, ...).
Placement C under a host budget below the state, as test_loops.
"""

from __future__ import annotations

import copy
import io
import os
import unittest
import warnings

import tierd
from test_loops import CONFIG, NO_VENV, VOCAB, batches, groups_of, lm, lm_loss  # noqa: F401  (the venv is entered)

try:
    import torch
    from torch.optim import lr_scheduler as S
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None


def hyper(opt) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def run(model, opt, sched, data, *, tweak=None, plateau=False):
    """Per step: the loss and the groups' hyperparameters after it."""
    out = []
    torch.manual_seed(11)
    for i, x in enumerate(data):
        if tweak is not None:
            tweak(opt, i)
        loss = lm_loss(model, x)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step(loss.item()) if plateau else sched.step()
        opt.zero_grad()
        out.append((loss.item(), hyper(opt)))
    return out


def sched_state(s) -> dict:
    """A scheduler's state_dict() without what holds functions (lambdas, bound methods, inner schedulers' objects)."""
    return {k: v for k, v in s.state_dict().items()
            if k not in ("anneal_func", "lr_lambdas", "_scale_fn_ref", "_scale_fn_custom") and not callable(v)}


SCHEDULERS = {
    "StepLR": ("adamw", lambda o: S.StepLR(o, 2, 0.5)),
    "MultiStepLR": ("adamw", lambda o: S.MultiStepLR(o, [1, 3], 0.3)),
    "ConstantLR": ("adamw", lambda o: S.ConstantLR(o, 0.5, 3)),
    "LinearLR": ("adamw", lambda o: S.LinearLR(o, 0.1, 1.0, 4)),
    "ExponentialLR": ("adamw", lambda o: S.ExponentialLR(o, 0.7)),
    "PolynomialLR": ("adamw", lambda o: S.PolynomialLR(o, 4, 2.0)),
    "CosineAnnealingLR": ("adamw", lambda o: S.CosineAnnealingLR(o, 3, 1e-5)),
    "CosineAnnealingWarmRestarts": ("adamw", lambda o: S.CosineAnnealingWarmRestarts(o, 2, 2, 1e-5)),
    "CyclicLR": ("adamw", lambda o: S.CyclicLR(o, 1e-4, 1e-2, 2, cycle_momentum=False)),
    "CyclicLR-momentum": ("sgd", lambda o: S.CyclicLR(o, 1e-3, 1e-1, 2, cycle_momentum=True)),
    "OneCycleLR-betas": ("adamw", lambda o: S.OneCycleLR(o, 1e-2, total_steps=6)),
    "OneCycleLR-momentum": ("sgd", lambda o: S.OneCycleLR(o, 1e-1, total_steps=6)),
    "MultiplicativeLR": ("adamw", lambda o: S.MultiplicativeLR(o, lambda e: 0.9)),
    "SequentialLR": ("adamw", lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 2), S.ExponentialLR(o, 0.8)],
                                                       [2])),
    "ChainedScheduler": ("adamw", lambda o: S.ChainedScheduler([S.ConstantLR(o, 0.5, 2), S.ExponentialLR(o, 0.9)])),
    "SWALR": ("sgd", lambda o: torch.optim.swa_utils.SWALR(o, 1e-2, 3, "cos")),
    "ReduceLROnPlateau": ("adamw", lambda o: S.ReduceLROnPlateau(o, patience=0, factor=0.5)),
}


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestLoopsSched(tierd.DaemonTestCase):
    config = CONFIG

    def engine(self, model, job: str, params=None, **kw):
        import tier.torch

        c = self.client(job)
        state = sum(p.numel() * 16 for p in model.parameters())
        c.set_quota(host=max(state // 2, 1 << 20))          # below the state: through NVMe
        kw = {"lr": 1e-3, "placement": "C", **kw}
        eng = tier.torch.Offload(model, c, params if params is not None else model.parameters(), **kw)
        self.addCleanup(eng.close, restore=False)
        return eng

    def pair(self, name: str, rule: str, groups: bool, **kw):
        """A plain torch.optim optimizer over one model and an engine over its copy, the same hyperparameters."""
        ref = lm()
        model = copy.deepcopy(ref)
        hk = {"lr": 1e-2, "momentum": 0.9} if rule == "sgd" else {"lr": 1e-3}
        cls = torch.optim.SGD if rule == "sgd" else torch.optim.AdamW
        opt = cls(groups_of(ref) if groups else ref.parameters(), **hk)
        eng = self.engine(model, name, groups_of(model) if groups else None, optimizer=rule, **hk, **kw)
        return ref, opt, model, eng

    def same(self, name, ref, opt, model, eng) -> None:
        sd = model.state_dict()
        for n, p in ref.state_dict().items():
            self.assertTrue(torch.equal(sd[n], p), f"{name}: {n} differs from plain PyTorch's")
        osd, rsd = eng.state_dict(), opt.state_dict()
        self.assertEqual(osd["param_groups"], rsd["param_groups"], f"{name}: param_groups")
        for i, st in rsd["state"].items():
            self.assertEqual({k: None if v is None else v.tolist() for k, v in osd["state"][i].items()},
                             {k: None if v is None else v.tolist() for k, v in st.items()}, f"{name}: state {i}")

    def test_every_scheduler(self) -> None:
        """Every scheduler of torch 1.13 over the engine's groups (two, as Hugging Face's no-decay split),
        bit for bit: losses, the groups after each step (CyclicLR's and OneCycleLR's momentum and betas
        too), the parameters, the optimizer's state_dict() and the scheduler's."""
        data = batches(6)
        for name, (rule, make) in SCHEDULERS.items():
            with self.subTest(name), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)      # (SequentialLR's own deprecation warning)
                ref, opt, model, eng = self.pair(f"sched-{name}", rule, True)
                plateau = name == "ReduceLROnPlateau"
                rs, es = make(opt), make(eng)
                want = run(ref, opt, rs, data, plateau=plateau)
                got = run(model, eng, es, data, plateau=plateau)
                self.assertEqual(got, want, f"{name}: losses and groups")
                self.same(name, ref, opt, model, eng)
                self.assertEqual(sched_state(es), sched_state(rs), f"{name}: the scheduler's state_dict()")
                eng.close()

    def test_cyclic_momentum_with_adamw(self) -> None:
        """CyclicLR(cycle_momentum=True) over AdamW: torch refuses an optimizer whose defaults have no
        'momentum'; the engine's AdamW has none either, so it is refused the same way."""
        ref, opt, model, eng = self.pair("cyclic-adamw", "adamw", False)
        for o in (opt, eng):
            with self.assertRaisesRegex(ValueError, r"optimizer must support momentum"):
                S.CyclicLR(o, 1e-4, 1e-2, 2, cycle_momentum=True)

    def test_scheduler_checkpoint(self) -> None:
        """torch.save({"model", "opt", "sched"}) after 3 steps, loaded into a new model, engine and
        scheduler: the last 3 steps as plain PyTorch's 6 uninterrupted, bit for bit."""
        data = batches(6)
        for name in ("StepLR", "CosineAnnealingWarmRestarts", "SequentialLR", "ChainedScheduler", "SWALR",
                     "ReduceLROnPlateau", "CyclicLR-momentum"):
            rule, make = SCHEDULERS[name]
            if name == "CyclicLR-momentum":
                make = lambda o: S.CyclicLR(o, 1e-3, 1e-1, 2, scale_fn=lambda x: 1.0)   # noqa: E731
                # (torch 1.13's own mode= keeps a WeakMethod, which cannot be pickled: torch's, not the engine's)
            plateau = name == "ReduceLROnPlateau"
            with self.subTest(name), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                ref, opt, model, eng = self.pair(f"ck-{name}-1", rule, False)
                want = run(ref, opt, make(opt), data, plateau=plateau)
                s = make(eng)
                got = run(model, eng, s, data[:3], plateau=plateau)
                rng = torch.get_rng_state()
                buf = io.BytesIO()
                sd = s.state_dict()
                sd.pop("_scale_fn_custom", None)      # (a lambda: torch.save cannot pickle it)
                torch.save({"model": model.state_dict(), "opt": eng.state_dict(), "sched": sd}, buf)
                eng.close()
                buf.seek(0)
                ck = torch.load(buf)
                model2 = lm()
                hk = {"lr": 1e-2, "momentum": 0.9} if rule == "sgd" else {"lr": 1e-3}
                eng2 = self.engine(model2, f"ck-{name}-2", optimizer=rule, **hk)
                s2 = make(eng2)
                model2.load_state_dict(ck["model"])
                eng2.load_state_dict(ck["opt"])
                s2.load_state_dict(ck["sched"])
                torch.set_rng_state(rng)
                rest = []
                for x in data[3:]:
                    loss = lm_loss(model2, x)
                    loss.backward()
                    eng2.step()
                    s2.step(loss.item()) if plateau else s2.step()
                    eng2.zero_grad()
                    rest.append((loss.item(), hyper(eng2)))
                self.assertEqual(got + rest, want, f"{name}: losses and groups")
                self.same(name, ref, opt, model2, eng2)
                eng2.close()

    def test_hyperparameters_set_by_hand(self) -> None:
        """group["lr"], "weight_decay", "betas", "eps" (AdamW) and "momentum", "nesterov", "dampening"
        (SGD, with a momentum from the start) set by hand between steps, per group: bit for bit."""
        def adamw(o, i):
            if i == 2:
                o.param_groups[0]["lr"] = 5e-3
                o.param_groups[1]["weight_decay"] = 0.3
            if i == 3:
                o.param_groups[0]["betas"] = (0.8, 0.99)
                o.param_groups[1]["eps"] = 1e-6

        def sgd(o, i):
            if i == 2:
                o.param_groups[0]["momentum"] = 0.5
                o.param_groups[1]["nesterov"] = True
            if i == 3:
                o.param_groups[0]["dampening"] = 0.1

        data = batches(5)
        for rule, tweak in (("adamw", adamw), ("sgd", sgd)):
            with self.subTest(rule):
                ref, opt, model, eng = self.pair(f"by-hand-{rule}", rule, True)
                self.assertEqual(run(model, eng, None, data, tweak=tweak), run(ref, opt, None, data, tweak=tweak))
                self.same(rule, ref, opt, model, eng)
                eng.close()

    def test_step_with_closure(self) -> None:
        """optimizer.step(closure), the closure zeroing the gradients, running the forward and the
        backward (and clipping) and returning the loss, as torch.optim documents it and PyTorch
        Lightning's automatic optimization calls every optimizer: it was refused ("takes no closure").
        Now the closure runs first, with gradients on, and step() returns its loss: bit for bit, clipped
        and not, SGD and AdamW, under torch.no_grad() around step() too."""
        data = batches(4)
        for rule, clip in (("adamw", None), ("sgd", 0.05)):
            with self.subTest(rule=rule):
                ref, opt, model, eng = self.pair(f"closure-{rule}", rule, True)

                def train(m, o):
                    out = []
                    torch.manual_seed(11)
                    for x in data:
                        def closure():
                            o.zero_grad()
                            loss = lm_loss(m, x)
                            loss.backward()
                            if clip is not None:
                                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
                            return loss
                        with torch.no_grad():       # (torch.optim's step() runs the closure with gradients on)
                            out.append(o.step(closure).item())
                    return out

                self.assertEqual(train(model, eng), train(ref, opt))
                self.assertEqual(eng.mode, "deferred")     # (a closure: test_closure_raising_after_its_backward)
                self.same(rule, ref, opt, model, eng)
                eng.close()

    def test_parameter_twice_in_a_group_refused(self) -> None:
        """A parameter twice in one group: torch.optim warns and updates it twice in each step; the engine
        updated it once, silently.  Refused when the engine is made (before anything is laid out) and when
        one is appended to a group later (at the next forward, nothing changed); the groups put back, the
        run goes on."""
        import tier.torch

        model = lm()
        ps = list(model.parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)         # (torch's: "duplicate parameters")
            with self.assertRaisesRegex(ValueError, r"param_groups\[0\] holds a parameter of shape \(256, 32\) "
                                        r"twice: torch\.optim \(with a warning\) updates it twice"):
                tier.torch.Offload(model, self.client("twice-0"), [ps[0]] + ps, lr=1e-3)
        eng = self.engine(model, "twice-1")
        data = batches(3)
        run(model, eng, None, data[:1])
        g = eng.param_groups[0]["params"]
        g.append(g[3])
        with self.assertRaisesRegex(ValueError, r"param_groups\[0\] holds a parameter .* twice.*nothing changed"):
            lm_loss(model, data[1])
        g.pop()
        run(model, eng, None, data[1:])
        eng.close()

    def test_closure_raising_after_its_backward(self) -> None:
        """A closure that raises after its loss.backward() (a NaN check, logging): torch.optim's step()
        applies nothing (the exception leaves step() before the update).  The engine fused its optimizer
        into that backward from the second step on (the first step, with a closure too, had decided
        "fused"), so the update was in, and the next step refused.  A closure in the first step now makes
        the engine deferred (the update in step(), after the closure returned): after the raise, the
        parameters and the optimizer state are torch's; the run goes on bit for bit, with the next
        closure's zero_grad() (the step skipped) or with step() at once (torch applies the gradients
        .grad holds); a closure returning None, one running no backward (Lightning's training_step that
        returned None), and Lightning's call shape (step(closure=...), the closure wrapped: the forward,
        zero_grad(), the backward, then the clip) as well."""
        data = batches(5)

        class Check(Exception):
            pass

        for rule, after, lightning in (("adamw", "skip", False), ("adamw", "step", False), ("sgd", "step", True)):
            with self.subTest(rule=rule, after=after, lightning=lightning):
                ref, opt, model, eng = self.pair(f"closure-raise-{rule}-{after}", rule, True)

                def train(m, o, check):
                    out = []
                    torch.manual_seed(11)
                    for i, x in enumerate(data):
                        def closure():
                            if lightning:       # (Lightning's Closure: the step, zero_grad(), the backward)
                                loss = lm_loss(m, x) if i != 3 else None
                                o.zero_grad()
                                if loss is not None:
                                    loss.backward()
                            else:
                                o.zero_grad()
                                loss = lm_loss(m, x)
                                loss.backward()
                            if i == 1:
                                raise Check("loss check")
                            return loss if i != 2 else None

                        def wrapped():          # (Lightning's precision plugin: the closure, then the clip)
                            res = closure()
                            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
                            return res

                        if i == 1:
                            with self.assertRaises(Check):
                                o.step(closure)
                            check()
                            if after == "step":
                                o.step()
                            continue
                        loss = o.step(closure=wrapped) if lightning else o.step(closure)
                        out.append(None if loss is None else loss.item())
                    return out

                at = []             # (torch's model and optimizer right after the raise)
                want = train(ref, opt, lambda: at.append((copy.deepcopy(ref), copy.deepcopy(opt))))
                got = train(model, eng, lambda: self.same(f"{rule} raised", *at[0], model, eng))
                self.assertEqual(got, want)
                self.assertEqual(eng.mode, "deferred")
                self.same(rule, ref, opt, model, eng)
                eng.close()

    def test_closure_on_fused_engine_refused(self) -> None:
        """step(closure) on an engine whose optimizer runs in the backward (its first step had no closure,
        or optimizer_in_backward=True): its backward would apply the update before the closure returns,
        where torch.optim applies none if the closure raises after it.  Refused before the closure runs,
        naming optimizer_in_backward=False; nothing changed, and the run goes on as plain PyTorch's."""
        data = batches(4)
        for forced in (None, True):
            with self.subTest(optimizer_in_backward=forced):
                ref, opt, model, eng = self.pair(f"closure-fused-{forced}", "adamw", True,
                                                 optimizer_in_backward=forced)
                pre = data[:1] if forced is None else []       # (forced: refused in the first step)
                want = run(ref, opt, None, pre + data[2:])
                got = run(model, eng, None, pre)
                before = copy.deepcopy(model.state_dict())
                osd = repr(eng.state_dict())
                called = []
                with self.assertRaisesRegex(RuntimeError, r"step\(closure\) on an engine that runs the optimizer "
                                            r"inside the backward.*optimizer_in_backward=False.*nothing ran"):
                    eng.step(lambda: called.append(1))
                self.assertEqual(called, [])
                sd = model.state_dict()
                for n, p in before.items():
                    self.assertTrue(torch.equal(sd[n], p), f"{n} changed by a refused step")
                self.assertEqual(repr(eng.state_dict()), osd)
                got += run(model, eng, None, data[2:])
                self.assertEqual([a for a, _ in got], [a for a, _ in want])
                self.assertEqual(eng.mode, "fused")
                self.same(f"fused {forced}", ref, opt, model, eng)
                eng.close()

    def test_deferred_budget_says_why_deferred(self) -> None:
        """A host budget one optimizer phase fits, but not the two a deferred engine pins at once: the
        refusal at the first step's end says why the engine is deferred.  It said "the first step
        accumulated or clipped" whatever the reason, so a Lightning loop (a closure in every step, which
        makes the engine deferred since b2962e4) was told it clipped.  Each reason is named: a closure,
        a clip, micro-batches, a hyperparameter set between backward() and step(), optimizer_in_backward=False."""
        import tier
        import tier.torch

        x = batches(1)[0]

        def closure(model, eng):
            eng.step(lambda: lm_loss(model, x).backward())

        def clipped(model, eng):
            lm_loss(model, x).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            eng.step()

        def hyper_set(model, eng):
            lm_loss(model, x).backward()
            eng.param_groups[0]["lr"] = 5e-4
            eng.step()

        def accumulated(model, eng):
            lm_loss(model, x).backward()
            lm_loss(model, x).backward()
            eng.step()

        def plain(model, eng):
            lm_loss(model, x).backward()
            eng.step()

        for name, first, kw, why in (("closure", closure, {}, r"the first step took a closure \(step\(closure\)"),
                                     ("clip", clipped, {}, r"the first step clipped the gradients"),
                                     ("accumulated", accumulated, {}, r"the first step accumulated several "
                                      r"micro-batches"),
                                     ("hyper", hyper_set, {}, r"the first step changed the parameter groups "
                                      r"between backward\(\) and step\(\) \(group 0 lr 0.001 -> 0.0005\)"),
                                     ("forced", plain, {"optimizer_in_backward": False},
                                      r"optimizer_in_backward=False")):
            with self.subTest(name):
                model = lm()
                c = self.client(f"why-deferred-{name}")
                blocks = tier.torch.layout.build(model, tier.torch.auto_blocks(model))
                c.set_quota(host=max(b.opt_host_bytes(2) for b in blocks) * 3 // 2)
                eng = tier.torch.Offload(model, c, lr=1e-3, placement="C", **kw)
                with self.assertRaises(tier.NoSpaceError) as cm:
                    first(model, eng)
                text = str(cm.exception)
                self.assertRegex(text, r"the optimizer runs after the whole backward here \(" + why)
                self.assertIn("two blocks' optimizer phases are pinned at once", text)
                self.assertNotIn("accumulated or clipped", text)
                eng.close(restore=False)

    def test_group_members_changed_refused(self) -> None:
        """A parameter moved to another group (to take it out of weight decay, say), taken out of its
        group, or a group deleted from param_groups: torch.optim reads the groups' "params" in every
        step; the engine gave each parameter its group when it was made, so a moved parameter was
        updated with its old group's weight decay, silently (and a deleted group failed with an
        IndexError, an emptied one with a KeyError).  Refused now at the next forward, step(),
        state_dict() or backward (fused), naming the parameter, before anything changes: the model and
        the optimizer state are as before, and with the groups put back the run goes on as plain
        PyTorch's."""
        def moved(o):
            p = o.param_groups[0]["params"].pop()
            o.param_groups[1]["params"].append(p)
            return lambda: o.param_groups[0]["params"].append(o.param_groups[1]["params"].pop())

        def emptied(o):
            was = o.param_groups[1]["params"]
            o.param_groups[1]["params"] = []
            return lambda: o.param_groups[1].__setitem__("params", was)

        def deleted(o):
            g = o.param_groups.pop(1)
            return lambda: o.param_groups.append(g)

        changes = {"moved": (moved, r"parameter head\.weight moved from param_groups\[0\] to param_groups\[1\]"),
                   "emptied": (emptied, r"parameter blocks\.0\.ln1\.weight left param_groups\[1\]"),
                   "deleted": (deleted, r"1 parameter groups now, 2 when the engine was made")}
        asan = "libasan" in os.environ.get("LD_PRELOAD", "")
        for mode in ("deferred", "fused"):
            # where: after step() (refused at the forward), deferred between backward() and step() (at
            # step()), fused between the forward and its backward (in the backward, through autograd's C++:
            # not under ASan), and before engine.state_dict()
            for where in ("forward", "step" if mode == "deferred" else "backward", "state_dict"):
                if where == "backward" and asan:
                    continue
                for what, (change, named) in changes.items():
                    with self.subTest(mode=mode, where=where, what=what):
                        data = batches(4)
                        ref, opt, model, eng = self.pair(f"members-{mode}-{where}-{what}", "adamw", True,
                                                         optimizer_in_backward=mode == "fused")
                        want = run(ref, opt, None, data[:1] + data[2:])
                        got = run(model, eng, None, data[:1])
                        before = copy.deepcopy(model.state_dict())
                        osd = copy.deepcopy(eng.state_dict())
                        torch.manual_seed(11)
                        x = data[1]
                        with self.assertRaisesRegex(ValueError, r"tier\.torch: the parameter groups changed since "
                                                    r"the engine was made \(" + named + r"\).*close\(\) the engine "
                                                    r"and make a new one with the new groups"):
                            if where == "forward":
                                undo = change(eng)
                                lm_loss(model, x)
                            elif where == "state_dict":
                                undo = change(eng)
                                eng.state_dict()
                            else:
                                loss = lm_loss(model, x)
                                if where == "step":
                                    loss.backward()
                                undo = change(eng)
                                loss.backward() if where == "backward" else eng.step()
                        undo()
                        eng.zero_grad()                 # (the refused step's gradients, or forward, dropped)
                        sd = model.state_dict()
                        for n, p in before.items():
                            self.assertTrue(torch.equal(sd[n], p), f"{n} changed by a refused step")
                        self.assertEqual(repr(eng.state_dict()), repr(osd))
                        got += run(model, eng, None, data[2:])
                        self.assertEqual([a for a, _ in got], [a for a, _ in want])
                        self.same(f"{mode} {where} {what}", ref, opt, model, eng)
                        eng.close()


if __name__ == "__main__":
    unittest.main()
