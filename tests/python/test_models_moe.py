#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A mixture-of-experts layer through tier.torch (split from test_models.py, whose models and helpers it uses).

Experts as blocks of their own are refused, with their names, before any
state changes (an expert a step does not route to would run no phase); the
layer as one block trains bit for bit against plain PyTorch, with an idle
expert's gradients zeroed or set to None.
"""

from __future__ import annotations

import copy
import unittest
from typing import TYPE_CHECKING

import tierd
from test_models import CONFIG, VOCAB, lm_loss, run_plain, torch

if TYPE_CHECKING:
    import tier.torch

# ---- mixture of experts ----------------------------------------------------------------------

class Expert(torch.nn.Module if torch else object):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class MoE(torch.nn.Module if torch else object):
    """Top-1 routing over 4 experts, by token id (id % 4): an expert runs only for the tokens routed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList([Expert() for _ in range(4)])

    def forward(self, x, route):
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            sel = route == e
            if bool(sel.any()):
                out = out.index_put((sel,), ex(x[sel]))
        return out


class MoEModel(torch.nn.Module if torch else object):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.moe = MoE()
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        return self.head(h + self.moe(h, x % 4))


def moe_batch(seed: int, idle: int | None):
    """A batch of 4 x 8 tokens routed to every expert but ``idle`` (None: to all four)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB // 4, (4, 8), generator=g) * 4 + torch.randint(0, 4, (4, 8), generator=g)
    if idle is not None:
        x = torch.where(x % 4 == idle, (x + 1) % VOCAB, x)
    return x


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestMixtureOfExperts(tierd.DaemonTestCase):
    config = CONFIG

    def test_experts_as_blocks_refused(self) -> None:
        """auto_blocks() makes each expert a block; one that runs in some steps only is refused, by name,
        before the step changes any state."""
        import tier.torch

        torch.manual_seed(2)
        m = MoEModel()
        data = [moe_batch(1, 3), moe_batch(2, None)]    # expert 3 idle in step 1, busy in step 2
        c = self.client()
        eng = tier.torch.Offload(m, c)
        names = {id(mod): n for n, mod in m.named_modules()}
        self.assertIn("moe.experts.3", [names[id(b.module)] for b in eng.blocks if b.module is not None])
        lm_loss(m, data[0]).backward()
        eng.step()
        before = eng.parameters_state_dict()
        with self.assertRaises(RuntimeError) as cm:
            lm_loss(m, data[1]).backward()
        text = str(cm.exception)
        self.assertIn("'moe.experts.3' (Expert)", text)
        self.assertIn("mixture-of-experts", text)
        self.assertIn("no_split_module_classes", text)
        after = eng.parameters_state_dict()
        for n in before:
            self.assertTrue(torch.equal(before[n], after[n]), f"{n} changed")
        eng.close(restore=False)

        # the other way round: all four in step 1, one idle in step 2: refused at the forward's end
        torch.manual_seed(2)
        m = MoEModel()
        data = [moe_batch(3, None), moe_batch(4, 1)]
        eng = tier.torch.Offload(m, c)
        lm_loss(m, data[0]).backward()
        eng.step()
        before = eng.parameters_state_dict()
        with self.assertRaises(RuntimeError) as cm:
            m(data[1])
        self.assertIn("'moe.experts.1' (Expert) ran in the first step but not in this one", str(cm.exception))
        self.assertIn("Nothing was changed", str(cm.exception))
        self.assertIn("LayerDrop or stochastic depth", str(cm.exception))  # a layer skipped: what to do
        self.assertIn("StochasticDepth", str(cm.exception))
        after = eng.parameters_state_dict()
        for n in before:
            self.assertTrue(torch.equal(before[n], after[n]), f"{n} changed")
        eng.close(restore=False)

    def moe_as_one_block(self, data, zero_grad: bool) -> "tier.torch.Offload":
        """The MoE layer as one block (no_split_module_classes), trained on ``data`` against plain PyTorch
        whose zero_grad() sets .grad to None (``zero_grad`` False: the engine's loop calls
        zero_grad(set_to_none=True)) or to zeros (True: the engine's loop calls model.zero_grad(), as Hugging
        Face's Trainer does): exact."""
        import tier.torch

        torch.manual_seed(2)
        m = MoEModel()
        ref = copy.deepcopy(m)
        ref_losses = run_plain(ref, data, lm_loss, set_to_none=not zero_grad)
        eng = tier.torch.Offload(m, self.client(), placement="C", no_split_module_classes=["MoE"])
        losses = []
        torch.manual_seed(11)
        for x in data:
            loss = lm_loss(m, x)
            loss.backward()
            eng.step()
            if zero_grad:
                m.zero_grad()
            else:
                eng.zero_grad(set_to_none=True)
            losses.append(loss.item())
        sd = eng.parameters_state_dict()
        eng.close()
        self.assertEqual(losses, ref_losses)
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(sd[n], p), f"{n} differs")
        return eng

    def test_moe_layer_as_one_block(self) -> None:
        """An idle expert's parameters are skipped, as plain AdamW skips a .grad of None."""
        eng = self.moe_as_one_block([moe_batch(5, 3), moe_batch(6, None), moe_batch(7, 0)], zero_grad=False)
        names = {id(mod): n for n, mod in eng.model.named_modules()}
        self.assertEqual([names[id(b.module)] for b in eng.blocks], ["emb", "moe", "head"])

    def test_moe_idle_expert_with_zeroed_grads(self) -> None:
        """torch 1.13's zero_grad() leaves zeros in .grad (set_to_none=False): plain AdamW then updates an
        idle expert too (its moments decay, weight decay applies), and so does the engine after its own or
        the model's zero_grad()."""
        self.moe_as_one_block([moe_batch(5, 3), moe_batch(6, None), moe_batch(7, 0), moe_batch(8, 3)],
                              zero_grad=True)


    def test_moe_idle_expert_after_set_to_none(self) -> None:
        """zero_grad(set_to_none=True) once, zero_grad() after later steps: an expert idle since then has a
        .grad of None in torch (zeroing None leaves None), so AdamW skips it; the engine updated it with
        zeros (it remembered the gradient of the step before the set_to_none)."""
        import tier.torch

        data = [moe_batch(5, None), moe_batch(6, 3), moe_batch(7, 3), moe_batch(8, 3)]
        torch.manual_seed(2)
        m = MoEModel()
        ref = copy.deepcopy(m)

        def run(model, opt):
            losses = []
            torch.manual_seed(11)
            for i, x in enumerate(data):
                loss = lm_loss(model, x)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=i == 0)
                losses.append(loss.item())
            return losses

        want = run(ref, torch.optim.AdamW(ref.parameters(), lr=1e-3))
        eng = tier.torch.Offload(m, self.client(), no_split_module_classes=["MoE"])
        self.assertEqual(run(m, eng), want)
        sd = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(sd[n], p), f"{n} differs")


    def test_tied_parameter_used_once(self) -> None:
        """A parameter two blocks share (the shared block) that gets a gradient in the first step only:
        torch 1.13's zero_grad() leaves zeros in its .grad, so AdamW goes on updating it; the engine did
        not, as it never noted that the shared block's parameter had had a gradient."""
        import tier.torch

        class UsesP(torch.nn.Module):
            def __init__(self, p) -> None:
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
                self.p = p

            def forward(self, x, use: bool):
                h = self.lin(x)
                return h + self.p if use else h

        class Tied(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                p = torch.nn.Parameter(torch.randn(4))
                self.a = UsesP(p)
                self.b = UsesP(p)

            def forward(self, x, use_p: bool):
                return self.b(self.a(x, use_p), False)

        def run(model, opt):
            g = torch.Generator().manual_seed(6)
            for i in range(4):
                model(torch.randn(3, 4, generator=g), i == 0).pow(2).mean().backward()   # p: step 0 only
                opt.step()
                opt.zero_grad()

        torch.manual_seed(2)
        ref = Tied()
        model = copy.deepcopy(ref)
        run(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2))
        eng = tier.torch.Offload(model, self.client("tied-once"), lr=1e-2, blocks=[model.a, model.b],
                                 optimizer_in_backward=False)
        self.assertTrue(eng.blocks[-1].is_shared)
        run(model, eng)
        sd = eng.parameters_state_dict()
        eng.close()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(sd[n], p), f"{n} differs")


if __name__ == "__main__":
    tierd.main()
