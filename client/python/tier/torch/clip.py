# SPDX-License-Identifier: MIT
"""tier.torch.clip: gradient clipping over gradients that live in tierd.

``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` reads each
parameter's ``.grad``; an engine's parameters have none (their gradients
are in the blocks' ``g`` tensors).  So while an engine is alive, the
function is wrapped: a call naming an engine's parameters goes to
:func:`clip_grad_norm`, which computes the same thing from what the engine
noted when each gradient was complete (its 2-norm and largest magnitude,
on the whole tensor, as torch computes them on ``.grad``), returns the same
total norm and scales each gradient by the same factor in its optimizer
phase (``g * clip_coef_clamped``, what torch's ``g.mul_()`` leaves).  Calls
that name none go to torch's own function unchanged.
``clip_grad_value_`` on an engine's parameters is refused: it would see no
gradients and do nothing.  ``torch.nn.Module.zero_grad`` is wrapped too: on
a module around an engine's model it calls the engine's ``zero_grad()``
first (``_zero_grad_wrapper``).

Clipping needs the optimizer after the whole backward: where the first
step did not clip, the engine runs each block's optimizer phase inside the
backward (fused), and a later clip is refused, naming the cure.
"""

from __future__ import annotations

import math
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .. import VRAM
from . import guards

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Offload

_engines: "weakref.WeakSet[Offload]" = weakref.WeakSet()


def _copy(f: Callable) -> Callable:
    """A function of its own with @f's code now (torch's, before any is changed below)."""
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    return g


# torch's functions themselves, which a module that imported them by name (from torch.nn.utils import
# clip_grad_norm_) holds too, and copies of them that stay torch's
_norm_fn = torch.nn.utils.clip_grad_norm_
_value_fn = torch.nn.utils.clip_grad_value_
_norm_code, _value_code = _norm_fn.__code__, _value_fn.__code__
_orig_norm = _copy(_norm_fn)
_orig_value = _copy(_value_fn)


def _norm_trampoline(parameters: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                     *args: Any, **kw: Any) -> Any:
    return _tier_torch_clip_norm(parameters, max_norm, norm_type, error_if_nonfinite, *args, **kw)  # noqa: F821


def _value_trampoline(parameters: Any, clip_value: float, *args: Any, **kw: Any) -> Any:
    return _tier_torch_clip_value(parameters, clip_value, *args, **kw)  # noqa: F821


def _owner(params: list[torch.Tensor]) -> "Offload | None":
    owners = {id(e): e for e in list(_engines) for p in params if id(p) in e.slot_of}
    if len(owners) > 1:
        raise RuntimeError("clip_grad_norm_ over the parameters of two tier.torch engines: clip each engine's "
                           "own parameters")
    return next(iter(owners.values()), None)


def _norm_wrapper(parameters: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                  *args: Any, **kw: Any) -> torch.Tensor:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    eng = _owner(params)
    if eng is None:
        return _orig_norm(params, max_norm, norm_type, error_if_nonfinite, *args, **kw)
    if args or kw:
        raise TypeError(f"clip_grad_norm_: tier.torch takes parameters, max_norm, norm_type and "
                        f"error_if_nonfinite, not {', '.join(list(kw) or ['more'])}")
    return clip_grad_norm(eng, params, max_norm, norm_type, error_if_nonfinite)


def _value_wrapper(parameters: Any, clip_value: float, *args: Any, **kw: Any) -> None:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    if _owner(params) is not None:
        raise RuntimeError("clip_grad_value_ over a tier.torch engine's parameters is not supported (their "
                           "gradients are in tierd, not in .grad); use clip_grad_norm_, which is")
    return _orig_value(params, clip_value, *args, **kw)


_module_zero_grad = torch.nn.Module.zero_grad


def _zero_grad_wrapper(self: torch.nn.Module, set_to_none: bool = False) -> None:
    """torch.nn.Module.zero_grad() while an engine lives, on a module around an engine's model (a
    wrapper holding it as DistributedDataParallel would): the engine's zero_grad() first, as the model's own
    (ModelStateHooks), then torch's.  torch's alone failed on the first .grad in tierd (GradInTierd), after
    zeroing those before it; and after a forward, where those were None already, left the engine's gradients
    unzeroed for it.  On a module holding only some of an engine's parameters, set_to_none=False is refused
    where one's gradient is in tierd (the engine drops a step's gradients all at once), before anything
    changes; set_to_none=True is .grad = None by hand."""
    engines = [e for e in list(_engines) if not e._closed and e.model is not self]
    whole = []
    if engines:
        mine = {id(p) for p in self.parameters()}
        for e in engines:
            ours = [pid for pid in e.slot_of if pid in mine]
            if len(ours) == len(e.slot_of):
                whole.append(e)
            elif ours and not set_to_none:
                moved = [e.slot_of[pid][1].name for pid in ours if type(e.slot_of[pid][1].param.grad) is GradInTierd]
                if moved:
                    more = f" and {len(moved) - 1} more" if len(moved) > 1 else ""
                    raise RuntimeError(f"zero_grad(set_to_none=False) on a module holding some of a tier.torch "
                                       f"engine's parameters, not all ({type(self).__name__}; {moved[0]}{more} have "
                                       "their gradient in tierd, where the engine drops a step's gradients all at "
                                       "once): call zero_grad() on the engine, its model or a module holding the "
                                       "whole model, or zero_grad(set_to_none=True) here; nothing changed")
    for e in whole:
        e.zero_grad(set_to_none)        # (first: what it refuses changes nothing)
    _module_zero_grad(self, set_to_none)


def _install() -> None:
    # the function objects themselves run the wrappers (names in their own module's globals, which the
    # trampolines' code looks up): a name imported before the engine was made (from torch.nn.utils import
    # clip_grad_norm_) found torch's code, saw no .grad and clipped nothing, silently
    for fn, tramp, name, wrapper in ((_norm_fn, _norm_trampoline, "_tier_torch_clip_norm", _norm_wrapper),
                                     (_value_fn, _value_trampoline, "_tier_torch_clip_value", _value_wrapper)):
        fn.__globals__[name] = wrapper
        try:
            fn.__code__ = tramp.__code__
        except ValueError:      # pragma: no cover - a torch whose function is a closure (a decorator's)
            pass                # then only the module attributes below are wrapped
    for mod in (torch.nn.utils, torch.nn.utils.clip_grad):
        if getattr(mod, "clip_grad_norm_", None) is _norm_fn:
            mod.clip_grad_norm_ = _norm_wrapper
        if getattr(mod, "clip_grad_value_", None) is _value_fn:
            mod.clip_grad_value_ = _value_wrapper
    if torch.nn.Module.zero_grad is _module_zero_grad:
        torch.nn.Module.zero_grad = _zero_grad_wrapper


def _uninstall() -> None:
    _norm_fn.__code__ = _norm_code
    _value_fn.__code__ = _value_code
    for mod in (torch.nn.utils, torch.nn.utils.clip_grad):
        if getattr(mod, "clip_grad_norm_", None) is _norm_wrapper:
            mod.clip_grad_norm_ = _norm_fn
        if getattr(mod, "clip_grad_value_", None) is _value_wrapper:
            mod.clip_grad_value_ = _value_fn
    if torch.nn.Module.zero_grad is _zero_grad_wrapper:
        torch.nn.Module.zero_grad = _module_zero_grad


def check_names_free(client: Any, rank: int, prefix: str, resume: bool) -> None:
    """A new engine beside the live ones of this process (a GAN's two models, say), refused before anything
    is made when: it has the job, rank and prefix of another (its tensors would be taken for an earlier
    run's and destroyed); it has another's client (a client runs one plan: the second engine's first
    step() failed after its update); either resumes and they share the job (a commit takes every tensor of
    the job at once, the other engine's step half done)."""
    job = client.job
    for e in list(_engines):
        gone = e._closed or getattr(e.client, "closed", False)     # (a client closed: its process is gone)
        if gone:
            continue
        if e.client is client:
            raise ValueError(f"tier.torch: another engine runs on this client already (job '{job}'): a client "
                             "runs one plan; give each engine its own client of the job "
                             f"(tier.Client('{job}')) and its own prefix=")
        if e.client.job == job and e._rank == rank and e._prefix == prefix:
            raise ValueError(f"tier.torch: another engine of job '{job}' (rank {rank}) in this process names its "
                             f"tensors '{prefix}.{rank}.*' already: give each engine of a job its own prefix= "
                             "(Offload(model, client, prefix='disc'))")
        if e.client.job == job and (resume or e.resume):
            raise ValueError(f"tier.torch: resume=True with two engines of job '{job}': a commit takes every "
                             "tensor of the job at once, the other engine's step half done; give each model its "
                             "own job (tier.Client('gan-g'), tier.Client('gan-d')) to resume both")


def register(engine: "Offload") -> None:
    _engines.add(engine)
    _install()


def unregister(engine: "Offload") -> None:
    _engines.discard(engine)
    if not len(_engines):
        _uninstall()


def clip_grad_norm(eng: "Offload", params: Iterable[torch.Tensor], max_norm: float, norm_type: float,
                   error_if_nonfinite: bool) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (torch 1.13's arithmetic) over engine ``eng``'s gradients."""
    params = list(params)
    guards.check_backward(eng, "clip_grad_norm_")       # (a closed engine)
    if eng._mode == "fused":
        raise RuntimeError(
            "clip_grad_norm_: tier.torch already applied this step's gradients, unclipped, in the backward (the "
            "first step called no clip_grad_norm_, accumulated nothing and passed no closure to step(), so the "
            "optimizer runs inside the backward); call step() to go on (that update stands), and to clip make "
            "the engine with optimizer_in_backward=False (or clip from the first step on)")
    if eng._mode is None and eng.optimizer_in_backward:
        raise RuntimeError("clip_grad_norm_ with optimizer_in_backward=True: clipping needs the optimizer after the "
                           "whole backward (make the engine with optimizer_in_backward=False or None)")
    if eng._in_backward or eng._bwd is not None and eng._in_backward:
        raise RuntimeError("clip_grad_norm_ during a backward pass: call it after backward() and before step()")
    if eng._clip_coef is not None:
        raise RuntimeError("clip_grad_norm_ twice in one step: tier.torch scales the gradients once, in their "
                           "optimizer phase; clip once between the last backward() and step()")
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if norm_type not in (2.0, math.inf):
        raise ValueError(f"clip_grad_norm_ with norm_type {norm_type}: tier.torch clips by the 2-norm or the "
                         "inf-norm of the gradients")
    eng.reduce_shared()
    norms: list[torch.Tensor] = []
    ours: set[int] = set()
    inplace: list[torch.Tensor] = []        # real .grad tensors: the shared block's, and parameters not ours
    for p in params:
        hit = eng.slot_of.get(id(p))
        if hit is None or hit[0].is_shared:
            if p.grad is None:
                continue
            g = p.grad.detach()
            norms.append(g.abs().max() if norm_type == math.inf else torch.norm(g, norm_type))
            inplace.append(g)
            continue
        s = hit[1]
        if id(s) not in eng._got:
            continue                        # no gradient this step: torch leaves it out too
        norms.append((eng._maxabs if norm_type == math.inf else eng._norms)[id(s)])
        ours.add(id(s))
    if not norms:
        return torch.tensor(0.)
    if norm_type == math.inf:
        total = norms[0] if len(norms) == 1 else torch.max(torch.stack(norms))
    else:
        total = torch.norm(torch.stack(norms), norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f'The total norm of order {norm_type} for gradients from '
            '`parameters` is non-finite, so it cannot be clipped. To disable '
            'this error and scale the gradients by the non-finite norm anyway, '
            'set `error_if_nonfinite=False`')
    clip_coef = max_norm / (total + 1e-6)
    clamped = torch.clamp(clip_coef, max=1.0)
    for g in inplace:
        g.mul_(clamped.to(g.device))
    eng._clip_coef = clamped
    eng._clip_ids = ours
    return total


def note_norms(eng: Any, b: Any) -> None:
    """The 2-norm and largest magnitude of each gradient of b as summed so far (mapped in VRAM),
    computed on the whole tensor as clip_grad_norm_ computes them on .grad."""
    views: dict[int, list[torch.Tensor]] = {}
    for pt in b.parts:
        gflat = b.maps[(b.part_kind("g", pt.index), VRAM)]
        for pc in pt.pieces:
            if id(pc.slot) in eng._got:
                views.setdefault(id(pc.slot), []).append(pc.view(gflat, "g"))
    for s in b.slots:
        v = views.get(id(s))
        if not v:
            continue
        g = v[0] if len(v) == 1 else torch.cat([x.reshape(-1) for x in v]).view(s.shape)
        eng._norms[id(s)] = torch.norm(g.detach(), 2.0)
        eng._maxabs[id(s)] = g.detach().abs().max()


# ---- .grad between a block's backward and the next forward ------------------------------------------

GRAD_NOTE = ("the gradient of parameter '{name}' is in tierd, not in .grad: tier.torch moves each block's "
             "gradients there in its backward (and, with the optimizer fused into the backward, has applied "
             "them already), so .grad can be neither read nor changed. To clip, call "
             "torch.nn.utils.clip_grad_norm_ (its return value is the total norm); to scale gradients, scale "
             "the loss; to drop them, zero_grad()")


class GradInTierd(torch.Tensor):
    """An engine parameter's ``.grad`` once its block's backward moved the gradient into tierd: ``p.grad
    is not None`` holds, as after torch's backward, and any use raises, saying why.  It was None, so a
    loop that scales, clamps or adds noise to ``.grad``, or logs its norm, silently did nothing."""

    _tier_name = "?"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = next((a._tier_name for a in args if isinstance(a, GradInTierd)), cls._tier_name)
        raise RuntimeError(guards.foreign_optimizer(name) or GRAD_NOTE.format(name=name))


def grad_moved(param: torch.nn.Parameter, name: str) -> None:
    """``param``'s gradient went to tierd: its .grad becomes a GradInTierd (no memory: one element)."""
    with guards.direct():
        try:
            g = torch.Tensor._make_subclass(GradInTierd, torch.zeros(1, dtype=param.dtype,
                                                                     device=param.device).expand(param.shape))
            g._tier_name = name
            param.grad = g
        except RuntimeError:
            param.grad = None       # (not shaped as its data now: left as before)


ZERO_NOTE = ("parameter '{name}''s .grad holds the zeros zero_grad(set_to_none=False) left, and reads so; "
             "tier.torch keeps the gradients in tierd, not in .grad, so a change to .grad would be lost, and "
             "{op} is refused (nothing changed).  To scale gradients, scale the loss; to clip, call "
             "torch.nn.utils.clip_grad_norm_; zero_grad() and zero_() pass")

#: in-place ops a zeroed .grad lets through: they leave zeros zeros
_ZERO_KEEPS = {"zero_", "requires_grad_", "detach_"}
_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "__set__"}


class GradZeroed(torch.Tensor):
    """An engine parameter's ``.grad`` after ``zero_grad(set_to_none=False)`` where it had a gradient: torch
    leaves a tensor of zeros there, and so does this (the zeros broadcast from one element: no memory).
    It reads as those zeros (``p.grad is not None``, its norm, a copy); a change in place (``add_()``,
    ``mul_()``, ``p.grad[...] = ``), which torch.optim would apply and the engine would not see, is refused,
    saying why.  It was None, where torch's loop saw zeros (a ``p.grad is not None`` filter, a log of the
    gradients' norms after zeroing)."""

    _tier_name = "?"
    _tier_shape: tuple[int, ...] = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        op = getattr(func, "__name__", "")
        if op in _ZERO_KEEPS and args and isinstance(args[0], GradZeroed):
            return args[0]
        if op == "__set__" and len(args) == 2 and isinstance(args[0], GradZeroed) and _zero_of(args[1], args[0]):
            return None         # (Module._apply(), model.float(): .grad.data = the zeros converted; stays zeros)
        name = next((a._tier_name for a in tree_flatten((args, kwargs))[0] if isinstance(a, GradZeroed)),
                    cls._tier_name)
        # what an op changes: out=, or an in-place op's first argument; another tensor's change reading .grad
        # (buf.copy_(p.grad), ema.add_(p.grad)) reads the zeros, as a read
        out = (kwargs or {}).get("out")
        written = out if out is not None else args[0] if args and (
            op in _INPLACE_DUNDERS or op.endswith("_") and not op.endswith("__")) else None
        if any(isinstance(t, GradZeroed) for t in tree_flatten(written)[0]):
            raise RuntimeError(guards.foreign_optimizer(name) or ZERO_NOTE.format(name=name, op=f"{op}()"))
        with torch._C.DisableTorchFunction():
            made: list[torch.Tensor] = []
            args, kwargs = tree_map(lambda a: _zeros(a, made), (args, kwargs or {}))
            result = func(*args, **kwargs)
            if op == "numpy":       # (an array over the zeros made for this read: a write there would be lost)
                result.flags.writeable = False
            return tree_map(lambda r: _stand_in(r, made, name), result)


def _stand_in(r: Any, made: list[torch.Tensor], name: str) -> Any:
    """``r``, or where it is a view of zeros ``made`` for a GradZeroed (``.data``, ``detach()``, ``[i]``,
    ``view()``: torch's share the gradient's memory) a GradZeroed of its shape: a change in place through
    it (``p.grad.data.fill_(1)``, ``p.grad.data[0] = 1``) is refused as one of ``.grad`` itself is, where
    it changed those zeros, made for the call, and was lost silently.  With torch functions off."""
    if not isinstance(r, torch.Tensor) or not any(r.data_ptr() == z.data_ptr() for z in made):
        return r
    g = torch.Tensor._make_subclass(GradZeroed, r)
    g._tier_name, g._tier_shape = name, tuple(r.shape)
    return g


def _zero_of(v: Any, g: "GradZeroed") -> bool:
    """``v`` is zeros of the shape ``g`` stands for."""
    with torch._C.DisableTorchFunction():
        return isinstance(v, torch.Tensor) and tuple(v.shape) == g._tier_shape and not bool(v.any())


def _zeros(a: Any, made: list[torch.Tensor]) -> Any:
    """``a``, or for a GradZeroed (shaped as the parameter's placeholder: its .grad must be) the zeros it
    stands for, shaped as the parameter (one element, broadcast), noted in ``made``.  With torch functions
    off.  Taken anywhere in a call's arguments (``torch.cat(tensors=[p.grad])``: the placeholder's empty
    shape was concatenated, silently)."""
    if not isinstance(a, GradZeroed):
        return a
    z = torch.zeros((), dtype=a.dtype, device=a.device)
    made.append(z)
    return z.expand(a._tier_shape)


def grads_zeroed(eng: Any) -> None:
    """zero_grad(set_to_none=False) with no forward open: each parameter that had a gradient since the last
    set_to_none (Slot.had_grad: torch's .grad is a tensor from then on) and has no .grad now gets a
    GradZeroed, as torch's zero_grad() leaves zeros in it.  The next forward with gradients drops it (autograd
    would accumulate into it), as the gradients start afresh from zeros there anyway."""
    if eng._micro:
        return
    with guards.direct():
        for b in eng.blocks:
            for sl in b.slots:
                if sl.had_grad and sl.param.grad is None:
                    try:
                        g = torch.Tensor._make_subclass(GradZeroed, torch.zeros(
                            (), dtype=sl.param.dtype, device=sl.param.device).expand(sl.param.shape))
                        g._tier_name, g._tier_shape = sl.name, tuple(sl.shape)
                        sl.param.grad = g
                    except RuntimeError:
                        pass        # (not shaped as its data now: left None)


def drop_moved_grads(eng: Any) -> None:
    """Before autograd accumulates into .grad again (a forward with gradients), or at zero_grad()."""
    with guards.direct():
        for b in eng.blocks:
            for sl in b.slots:
                if type(sl.param.grad) in (GradInTierd, GradZeroed):
                    sl.param.grad = None
