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
anything is made, saying what to pass.  Placement C under a host budget
below the state, as test_loops.
"""

from __future__ import annotations

import copy
import unittest

import tierd
from test_loops import CONFIG, NO_VENV, batches, lm, lm_loss  # noqa: F401  (NO_VENV: the venv is entered)

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

    def test_torch_optimizer_as_optimizer_refused(self) -> None:
        """optimizer=torch.optim.AdamW (the class), an instance, or an object that is no StepRule: a
        ValueError saying what to pass (AttributeError, or "lr= go to the StepRule", before), raised before
        anything is made: the model keeps its parameters, tierd has none of its tensors."""
        import tier.torch

        model = lm()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        c = self.client("optimizer-given")
        for given, kw, say in ((torch.optim.AdamW, {"lr": 1e-3}, r"optimizer='adamw'"),
                               (torch.optim.SGD, {}, r"optimizer='sgd'"),
                               (torch.optim.Adam(lm().parameters()), {}, r"'adamw' or 'sgd'"),
                               (object(), {}, r"not a StepRule: it lacks name, state_kinds, defaults")):
            with self.subTest(given=given):
                with self.assertRaisesRegex(ValueError, say):
                    tier.torch.Offload(model, c, optimizer=given, **kw)
                for n, p in model.named_parameters():
                    self.assertTrue(torch.equal(p, before[n]), n)
        eng = tier.torch.Offload(model, c, optimizer="adamw", lr=1e-3)     # and the way it says works
        eng.close()


if __name__ == "__main__":
    tierd.main()
