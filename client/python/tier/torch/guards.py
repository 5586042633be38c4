# SPDX-License-Identifier: MIT
"""tier.torch.guards: what may come while a backward has not ended.

autograd tells the engine a backward ended with a callback queued at its start
(``Offload._backward_ended``); a backward that raises (a tensor hook, a NaN
check, out of memory) never calls it, so the engine stays "in a backward".
What comes next is either inside a backward (autograd runs hooks with
gradients off) or after one that raised:

* fused, with an optimizer phase already run, the step is partly applied
  (the blocks whose backward ended were updated, the others not) and cannot
  be undone: everything is refused, naming those blocks and what to do;
* otherwise nothing of the model changed: ``zero_grad()`` drops the partial
  gradients and the step (as torch's loop would skip it), and what else comes
  first is refused, saying so.
"""

from __future__ import annotations

import collections
import functools
import sys
import weakref
from typing import Any

import torch

from . import convert, gradcall, optim

FUSED_NOTE = ("tier.torch ran this step's optimizer inside the backward (fused: the first step had one forward and "
              "backward, no clip_grad_norm_ and no step(closure), or optimizer_in_backward=True), so")


def check_backward(eng: Any, what: str) -> None:
    """``what`` (an engine call, a forward) comes while a backward has not ended: refused, or (zero_grad())
    the engine leaves the backward that raised.  And refused once the engine is closed."""
    if eng._closed:
        raise RuntimeError(f"{what} on a closed Offload engine: close() gave the model its parameters back "
                           "and dropped the engine's gradients and optimizer state; make a new engine to train "
                           "through tierd, or a torch.optim optimizer to train the model as it is")
    if not eng._in_backward:
        return
    if not torch.is_grad_enabled():     # (autograd runs hooks with gradients off: inside a backward)
        raise RuntimeError(f"{what} during a backward pass")
    if eng._applied:
        raise RuntimeError(f"{what} after a backward that raised: {FUSED_NOTE} the blocks whose backward had "
                           f"ended were updated ({', '.join(eng._stepped) or 'none'}), the others not: this step "
                           "is partly applied and cannot be undone; load a checkpoint saved before it (the "
                           "model's and the engine's state dicts, or resume=True's last commit) into a new engine")
    if what != "zero_grad()":
        raise RuntimeError(f"{what} after a backward that raised: no parameter changed, but its gradients are "
                           "partial; call zero_grad() to drop them (the step is skipped), then go on")
    eng._in_backward = False
    if eng._bwd is not None:
        eng._point(eng._bwd, False)
        eng._bwd = None


def check_sparse_grads(eng: Any, b: Any) -> None:
    """``b``'s gradients are complete, before any goes into tierd: a sparse one (the functional
    ``F.embedding(..., sparse=True)``; an nn.Embedding with sparse=True is refused at Offload()) cannot be
    added into the block's dense gradients there, and failed in torch's words ("copy_() between dense and
    sparse Tensors"), raised from autograd's end-of-backward callback, which left the engine as if that
    backward had ended.  Refused, naming the parameter and what state the step is in; the engine stays in
    a backward that raised (check_backward()), so what comes next is refused or dropped as after one."""
    with direct():
        s = next((s for s in b.slots if s.param.grad is not None and s.param.grad.layout != torch.strided), None)
        layout = s.param.grad.layout if s is not None else None
    if s is None:
        return
    eng._in_backward = True
    what = (f"a {layout} gradient of parameter {s.name} ({b.label}; the functional F.embedding(..., sparse=True)?): "
            "tier.torch keeps every gradient dense in tierd and cannot add a sparse one there (nor does AdamW "
            "take one); compute it dense (sparse=False), ")
    if eng._applied:
        raise RuntimeError(f"{what}then: {FUSED_NOTE} the blocks whose backward had ended were updated "
                           f"({', '.join(eng._stepped) or 'none'}), the others not: this step is partly applied and "
                           "cannot be undone; load a checkpoint saved before it (the model's and the engine's state "
                           "dicts, or resume=True's last commit) into a new engine")
    raise RuntimeError(f"{what}then call zero_grad() to drop this step's partial gradients (nothing was applied; "
                       "the step is skipped), and run it again")


def partly_applied(eng: Any) -> bool:
    """Fused, a backward raised after some blocks' optimizer phases ran (close() gives such a model back)."""
    return eng._in_backward and eng._applied


def drop_failed_forward(eng: Any) -> None:
    """The last forward with gradients raised (a bad batch skipped, out of memory): it did not
    happen; its micro-batch (and, tracing, its phases) are the next forward's again."""
    if eng._fwd_open is not None:
        if eng._in_block is not None:
            eng._point(eng._in_block, False)
            eng._in_block = None
        eng._micro -= 1
        del eng.tracer.seq[eng._fwd_open:]
        eng._fwd_open = None


def keep_forwards(eng: Any) -> bool:
    """zero_grad() with forwards with gradients of this step open: kept (True) where no backward of the step
    began yet, as in torch 1.13's quickstart (``pred = model(X); loss = loss_fn(pred, y);
    optimizer.zero_grad(); loss.backward()``), where zero_grad() only clears .grad.  Their backward then
    runs as usual; the next forward with gradients, or step(), without it drops them (the step skipped,
    as torch's loop skips it).  Where a backward of the step began (it ran, or raised, or was refused),
    the step is dropped at once: its gradients in tierd cannot be dropped while the plan's later
    micro-batches go on adding to them."""
    keep = eng._backwards == 0 and not eng._bwd_tried
    eng._zero_kept = keep
    return keep


def note_dropped_forward(eng: Any) -> None:
    """zero_grad() drops the step while its last forward awaits its backward (one of an earlier micro-batch
    ran): that backward is refused in words (check_one_forward), where torch would start afresh from it."""
    if eng._micro > eng._backwards and not eng._bwd_tried:
        eng._fwd_dropped = True


def check_one_forward(eng: Any) -> None:
    """A backward begins: it must be the backward of one forward with gradients, the last (tier.torch pairs
    them, micro-batch by micro-batch).  Refused before any block's backward runs, with the likely cause:
    it used to fail inside the backward with a message about blocks run twice or parameters out of phase."""
    gradcall.check_backward(eng)        # (autograd.grad(), backward(inputs=) of no parameter: nothing noted)
    eng._bwd_tried = True
    check_kept_grads(eng)
    if eng._mode == "fused":
        optim.check_groups(eng)     # (changed since the forward: this backward runs the updates)
    if eng._fwd_dropped and eng._micro == 0:
        raise RuntimeError("backward() after zero_grad() dropped this step, between this forward and its backward: "
                           "plain PyTorch would keep the forward and start the gradients afresh from this backward; "
                           "tier.torch keeps a forward across zero_grad() only while no backward of the step ran "
                           "(the quickstart's order: forward, zero_grad(), backward(), step()), and here an earlier "
                           "micro-batch's had (its gradients are summed in tierd), so zero_grad() skipped the step, "
                           "this forward with it. Nothing was applied: call zero_grad() before the step's first "
                           "forward, and run the step again")
    pending = eng._micro - eng._backwards
    if pending > 1:
        raise RuntimeError(f"backward() with {pending} forwards of this step not yet backpropagated: tier.torch "
                           "pairs each forward that records gradients with one backward; for a loss over "
                           "several forwards (Siamese, contrastive) run the model once on the inputs "
                           "concatenated (torch.cat), and run an evaluation forward under torch.no_grad()")
    if pending < 1:
        raise RuntimeError("a second backward over the same forward (backward(retain_graph=True) twice): "
                           "tier.torch runs one backward per forward; compute the loss once and call backward() "
                           "once, or run the forward again for the second backward")
    eng._zero_kept = False      # (the forward a zero_grad() kept open is backpropagated)


def note_mapped_write(eng: Any, s: Any) -> None:
    """``s``'s parameter leaves its mapped copy (its block's forward or backward ended): changed in place
    there (under torch.no_grad(), in a hook), the change went into a copy tierd maps for reading only, which
    the phase leaves unwritten, and was lost.  Kept to be refused by the next check_params(), as autograd may
    be calling (a backward hook)."""
    if s.map_version >= 0 and s.param._version != s.map_version:
        eng.__dict__.setdefault("_mapped_writes", []).append(s.name)
    s.map_version = -1


def check_params(eng: Any, what: str) -> None:
    """Outside its phases a parameter is an empty placeholder and its values are in tierd: a change in
    place to it (weight clipping, nn.init) changed nothing, and a conversion past convert.py's refusal only
    the placeholder, the engine going on in the layout it made.  Refused, naming the parameter, where
    they were lost silently; a change in place is said once.  So is a write into a tensor a
    model.state_dict() gave (check_given())."""
    check_given(eng, what)
    written = eng.__dict__.pop("_mapped_writes", None)
    if written:
        raise RuntimeError(
            f"{what}: parameter {written[0]}{f' (and {len(written) - 1} more)' if len(written) > 1 else ''} was "
            "changed in place inside its block's forward or backward (under torch.no_grad(), in a hook): tier.torch "
            "maps parameters there from a copy in tierd that those phases only read, so the change was not kept "
            "(it may be seen until tierd drops that copy: its value is undefined now); change parameters through "
            "model.load_state_dict(), or before making the engine")
    mapped = {id(s) for b in (eng._bwd, eng._in_block) if b is not None for owner in eng.param_owners(b)
              for s in (owner.slots if owner is b else b.shared)}
    with direct():
        _check_placeholders(eng, what, mapped)


def _check_placeholders(eng: Any, what: str, mapped: set[int]) -> None:
    for b in eng.blocks:
        for s in b.slots:
            p = s.param
            if s.ph_version == -2 and p.data.numel() == 0:
                s.ph_version = p._version       # a load_state_dict() copied into the placeholder
            if s.ph_version < 0 or id(s) in mapped:
                continue
            if p.dtype != s.dtype or p.device != eng.device_here:      # (cuda:0, not eng.device's cuda)
                raise RuntimeError(
                    f"{what}: parameter {s.name} is {p.dtype} on {p.device} now, {s.dtype} on {eng.device_here} when "
                    "the tier.torch engine was made, which laid out its values, gradients and optimizer state "
                    "in tierd then (a conversion after it, model.double(), .half() or .to(), changed only the "
                    "empty placeholder): convert the model before making the engine, or close() the engine "
                    "(the model gets its values back), convert, and make a new one")
            if p._version != s.ph_version or p.data.numel() != 0:
                # (set_(), which torch 1.13 binds without __torch_function__, is seen here only)
                set_ = "" if p.data.numel() != 0 else (
                    "  Or p.set_() was called: parametrize.register_parametrization() (orthogonal()) calls "
                    "p.set_(p) before its refusal, which changed nothing (go on)")
                for ss in (ss for bb in eng.blocks for ss in bb.slots if id(ss) not in mapped):
                    eng._unmap(ss)      # (what was assigned goes: the placeholder again)
                raise RuntimeError(
                    f"{what}: parameter {s.name} was changed in place outside the model's forward (weight "
                    "clipping, nn.init, p.data assigned), where tier.torch keeps its values in tierd and the "
                    "model only an empty placeholder: the change was lost.  Change parameters before making "
                    f"the engine, or through model.load_state_dict() (written into tierd).{set_}")


#: the getter and setter of ``Tensor.data``, as __torch_function__ is handed them
_DATA_GET = torch._C._TensorBase.data.__get__
_DATA_SET = torch._C._TensorBase.data.__set__
_WATCHED: dict[type, type] = {}     # a parameter class: its subclass that watches .data (watch_data())


def _watching(cls: type) -> type:
    """``cls`` (torch.nn.Parameter, or a subclass) with ``.data`` giving ``detach()``, which shares the
    parameter's version counter; the rest as ``cls`` does it."""
    sub = _WATCHED.get(cls)
    if sub is None:
        base = cls.__torch_function__

        plain = base is torch._C._disabled_torch_function_impl      # (Parameter's: torch's own ops)

        def tf(k: type, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func == _DATA_GET:
                with torch._C.DisableTorchFunction():
                    return _marked(args[0].detach(), args[0])
            mark = False
            if func in _SHAPED:
                real = _shaped(args[0])
                if real is not None:
                    with torch._C.DisableTorchFunction():
                        return func(real, *args[1:], **(kwargs or {}))
            if func == _DATA_SET:
                check_data_set(args[0], args[1])
            elif func in _GRAD_SET:
                check_grad_set(args[0], args[1])
            elif func not in _METADATA and not _reads_nothing(func, args):
                with torch._C.DisableTorchFunction():
                    mark = check_reads(func, args, kwargs)
                if type(mark) is int:
                    return mark             # (numel() of a placeholder: its parameter's)
            if not plain:
                # (as its own: torch's default answers NotImplemented for a type not a base of its class)
                ret = base(func, tuple(getattr(t, "_tier_watched", None) or t for t in types), args, kwargs)
            else:
                with torch._C.DisableTorchFunction():
                    ret = func(*args, **(kwargs or {}))
            if mark:
                with torch._C.DisableTorchFunction():
                    ret = _marked(ret, args[0])
            return ret

        sub = type(cls.__name__, (cls,), {"__torch_function__": classmethod(tf), "__slots__": (),
                                          "__module__": cls.__module__, "_tier_watched": cls})
        _WATCHED[cls] = sub
    return sub


def _slot_of(p: torch.Tensor) -> Any:
    """The slot of the open engine that holds ``p``, or None."""
    ref = _OWNERS.get(id(p))
    eng = ref() if ref is not None else None
    hit = eng.slot_of.get(id(p)) if eng is not None and not eng._closed else None
    return hit[1] if hit is not None and hit[1].param is p else None


def check_data_set(p: torch.Tensor, value: Any) -> None:
    """``p.data = value`` on a parameter the engine holds: its values are in tierd, and the assignment
    changed only the placeholder (or the copy a phase maps for reading), so nothing the engine trains;
    torch.nn.utils.vector_to_parameters() assigns each parameter its slice of the vector so, and an empty
    placeholder took an empty slice: the model was left as it was, silently.  Refused before anything
    changes.  What is let through: the parameter itself (``model.float()``, ``.cpu()``, ``.to()`` that
    change nothing assign it), its own data (``p.data = p.data.to(device)``, ``p.detach()``: the same
    storage, offset, sizes and strides, ``is_set_to()``, so nothing changes), and a conversion (another
    dtype or device), refused by check_params() at the next forward, step() or model.state_dict() with
    what to do."""
    s = _slot_of(p)
    if s is None or value is p:
        return
    with direct():
        same = isinstance(value, torch.Tensor) and value.dtype == p.dtype and value.device == p.device
        if same and value.is_set_to(p):
            return
    if not same:
        return
    raise RuntimeError(f"p.data = ... on parameter {s.name}, whose values the tier.torch engine keeps in tierd (the "
                       "model holds an empty placeholder outside its block's phases): the assignment would reach "
                       "nothing the engine trains (torch.nn.utils.vector_to_parameters() assigns so); nothing "
                       "changed.  Load values with model.load_state_dict() (written into tierd), or assign them "
                       "before making the engine, or after close() (the model gets its values back)")


def check_grad_set(p: torch.Tensor, value: Any) -> None:
    """``p.grad = value`` (or ``p._grad =``) on a parameter the engine holds, outside its block's phases:
    torch compares the gradient's size with the empty placeholder's, so ``torch.zeros(0)`` passed, and
    autograd failed to add the next backward's gradient into it, partway through that backward (and a
    gradient of the parameter's shape was refused in torch's words, "of a different size").  The engine
    takes each block's gradients from ``.grad`` in its backward and moves them into tierd: a gradient set
    outside it has no meaning there.  Refused before anything changes; ``None`` (zero_grad(set_to_none=True))
    and ``.grad`` its own value again pass, and so does any value inside the block's phases (its parameters
    mapped), as torch's."""
    if value is None:
        return
    with direct():
        name = _placeholder_name(p)
        if name is None or value is p.grad:
            return
    raise RuntimeError(f"p.grad = ... on parameter {name} outside its block's forward or backward: the tier.torch "
                       "engine takes each block's gradients from .grad in its backward and moves them into tierd "
                       "(the model holds an empty placeholder outside), so a gradient set here would not be used, "
                       "and autograd would fail adding the next backward's into it; nothing changed.  To scale or "
                       "change gradients, scale the loss or register a hook on the parameter (p.register_hook(), "
                       "run in the backward); to clip, torch.nn.utils.clip_grad_norm_; to drop them, zero_grad() "
                       "(or p.grad = None)")


_T = torch.Tensor
#: what passes on a placeholder: its metadata (shape, dtype, device; attributes but the views among
#: them, .T, .real), its autograd bookkeeping (hooks, requires_grad), identity (hash), printing, and
#: tensors made from its dtype and device only (new_zeros())
_METADATA = frozenset(
    [getattr(_T, n).__get__ for n in dir(torch._C._TensorBase)
     if type(getattr(torch._C._TensorBase, n)).__name__ == "getset_descriptor"
     and n not in ("T", "H", "mT", "mH", "real", "imag", "data", "__dict__")] +
    [getattr(_T, n).__set__ for n in ("grad", "_grad", "requires_grad", "retains_grad", "names")] +
    [getattr(_T, n) for n in (
        "size", "dim", "ndimension", "stride", "storage_offset", "element_size", "is_contiguous",
        "is_floating_point", "is_complex", "is_signed", "is_inference", "get_device", "data_ptr", "is_pinned",
        "is_shared", "has_names", "__hash__", "__repr__", "__format__", "__len__", "__dir__", "register_hook",
        "retain_grad", "requires_grad_", "_is_view", "new_empty", "new_zeros", "new_ones", "new_full",
        "new_tensor", "__setstate__", "is_conj", "is_neg")] + [torch._has_compatible_shallow_copy_type] +  # (_apply())
    # (and as torch's functions: torch.is_floating_point(p) read the dtype before the engine and after it alike)
    [torch.is_floating_point, torch.is_complex, torch.is_conj, torch.is_neg, torch.is_inference])
#: what passes on a placeholder and gives a placeholder (marked): a conversion (Module._apply(), a move to a
#: device: refused at the next step by check_params() when it changes the parameter) or ``detach()``
#: (model.state_dict() detaches each, then takes the values from tierd)
_CONVERSIONS = frozenset(getattr(_T, n) for n in (
    "to", "cuda", "cpu", "type", "float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte",
    "bool", "detach", "share_memory_", "pin_memory", "contiguous"))
_COPY = _T.copy_
_GRAD_SET = frozenset((_T.grad.__set__, _T._grad.__set__))     # (check_grad_set(); metadata otherwise)
#: what a placeholder answers as its parameter (a meta tensor of its shape answers, _shaped()), as numel()
#: does: code sizing tensors of its own from a parameter (``p.new_zeros(p.shape)``, HF's
#: ``get_input_embeddings().weight.shape[0]``, a model summary) gets the parameter's; what would compute on
#: the placeholder (``p.view(p.shape)``, ``torch.zeros_like(p)``) stays refused
_SHAPED = frozenset([_T.shape.__get__, _T.ndim.__get__, _T.names.__get__] +
                    [getattr(_T, n) for n in ("size", "dim", "ndimension", "stride", "__len__", "is_contiguous")])
_FORMATS = (torch.channels_last, torch.channels_last_3d)
#: a Placeholder is made as a view of the empty tensor (as_subclass()), which ``_base`` gave, unguarded,
#: where the parameter's ``detach()``, ``.data`` and conversions are no view: answered as theirs
_NOT_A_VIEW = {_T._base.__get__: None, _T._is_view: False}
_COUNT = frozenset((_T.numel, _T.nelement, torch.numel))      # (sum(map(torch.numel, model.parameters())))
_VIEWS = frozenset((_T.view, _T.view_as))
_CUDA_ARRAY = _T.__cuda_array_interface__.__get__


def _reads_nothing(func: Any, args: Any) -> bool:
    """``func`` is the getter of ``__cuda_array_interface__`` (a property in Python), which raises before
    it reads anything where the tensor is not on a GPU (AttributeError: ``hasattr()`` False, as numba's, cupy's
    and HF's probes expect) or requires grad (torch's RuntimeError): torch's own answer, as for any parameter.
    Refused as a read of values, it made ``hasattr(p, "__cuda_array_interface__")`` raise."""
    if func != _CUDA_ARRAY:
        return False
    with torch._C.DisableTorchFunction():
        return not args[0].is_cuda or args[0].requires_grad


class Placeholder(torch.Tensor):
    """``p.detach()``, ``p.data`` (and their conversions) of an engine's parameter outside its block's
    phases: the empty placeholder, where the values are in tierd.  A plain tensor, an op reading it (an
    EMA's ``ema.add_(p.detach())``) computed on nothing, silently; as this class it is refused at once, as
    the parameter itself is (check_reads()).  Its shape (``size()``, ``dim()``, ``len()``: _SHAPED) and
    numel() are the parameter's, as the parameter's own are; ``_base`` is None, as the ``detach()``'s of a
    parameter with values."""

    _tier_of: str = "?"
    _tier_numel: int = 0
    _tier_shape: Any = None         # (the parameter's: torch.Size)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _NOT_A_VIEW and isinstance(args[0], Placeholder):
            return _NOT_A_VIEW[func]
        if func in _SHAPED:
            real = _shaped(args[0])
            if real is not None:
                with torch._C.DisableTorchFunction():
                    return func(real, *args[1:], **(kwargs or {}))
        if func not in _METADATA and func != _DATA_GET and not _reads_nothing(func, args):
            with torch._C.DisableTorchFunction():
                count = check_reads(func, args, kwargs)
            if type(count) is int:
                return count
        with torch._C.DisableTorchFunction():
            ret = func(*args, **(kwargs or {}))
            if func in _CONVERSIONS or func == _DATA_GET:
                ret = _marked(ret, args[0])
        return ret


def _placeholder_name(t: Any) -> str | None:
    """The name of the parameter whose empty placeholder ``t`` is (the parameter, or a Placeholder), or
    None.  With torch functions off."""
    if isinstance(t, Placeholder):
        return t._tier_of
    if getattr(type(t), "_tier_watched", None) is None or t.numel() != 0:
        return None
    s = _slot_of(t)
    return s.name if s is not None and s.numel != 0 else None


def _marked(ret: Any, src: Any) -> Any:
    """``ret``, made from ``src`` (a detach(), a conversion): a Placeholder where ``src`` is a placeholder."""
    if type(ret) is torch.Tensor and ret.numel() == 0:
        name = _placeholder_name(src)
        if name is not None:
            ret = ret.as_subclass(Placeholder)
            ret._tier_of, ret._tier_numel, ret._tier_shape = name, _count(src), _shape(src)
    return ret


def handed(ph: torch.Tensor, s: Any) -> torch.Tensor:
    """``ph``, the empty tensor model.load_state_dict()'s pre-hook hands torch for ``s``'s parameter to
    copy, shaped (in what it answers) as the parameter: torch compares their shapes first."""
    ret = ph.as_subclass(Placeholder)
    ret._tier_of, ret._tier_numel, ret._tier_shape = s.name, s.numel, s.shape
    return ret


def _shape(p: Any) -> Any:
    """The shape of the parameter whose placeholder ``p`` is (torch functions off)."""
    if isinstance(p, Placeholder):
        return p._tier_shape
    s = _slot_of(p)
    return s.shape if s is not None else None


@functools.lru_cache(maxsize=256)
def _meta(shape: tuple[int, ...]) -> torch.Tensor:
    """A contiguous tensor of ``shape`` without memory (as the engine maps a parameter), to answer for it."""
    with torch._C.DisableTorchFunction():
        return torch.empty(shape, device="meta")


def _shaped(t: Any) -> torch.Tensor | None:
    """For ``t``, an engine's parameter outside its phases (a zero-size one too) or a Placeholder of one:
    a meta tensor of the parameter's shape, which answers the shape queries of _SHAPED as the parameter
    would.  None for any other tensor (a mapped parameter: its own shape)."""
    with torch._C.DisableTorchFunction():
        if isinstance(t, Placeholder):
            shape = t._tier_shape
        elif isinstance(t, torch.Tensor) and getattr(type(t), "_tier_watched", None) is not None and t.numel() == 0:
            shape = _shape(t)
        else:
            return None
    return None if shape is None else _meta(tuple(shape))


def _count(p: Any) -> int:
    """The number of elements of the parameter whose placeholder ``p`` is (what torch's numel() gave before
    the engine: HF's Trainer counts parameters so)."""
    return p._tier_numel if isinstance(p, Placeholder) else _slot_of(p).numel


def check_reads(func: Any, args: Any, kwargs: Any) -> bool | int:
    """``func`` on ``args`` (torch functions off): where one of them is an engine's parameter outside its
    block's phases (or a Placeholder of one), the empty placeholder, and ``func`` would compute on it (a
    norm, a sum, clone(), reshape(), an EMA's add_()) or write into it (clamp_(), nn.init), refused before
    anything is computed: it computed on nothing, or the write was lost, silently.  True for a conversion
    or detach() of one (its result a Placeholder); a copy_() of what model.load_state_dict()'s pre-hook
    handed torch passes (the values went into tierd).  numel() of one: the parameter's (an int)."""
    name = None
    for a in args:
        if isinstance(a, torch.Tensor):
            name = _placeholder_name(a)
        elif type(a) in (list, tuple):
            name = next((n for n in map(_placeholder_name, (t for t in a if isinstance(t, torch.Tensor)))
                         if n is not None), None)
        if name is not None:
            break
    if name is None and kwargs:
        name = next((n for n in map(_placeholder_name, (t for t in kwargs.values() if isinstance(t, torch.Tensor)))
                     if n is not None), None)
    if name is None:
        return False
    own = bool(args) and _placeholder_name(args[0]) is not None
    if own and func in _CONVERSIONS:
        fmt = next((a for a in (*args[1:], *(kwargs or {}).values())
                    if isinstance(a, torch.memory_format) and a in _FORMATS), None)
        if fmt is not None:
            raise RuntimeError(_format_refusal(func, fmt, name))
        return True
    if own and func in _COUNT:
        return _count(args[0])
    if func == _COPY and len(args) > 1 and getattr(args[1], "_tier_handed_on", False):
        return False        # (state.HANDED: load_state_dict() wrote the values into tierd)
    raise RuntimeError(foreign_optimizer(name) or read_refusal(func, name, own))


def foreign_optimizer(name: str) -> str | None:
    """The words for a torch.optim optimizer other than an engine (a second one kept over ``model.parameters()``
    beside the engine) whose step() or zero_grad(), running now, touched parameter ``name`` (its placeholder,
    or its .grad in tierd), or None: the innermost optimizer method on the stack is an engine's, or one of an
    optimizer wrapping an engine (accelerate's AcceleratedOptimizer, whose step() reads the gradients for its
    GradScaler before it calls the engine's), or there is none holding an engine's parameters (a GAN's other
    optimizer, whose closure ran this model).  That optimizer was told its .grad is in tierd and to scale the
    loss, or that its update was weight clipping, where what is wrong is the optimizer.  Only on the way to a
    refusal (it walks the stack)."""
    from .clip import _engines
    from .engine import Offload

    engines = [e for e in list(_engines) if not e._closed]
    f = sys._getframe(1)
    while f is not None:
        me = f.f_locals.get("self") if f.f_code.co_argcount else None
        f_name = f.f_code.co_name
        f = f.f_back
        if not isinstance(me, torch.optim.Optimizer):
            continue
        if isinstance(me, Offload) or _wraps_engine(me, engines):
            return None
        if not _holds_engine_param(me, engines):
            continue
        return (f"{type(me).__name__}.{f_name}() on parameter {name}, which a tier.torch engine holds "
                "(its values, gradient and optimizer state are in tierd; the model holds an empty placeholder): "
                "this parameter belongs to the engine, which is the model's optimizer; give it to the engine's "
                "parameter groups (Offload(model, client, params=[{'params': [...], 'lr': ...}, ...]), "
                "optimizer='adamw' or 'sgd') and call the engine's step() and zero_grad() instead of this "
                f"optimizer's; no parameter of the engine changed")
    return None


def _wraps_engine(opt: Any, engines: list[Any]) -> bool:
    """``opt`` holds an engine as an attribute, or hands out an engine's parameter groups as its own."""
    from .engine import Offload

    if any(isinstance(v, Offload) for v in getattr(opt, "__dict__", {}).values()):
        return True
    try:
        groups = opt.param_groups
    except Exception:       # (a wrapper's property over what it holds: not an engine's, then)
        return False
    return any(groups is e.param_groups for e in engines)


def _holds_engine_param(opt: Any, engines: list[Any]) -> bool:
    """One of ``opt``'s parameter groups holds a parameter of an engine."""
    try:
        params = [p for g in opt.param_groups for p in g.get("params", ())]
    except Exception:
        return False
    return any(id(p) in e.slot_of for e in engines for p in params)


def _format_refusal(func: Any, fmt: Any, name: str, kept: str = "the parameter is unchanged") -> str:
    """A conversion of parameter ``name``'s placeholder to another memory format (model.to(memory_format=
    torch.channels_last) converts each parameter of four or five dimensions, as the placeholder answers)."""
    return (f"{getattr(func, '__name__', func)}(memory_format={fmt}) of parameter {name}, whose values the "
            "tier.torch engine keeps in tierd (the model holds an empty placeholder outside its block's phases): "
            "tier.torch maps every parameter contiguous in its block's phases, so another memory format cannot "
            "be kept (one given before making the engine is not kept either); convert the inputs only "
            f"(convolutions take contiguous weights with channels_last inputs); {kept}")


def read_refusal(func: Any, name: str, own: bool) -> str:
    """The words for ``func`` refused on parameter ``name``'s placeholder (``own``: as the tensor operated on)."""
    op = getattr(func, "__name__", str(func))
    if type(func).__name__ == "method-wrapper":        # (an attribute's __get__ or __set__: named by the attribute)
        owner = getattr(func, "__self__", None)
        attr = getattr(owner, "__name__", None) or getattr(getattr(owner, "fget", None), "__name__", "?")
        return _read_refusal(f"p.{attr} = ..." if op == "__set__" else f"p.{attr}", func, name, own and op == "__set__")
    return _read_refusal(f"{op}()", func, name, own and (op.endswith("_") and not op.endswith("__") or
                                                          op == "__setitem__"))


def _read_refusal(op: str, func: Any, name: str, write: bool) -> str:
    where = ("outside its block's forward or backward: the tier.torch engine keeps its values in tierd, and the "
             "model holds an empty placeholder there (no values: only its shape and numel() answer the "
             "parameter's), so")
    if func in _VIEWS:
        return (f"a view of parameter {name} (parameters_to_vector()? vector_to_parameters()?) {where} the view "
                "would be empty; read values from model.state_dict() (sd = model.state_dict(); parameters_to_vector("
                "sd[n] for n, _ in model.named_parameters())), and write them with model.load_state_dict(), or "
                "before making the engine, or after close(); nothing changed")
    if write:
        return (f"{op} on parameter {name} {where} the change would be lost (weight clipping, nn.init); nothing "
                "changed.  Change parameters through model.load_state_dict() (written into tierd), or before "
                "making the engine, or after close() (the model gets its values back)")
    return (f"{op} reading parameter {name} {where} it would compute on nothing; nothing of it was computed.  "
            "Read values from model.state_dict() (or engine.parameters_state_dict()), or inside the model's forward "
            "or a hook of the block's (where its values are mapped), or after close().  An EMA of the weights: "
            "update it from the state dict after step() (sd = model.state_dict(); ema[k].mul_(d).add_(sd[k], "
            "alpha=1 - d) for each k), not from model.parameters(); an op that ran before this one in the same "
            "statement (the mul_() of ema_p.mul_(d).add_(p.detach(), ...)) changed its tensor already: start "
            "that one again from model.state_dict()")


def watch_data(p: torch.Tensor) -> None:
    """``p`` is the engine's (placeholder or mapped copy): a change through ``p.data`` (WGAN's
    ``p.data.clamp_()``) is seen.  ``.data`` is a tensor with a version counter of its own, so the change
    did nothing to the placeholder, or went into the copy a phase only reads, and nothing saw it
    (check_params() and note_mapped_write() compare ``p._version``): training went on without it.  Its
    class becomes one whose ``.data`` is ``p.detach()``, counted in ``p._version``, until close()."""
    cls = type(p)
    if getattr(cls, "_tier_watched", None) is None:
        try:
            p.__class__ = _watching(cls)
        except TypeError:       # (a class whose layout differs: left as it was)
            pass


#: the engine's own reads and writes of its parameters' attributes (``.grad``, ``._version``, ``.dtype``,
#: ``.data =``), as torch does them for the parameter's own class: without the watching class's
#: ``__torch_function__``, through which every one of them passes otherwise, at twenty times the cost
#: (0.8 us a read, 0.04 us without; its loops walk every parameter, 28 reads each a step).  Only around
#: reads and writes of attributes (and ops on the engine's own plain tensors): ``.data`` read inside
#: is the parameter's data, not watch_data()'s ``detach()`` (a size is the same).
direct = torch._C.DisableTorchFunction


def unwatch_data(p: torch.Tensor) -> None:
    """``p`` gets its values back (close()): its own class back, before they are set."""
    orig = getattr(type(p), "_tier_watched", None)
    if orig is not None:
        p.__class__ = orig


_OWNERS: dict[int, Any] = {}    # id(parameter): a weak reference to the engine that laid it out


def claim_params(eng: Any) -> None:
    """The engine being made lays out these parameters: refused, before anything changes, when an engine
    still open laid out one of them (the same model made an engine twice, a notebook cell run again):
    the second laid out the first one's empty placeholders and failed inside the backward."""
    for pid, (b, s) in eng.slot_of.items():
        ref = _OWNERS.get(pid)
        other = ref() if ref is not None else None
        if other is not None and other is not eng and not other._closed and pid in other.slot_of and \
                other.slot_of[pid][1].param is s.param:
            raise ValueError(f"tier.torch: parameter {s.name} is laid out by another engine, still open ({other!r}): "
                             "close() that one first (the model gets its values back), then make this one")
    r = weakref.ref(eng)
    for pid in eng.slot_of:
        _OWNERS[pid] = r
    for m in eng.model.modules():
        if callable(getattr(type(m), "resize_token_embeddings", None)) and \
                "resize_token_embeddings" not in m.__dict__:
            m.__dict__["resize_token_embeddings"] = _refuse_resize(r, m)
    shaped = {pid: s.name for pid, (b, s) in eng.slot_of.items() if len(s.shape) in (4, 5)}
    for m in eng.model.modules() if shaped else ():
        name = next((shaped[id(p)] for p in m.parameters() if id(p) in shaped), None)
        if name is not None and "to" not in m.__dict__:
            m.__dict__["to"] = _refuse_format(r, m, name)
    for m in eng.model.modules():
        held_type = _HELD_TYPES.get(type(m.__dict__.get("_parameters")))
        if held_type is not None:
            held = held_type(m._parameters)
            held._tier_eng, held._tier_owner = r, type(m).__name__
            m.__dict__["_parameters"] = held
    convert.hold(eng)
    from . import swap      # (it imports this module)
    swap.hold(eng)


class HeldParams:
    """A module's ``_parameters`` while the engine ``_tier_eng`` (a weak reference) is open: what would
    remove one of the engine's parameters from it, replace it or register it under a second name is
    refused before it changes anything.  ``weight_norm()``, ``prune``'s methods and
    ``parametrize.register_parametrization()`` removed the parameter (``del module._parameters[name]``,
    ``delattr()``; prune registered it again as ``weight_orig`` first) before their first read of the empty
    placeholder was refused, leaving the module without it; ``m.weight = nn.Parameter(...)``,
    ``register_parameter()`` or ``_parameters[name] =`` replaced it silently, the engine training the
    old one in tierd and the model holding the new.  Every path of torch's Module goes through these
    methods; its reads (``__getattr__``, ``state_dict()``, ``named_parameters()``) are the dict's own.
    Of the type torch's Module gave it (``_plain``): an OrderedDict in torch 1.13, a dict in torch 2's
    later releases, whose own update() and ``|=`` would not call ``__setitem__``.  Once the engine is
    closed (or gone) a plain dict; release_params() gives the module one of torch's type back."""

    _tier_eng: Any = None
    _tier_owner = "?"
    _plain: type = dict

    def _check(self, key: Any, value: Any, removing: bool) -> None:
        eng = self._tier_eng() if self._tier_eng is not None else None
        if eng is None or eng._closed:
            return
        old = dict.get(self, key)
        s = _held_slot(eng, old)
        if s is not None and (removing or value is not old):
            _refuse_held(f"{'removing' if removing else 'replacing'} parameter {key} of {self._tier_owner}", s.name)
        s = None if removing or value is old else _held_slot(eng, value)
        if s is not None:
            _refuse_held(f"registering parameter {s.name} again, as {key} of {self._tier_owner},", s.name)
        if not removing and value is not old:
            from . import swap      # (it imports this module)
            swap.refuse_new(eng, self._tier_owner, key, value)
        if removing or value is not old:
            eng._model_changed = True   # (Hooks.root_pre looks for parameters that train from now on)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check(key, value, False)
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._check(key, None, True)
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._check(key, None, True)
        return super().pop(key, *default)

    def popitem(self, *args: Any, **kwargs: Any) -> Any:     # (OrderedDict's takes last=, dict's nothing)
        if self:
            last = kwargs.get("last", args[0] if args else True)
            self._check(next(reversed(self)) if last else next(iter(self)), None, True)
        return super().popitem(*args, **kwargs)

    def clear(self) -> None:
        for key in self:
            self._check(key, None, True)
        super().clear()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self._check(key, default, False)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Every item checked before the first is set (OrderedDict's set those before a refused one)."""
        items = list(dict(*args, **kwargs).items())
        for key, value in items:
            self._check(key, value, False)
        for key, value in items:
            self[key] = value

    def __ior__(self, other: Any) -> Any:
        self.update(other)
        return self

    def __reduce__(self) -> Any:     # (a copy, a pickle: torch's own dict, without the engine)
        return (self._plain, (list(self.items()),))


class _HeldOrderedDict(HeldParams, collections.OrderedDict):
    _plain = collections.OrderedDict


class _HeldDict(HeldParams, dict):
    _plain = dict


#: torch's type of a module's ``_parameters``: its HeldParams while an engine holds them
_HELD_TYPES: dict[type, type] = {collections.OrderedDict: _HeldOrderedDict, dict: _HeldDict}


def _held_slot(eng: Any, p: Any) -> Any:
    hit = eng.slot_of.get(id(p)) if p is not None else None
    return hit[1] if hit is not None and hit[1].param is p else None


def _refuse_held(what: str, name: str) -> None:
    raise RuntimeError(f"{what} while a tier.torch engine holds it ({name}; its values, "
                       "gradients and optimizer state are laid out in tierd, the module holds an empty placeholder "
                       "outside its block's phases): torch.nn.utils.weight_norm(), spectral_norm(), prune and "
                       "parametrize.register_parametrization() re-parametrize so, and a Parameter assigned over it "
                       "would train outside tierd while the engine trained the old one.  Apply them before making "
                       "the engine, or close() the engine (the model gets its values back), apply, and make a new "
                       "one; new values go in with model.load_state_dict(); nothing changed")


def _refuse_resize(r: Any, m: Any) -> Any:
    """Hugging Face's ``model.resize_token_embeddings(n)`` on a model whose engine ``r`` is open: it reads the
    embedding's size from its weight, the empty placeholder, and failed with "not enough values to unpack";
    had it gone on, it would have replaced a parameter whose values, gradients and optimizer state the engine
    laid out in tierd.  Refused before anything changes; once the engine is closed (or gone), HF's own."""
    def resize(*args: Any, **kwargs: Any) -> Any:
        eng = r()
        if eng is None or eng._closed:
            m.__dict__.pop("resize_token_embeddings", None)
            return m.resize_token_embeddings(*args, **kwargs)
        raise RuntimeError(f"resize_token_embeddings() on {type(m).__name__} while a tier.torch engine holds its "
                           "parameters (their values, gradients and optimizer state are laid out in tierd for the "
                           "embedding's size when the engine was made; the model holds empty placeholders): resize "
                           "the embeddings before making the engine, or close() the engine (the model gets its "
                           "values back), resize, and make a new one; nothing changed")
    return resize


def _refuse_format(r: Any, m: Any, name: str) -> Any:
    """``m.to(..., memory_format=torch.channels_last)`` on a module holding parameter ``name`` (of four or five
    dimensions) of the open engine ``r``: Module.to() converts each parameter and buffer in turn, and only
    the first of four or five dimensions was refused (check_reads()), after those before it (another dtype or
    device given too: ``model.to(torch.bfloat16, memory_format=...)``, a BatchNorm's running statistics)
    were converted, where the refusal said nothing changed.  Refused before Module.to() runs; once the engine
    is closed (or gone), the module's own."""
    def to(*args: Any, **kwargs: Any) -> Any:
        eng = r()
        if eng is None or eng._closed:
            m.__dict__.pop("to", None)
        else:
            fmt = torch._C._nn._parse_to(*args, **kwargs)[3]
            if fmt in _FORMATS:
                raise RuntimeError(_format_refusal(_T.to, fmt, name, "nothing of the model changed"))
        return type(m).to(m, *args, **kwargs)
    return to


def release_params(eng: Any) -> None:
    """The engine lets its parameters go (close()): and the .grad that stood for a gradient in tierd
    becomes None (that gradient goes with the engine), as after zero_grad(set_to_none=True); it was left a
    one-element stand-in, into which the model's next backward failed to accumulate ("more than one element
    of the written-to tensor refers to a single memory location")."""
    from .clip import drop_moved_grads

    drop_moved_grads(eng)
    convert.release(eng)
    from . import swap
    swap.release(eng)
    for m in eng.model.modules():
        if getattr(m.__dict__.get("resize_token_embeddings"), "__qualname__", "").startswith("_refuse_resize"):
            del m.__dict__["resize_token_embeddings"]
        if getattr(m.__dict__.get("to"), "__qualname__", "").startswith("_refuse_format"):
            del m.__dict__["to"]
        held = m.__dict__.get("_parameters")
        if type(held) in _HELD_TYPES.values() and held._tier_eng is not None and held._tier_eng() in (eng, None):
            m.__dict__["_parameters"] = held._plain(held)
    for pid in eng.slot_of:
        ref = _OWNERS.get(pid)
        if ref is not None and ref() in (eng, None):
            del _OWNERS[pid]


def check_in_forward(eng: Any, b: Any) -> None:
    """A block's forward with gradients on must be part of the model's (its hooks follow the step): one
    called on its own was refused only in the backward, as "a second backward over the same forward"."""
    if torch.is_grad_enabled() and eng._fwd_open is None:
        raise RuntimeError(f"{b.label} was called outside the model's forward, with gradients on: tier.torch "
                           "follows a training step through the forward of the model it was made with; call "
                           "that model, make the engine on the module you call, or call the block under "
                           "torch.no_grad()")


# ---- what torch keeps between steps, and tier.torch does not ----------------------------------

def _last_steps_grads(eng: Any) -> list[str]:
    """The parameters whose .grad still stands for a gradient moved into tierd (GradInTierd)."""
    from .clip import GradInTierd

    with direct():
        return [s.name for b in eng.blocks for s in b.slots if type(s.param.grad) is GradInTierd]


def check_step_again(eng: Any) -> None:
    """step() with no backward since the last step(): torch.optim would apply the gradients .grad still
    holds (the last step's, no zero_grad() between) a second time; tier.torch kept none and applied
    nothing, silently.  Refused before anything changes."""
    if eng._got or eng._bwd is not None or eng._backwards:
        return
    names = _last_steps_grads(eng)
    if names:
        raise RuntimeError(f"step() again with no backward() since the last step(): torch.optim would apply the "
                           f"last step's gradients, still in .grad ({names[0]} and {len(names) - 1} more), a "
                           "second time; tier.torch does not keep a step's gradients past its step(). Call "
                           "backward() before each step(), or zero_grad() first (then step() does what torch's "
                           "does with zeroed gradients); nothing changed")


def note_kept_grads(eng: Any) -> None:
    """A step's first forward with gradients, before autograd may accumulate into .grad: the parameters
    whose .grad still stands for the last step's gradient (no zero_grad() since that step(), nor .grad set
    to None by hand), kept until zero_grad() for check_kept_grads()."""
    if eng._micro == 0 and not eng._kept_grads:
        eng._kept_grads = _last_steps_grads(eng)


def check_kept_grads(eng: Any) -> None:
    """A backward begins while the last step's gradients were never zeroed: torch would add this step's
    gradients to them (they are still in .grad); tier.torch keeps none past step(), and would start from
    zero, silently training otherwise.  Refused before any gradient or update changes."""
    names = eng._kept_grads
    if names:
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        raise RuntimeError(f"backward() with no zero_grad() since the last step(): plain PyTorch would add this "
                           f"step's gradients to the last step's, still in .grad ({names[0]}{more}); tier.torch "
                           "does not keep a step's gradients past its step(), so it would train differently. Call "
                           "optimizer.zero_grad() (or model.zero_grad()) once every step, before its first "
                           "backward (at the top or the bottom of the loop); to accumulate gradients, run several "
                           "backward() before one step(). Nothing was applied: zero_grad() now drops this step's "
                           "forward, then run it again")


def refuse_second_forward(eng: Any) -> None:
    """A second forward with gradients in a step whose optimizer runs inside the backward (fused)."""
    if not eng._applied and eng._backwards == 0:
        raise RuntimeError("a second forward with gradients before step(), the first one's output not "
                           "backpropagated (an evaluation with gradients on?): tier.torch pairs each forward "
                           "that records gradients with one backward, and nothing was applied yet; call "
                           "zero_grad() to drop the first forward and go on, and run evaluations under "
                           "torch.no_grad()")
    raise RuntimeError(
        "a second forward with gradients before step(): tier.torch runs the optimizer inside the backward "
        "(optimizer_in_backward=True, or a first step of one forward and backward, no clip_grad_norm_ and no "
        "step(closure)), and this step's update was applied already, from the first micro-batch's gradients "
        "alone; call step() to go on (that update stands, as torch's with one micro-batch would), and to "
        "accumulate make the engine with optimizer_in_backward=False (or accumulate from the first step on)")


# ---- model.state_dict()'s tensors: copies, not the parameters ---------------------------------

def note_given(eng: Any, key: str, t: torch.Tensor) -> None:
    """model.state_dict() gives ``t`` for ``key``: a copy of the parameter, not the parameter itself.  Its
    entry goes with it (a weakref's callback): no pass over the others (every 64th note went over all the
    live ones, quadratic in a state dict's parameters)."""
    given = eng.__dict__.setdefault("_given", {})
    n = eng.__dict__["_given_n"] = eng.__dict__.get("_given_n", 0) + 1
    given[n] = (weakref.ref(t, lambda _, given=given, n=n: given.pop(n, None)), t._version, key)


def check_given(eng: Any, what: str) -> None:
    """A tensor of a model.state_dict() written in place: in torch that is the parameter, changed; here it
    is a copy (the values live in tierd), and the write reached nothing.  Refused once, naming it."""
    given = eng.__dict__.get("_given")
    if not given:
        return
    for n, (ref, version, key) in given.copy().items():     # (a callback may drop one meanwhile)
        t = ref()
        if t is not None and t._version != version:
            del given[n]
            raise RuntimeError(f"{what}: {key} of a model.state_dict() was written in place; tier.torch's state "
                               "dict holds copies of the parameters (their values live in tierd), so the write "
                               "did not reach the model, where torch's would have: write parameters with "
                               "model.load_state_dict(), or clone() a state dict's tensors before changing them")
