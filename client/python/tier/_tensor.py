# SPDX-License-Identifier: MIT
"""Fence, Grant, Tensor and Plan (private module; ``tier.client`` re-exports them).

See ``tier.client`` for the theory of operation: who frees what, and how
long each kind of view stays valid.
"""

from __future__ import annotations

import errno
import warnings
from ctypes import byref, c_uint64, c_void_p
from typing import TYPE_CHECKING, Any

from . import _lib
from ._base import (
    _L,
    _LEVEL_NAMES,
    _STATES,
    Level,
    Mode,
    ModeLike,
    PerTier,
    Stat,
    TierLike,
    _closed,
    _level,
    _mode,
    _serialized,
    _stream,
    _uncopyable,
    _uint,
)
from .errors import ReadPinWrittenWarning, ShutdownError, TierError, TimedOutError

if TYPE_CHECKING:  # only for annotations: never imported at run time here
    import numpy as _np
    import torch as _torch

    from .client import Client

#: What the package's own calls pass to Tensor() and Grant(): those wrap a libtier pointer, which
#: no caller can check (a wrong one crashes the interpreter), so only the package makes them.
_MADE_HERE = object()

# ---- fences ---------------------------------------------------------------------------------


@_serialized(lambda s: s.client)
class Fence:
    """The completion of an asynchronous request (a ``tier_fence``).

    A fence belongs to the client that issued it.  Fence 0 is always done.
    The fence of ``pin_async()`` knows its Grant: when it fails, tierd holds
    no pin, and the Grant is invalidated and forgotten.
    """

    __slots__ = ("client", "value", "_grant", "__weakref__")

    def __init__(self, client: Client, value: int, grant: Grant | None = None) -> None:
        from .client import Client

        if not isinstance(client, Client):
            raise TypeError(f"a fence belongs to a tier.Client, not {type(client).__name__}")
        self.client = client
        self.value = _uint(value, "a fence", 0, (1 << 64) - 1)
        self._grant = grant

    def _failed(self, e: TierError) -> None:
        """Checking this fence raised @e: if the request itself failed (not a timeout, not the
        connection gone), the pin it made is gone in tierd: so goes its Grant."""
        g = self._grant
        if g is None or isinstance(e, (TimedOutError, ShutdownError)):
            return
        self._grant = None
        if g._pinned:
            g.tensor._take_grant(g.tier, g)
            g._invalidate()
        elif g._kept is not None:  # its handle was closed: what was kept of it goes
            g.tensor._take_grant(g.tier, g._kept)
            g._kept = None

    def done(self) -> bool:
        """True if the request is done, False if not; raises its error if it failed.

        Makes no system call for a fence that completed without error.  Of a client made with
        ``reconnect=``, a fence not done whose tierd went joins the next tierd (waiting for it up to
        the reconnect timeout) and raises RestartedError, as any call that finds tierd gone.
        """
        c = self.client._handle("check fence")
        r = _L.tier_fence_done(c, self.value)
        try:
            self.client._check(r, f"fence {self.value}")
        except TierError as e:
            self._failed(e)
            raise
        return r > 0

    def wait(self, timeout: float | None = None) -> None:
        """Wait until done (``tier_fence_wait()``); TimedOutError after @timeout seconds (None or
        infinity: forever, and then not interruptible by Ctrl-C: see ``Client.wait()``)."""
        self.client.wait(self, timeout)

    def stream_wait(self, stream: Any = None) -> None:
        """``tier_fence_stream_wait()``: make CUDA @stream wait for this fence (an async pin into VRAM).

        @stream: an int (CUstream / cudaStream_t), a ctypes pointer, an
        object with ``.cuda_stream`` (``torch.cuda.Stream``), or None for the
        legacy default stream.  Without a device-side event this waits on the host.
        """
        s = _stream(stream)
        c = self.client._handle("stream wait")
        self.client._check(_L.tier_fence_stream_wait(c, self.value, s), f"stream wait for fence {self.value}")

    def __int__(self) -> int:
        return self.value

    __reduce_ex__ = _uncopyable("Fence", "share the object itself, or pass its value (int(fence))")

    def __repr__(self) -> str:
        return f"<tier.Fence {self.value}>"


# ---- grants -----------------------------------------------------------------------------------


@_serialized(lambda s: s.tensor.client)
class Grant:
    """A pinned copy of a tensor, mapped into this process (``struct tier_grant``).

    Attributes:
        tensor: the Tensor.
        tier: where (a tier.Level).
        length: bytes, the tensor's size.
        segment, offset: where the first piece lies in the job's segments.
        ptr: the host address (host and emulated-VRAM grants), else None.
        device_ptr: the device address (cuda VRAM grants), else None.
        mode: what the pin said it does (READ, WRITE, READ_WRITE).
        dirty: what the unpin of ``with`` / ``unpin()`` tells tierd; starts
            as ``bool(mode & WRITE)``; set it to False to unpin clean.  (A
            phase grant's pin is the plan's: written where its access has
            WRITE; True is refused for one whose access has not.)

    Used as a context manager it unpins on exit.  Views (``memoryview()``,
    ``numpy()``, ``torch()``) are zero-copy; see the module's notes on how
    long each stays valid.
    """

    def __init__(self, tensor: Tensor, raw: _lib.TierGrant, mode: Mode, *, phase: bool = False,
                 _key: object = None) -> None:
        self._pinned = False
        self._views: list[memoryview] = []
        if _key is not _MADE_HERE:
            raise TypeError("tier.Grant objects are made by Tensor.pin(), pin_async() and Client.phase_grant()")
        self.tensor = tensor
        self.tier = Level(raw.tier)
        self.length: int = raw.length
        self.segment: int = raw.segment
        self.offset: int = raw.offset
        self.ptr: int | None = raw.ptr or None
        self.device_ptr: int | None = raw.device_ptr or None
        self.mode = mode
        self.dirty = bool(mode & Mode.WRITE)
        self._phase = phase
        self._pinned = True
        self._views: list[memoryview] = []
        self._tensors: list[tuple[Any, int]] = []  # torch() tensors of a pin without WRITE: (tensor, its version)
        self._kept: _Pin | None = None  # what the client keeps of it once its handle is closed

    @property
    def pinned(self) -> bool:
        """False once unpinned: views may no longer be made."""
        return self._pinned

    @property
    def phase(self) -> bool:
        """True for a grant from ``Client.phase_grant()`` (the plan releases it, not ``unpin()``)."""
        return self._phase

    def _invalidate(self) -> None:
        """The pin goes: release the memoryviews handed out, refuse new views."""
        self._pinned = False
        self._tensors = []
        views, self._views = self._views, []
        for v in views:
            try:
                v.release()
            except BufferError:
                pass  # its buffer held by C code right now: cannot be revoked, as documented

    def _live(self, what: str) -> None:
        if not self._pinned:
            if self.tensor.client._fork_child:
                self.tensor.client._handle(f"{what} of '{self.tensor.name}'")  # raises: made before fork()
            raise TierError(errno.EBADF, "the grant was unpinned", f"{what} of '{self.tensor.name}' in {self.tier}")

    def _host(self, what: str) -> int:
        self._live(what)
        if self.ptr is None:
            raise TypeError(
                f"the {self.tier} grant of '{self.tensor.name}' is device memory (cuda backend): "
                "use torch() or __cuda_array_interface__"
            )
        return self.ptr

    def _torch_written(self) -> bool:
        """A torch() tensor of this pin without WRITE (or a view of it) was changed in place: torch counts
        every in-place change of a tensor and its views in their shared version counter."""
        return any(t._version != v for t, v in self._tensors)

    @property
    def _writable(self) -> bool:
        """Views may write: the pin's mode has WRITE (a READ pin's unpin is clean: writes would vanish)."""
        return bool(self.mode & Mode.WRITE)

    def memoryview(self) -> memoryview:
        """A memoryview (format "B", ``length`` bytes) over the mapping, without a copy; read-only
        unless the pin's mode has WRITE.

        Released when the pin is dropped: using it afterwards raises
        ValueError.  (Slices or casts made from it are not released.)
        """
        ptr = self._host("memoryview")
        mv = _lib.memory_view(ptr, self.length, self._writable, self)
        self._views.append(mv)
        return mv

    def numpy(self, dtype: Any = "uint8", shape: int | tuple[int, ...] | None = None) -> _np.ndarray:
        """A numpy array over the mapping (``np.frombuffer``), without a copy.

        @dtype: any numpy dtype whose item size divides ``length``;
        @shape: reshape to this (None: one dimension).  Read-only
        (``flags.writeable`` False) unless the pin's mode has WRITE.  The
        array cannot be invalidated: do not use it after the unpin.
        """
        import numpy as np

        ptr = self._host("numpy view")
        dt = np.dtype(dtype)
        if self.length % dt.itemsize:
            raise ValueError(f"{self.length} bytes are not a whole number of {dt} ({dt.itemsize} bytes)")
        # a memoryview of its own, never released: the array holds it
        arr = np.frombuffer(_lib.memory_view(ptr, self.length, self._writable, self), dtype=dt)
        return arr if shape is None else arr.reshape(shape)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface (version 3) of a cuda VRAM grant: ``length`` bytes (typestr "|u1").

        Only grants with a ``device_ptr`` have it (AttributeError otherwise).
        """
        if self.device_ptr is None:
            raise AttributeError("__cuda_array_interface__: not a device grant (ptr is a host address)")
        self._live("__cuda_array_interface__")
        return {
            "shape": (self.length,),
            "typestr": "|u1",
            "data": (self.device_ptr, False),
            "strides": None,
            "version": 3,
        }

    def torch(self, dtype: _torch.dtype | str | None = None, shape: int | tuple[int, ...] | None = None) -> _torch.Tensor:
        """A torch tensor over the mapping, without a copy.

        @dtype: a torch.dtype (or its name, "float16"); None is torch.uint8.
        @shape: view as this (None: one dimension).  Host and emulated-VRAM
        grants give a CPU tensor (``torch.frombuffer``); a cuda VRAM grant a
        CUDA tensor through ``__cuda_array_interface__`` on the current CUDA
        device, which must be tierd's GPU (``Client.vram_device``).  The
        tensor cannot be invalidated: do not use it after the unpin.

        torch has no read-only tensors: for a pin without WRITE the CPU
        tensor is made over a read-only buffer (torch's warning about that
        suppressed), yet torch lets it be written.  The unpin sees such a
        write (torch's version counter of the tensor and its views: an
        in-place op, ``copy_()``, an indexed assignment; not a write through
        ``.data`` or ``.numpy()``, nor one into a tensor made under
        ``torch.inference_mode()``, which has no version counter) and is
        then dirty, so the write is kept as the tensor's newest data, with a
        ``tier.ReadPinWrittenWarning``:
        pin with WRITE to write (tierd may refill a READ pin's copy under
        it).  A phase grant's is released by the plan, clean: not seen.
        """
        import torch

        if dtype is None:
            dt = torch.uint8
        elif isinstance(dtype, str):
            dt = getattr(torch, dtype, None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"no torch dtype {dtype!r}")
        elif isinstance(dtype, torch.dtype):
            dt = dtype
        else:
            raise TypeError(f"dtype is a torch.dtype or its name, not {type(dtype).__name__}")
        item = torch.empty((), dtype=dt).element_size()
        if self.length % item:
            raise ValueError(f"{self.length} bytes are not a whole number of {dt} ({item} bytes)")
        self._live("torch view")
        if self.ptr is not None:
            # a memoryview of its own, never released: the tensor holds it
            mv = _lib.memory_view(self.ptr, self.length, self._writable, self)
            with warnings.catch_warnings():  # "The given buffer is not writable": documented above
                warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
                t = torch.frombuffer(mv, dtype=torch.uint8, count=self.length)
        elif self.device_ptr is not None:
            t = torch.as_tensor(self, device="cuda")
        else:
            raise TypeError(f"the grant of '{self.tensor.name}' has no address")
        # (its views share its version counter, and keep it; an inference tensor has none: not watched)
        if not self._writable and not self._phase and not t.is_inference():
            self._tensors.append((t, t._version))
        if dt != torch.uint8:
            t = t.view(dt)
        return t if shape is None else t.view(shape)

    def unpin(self, dirty: bool | None = None) -> None:
        """Drop this pin (``tier_unpin()``); @dirty None: ``self.dirty``.

        Does nothing if already unpinned.  A phase grant is only invalidated
        here: the plan's next ``Client.phase()`` (or ``end_plan()``) releases
        its pin, as written where the phase's access has WRITE; a dirty
        unpin of one whose access has not is refused (ValueError, the grant
        left as it was): plan the write (the access READ_WRITE).
        """
        if not self._pinned:
            return
        if self._phase:
            if (self.dirty if dirty is None else dirty) and not self.mode & Mode.WRITE:
                raise ValueError(f"'{self.tensor.name}' in {self.tier} is a phase grant of a {self.mode.name} access: "
                                 "the plan releases its pin at the next phase() or end_plan(), as written only where "
                                 "the phase's access has WRITE, so a dirty unpin cannot keep a write; plan the write "
                                 f"(plan.add(phase, tensor, '{self.tier}', tier.READ_WRITE)), or pin the tensor "
                                 "outside the plan (tensor.pin(tier, tier.READ_WRITE))")
            self._invalidate()
            return
        self.tensor._unpin(self.tier, self.dirty if dirty is None else bool(dirty), self)

    __reduce_ex__ = _uncopyable("Grant", "share the object itself, or copy the bytes (bytes(g.memoryview()))")

    def __enter__(self) -> Grant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unpin()

    def __repr__(self) -> str:
        where = f"ptr={self.ptr:#x}" if self.ptr else f"device_ptr={self.device_ptr:#x}" if self.device_ptr else "no address"
        state = "phase" if self._phase else "pinned" if self._pinned else "unpinned"
        return (
            f"<tier.Grant '{self.tensor.name}' in {self.tier}, {self.length} bytes, {where}, "
            f"{self.mode.name}, {state}>"
        )


class _Pin:
    """What the client keeps of a pinned Grant whose handle was closed: the pin stays tierd's (it
    is the connection's), and a later unpin through another handle needs to know if it may have
    been written.  No Tensor, no mapping, no views."""

    __slots__ = ("tier", "mode", "dirty", "_pinned")

    tensor = None  # taken through no open handle

    def __init__(self, g: Grant) -> None:
        self.tier = g.tier
        self.mode = g.mode
        self.dirty = g.dirty  # what its unpin would have said (the mode's WRITE, or the user's choice)
        self._pinned = True

    def _invalidate(self) -> None:
        self._pinned = False

    def __repr__(self) -> str:
        return f"<tier pin in {self.tier}, {self.mode.name}{', dirty' if self.dirty else ''}, handle closed>"


def _pinnable(tier: TierLike, verb: str) -> Level:
    """@tier for a pin, an unpin or a prefetch: VRAM or HOST (NVMe is never pinned, and nothing is
    above it to bring a copy up to it); ValueError before anything reaches libtier."""
    lv = _level(tier)
    if lv not in (Level.VRAM, Level.HOST):
        raise ValueError(f"{verb} takes vram or host, not {lv}")
    return lv


def _evictable(tier: TierLike) -> Level:
    """@tier for an eviction: HOST or NVME (it goes down to there)."""
    lv = _level(tier)
    if lv not in (Level.HOST, Level.NVME):
        raise ValueError(f"evict goes down to host or nvme, not {lv}")
    return lv


# ---- tensors ------------------------------------------------------------------------------------


@_serialized(lambda s: s.client)
class Tensor:
    """A handle on one of the job's tensors (``tier_tensor *``).

    Made by ``Client.create()``, ``open()`` or ``tensor()``.  Used as a
    context manager it closes the handle (the tensor stays in tierd).
    Pins belong to the connection: closing the handle does not unpin, and
    its grants' views are invalidated.
    """

    def __init__(self, client: Client, handle: int, _key: object = None) -> None:
        self._t: int | None = None
        if _key is not _MADE_HERE:
            raise TypeError("tier.Tensor objects are made by Client.create(), open() and tensor(): "
                            "c.open(name) for an existing tensor")
        self.client = client
        self._t = handle
        self.name: str = _L.tier_tensor_name(handle).decode("utf-8", "surrogateescape")
        self.size: int = _L.tier_tensor_size(handle)

    # -- plumbing
    def _handle(self, operation: str) -> int:
        if self._t is None:
            if self.client._fork_child:
                self.client._handle(operation)  # raises: made before fork()
            raise _closed(f"handle of tensor '{self.name}'", operation)
        if self.client._doomed:
            self.client._free_doomed()
        return self._t

    def _check(self, r: int, operation: str) -> int:
        return self.client._check(r, operation)

    def _op(self, verb: str, tier: Level) -> str:
        return f"{verb} '{self.name}' in {tier}"

    def _release_grants(self) -> None:
        """The handle goes: the grants taken through it lose their mapping (their pins stay, and
        the client keeps what their unpin needs: their tier and dirty)."""
        self.client._drop_grants(self, keep_pins=True)
        self.client._invalidate_phase_grants(self)

    def _connection_lost(self) -> None:
        """tierd restarted: its pins of this tensor went with the connection (their grants' memory
        stays mapped until the client is closed, their unpin() does nothing)."""
        self.client._drop_grants(self)
        self.client._invalidate_phase_grants(self)

    @property
    def closed(self) -> bool:
        """True once closed or destroyed (or its client closed)."""
        return self._t is None

    # -- state
    def stat(self) -> Stat:
        """``tier_tensor_stat()``: the tensor's copies as tierd sees them."""
        h = self._handle("stat")
        st = _lib.TierStat()
        self._check(_L.tier_tensor_stat(h, byref(st)), f"stat '{self.name}'")
        n = _lib.TIER_LEVEL_MAX
        return Stat(
            size=st.size,
            state=PerTier((_LEVEL_NAMES[i], _STATES[st.state[i]] if 0 <= st.state[i] < 4 else str(st.state[i])) for i in range(n)),
            dirty=PerTier((_LEVEL_NAMES[i], bool(st.dirty[i])) for i in range(n)),
            pins=PerTier((_LEVEL_NAMES[i], int(st.pins[i])) for i in range(n)),
        )

    # -- pins
    def _grant(self, raw: _lib.TierGrant, mode: Mode) -> Grant:
        g = Grant(self, raw, mode, _key=_MADE_HERE)
        self.client._grants.setdefault(self.name, []).append(g)
        return g

    def pin(self, tier: TierLike, mode: ModeLike = Mode.READ_WRITE) -> Grant:
        """Pin a resident copy in @tier, bringing it there first (``tier_pin()``).

        @mode WRITE alone promises to overwrite the whole tensor: tierd
        brings no old bytes (they read as anything) and the unpin is dirty.
        """
        lv, md = _pinnable(tier, "pin"), _mode(mode)
        h = self._handle(self._op("pin", lv))
        raw = _lib.TierGrant()
        self._check(_L.tier_pin(h, lv, md, byref(raw)), self._op("pin", lv))
        return self._grant(raw, md)

    def pin_async(self, tier: TierLike, mode: ModeLike = Mode.READ_WRITE) -> tuple[Grant, Fence]:
        """``tier_pin_async()``: the grant is valid at once, its bytes once the fence is done.

        If the fence fails (``done()`` or a wait raises the request's error), tierd holds no pin:
        the Grant is invalidated and forgotten (its ``unpin()`` then does nothing).
        """
        lv, md = _pinnable(tier, "pin"), _mode(mode)
        h = self._handle(self._op("pin", lv))
        raw = _lib.TierGrant()
        f = c_uint64()
        self._check(_L.tier_pin_async(h, lv, md, byref(raw), byref(f)), self._op("pin", lv))
        g = self._grant(raw, md)
        return g, Fence(self.client, f.value, g)

    def _take_grant(self, tier: Level, grant: Grant | None) -> Grant | _Pin | None:
        """The Grant an unpin in @tier ends, forgotten: @grant, else the most recent one of this
        tensor in @tier taken through any handle of the client (the pin is the connection's), or
        what is kept of it where that handle was closed (a _Pin)."""
        grants = self.client._grants.get(self.name, [])
        if grant is None:
            there = [g for g in grants if g.tier == tier]
            grant = there[-1] if there else None
        if grant is not None and grant in grants:
            grants.remove(grant)
            if not grants:
                del self.client._grants[self.name]
        return grant

    def _unpin(self, tier: Level, dirty: bool | None, grant: Grant | None, stream: Any = None,
               after: bool = False) -> None:
        op = self._op("unpin", tier)
        h = self._handle(op)
        g = self._take_grant(tier, grant)
        if dirty is None:  # nothing known of the pin (not taken by this client?): dirty, so no write is lost
            dirty = g.dirty if g is not None else True
        if not dirty and isinstance(g, Grant) and g._torch_written():
            warnings.warn(f"{op}: the pin is {g.mode.name} but its torch() tensor was written: unpinned dirty, so "
                          "the write is kept; pin with WRITE (READ_WRITE) to write, since tierd may refill a copy "
                          "pinned for reading only under the pin", ReadPinWrittenWarning, stacklevel=3)
            dirty = True
        if g is not None:
            g._invalidate()
        if after:
            r = _L.tier_unpin_after(h, tier, int(dirty), stream)
        else:
            r = _L.tier_unpin(h, tier, int(dirty))
        # the pin stays: so does its grant (its memoryviews are gone); not where tierd holds no such
        # pin (ENOENT: its pin_async failed unchecked; ESTALE: the tensor is gone)
        if r < 0 and g is not None and r not in (-errno.ENOENT, -errno.ESTALE):
            g._pinned = True
            self.client._grants.setdefault(self.name, []).append(g)
        self._check(r, op)

    def unpin(self, tier: TierLike, dirty: bool | None = None) -> None:
        """Drop one pin in @tier (``tier_unpin()``); @dirty: this process wrote the copy; None (the
        default): that Grant's ``dirty``, which a pin that may write starts with (a written copy
        unpinned clean could be dropped as if nothing had changed).  The Grant of a closed handle
        is kept as far as this needs (its tier and dirty), so a READ pin's unpin through another
        handle is clean; only when the client knows nothing of a pin in @tier (none taken through
        it) is the unpin dirty, so that no write can be lost.

        Invalidates the most recent Grant of that tier still pinned, taken through this handle
        or another one of the same client (the pin belongs to the connection).
        """
        self._unpin(_pinnable(tier, "unpin"), None if dirty is None else bool(dirty), None)

    def unpin_after(self, tier: TierLike, dirty: bool, stream: Any) -> None:
        """``tier_unpin_after()``: unpin a VRAM pin once the work queued on CUDA @stream is done.

        @stream: an int, a ctypes pointer, an object with ``.cuda_stream``,
        or None (legacy default stream).  Needs the cuda backend.
        """
        lv = _level(tier)
        if lv != Level.VRAM:
            raise ValueError(f"only VRAM pins can be released after GPU work, not {lv}")
        self._unpin(lv, bool(dirty), None, _stream(stream), after=True)

    # -- moves
    def evict(self, tier: TierLike) -> None:
        """Make @tier (or a lower one) hold the only copy (``tier_evict()``)."""
        lv = _evictable(tier)
        h = self._handle(self._op("evict", lv))
        self._check(_L.tier_evict(h, lv), self._op("evict", lv))

    def evict_async(self, tier: TierLike) -> Fence:
        """``tier_evict_async()``."""
        lv = _evictable(tier)
        h = self._handle(self._op("evict", lv))
        f = c_uint64()
        self._check(_L.tier_evict_async(h, lv, byref(f)), self._op("evict", lv))
        return Fence(self.client, f.value)

    def prefetch(self, tier: TierLike) -> None:
        """Bring a copy up to @tier without pinning it (``tier_prefetch()``)."""
        lv = _pinnable(tier, "prefetch")
        h = self._handle(self._op("prefetch", lv))
        self._check(_L.tier_prefetch(h, lv), self._op("prefetch", lv))

    def prefetch_async(self, tier: TierLike) -> Fence:
        """``tier_prefetch_async()``."""
        lv = _pinnable(tier, "prefetch")
        h = self._handle(self._op("prefetch", lv))
        f = c_uint64()
        self._check(_L.tier_prefetch_async(h, lv, byref(f)), self._op("prefetch", lv))
        return Fence(self.client, f.value)

    # -- lifetime
    def destroy(self) -> None:
        """Remove the tensor from tierd and free the handle (``tier_tensor_destroy()``).

        BusyError while it is pinned, in use or planned; the handle then stays open.
        """
        h = self._handle(f"destroy '{self.name}'")
        self._check(_L.tier_tensor_destroy(h), f"destroy '{self.name}'")
        self._t = None  # libtier freed the handle
        self._release_grants()
        self.client._tensors.discard(self)

    def close(self) -> None:
        """Free the handle only (``tier_tensor_close()``); idempotent.

        The tensor stays in tierd, and so do pins taken through it (they
        belong to the connection): the grants' views are invalidated, and
        numpy/torch views of a tensor spanning segments lose their mapping.
        """
        if self._t is None:
            return
        self._release_grants()
        h, self._t = self._t, None
        _L.tier_tensor_close(h)
        self.client._tensors.discard(self)

    __reduce_ex__ = _uncopyable("Tensor", "share the object itself, or open the tensor again by name "
                                "(client.open(t.name))")

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        """Collected: the handle is closed by the client's next call (this may run in the GC's
        thread while the client's own thread is inside libtier), or here once the client is freed
        (a detached handle: closing it concerns no client)."""
        try:
            if self._t is not None:
                self._release_grants()  # before the unmapping: no memoryview left over it
                h, self._t = self._t, None
                if self.client._c is not None:
                    self.client._doomed.append((_L.tier_tensor_close, h))
                else:
                    _L.tier_tensor_close(h)
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"<tier.Tensor '{self.name}' {self.size} bytes{' (closed)' if self._t is None else ''}>"


# ---- plans ------------------------------------------------------------------------------------


@_serialized(lambda s: s.client)
class Plan:
    """An iteration plan (``tier_plan *``): which tensors each phase needs, where, how.

    Build with ``add()``, send with ``submit()``; the submitted plan belongs
    to the client.  As a context manager it frees a plan not submitted.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._p: int | None = None
        p = c_void_p()
        c = client._handle("new plan")
        client._check(_L.tier_plan_new(c, byref(p)), "new plan")
        self._p = p.value
        self._entries: list[tuple[int, Tensor, Level, Mode]] = []
        self._submitted = False
        client._plans.add(self)

    @property
    def submitted(self) -> bool:
        return self._submitted

    def _handle(self, operation: str) -> int:
        if self._p is None:
            if self.client._fork_child:
                self.client._handle(operation)  # raises: made before fork()
            raise _closed("plan" if not self._submitted else "plan (submitted already)", operation)
        self.client._handle(operation)
        return self._p

    def add(self, phase: int, tensor: Tensor, tier: TierLike, mode: ModeLike = Mode.READ_WRITE) -> Plan:
        """Phase @phase (from 0; phases form a cycle) needs @tensor in @tier (VRAM or HOST)."""
        ph = _uint(phase, "phase")
        lv, md = _level(tier), _mode(mode)
        if lv not in (Level.VRAM, Level.HOST):
            raise ValueError(f"a plan places tensors in vram or host, not {lv}")
        if not isinstance(tensor, Tensor):
            raise TypeError(f"a plan entry names a tier.Tensor, not {type(tensor).__name__}")
        if tensor.client is not self.client:
            raise ValueError(f"tensor '{tensor.name}' belongs to another client")
        op = f"plan phase {ph}: '{tensor.name}' in {lv}"
        p = self._handle(op)
        self.client._check(_L.tier_plan_add(p, ph, tensor._handle(op), lv, md), op)
        self._entries.append((ph, tensor, lv, md))
        return self

    def submit(self) -> None:
        """Send the plan (``tier_plan_submit()``): NoSpaceError if it cannot run within the quota."""
        p = self._handle("submit plan")
        self.client._check(_L.tier_plan_submit(p), "submit plan")
        self._p = None
        self._submitted = True
        self.client._plans.discard(self)
        self.client._planned = list(self._entries)
        # the accesses by phase, tier and tensor: phase_grant() looks its mode up (a walk of the plan at
        # every grant made a step's grants cost the square of the plan's size)
        modes: dict[tuple[int, Level, str], Mode] = {}
        for ph, t, lv, md in self._entries:
            modes[(ph, lv, t.name)] = modes.get((ph, lv, t.name), Mode(0)) | md
        self.client._planned_modes = modes

    def close(self) -> None:
        """Free the plan if not submitted (``tier_plan_free()``); idempotent."""
        if self._p is not None:
            p, self._p = self._p, None
            _L.tier_plan_free(p)
            self.client._plans.discard(self)

    __reduce_ex__ = _uncopyable("Plan", "build another plan (client.plan())")

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        """Collected: freed by the client's next call, as a Tensor's handle is."""
        try:
            if self._p is not None:
                p, self._p = self._p, None
                if self.client._c is not None:
                    self.client._doomed.append((_L.tier_plan_free, p))
                else:
                    _L.tier_plan_free(p)
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "submitted" if self._submitted else "open" if self._p is not None else "freed"
        return f"<tier.Plan {len(self._entries)} entries, {state}>"
