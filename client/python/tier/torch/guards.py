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

import weakref
from typing import Any

import torch

FUSED_NOTE = ("tier.torch ran this step's optimizer inside the backward (fused: the first step had one forward and "
              "backward and no clip_grad_norm_, or optimizer_in_backward=True), so")


def check_backward(eng: Any, what: str) -> None:
    """``what`` (an engine call, a forward) comes while a backward has not ended: refused, or (zero_grad())
    the engine leaves the backward that raised."""
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


def check_one_forward(eng: Any) -> None:
    """A backward begins: it must be the backward of one forward with gradients, the last (tier.torch pairs
    them, micro-batch by micro-batch).  Refused before any block's backward runs, with the likely cause:
    it used to fail inside the backward with a message about blocks run twice or parameters out of phase."""
    pending = eng._micro - eng._backwards
    if pending > 1:
        raise RuntimeError(f"backward() with {pending} forwards of this step not yet backpropagated: tier.torch "
                           "pairs each forward that records gradients with one backward; for a loss over "
                           "several forwards (Siamese, contrastive) run the model once on the inputs "
                           "concatenated (torch.cat), and run an evaluation forward under torch.no_grad()")
    if pending < 1:
        raise RuntimeError("a second backward over the same forward (backward(retain_graph=True) twice, or "
                           "torch.autograd.grad(..., create_graph=True) and then backward()): tier.torch runs one "
                           "backward per forward; compute the loss once and call backward() once, or run the "
                           "forward again for the second backward")


def check_params(eng: Any, what: str) -> None:
    """Outside its phases a parameter is an empty placeholder and its values are in tierd: a change in
    place to it (weight clipping, nn.init) changed nothing, and a conversion (model.double(), .to()) only
    the placeholder, the engine going on in the layout it made.  Refused, naming the parameter, where
    they were lost silently; a change in place is said once."""
    mapped = {id(s) for b in (eng._bwd, eng._in_block) if b is not None for owner in eng.param_owners(b)
              for s in (owner.slots if owner is b else b.shared)}
    for b in eng.blocks:
        for s in b.slots:
            p = s.param
            if s.ph_version == -2 and p.data.numel() == 0:
                s.ph_version = p._version       # a load_state_dict() copied into the placeholder
            if s.ph_version < 0 or id(s) in mapped:
                continue
            if p.dtype != s.dtype or p.device != eng.device:
                raise RuntimeError(
                    f"{what}: parameter {s.name} is {p.dtype} on {p.device} now, {s.dtype} on {eng.device} when "
                    "the tier.torch engine was made, which laid out its values, gradients and optimizer state "
                    "in tierd then (a conversion after it, model.double(), .half() or .to(), changed only the "
                    "empty placeholder): convert the model before making the engine, or close() the engine "
                    "(the model gets its values back), convert, and make a new one")
            if p._version != s.ph_version or p.data.numel() != 0:
                for ss in (ss for bb in eng.blocks for ss in bb.slots if id(ss) not in mapped):
                    eng._unmap(ss)      # (what was assigned goes: the placeholder again)
                raise RuntimeError(
                    f"{what}: parameter {s.name} was changed in place outside the model's forward (weight "
                    "clipping, nn.init, p.data assigned), where tier.torch keeps its values in tierd and the "
                    "model only an empty placeholder: the change was lost.  Change parameters before making "
                    "the engine, through model.load_state_dict() (written into tierd), or inside the forward "
                    "of their block")


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


def release_params(eng: Any) -> None:
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
