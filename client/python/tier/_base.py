# SPDX-License-Identifier: MIT
"""The constants, argument checks and result types of the tier package (private).

``tier.client`` re-exports what is public here.  The checks raise ValueError
or TypeError for a bad Python argument before anything reaches libtier.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import functools
import math
import numbers
from ctypes import c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Union

from . import _lib
from .errors import TierError

class Level(enum.IntEnum):
    """Where a tensor lives (``enum tier_level``); lower is closer to the GPU."""

    VRAM = 0
    HOST = 1
    NVME = 2

    @property
    def label(self) -> str:
        """The name tierd spells: "vram", "host", "nvme"."""
        return _LEVEL_NAMES[self.value]

    def __str__(self) -> str:
        return self.label

    def __format__(self, spec: str) -> str:
        return self.label if not spec else format(int(self), spec)


class Mode(enum.IntFlag):
    """What a pin (or a plan access) will do with the bytes (``enum tier_access``)."""

    READ = 1
    WRITE = 2
    READ_WRITE = 3


VRAM = Level.VRAM
HOST = Level.HOST
NVME = Level.NVME
READ = Mode.READ
WRITE = Mode.WRITE
READ_WRITE = Mode.READ_WRITE

def _serialized(owner: Callable[[Any], Any]) -> Callable[[type], type]:
    """Class decorator: each public method and property of the class runs holding the lock of the
    Client @owner returns for the object (``Client._lock``, reentrant).  libtier's client is not
    thread-safe (two threads inside one interleave their requests and break the connection), so a
    Client shared by threads is used by one at a time: another thread's call waits, GIL released."""
    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def locked(self: Any, *args: Any, **kw: Any) -> Any:
            with owner(self)._lock:
                return f(self, *args, **kw)
        return locked

    def decorate(cls: type) -> type:
        for name, v in list(vars(cls).items()):
            if name.startswith("_"):
                continue  # helpers run inside a public call; __del__ only queues (any thread)
            if isinstance(v, property) and v.fget is not None:
                setattr(cls, name, property(wrap(v.fget), v.fset and wrap(v.fset), v.fdel, v.__doc__))
            elif callable(v) and not isinstance(v, (staticmethod, classmethod, type)):
                setattr(cls, name, wrap(v))
        return cls
    return decorate


_L = _lib.lib()
_LEVEL_NAMES: tuple[str, ...] = tuple(_L.tier_level_name(i).decode() for i in range(_lib.TIER_LEVEL_MAX))
#: The link names of ``tier_link_name()``, indexed by TIER_LINK_*: the keys of ``Client.moved()``.
LINKS: tuple[str, ...] = tuple(_L.tier_link_name(i).decode() for i in range(_lib.TIER_LINKS))
_STATES = ("absent", "filling", "resident", "draining")
_SIZE_MAX = 1 << 40  # tier_tensor_create(): 1 to 2^40 bytes
_UINT_MAX = (1 << 32) - 1
_INT_MAX = (1 << 31) - 1

TierLike = Union[Level, int, str]
ModeLike = Union[Mode, int]


def strerror(err: int) -> str:
    """``tier_strerror()``: the text of an errno value (positive or negative)."""
    if not isinstance(err, numbers.Integral) or isinstance(err, bool):
        raise TypeError(f"an errno must be an int, not {type(err).__name__}")
    if not -_INT_MAX <= err <= _INT_MAX:
        raise ValueError(f"errno {err} out of range")
    return _L.tier_strerror(int(err)).decode()


def level_name(tier: TierLike) -> str:
    """"vram", "host" or "nvme" (``tier_level_name()``)."""
    return _LEVEL_NAMES[_level(tier)]


def link_name(link: int) -> str:
    """``tier_link_name()``: "nvme->host", "host->nvme", "host->vram", "vram->host"."""
    if not isinstance(link, numbers.Integral) or isinstance(link, bool):
        raise TypeError(f"a link must be an int, not {type(link).__name__}")
    if not 0 <= link < len(LINKS):
        raise ValueError(f"no link {link} (0..{len(LINKS) - 1})")
    return LINKS[int(link)]


# ---- argument checks (before anything reaches C) ------------------------------------


def _level(tier: TierLike) -> Level:
    if isinstance(tier, str):
        try:
            return Level(_LEVEL_NAMES.index(tier.lower()))
        except ValueError:
            raise ValueError(f"unknown tier {tier!r} (vram, host, nvme)") from None
    if isinstance(tier, bool) or not isinstance(tier, numbers.Integral):
        raise TypeError(f"a tier is a tier.Level, an int or a name, not {type(tier).__name__}")
    try:
        return Level(int(tier))
    except ValueError:
        raise ValueError(f"unknown tier {tier} (0..{len(_LEVEL_NAMES) - 1})") from None


def _mode(mode: ModeLike) -> Mode:
    if isinstance(mode, bool) or not isinstance(mode, numbers.Integral):
        raise TypeError(f"a mode is a tier.Mode, not {type(mode).__name__}")
    if mode not in (1, 2, 3):
        raise ValueError(f"mode {int(mode)} is none of READ, WRITE, READ_WRITE")
    return Mode(int(mode))


#: The longest escaped name a refusal says (libtier's NAME_REFUSAL_SAY): a longer one is not said, nor cut.
_NAME_REFUSAL_SAY = 256


def _is_control(ch: str) -> bool:
    return ch < "\x20" or "\x7f" <= ch <= "\x9f"  # C0, DEL and C1 (U+009B: a terminal's CSI)


#: Unicode's Bidi_Control characters (proto/utf8.h utf8_bidi_cp()): ALM, LRM, RLM, LRE..RLO, LRI..PDI. Printed, they
#: reorder the text after them: "abc\u202egpj.exe" reads "abcexe.jpg" (Trojan Source).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _is_unsafe(ch: str) -> bool:
    """A character no name holds and util/escape.c escapes (proto/utf8.h utf8_unsafe_cp()): control or bidi."""
    return _is_control(ch) or ch in _BIDI


def _escaped(name: str) -> str:
    """@name as util/escape.c's text_escape() writes the bytes it stands for (os.fsencode()'s: "\\udcff" is the
    byte 0xff): controls and bidirectional format characters as \\uXXXX, each byte that starts no well-formed UTF-8
    sequence as \\xNN."""
    b = b"".join(bytes([ord(ch) - 0xDC00]) if "\udc80" <= ch <= "\udcff" else ch.encode("utf-8", "surrogatepass")
                 for ch in name)
    return "".join(f"\\u{ord(ch):04x}" if _is_unsafe(ch) else ch for ch in b.decode("utf-8", "backslashreplace"))


def _name_refusal(name: str, what: str, why: str) -> ValueError:
    """tierd's refusal of such a name (rpc.c check_name()), said before asking it: the escaped text a @what an older
    tierd made under @name was restored under, if at most _NAME_REFUSAL_SAY bytes (tierd's max_name, which may have
    cut it with a hash, is not known here: tierctl lists what it was restored under)."""
    e = _escaped(name) if len(name) <= _NAME_REFUSAL_SAY else None  # (each character escapes to 1 byte or more)
    said = f"'{e}'" if e is not None and len(e.encode("utf-8")) <= _NAME_REFUSAL_SAY else "too long to say here"
    lister = "tierctl jobs" if what == "job" else "tierctl tensors JOB"
    return ValueError(f"{what} name {why}; a {what} an older tierd made under such a name was restored under its "
                      f"escaped text, {said} ({lister} lists the name it was restored under, if any)")


def _name(name: str, what: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"a {what} name is a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"a {what} name must not be empty")
    if any(_is_control(ch) for ch in name):  # said first, as libtier and tierd do (proto/utf8.h utf8_name_flaw())
        raise _name_refusal(name, what, "contains control characters")
    bidi = next((ch for ch in name if ch in _BIDI), None)
    if bidi is not None:
        raise _name_refusal(name, what, f"contains the bidirectional format character U+{ord(bidi):04X}")
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (os.fsdecode's "\udcff"): not text tierd takes
        raise _name_refusal(name, what, "is not valid UTF-8") from None


def _uint(value: int, what: str, lo: int = 0, hi: int = _UINT_MAX) -> int:
    """@value, an integer (an int, or another numbers.Integral: numpy's int64 of ``np.prod(shape) * 4``),
    in lo..hi; TypeError for a bool, a float or None, ValueError out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} out of range ({lo}..{hi})")
    return int(value)


def _timeout_ms(timeout: float | None) -> int:
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"a timeout is seconds (a number) or None, not {type(timeout).__name__}")
    if isinstance(timeout, numbers.Integral):  # numpy's too; an int beyond a float's range is no NaN
        if timeout < 0:
            raise ValueError(f"timeout {timeout} must be >= 0 (None waits forever)")
        return min(int(timeout) * 1000, _INT_MAX)
    timeout = float(timeout)  # numpy's scalars too
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout {timeout} must be >= 0 (None waits forever)")
    if math.isinf(timeout):
        return -1  # forever, as None
    return min(math.ceil(timeout * 1000), _INT_MAX)


def _stream(stream: Any) -> int | None:
    """A CUDA stream as the void * libtier takes: None (the legacy default
    stream), an int, a ctypes pointer, or an object with ``.cuda_stream``
    (``torch.cuda.Stream``)."""
    if stream is None:
        return None
    if hasattr(stream, "cuda_stream"):
        stream = stream.cuda_stream
    if isinstance(stream, bool):
        raise TypeError("a stream is not a bool")
    if isinstance(stream, int):
        if not 0 <= stream < 1 << 64:
            raise ValueError(f"stream {stream:#x} is not an address")
        return stream or None
    if isinstance(stream, c_void_p):
        return stream.value
    if isinstance(stream, (ctypes._Pointer, ctypes._SimpleCData)):  # type: ignore[attr-defined]
        return ctypes.cast(stream, c_void_p).value
    raise TypeError(f"a stream is an int, a ctypes pointer or has .cuda_stream, not {type(stream).__name__}")


def _uncopyable(what: str, instead: str) -> Callable[[Any, Any], Any]:
    """A ``__reduce_ex__`` refusing copy.copy(), copy.deepcopy() and pickle with TypeError: the object
    owns a libtier handle (or a pin) of this process's connection, which a copy would free (or unpin)
    a second time, and which means nothing in another process."""
    why = ("it is this process's connection to tierd" if what == "Client"
           else "it belongs to its Client's connection to tierd, in this process")

    def refuse(self: Any, protocol: Any) -> Any:
        raise TypeError(f"a tier.{what} cannot be copied or pickled ({why}): {instead}")
    return refuse


def _closed(what: str, operation: str) -> TierError:
    return TierError(errno.EBADF, f"the {what} is closed", operation)


# ---- results ------------------------------------------------------------------------------


class PerTier(dict):
    """A dict keyed by tier name ("vram", "host", "nvme") that also takes
    ``tier.Level`` (or int) keys: ``stat.state[tier.HOST] == stat.state["host"]``."""

    def __getitem__(self, key: TierLike) -> Any:
        return super().__getitem__(_LEVEL_NAMES[_level(key)])

    def __contains__(self, key: object) -> bool:
        try:
            return super().__contains__(_LEVEL_NAMES[_level(key)])  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False

    def get(self, key: TierLike, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[key]
        except (KeyError, TypeError, ValueError):
            return default


@dataclass(frozen=True)
class Stat:
    """``tier_tensor_stat()``: a tensor's state in tierd.

    Attributes:
        size: bytes.
        state: per tier, "absent", "filling", "resident" or "draining".
        dirty: per tier, whether that copy holds the newest data and NVMe does not (an evict writes it
            down before it drops it); VRAM and host may both be.
        pins: per tier, the number of pins (of all clients).
    """

    size: int
    state: PerTier
    dirty: PerTier
    pins: PerTier


@dataclass(frozen=True)
class Commit:
    """A job's last commit (``Client.rollback()``, ``tier_job_rollback()``).

    Attributes:
        step: the number the client gave it.
        rolled_back: tensors a rollback brought back to it.
        lost: tensors with nothing to go back to (reads raise LostError).
        committed: False when the job has made no commit (a rollback changed nothing).
    """

    step: int
    rolled_back: int
    lost: int
    committed: bool


@dataclass(frozen=True)
class QuotaTotal:
    """The totals of a uid or a group: what all its jobs together may use (``tier_quota_total_get()``).

    Attributes:
        totals: bytes per tier, keyed like Quota.limits; 0: no total.
        used: what its jobs use now, per tier.
        sources: where each total comes from, per tier: "uid 1000", "group 27"
            (" (tierd.conf)" for a rule of the configuration), "uid_share"
            (tierd.conf's default share of a uid) or "none".
    """

    totals: PerTier
    used: PerTier
    sources: dict[str, str]


@dataclass(frozen=True)
class Quota:
    """A quota: per tier a maximum and a guaranteed minimum, and a link weight.

    ``Client.quota()``, ``Client.get_quota()`` and ``Client.set_quota()`` fill
    every field (``tier_quota_get()`` and ``tier_quota_set()``).

    Attributes:
        limits: maxima, {"vram": bytes, "host": bytes, "nvme": bytes} (also keyed by tier.Level).
        weight: its share of the links (1..1000).
        minimums: guaranteed bytes per tier, keyed like limits.
        sources: where each value comes from, keyed "vram", "vram_min", ..., "weight":
            "job 'x'", "uid 1000", "group 27", "default", with " (tierd.conf)" for a
            rule of the configuration (None from quota()).
        running: a job of that name runs now (job targets).
        warning: after set_quota(), tierd's warning (a max below a job's use), or "".
    """

    limits: PerTier
    weight: int
    minimums: PerTier | None = None
    sources: dict[str, str] | None = None
    running: bool = False
    warning: str = ""
