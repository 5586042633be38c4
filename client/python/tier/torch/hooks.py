# SPDX-License-Identifier: MIT
"""tier.torch.hooks: how the engine sees the model run, attached and removed cleanly.

In the spirit of accelerate's ``add_hook_to_module``: the engine's hooks
go on the model and its blocks with torch's own hook API, and
:meth:`Hooks.detach` takes every one of them off again, leaving the user's
model as it was.  What they do:

* the model's forward pre-hook opens a ``saved_tensors_hooks`` context
  (when gradients are on) and its forward hook closes it;
* a block's forward pre-hook enters its forward phase and points its
  parameters at the mapped copy; its first forward hook copies an output
  that is a view of them, and its last (moved last before each forward, so
  that a user's hook registered after the engine still sees the parameters)
  points them back at the placeholders and hooks the block's outputs;
* the first output gradient of a block to be computed enters its backward
  phase (autograd runs a node's tensor hooks before the node, and the
  parameters' gradient accumulators of the block before, which run first,
  having the highest priority in autograd's queue);
* tensors that autograd saves for the backward and that alias a mapped
  parameter (the parameter itself, or a view such as ``weight.t()``) are
  saved as (block, offset, shape, strides) and rebuilt from the block's
  mapping in its backward phase, wherever tierd mapped it then; other
  large saved tensors may be stashed in tierd (``offload_activations``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import torch

from . import guards
from .state import Uncopyable

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Offload
    from .layout import Block


@dataclass(frozen=True)
class Stashed:
    """A saved activation copied into its block's ``a`` tensor."""
    block: int
    offset: int                   # bytes into the block's a tensor
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class Alias:
    """A saved tensor that is (a view of) a mapped parameter: where it lies, not the memory."""
    block: int                    # the block whose p holds it (the shared block for a tied weight)
    offset: int                   # elements of its dtype from the start of that block's p tensor
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype


def tensors_of(x: Any, depth: int = 0) -> Iterable[torch.Tensor]:
    """The tensors in a module's output (nested tuples, lists, dicts, Hugging Face ModelOutputs,
    dataclasses and other objects' attributes, e.g. a torch.distributions one; not modules)."""
    if depth > 16:
        return
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors_of(y, depth + 1)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors_of(y, depth + 1)
    elif not isinstance(x, (torch.nn.Module, type, str, bytes, int, float, bool)) and hasattr(x, "__dict__"):
        for y in vars(x).values():
            yield from tensors_of(y, depth + 1)


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class Hooks(Uncopyable):
    """The engine's hooks on one model; attach() once, detach() to take them all off."""

    def __init__(self, engine: "Offload") -> None:
        self.engine = engine
        self.handles: list[Any] = []
        self.post_ids: dict[int, int] = {}      # id(block module): its forward hook's id
        self.saved_ctx: Any = None
        #: the engine's parameters, and whether each trained when it was made (root_pre compares)
        self.params = [s.param for b in engine.blocks for s in b.slots]
        self.trains = [s.trainable for b in engine.blocks for s in b.slots]

    def attach(self) -> None:
        e = self.engine
        root = e.model.register_forward_pre_hook(self.root_pre)
        self.handles.append(root)
        self.handles.append(e.model.register_forward_hook(self.root_post))
        for b in e.blocks:
            if b.module is not None:
                h = b.module.register_forward_pre_hook(self.block_pre)
                # first: the module's own pre-hooks (weight_norm, spectral_norm, prune, a user's) read
                # its parameters, which are placeholders until this one maps them
                b.module._forward_pre_hooks.move_to_end(h.id, last=False)
                self.handles.append(h)
                # first: an output that is a view of the mapped parameters is copied before anyone keeps it
                h = b.module.register_forward_hook(self.block_own)
                b.module._forward_hooks.move_to_end(h.id, last=False)
                self.handles.append(h)
                h = b.module.register_forward_hook(self.block_post)
                self.post_ids[id(b.module)] = h.id
                self.handles.append(h)
        # a model that is one block itself: its forward begins before the block's phase does
        e.model._forward_pre_hooks.move_to_end(root.id, last=False)

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.post_ids.clear()
        self.close_saved()

    def close_saved(self) -> None:
        if self.saved_ctx is not None:
            self.saved_ctx.__exit__(None, None, None)
            self.saved_ctx = None

    # ---- the model ----------------------------------------------------------------------------

    def root_pre(self, module: torch.nn.Module, args: Any) -> None:
        if torch.jit.is_tracing():
            raise RuntimeError("torch.jit.trace of a model offloaded by tier.torch: its parameters are in tierd, "
                               "mapped only while each block runs, which a trace cannot record; trace (or "
                               "export) the model before making the engine, or after close()")
        if torch.is_grad_enabled():
            e = self.engine
            with guards.direct():
                # no Python line per parameter over a model unchanged since the engine (map() and the list
                # compare run in C: 3 ms a forward at 40960 parameters; the named_parameters() walk below
                # another 38, which every forward paid; tests/python/test_scale.py counts the lines)
                s = None
                if list(map(_REQUIRES_GRAD, self.params)) != self.trains:
                    s = next((s for b in e.blocks for s in b.slots if s.param.requires_grad != s.trainable), None)
                # (a parameter that trains now but is none of the engine's: added after it, a frozen one then
                # unfrozen; only where the model changed since the engine was made: the held dicts say so)
                new = next((n for n, p in module.named_parameters() if p.requires_grad and
                            id(p) not in e.slot_of), None) if s is None and e._model_changed else None
            if new is not None:
                raise RuntimeError(
                    f"parameter {new} requires grad but is none of the tier.torch engine's: it was added (or "
                    "unfrozen) after the engine was made, which laid out the parameters that train then (their "
                    "gradients, optimizer state and updates in tierd), so nothing would update it.  Add adapters "
                    "(LoRA) and any other parameter that trains before making the engine, or close() it, add "
                    "them, and make a new one; nothing ran")
            if s is not None:
                raise RuntimeError(
                    f"parameter {s.names[0]}: requires_grad is {s.param.requires_grad} now, {s.trainable} "
                    "when the tier.torch engine was made, which laid out what trains then (its "
                    "gradients, optimizer state and updates): close() the engine and make a new one "
                    "after changing which parameters train")
        self.engine.forward_begins()
        self.close_saved()          # a forward that raised left it open
        if torch.is_grad_enabled():
            self.saved_ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            self.saved_ctx.__enter__()

    def root_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self.close_saved()
        self.engine.forward_ends()
        if torch.is_grad_enabled():
            # the first gradient through the model's output opens its backward pass (whose end
            # autograd then reports to the engine: the last block's gradients are complete)
            e = self.engine

            def on_out_grad(grad: torch.Tensor) -> None:
                e.backward_begins()

            found = False
            ts = list(tensors_of(out))
            for t in ts:
                if t.requires_grad:
                    t.register_hook(on_out_grad)
                    found = True
            if not found and ts and any(s.trainable for b in e.blocks for s in b.slots):
                raise RuntimeError(
                    f"no tensor of the model's output ({type(out).__name__}) requires grad, with gradients on and "
                    "parameters that train: nothing depends on them.  With the model frozen but for some blocks "
                    "(LoRA adapters) under reentrant activation checkpointing (torch.utils.checkpoint's "
                    "use_reentrant=True, Hugging Face's gradient_checkpointing_enable() by default), a "
                    "checkpointed block whose inputs need no gradient drops its parameters' gradients: call "
                    "model.enable_input_require_grads() (Hugging Face) before the forward, or checkpoint with "
                    "use_reentrant=False (gradient_checkpointing_kwargs={'use_reentrant': False}); for an "
                    "evaluation, run the forward under torch.no_grad()")
            if not found and any(s.trainable for b in e.blocks for s in b.slots):
                raise RuntimeError(f"the model's output ({type(out).__name__}) holds no tensor with gradients "
                                   "that tier.torch can find, so it cannot tell when the backward starts: "
                                   "return tensors (or tuples, lists, dicts, dataclasses of them)")

    # ---- blocks -------------------------------------------------------------------------------

    def block_pre(self, module: torch.nn.Module, args: Any) -> None:
        # last: a forward hook registered after the engine (a user's logging of the weights) runs while
        # the parameters are still mapped
        module._forward_hooks.move_to_end(self.post_ids[id(module)])
        self.engine.block_forward(self.engine.by_module[id(module)])

    def _in_params(self, b: "Block", t: torch.Tensor) -> bool:
        """Does ``t`` lie in the parameters mapped for ``b``'s phase (a view of one of them)?"""
        e = self.engine
        for owner in e.param_owners(b):
            flat = owner.maps.get(("p", e.vram))
            if flat is not None and t.device == flat.device and \
                    flat.data_ptr() <= t.data_ptr() < flat.data_ptr() + owner.nbytes:
                return True
        return False

    def _own_output(self, b: "Block", out: Any) -> Any:
        """``out`` with its views of ``b``'s parameters copied (None: it has none).  A block that returns
        a slice of its own parameter (a learned positional table's ``self.pe[:, :n]``) returned memory
        tierd gives to other tensors once the phase is over: later reads saw whatever lay there."""
        def own(x: Any) -> Any:
            return x.clone() if isinstance(x, torch.Tensor) and self._in_params(b, x) else x

        if isinstance(out, torch.Tensor):
            return own(out) if self._in_params(b, out) else None
        if type(out) in (tuple, list):
            items = [own(x) for x in out]
            if any(a is not x for a, x in zip(items, out)):
                return type(out)(items)
        for t in tensors_of(out):
            if self._in_params(b, t):
                raise RuntimeError(f"{b.label} returned a view of its own parameters inside a "
                                   f"{type(out).__name__}: tier.torch maps them for its phase only; return a copy "
                                   "(.clone()) of it")
        return None

    def block_own(self, module: torch.nn.Module, args: Any, out: Any) -> Any:
        return self._own_output(self.engine.by_module[id(module)], out)

    def block_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        """Last of the block's forward hooks (block_pre() keeps it there): its parameters go back to the
        placeholders, and the output's first gradient will enter the block's backward."""
        e = self.engine
        b = e.by_module[id(module)]
        e.block_forward_done(b)
        if not torch.is_grad_enabled():
            return
        fired = [False]

        def on_grad(grad: torch.Tensor) -> None:
            if not fired[0]:
                # (noted once entered: a backward refused where it would begin, autograd.grad() with
                # retain_graph=True, leaves the forward open for its own backward, which enters it)
                e.block_backward(b)
                fired[0] = True

        for t in tensors_of(out):
            if t.requires_grad:
                t.register_hook(on_grad)

    # ---- saved tensors ------------------------------------------------------------------------

    def pack(self, t: torch.Tensor) -> Any:
        e = self.engine
        b = e.forward_block()
        if b is None:
            return t
        for owner in e.param_owners(b):
            flat = owner.maps.get(("p", e.vram))
            if flat is None or t.device != flat.device:
                continue
            base, ptr = flat.data_ptr(), t.data_ptr()
            if base <= ptr < base + owner.nbytes:
                if (ptr - base) % t.element_size():
                    raise RuntimeError(f"{b.label}: a tensor saved for the backward aliases its parameters at an "
                                       "offset that is not a multiple of its element size")
                return Alias(owner.index, (ptr - base) // t.element_size(), t.shape, t.stride(), t.dtype)
        return e.stash(b, t)

    def unpack(self, x: Any) -> torch.Tensor:
        e = self.engine
        if isinstance(x, Stashed):
            return e.unstash(x)
        if not isinstance(x, Alias):
            return x
        owner = e.blocks[x.block]
        flat = owner.maps.get(("p", e.vram))
        if flat is None:
            raise RuntimeError(f"{owner.label}: the backward needs its parameters outside a phase that maps them "
                               "(the model's blocks do not run one after another)")
        return torch.as_strided(flat.view(x.dtype), x.shape, x.stride, x.offset)
