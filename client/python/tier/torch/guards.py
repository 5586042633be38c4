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
