#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What users do around a tier.torch engine, bit for bit against plain PyTorch, or refused in words.

An auxiliary loss left out after the first step (its head updated with the
zeros zero_grad() left, as torch.optim does); forward hooks registered after
the engine; parameters changed in place outside the forward (weight clipping,
a re-initialisation) and the model converted (``.double()``) after the
engine, refused before they are lost, and changed inside it (a hook under
torch.no_grad()), refused at the next step; a second engine on the same model;
blocks called without the model's forward; a model with one module under
several names that each call it (T5's shared embedding), trained bit for bit.  Placement C under a host budget
below the state, as test_loops.
"""

from __future__ import annotations

import copy
import os
import unittest

import tierd
from test_loops import CONFIG, NO_VENV, VOCAB, batches, lm, lm_loss  # noqa: F401  (NO_VENV: the venv is entered)

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None
try:
    import transformers
except ImportError:
    transformers = None


class TwoHead(torch.nn.Module if torch else object):
    """A main head and an auxiliary one over one embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.Embedding(256, 16)
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)
        self.l3 = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.emb(x)
        return self.l3(self.l1(h)), self.l2(h)


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestUsage(tierd.DaemonTestCase):
    config = CONFIG

    def engine(self, model, job: str, **kw):
        import tier.torch

        c = self.client(job)
        state = sum(p.numel() * 16 for p in model.parameters())
        c.set_quota(host=max(state // 2, 1 << 20))          # below the state: through NVMe
        kw = {"lr": 1e-2, "placement": "C", **kw}
        return tier.torch.Offload(model, c, **kw)

    def same(self, model, ref, what: str) -> None:
        sd = model.state_dict()
        bad = [n for n, p in ref.state_dict().items() if not torch.equal(sd[n], p)]
        self.assertEqual(bad, [], f"{what}: differ from plain PyTorch's")

    def test_auxiliary_loss_left_out(self) -> None:
        """The auxiliary head's loss in the first step only: torch 1.13's zero_grad() leaves zeros in its
        .grad, and AdamW goes on updating it.  Fused (the default after such a first step) skipped the
        head, whose backward no longer runs; deferred and set_to_none=True were right already."""
        def loss(m, x, i):
            a, b = m(x)
            return a.pow(2).mean() + (b.pow(2).mean() if i == 0 else 0)

        for kw, zero in (({}, {}), ({"optimizer_in_backward": False}, {}), ({}, {"set_to_none": True})):
            ref = TwoHead()
            model = copy.deepcopy(ref)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            eng = self.engine(model, "aux", **kw)
            for i, x in enumerate(batches(4)):
                rl = loss(ref, x, i)
                rl.backward()
                opt.step()
                opt.zero_grad(**zero)
                ml = loss(model, x, i)
                ml.backward()
                eng.step()
                eng.zero_grad(**zero)
                self.assertEqual(ml.item(), rl.item(), f"step {i} ({kw}, {zero})")
            self.same(model, ref, f"{kw} {zero}")
            eng.close()


    def test_forward_hook_after_engine(self) -> None:
        """A forward hook registered after the engine (logging a weight's norm and size) sees the mapped
        weight, as on the plain model; it ran after the engine's own hook, on the empty placeholder."""
        seen: dict[str, list] = {"ref": [], "eng": []}

        def hook(key):
            def f(mod, args, out):
                seen[key].append((mod.weight.norm().item(), mod.weight.numel()))
            return f

        ref = TwoHead()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "hook")
        ref.l1.register_forward_hook(hook("ref"))
        model.l1.register_forward_hook(hook("eng"))
        for x in batches(3):
            for m, o in ((ref, opt), (model, eng)):
                a, b = m(x)
                (a.pow(2).mean() + b.pow(2).mean()).backward()
                o.step()
                o.zero_grad()
        self.assertEqual(seen["eng"], seen["ref"])
        self.same(model, ref, "forward hook")
        eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser, which "
                     "turns it into a C++ throw that ASan's runtime, preloaded into Python, cannot intercept")
    def test_changes_outside_the_forward_refused(self) -> None:
        """Outside its phases a parameter is an empty placeholder: weight clipping after step() (WGAN),
        nn.init after the engine, p.data assigned, and model.double() changed nothing, and training went
        on without them.  Each is now refused at once (a change in place past that refusal, at the next forward,
        step() or model.state_dict()), naming the parameter; said once, and the run goes on as plain PyTorch's."""
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "inplace")
        data = batches(3)
        for i, x in enumerate(data):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
            if i == 0:
                with torch.no_grad(), self.assertRaisesRegex(RuntimeError, r"clamp_\(\) on parameter tok\.weight "
                                                                           r"outside its block's forward.*nothing "
                                                                           r"changed"):
                    for p in model.parameters():
                        p.clamp_(-0.01, 0.01)   # (refused at once: test_placeholders.py)
                with torch.no_grad(), torch._C.DisableTorchFunction():     # (past the refusal: a C++ extension)
                    model.tok.weight.clamp_(-0.01, 0.01)
                with self.assertRaisesRegex(RuntimeError, r"the model's forward: parameter tok\.weight was "
                                                          r"changed in place outside the model's forward"):
                    lm_loss(model, data[1])
            if i == 1:
                with self.assertRaisesRegex(RuntimeError, r"zero_\(\) on parameter head\.weight outside"):
                    torch.nn.init.zeros_(model.head.weight)
                with torch.no_grad(), torch._C.DisableTorchFunction():
                    model.head.weight.zero_()
                with self.assertRaisesRegex(RuntimeError, r"model\.state_dict\(\): parameter head\.weight was "
                                                          r"changed in place"):
                    model.state_dict()
                with self.assertRaisesRegex(RuntimeError, r"p\.data = \.\.\. on parameter ln\.bias, whose "
                                                          r"values the tier\.torch engine keeps in tierd"):
                    model.ln.bias.data = torch.zeros(32)    # (refused at once: test_vector_to_parameters_refused)
        self.same(model, ref, "after the refusals")
        # (refused before it converts anything: test_vision.py's test_conversion_refused_before_anything_changes)
        with self.assertRaisesRegex(RuntimeError, r"would make parameter tok\.weight torch\.float64 on cpu; it is "
                                                  r"torch\.float32 on cpu, as when the tier\.torch engine was made"):
            model.double()
        model.float()
        self.same(model, ref, "after the conversion refused")
        eng.close()
        self.same(model, ref, "closed")

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser, which "
                     "turns it into a C++ throw that ASan's runtime, preloaded into Python, cannot intercept")
    def test_changes_through_data_refused(self) -> None:
        """WGAN's weight clipping is ``p.data.clamp_(-c, c)`` after step(); a manual decay or noise
        ``p.data.mul_()``, ``p.data.add_()``.  ``.data`` is a new tensor with a version counter of its own:
        on the empty placeholder such a change did nothing and nothing saw it, so training went on without
        it, silently.  Now each is refused at once (``.data`` is a Placeholder there), naming the parameter, as
        the same change without ``.data``; the run goes on as plain PyTorch's, and after close() ``.data`` is
        torch's own."""
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "data")
        data = batches(4)
        changes = (lambda p: p.data.clamp_(-0.01, 0.01), lambda p: p.data.mul_(0.5),
                   lambda p: p.data.add_(torch.ones_like(p.data)))
        for i, x in enumerate(data):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
            if i < len(changes):
                with self.assertRaisesRegex(RuntimeError, r"(clamp_|mul_|ones_like)\(\) .*parameter tok\.weight "
                                                          r"outside its block's forward or backward"):
                    for p in model.parameters():
                        changes[i](p)
        self.same(model, ref, "after the refusals")
        eng.close()
        self.same(model, ref, "closed")
        self.assertIs(type(model.head.weight), torch.nn.Parameter)
        model.head.weight.data.mul_(0.0)                    # the model's own again: the change is real
        self.assertEqual(float(model.state_dict()["head.weight"].abs().sum()), 0.0)

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser, which "
                     "turns it into a C++ throw that ASan's runtime, preloaded into Python, cannot intercept")
    def test_vector_to_parameters_refused(self) -> None:
        """``torch.nn.utils.vector_to_parameters(vec, model.parameters())`` assigns each parameter
        ``vec[i:i + p.numel()].view_as(p).data``: on the engine's empty placeholders an empty slice, so the
        model was left as it was, silently; ``parameters_to_vector()`` (``p.view(-1)`` of each) gave an empty
        vector.  Both are refused now before anything changes (the first at its ``view_as(p)``), as is any
        ``p.data = ...`` of the same dtype
        and device; a conversion that changes nothing (``model.float()``, ``.to("cpu")``) still passes, and so
        does ``p.data = p.data.to(device)`` (``p.detach()``: its own data, nothing changes), the run goes on
        as plain PyTorch's, and after close() both utilities are torch's own again."""
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "vec")
        data = batches(3)
        for i, x in enumerate(data):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
            if i == 0:
                vec = parameters_to_vector(ref.parameters()).mul(0.5)
                with self.assertRaisesRegex(RuntimeError, r"a view of parameter tok\.weight \(parameters_to_vector"
                                                          r"\(\)\? vector_to_parameters\(\)\?\) outside its block's "
                                                          r"forward.*model\.load_state_dict\(\).*nothing changed"):
                    vector_to_parameters(vec, model.parameters())
                with self.assertRaisesRegex(RuntimeError, r"a view of parameter tok\.weight \(parameters_to_"
                                                          r"vector\(\)\? vector_to_parameters\(\)\?\) outside"):
                    parameters_to_vector(model.parameters())
                model.float().to("cpu")                 # (the parameters themselves assigned: no change)
                for p in model.parameters():            # (its own data again, as a move to a device: no change)
                    p.data = p.data.to("cpu")
                    p.data = p.detach()
                sd = model.state_dict()
                self.assertTrue(torch.equal(parameters_to_vector(sd[n] for n, _ in model.named_parameters()),
                                            parameters_to_vector(ref.parameters())))
        self.same(model, ref, "after the refusals")
        eng.close()
        self.assertTrue(torch.equal(parameters_to_vector(model.parameters()), parameters_to_vector(ref.parameters())))
        vector_to_parameters(vec, model.parameters())
        vector_to_parameters(vec, ref.parameters())
        self.same(model, ref, "closed, the vector loaded")

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in __torch_function__, called from torch's C++ argument parser, which "
                     "turns it into a C++ throw that ASan's runtime, preloaded into Python, cannot intercept")
    def test_parameter_used_outside_its_block_refused(self) -> None:
        """A parameter used outside the module holding it, where the engine keeps only an empty placeholder:
        a weight penalty over ``model.parameters()`` added to the loss gave a loss short of it and then a
        backward failing in autograd's words ("PowBackward0 returned an invalid gradient"); an output layer
        written as ``h @ self.emb.weight.t()`` in the top module's forward failed with "size mismatch".  Both
        are refused where the parameter is used, naming it; nothing changed: zero_grad() drops the open
        forward and the run goes on as plain PyTorch's that skipped the batch."""
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "outside")
        for i, x in enumerate(batches(3)):
            if i == 1:
                loss = lm_loss(model, x)
                with self.assertRaisesRegex(RuntimeError, r"pow\(\) reading parameter tok\.weight outside its "
                                                          r"block's forward or backward"):
                    loss = loss + 1e-3 * sum(p.pow(2).sum() for p in model.parameters())
                eng.zero_grad()
                continue
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
        self.same(model, ref, "after the refusal")
        eng.close()

        class Tied(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = torch.nn.Embedding(VOCAB, 16)
                self.mix = torch.nn.Linear(16, 16)

            def forward(self, x):
                return self.mix(self.emb(x)) @ self.emb.weight.t()

        model = Tied()
        want = {n: p.detach().clone() for n, p in model.named_parameters()}
        eng = self.engine(model, "outside-forward")
        with self.assertRaisesRegex(RuntimeError, r"t\(\) reading parameter emb\.weight outside its block's"):
            model(batches(1)[0])
        with self.assertRaisesRegex(RuntimeError, r"chunk\(\) reading parameter mix\.weight"):
            model.mix.weight.chunk(2)
        eng.close()
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), want[n]), n)

    def test_element_sizes_remembered(self) -> None:
        """layout.esize() made a tensor to learn an element's size at every view of a parameter
        (Slot.view(), Piece.view(): 510 a step for ByteLM's 102 parameters); made once per dtype now."""
        from unittest import mock

        from tier.torch import layout

        self.assertEqual(layout.esize(torch.bfloat16), 2)
        with mock.patch.object(torch, "empty", side_effect=AssertionError("a tensor made for its element size")):
            self.assertEqual(layout.esize(torch.bfloat16), 2)
            self.assertEqual(layout.esize(torch.bfloat16), 2)

    def test_phase_lookup_walks_no_plan(self) -> None:
        """Tracer.lookup(), at every phase of a planned step, found the plan's largest micro-batch (for a
        refusal's words) before looking the phase up: a walk of every phase at each phase, a step's cost
        quadratic in its phases.  Only a refusal walks the plan now, and says the same."""
        from tier.torch.tracer import Tracer

        class NoWalk(dict):
            def __iter__(self):
                raise AssertionError("the whole plan walked")

        t = Tracer()
        t.index = NoWalk({("f", 0, 0, 0): 0, ("b", 0, 0, 0): 1})
        self.assertEqual(t.lookup(("b", 0, 0, 0), "block 0"), 1)
        t.index = {("f", 0, 0, 0): 0, ("b", 0, 0, 0): 1}
        with self.assertRaisesRegex(RuntimeError, r"micro-batch 2 of this step, where the first step .* had 1:"):
            t.lookup(("f", 0, 0, 1), "block 0")
        with self.assertRaisesRegex(RuntimeError, r"block 1 ran its forward in this step but not in the first"
                                    r"(.|\n)*LayerDrop or stochastic depth(.|\n)*StochasticDepth"):
            t.lookup(("f", 1, 0, 0), "block 1")

    def test_changes_inside_the_forward_refused(self) -> None:
        """A parameter changed in place inside its block's forward (a pre-hook clamping it under
        torch.no_grad()) went into the copy tierd maps for the forward, which that phase only reads: the
        change was lost, silently (and the refusal of a change outside the forward advised making it
        there).  Refused now at the next step() or forward, naming the parameter, once; an evaluation's
        forward too."""
        model = lm()
        eng = self.engine(model, "inforward")
        data = batches(3)

        def clamp(mod, args):
            with torch.no_grad():
                mod.weight.clamp_(-0.01, 0.01)

        h = model.head.register_forward_pre_hook(clamp)
        lm_loss(model, data[0]).backward()
        h.remove()
        with self.assertRaisesRegex(RuntimeError, r"step\(\): parameter head\.weight was changed in place inside "
                                                  r"its block's forward or backward .*was not kept"):
            eng.step()
        eng.step()                                  # said once: the step goes on
        eng.zero_grad()
        h = model.head.register_forward_pre_hook(clamp)
        with torch.no_grad():
            lm_loss(model, data[1])
        h.remove()
        with self.assertRaisesRegex(RuntimeError, r"the model's forward: parameter head\.weight was changed"):
            lm_loss(model, data[2])
        lm_loss(model, data[2]).backward()
        eng.step()
        eng.zero_grad()
        # through .data (a tensor with a version counter of its own): it was lost without a word

        def clamp_data(mod, args):
            mod.weight.data.clamp_(-0.01, 0.01)

        h = model.head.register_forward_pre_hook(clamp_data)
        lm_loss(model, data[0]).backward()
        h.remove()
        with self.assertRaisesRegex(RuntimeError, r"step\(\): parameter head\.weight was changed in place inside"):
            eng.step()
        eng.close()

    def test_second_engine_refused(self) -> None:
        """A second engine on a model whose engine is still open (a notebook cell run again) is refused
        before it changes anything; it laid out the empty placeholders and failed inside the backward.
        Once the first is closed, a new one trains as plain PyTorch."""
        import tier
        import tier.torch

        ref = lm()
        model = copy.deepcopy(ref)
        eng = self.engine(model, "first")
        c = self.client("second")
        with self.assertRaisesRegex(ValueError, r"parameter tok\.weight is laid out by another engine, still open"):
            tier.torch.Offload(model, c, lr=1e-2)
        with self.assertRaises(tier.NotFoundError):
            c.open("torch.0.0.p")                   # nothing made
        eng.close()
        self.same(model, ref, "closed")
        eng = tier.torch.Offload(model, c, lr=1e-2)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        for x in batches(2):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
        self.same(model, ref, "second engine")
        eng.close()

    @unittest.skipIf(transformers is None, "no transformers (the test venv)")
    def test_module_under_several_names(self) -> None:
        """T5 registers its shared embedding as shared, encoder.embed_tokens and decoder.embed_tokens, and
        both stacks call it.  The blocks found made it one block, whose forward then ran twice a step: the
        engine refused T5 as "ran its forward twice", advising to make the repeated part one block's
        inside, which auto_blocks() could have done.  It keeps each stack that calls the embedding whole
        now, the embedding's weight (tied to lm_head) in the shared block: T5 trains, bit for bit, its
        relative position bias passed from each stack's first layer to the others inside the block.  The
        advice for a stack too large said to split it, which would be refused again."""
        import tier.torch
        import tier.torch.explain

        def make():
            torch.manual_seed(0)
            return transformers.T5ForConditionalGeneration(transformers.T5Config(
                vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0))

        ref = make()
        model = make()
        self.assertEqual(tier.torch.auto_blocks(model), [model.encoder, model.decoder, model.lm_head])
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "t5")
        g = torch.Generator().manual_seed(3)
        for i in range(3):
            x, y = torch.randint(1, 64, (2, 8), generator=g), torch.randint(1, 64, (2, 6), generator=g)
            torch.manual_seed(i)                    # the same dropout masks in both
            rl = ref(input_ids=x, labels=y).loss
            rl.backward()
            opt.step()
            opt.zero_grad()
            torch.manual_seed(i)
            ml = model(input_ids=x, labels=y).loss
            ml.backward()
            eng.step()
            eng.zero_grad()
            self.assertEqual(ml.item(), rl.item(), f"step {i}")
        self.same(model, ref, "T5")
        # a stack too large for the budget cannot be split (its parts would call the embedding outside
        # any block): the advice given (warning, describe(), errors) says so, not "split it"
        hint = tier.torch.explain.advice(eng, eng.blocks[1])          # (what a block that cannot fit says)
        self.assertIn("it cannot be split: it calls decoder.embed_tokens, which other blocks call too", hint)
        self.assertNotIn("blocks=[", hint)
        eng.close()

    def test_hyperparameters_checked_every_step(self) -> None:
        """The groups are checked before every step's updates, not only when the engine is made: amsgrad
        set later (ignored before), and SGD's momentum turned on with dampening in a group updated with
        momentum 0 until then (torch starts its buffer then, as a copy of the gradient; the engine's was
        zeros: other bits).  A negative weight decay is refused, as torch refuses it."""
        import tier.torch

        with self.assertRaisesRegex(ValueError, r"invalid AdamW hyperparameters: .*weight_decay -0\.1"):
            tier.torch.Offload(TwoHead(), self.client("negative"), lr=1e-2, weight_decay=-0.1)
        for mode in (True, False):
            model = TwoHead()
            eng = tier.torch.Offload(model, self.client(f"sgd-{mode}"),
                                     [{"params": list(model.parameters()), "momentum": 0.0, "dampening": 0.1}],
                                     lr=1e-2, optimizer="sgd", optimizer_in_backward=mode)
            data = batches(3)
            for x in data[:2]:
                a, b = model(x)
                (a.pow(2).mean() + b.pow(2).mean()).backward()
                eng.step()
                eng.zero_grad()
            eng.param_groups[0]["momentum"] = 0.9
            with self.assertRaisesRegex(ValueError, r"SGD momentum 0\.9 with dampening 0\.1 in a group updated "
                                                    r"with momentum 0 until now"):
                a, b = model(data[2])
                (a.pow(2).mean() + b.pow(2).mean()).backward()
                eng.step()
            eng.close()
        model = TwoHead()
        eng = self.engine(model, "amsgrad")
        a, b = model(batches(1)[0])
        (a.pow(2).mean() + b.pow(2).mean()).backward()
        eng.step()
        eng.param_groups[0]["amsgrad"] = True
        with self.assertRaisesRegex(ValueError, r"amsgrad=True"):
            model(batches(1)[0])
        eng.close()

    def test_block_called_on_its_own(self) -> None:
        """A block called outside the model's forward with gradients on (the model's forward written out
        by hand) is refused at that call, before anything changes; it was refused in the backward as "a
        second backward over the same forward".  Under no_grad it runs, and training goes on as plain."""
        ref = lm()
        model = copy.deepcopy(ref)
        eng = self.engine(model, "direct")
        x = batches(1)[0]
        with self.assertRaisesRegex(RuntimeError, r"block 0 'tok' \(Embedding\) was called outside the model's "
                                                  r"forward, with gradients on"):
            model.tok(x)
        with torch.no_grad():
            self.assertTrue(torch.equal(model.tok(x), ref.tok(x)))
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        for x in batches(2):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x).backward()
                o.step()
                o.zero_grad()
        self.same(model, ref, "after the refusal")
        eng.close()

    def test_step_again_without_backward_refused(self) -> None:
        """step() twice after one backward: torch.optim applies the same gradients again; tier.torch
        applied nothing, silently.  Refused now, before anything changes; after zero_grad(), a step()
        without backward does what torch's does with zeroed gradients (AdamW's moments go on)."""
        ref = lm()
        model = copy.deepcopy(ref)
        eng = self.engine(model, "twice")
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, batches(1)[0]).backward()
            o.step()
        with self.assertRaisesRegex(RuntimeError, r"step\(\) again with no backward\(\) since the last step\(\)"):
            eng.step()
        for o in (opt, eng):
            o.zero_grad(set_to_none=False)
            o.step()
            o.zero_grad()
        self.same(model, ref, "after the refusal")
        eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in the backward's first hook, through autograd's C++ (a C++ throw), "
                     "which ASan's runtime, preloaded into Python, cannot intercept")
    def test_loop_without_zero_grad_refused(self) -> None:
        """A loop that never calls zero_grad(): torch adds each step's gradients to the last step's, still in
        .grad; tier.torch started each step's from zero, training otherwise, silently (the README called
        zero_grad() optional).  The second step's backward is refused now, naming what to do, before any
        gradient or update changes; zero_grad() drops that forward and the run goes on bit for bit."""
        for kw in ({}, {"optimizer_in_backward": False}):
            ref = lm()
            model = copy.deepcopy(ref)
            eng = self.engine(model, "nozero", **kw)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            x0, x1, x2 = batches(3)
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, x0).backward()
                o.step()
            loss = lm_loss(model, x1)
            with self.assertRaisesRegex(RuntimeError, r"backward\(\) with no zero_grad\(\) since the last step\(\): "
                                                      r"plain PyTorch would add this step's gradients to the last "
                                                      r"step's.*Call optimizer\.zero_grad\(\) \(or "
                                                      r"model\.zero_grad\(\)\) once every step"):
                loss.backward()
            eng.zero_grad()                     # (drops that forward: nothing was applied)
            opt.zero_grad()
            for x in (x1, x2):
                for m, o in ((ref, opt), (model, eng)):
                    lm_loss(m, x).backward()
                    o.step()
                    o.zero_grad()
            self.same(model, ref, f"after the refusal {kw}")
            eng.close()

    def test_every_way_of_zeroing_gradients(self) -> None:
        """Each way a loop drops the last step's gradients (the engine's zero_grad() or the model's, either
        set_to_none, .grad set to None by hand), at the bottom of the loop or at its top (after an evaluation
        forward with gradients on, harmless in torch): bit for bit as plain PyTorch, none refused as a loop
        without zero_grad() is."""
        def by_hand(m, o):
            for p in m.parameters():
                p.grad = None

        ways = {"zero_grad()": lambda m, o: o.zero_grad(),
                "zero_grad(set_to_none=True)": lambda m, o: o.zero_grad(set_to_none=True),
                "model.zero_grad()": lambda m, o: m.zero_grad(),
                "model.zero_grad(set_to_none=True)": lambda m, o: m.zero_grad(set_to_none=True),
                ".grad = None": by_hand}
        for (name, zero), top, kw in [(w, top, {}) for w in ways.items() for top in (False, True)] + \
                [(w, False, {"optimizer_in_backward": False}) for w in ways.items()]:
            what = f"{name} at the {'top' if top else 'bottom'} {kw}"
            ref = lm()
            model = copy.deepcopy(ref)
            eng = self.engine(model, "zeroing", **kw)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            for i, x in enumerate(batches(3)):
                for m, o in ((ref, opt), (model, eng)):
                    if top:
                        if i == 1 and zero is not by_hand:
                            lm_loss(m, x)       # an evaluation with gradients on, no backward (which only
                                                # the engine's zero_grad() drops, as the README says)
                        zero(m, o)
                    loss = lm_loss(m, x)
                    loss.backward()
                    o.step()
                    if not top:
                        zero(m, o)
                    if m is ref:
                        want = loss.item()
                self.assertEqual(loss.item(), want, f"step {i}: {what}")
            self.same(model, ref, what)
            eng.close()

    def test_zero_grad_between_forward_and_backward(self) -> None:
        """PyTorch 1.13's quickstart zeroes between the forward and its backward (``pred = model(X); loss =
        loss_fn(pred, y); optimizer.zero_grad(); loss.backward(); optimizer.step()``): the engine's zero_grad()
        dropped the open forward, and the backward was refused at the first step as "a second backward over the
        same forward".  The forward stays open now (no backward of the step ran yet), bit for bit as plain
        PyTorch: fused and deferred (accumulating, clipping), the engine's zero_grad() or the model's, either
        set_to_none; a forward with no backward before the next forward (or step()) is dropped then, the step
        skipped, as torch's loop skips it (step 2: a forward, zero_grad(), then the step again; step 3: a
        forward, zero_grad(), step() with no backward)."""
        ways = {"zero_grad()": lambda m, o: o.zero_grad(),
                "zero_grad(set_to_none=True)": lambda m, o: o.zero_grad(set_to_none=True),
                "model.zero_grad()": lambda m, o: m.zero_grad(),
                "model.zero_grad(set_to_none=True)": lambda m, o: m.zero_grad(set_to_none=True)}
        loops = [({}, 1, False), ({"optimizer_in_backward": False}, 1, False), ({}, 2, False), ({}, 1, True)]
        for (name, zero), (kw, micro, clip) in [(w, lp) for w in ways.items() for lp in loops]:
            what = f"{name} {kw} micro-batches {micro} clip {clip}"
            ref = lm()
            model = copy.deepcopy(ref)
            eng = self.engine(model, "quickstart", **kw)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            xs = batches(5 * micro)
            for i in range(5):
                for m, o in ((ref, opt), (model, eng)):
                    if i in (2, 3):
                        lm_loss(m, xs[i * micro])           # its backward never runs
                        zero(m, o)
                    if i == 3:
                        o.step()                            # with the gradients zeroed (or None)
                        continue
                    for k in range(micro):
                        loss = lm_loss(m, xs[i * micro + k])
                        if k == 0:
                            zero(m, o)                      # between the forward and its backward
                        loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
                    o.step()
                    if m is ref:
                        want = loss.item()
                if i != 3:
                    self.assertEqual(loss.item(), want, f"step {i}: {what}")
            self.assertEqual(eng.mode, "fused" if not kw and micro == 1 and not clip else "deferred", what)
            self.same(model, ref, what)
            eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal is raised in the backward's first hook, through autograd's C++ (a C++ throw), "
                     "which ASan's runtime, preloaded into Python, cannot intercept")
    def test_zero_grad_between_micro_batches_refused(self) -> None:
        """zero_grad() between a second micro-batch's forward and its backward, after the first micro-batch's
        backward: torch keeps the forward and starts the gradients afresh from its backward; tier.torch drops
        the step (it cannot drop the gradients in tierd and keep the plan's micro-batch), and that backward
        was refused as "a second backward over the same forward".  Refused in words now, nothing applied;
        the run goes on bit for bit."""
        ref = lm()
        model = copy.deepcopy(ref)
        eng = self.engine(model, "zero-micro", optimizer_in_backward=False)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        xs = batches(6)
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, xs[0]).backward()
            lm_loss(m, xs[1]).backward()
            o.step()
            o.zero_grad()
        lm_loss(model, xs[2]).backward()
        loss = lm_loss(model, xs[3])
        eng.zero_grad()
        with self.assertRaisesRegex(RuntimeError, r"backward\(\) after zero_grad\(\) dropped this step, between "
                                                  r"this forward and its backward.*run the step again"):
            loss.backward()
        for i in (2, 4):
            for m, o in ((ref, opt), (model, eng)):
                lm_loss(m, xs[i]).backward()
                lm_loss(m, xs[i + 1]).backward()
                o.step()
                o.zero_grad()
        self.same(model, ref, "after the refusal")
        eng.close()

    def test_evaluation_forward_with_gradients(self) -> None:
        """An evaluation forward with gradients on (no backward) after a fused step, then the next training
        forward: refused as "a second forward" whose gradients "were applied already", with advice to
        accumulate; nothing was applied.  The message says so and how to go on, which works."""
        ref = lm()
        model = copy.deepcopy(ref)
        eng = self.engine(model, "evalgrad")
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        x0, x1, x2 = batches(3)
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, x0).backward()
            o.step()
            o.zero_grad()
        self.assertEqual(eng.mode, "fused")
        lm_loss(model, x2)                      # an evaluation, gradients on, no backward
        with self.assertRaisesRegex(RuntimeError, r"the first one's output not backpropagated \(an evaluation "
                                                  r"with gradients on\?\).*nothing was applied yet; call "
                                                  r"zero_grad\(\) to drop the first forward"):
            lm_loss(model, x1)
        eng.zero_grad()
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, x1).backward()
            o.step()
            o.zero_grad()
        self.same(model, ref, "after the refusal")
        eng.close()

    def test_closed_engine_refuses(self) -> None:
        """After close(): step() said a parameter "was changed in place ... the change was lost", state_dict()
        raised KeyError('m'), zero_grad() zeroed the model's own gradients; each says the engine is closed."""
        model = lm()
        eng = self.engine(model, "closed")
        lm_loss(model, batches(1)[0]).backward()
        eng.step()
        eng.close()
        lm_loss(model, batches(1)[0]).backward()
        for call, what in ((eng.step, "step()"), (eng.zero_grad, "zero_grad()"), (eng.state_dict, "state_dict()"),
                           (lambda: eng.clip_grad_norm_(model.parameters(), 1.0), "clip_grad_norm_")):
            with self.assertRaisesRegex(RuntimeError, rf"{what.replace('(', '.').replace(')', '.')} on a closed "
                                                      "Offload engine"):
                call()
        self.assertIsNotNone(model.head.weight.grad)           # the model's own gradients, left alone

    def test_write_into_state_dict_refused(self) -> None:
        """A tensor of model.state_dict() written in place: torch's is the parameter, tier.torch's a copy,
        and the write reached nothing, silently.  Refused at the next forward (once), while that state dict
        lives; the model is as if the write never happened."""
        ref = lm()
        model = copy.deepcopy(ref)
        eng = self.engine(model, "sdwrite")
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        x0, x1 = batches(2)
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, x0).backward()
            o.step()
            o.zero_grad()
        sd = model.state_dict()
        with torch.no_grad():
            sd["head.weight"].mul_(0.5)
        with self.assertRaisesRegex(RuntimeError, r"the model's forward: head.weight of a model.state_dict\(\) "
                                                  r"was written in place; tier.torch's state dict holds copies"):
            lm_loss(model, x1)
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, x1).backward()
            o.step()
            o.zero_grad()
        self.same(model, ref, "after the refusal")
        eng.close()

    def test_optimizer_state_checked_whole(self) -> None:
        """engine.load_state_dict() of an AdamW entry without exp_avg_sq (torch.optim's step() fails on it
        with a KeyError) took it as zeros, and one with exp_avg transposed (a size mismatch at torch's step)
        reshaped it, both silently: refused now, before anything changes."""
        model = lm()
        eng = self.engine(model, "optsd")
        lm_loss(model, batches(1)[0]).backward()
        eng.step()
        eng.zero_grad()
        before = eng.state_dict()
        k = next(i for i, e in before["state"].items() if e["exp_avg"].ndim == 2 and
                 e["exp_avg"].shape[0] != e["exp_avg"].shape[1])
        lacking = copy.deepcopy(before)
        del lacking["state"][k]["exp_avg_sq"]
        with self.assertRaisesRegex(ValueError, r"has exp_avg but not exp_avg_sq \(torch.optim's step\(\) "
                                                r"would fail on it with a KeyError\)"):
            eng.load_state_dict(lacking)
        transposed = copy.deepcopy(before)
        transposed["state"][k]["exp_avg"] = transposed["state"][k]["exp_avg"].t().contiguous()
        with self.assertRaisesRegex(ValueError, r"exp_avg is shaped \(\d+, \d+\), the parameter \(\d+, \d+\)"):
            eng.load_state_dict(transposed)
        after = eng.state_dict()
        for i, e in before["state"].items():
            for name, v in e.items():
                self.assertTrue(torch.equal(after["state"][i][name], v), f"{i} {name}")
        eng.close()

    def test_optimizer_state_mapping(self) -> None:
        """engine.state (torch.optim's optimizer.state) was an empty dict: a loop checking len(opt.state) to
        see whether there is state to checkpoint saw none.  Now its keys are the parameters with state, as
        torch's (compared with AdamW's), and reading or setting a value is refused, naming state_dict()."""
        ref = lm()
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = self.engine(model, "optstate")
        self.assertEqual((len(eng.state), len(opt.state)), (0, 0))
        x = batches(1)[0]
        for m, o in ((ref, opt), (model, eng)):
            lm_loss(m, x).backward()
            o.step()
        self.assertEqual(len(eng.state), len(opt.state))
        self.assertGreater(len(eng.state), 0)
        self.assertEqual(len(eng.state), len(eng.state_dict()["state"]))
        names = {id(p): n for n, p in model.named_parameters()}
        ref_names = {id(p): n for n, p in ref.named_parameters()}
        self.assertEqual([names[id(p)] for p in eng.state], [ref_names[id(p)] for p in opt.state])
        p = next(iter(model.parameters()))
        self.assertIn(p, eng.state)
        with self.assertRaisesRegex(RuntimeError, r"optimizer.state\[p\]: tier.torch keeps the optimizer state in "
                                                  r"tierd.*engine.state_dict\(\)\['state'\]"):
            eng.state[p]
        with self.assertRaisesRegex(RuntimeError, r"engine.state_dict"):
            list(eng.state.items())
        with self.assertRaisesRegex(RuntimeError, r"engine.load_state_dict\(\) writes it"):
            eng.state = {}
        eng.close()
        self.assertEqual(len(eng.state), 0)

    def test_error_traceback_in_the_model_words(self) -> None:
        """An error of tierd's said in the model's words (a phase that cannot fit: the block, not
        'torch.0.1.g') was raised "from" tierd's own, which the traceback printed as its direct cause, with
        the engine's internal tensor names.  Not chained now; tierd's error stays at hand as tierd_error."""
        import traceback

        import tier
        import tier.torch

        model = lm()
        c = self.client("tbnames")
        c.set_quota(vram=4096)
        eng = tier.torch.Offload(model, c, lr=1e-2)
        with self.assertRaises(tier.TierError) as cm:
            lm_loss(model, batches(1)[0]).backward()
            eng.step()
        text = "".join(traceback.format_exception(cm.exception))
        self.assertRegex(text, r"block \d+ '[a-z.0-9]+' \(\w+\)")
        self.assertNotRegex(text, r"torch\.0\.\d+\.[a-z]")
        self.assertRegex(str(cm.exception.tierd_error), r"'torch\.0\.\d+\.[pg]'")
        eng.close(restore=False)

    def test_reduced_precision_read_before_step(self) -> None:
        """A bfloat16 model, deferred (accumulation): between the last backward() and step(), its parameters
        read as zeros (model.state_dict(), engine.save(), an evaluation forward): the optimizer phase wrote p
        whole from the master weights, so tierd dropped p after the backward.  They read as before the
        forward now, as torch's do."""
        model = lm().to(torch.bfloat16)
        eng = self.engine(model, "bf16-between")
        data = batches(4)
        for step in range(2):
            before = {k: v.clone() for k, v in model.state_dict().items()}
            with torch.no_grad():
                eval_before = lm_loss(model, data[0]).item()
            for x in data[2 * step:2 * step + 2]:
                (lm_loss(model, x) / 2).backward()
            between = model.state_dict()
            self.assertEqual([k for k in before if not torch.equal(before[k], between[k])], [], f"step {step}")
            with torch.no_grad():
                self.assertEqual(lm_loss(model, data[0]).item(), eval_before, f"step {step}")
            eng.step()
            eng.zero_grad()
        self.assertEqual(eng.mode, "deferred")
        eng.close()

    def test_auxiliary_loss_added_later(self) -> None:
        """An auxiliary head's loss from the second step on: its backward was not in the first step's
        plan, and was refused there; fused, after the main head's blocks had been updated, so the step
        could not be undone.  The plan now has its backward phase, and the run is plain PyTorch's."""
        def loss(m, x, i):
            a, b = m(x)
            return a.pow(2).mean() + (b.pow(2).mean() if i > 0 else 0)

        for kw in ({}, {"optimizer_in_backward": False}):
            ref = TwoHead()
            model = copy.deepcopy(ref)
            opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            eng = self.engine(model, "aux-later", **kw)
            for i, x in enumerate(batches(4)):
                rl = loss(ref, x, i)
                rl.backward()
                opt.step()
                opt.zero_grad()
                ml = loss(model, x, i)
                ml.backward()
                eng.step()
                eng.zero_grad()
                self.assertEqual(ml.item(), rl.item(), f"step {i} ({kw})")
            self.same(model, ref, f"{kw}")
            eng.close()

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "the refusal passes through torch.jit's C++ (a C++ throw), which ASan's runtime, preloaded "
                     "into Python, cannot intercept")
    def test_jit_trace_refused(self) -> None:
        """torch.jit.trace of the offloaded model is refused in words; it failed as a bare "Tracing failed
        sanity checks!"."""
        model = lm()
        eng = self.engine(model, "jit")
        with self.assertRaisesRegex(RuntimeError, r"torch\.jit\.trace of a model offloaded by tier\.torch"):
            torch.jit.trace(model, batches(1)[0][:, :-1])
        eng.close()

    def test_model_that_is_one_block(self) -> None:
        """A model that is one block itself (an nn.Linear): its block's forward hook ran before the model's,
        so the first forward was refused as "called outside the model's forward" (before that check, the
        second step was refused as a block not in the first).  It trains as plain PyTorch."""
        import tier.torch

        torch.manual_seed(0)
        ref = torch.nn.Linear(16, 16)
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = tier.torch.Offload(model, self.client("one-block"), lr=1e-2)
        self.assertEqual([b.label for b in eng.blocks], ["block 0 'the model' (Linear)"])
        for i in range(4):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i))
            for m, o in ((ref, opt), (model, eng)):
                m(x).pow(2).mean().backward()
                o.step()
                o.zero_grad()
        self.same(model, ref, "one block")
        eng.close()

    def test_describe_counts_the_backward(self) -> None:
        """describe() measured VRAM by the forward phase (p), but the backward pins p and g: a budget it
        called "fits" failed at the first backward.  It names the backward's need now."""
        import tier.torch

        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
        c = self.client("describe")
        c.set_quota(vram=3 << 20)
        eng = tier.torch.Offload(m, c, lr=1e-3)
        need = 2 * (512 * 512 + 512) * 4        # p and g of one Linear, float32
        text = eng.describe()
        self.assertIn(f"the largest backward phase (its block's p and g, and the shared parameters it uses) "
                      f"needs {tier.torch.layout.fmt_bytes(need)}: does not fit twice", text)
        eng.close()

if __name__ == "__main__":
    tierd.main()
