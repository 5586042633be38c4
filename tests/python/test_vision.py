#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Vision models through tier.torch as a newcomer trains them, bit for bit against plain PyTorch.

torchvision's mobilenet_v3_small (squeeze-excitation, hardswish), efficientnet_b0 (squeeze-excitation,
stochastic depth drawn from the seed) and densenet121 (BatchNorm everywhere), each under a host budget
below its state, placement C: losses, every entry of ``model.state_dict()`` (the BatchNorm running
statistics and ``num_batches_tracked`` buffers too) and the optimizer state equal plain AdamW's.  Then the
loop around them: a LambdaLR warmup with gradient accumulation and clipping; BatchNorm put in eval mode
mid-training, an evaluation between steps, ``model.state_dict()`` kept while training, a
``model.load_state_dict()`` mid-training and ``torch.save(model.state_dict())`` loaded into a plain model;
bfloat16 autocast on the CPU with ``torch.cuda.amp.GradScaler(enabled=False)``'s calls; and a conversion
of the model after the engine (``model.half()``, ``.to(torch.bfloat16)``, ``.double()``), refused before it
converts anything, its BatchNorm buffers included; and ``SyncBatchNorm.convert_sync_batchnorm(model)`` or a
new head after the engine, refused before a module is replaced.
"""

from __future__ import annotations

import io
import unittest

import tierd

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None
try:
    import torchvision
except ImportError:
    torchvision = None

#: densenet121's 106 MiB of state at half of it per job; VRAM not throttled
CONFIG = """\
[daemon]
linger_sec = 0
[host]
capacity = 192M
segment_size = 16M
job_limit = 128M
[vram]
backend = emulated
capacity = 128M
chunk_size = 16M
job_limit = 128M
[nvme]
target = @DIR@/t0.img:1G
extent_size = 1M
"""

MODELS = {
    "mobilenet_v3_small": lambda: torchvision.models.mobilenet_v3_small(num_classes=10),
    "efficientnet_b0": lambda: torchvision.models.efficientnet_b0(num_classes=10),
    "densenet121": lambda: torchvision.models.densenet121(num_classes=10),
}


def make(name: str = "mobilenet_v3_small"):
    torch.manual_seed(5)
    return MODELS[name]()


def images(seed: int, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


@unittest.skipIf(torch is None or torchvision is None, "no torch or torchvision (python3-torchvision)")
class TestVision(tierd.DaemonTestCase):
    config = CONFIG

    def engine(self, model, name: str, **kw):
        import tier.torch

        c = self.client(name)
        state = sum(p.numel() * p.element_size() for p in model.parameters()) * 4     # p, g, m, v
        blocks = tier.torch.layout.build(model, tier.torch.auto_blocks(model))
        largest = max(b.nbytes * 2 + b.nbytes32 * 2 for b in blocks)
        c.set_quota(host=max(2 * largest + 256 * 1024, state // 2))
        kw.setdefault("placement", "C")
        eng = tier.torch.Offload(model, c, lr=1e-3, **kw)
        self.addCleanup(lambda: eng.close() if not eng._closed else None)
        return eng

    def same(self, model, ref, what: str) -> None:
        sd, rsd = model.state_dict(), ref.state_dict()
        self.assertEqual(list(sd), list(rsd), what)
        for k, v in rsd.items():
            self.assertTrue(torch.equal(sd[k], v), f"{what}: {k} differs from plain PyTorch's")
            self.assertEqual(sd[k].dtype, v.dtype, f"{what}: {k}")

    def same_opt(self, got: dict, ref: dict, what: str) -> None:
        self.assertEqual(set(got["state"]), set(ref["state"]), what)
        for i, st in ref["state"].items():
            for k, v in st.items():
                self.assertTrue(torch.equal(torch.as_tensor(got["state"][i][k]), torch.as_tensor(v)),
                                f"{what}: optimizer state {i}.{k} differs")

    def train(self, model, opt, data) -> list[float]:
        losses = []
        torch.manual_seed(11)
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    # ---- the models, bit for bit, buffers included -----------------------------------------------

    def test_models(self) -> None:
        for name in MODELS:
            with self.subTest(model=name):
                ref, model = make(name), make(name)
                opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
                eng = self.engine(model, name)
                data = images(7)
                self.assertEqual(self.train(model, eng, data), self.train(ref, opt, data), name)
                self.same(model, ref, name)
                self.assertTrue(any(k.endswith("num_batches_tracked") for k in ref.state_dict()))
                self.same_opt(eng.state_dict(), opt.state_dict(), name)
                eng.close()
                self.same(model, ref, f"{name}, closed")

    def test_warmup_accumulation_clip(self) -> None:
        """LambdaLR warmup, two micro-batches a step, clip_grad_norm_: losses, norms, learning rates."""
        def run(engine: bool):
            model = make()
            opt = self.engine(model, "warmup", weight_decay=0.05, placement="B") if engine else \
                torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
            out: list[float] = []
            torch.manual_seed(11)
            for i, (x, y) in enumerate(images(7, 8)):
                loss = torch.nn.functional.cross_entropy(model(x), y) / 2
                loss.backward()
                out.append(loss.item())
                if i % 2:
                    out.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                    out.append(opt.param_groups[0]["lr"])
            return model, out, opt.state_dict()

        ref, ref_out, ref_opt = run(False)
        model, out, sd = run(True)
        self.assertEqual(out, ref_out)
        self.same(model, ref, "warmup")
        self.same_opt(sd, ref_opt, "warmup")

    # ---- BatchNorm and the model's state dict around training -----------------------------------

    def test_batchnorm_and_state_dicts(self) -> None:
        """BatchNorm frozen in eval mode from the second step, an evaluation after each step, the state dict
        kept each step, a load of the first step's state dict in the third, and at the end torch.save() of
        model.state_dict() loaded into a plain model: every value as plain PyTorch's."""
        def run(engine: bool):
            model = make()
            opt = self.engine(model, "bn") if engine else torch.optim.AdamW(model.parameters(), lr=1e-3)
            test = images(9, 1)[0][0]
            seen, kept = [], None
            torch.manual_seed(11)
            for i, (x, y) in enumerate(images(7, 4)):
                model.train()
                if i >= 1:
                    for m in model.modules():
                        if isinstance(m, torch.nn.BatchNorm2d):
                            m.eval()
                if i == 2:
                    model.load_state_dict(kept)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                seen.append(loss.detach())
                sd = model.state_dict()
                seen.extend(v.clone() for v in sd.values())
                if i == 0:
                    kept = {k: v.clone() for k, v in sd.items()}
                model.eval()
                with torch.no_grad():
                    seen.append(model(test))
            f = io.BytesIO()
            torch.save(model.state_dict(), f)
            f.seek(0)
            plain = make()
            plain.load_state_dict(torch.load(f))
            plain.eval()
            with torch.no_grad():
                seen.append(plain(test))
            return seen

        ref, got = run(False), run(True)
        self.assertEqual(len(got), len(ref))
        for i, (a, b) in enumerate(zip(got, ref)):
            self.assertTrue(torch.equal(a, b), f"value {i} differs from plain PyTorch's")

    # ---- mixed precision -------------------------------------------------------------------------

    def test_autocast_and_disabled_grad_scaler(self) -> None:
        """bfloat16 autocast around the forward and GradScaler(enabled=False)'s scale(), unscale_(), step(),
        update() with a clip between: plain PyTorch's bits."""
        def run(engine: bool):
            model = make("efficientnet_b0")
            opt = self.engine(model, "autocast") if engine else torch.optim.AdamW(model.parameters(), lr=1e-3)
            scaler = torch.cuda.amp.GradScaler(enabled=False)
            out = []
            torch.manual_seed(11)
            for x, y in images(7):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                out.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                out.append(loss.item())
            return model, out, opt.state_dict()

        ref, ref_out, ref_opt = run(False)
        model, out, sd = run(True)
        self.assertEqual(out, ref_out)
        self.same(model, ref, "autocast")
        self.same_opt(sd, ref_opt, "autocast")

    def test_conversion_refused_before_anything_changes(self) -> None:
        """model.half(), .to(torch.bfloat16), .double() after the engine: they converted the BatchNorm
        buffers and the parameters' empty placeholders, and only the next forward was refused, saying that
        only the placeholders had changed; no forward passed after it, and close() gave back float32
        parameters beside half-precision running statistics, rounded.  Now each is refused before it converts
        anything; conversions that change nothing (float(), to("cpu"), cpu()) pass, and training goes on as
        plain PyTorch's."""
        ref, model = make(), make()
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng = self.engine(model, "convert")
        data = images(7)
        for i, (x, y) in enumerate(data):
            for m, o in ((ref, opt), (model, eng)):
                torch.manual_seed(11 + i)           # (the classifier's dropout: the same masks)
                torch.nn.functional.cross_entropy(m(x), y).backward()
                o.step()
                o.zero_grad()
            if i == 0:
                before = {k: v.clone() for k, v in model.state_dict().items()}
                for what, convert in (("half", lambda: model.half()),
                                      ("to", lambda: model.to(torch.bfloat16)),
                                      ("double", lambda: model.double()),
                                      ("a block's", lambda: model.features[1].half()),
                                      ("type", lambda: model.type(torch.float64))):
                    with self.subTest(conversion=what), \
                            self.assertRaisesRegex(RuntimeError, r"would make parameter \S+ torch\.(float16|bfloat16|"
                                                                 r"float64) on cpu; it is torch\.float32.*Nothing of "
                                                                 r"the model changed"):
                        convert()
                    for k, v in model.state_dict().items():
                        self.assertEqual(v.dtype, before[k].dtype, f"{what}: {k} converted")
                        self.assertTrue(torch.equal(v, before[k]), f"{what}: {k} changed")
                self.assertIs(model.float(), model)
                model.to("cpu")
                model.cpu()
                ref.float()
        self.same(model, ref, "after the refusals")
        eng.close()
        self.assertNotIn("_apply", model.__dict__)
        model.half()                                        # torch's own again
        self.assertEqual(model.features[0][0].weight.dtype, torch.float16)

    def test_device_named_without_an_index(self) -> None:
        """On the GPU the engine's device is torch.device("cuda"), which no tensor's .device equals (they say
        cuda:0): the conversion check compared with it, so model.to("cuda"), .cuda(), .float() (HF Trainer's
        and accelerate's model.to(device)) were refused as a change of device, and so was every forward once
        a placeholder was checked.  Without a GPU here, the engine's device is named in the other spelling
        (torch.device("cpu", 0), which a CPU tensor's .device, cpu, does not equal): the comparisons must be
        with the device the engine's tensors report.  Found by review."""
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
        eng = self.engine(model, "device-index")
        eng.device = torch.device("cpu", 0)             # (as torch.device("cuda") against cuda:0)
        x = torch.randn(2, 8)
        for _ in range(2):
            model(x).sum().backward()
            eng.step()
            eng.zero_grad()
        self.assertIs(model.float(), model)
        self.assertIs(model.to("cpu", non_blocking=True), model)
        model.cpu()
        with self.assertRaisesRegex(RuntimeError, r"would make parameter 0\.weight torch\.float16 on cpu; it is "
                                                  r"torch\.float32 on cpu,"):
            model.half()
        model(x).sum().backward()
        eng.step()
        self.assertEqual(model.state_dict()["0.weight"].dtype, torch.float32)
        eng.close()

    @unittest.skipIf(torch is None or not torch.cuda.is_available(), "no GPU")
    def test_cuda_noop_conversions_pass(self) -> None:
        """The same on a GPU (vram backend cuda): model.to("cuda"), .cuda() and .float() pass."""
        c = self.client("device-cuda")
        if c.vram_backend != "cuda":
            self.skipTest("tierd's vram backend is not cuda")
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).cuda()
        eng = self.engine(model, "device-cuda-engine")
        x = torch.randn(2, 8, device="cuda")
        model(x).sum().backward()
        eng.step()
        model.to("cuda")
        model.cuda()
        model.float()
        model(x).sum().backward()
        eng.step()
        eng.close()

    def test_module_replaced_refused(self) -> None:
        """SyncBatchNorm.convert_sync_batchnorm(model) after the engine put a new module holding the same
        parameters in place of each BatchNorm; a new head put in place of the old one (model.classifier[3] =
        nn.Linear(...)) left the old parameters to the engine and the new ones untrained.  The first was
        refused at the next forward as a read of a placeholder "outside its block's forward", the second, after
        the first step, as a block that "ran in the first step but not in this one" (an expert's words).  Now
        each is refused where the module is replaced, before anything changes; a module holding none of the
        engine's parameters (an activation) is replaced as in torch, and after close() the conversion is
        torch's."""
        ref, model = make(), make()
        opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
        eng = self.engine(model, "swap")
        before = [(n, type(m)) for n, m in model.named_modules()]
        for i, (x, y) in enumerate(images(7)):
            for m, o in ((ref, opt), (model, eng)):
                torch.manual_seed(11 + i)           # (the classifier's dropout: the same masks)
                torch.nn.functional.cross_entropy(m(x), y).backward()
                o.step()
                o.zero_grad()
            if i == 0:
                with self.assertRaisesRegex(RuntimeError, r"putting a SyncBatchNorm in place of module 1 \(BatchNorm2d\) "
                                                          r"of Conv2dNormActivation, which holds parameter "
                                                          r"features\.0\.1\.weight.*nothing changed"):
                    torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
                with self.assertRaisesRegex(RuntimeError, r"putting a Linear in place of module 3 \(Linear\) of "
                                                          r"Sequential, which holds parameter classifier\.3\.weight"):
                    model.classifier[3] = torch.nn.Linear(1024, 10)
                with self.assertRaisesRegex(RuntimeError, r"removing module classifier \(Sequential\) of "
                                                          r"MobileNetV3, which holds parameter classifier\.0\.weight"):
                    del model.classifier
                self.assertEqual([(n, type(m)) for n, m in model.named_modules()], before)
                for m in (model, ref):
                    m.classifier[1] = torch.nn.Hardswish()       # (no parameters: torch's)
        self.same(model, ref, "after the refusals")
        eng.close()
        torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)      # torch's own again
        self.assertIsInstance(model.features[0][1], torch.nn.SyncBatchNorm)


if __name__ == "__main__":
    tierd.main()
