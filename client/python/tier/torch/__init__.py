# SPDX-License-Identifier: MIT
"""tier.torch: train a ``torch.nn.Module`` with its state in tierd.

Theory of operation
-------------------

An :class:`Offload` engine takes a model and a :class:`tier.Client` and from
then on owns the model's trainable state, block by block.  A *block* is a
submodule: by default the ones :func:`auto_blocks` finds (the layers of
``ModuleList``s, the classes a Hugging Face model declares in
``_no_split_modules``, embeddings, norms and heads on their own), or the
``blocks=`` given.  The engine's parts, each in its own module:

* :mod:`tier.torch.layout`: a block's parameters, gradients, optimizer
  state and master weights packed into flat tierd tensors (kinds p, g, m,
  v, w; a) at 64-byte aligned offsets; parameters several blocks use (tied
  embeddings) stored once, in a shared block;
* :mod:`tier.torch.discovery`: which submodules become blocks, and
  :meth:`Offload.describe`'s table of what they cost;
* :mod:`tier.torch.hooks`: the forward, gradient and saved-tensor hooks,
  attached and detached as a whole;
* :mod:`tier.torch.tracer`: the first step's order of phases, submitted to
  tierd as the job's iteration plan;
* :mod:`tier.torch.optim`: the optimizer step behind a small interface
  (AdamW, SGD with momentum), torch's own single-tensor code;
* :mod:`tier.torch.collective`: gradients averaged over the ranks, in
  buckets;
* :mod:`tier.torch.placement`: what is written down to NVMe after each
  optimizer phase (placements A, B, C).

Outside its phases a parameter's ``.data`` is an empty placeholder, so the
model holds nothing: a block's parameters are mapped only while it runs.  A
parameter's ``.data`` is its ``detach()`` while the engine has it
(tier.torch.guards.watch_data), so that a change through it
(``p.data.clamp_()``) is seen, and refused; ``p.data = ...``
(``vector_to_parameters()``) and, outside its phases, any op reading or
writing the placeholder (a view: ``parameters_to_vector()``; an EMA's
``ema_p.add_(p.detach())``) are refused at once (guards.check_reads()), and
so is removing or replacing a parameter in its module (``weight_norm()``,
``prune``: guards.HeldParams), setting its ``.grad`` outside its phases, or
converting the model to another dtype or device (``model.half()``:
tier.torch.convert, before any buffer is converted), or putting another
module in the place of one holding its parameters
(``convert_sync_batchnorm()``: tier.torch.swap).

One training step is a cycle of phases: the forward of each block in the
order the model calls them, then, as autograd reaches each block, its
backward followed at once by its optimizer phase (the block's gradients are
complete by then and nothing later in the backward reads its parameters),
and last the shared block's optimizer phase (autograd has summed every
use's gradient of a tied weight only once the whole backward is done).  The
optimizer runs on the mapped host copies with torch's own code, so the
results are the bits plain PyTorch computes.  From the second step on the
phases follow the traced plan, and tierd moves each tensor ahead of its use.

Activations (``offload_activations=True``): the tensors autograd saves
during a block's forward (contiguous, at least ``activation_min_bytes``)
are copied into the block's ``a`` tensor instead of being kept, and read
from its mapping in the block's backward phase.  Between the two, tierd may
write them to NVMe when the host budget needs the room.  The first step
measures what each block saves; what a later step saves beyond that stays
in memory as usual.

Loops (:class:`Offload` is a ``torch.optim.Optimizer``): parameter groups
(their members fixed when the engine is made: one moved is refused) and
``torch.optim.lr_scheduler`` schedulers, gradient accumulation over
micro-batches, ``clip_grad_norm_`` (exact: it switches the optimizer phases
to after the whole backward), ``step(closure)`` (likewise: the update after
the closure returns, as torch.optim's), activation checkpointing, ``state_dict()``
of the model and of the engine, and :meth:`Offload.save`/:meth:`Offload.load`
block by block.

Limits: a block runs once per micro-batch (a block called several times in
one forward, weights shared across time, is refused; make the repeated part
one block's inside); every step runs the same blocks (the experts of a
mixture-of-experts layer are refused as blocks of their own, with their
names, before the step changes anything: make the whole layer one block
with ``no_split_module_classes=``); a model whose top module has parameters
of its own is one block.
"""

from __future__ import annotations

from .discovery import auto_blocks
from .engine import Offload, TierTorchWarning
from .optim import SGD, AdamW, StepRule

__all__ = ["Offload", "auto_blocks", "AdamW", "SGD", "StepRule", "TierTorchWarning"]
