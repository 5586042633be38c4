# SPDX-License-Identifier: MIT
"""tier.torch.swap: a module holding an engine's parameters replaced or removed while the engine is open,
refused before anything changes.

``SyncBatchNorm.convert_sync_batchnorm(model)`` puts a new module in place of each BatchNorm, holding the
same parameters; a user swaps a module for one of their own, or puts a new head in place of the old one
(``model.fc = nn.Linear(...)``).  The engine hooked the modules it was made with and traced the first
step's blocks: a block module replaced lost its hooks, and the forward failed reading its parameters'
empty placeholders "outside its block's forward" (or, after the first step, "ran in the first step but not
in this one", about experts of a mixture-of-experts layer), neither of which says what happened.

A module added while the engine is open with a parameter that trains (LoRA adapters put into a layer as
peft's injection does, ``layer.lora_A = nn.Linear(...)`` with the layer's forward patched) was trained by
nobody: the engine lays out what trains when it is made, so the adapter's gradients piled up in ``.grad``
and it kept its first values, silently.  ``refuse_new()`` refuses it (and a new trainable ``Parameter``,
from guards.HeldParams) before it is added, saying to add adapters before making the engine.

``hold()`` (from guards.claim_params()) makes ``_modules`` of every module a ``HeldModules`` (a
guards.HeldParams whose check is about modules), of torch's type, until ``release()`` (close()): setting
a child that holds an engine's parameter to another module (or None), or deleting it, is refused before
it changes anything; so is a child, under a new name or not, with a parameter that trains and that the
engine does not hold.  A child holding none (``Dropout`` for ``Identity``, an activation, a frozen
module) is torch's.  No round trip to tierd.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

import torch

from . import guards


class HeldModules(guards.HeldParams):
    """A module's ``_modules`` while the engine ``_tier_eng`` (a weak reference) is open: what would put
    another module in the place of a child holding one of its parameters, or remove that child, or add a
    child with a parameter that trains and that the engine does not hold, is refused before it changes
    anything.  ``_tier_holding``: the ids of the modules holding one of its parameters then."""

    _tier_holding: frozenset[int] = frozenset()

    def _check(self, key: Any, value: Any, removing: bool) -> None:
        eng = self._tier_eng() if self._tier_eng is not None else None
        if eng is None or eng._closed:
            return
        old = dict.get(self, key)
        if old is None or id(old) not in self._tier_holding or (not removing and value is old):
            if not removing and value is not None and value is not old:
                refuse_new(eng, self._tier_owner, key, value)
            if removing or value is not old:
                # Hooks.root_pre looks for parameters that train from now on: a frozen module added may be
                # unfrozen, and torch's ModuleList.__delitem__ gives the list a plain _modules after a removal
                eng._model_changed = True
            return
        name = next((s.name for p in old.parameters() for hit in (eng.slot_of.get(id(p)),)
                     if hit is not None for s in (hit[1],) if s.param is p), "?")
        what = "removing" if removing or value is None else f"putting a {type(value).__name__} in place of"
        raise RuntimeError(
            f"{what} module {key} ({type(old).__name__}) of {self._tier_owner}, which holds parameter {name}, "
            "while a tier.torch engine holds it (the engine laid out its values, gradients and optimizer state "
            "in tierd, hooked the modules it was made with and planned the first step's blocks; a module in its "
            "place would run without those hooks, on parameters the engine does not train or on the empty "
            "placeholders): torch.nn.SyncBatchNorm.convert_sync_batchnorm(), a new head or a module swapped "
            "for one of your own do so.  Replace modules before making the engine, or close() the engine (the "
            "model gets its values back), replace, and make a new one; nothing changed")


class _HeldOrderedDict(HeldModules, collections.OrderedDict):
    _plain = collections.OrderedDict


class _HeldDict(HeldModules, dict):
    _plain = dict


#: torch's type of a module's ``_modules``: its HeldModules while an engine holds them
_HELD_TYPES: dict[type, type] = {collections.OrderedDict: _HeldOrderedDict, dict: _HeldDict}


def untrained(eng: Any, value: Any) -> str | None:
    """The name (in ``value``, "" for itself) of the first parameter of ``value`` (a Parameter or a Module)
    that trains (requires_grad) and that engine ``eng`` does not hold; None if there is none."""
    if isinstance(value, torch.nn.Parameter):
        named: Any = [("", value)]
    elif isinstance(value, torch.nn.Module):
        named = value.named_parameters()
    else:
        return None
    with guards.direct():
        return next((n for n, p in named if p.requires_grad and guards._held_slot(eng, p) is None), None)


def refuse_new(eng: Any, owner: str, key: Any, value: Any) -> None:
    """Refuse adding ``value`` as ``key`` of a ``owner`` module of ``eng``'s model (before it is added) if it
    has a parameter that trains and that the engine does not hold: nothing would update it."""
    name = untrained(eng, value)
    if name is None:
        return
    what = f"parameter {key}, which" if not name else f"module {key} ({type(value).__name__}), whose parameter {name}"
    raise RuntimeError(
        f"adding {what} requires grad, to {owner} while a tier.torch engine is open: the engine laid out "
        "the parameters that train (their gradients, optimizer state and updates in tierd) when it was made, "
        "so nothing would ever update this one (its gradients would pile up in .grad).  Add adapters (LoRA: "
        "peft's get_peft_model() or your own) and any other parameter that trains before making the engine, "
        "or close() it (the model gets its values back), add them, and make a new one; nothing changed")


def hold(eng: Any) -> None:
    """``_modules`` of every module of ``eng``'s model made a HeldModules, knowing the modules holding one
    of its parameters (one pass over the modules, children before their parents)."""
    held: dict[int, bool] = {}

    def visit(m: torch.nn.Module) -> bool:
        if id(m) not in held:
            held[id(m)] = False         # (a module under itself: not walked twice)
            mine = any(p is not None and id(p) in eng.slot_of for p in m._parameters.values())
            below = [visit(c) for c in m._modules.values() if c is not None]
            held[id(m)] = mine or any(below)
        return held[id(m)]

    visit(eng.model)
    holding = frozenset(i for i, h in held.items() if h)
    r = weakref.ref(eng)
    for m in eng.model.modules():
        kind = _HELD_TYPES.get(type(m.__dict__.get("_modules")))
        if kind is not None:
            new = kind(m._modules)
            new._tier_eng, new._tier_owner, new._tier_holding = r, type(m).__name__, holding
            m.__dict__["_modules"] = new


def release(eng: Any) -> None:
    """``eng`` lets its parameters go: each module gets a ``_modules`` of torch's type back."""
    for m in eng.model.modules():
        held = m.__dict__.get("_modules")
        if type(held) in _HELD_TYPES.values() and held._tier_eng is not None and held._tier_eng() in (eng, None):
            m.__dict__["_modules"] = held._plain(held)
