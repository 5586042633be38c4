# SPDX-License-Identifier: MIT
"""tier.torch: train a ``torch.nn.Module`` with its state in tierd.

Theory of operation
-------------------

An :class:`Offload` engine takes a model and a :class:`tier.Client` and from
then on owns the model's trainable state, block by block.  A *block* is a
submodule (by default each child of the model, with ``ModuleList`` and
``Sequential`` children expanded) and its parameters are laid out in four
flat tierd tensors, each parameter at a 64-byte aligned offset (the CPU
allocator's alignment, so kernels see the same alignment as without tierd):

=====  ===========================  =====================================
 kind   holds                        needed
=====  ===========================  =====================================
 p      the parameters               VRAM in its forward and backward
                                     phases, host in its optimizer phase
 g      their gradients              VRAM (written) in its backward phase,
                                     host (read) in its optimizer phase
 m, v   AdamW's two moments          host in its optimizer phase
 w      float32 master weights       host in its optimizer phase
 a      saved activations            host: written in its forward phase,
                                     read in its backward phase
=====  ===========================  =====================================

``p`` and ``g`` hold each parameter in its own dtype; ``m``, ``v`` and
``w`` in float32.  ``w`` exists only for a block with a parameter in
reduced precision (bfloat16, float16): the optimizer then updates the
float32 master weights with the gradients made float32, and writes the
parameters as the master weights rounded to their dtype (the usual
mixed-precision recipe); for float32 parameters ``p`` is its own master.

Outside its phases a parameter's ``.data`` is an empty placeholder, so the
model holds nothing: a block's parameters are mapped only while it runs.

One training step is a cycle of phases: the forward of each block in the
order the model calls them, then, as autograd reaches each block, its
backward followed at once by its optimizer phase (the block's gradients are
complete by then and nothing later in the backward reads its parameters),
the optimizer being torch's own AdamW (``torch.optim.adamw.adamw``, the
single-tensor form that ``torch.optim.AdamW`` runs on the CPU) over the
mapped host copies.  So the results are the bits plain PyTorch computes.

The first step is traced: hooks record the order of the phases while each
phase pins what it needs with plain pins.  The engine then submits the
cycle to tierd as the job's iteration plan and from the second step on
enters each phase with ``tier_phase()``: tierd knows what comes next and
moves it while the current phase computes.

How the hooks find the phases:

* a forward pre-hook of each block enters its forward phase and points the
  parameters at the mapped copy; its forward hook points them back at the
  placeholders and hooks the block's outputs;
* the first output gradient of a block to be computed enters its backward
  phase (autograd runs a node's tensor hooks before the node, and the
  parameters' gradient accumulators of the block before, which run first,
  having the highest priority in autograd's queue);
* tensors that autograd saves for the backward and that alias a mapped
  parameter (the parameter itself, or a view such as ``weight.t()``) are
  saved as (block, offset, shape, strides) with
  ``torch.autograd.graph.saved_tensors_hooks`` and rebuilt from the block's
  mapping in its backward phase, wherever tierd mapped it then.

Activations (``offload_activations=True``): the tensors autograd saves
during a block's forward (contiguous, at least ``activation_min_bytes``)
are copied into the block's ``a`` tensor instead of being kept, and read
from its mapping in the block's backward phase.  Between the two, tierd
may write them to NVMe when the host budget needs the room (the plan says
when they are read next, and that they are dead after it).  The first step
measures what each block saves; what a later step saves beyond that stays
in memory as usual.

Placements (as DeepSpeed's offload devices):

* ``"A"``: optimizer state and parameters stay in host memory; nothing is
  written to NVMe unless the job's host budget is too small;
* ``"B"``: after each block's optimizer phase its moments are written down
  to NVMe, host memory only stages them;
* ``"C"``: the parameters as well.

A write-down is an eviction (``evict_async(NVME)``) issued once the
optimizer phase is left (the last one's when :meth:`Offload.step` enters
the next step's first phase, so every write-down is issued, and counted, in
its own step); tierd's timeline then brings the tensor back before its next
use.  When the plan comes round to a tensor before its write-down ended (a
short step, a slow link), tierd's pin for the plan wins and the eviction
ends with EBUSY: the engine counts it in ``kept_up`` and goes on, the bytes
already written stay valid on NVMe.  (tierd handles a phase marker before
the requests sent after it, so the previous phase's pins never cause it.)

With several ranks (``torch.distributed`` initialised), each block's
gradients are all-reduced (averaged) before its optimizer phase: the
arithmetic of DistributedDataParallel, which itself cannot be used because
it assumes parameters that stay in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.optim.adamw as _adamw

from . import HOST, NVME, READ, READ_WRITE, VRAM, WRITE

__all__ = ["Offload", "auto_blocks"]

ALIGN = 64                       # bytes: torch's CPU allocator aligns to this
PLACEMENTS = ("A", "B", "C")
KINDS = ("p", "g", "m", "v", "w", "a")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _esize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def auto_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's children, ``ModuleList``/``Sequential`` ones expanded, that hold parameters."""
    out: list[torch.nn.Module] = []

    def walk(m: torch.nn.Module) -> None:
        for child in m.children():
            if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
                walk(child)
            elif any(True for _ in child.parameters()):
                out.append(child)

    walk(model)
    return out


@dataclass
class _Slot:
    param: torch.nn.Parameter
    name: str
    off: int                      # bytes, in the block's p and g (the parameter's dtype)
    off32: int                    # bytes, in its m, v and w (float32)
    numel: int
    shape: torch.Size
    dtype: torch.dtype
    trainable: bool

    def view(self, flat: torch.Tensor, kind: str) -> torch.Tensor:
        """This parameter's part of ``flat``, the uint8 mapping of the block's tensor ``kind``."""
        if kind in ("p", "g"):
            n = self.numel * _esize(self.dtype)
            return flat[self.off:self.off + n].view(self.dtype).view(self.shape)
        return flat[self.off32:self.off32 + self.numel * 4].view(torch.float32).view(self.shape)


@dataclass
class _Block:
    index: int
    name: str
    module: torch.nn.Module
    slots: list[_Slot]
    nbytes: int                   # of p and g
    nbytes32: int                 # of m, v and w
    mixed: bool                   # has a parameter in reduced precision: float32 master weights in w
    act_bytes: int = 0            # saved activations its forward stashes (measured in the first step)
    act_used: int = 0             # of them, in the current forward
    tensors: dict[str, Any] = field(default_factory=dict)      # kind -> tier.Tensor
    maps: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # (kind, tier) -> flat view
    step_hooked: int = -1          # the step whose outputs carry our gradient hook


class Offload:
    """Parameters, gradients and AdamW state of ``model`` in tierd; AdamW runs on the host tier.

    Use it in place of the optimizer::

        engine = tier.torch.Offload(model, client, lr=3e-4, placement="B")
        for x, y in data:
            loss = loss_fn(model(x), y)
            loss.backward()
            engine.step()           # AdamW, block by block; no zero_grad() needed

    ``blocks`` overrides the automatic choice (:func:`auto_blocks`); every
    trainable parameter must belong to exactly one block.  The model's
    parameters are empty outside the engine's phases: read them with
    :meth:`state_dict`, or give them back with :meth:`close`.
    """

    def __init__(self, model: torch.nn.Module, client: Any, *, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 placement: str = "A", blocks: Sequence[torch.nn.Module] | None = None,
                 offload_activations: bool = False, activation_min_bytes: int = 64 << 10,
                 prefix: str = "torch", process_group: Any = None) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
        self.model = model
        self.client = client
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.placement = placement
        self.offload_activations = offload_activations
        self.activation_min_bytes = activation_min_bytes
        #: bytes of saved activations stashed in tierd, and kept in memory (beyond what the first step
        #: measured), so far
        self.activations_stashed = 0
        self.activations_kept = 0
        self.steps = 0
        #: write-downs (placements B, C) that tierd did not finish because the plan needed the tensor
        #: back in VRAM or host memory first: its copy there stays, the bytes on NVMe too.
        self.kept_up = 0
        self.device = torch.device("cuda") if client.vram_backend == "cuda" else torch.device("cpu")
        self._group = process_group
        self._world = 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._world = torch.distributed.get_world_size(process_group)
        self._rank = client.rank
        self._prefix = prefix
        self._blocks = self._layout(list(blocks) if blocks is not None else auto_blocks(model))
        self._by_module = {id(b.module): b for b in self._blocks}
        self._seq: list[tuple[str, int]] = []        # the step's phases, as traced
        self._index: dict[tuple[str, int], int] = {}
        self._planned = False
        self._phase: tuple[str, int] | None = None
        self._early: tuple[str, int] | None = None     # the next step's first phase, entered by step()
        self._held: list[tuple[Any, int, bool]] = []  # trace mode: (tensor, tier, dirty) pinned now
        self._fences: list[Any] = []
        self._down: list[tuple[_Block, tuple[str, ...]]] = []   # written down once their phase is left
        self._bwd: _Block | None = None               # the block whose backward runs
        self._in_block: _Block | None = None          # the block whose forward runs
        self._saved_ctx: Any = None
        self._hooks: list[Any] = []
        self._closed = False
        self._create_tensors()
        self._install_hooks()

    # ---- layout ------------------------------------------------------------------------------

    def _layout(self, modules: list[torch.nn.Module]) -> list[_Block]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        mnames = {id(m): n or "the model" for n, m in self.model.named_modules()}
        owner: dict[int, int] = {}
        blocks: list[_Block] = []
        for m in modules:
            for inner in modules:
                if inner is not m and any(inner is x for x in m.modules()):
                    raise ValueError(f"block {mnames.get(id(inner), '?')} lies inside block "
                                     f"{mnames.get(id(m), '?')}: blocks must not nest")
        for i, m in enumerate(modules):
            slots: list[_Slot] = []
            off = off32 = 0
            for p in m.parameters():
                if id(p) in owner:
                    raise ValueError(f"parameter {names.get(id(p), '?')} is in blocks {owner[id(p)]} and {i}: "
                                     "parameters shared between blocks are not supported")
                if p.dtype not in DTYPES:
                    raise TypeError(f"parameter {names.get(id(p), '?')} is {p.dtype}: tier.torch trains "
                                    "float32, bfloat16 and float16 parameters")
                owner[id(p)] = i
                slots.append(_Slot(p, names.get(id(p), f"{i}.?"), off, off32, p.numel(), p.shape, p.dtype,
                                   p.requires_grad))
                off += _align(p.numel() * p.element_size())
                off32 += _align(p.numel() * 4)
            mixed = any(sl.dtype != torch.float32 for sl in slots)
            blocks.append(_Block(i, type(m).__name__, m, slots, max(off, ALIGN), max(off32, ALIGN), mixed))
        for n, p in self.model.named_parameters():
            if p.requires_grad and id(p) not in owner:
                raise ValueError(f"trainable parameter {n} is in no block: pass blocks= that cover it")
        if not blocks:
            raise ValueError("the model has no parameters to train")
        return blocks

    def _tname(self, b: _Block, kind: str) -> str:
        return f"{self._prefix}.{self._rank}.{b.index}.{kind}"

    def _create_tensors(self) -> None:
        from . import ExistsError

        for b in self._blocks:
            for kind in KINDS:
                if (kind == "w" and not b.mixed) or kind == "a":
                    continue
                name = self._tname(b, kind)
                size = b.nbytes if kind in ("p", "g") else b.nbytes32
                try:
                    t = self.client.create(name, size)
                except ExistsError:
                    # left by an earlier run of this job: start afresh
                    self.client.open(name).destroy()
                    t = self.client.create(name, size)
                b.tensors[kind] = t
            # the initial parameters go in (and the master weights); g, m and v start as zeros (a new
            # tensor reads as zeros)
            for kind in ("p", "w") if b.mixed else ("p",):
                with b.tensors[kind].pin(HOST, WRITE) as g:
                    flat = g.torch()
                    for s in b.slots:
                        s.view(flat, kind).copy_(s.param.data)
            for s in b.slots:
                s.param.data = self._placeholder(s.param)

    def _placeholder(self, p: torch.Tensor) -> torch.Tensor:
        return torch.empty(0, dtype=p.dtype, device=self.device)

    # ---- phases ------------------------------------------------------------------------------

    def _needs(self, kind: str, b: _Block) -> list[tuple[str, int, int]]:
        """(tensor kind, tier, mode) a phase of ``b`` needs."""
        act = "a" in b.tensors
        if kind == "f":
            return [("p", VRAM, READ)] + ([("a", HOST, WRITE)] if act else [])
        if kind == "b":
            return [("p", VRAM, READ), ("g", VRAM, WRITE)] + ([("a", HOST, READ)] if act else [])
        moments = [("g", HOST, READ), ("m", HOST, READ_WRITE), ("v", HOST, READ_WRITE)]
        if b.mixed:
            # p is written whole from the master weights: its old bytes need not come
            return [("p", HOST, WRITE), ("w", HOST, READ_WRITE)] + moments
        return [("p", HOST, READ_WRITE)] + moments

    def _enter(self, kind: str, b: _Block) -> None:
        key = (kind, b.index)
        for blk in self._blocks:
            blk.maps.clear()
        if self.device.type == "cuda":
            # kernels queued on the stream still read (and write) the phase's VRAM: they finish
            # before tierd may move it
            torch.cuda.current_stream().synchronize()
        if self._planned:
            k = self._index.get(key)
            if k is None:
                raise RuntimeError(f"phase {kind}{b.index} ({b.name}) is not in the plan traced at the first step: "
                                   "the model's order of blocks changed")
            if self._early != key:
                self.client.phase(k)
            self._early = None
            for tk, tier, _ in self._needs(kind, b):
                b.maps[(tk, tier)] = self.client.phase_grant(b.tensors[tk], tier).torch()
        else:
            self._release()
            if self.steps == 0 and (kind != "f" or torch.is_grad_enabled()):   # an evaluation is no step
                if key in self._seq:
                    raise RuntimeError(f"block {b.index} ({b.name}) ran its {'forward' if kind == 'f' else 'backward'}"
                                       " twice in one step: a block that runs more than once per step (weights "
                                       "shared across time) is not supported; make the repeated part one block's "
                                       "inside")
                self._seq.append(key)
            for tk, tier, mode in self._needs(kind, b):
                t = b.tensors[tk]
                g = t.pin(tier, mode)
                self._held.append((t, tier, bool(mode & WRITE)))
                b.maps[(tk, tier)] = g.torch()
        self._phase = key
        self._write_down(b, kind)

    def _write_down(self, now: _Block | None, kind: str) -> None:
        """Placements B and C: what optimizer phases left goes down to NVMe, but what the phase just
        entered (``kind`` of block ``now``; None: no phase) pins itself."""
        for b, kinds in self._down:
            keep = {tk for tk, _, _ in self._needs(kind, b)} if b is now else set()
            for k in kinds:
                if k not in keep:
                    self._fences.append(b.tensors[k].evict_async(NVME))
        self._down.clear()

    def _release(self) -> None:
        for t, tier, dirty in self._held:
            t.unpin(tier, dirty)
        self._held.clear()

    def _point(self, b: _Block, flat: torch.Tensor | None) -> None:
        for s in b.slots:
            if flat is None:
                s.param.data = self._placeholder(s.param)
            else:
                s.param.data = s.view(flat, "p")

    # ---- hooks -------------------------------------------------------------------------------

    def _install_hooks(self) -> None:
        self._hooks.append(self.model.register_forward_pre_hook(self._root_pre))
        self._hooks.append(self.model.register_forward_hook(self._root_post))
        for b in self._blocks:
            self._hooks.append(b.module.register_forward_pre_hook(self._block_pre))
            self._hooks.append(b.module.register_forward_hook(self._block_post))

    def _root_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._closed:
            raise RuntimeError("this Offload engine is closed")
        self._collect_fences()
        if self._saved_ctx is not None:
            # a forward that raised left it entered
            self._saved_ctx.__exit__(None, None, None)
            self._saved_ctx = None
        if torch.is_grad_enabled():
            self._saved_ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_ctx.__enter__()

    def _root_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._saved_ctx is not None:
            self._saved_ctx.__exit__(None, None, None)
            self._saved_ctx = None

    def _block_pre(self, module: torch.nn.Module, args: Any) -> None:
        b = self._by_module[id(module)]
        self._enter("f", b)
        self._point(b, b.maps[("p", VRAM)])
        self._in_block = b
        b.act_used = 0

    def _block_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        b = self._by_module[id(module)]
        self._in_block = None
        self._point(b, None)
        if not torch.is_grad_enabled():
            return
        fired = [False]

        def on_grad(grad: torch.Tensor) -> None:
            if not fired[0]:
                fired[0] = True
                self._backward(b)

        for t in _tensors(out):
            if t.requires_grad:
                t.register_hook(on_grad)

    def _pack(self, t: torch.Tensor) -> Any:
        if self._phase is None or self._phase[0] != "f":
            return t
        b = self._blocks[self._phase[1]]
        flat = b.maps.get(("p", VRAM))
        if flat is None or t.device != flat.device:
            return self._stash(b, t)
        base = flat.data_ptr()
        ptr = t.data_ptr()
        if not base <= ptr < base + b.nbytes:
            return self._stash(b, t)
        if (ptr - base) % t.element_size():
            raise RuntimeError(f"block {b.index} ({b.name}): a tensor saved for the backward aliases its "
                               "parameters at an offset that is not a multiple of its element size")
        # it aliases a mapped parameter: keep where it lies, not the memory (it moves)
        return _Alias(b.index, (ptr - base) // t.element_size(), t.shape, t.stride(), t.dtype)

    def _stash(self, b: _Block, t: torch.Tensor) -> Any:
        """An activation block ``b``'s forward saves: into its a tensor, when it is on and there is room."""
        if not self.offload_activations or self._in_block is not b or not t.is_contiguous():
            return t
        n = t.numel() * t.element_size()
        if n < self.activation_min_bytes:
            return t
        if self.steps == 0:
            b.act_bytes += _align(n)      # measured: the a tensor is made this big with the plan
            return t
        amap = b.maps.get(("a", HOST))
        if amap is None or b.act_used + n > b.act_bytes:
            self.activations_kept += n
            return t
        off = b.act_used
        amap[off:off + n].view(t.dtype).view(t.shape).copy_(t)
        b.act_used += _align(n)
        self.activations_stashed += n
        return _Stashed(b.index, off, t.shape, t.dtype, t.device)

    def _unpack(self, x: Any) -> torch.Tensor:
        if isinstance(x, _Stashed):
            b = self._blocks[x.block]
            amap = b.maps.get(("a", HOST))
            if amap is None:
                raise RuntimeError(f"block {x.block} ({b.name}): its backward needs its saved activations "
                                   "outside its backward phase (the model's blocks do not run one after another)")
            n = math.prod(x.shape) * _esize(x.dtype)
            t = amap[x.offset:x.offset + n].view(x.dtype).view(x.shape)
            return t if x.device == t.device else t.to(x.device)
        if not isinstance(x, _Alias):
            return x
        b = self._blocks[x.block]
        flat = b.maps.get(("p", VRAM))
        if flat is None:
            raise RuntimeError(f"block {x.block} ({b.name}): its backward needs its parameters outside its "
                               "backward phase (the model's blocks do not run one after another)")
        return torch.as_strided(flat.view(x.dtype), x.shape, x.stride, x.offset)

    # ---- backward and optimizer ------------------------------------------------------------

    def _backward(self, b: _Block) -> None:
        if self._bwd is not None:
            self._finish(self._bwd)
        self._enter("b", b)
        self._point(b, b.maps[("p", VRAM)])
        self._bwd = b

    def _finish(self, b: _Block) -> None:
        """b's gradients are complete: into its g tensor, then its optimizer phase."""
        gflat = b.maps[("g", VRAM)]
        for s in b.slots:
            dst = s.view(gflat, "g")
            if s.param.grad is None:
                dst.zero_()
            else:
                dst.copy_(s.param.grad)
                s.param.grad = None
        if self._world > 1:
            for s in b.slots:
                if s.trainable:
                    dst = s.view(gflat, "g")
                    torch.distributed.all_reduce(dst, group=self._group)
                    dst.div_(self._world)
        self._point(b, None)
        self._bwd = None
        self._enter("o", b)
        self._adamw(b)
        if self.placement != "A":
            self._down.append((b, ("m", "v") if self.placement == "B" else ("m", "v", "p")))

    def _adamw(self, b: _Block) -> None:
        maps = {k: b.maps[(k, HOST)] for k in KINDS if (k, HOST) in b.maps}
        master = "w" if b.mixed else "p"
        ps: list[torch.Tensor] = []
        gs: list[torch.Tensor] = []
        ms: list[torch.Tensor] = []
        vs: list[torch.Tensor] = []
        for s in b.slots:
            if not s.trainable:
                continue
            ps.append(s.view(maps[master], master))
            gs.append(s.view(maps["g"], "g").float())     # no copy when already float32
            ms.append(s.view(maps["m"], "m"))
            vs.append(s.view(maps["v"], "v"))
        if ps:
            self._adamw_update(ps, gs, ms, vs)
        if b.mixed:
            # the parameters, every one (p is pinned write-only), are the master weights rounded
            for s in b.slots:
                s.view(maps["p"], "p").copy_(s.view(maps["w"], "w"))

    def _adamw_update(self, ps: list[torch.Tensor], gs: list[torch.Tensor], ms: list[torch.Tensor],
                      vs: list[torch.Tensor]) -> None:
        steps = [torch.tensor(float(self.steps)) for _ in ps]     # adamw() counts this step in
        _adamw.adamw(ps, gs, ms, vs, [], steps, foreach=False, capturable=False, amsgrad=False,
                     beta1=self.betas[0], beta2=self.betas[1], lr=self.lr, weight_decay=self.weight_decay,
                     eps=self.eps, maximize=False)

    def step(self) -> None:
        """After ``loss.backward()``: the optimizer phases still due, and the next step's bookkeeping.

        With the plan running (from the second step on), it ends by entering the next step's first
        phase (one ``tier_phase()``, no round trip): tierd holds the last optimizer phase's pins until
        the next phase begins, so only then can that phase's write-downs (placements B and C) be
        issued, and this way they are issued in the step they belong to; :meth:`flush` waits for
        them."""
        if self._bwd is not None:
            self._finish(self._bwd)
        for b in self._blocks:
            b.maps.clear()
        self._phase = None
        if not self._planned:
            self._release()
            self._write_down(None, "")      # nothing is pinned now
            if self.steps == 0:
                self._submit_plan()
        elif self._seq:
            kind, i = self._seq[0]
            self.client.phase(self._index[(kind, i)])
            self._early = (kind, i)
            self._write_down(self._blocks[i], kind)
        self.steps += 1

    def flush(self) -> None:
        """Wait until the write-downs to NVMe in flight have ended (placements B and C evict each
        block's state after its optimizer phase without waiting): afterwards tierd's byte counters
        include them, and the state is on NVMe.  Not needed for correctness."""
        for f in self._fences:
            self._fence_done(f, True)
        self._fences = []

    def _fence_done(self, f: Any, wait: bool) -> bool:
        """Has write-down ``f`` ended?  One the plan overtook (it pinned the tensor again first) is done."""
        from . import BusyError

        try:
            if wait:
                f.wait()
                return True
            return f.done()
        except BusyError:
            self.kept_up += 1
            return True

    def _collect_fences(self) -> None:
        self._fences = [f for f in self._fences if not self._fence_done(f, False)]

    def _submit_plan(self) -> None:
        from . import ExistsError

        for b in self._blocks:
            if self.offload_activations and b.act_bytes:
                name = self._tname(b, "a")
                try:
                    b.tensors["a"] = self.client.create(name, b.act_bytes)
                except ExistsError:
                    self.client.open(name).destroy()
                    b.tensors["a"] = self.client.create(name, b.act_bytes)
        with self.client.plan() as plan:
            for k, (kind, i) in enumerate(self._seq):
                b = self._blocks[i]
                for tk, tier, mode in self._needs(kind, b):
                    plan.add(k, b.tensors[tk], tier, mode)
            plan.submit()
        self._index = {key: k for k, key in enumerate(self._seq)}
        self._planned = True

    # ---- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters as they are now, copied out of tierd (for checkpoints and checks)."""
        self._check_idle()
        out: dict[str, torch.Tensor] = {}
        for b in self._blocks:
            t = b.tensors["p"]
            with t.pin(HOST, READ) as g:
                flat = g.torch()
                for s in b.slots:
                    out[s.name] = s.view(flat, "p").clone()
        return out

    def _check_idle(self) -> None:
        if self._bwd is not None:
            raise RuntimeError("the engine is inside a step: call step() first")

    @property
    def stall(self) -> float:
        """Seconds spent waiting in phases for tierd to bring data, so far."""
        return self.client.phase_stall

    def close(self, restore: bool = True) -> None:
        """Give the parameters back to the model (``restore``), drop the hooks and tierd's tensors."""
        if self._closed:
            return
        self.flush()
        state = self.state_dict() if restore else None
        if self._planned:
            self.client.end_plan()          # its tensors may go now
            self._planned = False
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for b in self._blocks:
            for s in b.slots:
                s.param.data = state[s.name] if state is not None else self._placeholder(s.param)
            for t in b.tensors.values():
                t.destroy()
            b.tensors.clear()
        self._closed = True

    def __enter__(self) -> "Offload":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class _Stashed:
    block: int
    offset: int                   # bytes into the block's a tensor
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class _Alias:
    block: int
    offset: int                   # elements of its dtype from the start of the block's p tensor
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype


def _tensors(x: Any) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)
