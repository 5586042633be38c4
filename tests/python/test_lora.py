#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Parameter-efficient fine-tuning (LoRA, written by hand as peft does it) through tier.torch.

Hugging Face's GPT-2 and Llama (tiny configs, transformers from the test venv,
see venv.py) get LoRA adapters on their attention and MLP projections
before the engine is made (the base frozen, A and B trainable, the adapter
``base(x) + B(A(dropout(x))) * scale``), and train bit for bit as plain
PyTorch does (losses, adapters, AdamW state); then what a LoRA loop does
around that: the adapters' state dict loaded into a plain model, adapters
merged into the base after close(), frozen tied embeddings, gradient
checkpointing with HF's enable_input_require_grads(), blocks with no
trainable parameter (frozen first layers), and what is refused: adapters
added after the engine, a merge while it is open.
"""

from __future__ import annotations

import copy
import os
import unittest

import tierd
import venv

NO_VENV = venv.enter()

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None
try:
    import transformers
except ImportError:
    transformers = None

VOCAB = 256
STEPS = 3

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
chunk_size = 16M
job_limit = 64M
[nvme]
target = @DIR@/t0.img:1G
extent_size = 1M
"""


# ---- LoRA by hand, as peft wraps a layer ----------------------------------------------------

class LoRA(torch.nn.Module if torch else object):
    """``base`` (an nn.Linear, or GPT-2's Conv1D) frozen, plus B(A(dropout(x))) * scale."""

    def __init__(self, base, r: int = 4, alpha: int = 8, dropout: float = 0.1) -> None:
        super().__init__()
        if isinstance(base, torch.nn.Linear):
            fin, fout = base.in_features, base.out_features
        else:                                   # transformers' Conv1D: weight (in, out)
            fin, fout = base.weight.shape
        self.base_layer = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_dropout = torch.nn.Dropout(dropout)
        self.lora_A = torch.nn.Linear(fin, r, bias=False)
        self.lora_B = torch.nn.Linear(r, fout, bias=False)
        torch.nn.init.normal_(self.lora_B.weight, std=0.02)     # (peft: zeros; not zero, so A trains from step 1)
        self.scale = alpha / r

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scale

    def delta(self):
        """What merging adds to the base weight (in the base's layout)."""
        d = self.lora_B.weight @ self.lora_A.weight * self.scale
        return d if isinstance(self.base_layer, torch.nn.Linear) else d.T


TARGETS = ("c_attn", "c_proj", "c_fc", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model, layers=None) -> list[str]:
    """Freeze ``model`` and wrap its attention and MLP projections (of ``layers``, an index set; every
    layer if None) in LoRA; returns the wrapped modules' names."""
    for p in model.parameters():
        p.requires_grad_(False)
    done = []
    for name, m in list(model.named_modules()):
        parent, _, attr = name.rpartition(".")
        if attr not in TARGETS or isinstance(m, LoRA):
            continue
        idx = next((int(x) for x in name.split(".") if x.isdigit()), None)
        if layers is not None and idx not in layers:
            continue
        setattr(model.get_submodule(parent), attr, LoRA(m))
        done.append(name)
    return done


def gpt2(tied: bool = True):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32, tie_word_embeddings=tied))


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=VOCAB, max_position_embeddings=64))


MODELS = {"gpt2": gpt2, "llama": llama}


def batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (4, 16), generator=g) for _ in range(STEPS)]


def loss_of(m, x):
    return m(input_ids=x, labels=x).loss


def lora_sd(model) -> dict:
    return {k: v for k, v in model.state_dict().items() if "lora" in k}


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestLoRA(tierd.DaemonTestCase):
    config = CONFIG

    def make(self, name: str, prepare=None):
        torch.manual_seed(5)
        m = MODELS[name]()
        if prepare is not None:
            prepare(m)
        else:
            add_lora(m)
        return m

    def run_loop(self, model, data, engine=None, step=None):
        """Train ``model`` on ``data``: through ``engine``, else a plain AdamW over what trains.
        Returns (losses, optimizer state_dict, the optimizer or engine)."""
        opt = engine or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        losses = []
        torch.manual_seed(11)               # dropout draws the same masks in both runs
        for x in data:
            loss = loss_of(model, x)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, opt.state_dict(), opt

    def compare(self, name: str, prepare=None, placement: str = "C", **kw):
        """Train model ``name`` prepared by ``prepare`` plainly and through tier.torch; assert the same
        bits (losses, every parameter, the optimizer state); returns (plain model, engine's model)."""
        import tier.torch

        ref = self.make(name, prepare)
        model = self.make(name, prepare)
        data = batches(7)
        ref_losses, ref_osd, _ = self.run_loop(ref, data)
        eng = tier.torch.Offload(model, self.client(f"{name}-{placement}"), lr=1e-2, placement=placement, **kw)
        losses, osd, _ = self.run_loop(model, data, eng)
        eng.close()
        self.assertEqual(losses, ref_losses)
        sd, ref_sd = model.state_dict(), ref.state_dict()
        self.assertEqual(set(sd), set(ref_sd))
        for k, v in ref_sd.items():
            self.assertTrue(torch.equal(sd[k], v), f"{name}: {k} differs")
        self.assertEqual(len(osd["state"]), len(ref_osd["state"]))
        for i, st in ref_osd["state"].items():
            for k, v in st.items():
                self.assertTrue(torch.equal(torch.as_tensor(osd["state"][i][k]), torch.as_tensor(v)),
                                f"{name}: optimizer state {i} {k} differs")
        return ref, model, eng

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_lora_bit_for_bit(self) -> None:
        for name in MODELS:
            for placement in "AC":
                with self.subTest(name=name, placement=placement):
                    self.compare(name, placement=placement)

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_adapters_saved_loaded_merged(self) -> None:
        """The adapters' state dict (peft's adapter_model) loads into a fresh plain model, which then computes
        what plain PyTorch's does; merged into the base weights after close() (W += B @ A * scale), the model
        without adapters gives the same logits, up to rounding."""
        ref, model, _ = self.compare("gpt2", placement="B")
        sd = lora_sd(model)
        self.assertTrue(sd and all("lora_A" in k or "lora_B" in k for k in sd))
        fresh = self.make("gpt2")
        missing, unexpected = fresh.load_state_dict(sd, strict=False)
        self.assertFalse(unexpected)
        self.assertFalse([k for k in missing if "lora" in k])
        ref.eval()
        fresh.eval()
        x = batches(3)[0]
        with torch.no_grad():
            want = ref(input_ids=x).logits
            self.assertTrue(torch.equal(fresh(input_ids=x).logits, want))
            # merged after close(): the engine's model is plain again
            model.eval()
            for m in model.modules():
                if isinstance(m, LoRA):
                    m.base_layer.weight += m.delta()
                    m.lora_B.weight.zero_()
            torch.testing.assert_close(model(input_ids=x).logits, want, rtol=1e-4, atol=1e-5)

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "raises through torch's C++ (__torch_function__), which ASan's __cxa_throw cannot take")
    def test_merge_while_open_refused(self) -> None:
        """Merging while the engine is open reads the adapters' empty placeholders: refused before the base
        weight changes, naming close()."""
        import tier.torch

        model = self.make("gpt2")
        eng = tier.torch.Offload(model, self.client("merge-open"), lr=1e-2, placement="C")
        self.run_loop(model, batches(7)[:1], eng)
        before = model.state_dict()
        lo = model.transformer.h[0].attn.c_attn
        with self.assertRaisesRegex(RuntimeError, "after close"):
            with torch.no_grad():
                lo.base_layer.weight += lo.delta()
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        eng.close()

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_adapters_after_engine_refused(self) -> None:
        """Adapters added after the engine was made, as peft's injection does (a new Linear put into the layer,
        its forward patched) or as a new Parameter: the engine would never update them (their gradients
        piled up in .grad, silently, before the fix); refused before they are added, saying to add them
        before making the engine.  A module put in place of the layer (peft's replacement) is refused as a
        replacement; a frozen module added passes, and unfreezing it later is refused at the next forward."""
        import tier.torch

        model = self.make("llama", lambda m: None)          # full fine-tuning engine, then LoRA
        eng = tier.torch.Offload(model, self.client("after"), lr=1e-2, placement="C")
        lin = model.model.layers[0].self_attn.q_proj
        with self.assertRaisesRegex(RuntimeError, "lora_A.*requires grad.*before making the engine"):
            lin.lora_A = torch.nn.Linear(64, 4, bias=False)
        self.assertNotIn("lora_A", lin._modules)
        with self.assertRaisesRegex(RuntimeError, "lora_A.*requires grad.*before making the engine"):
            lin.add_module("lora_A", torch.nn.Linear(64, 4, bias=False))
        with self.assertRaisesRegex(RuntimeError, "parameter lora_scale.*requires grad.*before making the engine"):
            lin.lora_scale = torch.nn.Parameter(torch.ones(()))
        self.assertNotIn("lora_scale", lin._parameters)
        with self.assertRaisesRegex(RuntimeError, "in place of module q_proj"):
            model.model.layers[0].self_attn.q_proj = LoRA(torch.nn.Linear(64, 64))
        with self.assertRaisesRegex(RuntimeError, "requires grad.*before making the engine"):
            model.model.layers[1].lora = torch.nn.ModuleDict({"a": torch.nn.Linear(64, 4)})
        # a frozen one is torch's (nothing trains it); unfrozen later, the next forward refuses
        frozen = torch.nn.Linear(64, 4, bias=False).requires_grad_(False)
        lin.lora_A = frozen
        frozen.weight.requires_grad_(True)
        with self.assertRaisesRegex(RuntimeError, "q_proj.lora_A.weight requires grad.*none of the tier.torch"):
            loss_of(model, batches(1)[0])
        frozen.weight.requires_grad_(False)
        losses, _, _ = self.run_loop(model, batches(1)[:1], eng)       # and the run goes on
        eng.close()
        lin.lora_B = torch.nn.Linear(4, 64, bias=False)                # after close(): torch's

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_gradient_checkpointing(self) -> None:
        """HF gradient checkpointing with the base frozen: reentrant (transformers 4.36's default) with
        enable_input_require_grads(), and non-reentrant without it, bit for bit; reentrant without it, where
        no gradient reaches the adapters, refused at the forward saying so (it said "return tensors")."""
        import tier.torch

        for name in MODELS:
            for reentrant, irg in ((True, True), (False, False)):
                def prepare(m, reentrant=reentrant, irg=irg):
                    add_lora(m)
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
                    if irg:
                        m.enable_input_require_grads()
                with self.subTest(name=name, reentrant=reentrant, irg=irg):
                    self.compare(name, prepare)

        def no_irg(m):
            add_lora(m)
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model = self.make("llama", no_irg)
        eng = tier.torch.Offload(model, self.client("gc-no-irg"), lr=1e-2, placement="C")
        with self.assertWarns(UserWarning):             # torch's "None of the inputs have requires_grad=True"
            with self.assertRaisesRegex(RuntimeError, "enable_input_require_grads"):
                loss_of(model, batches(1)[0])
        eng.zero_grad()
        eng.close()

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_frozen_blocks(self) -> None:
        """Whole blocks with nothing to train (the first layers frozen, adapters on the last only; the
        embeddings, tied head and norms frozen throughout), and fully trainable blocks beside LoRA ones
        (the last layer unfrozen): bit for bit, and placement C still writes the frozen blocks' parameters
        down to NVMe."""
        import tier.torch

        def mixed(m):
            add_lora(m, layers={1})
            last = m.transformer.h[2] if hasattr(m, "transformer") else m.model.layers[2]
            last.requires_grad_(True)
        for name in MODELS:
            with self.subTest(name=name, case="first frozen"):
                self.compare(name, lambda m: add_lora(m, layers={2}))
            with self.subTest(name=name, case="mixed"):
                self.compare(name, mixed)
        model = self.make("llama", lambda m: add_lora(m, layers={2}))
        c = self.client("frozen-nvme")
        eng = tier.torch.Offload(model, c, lr=1e-2, placement="C")
        self.run_loop(model, batches(7), eng)
        eng.flush()
        first = {o.index for o in eng.param_owners(eng.blocks[eng.phases[0][1]])}
        for b in eng.blocks:
            if b.slots and b.index not in first and not any(s.trainable for s in b.slots):
                self.assertEqual(b.tensors["p"].stat().state["nvme"], "resident", b.label)
        eng.close()


if __name__ == "__main__":
    tierd.main()
