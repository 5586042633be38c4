# SPDX-License-Identifier: MIT
"""tier.torch.collective: gradients averaged over the ranks, a bucket at a time.

With several ranks (``torch.distributed`` initialised), each block's
gradients are all-reduced (averaged) before its optimizer phase: the
arithmetic of DistributedDataParallel, which itself cannot be used because
it assumes parameters that stay in place.  The gradients of a block are
flattened into one buffer per dtype (at most ``BUCKET_BYTES`` each) and
reduced with one call per buffer, not one per parameter; the sums are
element by element, so the bits are those of one call per parameter.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

#: the most bytes one all-reduce carries (DDP's default bucket is 25 MiB)
BUCKET_BYTES = 25 << 20


def _buckets(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    by_dtype: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    for t in tensors:
        lists = by_dtype.setdefault((t.dtype, t.device), [[]])
        cur = lists[-1]
        if cur and sum(x.numel() * x.element_size() for x in cur) + t.numel() * t.element_size() > BUCKET_BYTES:
            cur = []
            lists.append(cur)
        cur.append(t)
    return [b for lists in by_dtype.values() for b in lists if b]


def fill_unused(params: Sequence[torch.nn.Parameter], world: int, group: Any = None) -> None:
    """With several ranks: a parameter of ``params`` (mapped, the block's own) that some rank got a
    gradient for and this one did not gets a zero gradient, so that every rank reduces the same list.
    (Without it the ranks' lists differed: one rank's gradient of one parameter was summed with another's
    of another, and the ranks' parameters drifted apart, silently.)"""
    if world <= 1 or not params:
        return
    used = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    torch.distributed.all_reduce(used, group=group)
    for p, u in zip(params, used.tolist()):
        if u and p.grad is None:
            p.grad = torch.zeros_like(p)


def allreduce_mean(tensors: Sequence[torch.Tensor], world: int, group: Any = None) -> int:
    """Average ``tensors`` (in place) over the ``world`` ranks of ``group``; returns the calls made."""
    if world <= 1 or not tensors:
        return 0
    calls = 0
    for bucket in _buckets(tensors):
        if len(bucket) == 1:
            flat = bucket[0]
            torch.distributed.all_reduce(flat, group=group)
            flat.div_(world)
        else:
            flat = torch.cat([t.reshape(-1) for t in bucket])
            torch.distributed.all_reduce(flat, group=group)
            flat.div_(world)
            off = 0
            for t in bucket:
                n = t.numel()
                t.copy_(flat[off:off + n].view_as(t))
                off += n
        calls += 1
    return calls
