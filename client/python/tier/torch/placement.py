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

import warnings
from typing import Any

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


def fence_done(eng: Any, f: Any, wait: bool) -> bool:
    """Has write-down ``f`` ended?  One the plan overtook (it pinned the tensor again first) is done;
    so is one tierd could not make (no room to go through, -ENOSPC/-EAGAIN): a write-down is a move
    of a valid copy, never the only one, so the tensor stays where it is, counted and said once."""
    from .. import BusyError, NoSpaceError, RetryLaterError
    from ..errors import RestartedError
    from .engine import TierTorchWarning
    from .explain import explain_text

    try:
        if wait:
            f.wait()
            return True
        return f.done()
    except BusyError:
        eng.kept_up += 1
        return True
    except RestartedError:
        if getattr(eng.client, "restarts", 0) != eng._client_restarts:
            # this check found tierd gone and joined the next one (tier_fence_done() too reconnects): the
            # pins and the phase the engine holds went with the connection, its caller goes again
            raise
        # a fence of before tierd restarted: the copy stays valid where it is, wherever it was written
        eng.kept_up += 1
        return True
    except (NoSpaceError, RetryLaterError) as e:
        eng.write_downs_refused += 1
        if eng.write_downs_refused == 1:
            warnings.warn(f"tier.torch: a write-down to NVMe (placement {eng.placement}) was refused by "
                          f"tierd ({explain_text(eng, e.strerror or str(e))}); the state stays in host memory until tierd moves it (counted in "
                          "Offload.write_downs_refused)", TierTorchWarning, stacklevel=4)
        return True
