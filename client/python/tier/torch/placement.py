# SPDX-License-Identifier: MIT
"""tier.torch.placement: where a block's state lives between its uses (as DeepSpeed's offload devices).

* ``"A"``: the optimizer state and the parameters stay in host memory;
  nothing is written to NVMe unless the job's host budget is too small;
* ``"B"``: after each block's optimizer phase its optimizer state (the
  step rule's state and the float32 master weights) is written down to
  NVMe, host memory only stages it;
* ``"C"``: the parameters as well.

A write-down is an eviction (``evict_async(NVME)``) issued once the
optimizer phase is left (the last one's when :meth:`Offload.step` enters
the next step's first phase, so every write-down is issued, and counted, in
its own step); tierd's timeline then brings the tensor back before its next
use.  When the plan comes round to a tensor before its write-down ended (a
prefetch for the next use started first), tierd's pin for the plan wins and
the eviction ends with EBUSY: the engine counts it in ``kept_up`` and goes
on, the bytes already written stay valid on NVMe.  (tierd handles a phase
marker before the requests sent after it, so the previous phase's pins
never cause it.)
"""

from __future__ import annotations

PLACEMENTS = ("A", "B", "C")


def check(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    return placement


def write_down_kinds(placement: str, state_kinds: tuple[str, ...], mixed: bool) -> tuple[str, ...]:
    """The tensor kinds of a block written down to NVMe after its optimizer phase."""
    if placement == "A":
        return ()
    kinds = tuple(state_kinds) + (("w",) if mixed else ())
    return kinds + ("p",) if placement == "C" else kinds
