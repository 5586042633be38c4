#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench/torch_plan.py: the iteration plan tier.torch derives for the example language model, as a file.

bench-timeline --plan FILE runs it against tierd like its synthetic plan
(bench/run timeline --matrix does, for the matrix's "torch" row).  The plan
is tier.torch's own: an Offload engine (tier/torch.py, unchanged) on
ByteLM of client/python/examples/train_lm.py traces one training step
(forward, backward, engine.step()) and submits its plan; the client it talks
to here is a stand-in that keeps tensors in process memory and records the
plan instead of sending it to tierd, so no tierd is needed.  Tensor names
and sizes are the engine's (p, g, m, v per block; a with
--offload-activations), phases in traced order with kind f, b or o.

    /usr/bin/python3 bench/torch_plan.py --dim 256 --layers 8 > plan.json

Prints the plan as JSON on stdout (the format tl_plan_load() in
bench/timeline-plan.c reads) and a summary on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python", "examples"))


class FakeGrant:
    def __init__(self, buf):
        self._buf = buf

    def torch(self):
        return self._buf

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class FakeTensor:
    def __init__(self, client, name, size):
        import torch

        self.client = client
        self.name = name
        self.size = size
        self.buf = torch.zeros(size, dtype=torch.uint8)

    def pin(self, tier, mode=None):
        return FakeGrant(self.buf)

    def unpin(self, tier, dirty=False):
        pass

    def destroy(self):
        pass

    def evict_async(self, tier):
        # placements B and C write state down when the next phase is entered: recorded, done at once
        self.client.write_downs.append((self.client.phase_now(), self))
        return FakeFence()


class FakeFence:
    def wait(self):
        pass

    def done(self):
        return True


class FakePlan:
    def __init__(self, client):
        self.client = client
        self.phases: dict[int, list] = {}

    def add(self, phase, tensor, tier, mode):
        self.phases.setdefault(phase, []).append((tensor, int(tier), int(mode)))

    def submit(self):
        self.client.submitted = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class FakeClient:
    """What tier.torch.Offload calls on a tier.Client during its first (traced) step."""
    vram_backend = "emulated"
    rank = 0
    job = "torch-plan"

    def __init__(self):
        self.tensors: list[FakeTensor] = []
        self.submitted: FakePlan | None = None
        self.write_downs: list[tuple[int, FakeTensor]] = []
        self.phase_now = lambda: 0

    def create(self, name, size):
        t = FakeTensor(self, name, size)
        self.tensors.append(t)
        return t

    def open(self, name):
        # a fresh job: nothing an earlier run left (tier.torch looks for its resume record)
        import errno

        from tier import NotFoundError

        raise NotFoundError(errno.ENOENT, f"no tensor {name!r}", f"open {name!r}")

    def plan(self):
        return FakePlan(self)

    def end_plan(self):
        pass

    # the second (planned) step: the phase the engine is in is the one it entered last
    def phase(self, k):
        self.current = k

    def phase_grant(self, tensor, tier):
        return FakeGrant(tensor.buf)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--offload-activations", action="store_true")
    p.add_argument("--placement", choices=("A", "B", "C"), default="A",
                   help="tier.torch's placement: B and C add the write-downs to NVMe it issues after "
                        "optimizer phases (\"write_down\" of the phase entered then); the accesses are the same")
    a = p.parse_args()

    import torch
    import tier
    import tier.torch as tt
    import train_lm

    torch.manual_seed(1)
    model = train_lm.ByteLM(a.dim, a.layers, a.heads, a.context)
    client = FakeClient()
    engine = tt.Offload(model, client, placement=a.placement, offload_activations=a.offload_activations)
    # the phase just entered (_enter() appends it first); at the step's end (no phase) the next step's first
    # the first step is traced (its optimizer phases after the backward); the second runs the plan,
    # with the write-downs where every later step has them: recorded at the phase entered then
    x = torch.randint(0, 256, (a.batch, a.context))
    y = torch.randint(0, 256, (a.batch, a.context))
    for step in range(2):
        if step == 1:
            client.write_downs.clear()
            client.phase_now = lambda: client.current
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        engine.step()
        engine.zero_grad()
    plan = client.submitted
    if plan is None:
        print("torch_plan.py: tier.torch submitted no plan after the first step", file=sys.stderr)
        return 1
    used = {id(t) for acc in plan.phases.values() for t, _, _ in acc}
    tensors = [t for t in client.tensors if id(t) in used]
    index = {id(t): i for i, t in enumerate(tensors)}
    tiers = {int(tier.VRAM): "vram", int(tier.HOST): "host"}
    modes = {int(tier.READ): "r", int(tier.WRITE): "w", int(tier.READ_WRITE): "rw"}
    kinds = {k: key[0] for k, key in enumerate(engine.phases)}
    n_phases = len(plan.phases)
    # a write-down at the step's end (no phase entered: len(_seq) phases) comes before the next step's phase 0
    down: dict[int, list[int]] = {}
    for ph, t in client.write_downs:
        lst = down.setdefault(ph % n_phases, [])
        if id(t) in index and index[id(t)] not in lst:
            lst.append(index[id(t)])
    phases = []
    for k in sorted(plan.phases):
        ph = {"kind": kinds[k], "access": [[index[id(t)], tiers[tr], modes[m]] for t, tr, m in plan.phases[k]]}
        if down.get(k):
            ph["write_down"] = down[k]
        phases.append(ph)
    out = {
        "name": f"torch-lm-d{a.dim}-l{a.layers}" + ("" if a.placement == "A" else f"-{a.placement}"),
        "tensors": [{"name": t.name, "size": t.size} for t in tensors],
        "phases": phases,
    }
    engine.close(restore=False)
    json.dump(out, sys.stdout)
    print()
    sizes = [t.size for t in tensors]
    print(f"torch_plan.py: {out['name']}: {len(tensors)} tensors, {sum(sizes)} bytes (largest {max(sizes)}), "
          f"{len(out['phases'])} phases: {' '.join(ph['kind'] + str(i) for i, ph in enumerate(out['phases']))}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
