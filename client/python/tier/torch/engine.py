# SPDX-License-Identifier: MIT
"""tier.torch.engine: the Offload engine, tying layout, hooks, tracer, step rule and collective together.

See the package's description (``help(tier.torch)``) for how a step runs.

The engine is a ``torch.optim.Optimizer``: ``param_groups`` hold the
model's parameters with their hyperparameters (schedulers change them),
``step()`` runs what is left of the step, ``zero_grad()`` drops the
gradients gathered since the last step, ``state_dict()`` and
``load_state_dict()`` carry the optimizer's state in torch.optim's format
(tier.torch.state).  Where the optimizer phases run depends on the loop:

* *fused*: each block's optimizer phase right after its backward, during
  ``loss.backward()``; the fewest moves.  Chosen when the first step ran
  one forward and backward, called no gradient clipping and passed no
  closure to ``step()`` (a closure that raises after its backward must
  leave the update undone, as torch.optim's);
* *deferred*: the optimizer phases after the whole backward, in ``step()``,
  once the gradients of every micro-batch are summed in tierd and the
  global norm is known (``clip_grad_norm_``).  Chosen when the first step
  accumulated (several forwards and backwards), clipped or took a closure;
  ``optimizer_in_backward=False`` forces it, ``True`` forces fused.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from .. import HOST, NVME, READ, READ_WRITE, VRAM, WRITE
from ..errors import RestartedError
from . import clip, collective, discovery, explain, gradcall, guards, layout, optim, placement as placement_mod, resume as resume_mod, state as state_mod
from .hooks import Hooks, Stashed
from .layout import Block, Slot, fmt_bytes
from .optim import StepRule, hyper_changed, hyper_of, rule_from
from .tracer import Key, Tracer

if TYPE_CHECKING:  # pragma: no cover
    from ..client import Client

#: how often a phase entry (or a commit) is tried again after tierd restarted under it (each try waits
#: for the next tierd, up to the Client's reconnect timeout)
RESTART_TRIES = 3
#: why a fused step's parameters change in the backward (what refusals between backward() and step() say)
FUSED_NOTE = guards.FUSED_NOTE

#: a block's optimizer phase is cut into parts of at most this many bytes of each float32 kind (an
#: embedding of 50257 x 768 is 154 MB of parameters: in one phase its p, g, m and v would take 618 MB
#: of host memory at once, in parts of 32 MiB 250 MB)
DEFAULT_PART_BYTES = 32 << 20


class TierTorchWarning(UserWarning):
    """A model tier.torch can run, but not well as given (a block holding most of the state)."""


class Offload(torch.optim.Optimizer):
    """Parameters, gradients and optimizer state of ``model`` in tierd; the optimizer runs on the host tier.

    Use it in place of the optimizer::

        engine = tier.torch.Offload(model, client, lr=3e-4, placement="B")
        for x, y in data:
            loss = loss_fn(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # optional
            engine.step()
            engine.zero_grad()                                          # every step, as torch's loop

    ``params`` are torch.optim's: an iterable of the model's parameters or of parameter groups
    (``[{"params": [...], "weight_decay": 0.0}, ...]``); default, every trainable parameter in one
    group; torch.optim's other hyperparameters (``nesterov=``, ``maximize=``) by name too.
    ``blocks`` overrides the automatic choice (:func:`tier.torch.auto_blocks`, which
    honours the model's ``_no_split_modules`` and ``no_split_module_classes``); a parameter
    several blocks use (tied weights) is stored once.  The model's parameters are empty outside
    the engine's phases, but ``model.state_dict()`` and ``model.load_state_dict()`` work on the
    real values; :meth:`close` gives them back.  :meth:`describe` shows the blocks and what the
    job's budgets mean for them.
    """

    def __init__(self, model: torch.nn.Module, client: "Client", params: Iterable[Any] | None = None, *,
                 lr: float | None = None, betas: tuple[float, float] | None = None, eps: float | None = None,
                 weight_decay: float | None = None, momentum: float | None = None,
                 optimizer: str | StepRule = "adamw", placement: str = "A",
                 blocks: Sequence[torch.nn.Module] | None = None,
                 no_split_module_classes: Iterable[str] | None = None,
                 optimizer_in_backward: bool | None = None,
                 offload_activations: bool = False, activation_min_bytes: int = 64 << 10,
                 optimizer_part_bytes: int | None = DEFAULT_PART_BYTES,
                 prefix: str = "torch", process_group: Any = None, resume: bool = False, **more: Any) -> None:
        self.placement = placement_mod.check(placement)
        hyper = {k: v for k, v in (("lr", lr), ("betas", betas), ("eps", eps), ("weight_decay", weight_decay),
                                   ("momentum", momentum)) if v is not None}
        if isinstance(optimizer, str):
            try:
                self.rule: StepRule = rule_from(optimizer, **hyper)
            except TypeError as e:
                raise ValueError(f"optimizer {optimizer!r} takes {', '.join(rule_from(optimizer).defaults)}, "
                                 f"not all of {', '.join(hyper)}: {e}") from None
        else:
            self.rule = optim.check_rule(optimizer)
            if hyper or more:
                raise ValueError(f"{', '.join({**hyper, **more})}= go to the StepRule given as optimizer=, not to "
                                 "Offload")
        if params is None:
            params = [p for p in model.parameters() if p.requires_grad]
        self._constructing = True
        torch.optim.Optimizer.__init__(self, params, optim.group_defaults(self.rule, more))
        self._constructing = False
        for g in self.param_groups:
            self.rule.check_group(g)
        self.model = model
        self.client = client
        self.optimizer_in_backward = optimizer_in_backward
        self.offload_activations = offload_activations
        self.activation_min_bytes = activation_min_bytes
        #: bytes of saved activations stashed in tierd, and kept in memory (beyond what the first step
        #: measured), so far
        self.activations_stashed = 0
        self.activations_kept = 0
        self.steps = 0
        #: resume=True: the job is committed at every step's end, and an engine made for a job that has
        #: a commit takes it over (tier.torch.resume); resumed says whether this one did
        self.resume = resume
        self.resumed = False
        self.resumed_from: Any = None      # the tier.Commit it resumed from
        self._meta: Any = None             # the resume record's tensor
        self._first_step = True            # the first step of this engine (traced, unplanned)
        self._closure_seen = False         # a step(closure) came before the mode was decided: deferred
        #: tierd restarts this engine lived through (a Client made with reconnect=)
        self.restarts = 0
        self._client_restarts = getattr(client, "restarts", 0)
        #: write-downs (placements B, C) that tierd did not finish because the plan needed the tensor
        #: back in VRAM or host memory first: its copy there stays, the bytes on NVMe too.
        self.kept_up = 0
        #: write-downs tierd refused for want of room (their copies stay valid where they are)
        self.write_downs_refused = 0
        self.vram = VRAM
        self.device = torch.device("cuda") if client.vram_backend == "cuda" else torch.device("cpu")
        #: the device its tensors report, to compare with: cuda:N for torch.device("cuda"), which no tensor's
        #: .device equals (torch.device("cuda", 0) != torch.device("cuda"))
        self.device_here = torch.empty(0, device=self.device).device
        self._group = process_group
        self._world = 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._world = torch.distributed.get_world_size(process_group)
        if resume and self._world > 1:
            # a commit (tier_job_commit()) takes every rank's tensors of the job at once: a rank that
            # commits at its own step's end would commit another's step half done
            raise ValueError(f"tier.torch: resume=True is for a job of one rank, and this one has {self._world}: "
                             "a commit takes every rank's tensors at once, and ranks end their steps apart; "
                             "save checkpoints instead (engine.save(dir), or engine.state_dict())")
        self._rank = client.rank
        self._prefix = prefix
        clip.check_names_free(client, self._rank, prefix, resume)
        resume_mod.check_alone(client, resume)  # (without torch.distributed: no other connection of the job)
        modules = list(blocks) if blocks is not None else discovery.auto_blocks(model, no_split_module_classes)
        self.blocks: list[Block] = layout.build(model, modules, optimizer_part_bytes)
        self.by_module = {id(b.module): b for b in self.blocks if b.module is not None}
        self.slot_of: dict[int, tuple[Block, Slot]] = {id(s.param): (b, s) for b in self.blocks for s in b.slots}
        optim.assign_groups(self)               # (Slot.group)
        optim.remember_members(self)            # (optim.check_members())
        self._by_tname: dict[str, tuple[Block, str]] = {}
        self.tracer = Tracer()
        self._mode: str | None = None        # None during the first step, then "fused" or "deferred"
        self._deferred_why: str | None = None  # deferred: why, in words (optim.decide_mode())
        self._phase: Key | None = None
        self._early: Key | None = None       # the next step's first phase, entered by step()
        self._held: list[tuple[Any, int, bool]] = []  # trace mode: (tensor, tier, dirty) pinned now
        self._fences: list[Any] = []
        self._down: list[tuple[Block, tuple[str, ...]]] = []   # written down once their phase is left
        self._mapped: list[Block] = []               # the blocks whose maps the last phase entered may have set
        self._bwd: Block | None = None               # the block whose backward runs
        self._in_block: Block | None = None          # the block whose forward runs
        self._in_backward = False                    # between a backward's first gradient and its end
        self._training = False                       # the model's forward runs with gradients
        self._micro = 0                              # forwards with gradients since the last step
        self._cur = 0                                # the micro-batch of the forward (and backward) now
        self._backwards = 0                          # backward passes ended since the last step
        self._got: set[int] = set()                  # slots whose gradient came since the last step
        self._norms: dict[int, torch.Tensor] = {}    # their gradients' 2-norms (deferred: for clipping)
        self._maxabs: dict[int, torch.Tensor] = {}   # and largest magnitudes (the inf-norm)
        self._clip_coef: torch.Tensor | None = None  # this step's clipping factor, if clipped
        #: the parameter groups' hyperparameters at the end of this step's last backward (fused, the
        #: optimizer ran with them): step() compares, since torch.optim reads them in step()
        self._hyper_at_backward: list[dict[str, Any]] | None = None
        self._grads_zeroed = False         # the last zero_grad() (engine's or model's) left zeros in .grad
        self._kept_grads: list[str] = []   # the last step's gradients, never zeroed: this step's backward is refused
        self._clip_ids: set[int] = set()             # the slots it applies to (those named in the call)
        self._shared_reduced = False                 # the shared block's .grad averaged over the ranks
        self._clipped = False                        # clip_grad_norm_ was called in the first step
        self._applied = False                        # fused: an optimizer phase ran since the last step()
        self._stepped: dict[str, None] = {}          # fused: the blocks it ran for (since the last step()), in order
        self._fwd_open: int | None = None            # a forward with gradients began, not ended (tracer.seq then)
        self._zero_kept = False     # zero_grad() kept this step's forwards open: dropped unless their backward comes
        self._bwd_tried = False     # a backward began (or was refused) since this step's last forward with gradients
        self._fwd_dropped = False   # zero_grad() dropped a forward whose backward had not begun (guards.keep_forwards)
        self._closed = False
        #: a module or parameter was added to (or taken from) the model since the engine was made (swap.py's
        #: and guards.py's held dicts note it): each forward with gradients then looks for a parameter that
        #: trains and is none of the engine's (Hooks.root_pre); before, it costs no walk over the model
        self._model_changed = False
        for b, share in discovery.dominant_blocks(self.blocks):
            warnings.warn(f"{b.label} holds {100 * share:.0f} % of the model's parameters "
                          f"({fmt_bytes(b.nbytes)} of {fmt_bytes(sum(x.nbytes for x in self.blocks))}): every "
                          f"phase of it pins all of that, so no budget below it fits; {discovery.split_hint(b, model)}",
                          TierTorchWarning, stacklevel=2)
        guards.claim_params(self)
        try:
            state_mod.create_tensors(self)
        except BaseException:
            guards.release_params(self)
            raise
        self.hooks = Hooks(self)
        self.hooks.attach()
        self.model_hooks = state_mod.ModelStateHooks(self)
        self.model_hooks.attach()
        clip.register(self)
        gradcall.register(self)

    # ---- torch.optim.Optimizer --------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not getattr(self, "_constructing", False):
            raise RuntimeError("tier.torch lays out the model's parameters when the engine is made: pass every "
                               "parameter group to Offload(params=[...]) instead of add_param_group()")
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Drop the gradients gathered since the last step (what torch.optim's zero_grad() does to
        ``.grad``): the next backward starts them afresh.  No round trip.  A forward whose backward has
        not run stays open where no backward of the step ran yet (torch 1.13's quickstart zeroes between
        them): the next forward with gradients, or step(), without that backward drops it, skipping the
        step (guards.keep_forwards)."""
        guards.check_backward(self, "zero_grad()")
        if self._applied:
            raise RuntimeError(f"zero_grad() between backward() and step(): {FUSED_NOTE} this step cannot be "
                               "skipped; call step() first, or make the engine with optimizer_in_backward=False")
        guards.drop_failed_forward(self)                 # (a skipped batch: before its micro-batch is forgotten)
        if self._micro > 0 and not guards.keep_forwards(self):
            guards.note_dropped_forward(self)
            self._drop_step()
        self._grads_zeroed = not set_to_none        # (see optim.update_part())
        self._kept_grads = []
        self._got.clear()
        self._norms.clear()
        self._maxabs.clear()
        self._clip_coef = None
        self._clip_ids = set()
        self._shared_reduced = False
        clip.drop_moved_grads(self)
        with guards.direct():
            held = [s for b in self.blocks for s in b.slots if s.param.grad is not None]
        for b in self.blocks:
            for s in b.slots:
                s.had_grad = s.had_grad and not set_to_none     # (.grad None: torch.optim skips it until a gradient)
        for s in held:                  # the shared block's, held by autograd between micro-batches
            if set_to_none:
                s.param.grad = None
            else:
                s.param.grad.zero_()
        if not set_to_none:
            clip.grads_zeroed(self)     # (torch's .grad: zeros)

    def _drop_step(self) -> None:
        """A step skipped (its loss not finite, its backward raised, zero_grad() and a forward or step()
        with no backward): the next forward starts it again."""
        for b in self.blocks:
            b.maps.clear()
        self._phase = None
        self._release()             # (traced: the phase's pins; planned: an evaluation's)
        if not self.tracer.planned:
            self.tracer.seq, self.tracer.index = [], {}
        self._micro = self._backwards = 0
        self._zero_kept = False

    #: torch.optim's ``optimizer.state``: the parameters that have state; their values are refused (tierd's)
    state = property(state_mod.StateInTierd, state_mod.set_state)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state in torch.optim's format (per parameter its step and the step rule's
        state, read from tierd block by block; the groups' hyperparameters)."""
        return state_mod.optimizer_state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` (or torch.optim's own optimizer of the same kind) saved; checked
        whole before anything is written."""
        state_mod.load_optimizer_state_dict(self, state_dict)

    def save(self, path: str) -> None:
        """Write the parameters and the optimizer state to directory ``path``, one block at a time
        (a model larger than memory can be saved); :meth:`load` reads it back."""
        state_mod.save(self, path)

    def load(self, path: str) -> None:
        """Read what :meth:`save` wrote, one block at a time, checked whole before anything is written."""
        state_mod.load(self, path)

    # ---- layout ------------------------------------------------------------------------------

    @property
    def lr(self) -> float:
        """The first group's learning rate (settable; schedulers set each group's ``"lr"``)."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        for g in self.param_groups:
            g["lr"] = float(value)

    @property
    def state_kinds(self) -> tuple[str, ...]:
        return tuple(self.rule.state_kinds)

    @property
    def mode(self) -> str | None:
        """Where the optimizer phases run: "fused" (in the backward), "deferred" (in step()), or None
        before the first step's end decided it."""
        return self._mode

    def _part_kinds(self, b: Block) -> tuple[str, ...]:
        """The kinds each optimizer part of ``b`` has: g, the step rule's state, w for reduced precision."""
        return ("g", *self.state_kinds) + (("w",) if b.mixed else ())

    def _kinds(self, b: Block) -> list[str]:
        """The tensor kinds block ``b`` has (no tensors for a block all of whose parameters are shared)."""
        if not b.slots:
            return []
        return ["p"] + [b.part_kind(k, pt.index) for pt in b.parts for k in self._part_kinds(b)]

    def _tname(self, b: Block, kind: str) -> str:
        return f"{self._prefix}.{self._rank}.{'shared' if b.is_shared else b.index}.{kind}"

    def _create_named(self, name: str, size: int) -> Any:
        from .. import ExistsError

        try:
            return self.client.create(name, size)
        except ExistsError:
            # left by an earlier run of this job: start afresh
            self.client.open(name).destroy()
            return self.client.create(name, size)

    def _create(self, b: Block, kind: str, size: int) -> None:
        name = self._tname(b, kind)
        b.tensors[kind] = self._create_named(name, size)
        self._by_tname[name] = (b, kind)

    def _meta_name(self) -> str:
        return f"{self._prefix}.{self._rank}.{resume_mod.KIND}"

    def _placeholder(self, p: torch.Tensor) -> torch.Tensor:
        return torch.empty(0, dtype=p.dtype, device=self.device)

    def _unmap(self, s: Slot) -> None:
        """``s``'s parameter gets its placeholder; a change in place to it from now on is refused."""
        guards.unwatch_data(s.param)
        s.param.data = self._placeholder(s.param)
        s.ph_version = s.param._version
        guards.watch_data(s.param)              # (p.data.clamp_() counted in _version too)

    def describe(self) -> str:
        """The blocks, their bytes per kind of state, and what the job's budgets mean for them."""
        return discovery.describe(self.blocks, state_kinds=self.state_kinds, placement=self.placement,
                                  limits=explain.limits(self), model=self.model)

    # ---- errors in the model's words (explain.py) ----------------------------------------------

    def _explained(self, b: Block | None, what: str) -> "explain.Explained":
        return explain.Explained(self, b, what)

    # ---- phases ------------------------------------------------------------------------------

    def param_owners(self, b: Block) -> list[Block]:
        """The blocks whose p holds the parameters block ``b``'s module uses: its own, and the shared one."""
        out = [b] if b.slots else []
        if b.shared:
            out.append(self.blocks[-1])
        return out

    def _needs(self, key: Key) -> list[tuple[Block, str, int, int]]:
        """(block holding the tensor, tensor kind, tier, mode) phase ``key`` needs."""
        kind, i, k, micro = key
        b = self.blocks[i]
        act = "a" in b.tensors
        shared = [(self.blocks[-1], "p", VRAM, READ)] if b.shared else []
        if kind == "f":
            own = [(b, "p", VRAM, READ)] if b.slots else []
            return own + shared + ([(b, "a", HOST, WRITE)] if act else [])
        if kind == "b":
            # the first micro-batch writes the gradients, the others add to them
            gmode = WRITE if micro == 0 else READ_WRITE
            own = [(b, "p", VRAM, READ)] + [(b, b.part_kind("g", pt.index), VRAM, gmode) for pt in b.parts] \
                if b.slots else []
            return own + shared + ([(b, "a", HOST, READ)] if act else [])
        state = [(b, b.part_kind(sk, k), HOST, READ_WRITE) for sk in self.state_kinds]
        # the shared block's gradients are written whole from autograd's .grad in its optimizer phase
        grads = [(b, b.part_kind("g", k), HOST, WRITE if b.is_shared else READ)]
        if b.mixed:
            # p is written from the master weights: whole in one phase (its old bytes need not come),
            # a part of it in each of several; deferred, not write-only: tierd would drop p after the
            # backward, where state_dict() or an evaluation may read it before step()
            pmode = WRITE if len(b.parts) == 1 and self._mode == "fused" else READ_WRITE
            return [(b, "p", HOST, pmode), (b, b.part_kind("w", k), HOST, READ_WRITE)] + grads + state
        return [(b, "p", HOST, READ_WRITE)] + grads + state

    def _plan_needs(self, key: Key) -> list[tuple[Any, int, int]]:
        return [(blk.tensors[k], tier, mode) for blk, k, tier, mode in self._needs(key)]

    def _check_restarts(self) -> None:
        """A restart another call found (the client's count moved): the plan goes in again first."""
        if getattr(self.client, "restarts", 0) != self._client_restarts:
            self._restarted()

    def _enter(self, kind: str, b: Block, part: int = 0) -> None:
        for attempt in range(RESTART_TRIES + 1):
            try:
                self._check_restarts()
                self._enter_once(kind, b, part)
                return
            except RestartedError:
                if attempt == RESTART_TRIES:
                    raise
                self._restarted()

    def _restarted(self) -> None:
        """tierd restarted (a Client made with ``reconnect=``): what the connection held is gone,
        the tensors are back (what a clean stop wrote down, or what its memory kept); the plan goes
        in again and the phase being entered is entered again.  The phases before wrote through
        tierd's mappings of before, which tierd wrote down as it stopped."""
        self.restarts += 1
        self._client_restarts = self.client.restarts
        self._held.clear()
        self._fences = []
        self._early = None
        if self.tracer.planned:
            with self._explained(None, "submitting the plan again after tierd restarted"):
                self.client.resubmit_plan()

    def _enter_once(self, kind: str, b: Block, part: int = 0) -> None:
        key = (kind, b.index, part, self._cur if kind != "o" else 0)
        for blk in self._mapped:        # (not every block's: a pass over the blocks at each phase is quadratic)
            blk.maps.clear()
        needs = self._needs(key)
        self._mapped = [blk for blk, _, _, _ in needs]
        if self.device.type == "cuda":
            # kernels queued on the stream still read (and write) the phase's VRAM: they finish
            # before tierd may move it
            torch.cuda.current_stream().synchronize()
        what = {"f": "its forward phase", "b": "its backward phase", "o": "its optimizer phase"}[kind]
        if kind == "o" and len(b.parts) > 1:
            what += f" (part {part + 1} of {len(b.parts)})"
        if key[3]:
            what += f" (micro-batch {key[3] + 1})"
        # an evaluation inside a step (after a forward with gradients) pins outside the plan: in its phases
        # tierd would go on through the step's others, and drop their gradients as dead (to be written whole)
        if self.tracer.planned and not (kind == "f" and not self._training and self._micro > 0):
            self._release()                 # (an evaluation's pins)
            k = self.tracer.lookup(key, b.label)
            if self._early != key:
                with self._explained(b, f"entering {what}"):
                    self.client.phase(k)
            self._early = None
            with self._explained(b, f"mapping {what}"):
                for blk, tk, tier, _ in needs:
                    blk.maps[(tk, tier)] = self.client.phase_grant(blk.tensors[tk], tier).torch()
        else:
            self._release()
            # the first step pins phase by phase, unplanned: the write-downs of the phases before
            # end first, so that the room they free is free (tierd cannot wait for room a queued
            # eviction will free: a pin then would fail for want of room that is coming)
            self.flush()
            tracing = self._first_step and (kind != "f" or self._training)   # an evaluation is no step
            if tracing:
                self.tracer.check_new(key, b.label, "a block that runs more than once per micro-batch (weights "
                                      "shared across time) is not supported; make the repeated part one block's "
                                      "inside (activation checkpointing, which runs a block's forward again in "
                                      "its backward, is)")
            for blk, tk, tier, mode in needs:
                if tk == "a" and not self._training:
                    continue            # (an evaluation saves no activations)
                t = blk.tensors[tk]
                whose = "its" if blk is b else f"{blk.label}'s"
                with self._explained(b, f"{what}, pinning {whose} {tk} ({fmt_bytes(blk.kind_bytes(tk))}) in "
                                        f"{'vram' if tier == VRAM else 'host'}"):
                    g = t.pin(tier, mode)
                self._held.append((t, tier, bool(mode & WRITE)))
                blk.maps[(tk, tier)] = g.torch()
            if tracing:
                self.tracer.record(key)
        self._phase = key
        self._write_down(key)

    def _write_down(self, now: Key | None) -> None:
        """Placements B and C: what optimizer phases left goes down to NVMe, but what the phase just
        entered (``now``; None: no phase) pins itself."""
        keep = {(blk.index, tk) for blk, tk, _, _ in self._needs(now)} if now is not None else set()
        for b, kinds in self._down:
            for k in kinds:
                if (b.index, k) not in keep and k in b.tensors:
                    self._bound_write_downs()
                    self._fences.append(b.tensors[k].evict_async(NVME))
        self._down.clear()

    def _release(self) -> None:
        try:
            for t, tier, dirty in self._held:
                t.unpin(tier, dirty)
        except RestartedError:
            self._restarted()           # (its pins went with the connection: tierd wrote them down)
        self._held.clear()

    def _point(self, b: Block, on: bool) -> None:
        """Point ``b``'s module's parameters at their mapped copies (``on``) or at the placeholders."""
        with guards.direct():
            for owner in self.param_owners(b):
                flat = owner.maps[("p", VRAM)] if on else None
                for s in (owner.slots if owner is b else b.shared):
                    if on:
                        s.param.data = s.view(flat, "p")    # (watched still: p.data.clamp_() there is seen too)
                        s.map_version = s.param._version
                    else:
                        guards.note_mapped_write(self, s)
                        self._unmap(s)

    # ---- what the hooks call ------------------------------------------------------------------

    def forward_begins(self) -> None:
        if self._closed:
            raise RuntimeError("this Offload engine is closed")
        guards.check_backward(self, "the model's forward")
        self.tracer.forwards.clear()    # (a forward that raised did not end)
        guards.drop_failed_forward(self)
        guards.check_params(self, "the model's forward")
        if self._applied and not torch.is_grad_enabled():       # (with gradients: the accumulation's refusal)
            raise RuntimeError(f"a forward between backward() and step(): {FUSED_NOTE} the parameters are this "
                               "step's updated ones already, where torch's forward would see the last step's; "
                               "call step() first, or make the engine with optimizer_in_backward=False")
        self.model_hooks.forget()
        try:
            self._collect_fences()
        except RestartedError:          # (a check joined the next tierd: no phase is held here)
            self._restarted()
        self._training = torch.is_grad_enabled()
        if not self._training:
            return
        if self._zero_kept:
            self._drop_step()       # (a forward, zero_grad(), and no backward: that step is skipped)
        self._bwd_tried = self._fwd_dropped = False
        guards.note_kept_grads(self)    # (the last step's, not zeroed: torch would add to them)
        clip.drop_moved_grads(self)     # (autograd would add this backward's gradients to them)
        optim.check_groups(self)        # (fused: its updates run in this backward)
        if self._micro > 0 and (self._mode == "fused" or (self._mode is None and self.optimizer_in_backward)):
            guards.refuse_second_forward(self)
        self._cur = self._micro
        self._micro += 1
        self._fwd_open = len(self.tracer.seq)       # (planned: the plan, kept whole)

    def forward_ends(self) -> None:
        self._fwd_open = None
        if self.tracer.planned and self._training:
            self.tracer.forward_ended(lambda i: self.blocks[i].label)
        else:
            self.tracer.forwards.clear()

    def backward_begins(self) -> None:
        """The first gradient of a backward through the model's output: its end is queued."""
        if self._in_backward:
            return
        guards.check_one_forward(self)
        if self._clip_coef is not None:
            # torch would scale only the gradients before the clip; here the factor applies in the
            # optimizer phases, to the sum
            raise RuntimeError("backward() after clip_grad_norm_ in the same step: tier.torch applies the "
                               "clipping factor to the summed gradients in the optimizer phases; clip once "
                               "between the last backward() and step()")
        self._in_backward = True
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)

    def _backward_ended(self) -> None:
        """autograd's callback at the end of the backward pass: the last block's gradients are complete."""
        if self._bwd is not None:
            guards.check_sparse_grads(self, self._bwd)  # (before the finally: in the backward that raised)
        try:
            if self._bwd is not None:
                self._finish(self._bwd)
            if self._mode == "fused" and self.blocks[-1].is_shared:
                self._finish_shared()
            self._backwards += 1
            self._hyper_at_backward = hyper_of(self.param_groups)
        finally:
            self._in_backward = False

    def block_forward(self, b: Block) -> None:
        if self._in_backward:
            # a forward run again in the backward (activation checkpointing): in the block's backward
            # phase, entered now if autograd has not reached it yet (a reentrant checkpoint)
            if self._bwd is not b:
                self.block_backward(b)
            return
        guards.check_in_forward(self, b)
        if self._training and self.tracer.planned:
            self.tracer.check_again(b.index, b.label)
        self._enter("f", b)
        self._point(b, True)
        self._in_block = b
        b.act_used = 0
        if self._training:
            self.tracer.forwards.add(b.index)

    def block_forward_done(self, b: Block) -> None:
        if self._in_backward:
            return                      # a recomputation: the backward phase goes on
        self._in_block = None
        self._point(b, False)

    def forward_block(self) -> Block | None:
        """The block whose forward phase runs (for saved tensors), or None."""
        if self._phase is None or self._phase[0] != "f" or self._in_backward:
            return None
        return self.blocks[self._phase[1]]

    def block_backward(self, b: Block) -> None:
        if self._bwd is b:
            return                      # (its recomputed outputs' gradients, a checkpoint's inner backward)
        if not self._in_backward:
            guards.check_one_forward(self)      # (the last block's hook runs before the output's: refused first)
        if self._bwd is not None:
            guards.check_sparse_grads(self, self._bwd)
            self._finish(self._bwd)
        self._enter("b", b)
        self._point(b, True)
        self._bwd = b

    def stash(self, b: Block, t: torch.Tensor) -> Any:
        """An activation block ``b``'s forward saves: into its a tensor, when it is on and there is room."""
        if not self.offload_activations or self._in_block is not b or not t.is_contiguous():
            return t
        n = t.numel() * t.element_size()
        if n < self.activation_min_bytes:
            return t
        if self._first_step:
            b.act_bytes += layout.align(n)      # measured: the a tensor is made this big with the plan
            return t
        amap = b.maps.get(("a", HOST))
        if amap is None or b.act_used + n > b.act_bytes:
            self.activations_kept += n
            return t
        off = b.act_used
        amap[off:off + n].view(t.dtype).view(t.shape).copy_(t)
        b.act_used += layout.align(n)
        self.activations_stashed += n
        return Stashed(b.index, off, t.shape, t.dtype, t.device)

    def unstash(self, x: Stashed) -> torch.Tensor:
        b = self.blocks[x.block]
        amap = b.maps.get(("a", HOST))
        if amap is None:
            raise RuntimeError(f"{b.label}: its backward needs its saved activations outside its backward phase "
                               "(the model's blocks do not run one after another)")
        n = math.prod(x.shape) * layout.esize(x.dtype)
        t = amap[x.offset:x.offset + n].view(x.dtype).view(x.shape)
        return t if x.device == t.device else t.to(x.device)

    # ---- backward and optimizer ------------------------------------------------------------

    @property
    def _deferred(self) -> bool:
        return self._mode != "fused"    # the first step defers, whatever comes after it

    def _finish(self, b: Block) -> None:
        """b's gradients are complete: into its g tensors (added to them after the first micro-batch),
        then its optimizer phases if they are fused into the backward."""
        if b.slots:
            collective.fill_unused([s.param for s in b.slots if s.trainable], self._world, self._group)
            with guards.direct():
                got = {id(s): s.param.grad for s in b.slots}
            grads = [got[id(s)] for s in b.slots if s.trainable and got[id(s)] is not None]
            collective.allreduce_mean(grads, self._world, self._group)
            add = self._cur > 0
            for pt in b.parts:
                gflat = b.maps[(b.part_kind("g", pt.index), VRAM)]
                for pc in pt.pieces:
                    dst = pc.view(gflat, "g")
                    grad = got[id(pc.slot)]
                    if grad is not None:
                        if add and id(pc.slot) in self._got:
                            dst.add_(pc.of(grad))
                        else:
                            dst.copy_(pc.of(grad))
                    elif not (add and id(pc.slot) in self._got):
                        dst.zero_()
            for s in b.slots:
                if got[id(s)] is not None:
                    self._got.add(id(s))
                    s.had_grad = True
                    clip.grad_moved(s.param, s.name)
            if self._deferred:
                clip.note_norms(self, b)
        self._point(b, False)
        self._bwd = None
        if not self._deferred:
            self._applied = self._applied or bool(b.parts)
            self._stepped[b.label] = None
            self._optimize(b)

    def _optimize(self, b: Block) -> None:
        """b's optimizer phases: the update, then the write-downs its placement asks for."""
        for pt in b.parts:
            self._enter("o", b, pt.index)
            optim.update_part(self, b, pt.index)
            self._queue_write_down(b, pt.index)

    def _finish_shared(self) -> None:
        """After the whole backward: the shared block's gradients (every use's, summed by autograd), its update."""
        sb = self.blocks[-1]
        self.reduce_shared()
        self._applied = self._applied or not self._deferred
        for s in sb.slots:
            if s.param.grad is not None:
                self._got.add(id(s))
                s.had_grad = True
        for pt in sb.parts:
            self._enter("o", sb, pt.index)
            gflat = sb.maps[(sb.part_kind("g", pt.index), HOST)]
            for pc in pt.pieces:
                grad = pc.slot.param.grad
                dst = pc.view(gflat, "g")
                if grad is None:
                    dst.zero_()
                else:
                    dst.copy_(pc.of(grad))
            optim.update_part(self, sb, pt.index, clip_now=False)     # a clip scaled its .grad in place already
            self._queue_write_down(sb, pt.index)
        for s in sb.slots:
            if s.param.grad is not None:
                clip.grad_moved(s.param, s.name)

    def reduce_shared(self) -> None:
        """The shared block's gradients (autograd's .grad, summed over the step's micro-batches)
        averaged over the ranks, once a step: before a clip's norm, or the shared optimizer phase."""
        if self._shared_reduced or not self.blocks[-1].is_shared:
            return
        self._shared_reduced = True
        collective.allreduce_mean([s.param.grad for s in self.blocks[-1].slots if s.trainable and s.param.grad
                                   is not None], self._world, self._group)

    def _queue_write_down(self, b: Block, k: int) -> None:
        kinds = placement_mod.write_down_kinds(self.placement, self.state_kinds, b.mixed)
        last = k == len(b.parts) - 1
        kinds = tuple(kind if kind == "p" else b.part_kind(kind, k) for kind in kinds if kind != "p" or last)
        if kinds:
            self._down.append((b, kinds))

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the gradients gathered since the last step (that call
        comes here by itself for the model's parameters): the same total norm, returned, and the same
        scaling, applied to each gradient in its optimizer phase.  Refused, before anything changes,
        where the optimizer already ran in the backward (the first step did not clip)."""
        return clip.clip_grad_norm(self, list(parameters), max_norm, norm_type, error_if_nonfinite)

    def step(self, closure: Any = None) -> Any:
        """After ``loss.backward()``: the optimizer phases still due, and the next step's bookkeeping.
        A ``closure`` (torch.optim's: zero_grad(), the forward and the backward, returning the loss, as
        PyTorch Lightning passes one) is called first, with gradients on, and its loss returned; the
        update runs after it returns (a closure makes the engine deferred; fused, one is refused).

        Deferred (gradients accumulated or clipped, a closure: :attr:`mode`), every block's optimizer
        phases run here, the clipping factor applied; fused, only the shared block's are left, if the
        backward's end did not run them.  With the plan running (from the second step on), it ends by entering the
        next step's first phase (one ``tier_phase_enter()``, no round trip): tierd holds the last
        optimizer phase's pins until the next phase begins, so only then can that phase's
        write-downs (placements B and C) be issued, and this way they are issued in the step they
        belong to; :meth:`flush` waits for them."""
        self.model_hooks.forget()
        loss = optim.run_closure(self, closure) if closure is not None else None
        guards.check_backward(self, "step()")
        guards.check_step_again(self)
        changed = hyper_changed(self._hyper_at_backward, self.param_groups)
        if changed is not None and self._mode == "fused":
            self._hyper_at_backward = None
            raise RuntimeError(f"step() after the parameter groups changed since backward() ({changed}): "
                               "tier.torch ran this step's optimizer inside the backward, with the values "
                               "before, where torch.optim would use the new ones; set hyperparameters before "
                               "backward() (a scheduler's step() after engine.step() does), or make the engine "
                               "with optimizer_in_backward=False")
        guards.drop_failed_forward(self)
        if self._zero_kept:
            self._drop_step()       # (a forward, zero_grad(), step(): the forward had no backward)
        self._bwd_tried = self._fwd_dropped = False
        guards.check_params(self, "step()")
        optim.check_groups(self)
        if self._first_step and not self._got and self._bwd is None:
            # no gradient yet (a step() before any backward): torch.optim changes nothing; nothing is
            # planned from it (an empty plan made every later forward "a block not in the first step")
            for b in self.blocks:
                b.maps.clear()
            self._phase, self._micro = None, 0
            self._release()
            self.tracer.seq, self.tracer.index = [], {}
            return loss
        if self._bwd is not None:       # a backward whose end autograd did not report (not through the model)
            self._finish(self._bwd)
            if self._mode == "fused" and self.blocks[-1].is_shared:
                self._finish_shared()
        if self._deferred:
            for b in self.tracer.order(self.blocks):
                self._optimize(b)
            if self.blocks[-1].is_shared:
                self._finish_shared()
        elif self._grads_zeroed:
            # fused, a block the backward did not reach (a loss left it out): where zero_grad() left zeros
            # in .grad, torch.optim updates the parameter all the same
            for b in self.tracer.order(self.blocks):
                if b.label not in self._stepped and any(s.had_grad for s in b.slots):
                    self._optimize(b)
        for b in self.blocks:
            b.maps.clear()
        self._phase = None
        micro, clipped = self._micro, self._clip_coef is not None
        self._micro = self._backwards = 0
        self._cur = 0
        self._got.clear()
        self._norms.clear()
        self._maxabs.clear()
        self._clip_coef = None
        self._clip_ids = set()
        self._shared_reduced = False
        self._hyper_at_backward = None
        self._applied = False
        self._stepped = {}
        if not self.tracer.planned:
            self._release()
            self._write_down(None)          # nothing is pinned now
            if self._first_step:
                try:
                    self.tracer.add_backwards({b.index for b in self.blocks if any(s.trainable for s in b.slots)})
                    optim.decide_mode(self, micro, clipped, changed)
                    self._submit_plan()
                except Exception as e:
                    # the step ran (its update is in); its plan did not go: the next step is traced again
                    self._mode = None
                    self.tracer.seq, self.tracer.index, self.tracer.planned = [], {}, False
                    self.steps += 1
                    e.add_note("tier.torch: this step's update was applied; the plan traced in it was not "
                               "submitted, so the next step is traced and submits it again")
                    raise
        elif self.tracer.seq:
            first = self.tracer.seq[0]
            for attempt in range(RESTART_TRIES + 1):
                try:
                    self._check_restarts()
                    with self._explained(self.blocks[first[1]], "entering the next step's first phase"):
                        self.client.phase(self.tracer.index[first])
                    self._early = first
                    self._write_down(first)
                    break
                except RestartedError:
                    if attempt == RESTART_TRIES:
                        raise
                    self._restarted()
        self.steps += 1
        self._first_step = False
        if self.resume:
            self._commit()
        return loss

    def _commit(self) -> None:
        """The step is over: the job is committed (after the resume record), a round trip and a small
        write.  tierd refuses a commit while a tensor is pinned for reading and writing: here the
        optimizer phases' pins went with the next step's first phase."""
        for attempt in range(RESTART_TRIES + 1):
            try:
                self._check_restarts()
                resume_mod.write_meta(self)
                with self._explained(None, f"committing step {self.steps}"):
                    resume_mod.commit(self)
                return
            except RestartedError:
                if attempt == RESTART_TRIES:
                    raise
                self._restarted()

    def flush(self) -> None:
        """Wait until the write-downs to NVMe in flight have ended (placements B and C evict each
        block's state after its optimizer phase without waiting): afterwards tierd's byte counters
        include them, and the state is on NVMe.  Not needed for correctness."""
        try:
            for f in self._fences:
                self._fence_done(f, True)
        except RestartedError:          # (the wait joined the next tierd: the rest went with the connection)
            self._restarted()
        self._fences = []

    def _fence_done(self, f: Any, wait: bool) -> bool:
        return placement_mod.fence_done(self, f, wait)

    # Write-downs in flight at most: tierd refuses a connection's requests beyond [limits] max_inflight
    # (64 by default) with EBUSY, and the pins and prefetches of the phases need room beside them.
    WRITE_DOWNS_IN_FLIGHT = 16

    def _bound_write_downs(self) -> None:
        """Before another write-down: drop the ended ones, and wait for the oldest while at the bound."""
        if len(self._fences) < self.WRITE_DOWNS_IN_FLIGHT:
            return
        self._collect_fences()
        while len(self._fences) >= self.WRITE_DOWNS_IN_FLIGHT:
            self._fence_done(self._fences.pop(0), True)

    def _collect_fences(self) -> None:
        self._fences = [f for f in self._fences if not self._fence_done(f, False)]

    def _submit_plan(self) -> None:
        for b in self.blocks:
            if self.offload_activations and b.act_bytes:
                self._create(b, "a", b.act_bytes)
        with self._explained(None, "submitting the plan traced in the first step"):
            self.tracer.submit(self.client, self._plan_needs)

    # ---- state ------------------------------------------------------------------------------

    @property
    def phases(self) -> list[Key]:
        """The step's phases as traced in the first step: (kind, block index, part, micro-batch)."""
        return list(self.tracer.seq)

    def check_idle(self, what: str) -> None:
        guards.check_backward(self, what)
        if self._in_backward or self._bwd is not None:
            raise RuntimeError(f"{what} inside a backward pass: call it before the forward or after step()")
        if self._applied:
            raise RuntimeError(f"{what} between backward() and step(): {FUSED_NOTE} the parameters and the optimizer "
                               "state are this step's already, where torch.optim's are still the last step's; call "
                               "it after step(), or make the engine with optimizer_in_backward=False")

    def parameters_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter by every name, copied out of tierd (what model.state_dict() holds of them)."""
        self.check_idle("reading the parameters")
        return state_mod.parameters_state_dict(self)

    @property
    def stall(self) -> float:
        """Seconds spent waiting in phases for tierd to bring data, so far."""
        return self.client.phase_stall

    def close(self, restore: bool = True) -> None:
        """Give the parameters back to the model (``restore``), drop the hooks and tierd's tensors."""
        if self._closed:
            return
        if restore and guards.partly_applied(self):
            warnings.warn("closing after a backward that raised partway through a fused step: the model gets "
                          f"back parameters of which some blocks' ({', '.join(self._stepped)}) were updated and "
                          "the others not", TierTorchWarning, stacklevel=2)
        self.flush()
        self._release()                     # a first step that failed holds its phase's pins
        self._bwd = None
        self._in_backward = False
        values = state_mod.parameters_state_dict(self) if restore else None
        if self.tracer.planned:
            self.client.end_plan()          # its tensors may go now
            self.tracer.planned = False
        self.hooks.detach()
        self.model_hooks.detach()
        clip.unregister(self)
        gradcall.unregister(self)
        guards.release_params(self)
        for b in self.blocks:
            for s in b.slots:
                guards.unwatch_data(s.param)
                s.param.data = values[s.name] if values is not None else self._placeholder(s.param)
            for t in b.tensors.values():
                t.destroy()
            b.tensors.clear()
        if self._meta is not None:
            self._meta.destroy()
            self._meta = None
        self._closed = True

    def __enter__(self) -> "Offload":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __deepcopy__(self, memo: dict) -> None:
        raise RuntimeError(state_mod.ENGINE_COPY_NOTE)

    def __reduce_ex__(self, protocol: Any) -> None:
        raise RuntimeError(state_mod.ENGINE_COPY_NOTE)

    def __repr__(self) -> str:
        return (f"tier.torch.Offload({self.rule.name}, {len(self.blocks)} blocks, placement {self.placement}, "
                f"{len(self.param_groups)} parameter group(s), mode {self._mode or 'undecided'})")
