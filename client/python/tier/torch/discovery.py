# SPDX-License-Identifier: MIT
"""tier.torch.discovery: which submodules of a model become blocks, and what they cost.

:func:`auto_blocks` walks the model from the top.  A child becomes a block
when its class is one that must not be split (the model's
``_no_split_modules``, as Hugging Face transformers models declare them
for accelerate's device maps, and ``no_split_module_classes=``), or when it
holds no repeated structure below it (an embedding, a norm, a head, a
convolution).  Containers are walked into: ``ModuleList``, ``ModuleDict``
and ``Sequential`` reached on the way down, and any module that has a
``ModuleList`` of several layers (or a no-split module) somewhere below it,
such as Hugging Face's ``GPT2Model`` inside ``GPT2LMHeadModel``; a
``Sequential`` deeper down is taken as part of its module (an MLP).
A container with parameters of its own (registered
on itself, not on a child) is not walked into: it is one block.  A module
registered under several parents (T5's shared embedding: ``shared``,
``encoder.embed_tokens``, ``decoder.embed_tokens``) is called by each of
them, and a block runs once per micro-batch: it is no block of its own,
and each module that calls it is kept whole (T5 gives ``encoder, decoder,
lm_head``, the embedding's weight in the shared block); one that only
holds it above a caller (``shared`` on the model, or on a T5EncoderModel
inside the user's model) is no caller.  So
GPT-2 gives ``wte, wpe, h.0 .. h.N, ln_f, lm_head``; resnet18 gives
``conv1, bn1, layer1.0 .. layer4.1, fc``.

A block that holds most of the model's state bounds what any budget can
do (a phase pins it whole): :func:`dominant_blocks` finds those, and the
engine warns about them with the way to split them.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from .layout import Block, fmt_bytes

#: a block above this share of the model's parameter bytes is worth a warning
DOMINANT_SHARE = 0.5


def _has_params(m: torch.nn.Module) -> bool:
    return any(True for _ in m.parameters())


def _own_params(m: torch.nn.Module) -> bool:
    return any(True for _ in m.parameters(recurse=False))


def auto_blocks(model: torch.nn.Module, no_split_module_classes: Iterable[str] | None = None) -> list[torch.nn.Module]:
    """The blocks tier.torch makes of ``model`` by default: see the module's description.

    ``no_split_module_classes``: class names (``"GPT2Block"``) whose instances are kept whole, on
    top of the model's own ``_no_split_modules``.  Every parameter ends up in exactly one block
    (a parameter two blocks use is the shared block's, see :mod:`tier.torch.layout`)."""
    no_split = set(no_split_module_classes or ())
    no_split |= set(getattr(model, "_no_split_modules", None) or ())
    out: list[torch.nn.Module] = []

    def splittable(m: torch.nn.Module) -> bool:
        """Is there a list of layers (a ModuleList of several, or a no-split module) below m?  A
        Sequential below a module is taken as part of it (an MLP), not as its layers."""
        for sub in m.modules():
            if sub is m:
                continue
            if type(sub).__name__ in no_split and _has_params(sub):
                return True
            if isinstance(sub, (torch.nn.ModuleList, torch.nn.ModuleDict)) and \
                    sum(1 for c in sub.children() if _has_params(c)) > 1:
                return True
        return False

    callers = _called_by_several(model)
    called_twice = set(callers)
    calling = {id(p) for ps in callers.values() for p in ps}
    seen: set[int] = set()
    skipped: list[torch.nn.Module] = []

    def walk(m: torch.nn.Module) -> None:
        for child in m.children():
            if not _has_params(child) or id(child) in seen:
                continue        # (one module under several names: once)
            seen.add(id(child))
            if id(child) in called_twice:
                skipped.append(child)       # kept whole inside each module that calls it
            elif type(child).__name__ in no_split:
                out.append(child)
            elif isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
                walk(child)
            elif not _own_params(child) and splittable(child) and id(child) not in calling:
                walk(child)         # (one holding modules that call it: they stay whole, found inside)
            else:
                out.append(child)

    if type(model).__name__ in no_split or _own_params(model) or not any(True for _ in model.children()):
        return [model]
    walk(model)
    # one no block holds (registered under several parents, all of them walked into: weights shared
    # across time in a layer list) is a block: the engine refuses it by name if it runs twice
    covered = {id(p) for b in out for p in b.parameters()}
    out += [m for m in skipped if any(id(p) not in covered for p in m.parameters())]
    return out


def _called_by_several(model: torch.nn.Module) -> dict[int, list[torch.nn.Module]]:
    """The modules with parameters registered under two or more parents other than the model itself
    (T5's embedding in its encoder and its decoder): each parent calls it, so it runs several times
    in a forward.  One registered on the model too (``shared``) is counted by its other parents; so
    is one registered on any parent that holds another of its parents (``T5EncoderModel.shared`` and
    its ``encoder.embed_tokens``, the T5EncoderModel inside a model of the user's: called once, by
    the encoder), which only holds it as the model does.  Each such module's id: its callers."""
    parents: dict[int, dict[int, torch.nn.Module]] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        if m is model:
            continue
        for c in m._modules.values():
            if c is not None:
                parents.setdefault(id(c), {})[id(m)] = m
    out: dict[int, list[torch.nn.Module]] = {}
    for m in model.modules():
        ps = parents.get(id(m), {})
        if len(ps) < 2 or not _has_params(m):
            continue
        callers = [p for p in ps.values()
                   if not any(q is not p and any(q is x for x in p.modules()) for q in ps.values())]
        if len(callers) > 1:
            out[id(m)] = callers
    return out


def dominant_blocks(blocks: Sequence[Block]) -> list[tuple[Block, float]]:
    """Blocks holding more than DOMINANT_SHARE of the model's parameter bytes, with their share."""
    total = sum(b.nbytes for b in blocks)
    if total == 0 or len(blocks) == 0:
        return []
    return [(b, b.nbytes / total) for b in blocks if b.nbytes / total > DOMINANT_SHARE and b.slots]


def split_hint(b: Block, model: torch.nn.Module | None = None) -> str:
    """How to split block ``b`` (its children with parameters), for messages; ``model``: the model it
    is a block of (to see the modules that other blocks call too)."""
    if b.module is None:
        return ("the shared block holds parameters several blocks use (tied weights): it cannot be split; "
                "untie them (e.g. tie_word_embeddings=False) if it is too large")
    kids = [n for n, c in b.module.named_children() if _has_params(c)]
    prefix = b.path + "." if b.path else ""
    own = [n for n, _ in b.module.named_parameters(recurse=False)]
    if kids and own:
        # blocks of its children would leave these in no block (refused): the whole module must hold them
        shown = ", ".join(prefix + n for n in own[:4]) + (", ..." if len(own) > 4 else "")
        return (f"it cannot be split: {b.cls} has parameters of its own ({shown}), which only a block of the "
                f"whole module can hold; move them into a submodule of their own to split it, or give the "
                f"job a larger budget")
    many = _called_by_several(model) if model is not None else {}
    inner = [n for n, m in b.module.named_modules() if id(m) in many]
    if kids and inner:
        return (f"it cannot be split: it calls {', '.join(prefix + n for n in inner[:3])}, which other blocks "
                f"call too (one module under several names), and a block runs once per micro-batch, so "
                f"{b.cls} stays whole; give the job a larger budget")
    if kids:
        shown = ", ".join(prefix + k for k in kids[:4]) + (", ..." if len(kids) > 4 else "")
        return (f"split it: blocks=[...] naming its parts ({shown}), or let auto_blocks() walk into it by "
                f"leaving {b.cls} out of no_split_module_classes")
    return f"it is a single {b.cls} module: it cannot be split further; give the job a larger budget"


def vram_need(b: Block) -> int:
    """VRAM bytes b's backward phase pins (its forward pins p and the shared p alone): p, every part's
    g, and the shared parameters it uses."""
    return b.nbytes + (b.kind_bytes("g") if b.slots else 0) + sum(s.numel * s.param.element_size() for s in b.shared)


def describe(blocks: Sequence[Block], *, state_kinds: Sequence[str], placement: str,
             limits: dict[str, int] | None = None, model: torch.nn.Module | None = None) -> str:
    """A table of the blocks: bytes per kind of state, and what the budgets mean for them."""
    kinds = ["p", "g", *state_kinds] + (["w"] if any(b.mixed for b in blocks) else [])
    total_params = sum(b.numel for b in blocks)
    rows = [["#", "block", "class", "params", *kinds, "share"]]
    total = sum(b.nbytes for b in blocks) or 1
    for b in blocks:
        vals = [fmt_bytes(b.kind_bytes(k)) if (k != "w" or b.mixed) and b.slots else "-" for k in kinds]
        params = f"{b.numel:,}" + (f" (+{sum(s.numel for s in b.shared):,} shared)" if b.shared else "")
        cls = b.cls + (f" ({len(b.parts)} optimizer parts)" if len(b.parts) > 1 else "")
        rows.append([str(b.index), "(shared)" if b.is_shared else b.path or "(the model)", cls,
                     params, *vals, f"{100 * b.nbytes / total:.0f} %"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i in (0, 3) or i >= 4 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    state = sum(b.kind_bytes(k) for b in blocks for k in kinds if (k != "w" or b.mixed) and b.slots)
    lines.append(f"{len(blocks)} blocks, {total_params:,} parameters, {fmt_bytes(state)} of state "
                 f"({', '.join(kinds)}); placement {placement}")
    if limits:
        # the backward phase pins the most: the block's p and its g (all parts), and the shared p it uses
        vram = max((vram_need(b) for b in blocks if not b.is_shared), default=0)
        host = max(b.opt_host_bytes(len(state_kinds)) for b in blocks)
        for tier, need, what in (("vram", vram, "backward phase (its block's p and g, and the shared parameters "
                                                "it uses)"),
                                 ("host", host, "optimizer phase (its block's p, and g and the step rule's state of a part)")):
            lim = limits.get(tier, 0)
            if lim:
                verdict = "fits" if 2 * need <= lim else "does not fit twice (tierd pins the next phase ahead)" \
                    if need <= lim else "DOES NOT FIT"
                lines.append(f"{tier} limit {fmt_bytes(lim)}: the largest {what} needs {fmt_bytes(need)}: {verdict}")
    for b, share in dominant_blocks(blocks):
        lines.append(f"{b.label} holds {100 * share:.0f} % of the parameters: {split_hint(b, model)}")
    return "\n".join(lines)
