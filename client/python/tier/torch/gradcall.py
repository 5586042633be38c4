# SPDX-License-Identifier: MIT
"""tier.torch.gradcall: ``torch.autograd.grad()`` while an engine lives.

``torch.autograd.grad(outputs, inputs)`` runs a backward that puts nothing
into any ``.grad``.  Through an engine's model (a saliency map, an
adversarial example, a gradient penalty: the gradient of an input or of an
activation) the engine's hooks took it for the training step's backward:
each block it reached had its gradients, none, moved into tierd and, with
the optimizer in the backward, its optimizer phase run, an AdamW update
from the zeros ``zero_grad(set_to_none=False)`` leaves, which plain PyTorch
never makes; the next forward was then refused as a second micro-batch,
saying the update came from the first micro-batch's gradients.  With
respect to an engine's parameter it was refused as a read of the empty
placeholder, in words about EMAs.

The engine itself tells such a backward in its first hook (:func:`check_backward`, from
guards.check_one_forward(), before any block's backward phase is entered or any count
changes): a backward with ``inputs`` (autograd's thread-local "checkpoint valid" flag is
false in one, as torch.utils.checkpoint reads it) in which no AccumulateGrad node of an
engine's parameter will run (``torch._C._will_engine_execute_node``) puts no gradient into
any of its parameters, and is refused, however it was called: torch.autograd.grad() from
Python or from TorchScript (aten::grad, which no Python wrapper sees), or
``backward(inputs=...)`` naming none of them.  ``backward(inputs=[some parameters])``
(a partial backward) and every backward without ``inputs`` go on as before.

While an engine lives torch.autograd.grad is also wrapped, as tier.torch.clip wraps
``clip_grad_norm_`` (the function object's code, for a name imported before the engine
too; ``torch.autograd.grad`` stays that object, which TorchScript compiles to
``aten::grad`` by its identity: a wrapper put in its place made every
``torch.jit.script`` of a function calling it fail while an engine lived), for an earlier
refusal: with respect to an engine's parameter it is refused before autograd runs (the
parameter is an empty placeholder there).  A call that never reaches an engine's model
(another model's gradient penalty) is torch's.
"""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Offload

_engines: "weakref.WeakSet[Offload]" = weakref.WeakSet()

_grad_fn = torch.autograd.grad
_grad_code = _grad_fn.__code__
_orig_grad = types.FunctionType(_grad_code, _grad_fn.__globals__, _grad_fn.__name__, _grad_fn.__defaults__,
                                _grad_fn.__closure__)
_orig_grad.__kwdefaults__ = _grad_fn.__kwdefaults__
_grad_defaults = _grad_fn.__defaults__

_DO_INSTEAD = ("train with loss.backward() and step() (p.register_hook() changes a gradient, clip_grad_norm_ "
               "clips); for other gradients (of an input, an activation or a parameter: a saliency map, an "
               "adversarial example, a gradient penalty) use a plain copy of the model loaded from "
               "model.state_dict(), or compute them before making the engine or after close()")


def _trampoline(*args: Any, **kw: Any) -> Any:
    return _tier_torch_autograd_grad(*args, **kw)  # noqa: F821


def _wrt_param(name: str) -> RuntimeError:
    return RuntimeError(f"torch.autograd.grad() with respect to parameter {name} of a tier.torch engine: its "
                        "gradient goes into tierd in its block's backward, for step(), and outside its block's "
                        "phases the parameter is an empty placeholder; not supported, nothing was computed.  "
                        f"{_DO_INSTEAD[0].upper()}{_DO_INSTEAD[1:]}.  The model's forward stays open: zero_grad() "
                        "drops it")


def _wrapper(outputs: Any, inputs: Any, *args: Any, **kw: Any) -> Any:
    live = [e for e in list(_engines) if not e._closed]
    if live:
        # one input: a tensor, or (torch >= 2.3) a GradientEdge, a named tuple (node, output_nr) that
        # list() would take apart
        single = isinstance(inputs, torch.Tensor) or (isinstance(inputs, tuple) and hasattr(inputs, "node"))
        ins = [inputs] if single else list(inputs)
        for e in live:
            hit = next((e.slot_of[id(t)] for t in ins if id(t) in e.slot_of), None)
            if hit is not None:
                raise _wrt_param(hit[1].name)
        if not single:
            inputs = ins  # (a generator is read once: what was looked at goes on)
    return _orig_grad(outputs, inputs, *args, **kw)


def check_backward(eng: "Offload") -> None:
    """A backward through ``eng``'s model begins (its first block's or its output's gradient): refused
    where it will put no gradient into any of the engine's parameters, before any phase is entered or any
    count changes."""
    if torch.autograd._is_checkpoint_valid():
        return          # (a backward without inputs=: every parameter it reaches gets its gradient)
    reached = False
    with torch.enable_grad(), torch._C.DisableTorchFunction():
        for b in eng.blocks:
            for s in b.slots:
                if not s.param.requires_grad:
                    continue
                reached = True
                node = s.param.view_as(s.param).grad_fn.next_functions[0][0]   # (its AccumulateGrad)
                try:
                    if torch._C._will_engine_execute_node(node):
                        return      # (backward(inputs=[...]) naming one: a partial backward, as before)
                except RuntimeError:    # (torch: "A leaf node was passed ... running autograd.grad()")
                    raise _wrt_param(s.name) from None
    if reached:
        raise RuntimeError("a backward through a tier.torch engine's model that puts no gradient into its "
                           "parameters (torch.autograd.grad() of an input or an activation, called from Python "
                           "or from TorchScript, or backward(inputs=...) naming none of them): the engine takes "
                           "a backward through the model for the training step's (each block's gradients into "
                           "tierd and, with the optimizer in the backward, its update); not supported, nothing "
                           f"was computed or applied.  {_DO_INSTEAD[0].upper()}{_DO_INSTEAD[1:]}.  The forward "
                           "stays open: zero_grad() drops it")


def register(engine: "Offload") -> None:
    _engines.add(engine)
    _grad_fn.__globals__["_tier_torch_autograd_grad"] = _wrapper
    try:
        _grad_fn.__code__ = _trampoline.__code__
        _grad_fn.__defaults__ = None    # (torch's, for its own parameters: the trampoline takes *args)
    except ValueError:          # pragma: no cover - a torch whose function is a closure: the attribute only
        if torch.autograd.grad is _grad_fn:
            torch.autograd.grad = _wrapper


def unregister(engine: "Offload") -> None:
    _engines.discard(engine)
    if len(_engines):
        return
    _grad_fn.__code__ = _grad_code
    _grad_fn.__defaults__ = _grad_defaults
    if torch.autograd.grad is _wrapper:
        torch.autograd.grad = _grad_fn
