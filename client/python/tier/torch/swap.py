# SPDX-License-Identifier: MIT
"""tier.torch.swap: a module holding an engine's parameters replaced or removed while the engine is open,
refused before anything changes.

``SyncBatchNorm.convert_sync_batchnorm(model)`` puts a new module in place of each BatchNorm, holding the
same parameters; a user swaps a module for one of their own, or puts a new head in place of the old one
(``model.fc = nn.Linear(...)``).  The engine hooked the modules it was made with and traced the first
step's blocks: a block module replaced lost its hooks, and the forward failed reading its parameters'
empty placeholders "outside its block's forward" (or, after the first step, "ran in the first step but not
in this one", about experts of a mixture-of-experts layer), neither of which says what happened.

``hold()`` (from guards.claim_params()) makes ``_modules`` of each module whose subtree holds one of the
engine's parameters a ``HeldModules`` (a guards.HeldParams whose check is about modules), of torch's type,
until ``release()`` (close()): setting a child that holds an engine's parameter to another module (or
None), or deleting it, is refused before it changes anything; a child holding none (``Dropout`` for
``Identity``, an activation) and a new name are torch's.  No round trip to tierd.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

import torch

from . import guards


class HeldModules(guards.HeldParams):
    """A module's ``_modules`` while the engine ``_tier_eng`` (a weak reference) is open: what would put
    another module in the place of a child holding one of its parameters, or remove that child, is refused
    before it changes anything.  ``_tier_holding``: the ids of the modules holding one then."""

    _tier_holding: frozenset[int] = frozenset()

    def _check(self, key: Any, value: Any, removing: bool) -> None:
        eng = self._tier_eng() if self._tier_eng is not None else None
        if eng is None or eng._closed:
            return
        old = dict.get(self, key)
        if old is None or id(old) not in self._tier_holding or (not removing and value is old):
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


def hold(eng: Any) -> None:
    """``_modules`` of every module of ``eng``'s model with a child holding one of its parameters made a
    HeldModules (one pass over the modules, children before their parents)."""
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
        if kind is not None and any(c is not None and id(c) in holding for c in m._modules.values()):
            new = kind(m._modules)
            new._tier_eng, new._tier_owner, new._tier_holding = r, type(m).__name__, holding
            m.__dict__["_modules"] = new


def release(eng: Any) -> None:
    """``eng`` lets its parameters go: each module gets a ``_modules`` of torch's type back."""
    for m in eng.model.modules():
        held = m.__dict__.get("_modules")
        if type(held) in _HELD_TYPES.values() and held._tier_eng is not None and held._tier_eng() in (eng, None):
            m.__dict__["_modules"] = held._plain(held)
