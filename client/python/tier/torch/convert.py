# SPDX-License-Identifier: MIT
"""tier.torch.convert: a model converted to another dtype or device while an engine holds its parameters
(``model.half()``, ``model.to(torch.bfloat16)``, ``model.double()``, ``model.cpu()`` off the engine's
device) is refused before it converts anything.

torch's ``Module.to()``, ``half()``, ``bfloat16()``, ``float()``, ``double()``, ``type()``, ``cuda()`` and
``cpu()`` all go through ``Module._apply(fn)``, which converts every parameter and buffer of the module's
subtree, one after the other.  The engine laid out each parameter's values, gradients and optimizer state
in tierd in the dtype and on the device the parameter had when it was made: such a conversion changed only
the empty placeholders, and was refused at the next forward, ``step()`` or ``model.state_dict()``
(guards.check_params()), after it had converted the model's buffers (a BatchNorm's running statistics
rounded to bfloat16 for good) and the placeholders, so that no forward passed any more and ``close()``
gave back a model of float32 parameters and bfloat16 buffers.

``hold()`` (from guards.claim_params()) gives each module that holds an engine's parameter in its subtree
an ``_apply`` of its own, in its ``__dict__`` (as guards shadows ``to()`` for a memory format), until
``release()`` (close()): it first asks ``fn`` what it makes of an empty tensor of each of the engine's
parameters' dtype, device and number of dimensions, and refuses a dtype or device that is not the
parameter's, before torch's ``_apply`` runs; the rest (``model.float()`` of a float32 model, ``.to()`` the
device it is on, ``share_memory()``, a conversion of a module holding none of the engine's parameters)
is torch's own.  No round trip to tierd; the walk over the parameters runs at such a call only.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

_checking = threading.local()       # .depth: inside a checked _apply (torch's recursion into the children)


def hold(eng: Any) -> None:
    """Shadow ``_apply`` on every module of ``eng``'s model whose subtree holds one of its parameters (one
    pass over the modules, children before their parents)."""
    r = weakref.ref(eng)

    held: dict[int, bool] = {}

    def visit(m: torch.nn.Module) -> bool:
        if id(m) not in held:
            held[id(m)] = False         # (a module under itself: not walked twice)
            mine = any(p is not None and id(p) in eng.slot_of for p in m._parameters.values())
            below = [visit(c) for c in m._modules.values() if c is not None]
            held[id(m)] = mine or any(below)
            if held[id(m)] and "_apply" not in m.__dict__:
                m.__dict__["_apply"] = _refuse_apply(r, m)
        return held[id(m)]

    visit(eng.model)


def release(eng: Any) -> None:
    """``eng`` lets its parameters go: torch's own ``_apply`` again."""
    for m in eng.model.modules():
        f = m.__dict__.get("_apply")
        if getattr(f, "_tier_convert", False) and f._tier_eng() in (eng, None):
            del m.__dict__["_apply"]


def _refuse_apply(r: Any, m: torch.nn.Module) -> Any:
    def _apply(fn: Any, *args: Any, **kwargs: Any) -> Any:
        eng = r()
        if eng is None or eng._closed:
            m.__dict__.pop("_apply", None)
        elif not getattr(_checking, "depth", 0):
            check(eng, m, fn)
        _checking.depth = getattr(_checking, "depth", 0) + 1
        try:
            return type(m)._apply(m, fn, *args, **kwargs)
        finally:
            _checking.depth -= 1

    _apply._tier_convert = True
    _apply._tier_eng = r
    return _apply


def check(eng: Any, m: torch.nn.Module, fn: Any) -> None:
    """Refused, naming the first parameter, where ``fn`` makes one of ``eng``'s parameters under ``m``
    another dtype or device than the one the engine laid out."""
    asked: dict[tuple[Any, int], torch.Tensor] = {}
    for p in m.parameters():
        hit = eng.slot_of.get(id(p))
        if hit is None or hit[1].param is not p:
            continue
        s = hit[1]
        key = (s.dtype, len(s.shape))
        if key not in asked:
            with torch._C.DisableTorchFunction():
                probe = torch.empty((0,) * len(s.shape), dtype=s.dtype, device=eng.device_here)
            out = fn(probe)
            asked[key] = out if isinstance(out, torch.Tensor) else probe
        out = asked[key]
        # (device_here: the probe's own device, cuda:0 where eng.device is torch.device("cuda"), which no tensor's
        # .device equals: every conversion on the GPU was refused, model.to("cuda") and model.float() too)
        if out.dtype != s.dtype or out.device != eng.device_here:
            raise RuntimeError(
                f"converting {type(m).__name__} (model.half(), .to(), .double(), .cpu()...) would make parameter "
                f"{s.name} {out.dtype} on {out.device}; it is {s.dtype} on {eng.device_here}, as when the tier.torch "
                "engine was made, which laid out its values, gradients and optimizer state in tierd so (the "
                "conversion would change only the empty placeholder, and the model's buffers, a BatchNorm's "
                "running statistics).  Convert the model before making the engine, or close() the engine (the "
                "model gets its values back), convert, and make a new one; for bfloat16 compute over float32 "
                "parameters, use torch.autocast(\"cpu\", dtype=torch.bfloat16) around the forward.  Nothing of "
                "the model changed")
