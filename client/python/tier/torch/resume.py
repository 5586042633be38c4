# SPDX-License-Identifier: MIT
"""tier.torch.resume: a training process that crashed takes its job over again, without a checkpoint.

With ``Offload(..., resume=True)`` the engine commits the job at the end of
every step (``tier_job_commit()``): tierd then keeps, for each tensor written
after the commit, the committed version on NVMe until the next one.  The
commit goes with a small ``meta`` tensor the engine writes first: the layout
(every block's parameters: names, shapes, dtypes), the step rule, the
parameter groups' hyperparameters, each parameter's update count, the
engine's step count and the model's buffers (BatchNorm's running
statistics live in the process, not in tierd).

A process that makes the engine again with ``resume=True`` for a job that
lingers in tierd (``[daemon] linger_sec``; or that tierd found in its NVMe
index after a restart) rolls the job back to its last commit
(``tier_job_rollback()``: the blocks the crashed step had already updated
get their committed state back), reads the meta tensor, checks that the
model and the stored layout agree, and that the engine was made with the
same hyperparameters (the parameter groups as made: a scheduler's changes
since come back with the groups), before it changes anything of the
model's, and takes the tensors over as they are.  A commit tierd lost (its
data in memory only when tierd was killed without a service manager keeping
its memory) is refused, saying so, before the record is read.  ``engine.steps`` is then
the number of steps committed, ``engine.resumed`` True: the loop goes on from
there.  A job with no commit (a first run, or a crash before the first
step's end) starts afresh (``engine.resumed`` False), and so does one whose
last run ended (``close()`` destroys the record and every tensor).  An engine that
starts afresh (``resume=False`` too) destroys the record an earlier run left,
so a commit from before that is refused, not paired with the new tensors.
``resume=True`` is for a job of one rank: a commit takes every rank's tensors
at once.  It is refused, before anything changes, with several ranks of
``torch.distributed``, and, without it, while the job has another connection
when the engine is made (a rank in a process of its own, another
``tier.Client`` of the job: the rollback would bring its tensors back under
it); a connection that joins the job later is not seen.

What the loop itself must bring back: the batch of each step (start at
``engine.steps``) and its random numbers (seed each step from its number,
or save the RNG state), as for any resume; a learning-rate scheduler made
again with ``last_epoch=engine.steps - 1`` (the groups carry their
``initial_lr``).
"""

from __future__ import annotations

import io
import struct
import time
from typing import TYPE_CHECKING, Any

import torch

from .. import HOST, READ, WRITE
from ..errors import BusyError
from .optim import hyper_of

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Offload

FORMAT = "tier.torch resume"
VERSION = 1
KIND = "meta"
#: the meta tensor's room: four times what the first step's meta takes, at least this
META_MIN = 1 << 20
_LEN = struct.Struct("<Q")


#: the pauses (seconds) between the tries of a commit tierd refuses with EBUSY, about a minute in all: a
#: rank of the job of before a tierd restart that has not attached again holds a tensor for writing (it
#: attaches at its next call of tierd), another connection of the job holds one pinned for writing, or a
#: rollback waits for transfers; each ends without this process
COMMIT_PAUSES = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0, 8.0)
_sleep = time.sleep     # (a test replaces it, to order what the wait is for)


def commit(eng: "Offload") -> None:
    """``tier_job_commit()`` of the step just ended, tried again while tierd refuses it for a while (EBUSY,
    COMMIT_PAUSES); then the refusal, saying what was waited for and what to do."""
    for pause in (*COMMIT_PAUSES, None):
        try:
            eng.client.commit(eng.steps)
            return
        except BusyError as e:
            if pause is None:
                raise BusyError(e.errno, f"{e.strerror} (refused for {sum(COMMIT_PAUSES):.0f} s: tierd commits no "
                                "step while a rank of the job of before it restarted has not attached again, "
                                "which that rank's process does at its next call of tierd, or while another "
                                "process of the job holds one of its tensors pinned for writing; let it go on "
                                f"(or end it). Step {eng.steps} is applied but not committed: a resume now would "
                                "go back to the commit before; the next step() commits again)",
                                e.operation) from None
        _sleep(pause)


def layout(eng: "Offload") -> list[Any]:
    """What must agree between the run that committed and the one that resumes."""
    return [{"label": b.label, "kinds": {k: b.kind_bytes(k) for k in eng._kinds(b)},
             "slots": [{"names": list(s.names), "shape": list(s.shape), "dtype": str(s.dtype), "group": s.group}
                       for s in b.slots]}
            for b in eng.blocks]


def meta_bytes(eng: "Offload") -> bytes:
    groups = [{k: v for k, v in g.items() if k != "params"} for g in eng.param_groups]
    meta = {"format": FORMAT, "version": VERSION, "rule": eng.rule.name, "placement": eng.placement,
            "layout": layout(eng), "groups": groups, "steps": eng.steps, "mode": eng._mode,
            "slot_steps": [[s.steps for s in b.slots] for b in eng.blocks],
            # which .grad would be a tensor (zeros) after a zero_grad(): torch.optim updates those too
            "slot_had_grad": [[s.had_grad for s in b.slots] for b in eng.blocks],
            "grads_zeroed": eng._grads_zeroed,
            # the groups as the engine was made: a resume with other arguments is refused
            "made_groups": getattr(eng, "_made_groups", None),
            "buffers": {n: t.detach().cpu().clone() for n, t in eng.model.named_buffers()}}
    buf = io.BytesIO()
    torch.save(meta, buf)
    return buf.getvalue()


def write_meta(eng: "Offload") -> None:
    """The meta tensor, whole (created the first time, at four times its size)."""
    data = meta_bytes(eng)
    b = eng.blocks[0]
    if eng._meta is None:
        size = max(META_MIN, 4 * (len(data) + _LEN.size))
        eng._meta = eng._create_named(eng._meta_name(), size)
    if _LEN.size + len(data) > eng._meta.size:
        raise RuntimeError(f"tier.torch: the resume record grew to {len(data)} bytes, past the {eng._meta.size} "
                           "made for it at the first step (the model's buffers or parameter groups grew?)")
    with eng._explained(b, "writing the resume record"):
        with eng._meta.pin(HOST, WRITE) as g:
            flat = g.torch()
            flat[:_LEN.size].copy_(torch.frombuffer(bytearray(_LEN.pack(len(data))), dtype=torch.uint8))
            flat[_LEN.size:_LEN.size + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def discard_meta(eng: "Offload") -> None:
    """Starting afresh: destroy the resume record an earlier run of the job left, if any."""
    from .. import NotFoundError

    try:
        t = eng.client.open(eng._meta_name())
    except NotFoundError:
        return
    t.destroy()


def read_meta(eng: "Offload", t: Any) -> dict[str, Any]:
    with t.pin(HOST, READ) as g:
        flat = g.torch()
        (n,) = _LEN.unpack(bytes(flat[:_LEN.size].tolist()))
        if n > t.size - _LEN.size:
            raise ValueError(f"tier.torch: the job's resume record says {n} bytes in a tensor of {t.size}: damaged")
        data = bytes(flat[_LEN.size:_LEN.size + n].numpy().tobytes())
    meta = torch.load(io.BytesIO(data))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError("tier.torch: the job's resume record is not one tier.torch wrote")
    if meta.get("version") != VERSION:
        raise ValueError(f"tier.torch: the job's resume record is of version {meta.get('version')}, this "
                         f"tier.torch reads version {VERSION}")
    return meta


def _first_difference(saved: list[Any], mine: list[Any]) -> str:
    if len(saved) != len(mine):
        return f"{len(saved)} blocks then, {len(mine)} now"
    for a, b in zip(saved, mine):
        if a["label"] != b["label"]:
            return f"block {a['label']} then, {b['label']} now"
        if a["kinds"] != b["kinds"]:
            return f"{a['label']}: tensors {a['kinds']} then, {b['kinds']} now"
        if len(a["slots"]) != len(b["slots"]):
            return f"{a['label']}: {len(a['slots'])} parameters then, {len(b['slots'])} now"
        for x, y in zip(a["slots"], b["slots"]):
            if x != y:
                return (f"{a['label']}: parameter {x['names'][0]} {tuple(x['shape'])} {x['dtype']} (group "
                        f"{x['group']}) then, {y['names'][0]} {tuple(y['shape'])} {y['dtype']} (group {y['group']}) "
                        "now")
    return "?"


def _hyper_difference(saved: list[dict[str, Any]] | None, made: list[dict[str, Any]]) -> str:
    """What the engine's parameter groups as made (its arguments, torch.optim's defaults) say otherwise
    than the committing run's as made: "" when nothing, or when the record does not have them (an older
    tier.torch's).  Not the groups as they are at the commit: a scheduler, or the loop, moves those (lr,
    and OneCycleLR's betas), and the resume takes them over as they were."""
    out = []
    for i, (then, now) in enumerate(zip(saved or [], made)):
        for k in sorted(set(then) & set(now)):
            a, b = then[k], now[k]
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
            else:
                same = (tuple(a) if isinstance(a, list) else a) == (tuple(b) if isinstance(b, list) else b)
            if not same:
                out.append(f"param_groups[{i}] {k}={a!r} then, {b!r} now")
    return "; ".join(out)


def check_alone(client: Any, resume: bool) -> None:
    """resume=True without torch.distributed: refused, before the rollback, while the job has another
    connection (a rank in a process of its own, another tier.Client of the job): the rollback would bring
    its tensors back to the last commit under it, and each commit would take its step half done."""
    if not resume:
        return
    job = client.job
    conns = next((j.get("connections", 0) for j in client.status().get("jobs", []) if j.get("name") == job), 1)
    if conns > 1:
        raise ValueError(f"tier.torch: resume=True is for a job of one connection, and job {job!r} has {conns} "
                         "(a rank in another process, or another tier.Client of the job): a rollback brings back, "
                         "and a commit takes, every tensor of the job at once, the others' steps half done. "
                         "With several ranks, save checkpoints instead (engine.save(dir), or "
                         "engine.state_dict()); for one rank, close the job's other connections (or end their "
                         "processes) first")


def _has_tensors(eng: "Offload") -> bool:
    """Whether the job holds any tensor of this engine's names."""
    from .. import NotFoundError

    for b in eng.blocks:
        for kind in eng._kinds(b):
            try:
                eng.client.open(eng._tname(b, kind))
            except NotFoundError:
                continue
            return True
    return False


def try_resume(eng: "Offload") -> bool:
    """Roll the job back to its last commit and take its tensors over; False when it has none (start
    afresh).  Everything is checked before anything of the model's or the engine's changes."""
    from .. import NotFoundError

    # the groups as made (arguments, defaults), before any scheduler: what a resume compares (and commits)
    eng._made_groups = hyper_of(eng.param_groups)
    with eng._explained(None, "rolling the job back to its last commit"):
        c = eng.client.rollback()
    if not c.committed:
        return False
    try:
        t = eng.client.open(eng._meta_name())
    except NotFoundError:
        if not _has_tensors(eng):
            # a run that ended (close() destroys the record and every tensor; the job lingers with its
            # commit): nothing of it to pair with, so start afresh, as once the job is gone
            return False
        raise ValueError(f"tier.torch: job {eng.client.job!r} has a commit (step {c.step}) but no resume record "
                         f"({eng._meta_name()!r}): it was not committed by tier.torch with this prefix and rank, "
                         "or a run since started it afresh (without resume=True), so that the commit is stale; "
                         "to start afresh, end the job (tierctl detach JOB) first") \
            from None
    if c.lost:
        # (before the record is read: it may be one of them, and its read would say only "lost")
        raise RuntimeError(f"tier.torch: {c.lost} tensor(s) of job {eng.client.job!r} have nothing to go back to "
                           f"at its last commit (step {c.step}); tierd's log says which and why (their "
                           "committed data lay in memory only when tierd was killed without a service manager "
                           "keeping its memory, tierd(8), say): the job cannot be resumed; start it afresh "
                           "(without resume=True, or destroy the job), from a checkpoint if you saved one")
    meta = read_meta(eng, t)
    if meta["rule"] != eng.rule.name:
        raise ValueError(f"tier.torch: the job was trained with the {meta['rule']} step rule, this engine runs "
                         f"{eng.rule.name}")
    mine = layout(eng)
    if meta["layout"] != mine:
        raise ValueError("tier.torch: the model does not match the job's stored layout (" +
                         _first_difference(meta["layout"], mine) + "); resume with the same model, blocks= and "
                         "parameter groups, or start afresh without resume=True")
    if len(meta["groups"]) != len(eng.param_groups):
        raise ValueError(f"tier.torch: {len(meta['groups'])} parameter groups then, {len(eng.param_groups)} now")
    differs = _hyper_difference(meta.get("made_groups"), eng._made_groups)
    if differs:
        raise ValueError(f"tier.torch: the job was made with other hyperparameters ({differs}); resume with the "
                         "arguments the run was made with (the engine takes the job's hyperparameters over as "
                         "they were at its last commit, as a scheduler left them); to change one, set "
                         "engine.param_groups[i][key] once the engine is made, before the next step (or start "
                         "afresh without resume=True)")
    bufs = dict(eng.model.named_buffers())
    if set(bufs) != set(meta["buffers"]):
        raise ValueError("tier.torch: the model's buffers differ from the ones the job stored")
    for n, v in meta["buffers"].items():
        if tuple(v.shape) != tuple(bufs[n].shape) or v.dtype != bufs[n].dtype:
            raise ValueError(f"tier.torch: buffer {n} is {tuple(bufs[n].shape)} {bufs[n].dtype}, the job stored "
                             f"{tuple(v.shape)} {v.dtype}")
    opened = {}
    for b in eng.blocks:
        for kind in eng._kinds(b):
            name = eng._tname(b, kind)
            try:
                x = eng.client.open(name)
            except NotFoundError:
                raise ValueError(f"tier.torch: job {eng.client.job!r} lacks tensor {name!r} of {b.label}") from None
            if x.size != b.kind_bytes(kind):
                raise ValueError(f"tier.torch: tensor {name!r} of {b.label} is {x.size} bytes, {b.kind_bytes(kind)} "
                                 "now")
            opened[(b.index, kind)] = x
    # checked whole: from here on the engine takes the job over
    for b in eng.blocks:
        for kind in eng._kinds(b):
            b.tensors[kind] = opened[(b.index, kind)]
            eng._by_tname[eng._tname(b, kind)] = (b, kind)
        for s, n in zip(b.slots, meta["slot_steps"][b.index]):
            s.steps = n
        for s, h in zip(b.slots, meta.get("slot_had_grad", [[]] * len(eng.blocks))[b.index]):
            s.had_grad = h
    for g, saved in zip(eng.param_groups, meta["groups"]):
        for k, v in saved.items():
            g[k] = v
    with torch.no_grad():
        for n, v in meta["buffers"].items():
            bufs[n].copy_(v)
    eng._meta = t
    eng._grads_zeroed = meta.get("grads_zeroed", False)
    eng.steps = meta["steps"]
    eng.resumed_from = c
    return True
