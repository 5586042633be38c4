# SPDX-License-Identifier: MIT
"""tier.torch.tracer: the first step's order of phases, submitted to tierd as the job's plan.

One training step is a cycle of phases, each named ``(kind, block, part,
micro-batch)``: the forward (``"f"``) of each block in the order the model
calls them, then, as autograd reaches each block, its backward (``"b"``);
so for each micro-batch of an accumulated step; and the optimizer phases
(``"o"``; a large block's in parts, one phase each), either each right after
its block's backward (fused) or all after the last backward (deferred), the
shared block's last.
The first step is traced: hooks record the order while each phase pins
what it needs with plain pins.  The engine then submits the cycle as the
job's iteration plan (every phase's tensors, tiers and modes) and from the
second step on enters each phase with ``tier_phase_enter()``: tierd knows what
comes next and moves it while the current phase computes.

Every later step must run the same phases: a block that runs in a later
step but did not in the first, or the other way round (the experts of a
mixture-of-experts layer, which run for some inputs only), is refused with
its name, before the step changes any state.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

Key = tuple[str, int, int, int]   # (kind f/b/o, block index, optimizer part, micro-batch)
PHASE_NAMES = {"f": "forward", "b": "backward", "o": "optimizer"}


class Tracer:
    def __init__(self) -> None:
        self.seq: list[Key] = []            # the step's phases, as traced
        self.index: dict[Key, int] = {}
        self.planned = False
        self.forwards: set[int] = set()     # blocks whose forward the current step entered
        # trace mode: the phases of seq as a set, for check_new() (a list search per phase was quadratic);
        # good while seq is that list, grown by record() alone: rebuilt where it was replaced, or cut (the
        # set then holds more than seq until the phases cut are recorded again)
        self._keys: set[Key] = set()
        self._keys_of: list[Key] | None = None

    def check_new(self, key: Key, label: str, hint: str) -> None:
        """Trace mode: phase ``key`` is about to begin (``label``: its block in the model's words); a
        phase that began already in this step is refused."""
        if self._keys_of is not self.seq or len(self._keys) != len(self.seq):
            self._keys, self._keys_of = set(self.seq), self.seq
        if key in self._keys:
            raise RuntimeError(f"{label} ran its {PHASE_NAMES[key[0]]} twice in one step: {hint}")

    def record(self, key: Key) -> None:
        """Trace mode: phase ``key`` began (its pins are granted: a retry after tierd restarted while
        they were asked for is the same phase, not a second one)."""
        self.seq.append(key)
        if self._keys_of is self.seq:
            self._keys.add(key)

    def lookup(self, key: Key, label: str) -> int:
        """Planned mode: the plan's index of phase ``key``."""
        k = self.index.get(key)
        if k is not None:
            return k
        most = max((x[3] for x in self.index), default=0)     # (only to say why: a walk of the whole plan)
        if key[3] > most:
            raise RuntimeError(
                f"micro-batch {key[3] + 1} of this step, where the first step (which tier.torch traced and planned "
                f"for every step) had {most + 1}: every step must run as many forwards with gradients as the "
                "first; run an evaluation forward under torch.no_grad(), a loss over several forwards (Siamese, "
                "contrastive) as one forward on the inputs concatenated (torch.cat), and accumulate the same "
                "number of micro-batches every step")
        raise RuntimeError(
            f"{label} ran its {PHASE_NAMES[key[0]]} in this step but not in the first one, which tier.torch "
            "traced and planned for every step: a block that runs for some inputs or steps only (an expert "
            "of a mixture-of-experts layer; a layer skipped at random, LayerDrop or stochastic depth by not "
            "calling it) is not supported as a block of its own; make the layer that routes to it one block "
            "(no_split_module_classes=[its class] or blocks=[...]), drop a layer by scaling its output "
            "(x + f(x) * keep, keep 0 or 1, as torchvision's StochasticDepth does: its parameters then get "
            "zero gradients, not none) rather than by not calling it, or let the model call its blocks in "
            "the same order every step")

    def check_again(self, block: int, label: str) -> None:
        """Planned mode: a block whose forward ran already in this forward is refused (the first step ran it
        once, and that was planned for every step: a second run entered the same phases again, and fused,
        its parameters were updated twice)."""
        if block in self.forwards:
            raise RuntimeError(f"{label} ran its forward twice in one step, once in the first: a block that runs "
                               "more than once per micro-batch (weights shared across time) is not supported; make "
                               "the repeated part one block's inside.  Nothing was changed by this step")

    def forward_ended(self, labels: Callable[[int], str]) -> None:
        """Planned mode, end of a forward with gradients: every traced forward ran (else refuse)."""
        missing = sorted({i for kind, i, _, _ in self.seq if kind == "f"} - self.forwards)
        self.forwards.clear()
        if missing:
            names = ", ".join(labels(i) for i in missing[:4]) + (" ..." if len(missing) > 4 else "")
            raise RuntimeError(
                f"{names} ran in the first step but not in this one: tier.torch plans the first step's blocks "
                "for every step, and a block that runs for some inputs or steps only (an expert of a "
                "mixture-of-experts layer; a layer skipped at random, LayerDrop or stochastic depth by not "
                "calling it) is not supported as a block of its own; make the layer that routes to it one block "
                "(no_split_module_classes=[its class] or blocks=[...]), or drop a layer by scaling its output "
                "(x + f(x) * keep, keep 0 or 1, as torchvision's StochasticDepth does: its parameters then get "
                "zero gradients, not none) rather than by not calling it.  Nothing was changed by this step")

    def add_backwards(self, trainable: set[int]) -> None:
        """A block with trainable parameters whose forward ran with gradients in the first step but whose
        backward did not (a loss that left its output out, an auxiliary head used later) gets its backward
        phase all the same, where autograd would run it: before the backward of the first block whose
        forward came before its own.  A later step that backpropagates through it then follows the plan;
        it was refused there, fused after the blocks before had been updated.  (A step without it skips
        the phase.)  A pass over the phases per backward added, none per block."""
        have = set(self.seq)
        for m in sorted({k[3] for k in self.seq if k[0] == "f"}):
            fwd = [k[1] for k in self.seq if k[0] == "f" and k[3] == m]
            first: dict[int, int] = {}          # block: its forward's position in the micro-batch
            for pos, i in enumerate(fwd):
                first.setdefault(i, pos)
            for pos, i in enumerate(fwd):
                key = ("b", i, 0, m)
                if i not in trainable or key in have:
                    continue
                have.add(key)
                at = next((j for j, k in enumerate(self.seq) if k[0] == "b" and k[3] == m and
                           first.get(k[1], pos) < pos), None)
                if at is None:          # after the micro-batch's last backward, or its last forward
                    at = max((j + 1 for j, k in enumerate(self.seq) if k[3] == m and k[0] in "fb"), default=0)
                self.seq.insert(at, key)
        self._keys_of = None        # (check_new()'s set: rebuilt if needed)

    def order(self, blocks: Sequence[Any]) -> list[Any]:
        """``blocks`` with parameters in the order their forwards ran, then the others (the optimizer
        phases' order when deferred); not the shared block."""
        seen = dict.fromkeys(i for kind, i, _, _ in self.seq if kind == "f")     # (in order, looked up by hash)
        rest = [b.index for b in blocks if b.index not in seen and not b.is_shared]
        return [blocks[i] for i in [*seen, *rest] if blocks[i].slots and not blocks[i].is_shared]

    def fuse(self) -> None:
        """Reorder the traced phases for optimizer phases inside the backward: each block's right
        after its backward phase, the shared block's (which has none) at the end.  The first step
        ran them deferred, in step(); one micro-batch and no clipping make the two orders alike."""
        opt: dict[int, list[Key]] = {}      # block: its optimizer phases
        for k in self.seq:
            if k[0] == "o":
                opt.setdefault(k[1], []).append(k)
        out: list[Key] = []
        placed: set[Key] = set()
        for key in self.seq:
            if key[0] == "o":
                continue
            out.append(key)
            if key[0] == "b":
                out.extend(opt.get(key[1], ()))
                placed.update(opt.get(key[1], ()))
        out.extend(k for k in self.seq if k[0] == "o" and k not in placed)
        self.seq = out

    def submit(self, client: Any, needs: Callable[[Key], Sequence[tuple[Any, int, int]]]) -> None:
        """Send the traced cycle as the job's plan: phase k needs ``needs(seq[k])`` ((tensor, tier, mode))."""
        with client.plan() as plan:
            for k, key in enumerate(self.seq):
                for t, tier, mode in needs(key):
                    plan.add(k, t, tier, mode)
            plan.submit()
        self.index = {key: k for k, key in enumerate(self.seq)}
        self.planned = True
