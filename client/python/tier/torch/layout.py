# SPDX-License-Identifier: MIT
"""tier.torch.layout: how a block's trainable state is packed into tierd tensors.

A block's parameters are laid out in flat tierd tensors, one per *kind*,
each parameter at a 64-byte aligned offset (the CPU allocator's alignment,
so kernels see the same alignment as without tierd):

=====  ===========================  =====================================
 kind   holds                        needed
=====  ===========================  =====================================
 p      the parameters               VRAM in its forward and backward
                                     phases, host in its optimizer phase
 g      their gradients              VRAM (written) in its backward phase,
                                     host (read) in its optimizer phase
 m, v   the step rule's state        host in its optimizer phase
        (AdamW's two moments; SGD's
        momentum is m)
 w      float32 master weights       host in its optimizer phase
 a      saved activations            host: written in its forward phase,
                                     read in its backward phase
=====  ===========================  =====================================

``p`` and ``g`` hold each parameter in its own dtype; ``m``, ``v`` and
``w`` in float32.  ``w`` exists only for a block with a parameter in
reduced precision (bfloat16, float16).

A parameter that several blocks use (tied input and output embeddings, a
bias registered under two names) is stored once, in the *shared block*:
a block of no module of its own, whose ``p`` every block that uses it
maps in its forward and backward phases, and whose optimizer phase comes
after the whole backward, once autograd has summed every use's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

ALIGN = 64                       # bytes: torch's CPU allocator aligns to this
KINDS = ("p", "g", "m", "v", "w", "a")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


_ESIZE: dict[torch.dtype, int] = {}


def esize(dtype: torch.dtype) -> int:
    """Bytes of an element of ``dtype`` (remembered: every view of a parameter asks, hundreds a step)."""
    n = _ESIZE.get(dtype)
    if n is None:
        n = _ESIZE[dtype] = torch.empty(0, dtype=dtype).element_size()
    return n


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class Slot:
    """One parameter's place in its block's tensors."""
    param: torch.nn.Parameter
    name: str                     # the first of its names in model.named_parameters()
    names: list[str]              # every name it has (aliases, tied weights)
    off: int                      # bytes, in the block's p and g (the parameter's dtype)
    off32: int                    # bytes, in its m, v and w (float32)
    numel: int
    shape: torch.Size
    dtype: torch.dtype
    trainable: bool
    group: int = 0                # its parameter group (the step rule's hyperparameters)
    steps: int = 0                # optimizer updates it has had (torch.optim's state "step")
    had_grad: bool = False        # a backward gave it a gradient (torch: its .grad is a tensor from then on)
    map_version: int = -1         # its ._version when pointed at its mapped copy (guards.note_mapped_write())
    ph_version: int = -1          # its ._version when it got its placeholder (guards.check_params(); -2: loaded)

    def view(self, flat: torch.Tensor, kind: str) -> torch.Tensor:
        """This parameter's part of ``flat``, the uint8 mapping of the block's tensor ``kind``."""
        if kind in ("p", "g"):
            n = self.numel * esize(self.dtype)
            return flat[self.off:self.off + n].view(self.dtype).view(self.shape)
        return flat[self.off32:self.off32 + self.numel * 4].view(torch.float32).view(self.shape)


@dataclass
class Piece:
    """Elements [start, end) of a parameter, in one part of its block's g, m, v and w."""
    slot: Slot
    start: int
    end: int
    off_g: int                    # bytes, in the part's g (the parameter's dtype)
    off32: int                    # bytes, in the part's m, v and w (float32)

    def view(self, flat: torch.Tensor, kind: str) -> torch.Tensor:
        """This piece of ``flat``, the mapping of the part's tensor ``kind``: 1-D, or the parameter's
        shape when the piece is the whole parameter."""
        s = self.slot
        n = self.end - self.start
        if kind == "g":
            t = flat[self.off_g:self.off_g + n * esize(s.dtype)].view(s.dtype)
        else:
            t = flat[self.off32:self.off32 + n * 4].view(torch.float32)
        return t.view(s.shape) if n == s.numel else t

    def of(self, whole: torch.Tensor) -> torch.Tensor:
        """The same elements of a tensor shaped as the parameter (its p view, its .grad)."""
        if self.end - self.start == self.slot.numel:
            return whole
        return whole.reshape(-1)[self.start:self.end]


@dataclass
class Part:
    """One optimizer phase's share of a block: the g, m, v and w of some pieces of its parameters."""
    index: int
    pieces: list[Piece]
    g_bytes: int
    s_bytes: int                  # of each float32 kind (m, v, w)


#: elements a part boundary inside a parameter falls on (16 KiB of float32: the kernels' vector loops
#: see the same alignment as on the whole tensor)
PART_ALIGN = 4096


def parts_of(slots: list[Slot], part_bytes: int | None) -> list[Part]:
    """The block's optimizer parts: one holding every parameter whole when the float32 state fits
    ``part_bytes`` (None: always), else parts of at most that many float32 bytes each."""
    total32 = sum(align(s.numel * 4) for s in slots)
    if part_bytes is None or total32 <= part_bytes:
        return [Part(0, [Piece(s, 0, s.numel, s.off, s.off32) for s in slots],
                     max(sum(align(s.numel * esize(s.dtype)) for s in slots), ALIGN), max(total32, ALIGN))]
    cap = max(PART_ALIGN, part_bytes // 4 // PART_ALIGN * PART_ALIGN)      # elements per part
    parts: list[Part] = []
    cur: list[Piece] = []
    room = cap
    off_g = off32 = 0

    def close() -> None:
        nonlocal cur, room, off_g, off32
        if cur:
            parts.append(Part(len(parts), cur, max(off_g, ALIGN), max(off32, ALIGN)))
        cur, room, off_g, off32 = [], cap, 0, 0

    for s in slots:
        start = 0
        while start < s.numel:
            left = s.numel - start
            # the rest of the parameter when it fits, else as much as fits, ending on an aligned element
            n = left if left <= room else room // PART_ALIGN * PART_ALIGN
            if n == 0:
                close()
                continue
            cur.append(Piece(s, start, start + n, off_g, off32))
            off_g += align(n * esize(s.dtype))
            off32 += align(n * 4)
            room -= n
            start += n
            if room == 0:
                close()
    close()
    return parts


@dataclass
class Block:
    """A unit of offload: a module's parameters (or the shared ones), laid out in tierd tensors."""
    index: int
    path: str                     # the module's name in model.named_modules() ("" for the model itself)
    cls: str                      # its class name ("shared" for the shared block)
    module: torch.nn.Module | None    # None: the shared block
    slots: list[Slot]
    nbytes: int                   # of p and g
    nbytes32: int                 # of m, v and w
    mixed: bool                   # has a parameter in reduced precision: float32 master weights in w
    shared: list[Slot] = field(default_factory=list)  # slots of the shared block this block's module uses
    users: list[int] = field(default_factory=list)    # the shared block: the blocks that use it
    parts: list[Part] = field(default_factory=list)   # its optimizer phases' shares (one, unless it is large)
    act_bytes: int = 0            # saved activations its forward stashes (measured in the first step)
    act_used: int = 0             # of them, in the current forward
    tensors: dict[str, Any] = field(default_factory=dict)      # kind -> tier.Tensor
    maps: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (kind, tier) -> flat view

    @property
    def is_shared(self) -> bool:
        return self.module is None

    @property
    def label(self) -> str:
        """How messages name it: in the model's words."""
        if self.is_shared:
            return (f"the shared block (parameters used by several blocks: "
                    f"{', '.join(' = '.join(s.names) for s in self.slots)})")
        return f"block {self.index} '{self.path or 'the model'}' ({self.cls})"

    def kind_bytes(self, kind: str) -> int:
        """Bytes of this block's tensor ``kind`` ("g.2": part 2's g), or of every part's together ("g")."""
        base, _, k = kind.partition(".")
        if base == "p":
            return self.nbytes
        if base == "a":
            return self.act_bytes
        parts = [self.parts[int(k)]] if k else self.parts
        return sum(pt.g_bytes if base == "g" else pt.s_bytes for pt in parts)

    def opt_host_bytes(self, n_state: int) -> int:
        """Host bytes one optimizer phase of this block pins: p, and the largest part's g and
        ``n_state`` float32 kinds (and w for reduced precision)."""
        if not self.parts:
            return 0
        n32 = n_state + (1 if self.mixed else 0)
        return self.nbytes + max(pt.g_bytes + n32 * pt.s_bytes for pt in self.parts)

    def part_kind(self, kind: str, k: int) -> str:
        """The tensor kind of part ``k``'s ``kind`` (g, m, v, w): "g" for a block of one part, else "g.k"."""
        return kind if len(self.parts) == 1 else f"{kind}.{k}"

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.slots)


def param_names(model: torch.nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter of ``model`` (by id), in registration order: aliases included."""
    names: dict[int, list[str]] = {}
    # (named_parameters() has no remove_duplicate= before torch 2.0: walk the modules, duplicates kept)
    for mname, m in model.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is not None:
                n = f"{mname}.{pname}" if mname else pname
                if n not in names.setdefault(id(p), []):
                    names[id(p)].append(n)
    return names


def _slots(params: list[torch.nn.Parameter], names: dict[int, list[str]], where: str) -> tuple[list[Slot], int, int]:
    slots: list[Slot] = []
    off = off32 = 0
    for p in params:
        pn = names.get(id(p), ["?"])
        if p.dtype not in DTYPES:
            raise TypeError(f"parameter {pn[0]} ({where}) is {p.dtype}: tier.torch trains float32, bfloat16 "
                            "and float16 parameters; convert the model (model.float()) or freeze it elsewhere")
        with torch._C.DisableTorchFunction():       # (a second engine's: guards.claim_params() refuses it)
            n, esz, shape = p.numel(), p.element_size(), p.shape
        slots.append(Slot(p, pn[0], pn, off, off32, n, shape, p.dtype, p.requires_grad))
        off += align(n * esz)
        off32 += align(n * 4)
    return slots, max(off, ALIGN), max(off32, ALIGN)


def _check_embedding(name: str, m: torch.nn.Module) -> None:
    """What an Embedding or EmbeddingBag may do that tier.torch cannot follow, refused before anything is
    made: max_norm renormalizes the rows it looks up in place, under torch.no_grad(), in its forward,
    into the copy its block's phase maps for reading (lost, and refused only at the next step(), the
    value then undefined); sparse=True gives sparse gradients, which the backward cannot add into the
    block's dense gradients in tierd (it failed there: "copy_() between dense and sparse Tensors")."""
    if not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return
    what = f"'{name or 'the model'}' ({type(m).__name__})"
    if m.max_norm is not None:
        raise ValueError(f"{what} has max_norm={m.max_norm}: its forward renormalizes the rows it looks up in "
                         "place, and tier.torch maps parameters in a forward from a copy in tierd that the forward "
                         "only reads, so the renormalized rows would be lost; set max_norm=None on it "
                         f"(model.get_submodule('{name}').max_norm = None) before making the engine, or train this "
                         "model with a torch.optim optimizer")
    if m.sparse:
        raise ValueError(f"{what} has sparse=True: its weight's gradients are sparse tensors, and tier.torch keeps "
                         "every gradient dense in tierd; set sparse=False on it "
                         f"(model.get_submodule('{name}').sparse = False) before making the engine (AdamW takes only "
                         "dense gradients anyway), or train this model with a torch.optim optimizer")


def build(model: torch.nn.Module, modules: list[torch.nn.Module], part_bytes: int | None = None) -> list[Block]:
    """The blocks of ``modules`` (each a submodule of ``model``), and the shared block last if any
    parameter is used by more than one of them; a block whose float32 state is larger than
    ``part_bytes`` has its optimizer phase in parts of at most that.  Raises ValueError for blocks
    that nest, trainable parameters in no block, or no parameters at all."""
    names = param_names(model)
    mnames: dict[int, str] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        mnames.setdefault(id(m), n)             # a module registered twice: its first name
        _check_embedding(n, m)
    for m in modules:
        if id(m) not in mnames:
            raise ValueError(f"blocks= holds a {type(m).__name__} that is not a submodule of the model")
    seen: set[int] = set()
    for m in modules:
        if id(m) in seen:
            raise ValueError(f"block '{mnames[id(m)] or 'the model'}' is given twice in blocks=")
        seen.add(id(m))
    for m in modules:       # (a look-up per submodule: comparing each block with every other's was quadratic)
        inner = next((x for x in m.modules() if x is not m and id(x) in seen), None)
        if inner is not None:
            raise ValueError(f"block '{mnames[id(inner)]}' lies inside block '{mnames[id(m)] or 'the model'}': "
                             "blocks must not nest")
    # which blocks use each parameter
    users: dict[int, list[int]] = {}
    params: dict[int, torch.nn.Parameter] = {}
    per_block: list[list[torch.nn.Parameter]] = []
    for i, m in enumerate(modules):
        ps = list(m.parameters())          # deduplicated within the module
        per_block.append(ps)
        for p in ps:
            users.setdefault(id(p), []).append(i)
            params[id(p)] = p
    shared_ids = {pid for pid, us in users.items() if len(us) > 1}

    blocks: list[Block] = []
    for i, m in enumerate(modules):
        own = [p for p in per_block[i] if id(p) not in shared_ids]
        path = mnames[id(m)]
        slots, nb, nb32 = _slots(own, names, f"block '{path or 'the model'}'")
        blocks.append(Block(i, path, type(m).__name__, m, slots, nb, nb32,
                            any(s.dtype != torch.float32 for s in slots)))
    if shared_ids:
        # in the model's order of parameters, so that the layout does not depend on the blocks' order
        order = [id(p) for p in model.parameters() if id(p) in shared_ids]
        slots, nb, nb32 = _slots([params[pid] for pid in order], names, "used by several blocks")
        sb = Block(len(blocks), "", "shared", None, slots, nb, nb32, any(s.dtype != torch.float32 for s in slots))
        sb.users = sorted({u for pid in shared_ids for u in users[pid]})
        for u in sb.users:
            blocks[u].shared = [s for s in slots if u in users[id(s.param)]]
        blocks.append(sb)
    for b in blocks:
        b.parts = parts_of(b.slots, part_bytes) if b.slots else []
    owned = {id(s.param) for b in blocks for s in b.slots}
    for n, p in model.named_parameters():
        if p.requires_grad and id(p) not in owned:
            holder = model.get_submodule(n.rpartition(".")[0])
            inner = [mnames[id(m)] for m in modules if any(m is x for x in holder.modules())]
            if inner:       # (registered on a module that holds blocks: no block can take it)
                raise ValueError(f"trainable parameter {n} is in no block: it is registered on "
                                 f"'{n.rpartition('.')[0] or 'the model'}' itself, which holds blocks "
                                 f"({', '.join(inner[:3])}{', ...' if len(inner) > 3 else ''}), so only a "
                                 "block of that whole module can hold it: pass blocks= with that module "
                                 "instead of its parts, or move the parameter into a submodule of its own")
            raise ValueError(f"trainable parameter {n} is in no block: pass blocks= that cover it "
                             "(or leave blocks= out: tier.torch.auto_blocks() covers every parameter)")
    if not owned:
        raise ValueError("the model has no parameters to train")
    return blocks
