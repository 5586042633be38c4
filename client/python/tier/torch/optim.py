# SPDX-License-Identifier: MIT
"""tier.torch.optim: the optimizer step behind a small interface.

The engine runs a block's optimizer phase on the host tier: the block's
parameters (its float32 master weights for reduced precision), gradients
and the rule's state are mapped there, and a :class:`StepRule` updates
them in place.  A rule names the state it keeps (tensor kinds of the
layout, float32, one value per parameter element) and does one update of
a list of parameters of one parameter group with torch's own single-tensor
code, so that the bits are those ``torch.optim`` computes.

Each parameter counts its own updates (``Slot.steps``), as ``torch.optim``
keeps a per-parameter "step": a parameter that got no gradient in a step
is not updated (and its count does not move), as ``torch.optim`` skips a
parameter whose ``.grad`` is None; unless the last ``zero_grad()`` left
zeros there (``set_to_none=False``) after an earlier gradient: then it is
updated with zeros, as torch is.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Protocol, Sequence

import torch
import torch.optim.adamw as _adamw
import torch.optim.sgd as _sgd

from .. import HOST


class StepRule(Protocol):
    """What the engine asks of an optimizer step."""

    #: a name for messages and state_dict()
    name: str
    #: tensor kinds of the layout it keeps per parameter (float32), e.g. ("m", "v")
    state_kinds: tuple[str, ...]
    #: hyperparameters a parameter group may set, with their defaults
    defaults: dict[str, Any]

    def update(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
               state: dict[str, Sequence[torch.Tensor]], steps: Sequence[int], group: dict[str, Any]) -> None:
        """One update, in place, of ``params`` (float32 masters) with ``grads`` (float32), ``state``
        (kind -> a tensor per parameter), ``steps`` (each parameter's count of updates before this
        one) and the group's hyperparameters."""
        ...

    def state_names(self) -> dict[str, str]:
        """torch.optim's names of the state kinds ("m" -> "exp_avg"), for state_dict()."""
        ...

    def check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError for hyperparameters it cannot honour (before anything is made)."""
        ...

    def to_state(self, steps: int, tensors: dict[str, torch.Tensor], group: dict[str, Any]) -> dict[str, Any]:
        """torch.optim's per-parameter state entry from a count of updates and its state (by torch's names)."""
        ...

    def from_state(self, entry: dict[str, Any]) -> tuple[int, dict[str, torch.Tensor]]:
        """The count of updates and the state tensors (by torch's names) of a torch.optim state entry."""
        ...


def with_torch_keys(ours: dict[str, Any], cls: type) -> dict[str, Any]:
    """``ours`` (a rule's defaults) with the keys of a parameter group of torch.optim's ``cls`` it lacks, at
    torch's defaults (torch 1.13's SGD has ``differentiable``), so that a group and state_dict() have
    torch.optim's keys, as a checkpoint made by torch has them."""
    for k, p in inspect.signature(cls).parameters.items():
        if k != "params" and k not in ours and p.default is not inspect.Parameter.empty and \
                isinstance(p.default, (bool, int, float, type(None))):
            ours[k] = p.default
    return ours


def check_torch_keys(group: dict[str, Any]) -> None:
    """torch.optim's keys a group may carry (with_torch_keys(), a checkpoint of torch's, by name) that no rule
    can honour: refused (ValueError), as they were taken and ignored.  foreach= passes: torch 1.13's
    multi-tensor code gives the single-tensor code's bits on the CPU."""
    if group.get("differentiable"):
        raise ValueError("differentiable=True: tier.torch's optimizer step is not recorded by autograd (it runs "
                         "on the state in tierd, outside the graph), so nothing could differentiate through it; "
                         "use differentiable=False, or a torch.optim optimizer on a model without tier.torch")
    if group.get("fused"):
        raise ValueError("fused=True: tier.torch's optimizer step is torch's single-tensor code on the CPU, not "
                         "a fused kernel (whose bits differ); use fused=None or False")


class AdamW:
    """torch.optim.AdamW (amsgrad off), as its single-tensor code on the CPU computes it."""

    name = "AdamW"
    state_kinds = ("m", "v")

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                         "amsgrad": False, "maximize": False, "foreach": None, "capturable": False}
        with_torch_keys(self.defaults, torch.optim.AdamW)

    def update(self, params, grads, state, steps, group) -> None:
        step_t = [torch.tensor(float(n)) for n in steps]          # adamw() counts this update in itself
        b1, b2 = group["betas"]
        _adamw.adamw(list(params), list(grads), list(state["m"]), list(state["v"]), [], step_t, foreach=False,
                     capturable=False, amsgrad=False, beta1=b1, beta2=b2, lr=group["lr"],
                     weight_decay=group["weight_decay"], eps=group["eps"], maximize=group.get("maximize", False))

    def state_names(self) -> dict[str, str]:
        return {"m": "exp_avg", "v": "exp_avg_sq"}

    def to_state(self, steps, tensors, group):
        return {"step": torch.tensor(float(steps)), **tensors}

    def from_state(self, entry):
        if "step" not in entry:
            raise ValueError("an AdamW state entry needs 'step'")
        return int(float(entry["step"])), {k: entry[k] for k in ("exp_avg", "exp_avg_sq") if k in entry}

    def check_group(self, group: dict[str, Any]) -> None:
        check_torch_keys(group)
        if group.get("amsgrad"):
            raise ValueError("amsgrad=True: tier.torch's AdamW keeps no max_exp_avg_sq (use amsgrad=False)")
        if group.get("capturable"):
            raise ValueError("capturable=True: tier.torch's optimizer runs on the CPU (use capturable=False)")
        b1, b2 = group["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0) or group["lr"] < 0 or group["eps"] < 0 or \
                group["weight_decay"] < 0:
            raise ValueError(f"invalid AdamW hyperparameters: lr {group['lr']}, betas {group['betas']}, "
                             f"eps {group['eps']}, weight_decay {group['weight_decay']}")


class SGD:
    """torch.optim.SGD with momentum (and dampening, nesterov, weight decay), its single-tensor code.

    torch keeps no momentum buffer before a parameter's first update and starts it as a copy of the
    gradient: the buffer here (kind m) starts as zeros and is set to the gradient at a parameter's
    first update, which is the same thing."""

    name = "SGD"
    state_kinds = ("m",)

    def __init__(self, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening (as torch.optim.SGD)")
        self.defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                         "nesterov": nesterov, "maximize": False, "foreach": None}
        with_torch_keys(self.defaults, torch.optim.SGD)
        self.no_buffer: set[int] = set()        # id(group) of the groups updated with momentum 0 only, so far

    def update(self, params, grads, state, steps, group) -> None:
        if group["momentum"] == 0:
            self.no_buffer.add(id(group))
        else:
            self.no_buffer.discard(id(group))
        bufs: list[torch.Tensor | None] = []
        for m, n in zip(state["m"], steps):
            bufs.append(m if n > 0 else None)
        out = list(bufs)
        _sgd.sgd(list(params), list(grads), out, weight_decay=group["weight_decay"], momentum=group["momentum"],
                 lr=group["lr"], dampening=group["dampening"], nesterov=group["nesterov"],
                 maximize=group.get("maximize", False), foreach=False)
        if group["momentum"] != 0:
            for m, old, new in zip(state["m"], bufs, out):
                if old is None and new is not None:
                    m.copy_(new)    # the first buffer torch made (a clone of the gradient) goes into m

    def state_names(self) -> dict[str, str]:
        return {"m": "momentum_buffer"}

    def to_state(self, steps, tensors, group):
        return {"momentum_buffer": tensors["momentum_buffer"] if group["momentum"] != 0 else None}

    def from_state(self, entry):
        buf = entry.get("momentum_buffer")
        return (1, {"momentum_buffer": buf}) if buf is not None else (0, {})

    def check_group(self, group: dict[str, Any]) -> None:
        check_torch_keys(group)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening (as torch.optim.SGD)")
        if group["momentum"] != 0 and group["dampening"] != 0 and id(group) in self.no_buffer:
            # torch starts the buffer as a copy of the gradient at the first update with momentum; here it
            # is zeros from the start (the same thing while dampening is 0)
            raise ValueError(f"SGD momentum {group['momentum']} with dampening {group['dampening']} in a group "
                             "updated with momentum 0 until now: torch.optim starts its momentum buffer then, "
                             "tier.torch keeps one from the first step; give the group its momentum from the "
                             "first step, or no dampening")
        if group["lr"] < 0 or group["momentum"] < 0 or group["weight_decay"] < 0:
            raise ValueError(f"invalid SGD hyperparameters: {group}")


def group_defaults(rule: StepRule, more: dict[str, Any]) -> dict[str, Any]:
    """The parameter groups' defaults: the rule's, with the hyperparameters given to Offload by name beyond
    its own arguments (SGD's nesterov= and dampening=, AdamW's maximize=, as torch.optim's classes take
    them), checked as a group's are (check_group()); a name the rule does not know is refused, naming
    those it knows."""
    unknown = [k for k in more if k not in rule.defaults]
    if unknown:
        raise TypeError(f"Offload() got an unexpected keyword argument {unknown[0]!r}: {rule.name}'s hyperparameters "
                        f"are {', '.join(rule.defaults)} (optimizer='sgd' or 'adamw' chooses the rule)")
    return {**rule.defaults, **more}


def rule_from(optimizer: str | StepRule, **kw: Any) -> StepRule:
    """A StepRule from a name ("adamw", "sgd") and hyperparameters, or the rule given."""
    if not isinstance(optimizer, str):
        return optimizer
    name = optimizer.lower()
    if name == "adamw":
        return AdamW(**kw)
    if name == "sgd":
        return SGD(**kw)
    if name == "lbfgs":
        raise ValueError(f"optimizer={optimizer!r}: {LBFGS_NOTE}")
    raise ValueError(f"optimizer {optimizer!r}: tier.torch has 'adamw' and 'sgd' (or pass a StepRule)")


#: why an optimizer that evaluates the closure several times per step cannot be a StepRule
LBFGS_NOTE = ("LBFGS calls its closure several times per step (its line search runs the forward and the backward "
              "again at trial parameters), where tier.torch's step() calls the closure once and updates each "
              "block from that one backward's gradients (a StepRule sees no closure); not supported: use "
              "'adamw' or 'sgd', or torch.optim.LBFGS on the model without tier.torch")

#: what the engine calls on a StepRule
RULE_ATTRS = ("name", "state_kinds", "defaults", "update", "state_names", "check_group", "to_state", "from_state")


def check_rule(rule: Any) -> StepRule:
    """``rule`` (given as ``optimizer=``), if it is a StepRule; a ValueError saying what to pass for a
    torch.optim optimizer (its class or an instance) or another object, before anything is made."""
    cls = rule if isinstance(rule, type) else type(rule)
    if issubclass(cls, torch.optim.Optimizer):
        given = f"torch.optim.{cls.__name__}" + ("" if rule is cls else "(...)")
        if issubclass(cls, torch.optim.LBFGS):
            raise ValueError(f"optimizer={given}: {LBFGS_NOTE}")
        name = {"AdamW": "'adamw'", "SGD": "'sgd'"}.get(cls.__name__)
        raise ValueError(f"optimizer={given}: tier.torch runs the optimizer's step itself, torch's own code over "
                         "the state it keeps in tierd, not a torch.optim optimizer; "
                         + (f"pass optimizer={name} and the hyperparameters to Offload (lr=, weight_decay=, or "
                            "parameter groups as params)" if name else
                            "it has 'adamw' or 'sgd' (optimizer='adamw', with lr= and the other hyperparameters "
                            "given to Offload), or pass a StepRule (tier.torch.StepRule) of your own"))
    missing = [a for a in RULE_ATTRS if not hasattr(rule, a)]
    if missing:
        raise ValueError(f"optimizer={rule!r} is not a StepRule: it lacks {', '.join(missing)}; pass 'adamw' or "
                         "'sgd', or an object with what tier.torch.StepRule describes")
    return rule


def check_groups(eng: Any) -> None:
    """Every parameter group, as it is now, before a step's updates: what the rule cannot honour (a
    scheduler or the loop may have changed it since the engine was made) is refused first, and so are
    parameters moved between the groups (check_members())."""
    check_members(eng)
    for g in eng.param_groups:
        eng.rule.check_group(g)


def assign_groups(eng: Any) -> None:
    """Each slot's parameter group (Slot.group; -1: in no group, not optimized, as torch.optim leaves it); a
    group's parameter that is not the model's refused (ValueError).  One pass over the groups' parameters,
    each looked up by id: comparing every parameter with every group's members took seconds at 40960."""
    for b in eng.blocks:
        for s in b.slots:
            s.group = -1
    for gi, g in enumerate(eng.param_groups):
        for p in g["params"]:
            hit = eng.slot_of.get(id(p))
            if hit is None:
                raise ValueError(f"param_groups[{gi}] holds a parameter of shape {tuple(p.shape)} that is not one "
                                 "of the model's (tier.torch optimizes the model given it)")
            hit[1].group = gi


def remember_members(eng: Any) -> None:
    """What check_members() compares with: each group's parameters as the engine was made (eng._members, by
    id, a parameter twice refused, members_of()) and their lists (eng._member_lists, the fast path's)."""
    eng._members = members_of(eng.param_groups)
    eng._member_lists = [list(g["params"]) for g in eng.param_groups]


def members_of(groups: list[dict[str, Any]]) -> list[dict[int, None]]:
    """The parameters (their ids, in order) of each parameter group; one given twice in a group (torch.optim
    warns, and then updates it twice a step, the engine once) refused (ValueError)."""
    made = [dict.fromkeys(id(p) for p in g["params"]) for g in groups]
    for gi, (g, ids) in enumerate(zip(groups, made)):
        if len(ids) != len(g["params"]):
            raise ValueError(_twice(gi, g))
    return made


def _twice(gi: int, g: dict[str, Any]) -> str:
    seen: set[int] = set()
    p = next(p for p in g["params"] if id(p) in seen or seen.add(id(p)))
    return (f"tier.torch: param_groups[{gi}] holds a parameter of shape {tuple(p.shape)} twice: torch.optim (with a "
            "warning) updates it twice in each step, tier.torch once per parameter; give each parameter once")


def check_members(eng: Any) -> None:
    """The parameter groups hold the parameters they held when the engine was made (eng._members).
    torch.optim reads each group's "params" in every step(); the engine gave each parameter its group
    when it was made (Slot.group), and a parameter moved to another group
    (``param_groups[1]["params"].append(p)``), taken out of one, or a group added to or deleted from
    ``param_groups`` by hand was updated with its old group's hyperparameters, or failed deep inside
    (IndexError, KeyError): refused (ValueError), naming the change, before anything changes.  It runs at
    each forward with gradients and each step(): groups holding the very parameters they held, in their
    order, pass at the cost of an identity test each (no Python code per parameter); the full check, which
    names what changed, runs only where they do not."""
    groups = eng.param_groups
    lists = eng._member_lists
    if len(groups) == len(lists) and all(len(g["params"]) == len(was) and all(map(operator.is_, g["params"], was))
                                         for g, was in zip(groups, lists)):
        return
    made = eng._members
    what = None
    if len(groups) != len(made):
        what = f"{len(groups)} parameter groups now, {len(made)} when the engine was made"
    else:
        for gi, (g, was) in enumerate(zip(groups, made)):
            now = {id(p): p for p in g["params"]}
            if len(now) != len(g["params"]):
                raise ValueError(_twice(gi, g) + "; nothing changed")
            if now.keys() == was.keys():
                continue
            added = [p for k, p in now.items() if k not in was]
            if added:
                what = f"param_groups[{gi}] holds {param_name(eng, added[0])} now, not when the engine was made"
            else:
                gone = next(k for k in was if k not in now)
                to = [i for i, h in enumerate(groups) if any(id(p) == gone for p in h["params"])]
                what = f"{param_name(eng, eng.slot_of[gone][1].param)} " + (
                    f"moved from param_groups[{gi}] to param_groups[{to[0]}]" if to else f"left param_groups[{gi}]")
            break
    if what is not None:
        raise ValueError(f"tier.torch: the parameter groups changed since the engine was made ({what}): the "
                         "engine gave each parameter its group when it was made and does not follow parameters "
                         "moved between groups, added or removed, as torch.optim would; give each parameter its "
                         "group in Offload(params=[...]) and change a group's hyperparameters instead "
                         "(engine.param_groups[i]['weight_decay'] = 0.0), or close() the engine and make a new "
                         "one with the new groups")
    eng._member_lists = [list(g["params"]) for g in groups]     # (the same members, reordered: fast again)


def param_name(eng: Any, p: Any) -> str:
    """A parameter in words: the model's name for it, or its shape where it is not the model's."""
    hit = eng.slot_of.get(id(p))
    if hit is not None:
        return f"parameter {hit[1].name}"
    return f"a parameter of shape {tuple(getattr(p, 'shape', ()))} that is not the model's"


def hyper_of(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each parameter group's hyperparameters (all but its parameters), as they are now."""
    return [{k: v for k, v in g.items() if k != "params"} for g in groups]


def hyper_changed(then: list[dict[str, Any]] | None, groups: list[dict[str, Any]]) -> str | None:
    """What changed in ``groups`` since ``then`` (:func:`hyper_of`), e.g. "group 0 lr 0.1 -> 0.2"; None:
    nothing (or no ``then``)."""
    if then is None:
        return None
    for gi, (was, now) in enumerate(zip(then, hyper_of(groups))):
        for k in sorted(set(was) | set(now)):
            a, b = was.get(k), now.get(k)
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
            else:
                same = bool(a == b)
            if not same:
                return f"group {gi} {k} {a} -> {b}"
    return None


def run_closure(eng: Any, closure: Any) -> Any:
    """step(closure): torch.optim's closure (zero_grad(), the forward, the backward; it returns the loss),
    called with gradients on, as torch.optim's step() calls it; its loss returned.  torch.optim updates
    only once the closure returned: one that raises after its backward (a NaN check, logging) leaves the
    parameters and the state as they were.  Fused, the closure's backward would update every block before
    that, so a fused engine refuses a closure before calling it, and a closure in the first step (which
    runs deferred) makes the engine deferred (decide_mode()).  No round trip of its own."""
    if eng._mode == "fused" or (eng._mode is None and eng.optimizer_in_backward):
        raise RuntimeError(
            "step(closure) on an engine that runs the optimizer inside the backward (fused: "
            + ("optimizer_in_backward=True" if eng._mode is None else "its first step had one forward and "
               "backward, no clip_grad_norm_ and no closure, or optimizer_in_backward=True")
            + "): the closure's backward() would apply this step's update before the closure returns, so a "
            "closure that raised after it (a NaN check, logging) would leave the update in, where torch.optim's "
            "step() applies none.  Make the engine with optimizer_in_backward=False, or leave that out and pass "
            "the closure from the first step on (a closure then makes the engine update in step(), after it "
            "returns); nothing ran")
    eng._closure_seen = True
    with torch.enable_grad():
        return closure()


def decide_mode(eng: Any, micro: int, clipped: bool, changed: str | None = None) -> None:
    """After the first step: fused if it ran one micro-batch, no clipping and left the parameter
    groups as they were between backward() and step(), and no step(closure) came (run_closure()), and
    nothing forces deferred; deferred otherwise, the reason kept for the advice on errors (explain.advice());
    the traced phases reordered to match."""
    want = eng.optimizer_in_backward
    if want is None:
        want = micro <= 1 and not clipped and changed is None and not eng._closure_seen
    if want and (micro > 1 or clipped or changed is not None):
        raise RuntimeError("optimizer_in_backward=True, but the first step "
                           + ("accumulated several micro-batches" if micro > 1 else "clipped the gradients"
                              if clipped else f"changed the parameter groups between backward() and step() "
                              f"({changed})")
                           + ": that needs the optimizer after the whole backward (optimizer_in_backward=False)")
    eng._mode = "fused" if want else "deferred"
    eng._deferred_why = None if want else (
        "optimizer_in_backward=False" if eng.optimizer_in_backward is False else "the first step "
        + ("accumulated several micro-batches" if micro > 1 else "clipped the gradients" if clipped else
           "took a closure (step(closure): the update runs after it returns, as torch.optim's)"
           if eng._closure_seen else f"changed the parameter groups between backward() and step() ({changed})"))
    if eng._mode == "fused":
        eng.tracer.fuse()


def update_part(eng: Any, b: Any, k: int, clip_now: bool = True) -> None:
    """The step rule over part k of block b's parameters that got a gradient (torch.optim skips the
    others), group by group; the gradients scaled by this step's clipping factor first."""
    pt = b.parts[k]
    maps = {kind: b.maps[(b.part_kind(kind, k), HOST)] for kind in eng._part_kinds(b)}
    pflat = b.maps[("p", HOST)]
    coef = eng._clip_coef if clip_now else None
    by_group: dict[int, list[Any]] = {}
    for pc in pt.pieces:
        # torch.optim updates every parameter whose .grad is a tensor: one that got a gradient this step,
        # or any time before if zero_grad(set_to_none=False) left zeros there
        if pc.slot.trainable and pc.slot.group >= 0 and (
                id(pc.slot) in eng._got or (eng._grads_zeroed and pc.slot.had_grad)):
            by_group.setdefault(pc.slot.group, []).append(pc)
    for gi, todo in sorted(by_group.items()):
        masters = [pc.view(maps["w"], "w") if b.mixed else pc.of(pc.slot.view(pflat, "p")) for pc in todo]
        grads = []
        for pc in todo:
            g = pc.view(maps["g"], "g")
            g = g if id(pc.slot) in eng._got else torch.zeros_like(g)     # (g may be an older step's)
            if coef is not None and id(pc.slot) in eng._clip_ids:
                g = g.mul(coef)             # clip_grad_norm_'s g.mul_(clip_coef_clamped), on a copy
            grads.append(g.float())         # no copy when already float32
        eng.rule.update(masters, grads, {sk: [pc.view(maps[sk], sk) for pc in todo] for sk in eng.state_kinds},
                        [pc.slot.steps for pc in todo], eng.param_groups[gi])
        for pc in todo:
            if pc.end == pc.slot.numel:     # its last piece: the parameter had this step's update
                pc.slot.steps += 1
    if b.mixed:
        # the parameters, every one of the part (p is pinned write-only in a single part), are the
        # master weights rounded
        for pc in pt.pieces:
            pc.of(pc.slot.view(pflat, "p")).copy_(pc.view(maps["w"], "w"))
