# SPDX-License-Identifier: MIT
"""tier: the Python client of tierd, over libtier.so (ctypes, no compiled code).

    import tier

    with tier.Client("train-7b", rank=0) as c:
        t = c.tensor("layer0.w", 4 << 20)          # open, or create (zeros)
        with t.pin(tier.HOST) as g:                 # unpinned (dirty) on exit
            g.numpy("float32")[:] = 1.0             # zero-copy view of the pin
        t.evict(tier.NVME)
        c.wait(t.prefetch_async(tier.VRAM))

libtier is found through $TIER_LIBTIER (a file), $TIER_BUILD (a meson build
directory), the build directory of the checkout this package lies in, or
the system (libtier.so.1); importing fails with a TierError naming what was
tried when none loads.  numpy and torch are imported only by the views that
need them.  A Client shared by threads serves one call at a time.  See README.md
next to this package, and man libtier(3) for the C API underneath.
"""

from . import errors
from ._lib import library_path
from .client import (
    HOST,
    LINKS,
    NVME,
    READ,
    READ_WRITE,
    VRAM,
    WRITE,
    Client,
    Fence,
    Grant,
    Level,
    Mode,
    PerTier,
    Plan,
    Quota,
    QuotaTotal,
    Commit,
    Stat,
    Tensor,
    level_name,
    link_name,
    strerror,
)
from .errors import (
    BusyError,
    ExistsError,
    LostError,
    NoSpaceError,
    RestartedError,
    NotFoundError,
    PermissionDeniedError,
    QuotaError,
    ReadPinWrittenWarning,
    RetryLaterError,
    ShutdownError,
    TierError,
    TimedOutError,
    TooLargeError,
)

#: The package's version: tierd's (meson.build), which pyproject.toml repeats.
__version__ = "1.1.0"

__all__ = [
    "__version__",
    "errors",
    "library_path",
    # constants
    "Level",
    "Mode",
    "VRAM",
    "HOST",
    "NVME",
    "READ",
    "WRITE",
    "READ_WRITE",
    "LINKS",
    # objects
    "Client",
    "Tensor",
    "Grant",
    "Fence",
    "Plan",
    "Quota",
    "QuotaTotal",
    "Stat",
    "PerTier",
    # functions
    "strerror",
    "level_name",
    "link_name",
    # errors
    "TierError",
    "NoSpaceError",
    "QuotaError",
    "TooLargeError",
    "RetryLaterError",
    "NotFoundError",
    "ExistsError",
    "PermissionDeniedError",
    "BusyError",
    "ShutdownError",
    "TimedOutError",
    "LostError",
    "RestartedError",
    "ReadPinWrittenWarning",
    "Commit",
]
