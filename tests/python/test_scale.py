#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tier.torch's work per parameter, counted: what runs at each step, or once per engine, over every parameter
must not compare each parameter with every other (at 40960 parameters a quadratic pass took seconds).

Timings would be flaky: the tests count the Python lines tier.torch runs (sys.settrace, its comprehensions
and generators included) over models of several sizes, the same blocks holding more parameters, and ask
that the count grow linearly (the same difference between sizes n, 2n and 3n), or not at all.  A membership
test over a list runs in C, unseen by sys.settrace: instrument() gives the blocks indexes and labels that count
the comparisons made with them, which must grow linearly too.
"""

from __future__ import annotations

import os
import sys
import unittest

import tierd

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None

TORCH_DIR = os.path.join(tierd.source_dir(), "client", "python", "tier", "torch")
BLOCKS = 4


def lines_run(names: tuple[str, ...], fn):
    """fn()'s result, and the Python lines it ran in tier/torch/NAME.py for NAME in ``names``."""
    files = {os.path.join(TORCH_DIR, n + ".py") for n in names}
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def scope(frame, event, arg):
        return local if frame.f_code.co_filename in files else None

    old = sys.gettrace()
    sys.settrace(scope)
    try:
        out = fn()
    finally:
        sys.settrace(old)
    return out, count


def train(model, eng, x, set_to_none: bool = True) -> None:
    model(x).sum().backward()
    eng.step()
    eng.zero_grad(set_to_none=set_to_none)


class Counted(int):
    """A block's index that counts the comparisons made with it (an ``in`` over a list compares each item)."""
    seen = [0]
    __hash__ = int.__hash__

    def __eq__(self, other):
        Counted.seen[0] += 1
        return int.__eq__(self, other)

    def __ne__(self, other):
        Counted.seen[0] += 1
        return int.__ne__(self, other)


class Label(str):
    """A block's label, counting its comparisons as Counted does."""
    __hash__ = str.__hash__

    def __eq__(self, other):
        Counted.seen[0] += 1
        return str.__eq__(self, other)

    def __ne__(self, other):
        Counted.seen[0] += 1
        return str.__ne__(self, other)


def instrument(eng) -> None:
    """Each block's index and label count the comparisons made with them (Counted.seen): a membership test
    over a list runs in C, which sys.settrace does not see."""
    from tier.torch.layout import Block

    class CountedBlock(Block):
        label = property(lambda self: self.counted_label)

    for b in eng.blocks:
        b.counted_label = Label(b.label)
        b.index = Counted(b.index)
        b.__class__ = CountedBlock


def compares(fn):
    """fn()'s result, and the comparisons made with instrument()ed blocks' indexes and labels in it."""
    Counted.seen[0] = 0
    out = fn()
    return out, Counted.seen[0]


if torch is not None:
    class Layer(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(2)) for _ in range(n)])

        def forward(self, x):
            return x + torch.stack(list(self.ps)).sum()

    class Many(torch.nn.Module):
        """``blocks`` blocks of n small parameters each."""

        def __init__(self, n: int, blocks: int = BLOCKS) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(n) for _ in range(blocks)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    class AuxLast(Many):
        """Many, whose last block's output the loss leaves out (an auxiliary head): its backward never runs."""

        def forward(self, x):
            for layer in self.layers[:-1]:
                x = layer(x)
            self.aux = self.layers[-1](x)
            return x


@unittest.skipIf(torch is None, "no torch (python3-torch)")
class TestScale(tierd.DaemonTestCase):
    def made(self, n: int, groups=None) -> tuple[int, list[int]]:
        """The lines engine.py and optim.py ran making an engine over Many(n) (``groups(model)``: its
        params=), and the group of each block's first parameter.  Closed after (the pool has room for
        few jobs)."""
        import tier
        import tier.torch

        torch.manual_seed(1)
        model = Many(n)
        params = groups(model) if groups is not None else None
        with tier.Client(f"{self.id().rsplit('.', 1)[-1][:40]}-{n}", 0, socket=self.socket) as c:
            eng, lines = lines_run(("engine", "optim"), lambda: tier.torch.Offload(
                model, c, params=params, lr=1e-3, blocks=list(model.layers)))
            try:
                return lines, [b.slots[0].group for b in eng.blocks]
            finally:
                eng.close()

    def assert_linear(self, counts: list[int], what: str, unit: str = "lines run") -> None:
        self.assertEqual(counts[2] - counts[1], counts[1] - counts[0],
                         f"{what}: {unit} at sizes n, 2n, 3n {counts}: not linear")

    def test_constructor_linear(self):
        """The engine's constructor gives each parameter its group, and finds those in no group, in one pass
        (every parameter was compared with every group member: 9 s at 40960 parameters)."""
        counts = [self.made(n)[0] for n in (32, 64, 96)]
        self.assert_linear(counts, "Offload()")

        def two(model):     # two groups, the last two blocks' parameters in none
            return [{"params": list(model.layers[0].parameters())},
                    {"params": list(model.layers[1].parameters()), "lr": 0.1}]
        made = [self.made(n, two) for n in (32, 64, 96)]
        self.assertEqual(made[0][1], [0, 1, -1, -1])
        self.assert_linear([m[0] for m in made], "Offload(params=groups)")

    def test_group_check_constant(self):
        """optim.check_members() runs at each forward with gradients, step() and fused backward: the groups
        unchanged, it runs no Python code per parameter (it built a dict of every group's parameters each
        time: 13-20 ms a step at 40960).  A change is refused all the same."""
        import tier.torch
        from tier.torch import optim

        counts = []
        for n in (32, 64):
            torch.manual_seed(1)
            model = Many(n)
            c = self.client(f"check-{n}")
            eng = tier.torch.Offload(model, c, lr=1e-3, blocks=list(model.layers))
            counts.append(lines_run(("optim",), lambda: optim.check_members(eng))[1])
            if n == 32:
                eng.close()
                c.close()
        self.addCleanup(eng.close)
        self.assertEqual(counts[0], counts[1], f"check_members() ran {counts} lines at {BLOCKS} x 32 and 64 "
                         "parameters: it grows with the parameters")
        moved = eng.param_groups[0]["params"].pop()
        with self.assertRaisesRegex(ValueError, r"left param_groups\[0\]"):
            optim.check_members(eng)
        eng.param_groups[0]["params"].insert(0, moved)      # the same members, reordered: passes
        optim.check_members(eng)

    def test_forward_check_constant(self):
        """A forward with gradients checks that the parameters that train are the engine's (none unfrozen, none
        added after it): over a model unchanged since the engine, it runs no Python code per parameter (it
        walked named_parameters() at every forward: 38 ms at 40960 parameters).  A parameter that trains and
        is none of the engine's is refused all the same once the model changed: a frozen module added and
        unfrozen, or a trainable one appended to a ModuleList after a removal (torch's
        ModuleList.__delitem__ gives it a plain _modules, which refuses nothing)."""
        import tier.torch

        counts = []
        for n in (32, 64):
            torch.manual_seed(1)
            model = Many(n)
            model.drops = torch.nn.ModuleList([torch.nn.Dropout(0.0), torch.nn.Dropout(0.0)])
            c = self.client(f"fwd-check-{n}")
            eng = tier.torch.Offload(model, c, lr=1e-3, blocks=list(model.layers))
            self.addCleanup(eng.close)
            x = torch.randn(3, 2)
            train(model, eng, x)
            out, lines = lines_run(("hooks",), lambda: model(x))
            counts.append(lines)
            out.sum().backward()
            eng.step()
            eng.zero_grad()
        self.assertEqual(counts[0], counts[1], f"a forward ran {counts} lines of hooks.py at {BLOCKS} x 32 and 64 "
                         "parameters: it grows with the parameters")
        del model.drops[0]
        model.drops.append(torch.nn.Linear(2, 2))           # (unchecked: the list's _modules is torch's now)
        with self.assertRaisesRegex(RuntimeError, r"drops\.1\.weight requires grad.*none of the tier\.torch"):
            model(x)
        del model.drops[1]
        frozen = torch.nn.Linear(2, 2).requires_grad_(False)
        model.layers[0].extra = frozen
        train(model, eng, x)                                # frozen: torch's
        frozen.weight.requires_grad_(True)
        with self.assertRaisesRegex(RuntimeError, r"layers\.0\.extra\.weight requires grad.*none of the tier\.torch"):
            model(x)

    def test_model_state_dict_linear(self):
        """model.state_dict() notes each tensor it gives (a write into one is refused later): every 64th note
        went over all those noted before, quadratic in the parameters.  A write is refused all the same."""
        import tier
        import tier.torch
        from tier.torch import guards

        counts = []
        for n in (32, 64, 96):
            torch.manual_seed(1)
            model = Many(n)
            with tier.Client(f"sd-{n}", 0, socket=self.socket) as c:
                eng = tier.torch.Offload(model, c, lr=1e-3, blocks=list(model.layers))
                try:
                    sd, lines = lines_run(("guards", "state"), model.state_dict)
                    counts.append(lines)
                    self.assertEqual(len(eng._given), BLOCKS * n)
                    sd["layers.1.ps.3"].add_(1.0)
                    with self.assertRaisesRegex(RuntimeError, r"layers\.1\.ps\.3 of a model\.state_dict\(\) was "
                                                r"written in place"):
                        guards.check_given(eng, "forward")
                    guards.check_given(eng, "forward")          # (said once)
                finally:
                    eng.close()
        self.assert_linear(counts, "model.state_dict()")

    def test_blocks_linear(self):
        """layout.build() refuses blocks= nesting one block in another: it compared each block with every
        other's submodules, quadratic in the blocks.  A nested block is refused all the same."""
        import tier
        import tier.torch

        counts = []
        for nb in (16, 16, 32, 48):        # (the first fills layout.esize()'s cache)
            torch.manual_seed(1)
            model = Many(2, nb)
            with tier.Client(f"blocks-{nb}", 0, socket=self.socket) as c:
                eng, lines = lines_run(("layout",), lambda: tier.torch.Offload(
                    model, c, lr=1e-3, blocks=list(model.layers)))
                eng.close()
                counts.append(lines)
                with self.assertRaisesRegex(ValueError, r"block 'layers\.1\.ps' lies inside block 'layers\.1': "
                                            "blocks must not nest"):
                    tier.torch.Offload(model, c, lr=1e-3, blocks=[*model.layers, model.layers[1].ps])
        self.assert_linear(counts[1:], "Offload(blocks=...)")

    def stepping(self, nb: int, model_cls=None, **kw):
        """A model of ``nb`` blocks of 2 parameters, its engine (instrument()ed, closed at clean-up) and an
        input."""
        import tier.torch

        torch.manual_seed(1)
        model = (model_cls or Many)(2, nb)
        c = self.client(f"{self.id().rsplit('.', 1)[-1][:30]}-{nb}")
        eng = tier.torch.Offload(model, c, lr=1e-3, blocks=list(model.layers), **kw)
        self.addCleanup(eng.close)
        instrument(eng)
        return model, eng, torch.randn(3, 2)

    def test_deferred_step_linear(self):
        """Deferred, step() runs the optimizer phases in the order the forwards ran (tracer.order()): it looked
        each block up in a list of the blocks before it, quadratic in the blocks at every step."""
        counts = []
        for nb in (16, 32, 48):
            model, eng, x = self.stepping(nb, optimizer_in_backward=False)
            for _ in range(2):
                train(model, eng, x)
            model(x).sum().backward()
            counts.append(compares(eng.step)[1])
            self.assertEqual(eng.mode, "deferred")
            eng.close()
        self.assert_linear(counts, "a deferred step()", "comparisons of blocks")

    def test_fused_zeroed_step_linear(self):
        """Fused, after zero_grad(set_to_none=False), step() updates the blocks the backward did not reach
        (torch.optim updates their zeroed .grad): it looked each block up in the list of the blocks updated,
        quadratic in the blocks at every step."""
        counts = []
        for nb in (16, 32, 48):
            model, eng, x = self.stepping(nb)
            for _ in range(2):
                train(model, eng, x, set_to_none=False)
            model(x).sum().backward()
            counts.append(compares(eng.step)[1])
            self.assertEqual(eng.mode, "fused")
            eng.close()
        self.assert_linear(counts, "a fused step() after zero_grad(set_to_none=False)",
                           "comparisons of blocks")

    def test_planned_step_linear(self):
        """A planned step's forward, backward and step(): each phase entered went over every block (to
        clear the mappings of the phase before), quadratic in the blocks."""
        counts = []
        for nb in (16, 32, 48):
            model, eng, x = self.stepping(nb)
            for _ in range(2):
                train(model, eng, x)
            counts.append(lines_run(("engine",), lambda: train(model, eng, x))[1])
            eng.close()
        self.assert_linear(counts, "lines engine.py ran in a planned step")

    def test_first_step_linear(self):
        """The first step records its phases (each checked against those before), gives a block whose
        backward did not run its backward phase (add_backwards()) and fuses the optimizer phases into the
        backward (fuse()): each looked through the phases for every block, quadratic in the blocks.  The
        phases are the same."""
        lines, counts = [], []
        for nb in (16, 32, 48):
            model, eng, x = self.stepping(nb, AuxLast)
            (_, n), k = compares(lambda: lines_run(("tracer",), lambda: train(model, eng, x)))
            lines.append(n)
            counts.append(k)
            self.assertEqual(eng.mode, "fused")
            self.assertEqual(eng.phases, [("f", i, 0, 0) for i in range(nb)] +
                             [k for i in reversed(range(nb)) for k in (("b", i, 0, 0), ("o", i, 0, 0))])
            eng.close()
        self.assert_linear(lines, "lines tracer.py ran in the first step")
        self.assert_linear(counts, "the first step", "comparisons of blocks")


if __name__ == "__main__":
    tierd.main()
