# SPDX-License-Identifier: MIT
"""Loading libtier.so and the ctypes prototypes of every function of tier.h.

This module is private: the rest of the package calls ``lib()`` for the
loaded library.  Nothing here raises on a failed call; ``tier.client`` turns
negative return values into exceptions.

Where the library comes from, first match wins:

1. ``$TIER_LIBTIER``: the path of a libtier.so (or libtier.so.N) file;
2. ``$TIER_BUILD``: a meson build directory, ``$TIER_BUILD/client/libtier.so``;
3. the build directory of the checkout this package lies in, when it runs
   from the source tree (``client/python/tier`` -> ``build/client/libtier.so``);
4. the system: ``ctypes.util.find_library("tier")``, then ``libtier.so.1``.

A variable that is set is authoritative: when the file it names cannot be
loaded, the lookup stops there rather than loading some other libtier.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_int,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

from .errors import TierError

__all__ = [
    "TierGrant",
    "TierStat",
    "TierQuota",
    "TIER_LEVEL_MAX",
    "TIER_LINKS",
    "TIER_LEVEL_SLOTS",
    "TIER_LINK_SLOTS",
    "TIER_PROTOCOL_VERSION",
    "TIER_STATUS_TABLE",
    "TIER_STATUS_JSON",
    "TIER_STATUS_PROMETHEUS",
    "SONAME",
    "PROTOTYPES",
    "lib",
    "libc_free",
    "library_path",
    "memory_view",
]

# ---- constants of tier.h -------------------------------------------------------

TIER_PROTOCOL_VERSION = 2
TIER_LEVEL_MAX = 3
TIER_LINKS = 4
TIER_LEVEL_SLOTS = 8
TIER_LINK_SLOTS = 8
TIER_READ, TIER_WRITE, TIER_READ_WRITE = 1, 2, 3
TIER_STATUS_TABLE = 0
TIER_STATUS_JSON = 1
TIER_STATUS_PROMETHEUS = 2

#: The soname of libtier (client/meson.build: soversion 1).
SONAME = "libtier.so.1"


# ---- structures of tier.h -------------------------------------------------------


class TierGrant(Structure):
    """``struct tier_grant``."""

    _fields_ = [
        ("ptr", c_void_p),
        ("device_ptr", c_uint64),
        ("length", c_uint64),
        ("segment", c_uint32),
        ("offset", c_uint64),
        ("tier", c_int),
        ("reserved", ctypes.c_uint32 * 7),
    ]


class TierStat(Structure):
    """``struct tier_stat``."""

    _fields_ = [
        ("size", c_uint64),
        ("state", c_int * TIER_LEVEL_SLOTS),
        ("dirty", c_int * TIER_LEVEL_SLOTS),
        ("pins", c_uint * TIER_LEVEL_SLOTS),
        ("reserved", c_uint64 * 4),
    ]


TIER_QUOTA_JOB, TIER_QUOTA_UID, TIER_QUOTA_GROUP, TIER_QUOTA_DEFAULT = 0, 1, 2, 3
TIER_QUOTA_FROM_MAX = 288


class TierQuota(Structure):
    """``struct tier_quota``."""

    _fields_ = [
        ("max", c_uint64 * TIER_LEVEL_SLOTS),
        ("min", c_uint64 * TIER_LEVEL_SLOTS),
        ("min_set", c_uint),
        ("weight", c_uint),
        ("clear", c_int),
        ("running", c_int),
        ("max_from", (ctypes.c_char * TIER_QUOTA_FROM_MAX) * TIER_LEVEL_SLOTS),
        ("min_from", (ctypes.c_char * TIER_QUOTA_FROM_MAX) * TIER_LEVEL_SLOTS),
        ("weight_from", ctypes.c_char * TIER_QUOTA_FROM_MAX),
        ("warning", ctypes.c_char * 512),
        ("reserved", c_uint64 * 8),
    ]


class TierQuotaTotal(Structure):
    """``struct tier_quota_total``."""

    _fields_ = [
        ("total", c_uint64 * TIER_LEVEL_SLOTS),
        ("used", c_uint64 * TIER_LEVEL_SLOTS),
        ("from_", (ctypes.c_char * TIER_QUOTA_FROM_MAX) * TIER_LEVEL_SLOTS),
        ("reserved", c_uint64 * 4),
    ]


class TierCommit(Structure):
    """``struct tier_commit``."""

    _fields_ = [
        ("step", c_uint64),
        ("rolled_back", ctypes.c_uint),
        ("lost", ctypes.c_uint),
        ("committed", c_int),
        ("reserved", ctypes.c_uint32 * 7),
    ]


_client_p = c_void_p  # tier_client *
_tensor_p = c_void_p  # tier_tensor *
_plan_p = c_void_p  # tier_plan *
_fence = c_uint64  # tier_fence

#: Every function of tier.h: name -> (restype, argtypes).  tests/python checks
#: that this covers every function the header declares.
PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    # clients
    "tier_client_new": (c_int, [c_char_p, c_char_p, c_uint, POINTER(_client_p)]),
    "tier_client_free": (c_void_p, [_client_p]),
    "tier_client_last_error": (c_char_p, [_client_p]),
    "tier_client_set_reconnect": (c_int, [_client_p, c_int]),
    "tier_client_restarts": (ctypes.c_uint, [_client_p]),
    "tier_client_set_timeout": (c_int, [_client_p, c_int]),
    "tier_client_vram_backend": (c_char_p, [_client_p]),
    "tier_client_vram_device": (c_char_p, [_client_p]),
    "tier_client_limit": (c_uint64, [_client_p, c_int]),
    "tier_client_tensor_max": (c_uint64, [_client_p, c_int]),
    "tier_client_segment_size": (c_uint64, [_client_p, c_int]),
    "tier_client_fd": (c_int, [_client_p]),
    "tier_client_moved": (c_int, [_client_p, POINTER(c_uint64)]),
    "tier_client_process": (c_int, [_client_p]),
    # tensors
    "tier_tensor_create": (c_int, [_client_p, c_char_p, c_uint64, POINTER(_tensor_p)]),
    "tier_tensor_open": (c_int, [_client_p, c_char_p, POINTER(_tensor_p)]),
    "tier_tensor_destroy": (c_int, [_tensor_p]),
    "tier_tensor_close": (c_void_p, [_tensor_p]),
    "tier_tensor_size": (c_uint64, [_tensor_p]),
    "tier_tensor_name": (c_char_p, [_tensor_p]),
    "tier_tensor_stat": (c_int, [_tensor_p, POINTER(TierStat)]),
    # placement
    "tier_pin": (c_int, [_tensor_p, c_int, c_int, POINTER(TierGrant)]),
    "tier_pin_async": (c_int, [_tensor_p, c_int, c_int, POINTER(TierGrant), POINTER(_fence)]),
    "tier_unpin": (c_int, [_tensor_p, c_int, c_int]),
    "tier_evict": (c_int, [_tensor_p, c_int]),
    "tier_evict_async": (c_int, [_tensor_p, c_int, POINTER(_fence)]),
    "tier_prefetch": (c_int, [_tensor_p, c_int]),
    "tier_prefetch_async": (c_int, [_tensor_p, c_int, POINTER(_fence)]),
    # fences
    "tier_fence_done": (c_int, [_client_p, _fence]),
    "tier_fence_wait": (c_int, [_client_p, _fence, c_int]),
    # CUDA
    "tier_fence_stream_wait": (c_int, [_client_p, _fence, c_void_p]),
    "tier_unpin_after": (c_int, [_tensor_p, c_int, c_int, c_void_p]),
    "tier_client_cuda_register_host": (c_int, [_client_p]),
    # status
    "tier_client_status": (c_int, [_client_p, c_int, POINTER(c_void_p)]),
    # plans
    "tier_plan_new": (c_int, [_client_p, POINTER(_plan_p)]),
    "tier_plan_free": (c_void_p, [_plan_p]),
    "tier_plan_add": (c_int, [_plan_p, c_uint, _tensor_p, c_int, c_int]),
    "tier_plan_submit": (c_int, [_plan_p]),
    "tier_phase_enter": (c_int, [_client_p, c_uint]),
    "tier_plan_end": (c_int, [_client_p]),
    "tier_phase_grant": (c_int, [_client_p, _tensor_p, c_int, POINTER(TierGrant)]),
    "tier_phase_stall": (c_double, [_client_p]),
    # quotas
    # job control (tierctl; the result structs are not wrapped in Python)
    "tier_job_list": (c_int, [_client_p, POINTER(c_void_p), POINTER(c_size_t)]),
    "tier_job_tensors": (c_int, [_client_p, c_char_p, POINTER(c_void_p), POINTER(c_size_t)]),
    "tier_job_evict": (c_int, [_client_p, c_char_p, c_int, c_void_p]),
    "tier_job_detach": (c_int, [_client_p, c_char_p, c_void_p]),
    "tier_job_commit": (c_int, [_client_p, c_uint64]),
    "tier_job_rollback": (c_int, [_client_p, POINTER(TierCommit)]),
    "tier_quota_get": (c_int, [_client_p, c_int, ctypes.c_uint32, c_char_p, POINTER(TierQuota)]),
    "tier_quota_set": (c_int, [_client_p, c_int, ctypes.c_uint32, c_char_p, POINTER(TierQuota), POINTER(TierQuota)]),
    "tier_quota_total_get": (c_int, [_client_p, c_int, ctypes.c_uint32, POINTER(TierQuotaTotal)]),
    "tier_quota_total_set": (
        c_int,
        [_client_p, c_int, ctypes.c_uint32, POINTER(c_uint64), ctypes.c_uint, POINTER(TierQuotaTotal)],
    ),
    # tracing (tierctl trace; not wrapped in Python)
    "tier_trace_start": (c_int, [_client_p, c_uint, c_uint]),
    "tier_trace_stop": (c_int, [_client_p, POINTER(c_void_p)]),
    "tier_trace_records": (c_size_t, [c_void_p]),
    "tier_trace_dropped": (c_uint64, [c_void_p]),
    "tier_trace_link_bytes": (c_uint64, [c_void_p, c_int]),
    "tier_trace_traced_bytes": (c_uint64, [c_void_p, c_int]),
    "tier_trace_write_json": (c_int, [c_void_p, c_int]),
    "tier_trace_free": (c_void_p, [c_void_p]),
    # names
    "tier_strerror": (c_char_p, [c_int]),
    "tier_level_name": (c_char_p, [c_int]),
    "tier_link_name": (c_char_p, [c_int]),
    "tier_level_from_name": (c_int, [c_char_p]),
}


# ---- loading ---------------------------------------------------------------------


def _source_build_lib() -> Path | None:
    """build/client/libtier.so of the checkout this package runs from, if it does."""
    root = Path(__file__).resolve().parent.parent.parent.parent
    if not (root / "client" / "tier.h").is_file():
        return None  # an installed copy: no checkout around it
    return root / "build" / "client" / "libtier.so"


def _candidates() -> tuple[list[str], bool]:
    """The places to try, in order, and whether an environment variable chose them."""
    env_lib = os.environ.get("TIER_LIBTIER")
    if env_lib:
        return [env_lib], True
    env_build = os.environ.get("TIER_BUILD")
    if env_build:
        return [os.path.join(env_build, "client", "libtier.so")], True
    places: list[str] = []
    src = _source_build_lib()
    if src is not None and src.exists():
        places.append(str(src))
    found = ctypes.util.find_library("tier")
    if found:
        places.append(found)
    if SONAME not in places:
        places.append(SONAME)
    return places, False


def _load() -> tuple[ctypes.CDLL, str]:
    places, from_env = _candidates()
    tried: list[str] = []
    for place in places:
        try:
            handle = ctypes.CDLL(place, use_errno=False)
        except OSError as e:
            tried.append(f"{place} ({e})")
            continue
        missing = []
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(handle, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
        if missing:
            raise TierError(
                errno.ENOSYS,
                f"{place} lacks {', '.join(missing)}: it is older than this package",
                "load libtier",
            )
        return handle, place
    if not from_env:
        src = _source_build_lib()
        if src is not None and not src.exists():
            tried.insert(0, f"{src} (not built)")
        tried.insert(0, "$TIER_LIBTIER and $TIER_BUILD (not set)")
    raise TierError(
        errno.ENOENT,
        "cannot load libtier; tried: " + "; ".join(tried),
        "load libtier",
    )


_lib, _path = _load()


def lib() -> ctypes.CDLL:
    """The loaded libtier, with every prototype set."""
    return _lib


def library_path() -> str:
    """What was loaded: a path, or the name the dynamic loader resolved."""
    return _path


# free(3) of the C library libtier uses (the process's: tier_client_status() mallocs).
_libc = ctypes.CDLL(None)
_libc.free.restype = None
_libc.free.argtypes = [c_void_p]


def libc_free(p: int | None) -> None:
    """free(3) a pointer libtier returned."""
    _libc.free(p)


# A memoryview over foreign memory, exported by a ctypes array over it that holds @owner (the Grant,
# and through it its Tensor and Client): whatever holds the memoryview, an array made from it
# included, keeps the client that maps the memory alive, so the garbage collector never unmaps it
# under them.  release() still ends the memoryview's own access (slices and casts made from it
# keep theirs, and their owner).


def memory_view(address: int, length: int, writable: bool, owner: object) -> memoryview:
    """A one-dimensional memoryview (format "B") of @length bytes at @address, read-only unless
    @writable, keeping @owner alive as long as it (or a view or array made from it) lives."""
    buf = (ctypes.c_ubyte * length).from_address(address)
    buf._tier_owner = owner  # type: ignore[attr-defined]
    mv = memoryview(buf)
    if not writable:
        mv = mv.toreadonly()
    return mv.cast("B")
