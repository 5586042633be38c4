#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Models nobody in this project wrote, through tier.torch, bit for bit against plain PyTorch.

Hugging Face transformers' GPT-2 (tied and untied embeddings), Llama and
BERT-MLM (built from configs: no downloads; transformers from the test
venv, see venv.py), a torch ``nn.TransformerEncoder`` LM with its head tied
to its embedding, and torchvision's resnet18 (Debian's python3-torchvision).
Each is trained a few steps under placements A, B and C, with blocks found
by tier.torch.auto_blocks() and a host budget below the model's state, so
that every placement moves blocks through NVMe; losses, parameters (every
name of a tied one) and the model given back equal plain PyTorch's AdamW
bit for bit.  Then (a mixture-of-experts layer is in test_models_moe.py)
block discovery on each model, errors in the model's words, and the
warning for a block holding most of the state.
"""

from __future__ import annotations

import copy
import dataclasses
import unittest
import warnings

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
try:
    import torchvision
except ImportError:
    torchvision = None

MiB = 1 << 20
STEPS = 3
VOCAB = 256

#: pools large enough for resnet18's 187 MB of state at a quarter of it per job; VRAM not throttled
CONFIG = """\
[daemon]
linger_sec = 0
[host]
capacity = 320M
segment_size = 16M
job_limit = 256M
[vram]
backend = emulated
capacity = 128M
chunk_size = 16M
job_limit = 128M
[nvme]
target = @DIR@/t0.img:2G
extent_size = 1M
"""


# ---- the models ----------------------------------------------------------------------------

def gpt2(tied: bool = True):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32, tie_word_embeddings=tied))


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=VOCAB, max_position_embeddings=64))


def bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=VOCAB,
        max_position_embeddings=64))


class EncoderLM(torch.nn.Module if torch else object):
    """torch's own TransformerEncoder as a language model, its head tied to its embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, VOCAB)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


def resnet18():
    return torchvision.models.resnet18(num_classes=10)


def lm_batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (4, 16), generator=g) for _ in range(STEPS)]


def image_batches(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)) for _ in range(STEPS)]


def hf_loss(m, x):
    return m(input_ids=x, labels=x).loss


def lm_loss(m, x):
    """The next token at every place (the model sees the whole window: a test, not a language model)."""
    return torch.nn.functional.cross_entropy(m(x)[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))


def image_loss(m, xy):
    return torch.nn.functional.cross_entropy(m(xy[0]), xy[1])


#: name: (make the model, its batches, its loss, the blocks auto_blocks() must find (None: not checked))
CASES = {
    "gpt2": (lambda: gpt2(True), lm_batches, hf_loss,
             ["transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1", "transformer.h.2",
              "transformer.ln_f", "lm_head"]),
    "gpt2_untied": (lambda: gpt2(False), lm_batches, hf_loss, None),
    "llama": (llama, lm_batches, hf_loss,
              ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm", "lm_head"]),
    "bert_mlm": (bert, lm_batches, hf_loss,
                 ["bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "bert.encoder.layer.2", "cls"]),
    "encoder_lm": (EncoderLM, lm_batches, lm_loss, ["emb", "enc.layers.0", "enc.layers.1", "enc.layers.2", "head"]),
    "resnet18": (resnet18, image_batches, image_loss,
                 ["conv1", "bn1"] + [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)] + ["fc"]),
}


def run_plain(model, batches, loss_fn, lr: float = 1e-3, set_to_none: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    torch.manual_seed(11)                   # dropout draws the same masks in both runs
    for b in batches:
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(loss.item())
    return losses


def all_names(model) -> dict[str, "torch.Tensor"]:
    """Every name of every parameter (tied weights under each of theirs), as state_dict() has them."""
    from tier.torch.layout import param_names

    sd = model.state_dict()
    return {n: sd[n] for names in param_names(model).values() for n in names}


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestModels(tierd.DaemonTestCase):
    config = CONFIG

    def train(self, name: str, placement: str, **kw):
        """(losses, engine state_dict, model's parameters after close, bytes moved, engine) for case ``name``."""
        import tier.torch

        make, batches, loss_fn, _ = CASES[name]
        torch.manual_seed(5)
        model = make()
        ref = copy.deepcopy(model)
        data = batches(7)
        ref_losses = run_plain(ref, data, loss_fn)
        c = self.client(f"{name}-{placement}")
        # a host budget below the state, so that tierd moves blocks through NVMe in every placement:
        # half the state, or twice the largest optimizer phase (tierd pins the next phase while one
        # runs) if that is more
        state = sum(p.numel() * p.element_size() for p in model.parameters()) * 4     # p, g, m, v
        blocks = tier.torch.layout.build(model, tier.torch.auto_blocks(model))
        largest = max(b.nbytes * 2 + b.nbytes32 * 2 for b in blocks)
        limit = max(2 * largest + 256 * 1024, state // 2)
        self.assertLess(limit, state, f"{name}: a budget that fits its phases holds the whole state")
        c.set_quota(host=limit)
        eng = tier.torch.Offload(model, c, lr=1e-3, placement=placement, **kw)
        before = c.moved()
        losses = []
        torch.manual_seed(11)
        for i, b in enumerate(data):
            loss = loss_fn(model, b)
            loss.backward()
            if i == len(data) - 1:
                kept_before = eng.kept_up + eng.write_downs_refused
            eng.step()
            eng.zero_grad()
            losses.append(loss.item())
        eng.flush()
        # the last step's write-downs that the plan overtook (it pinned the tensor for the next step
        # before the write-down could start: Offload.kept_up) or tierd refused: those stay up
        self.last_kept = eng.kept_up + eng.write_downs_refused - kept_before
        after = c.moved()
        # which kinds are on NVMe now: the parameters the step's first phase maps excepted (step()
        # entered it: those stay up for it)
        first = {o.index for o in eng.param_owners(eng.blocks[eng.phases[0][1]])}
        self.on_nvme = {b.label: {k: t.stat().state["nvme"] == "resident" for k, t in b.tensors.items()
                                  if k[0] in "mv" or (k == "p" and b.index not in first)}
                        for b in eng.blocks if b.slots}
        sd = eng.parameters_state_dict()
        eng.close()
        moved = {k: after[k] - before[k] for k in after}
        return ref, ref_losses, losses, sd, model, moved, eng

    def check_case(self, name: str, **kw) -> None:
        for placement in "ABC":
            with self.subTest(placement=placement):
                ref, ref_losses, losses, sd, model, moved, eng = self.train(name, placement, **kw)
                if kw.get("optimizer_part_bytes"):
                    self.assertTrue(any(len(b.parts) > 1 for b in eng.blocks), "no block in parts")
                self.assertEqual(losses, ref_losses, f"{name} {placement}: losses")
                ref_all = all_names(ref)
                for n, p in ref_all.items():
                    self.assertIn(n, sd, f"{name} {placement}: {n} missing from the engine's state_dict()")
                    self.assertTrue(torch.equal(sd[n], p), f"{name} {placement}: {n} differs from plain PyTorch's")
                got = all_names(model)
                self.assertEqual(set(got), set(ref_all))
                for n, p in ref_all.items():
                    self.assertTrue(torch.equal(got[n], p), f"{name} {placement}: {n} was not given back")
                self.assertGreater(moved["host->nvme"], 0, f"{name} {placement}: nothing went through NVMe")
                self.assertGreater(moved["nvme->host"], 0, f"{name} {placement}: nothing came back from NVMe")
                if placement == "C":
                    # every block's moments are on NVMe after the last step, and its parameters but for
                    # those the plan needed back before their write-down could start (a prefetch for the
                    # next step, counted in Offload.kept_up): what holds however fast the links are
                    up = [label for label, kinds in self.on_nvme.items() if "p" in kinds and not kinds["p"]]
                    for label, kinds in self.on_nvme.items():
                        self.assertTrue(all(v for k, v in kinds.items() if k != "p"), f"{name}: {label}: on NVMe {kinds}")
                    self.assertLessEqual(len(up), self.last_kept, f"{name}: parameters not on NVMe: {up}")
                print(f"{name} {placement}: {len(eng.blocks)} blocks, losses {losses[0]:.4f}..{losses[-1]:.4f}, "
                      f"NVMe {moved['host->nvme'] >> 10} KiB written, {moved['nvme->host'] >> 10} KiB read")

    # ---- each model, A, B and C, bit for bit ------------------------------------------------

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_gpt2_tied(self) -> None:
        self.check_case("gpt2")

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_gpt2_untied(self) -> None:
        self.check_case("gpt2_untied")

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_llama(self) -> None:
        self.check_case("llama")

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_bert_mlm(self) -> None:
        self.check_case("bert_mlm")

    def test_encoder_lm_tied(self) -> None:
        self.check_case("encoder_lm")

    def test_optimizer_parts(self) -> None:
        """Optimizer phases in parts of 16 KiB of float32 (parameters cut on aligned elements, the
        tied embedding's too): the same bits."""
        self.check_case("encoder_lm", optimizer_part_bytes=16 << 10)

    @unittest.skipIf(torchvision is None, "no torchvision (python3-torchvision)")
    def test_resnet18(self) -> None:
        self.check_case("resnet18")

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_gpt2_generate_frozen_autocast(self) -> None:
        """What worked before with blocks= keeps working with the blocks found: HF generate() after
        training, frozen (tied) embeddings, bfloat16 autocast; each equal to plain PyTorch's bits."""
        import tier.torch

        def run(variant: str, engine: bool):
            torch.manual_seed(5)
            m = gpt2(True)
            if variant == "frozen":
                m.transformer.wte.weight.requires_grad_(False)      # tied: lm_head's too
            data = lm_batches(9)
            c = eng = opt = None
            if engine:
                c = self.client(f"gen-{variant}")
                eng = tier.torch.Offload(m, c, lr=1e-3, placement="C")
            else:
                opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)
            losses = []
            torch.manual_seed(11)
            for x in data:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant == "autocast"):
                    loss = hf_loss(m, x)
                loss.backward()
                o = eng or opt
                o.step()
                o.zero_grad()
                losses.append(loss.item())
            m.eval()
            with torch.no_grad():
                out = m.generate(data[0][:2, :4], max_new_tokens=6, do_sample=False, pad_token_id=0)
            sd = eng.parameters_state_dict() if eng else {n: p.detach().clone() for n, p in m.named_parameters()}
            if eng:
                eng.close()
            return losses, out, sd

        for variant in ("generate", "frozen", "autocast"):
            with self.subTest(variant=variant):
                ref_losses, ref_out, ref_sd = run(variant, False)
                losses, out, sd = run(variant, True)
                self.assertEqual(losses, ref_losses)
                self.assertTrue(torch.equal(out, ref_out), f"{variant}: generate() differs")
                for n, p in ref_sd.items():
                    self.assertTrue(torch.equal(sd[n], p), f"{variant}: {n} differs")

    # ---- block discovery ----------------------------------------------------------------------

    def test_blocks_found(self) -> None:
        import tier.torch

        for name, (make, _, _, want) in CASES.items():
            if want is None or (name in ("gpt2", "llama", "bert_mlm") and transformers is None) or \
                    (name == "resnet18" and torchvision is None):
                continue
            with self.subTest(name=name):
                m = make()
                names = {id(mod): n for n, mod in m.named_modules()}
                self.assertEqual([names[id(b)] for b in tier.torch.auto_blocks(m)], want)

    def test_blocks_module_under_several_names_wrapped(self) -> None:
        """A module under several names (T5's shared embedding) inside a model of the user's (a classifier
        holding a T5EncoderModel, or a T5ForConditionalGeneration).  The holder that only registers it
        (T5EncoderModel.shared) counted as one more caller, and every module holding a caller was kept
        whole: the whole backbone was one block, which no budget below it fits.  Only the modules that call
        it stay whole; the encoder-only one, called once, is a block of its own as in the model alone."""
        import tier.torch

        class Stack(torch.nn.Module):
            def __init__(self, emb: torch.nn.Module) -> None:
                super().__init__()
                self.embed_tokens = emb
                self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
                self.norm = torch.nn.LayerNorm(8)

        class Backbone(torch.nn.Module):        # (T5EncoderModel, T5ForConditionalGeneration's shape)
            def __init__(self, decoder: bool) -> None:
                super().__init__()
                self.shared = torch.nn.Embedding(16, 8)
                self.encoder = Stack(self.shared)
                if decoder:
                    self.decoder = Stack(self.shared)

        class User(torch.nn.Module):
            def __init__(self, decoder: bool) -> None:
                super().__init__()
                self.backbone = Backbone(decoder)
                self.head = torch.nn.Linear(8, 2)

        for decoder, want in ((False, ["backbone.shared", "backbone.encoder.layers.0", "backbone.encoder.layers.1",
                                       "backbone.encoder.norm", "head"]),
                              (True, ["backbone.encoder", "backbone.decoder", "head"])):
            with self.subTest(decoder=decoder):
                m = User(decoder)
                names = {id(mod): n for n, mod in m.named_modules()}
                self.assertEqual([names[id(b)] for b in tier.torch.auto_blocks(m)], want)
                self.assertEqual([names[id(b)] for b in tier.torch.auto_blocks(m.backbone)], want[:-1])

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_tied_stored_once(self) -> None:
        """GPT-2's wte and lm_head are one parameter: one storage (the shared block), both names."""
        import tier.torch

        m = gpt2(True)
        numel = sum(p.numel() for p in m.parameters())
        c = self.client()
        eng = tier.torch.Offload(m, c)
        shared = eng.blocks[-1]
        self.assertTrue(shared.is_shared)
        self.assertEqual([s.names for s in shared.slots], [["transformer.wte.weight", "lm_head.weight"]])
        self.assertEqual(sum(s.numel for b in eng.blocks for s in b.slots), numel)
        table = eng.describe()
        self.assertIn("transformer.h.0", table)
        self.assertIn("(shared)", table)
        self.assertIn("host limit", table)
        eng.close()
        self.assertIs(m.lm_head.weight, m.transformer.wte.weight)   # still tied after close
        self.assertEqual(m.lm_head.weight.shape, (VOCAB, 64))

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_bert_bias_alias(self) -> None:
        """BERT's decoder bias is also registered as cls.predictions.bias: one slot, both names."""
        import tier.torch

        m = bert()
        self.assertIs(m.cls.predictions.decoder.bias, m.cls.predictions.bias)
        c = self.client()
        eng = tier.torch.Offload(m, c)
        sd = eng.parameters_state_dict()
        self.assertTrue(torch.equal(sd["cls.predictions.bias"], sd["cls.predictions.decoder.bias"]))
        eng.close()

    # ---- what is refused, and how ---------------------------------------------------------------

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_dominant_block_warned(self) -> None:
        import tier.torch

        m = gpt2(False)
        c = self.client()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            eng = tier.torch.Offload(m, c, blocks=[m.transformer, m.lm_head])
        msgs = [str(x.message) for x in w if issubclass(x.category, tier.torch.TierTorchWarning)]
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("block 0 'transformer' (GPT2Model) holds", msgs[0])
        self.assertIn("blocks=[...]", msgs[0])
        self.assertIn("transformer.wte", msgs[0])
        eng.close()

    @unittest.skipIf(transformers is None, NO_VENV or "no transformers")
    def test_resize_token_embeddings_refused(self) -> None:
        """HF's ``model.resize_token_embeddings(n)`` after the engine is made read the embedding's size from
        its empty placeholder and failed with "not enough values to unpack (expected 2, got 1)".  Refused now
        in words, before anything changes (the embedding module, its parameter, the config); after close()
        it resizes as HF's own."""
        import tier.torch

        for tied in (True, False):
            m = gpt2(tied)
            wte, w = m.transformer.wte, m.transformer.wte.weight
            sizes = (m.get_input_embeddings().weight.shape[0], m.num_parameters(), m.lm_head.weight.size())
            eng = tier.torch.Offload(m, self.client(f"resize-{tied}"))
            sd = eng.parameters_state_dict()
            # (what the model's code reads of it, as before the engine: its placeholders gave 0 and (0,))
            self.assertEqual((m.get_input_embeddings().weight.shape[0], m.num_parameters(), m.lm_head.weight.size()),
                             sizes)
            with self.assertRaisesRegex(RuntimeError, r"^resize_token_embeddings\(\) on GPT2LMHeadModel while a "
                                                      r"tier\.torch engine holds .*resize the embeddings before "
                                                      r"making the engine, or close\(\) the engine.*nothing changed"):
                m.resize_token_embeddings(VOCAB + 8)
            self.assertIs(m.transformer.wte, wte)
            self.assertIs(m.transformer.wte.weight, w)
            self.assertEqual((m.config.vocab_size, m.lm_head.weight is w), (VOCAB, tied))
            after = eng.parameters_state_dict()
            self.assertTrue(all(torch.equal(after[k], v) for k, v in sd.items()))
            eng.close()
            self.assertNotIn("resize_token_embeddings", m.__dict__)
            m.resize_token_embeddings(VOCAB + 8)
            self.assertEqual((m.transformer.wte.weight.shape, m.config.vocab_size), ((VOCAB + 8, 64), VOCAB + 8))
            self.assertEqual(m.lm_head.weight is m.transformer.wte.weight, tied)

    def test_top_module_parameters_advice(self) -> None:
        """A model with a parameter of its own (a ViT's class token) is one block.  The warning about it
        advised splitting it into its children, or leaving its class out of no_split_module_classes
        (where it never was); the split was then refused as "class_token is in no block: pass blocks= that
        cover it", which no blocks= can.  Both say why now, and what to do."""
        import tier.torch

        class Tokened(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.class_token = torch.nn.Parameter(torch.zeros(1, 1, 16))
                self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))

            def forward(self, x):
                x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1)
                for layer in self.layers:
                    x = layer(x)
                return x

        m = Tokened()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            eng = tier.torch.Offload(m, self.client("tokened"))
        msgs = [str(x.message) for x in w if issubclass(x.category, tier.torch.TierTorchWarning)]
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("it cannot be split: Tokened has parameters of its own (class_token)", msgs[0])
        self.assertNotIn("no_split_module_classes", msgs[0])
        eng.close()
        with self.assertRaisesRegex(ValueError, r"class_token is in no block: it is registered on 'the model' "
                                                r"itself, which holds blocks \(layers.0, layers.1\)"):
            tier.torch.Offload(m, self.client("tokened-split"), blocks=list(m.layers))

    def test_no_fit_in_the_model_words(self) -> None:
        """A block whose phase cannot fit the job's budget: the error names the module, bytes and what to do."""
        import tier
        import tier.torch

        m = EncoderLM()
        c = self.client()
        c.set_quota(host=256 << 10)
        eng = None
        with self.assertRaises(tier.TierError) as cm:
            eng = tier.torch.Offload(m, c)
            x = lm_batches(1)[0]
            lm_loss(m, x).backward()
            eng.step()
        text = str(cm.exception)
        self.assertRegex(text, r"block \d+ '(emb|enc\.layers\.\d|head)' \((Embedding|TransformerEncoderLayer|Linear)\)")
        self.assertIn("in host", text)
        self.assertIn("tierctl quota set", text)
        self.assertIn("guaranteed minimums", text)     # a phase refused for other jobs' guarantees: said too
        self.assertIn("describe()", text)
        self.assertNotRegex(text, r"'torch\.\d+\.\d+\.[pgmv]'")      # no internal tensor names
        if eng is not None:
            eng.close(restore=False)


@dataclasses.dataclass
class Out:
    logits: "torch.Tensor"


class DataclassOut(torch.nn.Module if torch else object):
    """A model whose output is a dataclass (as a policy's distribution or a user's record is)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return Out(self.b(torch.relu(self.a(x))))


def normed() -> "torch.nn.Module":
    """Two weight_norm layers as blocks: their pre-hooks read weight_g and weight_v."""
    torch.manual_seed(6)
    wn = torch.nn.utils.weight_norm
    return torch.nn.Sequential(wn(torch.nn.Linear(8, 16)), torch.nn.ReLU(), wn(torch.nn.Linear(16, 4)))


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestModelShapes(tierd.DaemonTestCase):
    """Models built in ways the blocks' hooks must not miss, and what an engine cannot follow."""
    config = CONFIG

    def setUp(self) -> None:
        import tier.torch

        super().setUp()
        warnings.simplefilter("ignore", tier.torch.TierTorchWarning)      # (tiny models: one block dominates)
        self.addCleanup(warnings.resetwarnings)

    def exact(self, make, loss_fn, steps: int = 3, clip: float | None = None) -> None:
        import tier.torch

        torch.manual_seed(3)
        model = make()
        torch.manual_seed(3)
        ref = make()                # (weight_norm's module holds a non-leaf weight: no deepcopy)
        g = torch.Generator().manual_seed(4)
        data = [torch.randn(5, 8, generator=g) for _ in range(steps)]
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        eng = tier.torch.Offload(model, self.client(), lr=1e-2)
        rl, tl, rn, tn = [], [], [], []
        for x in data:
            for m, o, losses, norms in ((ref, opt, rl, rn), (model, eng, tl, tn)):
                loss = loss_fn(m, x)
                loss.backward()
                if clip is not None:
                    norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), clip).item())
                o.step()
                o.zero_grad()
                losses.append(loss.item())
        self.assertEqual(tl, rl)
        self.assertEqual(tn, rn)
        sd = eng.parameters_state_dict()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    def test_weight_norm_blocks(self) -> None:
        """weight_norm's pre-hook computes the weight from weight_g and weight_v: the engine's pre-hook maps
        them first (it ran after it, on the empty placeholders: a SIGFPE or a shape error)."""
        self.exact(normed, lambda m, x: m(x).pow(2).mean())

    def test_dataclass_output_with_clipping(self) -> None:
        """An output that is a dataclass: the backward's start is found (it was not: the clip's norm left
        the last block's gradients out, silently)."""
        self.exact(DataclassOut, lambda m, x: m(x).logits.pow(2).mean(), clip=0.01)

    def test_requires_grad_changed_refused(self) -> None:
        """Which parameters train is laid out when the engine is made: a change after is refused at the
        next forward, before it changes anything (torch.optim would update a parameter unfrozen later;
        the engine never did)."""
        import tier.torch

        torch.manual_seed(3)
        model = DataclassOut()
        model.a.bias.requires_grad_(False)
        eng = tier.torch.Offload(model, self.client(), lr=1e-2)
        x = torch.randn(5, 8)
        model(x).logits.sum().backward()
        eng.step()
        before = eng.parameters_state_dict()
        model.a.bias.requires_grad_(True)
        with self.assertRaisesRegex(RuntimeError, r"parameter a\.bias: requires_grad is True now, False when .*"
                                                  r"close\(\) the engine and make a new one"):
            model(x)
        after = eng.parameters_state_dict()
        for n in before:
            self.assertTrue(torch.equal(before[n], after[n]), n)
        model.a.bias.requires_grad_(False)
        eng.close()

    def test_block_twice_after_the_first_step_refused(self) -> None:
        """A block that ran once in the first step and twice in a later one is refused at its second
        forward, before the step changes anything (it entered the same planned phases again, and fused,
        its parameters were updated twice in one step)."""
        import tier.torch

        class Looped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body0 = torch.nn.Linear(8, 8)
                self.body1 = torch.nn.Linear(8, 8)
                self.head = torch.nn.Linear(8, 4)
                self.rounds = 1

            def forward(self, x):
                for _ in range(self.rounds):
                    x = self.body1(torch.relu(self.body0(x)))
                return self.head(x)

        torch.manual_seed(3)
        model = Looped()
        eng = tier.torch.Offload(model, self.client(), lr=1e-2)
        x = torch.randn(5, 8)
        for _ in range(2):
            model(x).pow(2).mean().backward()
            eng.step()
            eng.zero_grad()
        self.assertEqual(eng.mode, "fused")
        before = eng.parameters_state_dict()
        model.rounds = 2
        with self.assertRaisesRegex(RuntimeError, r"'body0' \(Linear\) ran its forward twice in one step.*"
                                                  r"Nothing was changed"):
            model(x)
        after = eng.parameters_state_dict()
        for n in before:
            self.assertTrue(torch.equal(before[n], after[n]), n)
        eng.close(restore=False)

    def test_two_engines_of_one_job(self) -> None:
        """Two models of one job (a GAN's generator and discriminator), each its own engine: the second
        with the first's tensor names is refused before it makes anything (it took the first's tensors for
        an earlier run's and destroyed them: the generator's weights were gone), and so is one on the first's
        client or with resume=True; with its own prefix= and client both train and give their weights back."""
        import tier.torch

        torch.manual_seed(3)
        gen, disc = DataclassOut(), DataclassOut()
        want = {n: p.detach().clone() for n, p in gen.named_parameters()}
        dwant = {n: p.detach().clone() for n, p in disc.named_parameters()}
        c1, c2 = self.client("gan"), self.client("gan")
        g = tier.torch.Offload(gen, c1, lr=1e-2)
        with self.assertRaisesRegex(ValueError, r"another engine of job 'gan' \(rank 0\) .*prefix="):
            tier.torch.Offload(disc, c2, lr=1e-2)
        # the first one's client (a client runs one plan: the second step() failed after its update), or
        # resuming with two engines of a job (a commit would take the other's step half done)
        with self.assertRaisesRegex(ValueError, "another engine runs on this client already"):
            tier.torch.Offload(disc, c1, lr=1e-2, prefix="disc")
        with self.assertRaisesRegex(ValueError, "resume=True with two engines of job 'gan'"):
            tier.torch.Offload(disc, c2, lr=1e-2, prefix="disc", resume=True)
        for n, p in disc.named_parameters():
            self.assertTrue(torch.equal(p.detach(), dwant[n]), n)
        d = tier.torch.Offload(disc, c2, lr=1e-2, prefix="disc")
        sd = g.parameters_state_dict()
        for n in want:
            self.assertTrue(torch.equal(sd[n], want[n]), n)
        d.close()
        g.close()
        for n, p in gen.named_parameters():
            self.assertTrue(torch.equal(p.detach(), want[n]), n)

    def test_forward_that_raised_does_not_count(self) -> None:
        """A forward that raised (a batch skipped, out of memory) did not happen: the next one is that
        micro-batch again, in the first (traced) step and later, fused and accumulating, and the run is
        plain PyTorch's with the bad batches skipped.  The engine used to count it: later forwards were
        refused for good ("a second forward with gradients before step()")."""
        import tier.torch

        class Fragile(DataclassOut):
            def forward(self, x):
                h = torch.relu(self.a(x))
                if torch.isnan(x).any():
                    raise ValueError("bad batch")
                return Out(self.b(h))

        def run(model, opt, accumulate: int, zero: bool) -> list[float]:
            g = torch.Generator().manual_seed(4)
            losses = []
            for step in range(3):
                for micro in range(accumulate):
                    if micro == 0 and step < 2:
                        with self.assertRaisesRegex(ValueError, "bad batch"):
                            model(torch.full((5, 8), float("nan")))
                        if zero:
                            opt.zero_grad()     # the usual skip (it used to break the engine for good)
                    loss = model(torch.randn(5, 8, generator=g)).logits.pow(2).mean() / accumulate
                    loss.backward()
                    losses.append(loss.item())
                opt.step()
                opt.zero_grad()
            return losses

        for accumulate, zero in ((1, False), (2, False), (1, True), (2, True)):
            torch.manual_seed(3)
            ref, model = Fragile(), Fragile()
            model.load_state_dict(ref.state_dict())
            want = run(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), accumulate, zero)
            eng = tier.torch.Offload(model, self.client(f"fragile{accumulate}{zero:d}"), lr=1e-2)
            self.assertEqual(run(model, eng, accumulate, zero), want)
            self.assertEqual(eng.mode, "fused" if accumulate == 1 else "deferred")
            sd = eng.parameters_state_dict()
            for n, p in ref.named_parameters():
                self.assertTrue(torch.equal(sd[n], p), n)
            eng.close()

    def test_block_returning_a_view_of_its_parameter(self) -> None:
        """A block that returns a slice of its own parameter (a learned positional table) hands out a copy:
        the view lay in the memory mapped for its phase, which tierd gives to other tensors once the phase
        is over, and was read after it.  Bit-exact against plain PyTorch."""
        import tier.torch

        class PosTable(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.pe = torch.nn.Parameter(torch.randn(1, 16, 8))

            def forward(self, n: int):
                return self.pe[:, :n]

        class WithPos(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.pos = PosTable()
                self.a = torch.nn.Linear(8, 8)
                self.b = torch.nn.Linear(8, 4)

            def forward(self, x):
                p = self.pos(x.shape[1])
                return self.b(torch.relu(self.a(x) + p))       # p read after a's phase began

        torch.manual_seed(3)
        model = WithPos()
        torch.manual_seed(3)
        ref = WithPos()
        eng = tier.torch.Offload(model, self.client(), lr=1e-2)
        views = []

        def check(mod, args, out) -> None:
            b = eng.by_module[id(mod)]
            flat = b.maps[("p", eng.vram)]
            views.append(flat.data_ptr() <= out.data_ptr() < flat.data_ptr() + b.nbytes)

        h = model.pos.register_forward_hook(check)
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(4)
        for _ in range(3):
            x = torch.randn(2, 5, 8, generator=g)
            for m, o in ((ref, opt), (model, eng)):
                m(x).pow(2).mean().backward()
                o.step()
                o.zero_grad()
        h.remove()
        self.assertEqual(views, [False] * 3)
        sd = eng.parameters_state_dict()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    def test_plan_refused_then_quota_raised(self) -> None:
        """The plan traced in the first step refused at its submit (two optimizer phases do not fit the
        host quota together): the step's update stands and says so, the next step is traced and submits
        again, and with the quota raised the run is plain PyTorch's.  The engine used to keep the refused
        trace: every later forward was refused ("ran its forward twice in one step")."""
        import tier
        import tier.torch

        def make() -> torch.nn.Module:
            torch.manual_seed(3)
            return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))

        model, ref = make(), make()
        c = self.client("replan")
        c.set_quota(host=1100 * 1024)           # one optimizer phase's state fits, two do not
        eng = tier.torch.Offload(model, c, lr=1e-2, placement="C")
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(4)
        for step in range(3):
            x = torch.randn(4, 256, generator=g)
            for m, o in ((ref, opt), (model, eng)):
                m(x).pow(2).mean().backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                if o is eng and step == 0:
                    with self.assertRaises(tier.NoSpaceError) as cm:
                        o.step()
                    self.assertIn("this step's update was applied", "".join(cm.exception.__notes__))
                    c.set_quota(host=8 << 20)
                else:
                    o.step()
                o.zero_grad()
        self.assertTrue(eng.tracer.planned)
        self.assertEqual(eng.steps, 3)
        sd = eng.parameters_state_dict()
        for n, p in ref.named_parameters():
            self.assertTrue(torch.equal(sd[n], p), n)
        eng.close()

    def test_failed_engine_keeps_the_model(self) -> None:
        """An engine refused for want of room (a host quota below one block's state) leaves the model its
        parameters and tierd none of its tensors; once the quota is raised, a new engine trains the same
        weights.  The model used to be left with empty placeholders, and the retry destroyed the tensors
        holding the only copy of the weights."""
        import tier
        import tier.torch

        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(512, 64))
        want = {n: p.detach().clone() for n, p in model.named_parameters()}
        c = self.client("refused")
        c.set_quota(host=96 * 1024)         # the first block's state fits, the second's does not
        with self.assertRaises(tier.TierError):
            tier.torch.Offload(model, c, lr=1e-2)
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), want[n]), n)
        for name in ("torch.0.0.p", "torch.0.0.m", "torch.0.2.p"):
            with self.assertRaises(tier.NotFoundError):
                c.open(name)
        c.set_quota(host=64 * MiB)
        eng = tier.torch.Offload(model, c, lr=1e-2)
        sd = eng.parameters_state_dict()
        for n in want:
            self.assertTrue(torch.equal(sd[n], want[n]), n)
        eng.close()
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(p.detach(), want[n]), n)


    def test_embedding_max_norm_or_sparse_refused(self) -> None:
        """An Embedding with max_norm renormalizes the rows it looks up in place in its forward (under
        torch.no_grad()), into the copy its block's phase only reads: the change was lost, and step()
        refused it only after the forward and backward, saying nothing of max_norm, the parameter's value
        left undefined.  One with sparse=True failed inside the backward ("copy_() between dense and sparse
        Tensors is not implemented").  Both refused when the engine is made, naming the module and what to
        set, the model left as it was and tierd holding none of its tensors."""
        import tier
        import tier.torch

        for cls, kw, say in ((torch.nn.Embedding, {"max_norm": 1.0}, r"has max_norm=1\.0.*max_norm=None"),
                             (torch.nn.EmbeddingBag, {"max_norm": 1.0}, r"has max_norm=1\.0.*max_norm=None"),
                             (torch.nn.Embedding, {"sparse": True}, r"has sparse=True.*sparse = False"),
                             (torch.nn.EmbeddingBag, {"sparse": True}, r"has sparse=True.*sparse = False")):
            with self.subTest(cls=cls.__name__, kw=kw):
                torch.manual_seed(3)
                model = torch.nn.Sequential(cls(50, 8, **kw), torch.nn.Linear(8, 4))
                want = {n: p.detach().clone() for n, p in model.named_parameters()}
                c = self.client(f"embedding-{cls.__name__}-{len(kw)}{list(kw)[0]}")
                with self.assertRaisesRegex(ValueError, r"'0' \(%s\) %s" % (cls.__name__, say)):
                    tier.torch.Offload(model, c, lr=1e-2)
                for n, p in model.named_parameters():
                    self.assertTrue(torch.equal(p.detach(), want[n]), n)
                with self.assertRaises(tier.NotFoundError):
                    c.open("torch.0.0.p")
                model[0].max_norm, model[0].sparse = None, False    # what the message says: then it trains
                eng = tier.torch.Offload(model, c, lr=1e-2)
                x = torch.randint(0, 50, (4, 3))
                model(x).sum().backward()
                eng.step()
                eng.close()


if __name__ == "__main__":
    tierd.main()
