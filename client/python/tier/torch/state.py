# SPDX-License-Identifier: MIT
"""tier.torch.state: checkpoints of a model whose state lives in tierd.

* ``model.state_dict()`` and ``model.load_state_dict()`` keep working on
  the real values: a state-dict hook on every module that holds a
  parameter of the engine's puts the values read from tierd in place of
  the empty placeholders, a block at a time; a load pre-hook writes the
  given values into tierd (checked first: the wrong shape is refused, as
  torch refuses it, and nothing of the engine's is written then) and hands
  torch empty tensors of the placeholders' shape to copy.
* The engine's ``state_dict()``/``load_state_dict()`` are torch.optim's
  format: ``{"state": {index: {"step": tensor, "exp_avg": ..., ...}},
  "param_groups": [...]}``, parameters numbered across the groups in order;
  a parameter kept in reduced precision also carries its float32 master
  weights (``"tier_master"``), which torch's optimizers do not have.
* ``save(path)`` and ``load(path)`` stream the same to a directory, one
  block per file (``meta.pt``, ``buffers.pt``, ``block-NNNN.pt``), so that a
  model larger than memory can be saved and loaded; a load is checked whole
  against ``meta.pt`` before anything is written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .. import HOST, READ, READ_WRITE, WRITE
from ..errors import LostError, RestartedError
from . import guards, optim, resume as resume_mod
from .layout import Block, Slot

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Offload

FORMAT = "tier.torch checkpoint"
VERSION = 1
MASTER = "tier_master"


# ---- the model's own state_dict() and load_state_dict() -------------------------------------

def _keys(module: torch.nn.Module, prefix: str, eng: "Offload") -> list[tuple[str, Block, Slot]]:
    """Every state-dict key of ``module``'s subtree (under ``prefix``) that names an engine's parameter."""
    out = []
    for mname, m in module.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            hit = eng.slot_of.get(id(p)) if p is not None else None
            if hit is not None:
                out.append((prefix + (mname + "." if mname else "") + pname, hit[0], hit[1]))
    return out


COPY_NOTE = ("a model offloaded by tier.torch cannot be copied or pickled whole (copy.deepcopy(model), "
             "AveragedModel(model), torch.save(model)): its parameters are in tierd, and the copy would hold "
             "empty placeholders and the engine's hooks; copy its values instead: model.state_dict() holds the "
             "real ones, load them into a model of your own (an EMA or best-so-far copy), or torch.save() them")

#: the engine's own (what the model reaches it through, its hooks, says COPY_NOTE first)
ENGINE_COPY_NOTE = ("a tier.torch engine cannot be copied or pickled (torch.save(engine), copy.deepcopy(engine)): "
                    "the optimizer's state is in tierd; save engine.state_dict() (torch.optim's format) or "
                    "engine.save(dir) instead. (torch 1.13's OneCycleLR keeps a method of itself, anneal_func, in "
                    "its state_dict(), which pickles the scheduler and the engine with it: drop that entry before "
                    "saving, sd = scheduler.state_dict(); sd.pop('anneal_func'); a OneCycleLR made the same way "
                    "keeps its own at load_state_dict())")


class Uncopyable:
    """The engine's objects a model refers to (its hooks): copying or pickling the model is refused with
    COPY_NOTE, before the copy reaches the engine."""

    def __deepcopy__(self, memo: dict) -> None:
        raise RuntimeError(COPY_NOTE)

    def __reduce_ex__(self, protocol: Any) -> None:
        raise RuntimeError(COPY_NOTE)


class ModelStateHooks(Uncopyable):
    """The engine's state-dict hooks on the model, and its zero_grad(); attach() once, detach() all."""

    def __init__(self, engine: "Offload") -> None:
        self.engine = engine
        self.handles: list[Any] = []
        self._cache: tuple[int, dict[int, torch.Tensor]] | None = None
        self._zero_grad = None

    def attach(self) -> None:
        e = self.engine
        for m in e.model.modules():
            # (the model's own too: its hook runs last in a whole model's state_dict() and ends the cache)
            if m is e.model or any(p is not None and id(p) in e.slot_of for p in m._parameters.values()):
                self.handles.append(m._register_state_dict_hook(self.state_dict_hook))
        for m in e.model.modules():
            self.handles.append(m._register_load_state_dict_pre_hook(self.load_pre_hook, with_module=True))
        # model.zero_grad() (what Hugging Face's Trainer calls) drops the engine's gradients too
        orig = e.model.zero_grad
        engine = e

        def zero_grad(set_to_none: bool = False) -> None:
            engine.zero_grad(set_to_none)       # (first: what it refuses changes nothing)
            orig(set_to_none)

        e.model.zero_grad = zero_grad
        self._zero_grad = zero_grad

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        m = self.engine.model
        if self._zero_grad is not None and m.__dict__.get("zero_grad") is self._zero_grad:
            del m.__dict__["zero_grad"]
        self._cache = None

    def forget(self) -> None:
        """The parameters may change (a forward, a step): what was read for state_dict() is stale."""
        self._cache = None

    def _values(self, b: Block) -> dict[int, torch.Tensor]:
        if self._cache is None or self._cache[0] != b.index:
            vals = read_params(self.engine, b, "reading its parameters for state_dict()")
            self._cache = (b.index, vals)
        return self._cache[1]

    def state_dict_hook(self, module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
        e = self.engine
        if e._closed:
            return
        e.check_idle("model.state_dict()")
        if module is e.model:
            guards.check_params(e, "model.state_dict()")
        for pname, p in module._parameters.items():
            hit = e.slot_of.get(id(p)) if p is not None else None
            if hit is not None and prefix + pname in state_dict:
                state_dict[prefix + pname] = self._values(hit[0])[id(hit[1])]
                guards.note_given(e, prefix + pname, state_dict[prefix + pname])
        if module is e.model:
            self._cache = None          # the end of a whole model's state_dict()

    def load_pre_hook(self, module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any,
                      strict: bool, missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        e = self.engine
        if e._closed:
            return
        todo: dict[int, tuple[Block, dict[int, torch.Tensor]]] = {}
        errors = []
        keys = [(k, b, s) for k, b, s in _keys(module, prefix, e) if k in state_dict]
        for key, b, s in keys:
            v = state_dict[key]
            if isinstance(v, torch.Tensor) and getattr(v, HANDED, False):
                continue                # handed on by a module above this one in this same load
            if not isinstance(v, torch.Tensor):
                errors.append(f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like '
                              f'object from checkpoint but received {type(v)}')
            elif _own_shape(v) != s.shape:
                with guards.direct():       # (a Placeholder, p.detach() taken outside its phases: empty)
                    empty = v.numel() == 0
                errors.append(f"size mismatch for {key}: copying a param with shape {_own_shape(v)} from checkpoint, "
                              f"the shape in current model is {s.shape}." +
                              (" (tier.torch: a copy of the parameter itself is empty outside its block's phases; "
                               "take model.state_dict(), which holds the real values)"
                               if empty and s.numel != 0 else ""))
            else:
                # torch's load copies into the parameter: cast to its dtype (a float32 checkpoint into a
                # bfloat16 model), as copy_() does, before anything is written
                todo.setdefault(b.index, (b, {}))[1][id(s)] = v.detach().to(dtype=s.dtype)
        for key, b, s in keys:
            ph = guards.handed(e._placeholder(s.param), s)  # what torch copies: nothing
            setattr(ph, HANDED, True)
            state_dict[key] = ph
            s.ph_version = -2           # (torch's copy_() into the placeholder: not a change of the user's)
        if errors:
            error_msgs.extend(errors)   # torch raises them; nothing of the engine's was written
            return
        if todo:
            e.check_idle("model.load_state_dict()")
        for b, vals in todo.values():
            write_params_keeping_masters(e, b, vals, "writing parameters given to load_state_dict()")
        self._cache = None


def _own_shape(v: torch.Tensor) -> torch.Size:
    """``v``'s own shape: a Placeholder (``p.detach()`` taken outside its block's phases) answers its
    parameter's, and holds nothing."""
    with guards.direct():
        return v.shape


#: a placeholder load_pre_hook() put in a state dict for the modules below to skip (not a user's empty tensor)
HANDED = "_tier_handed_on"


def create_tensors(eng: "Offload") -> None:
    """The engine's tensors in tierd, the model's parameters written into them (or, resuming, the
    job's last commit): then the parameters are placeholders.  A failure (a quota, no room) leaves the
    model its parameters and drops the tensors made here (a retry used to lay out the placeholders,
    and destroy the tensors holding the only copy of the weights as an earlier run's)."""
    if eng.resume and resume_mod.try_resume(eng):
        # the job's tensors hold the model now (its last commit): nothing is written
        eng.resumed = True
        for b in eng.blocks:
            for s in b.slots:
                eng._unmap(s)
        return
    # afresh: a resume record an earlier run left goes with its tensors, so that a later resume=True
    # cannot pair it with the tensors made here (the job's commit would give them back as zeros)
    resume_mod.discard_meta(eng)
    real = {id(s): s.param.data for b in eng.blocks for s in b.slots}
    try:
        for b in eng.blocks:
            for kind in eng._kinds(b):
                eng._create(b, kind, b.kind_bytes(kind))
            # the initial parameters go in (and the master weights, part by part); g and the step
            # rule's state start as zeros (a new tensor reads as zeros)
            if b.slots:
                write_params(eng, b, {id(s): real[id(s)] for s in b.slots}, "writing its initial parameters")
    except BaseException:
        for b in eng.blocks:
            for t in b.tensors.values():
                try:
                    t.destroy()
                except Exception:           # pragma: no cover - refused too: it lingers with the job
                    pass
            b.tensors.clear()
        raise
    for b in eng.blocks:
        for s in b.slots:
            eng._unmap(s)


def write_params(eng: "Offload", b: Block, values: dict[int, torch.Tensor], what: str) -> None:
    """Write ``values`` (slot id -> tensor of its shape) into b's parameters, and into its master
    weights for reduced precision: in host, outside any phase (pins of their own)."""
    whole = len(values) == len(b.slots)
    with eng._explained(b, what):
        with b.tensors["p"].pin(HOST, WRITE if whole else READ_WRITE) as g:
            flat = g.torch()
            for s in b.slots:
                if id(s) in values:
                    s.view(flat, "p").copy_(values[id(s)])
        for pt in b.parts if b.mixed else ():
            pieces = [pc for pc in pt.pieces if id(pc.slot) in values]
            if not pieces:
                continue
            part_whole = len(pieces) == len(pt.pieces)
            with b.tensors[b.part_kind("w", pt.index)].pin(HOST, WRITE if part_whole else READ_WRITE) as g:
                flat = g.torch()
                for pc in pieces:
                    pc.view(flat, "w").copy_(pc.of(values[id(pc.slot)]))


def again_after_restart(eng: "Offload", read: Any) -> Any:
    """``read()`` (a read out of tierd, under pins of its own), tried again after tierd restarted under it,
    as a step enters its phase again: the plan goes in again first (``Offload._restarted()``).  A read
    changes nothing, so trying it again is safe; it failed with RestartedError (state_dict() after a
    restart), where the next step would have gone on."""
    from .engine import RESTART_TRIES

    for attempt in range(RESTART_TRIES + 1):
        try:
            eng._check_restarts()
            return read()
        except RestartedError:
            if attempt == RESTART_TRIES:
                raise
            eng._restarted()


def read_params(eng: "Offload", b: Block, what: str) -> dict[int, torch.Tensor]:
    """b's parameters as they are now, copied out of tierd, by id(slot) (tried again after a restart)."""
    return again_after_restart(eng, lambda: _read_params(eng, b, what))


def _read_params(eng: "Offload", b: Block, what: str) -> dict[int, torch.Tensor]:
    """b's parameters as they are now, copied out of tierd, by id(slot).  A reduced-precision block's p
    has no bytes between its last backward and its optimizer phase, which writes it whole from the
    master weights (tierd drops such a tensor's copies, and its reads fail ENODATA; they gave zeros):
    then they are the master weights rounded, which p always equals outside that phase."""
    vals: dict[int, torch.Tensor] = {}
    try:
        with eng._explained(b, what):
            with b.tensors["p"].pin(HOST, READ) as g:
                flat = g.torch()
                for s in b.slots:
                    vals[id(s)] = s.view(flat, "p").clone()
        return vals
    except LostError:
        if not b.mixed:
            raise
    vals = {id(s): torch.empty(s.shape, dtype=s.dtype) for s in b.slots}
    for pt in b.parts:
        with eng._explained(b, what):
            with b.tensors[b.part_kind("w", pt.index)].pin(HOST, READ) as g:
                flat = g.torch()
                for pc in pt.pieces:
                    pc.of(vals[id(pc.slot)]).copy_(pc.view(flat, "w").reshape(pc.of(vals[id(pc.slot)]).shape))
    return vals


def parameters_of(eng: "Offload", b: Block) -> dict[str, torch.Tensor]:
    """b's parameters as they are now, copied out of tierd: every name of each."""
    out: dict[str, torch.Tensor] = {}
    vals = read_params(eng, b, "reading its parameters")
    for s in b.slots:
        for n in s.names:
            out[n] = vals[id(s)]
    return out


def parameters_state_dict(eng: "Offload") -> dict[str, torch.Tensor]:
    """Every parameter by every name, copied out of tierd (what close() gives back to the model)."""
    out: dict[str, torch.Tensor] = {}
    for b in eng.blocks:
        if b.slots:
            out.update(parameters_of(eng, b))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its element's size (a block may mix bfloat16 and float32 parameters)."""
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def write_params_keeping_masters(eng: "Offload", b: Block, vals: dict[int, torch.Tensor], what: str) -> None:
    """``write_params(eng, )``, but for reduced precision a master weight that rounds, bit for bit, to its
    parameter's new value stays: a model loaded after the optimizer state that brought the masters goes on
    as the run it was saved from (write_params() alone sets each master to its parameter made float32)."""
    old: dict[tuple[int, int], torch.Tensor] = {}
    for pt in b.parts if b.mixed else ():
        with eng._explained(b, what):
            with b.tensors[b.part_kind("w", pt.index)].pin(HOST, READ) as g:
                flat = g.torch()
                for pc in pt.pieces:
                    if id(pc.slot) in vals:
                        old[(pt.index, id(pc))] = pc.view(flat, "w").clone()
    write_params(eng, b, vals, what)
    for pt in b.parts if old else ():
        pieces = [pc for pc in pt.pieces if (pt.index, id(pc)) in old]
        if not pieces:
            continue
        with eng._explained(b, what):
            with b.tensors[b.part_kind("w", pt.index)].pin(HOST, READ_WRITE) as g:
                flat = g.torch()
                for pc in pieces:
                    was, new = old[(pt.index, id(pc))], pc.of(vals[id(pc.slot)]).reshape(-1)
                    rounds = _bits(was.reshape(-1).to(new.dtype)) == _bits(new)
                    w = pc.view(flat, "w")
                    w.copy_(torch.where(rounds.view(w.shape), was, w))


# ---- the optimizer's state ---------------------------------------------------------------------

def _packed_groups(eng: "Offload") -> tuple[list[dict], dict[int, int]]:
    index: dict[int, int] = {}
    groups = []
    for g in eng.param_groups:
        packed = {k: v for k, v in g.items() if k != "params"}
        ids = []
        for p in g["params"]:
            index[id(p)] = len(index)
            ids.append(index[id(p)])
        packed["params"] = ids
        groups.append(packed)
    return groups, index


def _read_state(eng: "Offload", b: Block) -> dict[int, dict[str, torch.Tensor]]:
    """Per slot of b that was updated: each float32 kind of the step rule (and w) as the parameter's shape
    (tried again after a restart)."""
    return again_after_restart(eng, lambda: _read_state_once(eng, b))


def _read_state_once(eng: "Offload", b: Block) -> dict[int, dict[str, torch.Tensor]]:
    kinds = list(eng.state_kinds) + (["w"] if b.mixed else [])
    pieces: dict[int, dict[str, list[torch.Tensor]]] = {}
    for pt in b.parts:
        for kind in kinds:
            with eng._explained(b, "reading its optimizer state"):
                with b.tensors[b.part_kind(kind, pt.index)].pin(HOST, READ) as g:
                    flat = g.torch()
                    for pc in pt.pieces:
                        if pc.slot.steps > 0 or kind == "w":
                            pieces.setdefault(id(pc.slot), {}).setdefault(kind, []).append(
                                pc.view(flat, kind).reshape(-1).clone())
    out = {}
    for s in b.slots:
        if id(s) in pieces:
            out[id(s)] = {k: torch.cat(v).view(s.shape) for k, v in pieces[id(s)].items()}
    return out


def _write_state(eng: "Offload", b: Block, vals: dict[int, dict[str, torch.Tensor]]) -> None:
    """Write each slot's kinds (zeros for a slot not in ``vals``: it starts afresh)."""
    kinds = list(eng.state_kinds) + (["w"] if b.mixed else [])
    for pt in b.parts:
        for kind in kinds:
            with eng._explained(b, "writing its optimizer state"):
                with b.tensors[b.part_kind(kind, pt.index)].pin(HOST, READ_WRITE if kind == "w" else WRITE) as g:
                    flat = g.torch()
                    for pc in pt.pieces:
                        v = vals.get(id(pc.slot), {}).get(kind)
                        dst = pc.view(flat, kind)
                        if v is not None:
                            dst.copy_(pc.of(v.to(torch.float32)))
                        elif kind != "w":
                            dst.zero_()


def optimizer_state_dict(eng: "Offload") -> dict[str, Any]:
    eng.check_idle("state_dict()")
    optim.check_members(eng)     # (the state is numbered by the groups)
    groups, index = _packed_groups(eng)
    state: dict[int, dict[str, Any]] = {}
    names = eng.rule.state_names()
    for b in eng.blocks:
        if not b.slots or not any(s.steps > 0 for s in b.slots):
            continue
        got = _read_state(eng, b)
        for s in b.slots:
            if s.steps == 0 or id(s.param) not in index:
                continue
            entry = eng.rule.to_state(s.steps, {names[k]: v for k, v in got[id(s)].items() if k in names},
                                      eng.param_groups[s.group])
            if b.mixed:
                entry[MASTER] = got[id(s)]["w"]
            state[index[id(s.param)]] = entry
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def _check_groups(eng: "Offload", saved: list[dict]) -> None:
    if len(saved) != len(eng.param_groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    for i, (g, sg) in enumerate(zip(eng.param_groups, saved)):
        if len(g["params"]) != len(sg["params"]):
            # torch.optim.AdamW(model.parameters()) numbers the frozen parameters too; the engine's default
            # group holds the trainable ones only
            frozen = sum(1 for p in eng.model.parameters() if not p.requires_grad)
            hint = ""
            if len(saved) == 1 and frozen and len(sg["params"]) == len(g["params"]) + frozen:
                hint = (f": the model has {frozen} frozen parameter{'s' if frozen > 1 else ''} (requires_grad "
                        "False), which torch.optim's optimizer over model.parameters() numbers and the "
                        "engine's default group leaves out; make the engine with params=model.parameters() "
                        "to load this state dict")
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             f"optimizer's group (group {i}: {len(sg['params'])} parameters saved, "
                             f"{len(g['params'])} here){hint}")
        # the hyperparameters it brings must be ones the step rule honours (amsgrad=True is not)
        eng.rule.check_group({**g, **{k: v for k, v in sg.items() if k != "params"}})


def load_optimizer_state_dict(eng: "Offload", sd: dict[str, Any]) -> None:
    eng.check_idle("load_state_dict()")
    optim.check_members(eng)     # (the state is numbered by the groups)
    if not isinstance(sd, dict) or "state" not in sd or "param_groups" not in sd:
        raise ValueError("not an optimizer state dict (it needs 'state' and 'param_groups')")
    _check_groups(eng, sd["param_groups"])
    params = [p for g in eng.param_groups for p in g["params"]]
    saved_ids = [i for sg in sd["param_groups"] for i in sg["params"]]
    by_index = dict(zip(saved_ids, params))
    names = {v: k for k, v in eng.rule.state_names().items()}
    todo: dict[int, dict[int, tuple[int, dict[str, torch.Tensor]]]] = {}
    for idx, entry in sd["state"].items():
        p = by_index.get(int(idx))
        if p is None:
            raise ValueError(f"optimizer state for parameter {idx}, which no group holds")
        b, s = eng.slot_of[id(p)]
        steps, tensors = eng.rule.from_state(entry)
        kinds = {names[k]: v for k, v in tensors.items() if k in names}
        if b.mixed and MASTER in entry:
            kinds["w"] = entry[MASTER]
        for k, v in kinds.items():
            k = eng.rule.state_names().get(k, MASTER if k == "w" else k)       # (torch's name, for messages)
            if not isinstance(v, torch.Tensor) or v.numel() != s.numel:
                raise ValueError(f"optimizer state of {s.name}: {k} has "
                                 f"{v.numel() if isinstance(v, torch.Tensor) else type(v)} elements, the "
                                 f"parameter {s.numel}")
            if tuple(v.shape) != tuple(s.shape):
                # (torch.optim's step() fails on it: a size mismatch; reshaped, it was taken silently)
                raise ValueError(f"optimizer state of {s.name}: {k} is shaped {tuple(v.shape)}, the parameter "
                                 f"{tuple(s.shape)}")
        moments = {k for k in kinds if k != "w"}
        if moments and moments != set(eng.state_kinds):
            # torch.optim initialises an entry only when it is empty: its step() fails on one that lacks a
            # moment (KeyError); here the missing one was taken as zeros, silently
            have = {tn for ek, tn in eng.rule.state_names().items() if ek in moments}
            lack = {tn for ek, tn in eng.rule.state_names().items() if ek not in moments}
            raise ValueError(f"optimizer state of {s.name}: it has {', '.join(sorted(have))} but not "
                             f"{', '.join(sorted(lack))} (torch.optim's step() would fail on it with a KeyError)")
        todo.setdefault(b.index, {})[id(s)] = (steps, {k: v.reshape(s.shape) for k, v in kinds.items()})
    # checked whole: now written
    for g, sg in zip(eng.param_groups, sd["param_groups"]):
        for k, v in sg.items():
            if k != "params":
                g[k] = v
    for b in eng.blocks:
        if not b.slots:
            continue
        vals = todo.get(b.index, {})
        _write_state(eng, b, {sid: kinds for sid, (_, kinds) in vals.items()})
        for s in b.slots:
            s.steps = vals[id(s)][0] if id(s) in vals else 0


# ---- streamed checkpoints ------------------------------------------------------------------------

def persistent_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's buffers that its state_dict() holds (not those registered with persistent=False)."""
    out = {}
    for mn, mod in model.named_modules():
        for bn, t in mod.named_buffers(recurse=False):
            if t is not None and bn not in mod._non_persistent_buffers_set:
                out[f"{mn}.{bn}" if mn else bn] = t
    return out


def save(eng: "Offload", path: str) -> None:
    """meta.pt, buffers.pt and one block-NNNN.pt per block, into a new directory ``path`` (written
    beside it first and renamed into place: a crash leaves the old one or none)."""
    eng.check_idle("save()")
    optim.check_members(eng)     # (the state is numbered by the groups)
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"{path} exists and is not a directory")
    tmp = path.rstrip("/") + ".tmp-save"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    groups, index = _packed_groups(eng)
    meta = {"format": FORMAT, "version": VERSION, "rule": eng.rule.name, "param_groups": groups,
            "blocks": [[{"names": s.names, "shape": tuple(s.shape), "dtype": str(s.dtype), "steps": s.steps,
                         "index": index.get(id(s.param))} for s in b.slots] for b in eng.blocks]}
    torch.save(meta, os.path.join(tmp, "meta.pt"))
    torch.save({n: t.detach().clone() for n, t in persistent_buffers(eng.model).items()},
               os.path.join(tmp, "buffers.pt"))
    for b in eng.blocks:
        if not b.slots:
            continue
        params = parameters_of(eng, b)
        st = _read_state(eng, b) if any(s.steps > 0 for s in b.slots) or b.mixed else {}
        torch.save({"params": {s.name: params[s.name] for s in b.slots},
                    "state": {s.name: st[id(s)] for s in b.slots if id(s) in st}},
                   os.path.join(tmp, f"block-{b.index:04d}.pt"))
        del params, st
    if os.path.isdir(path):
        old = path.rstrip("/") + ".tmp-old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)


def load(eng: "Offload", path: str) -> None:
    eng.check_idle("load()")
    optim.check_members(eng)     # (the state is numbered by the groups)
    meta = torch.load(os.path.join(path, "meta.pt"))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tier.torch checkpoint (no meta.pt of format {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path}: tier.torch checkpoint version {meta.get('version')}, this tier.torch reads "
                         f"version {VERSION}")
    if meta["rule"] != eng.rule.name:
        raise ValueError(f"{path}: saved with the {meta['rule']} step rule, this engine runs {eng.rule.name}")
    if len(meta["blocks"]) != len(eng.blocks):
        raise ValueError(f"{path}: {len(meta['blocks'])} blocks saved, the engine has {len(eng.blocks)} (the same "
                         "model and blocks= are needed)")
    _, index = _packed_groups(eng)
    for b, saved in zip(eng.blocks, meta["blocks"]):
        if len(saved) != len(b.slots):
            raise ValueError(f"{path}: {b.label} had {len(saved)} parameters, it has {len(b.slots)}")
        for s, m in zip(b.slots, saved):
            if m["names"][0] != s.name or tuple(m["shape"]) != tuple(s.shape) or m["dtype"] != str(s.dtype):
                raise ValueError(f"{path}: {b.label}: parameter {m['names'][0]} {tuple(m['shape'])} {m['dtype']} "
                                 f"saved, {s.name} {tuple(s.shape)} {s.dtype} here")
            # the same place in the parameter groups, or their hyperparameters would go to other parameters
            if m.get("index") != index.get(id(s.param)):
                raise ValueError(f"{path}: {b.label}: parameter {s.name} was number {m.get('index')} of the saved "
                                 f"parameter groups, it is number {index.get(id(s.param))} here (the same parameter "
                                 "groups, in the same order, are needed)")
    _check_groups(eng, meta["param_groups"])
    buffers = torch.load(os.path.join(path, "buffers.pt"))
    mine = persistent_buffers(eng.model)
    # (a checkpoint of before kept the non-persistent buffers too: those are not loaded, as torch does not)
    gone = set(mine) - set(buffers)
    extra = set(buffers) - set(mine) - set(dict(eng.model.named_buffers()))
    if gone or extra:
        raise ValueError(f"{path}: the model's buffers differ from the saved ones: {sorted(gone)} missing there, "
                         f"{sorted(extra)} not in the model")
    for n, t in mine.items():
        if tuple(buffers[n].shape) != tuple(t.shape) or buffers[n].dtype != t.dtype:
            raise ValueError(f"{path}: buffer {n} is {tuple(t.shape)} {t.dtype}, {tuple(buffers[n].shape)} "
                             f"{buffers[n].dtype} saved")
    # checked whole: now written, a block at a time
    for g, sg in zip(eng.param_groups, meta["param_groups"]):
        for k, v in sg.items():
            if k != "params":
                g[k] = v
    with torch.no_grad():
        for n, t in mine.items():
            t.copy_(buffers[n])
    for b, saved in zip(eng.blocks, meta["blocks"]):
        if not b.slots:
            continue
        data = torch.load(os.path.join(path, f"block-{b.index:04d}.pt"))
        write_params(eng, b, {id(s): data["params"][s.name] for s in b.slots}, "writing loaded parameters")
        _write_state(eng, b, {id(s): data["state"][s.name] for s in b.slots if s.name in data["state"]})
        for s, m in zip(b.slots, saved):
            s.steps = m["steps"]
        del data
    if hasattr(eng, "model_hooks"):
        eng.model_hooks._cache = None


# ---- engine.state: torch.optim's per-parameter state, which lives in tierd ----------------------

STATE_NOTE = ("tier.torch keeps the optimizer state in tierd, not in this process: engine.state_dict()['state'] "
              "holds copies of it read from tierd (torch.optim's format, parameters numbered across the groups), "
              "and engine.load_state_dict() writes it")


def set_state(eng: "Offload", value: Any) -> None:
    """``optimizer.state = ...``: only torch.optim's __init__ may (its defaultdict, which goes unused)."""
    if not getattr(eng, "_constructing", False):
        raise RuntimeError(f"optimizer.state = ...: {STATE_NOTE}")


class StateInTierd(Mapping):
    """What stands for ``optimizer.state`` (torch.optim's ``defaultdict`` keyed by parameter): its keys are
    the parameters that have state, as torch's would be (``len()``, ``in`` and iterating say the truth, so a
    loop that asks whether there is state to save sees it); their values live in tierd, and reading or
    changing one is refused, naming what to use instead (a copy handed out here would take writes and lose
    them)."""

    def __init__(self, eng: "Offload") -> None:
        self._eng = eng

    def _params(self) -> list[torch.Tensor]:
        eng = self._eng
        if eng._closed:
            return []
        return [s.param for g in eng.param_groups for p in g["params"]
                for s in (eng.slot_of[id(p)][1],) if s.steps > 0]

    def __len__(self) -> int:
        return len(self._params())

    def __iter__(self) -> Any:
        return iter(self._params())

    def __contains__(self, p: object) -> bool:
        return any(p is q for q in self._params())

    def __getitem__(self, p: Any) -> Any:
        raise RuntimeError(f"optimizer.state[p]: {STATE_NOTE}")

    def __setitem__(self, p: Any, v: Any) -> None:
        raise RuntimeError(f"optimizer.state[p] = ...: {STATE_NOTE}")

    def __delitem__(self, p: Any) -> None:
        raise RuntimeError(f"del optimizer.state[p]: {STATE_NOTE}")

    def __repr__(self) -> str:
        return f"<tier.torch optimizer state of {len(self)} parameter(s), in tierd: use engine.state_dict()>"
