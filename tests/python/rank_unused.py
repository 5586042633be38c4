#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tests/python/rank_unused.py SOCKET JOB OUT: one rank (torchrun, gloo) of a model whose block holds two
experts, rank r routed to expert r only; writes this rank's final parameters to OUT.RANK (torch.save).
test_torch's TestProcesses.test_unused_parameter_on_one_rank compares them."""

import os
import sys

import torch

import tier
import tier.torch


class TwoExperts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e0 = torch.nn.Linear(4, 4)
        self.e1 = torch.nn.Linear(4, 4)

    def forward(self, x, which: int):
        return (self.e0 if which == 0 else self.e1)(x)


class Net(torch.nn.Module):
    """The experts as one block of a model."""

    def __init__(self) -> None:
        super().__init__()
        self.moe = TwoExperts()

    def forward(self, x, which: int):
        return self.moe(x, which)


def main() -> int:
    sock, job, out = sys.argv[1:4]
    rank = int(os.environ["RANK"])
    torch.distributed.init_process_group("gloo")
    torch.manual_seed(1)
    model = Net()
    eng = tier.torch.Offload(model, tier.Client(job, rank=rank, socket=sock), lr=1e-2, blocks=[model.moe])
    g = torch.Generator().manual_seed(10 + rank)
    for _ in range(3):
        model(torch.randn(2, 4, generator=g), rank).pow(2).mean().backward()
        eng.step()
        eng.zero_grad()
    torch.save(eng.parameters_state_dict(), f"{out}.{rank}")
    eng.close()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
