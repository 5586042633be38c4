# SPDX-License-Identifier: MIT
"""A TierError of tier.torch's, said in the model's words: tierd's tensor names become the blocks they
belong to, phase numbers the phases they are, with what to do (the job's limits, how to split a block)."""

from __future__ import annotations

import errno

import re
from typing import TYPE_CHECKING, Any

from .. import HOST, VRAM
from ..errors import TierError
from . import discovery
from .layout import Block, fmt_bytes

if TYPE_CHECKING:
    from .engine import Offload


def explain_text(eng: "Offload", text: str) -> str:
    """tierd's text with our tensor names replaced by the blocks they belong to, and the plan's
    phase numbers by the phases they are."""
    for name, (b, kind) in sorted(eng._by_tname.items(), key=lambda x: -len(x[0])):
        if name in text:
            text = text.replace(f"'{name}'", f"{kind} of {b.label}").replace(name, f"{kind} of {b.label}")
    seq = eng.tracer.seq

    def phase(m: "re.Match[str]") -> str:
        k = int(m.group(0))
        if k >= len(seq):
            return m.group(0)
        kind, i, part, micro = seq[k]
        words = {"f": "forward", "b": "backward", "o": "optimizer"}[kind]
        extra = (f", part {part + 1}" if len(eng.blocks[i].parts) > 1 and kind == "o" else "") + \
            (f", micro-batch {micro + 1}" if micro else "")
        return f"{k} ({words} of {eng.blocks[i].label}{extra})"

    return re.sub(r"(?<=phases )\d+|(?<=phase )\d+|(?<= and )\d+(?= together)", phase, text)


class Explained:
    """Re-raise a TierError of ``what`` (for block ``b``) in the model's words, and what to do."""

    def __init__(self, engine: "Offload", b: Block | None, what: str) -> None:
        self.engine, self.b, self.what = engine, b, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, e: Any, tb: Any) -> bool:
        if e is None or not isinstance(e, TierError) or getattr(e, "_tier_torch", False):
            return False
        eng = self.engine
        op = f"{self.b.label}, {self.what}" if self.b is not None else self.what
        text = explain_text(eng, e.strerror or "")
        if e.errno == errno.ENODATA:
            # (not room: the budget advice misled)
            hint = ("a tensor's data is gone, tierd's log says which and why: it lay in memory only when tierd "
                    "stopped without keeping its memory (no fd store, see tierd(8)), a rollback had nothing to "
                    "go back to, or another rank's plan overwrites it next; " +
                    ("this engine commits every step (resume=True): end this process and start it again, and "
                     "the job goes back to its last commit where tierd kept that (the resume says so where not), "
                     "or load a checkpoint saved before into a new engine" if eng.resume else
                     "load a checkpoint saved before into a new engine, or make engines with resume=True"))
        elif e.errno in (errno.ENOSPC, errno.EAGAIN, errno.ENOMEM, errno.EDQUOT):
            hint = advice(eng, self.b)
        else:
            hint = ""
        new = type(e)(e.errno, text + (f" ({hint})" if hint else ""), op)
        new._tier_torch = True
        # not chained: tierd's own error names the engine's tensors ("torch.0.3.m"), which the traceback's
        # "direct cause" would show beside this one; it stays at hand for debugging as new.tierd_error
        new.tierd_error = e
        raise new from None


def limits(eng: "Offload") -> dict[str, int]:
    """The job's byte limits now (a round trip: on error paths and in describe() only)."""
    try:
        q = eng.client.quota()
        return {"vram": int(q.limits["vram"]), "host": int(q.limits["host"])}
    except Exception:       # a stand-in client, or tierd gone: what the handshake said
        lim = getattr(eng.client, "limit", None)
        return {"vram": lim(VRAM), "host": lim(HOST)} if callable(lim) else {}


def advice(eng: "Offload", b: Block | None) -> str:
    bits = []
    if b is not None and b.slots:
        need_host = b.opt_host_bytes(len(eng.state_kinds))
        bits.append(f"its optimizer phase{'s need' if len(b.parts) > 1 else ' needs'} {fmt_bytes(need_host)} "
                    f"in host, its forward {fmt_bytes(b.nbytes)} in vram and its backward "
                    f"{fmt_bytes(discovery.vram_need(b))} (with the gradients)")
        lim = limits(eng)
        if lim:
            bits.append(f"the job may have {fmt_bytes(lim['host'])} in host, {fmt_bytes(lim['vram'])} in vram, "
                        "and tierd holds the next phase while one runs")
        bits.append(discovery.split_hint(b, eng.model))
    if eng._mode == "deferred":
        bits.append(f"the optimizer runs after the whole backward here ({eng._deferred_why}), so two blocks' "
                    "optimizer phases are pinned at once")
    job = getattr(eng.client, "job", "JOB")
    bits.append(f"or raise the job's quota (tierctl quota set {job} --host SIZE --vram SIZE); room kept for "
                "other live jobs' guaranteed minimums (host_min, vram_min) is not the job's to use either: "
                "tierd's log names those jobs; Offload.describe() shows every block")
    return "; ".join(bits)
