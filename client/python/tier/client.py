# SPDX-License-Identifier: MIT
"""Client, Tensor, Grant, Fence, Plan: libtier through ctypes.

Theory of operation

Each Python object owns one libtier object and frees it exactly once:
``Client`` a ``tier_client *`` (``close()``), ``Tensor`` a ``tier_tensor *``
(``close()``, or ``destroy()``, which frees the handle on success), ``Plan``
a ``tier_plan *`` until it is submitted (then libtier owns it).  A Tensor
keeps its Client alive; the Client knows its open Tensors (weakly) and
closes them before ``tier_client_free()``, so no handle is left to a freed
client.  Objects dropped without ``close()`` are closed by ``__del__``; a
Grant is not: a pin belongs to the connection, as in C.  The Client keeps
every Grant still pinned (so its Tensor too) until the unpin or ``close()``,
and a Tensor's ``__del__`` invalidates the grants taken through it before it
frees the handle: no memoryview outlives the mapping it reads.  Of a Grant
whose handle closed while pinned the Client keeps only its tier and dirty
(the pin is still tierd's), for an unpin through another handle.

A ``Grant`` is one pin (or, from ``Client.phase_grant()``, the pin a plan
phase holds).  Its memory is reached through views built from the address
libtier returned, without a copy:

* ``memoryview()``: the Grant keeps each one it hands out and releases it
  when the pin is dropped (``Grant.unpin()``, ``Tensor.unpin()``, leaving a
  ``with`` block, the next ``Client.phase()`` for a phase grant, closing the
  tensor or the client); using it afterwards raises ValueError.  Slices and
  casts made from it are views of their own and are not released.
* ``numpy()`` and ``torch()``: arrays over a separate memoryview that is
  never released (a released buffer cannot be revoked from an array, and an
  export would make the release fail).  They stay valid only as long as the
  pin; using one after that reads or writes whatever the memory holds then,
  or crashes the process once libtier has unmapped it (closed tensor or
  client).  The Grant refuses to make new views once unpinned (TierError).

Every view's buffer is a ctypes array over the mapping holding the Grant
(``_lib.memory_view()``), so a view, or an array made from it, keeps the
Grant, its Tensor and its Client alive: the garbage collector never closes
the Client (and unmaps the memory) under a live view; ``close()`` does.

Errors: every negative return becomes a TierError subclass
(``tier.errors``) carrying tierd's reason.  Arguments are checked in Python
first (ValueError, TypeError).

libtier's client is used by one thread at a time: each public call of a
Client, Tensor, Plan, Grant or Fence holds the Client's reentrant lock
(``_serialized``), so threads sharing a Client take turns (a second call
waits for the first, a blocking wait included).  ctypes releases the GIL
during each libtier call, so other threads run while one waits.
The ``__del__`` of a Tensor or Plan (which the GC may run in any thread)
only queues its handle on the Client; the Client's next call, or
``close()``, frees it in the thread that uses the Client.

fork(): the child would share the connection with the parent (each would
read the other's replies), so in the child every Client of the parent is
dropped at once, without ``tier_client_free()`` (that would talk over the
parent's connection), with its Tensors, Plans and grants; any use of them
there raises TierError (EBADF) saying so.  Make a new Client in the child.
"""
from __future__ import annotations

import ctypes
import errno
import json
import math
import numbers
import os
import threading
import time
import weakref
from ctypes import byref, c_uint64, c_void_p
from typing import Any, Iterable

from . import _lib
from ._base import (
    _L,
    _LEVEL_NAMES,
    _SIZE_MAX,
    HOST,
    LINKS,
    NVME,
    READ,
    READ_WRITE,
    VRAM,
    WRITE,
    Level,
    Mode,
    PerTier,
    Quota,
    QuotaTotal,
    Commit,
    Stat,
    TierLike,
    _level,
    _name,
    _timeout_ms,
    _uint,
    _closed,
    _serialized,
    _uncopyable,
    level_name,
    link_name,
    strerror,
)
from ._tensor import _MADE_HERE, Fence, Grant, Plan, Tensor, _Pin
from .errors import NotFoundError, TierError, error_class

__all__ = [
    "Level",
    "Mode",
    "VRAM",
    "HOST",
    "NVME",
    "READ",
    "WRITE",
    "READ_WRITE",
    "LINKS",
    "Client",
    "Tensor",
    "Grant",
    "Fence",
    "Plan",
    "Quota",
    "Stat",
    "PerTier",
    "strerror",
    "level_name",
    "link_name",
]


# ---- clients ------------------------------------------------------------------------------------

#: The Clients with a connection, for the fork handler (weakly: no Client is kept alive by it).
_LIVE: weakref.WeakSet[Client] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for c in list(_LIVE):
        c._forked()
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@_serialized(lambda s: s)
class Client:
    """One connection to tierd: one rank of one job (``tier_client *``).

    @job: the job to join (created by its first connection); "" makes a
    control connection (status and quotas only).  @rank: informational.
    @socket: tierd's socket; None: $TIER_SOCKET, else /run/tierd/tierd.sock.
    @reconnect: see set_reconnect().  @timeout: see set_timeout() (None: no limit, the default).

    Threads sharing a Client take turns: one call at a time (a lock per Client).
    Not usable in the child of a fork(): make a new Client there.
    """

    def __init__(self, job: str, rank: int = 0, socket: str | os.PathLike[str] | None = None, *,
                 reconnect: float | None = None, timeout: float | None = None) -> None:
        self._lock = threading.RLock()  # held by each public call (_serialized): one thread at a time
        self._c: int | None = None
        if not isinstance(job, str):
            raise TypeError(f"a job name is a str, not {type(job).__name__}")
        jb = _name(job, "job") if job else b""
        rk = _uint(rank, "rank")
        sock = os.fsencode(socket) if socket is not None else None
        if sock is not None and (not sock or b"\0" in sock):
            raise ValueError(f"bad socket path {socket!r}")
        self._job = job
        self._rank = rk
        self._tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()
        self._plans: weakref.WeakSet[Plan] = weakref.WeakSet()
        self._planned: list[tuple[int, Tensor, Level, Mode]] = []  # the submitted plan's entries
        self._planned_modes: dict[tuple[int, Level, str], Mode] = {}  # their accesses: (phase, tier, tensor name)
        self._phase_grants: list[Grant] = []
        # every pinned Grant (not phase grants) by tensor name, whichever handle took it: close()
        # reaches them even when their Tensor has left _tensors (collected with its grants)
        # (and, for a pin whose handle was closed, a _Pin: what its unpin needs)
        self._grants: dict[str, list[Grant | _Pin]] = {}
        self._phase: int | None = None
        self._fork_child = False  # made before the fork() this process is the child of
        # handles of Tensors and Plans collected while the client was open, with their free function:
        # __del__ may run in any thread (the GC's), so they are freed by the client's next call,
        # in the thread that uses it
        self._doomed: list[tuple[Any, int]] = []
        c = c_void_p()
        r = _L.tier_client_new(sock, jb, rk, byref(c))
        if r < 0:
            text = (_L.tier_client_last_error(None) or b"").decode("utf-8", "replace") or strerror(r)
            where = os.fsdecode(sock) if sock else "tierd"
            raise error_class(r)(-r, text, f"connect to {where} as job {job!r}")
        self._c = c.value
        _LIVE.add(self)
        self._restarts = 0  # tier_client_restarts() when this client last forgot its pins
        if reconnect is not None:
            self.set_reconnect(reconnect)
        if timeout is not None:
            self.set_timeout(timeout)

    def set_reconnect(self, timeout: float) -> None:
        """``tier_client_set_reconnect()``: a call that finds tierd gone waits up to @timeout seconds
        for the next tierd, joins the job again and raises RestartedError (0: never, the default).
        No round trip."""
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 <= timeout <= 86400:
            raise ValueError(f"the reconnect timeout is 0..86400 seconds, not {timeout!r}")
        op = "set reconnect"
        self._check(_L.tier_client_set_reconnect(self._handle(op), int(timeout * 1000)), op)

    def set_timeout(self, timeout: float) -> None:
        """``tier_client_set_timeout()``: every request must be answered within @timeout seconds
        (0: no limit, the default).  A call with no answer in time raises TimedOutError and the
        connection is closed: later calls raise ShutdownError (ECONNRESET), or, with set_reconnect(),
        the next one connects again and raises RestartedError.  Fence waits and Plan phases wait for
        tierd's work, not an answer, and are not bounded by it (a fence's wait() takes its own
        timeout); a synchronous pin's answer waits for its transfers, which count.  No round trip."""
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 <= timeout <= 86400:
            raise ValueError(f"the request timeout is 0..86400 seconds, not {timeout!r}")
        op = "set timeout"
        # a timeout above 0 is at least 1 ms: 0 would mean none
        self._check(_L.tier_client_set_timeout(self._handle(op), math.ceil(timeout * 1000)), op)

    @property
    def restarts(self) -> int:
        """How many times this client connected again (``tier_client_restarts()``): tierd restarts,
        and connections closed for a timeout (set_timeout())."""
        return int(_L.tier_client_restarts(self._handle("restarts")))

    def resubmit_plan(self) -> None:
        """After a RestartedError: submit the plan that was running again (its entries are kept).
        A round trip; NotFoundError when none was submitted."""
        if not self._planned:
            raise NotFoundError(errno.ENOENT, "no plan was submitted", "resubmit plan")
        p = Plan(self)
        try:
            for ph, t, tl, md in self._planned:
                p.add(ph, t, tl, md)
            p.submit()
        finally:
            p.close()

    # -- plumbing
    def _handle(self, operation: str) -> int:
        if self._c is None:
            if self._fork_child:
                raise TierError(errno.EBADF, "this Client was made before fork() and cannot be used in "
                                "the child (the parent holds its connection): make a new tier.Client "
                                "in the child", operation)
            raise _closed("client", operation)
        if self._doomed:
            self._free_doomed()
        return self._c

    def _free_doomed(self) -> None:
        """Free the handles of the Tensors and Plans collected since the last call (no round trip)."""
        while self._doomed:
            free, h = self._doomed.pop()
            free(h)

    def _forked(self) -> None:
        """In the child of a fork(): let go of everything without a word to tierd (libtier's objects
        are the parent's; freeing them would talk over the parent's connection), leaking the copies."""
        self._fork_child = True
        self._lock = threading.RLock()  # the parent's may be held by a thread the child does not have
        self._invalidate_phase_grants()
        self._drop_grants()
        for t in list(self._tensors):
            t._t = None
        for p in list(self._plans):
            p._p = None
        self._tensors = weakref.WeakSet()
        self._plans = weakref.WeakSet()
        self._c = None

    def _check(self, r: int, operation: str) -> int:
        if r >= 0:
            return r
        text = ""
        if self._c is not None:
            text = (_L.tier_client_last_error(self._c) or b"").decode("utf-8", "replace")
        if r == -errno.ERESTART and self._c is not None:
            # a new restart, not a fence of before one (those fail with -ERESTART ever after):
            # only then are the pins and grants taken since gone
            n = int(_L.tier_client_restarts(self._c))
            if n != self._restarts:
                self._restarts = n
                self._restarted()
        if text.startswith(operation + ": "):  # libtier named the operation already (phase grants)
            text = text[len(operation) + 2:]
        cls = error_class(r)
        if r == -errno.EBADMSG and self._c is not None and not self._broken():
            cls = TierError  # not the connection: an older tierd's crc mismatch in a request
        raise cls(-r, text or strerror(r), operation)

    def _broken(self) -> bool:
        """After an error: is the connection unusable?  libtier says so: tier_client_fd() fails once
        it is closed, tier_client_process() with the error that broke it (without blocking)."""
        return _L.tier_client_fd(self._c) < 0 or _L.tier_client_process(self._c) < 0

    def _restarted(self) -> None:
        """tierd restarted: what the old connection held is gone (the memory of old grants stays)."""
        self._invalidate_phase_grants()
        self._drop_grants()
        self._phase = None
        for t in list(self._tensors):
            t._connection_lost()

    def _drop_grants(self, tensor: Tensor | None = None, keep_pins: bool = False) -> None:
        """Invalidate the pinned grants taken through @tensor's handle (None: all) and forget them;
        @keep_pins (the handle closes, the pins stay tierd's): keep, in their place, what their
        unpin through another handle needs (a _Pin: tier and dirty), but not the Grant itself."""
        for name in list(self._grants):
            keep: list[Grant | _Pin] = []
            for g in self._grants[name]:
                if tensor is None or g.tensor is tensor:
                    g._invalidate()
                    if keep_pins and tensor is not None:
                        g._kept = _Pin(g)
                        keep.append(g._kept)
                else:
                    keep.append(g)
            if keep:
                self._grants[name] = keep
            else:
                del self._grants[name]

    def _invalidate_phase_grants(self, tensor: Tensor | None = None) -> None:
        keep = []
        for g in self._phase_grants:
            if tensor is None or g.tensor is tensor:
                g._invalidate()
            else:
                keep.append(g)
        self._phase_grants = keep

    # -- what the handshake told
    @property
    def closed(self) -> bool:
        return self._c is None

    @property
    def job(self) -> str:
        """The job's name ("" for a control connection)."""
        return self._job

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def vram_backend(self) -> str:
        """tierd's VRAM backend: "cuda" or "emulated"."""
        return _L.tier_client_vram_backend(self._handle("vram backend")).decode()

    @property
    def vram_device(self) -> str:
        """PCI bus id of tierd's GPU with the cuda backend ("0000:3b:00.0"), else ""."""
        return _L.tier_client_vram_device(self._handle("vram device")).decode()

    def limit(self, tier: TierLike) -> int:
        """The job's byte limit in @tier (0 when unknown), as of the handshake."""
        lv = _level(tier)
        return _L.tier_client_limit(self._handle("limit"), lv)

    def tensor_max(self, tier: TierLike) -> int:
        """The largest tensor the job may have in @tier (0 when unknown)."""
        lv = _level(tier)
        return _L.tier_client_tensor_max(self._handle("tensor max"), lv)

    def segment_size(self, tier: TierLike) -> int:
        """The unit tierd hands out in @tier: host segment, VRAM chunk, NVMe extent."""
        lv = _level(tier)
        return _L.tier_client_segment_size(self._handle("segment size"), lv)

    def fileno(self) -> int:
        """The connection's socket (to poll; call ``process()`` when readable). Borrowed."""
        return _L.tier_client_fd(self._handle("fileno"))

    @property
    def last_error(self) -> str:
        """``tier_client_last_error()``: the reason of the last failed call, or ""."""
        if self._c is None:
            return ""
        return (_L.tier_client_last_error(self._c) or b"").decode("utf-8", "replace")

    # -- requests
    def moved(self) -> dict[str, int]:
        """Bytes tierd moved for the job on each link since it began (or tierd restarted): {"nvme->host": n, ...}.

        One status request; the difference of two calls is what a pass cost.
        """
        arr = (c_uint64 * _lib.TIER_LINK_SLOTS)()
        self._check(_L.tier_client_moved(self._handle("moved"), arr), "moved")
        return {LINKS[i]: int(arr[i]) for i in range(_lib.TIER_LINKS)}

    def _status(self, fmt: int) -> str:
        p = c_void_p()
        self._check(_L.tier_client_status(self._handle("status"), fmt, byref(p)), "status")
        try:
            return ctypes.string_at(p.value).decode("utf-8", "replace")
        finally:
            _lib.libc_free(p.value)

    def status(self) -> dict[str, Any]:
        """tierd's whole status (``tier_client_status()`` JSON, parsed): tiers, links, targets, jobs."""
        return json.loads(self._status(_lib.TIER_STATUS_JSON))

    def status_table(self) -> str:
        """tierd's status as the table ``tierctl status`` prints."""
        return self._status(_lib.TIER_STATUS_TABLE)

    def status_prometheus(self) -> str:
        """tierd's status in the Prometheus text format, as ``tierctl status --prometheus`` prints (one round trip)."""
        return self._status(_lib.TIER_STATUS_PROMETHEUS)

    def quota(self, job: str | None = None) -> Quota:
        """``tier_quota_get()``: the quota of @job (None: this client's job), as get_quota(job) gives it
        (it filled limits and weight only, and said running=False of a job that runs)."""
        jb = _name(job, "job") if job is not None else None
        q = _lib.TierQuota()
        op = f"quota of job {job if job is not None else self._job!r}"
        self._check(_L.tier_quota_get(self._handle(op), _lib.TIER_QUOTA_JOB, 0, jb, byref(q)), op)
        return self._quota2(q)

    @staticmethod
    def _quota_target(
        job: str | None, uid: int | None, user: str | None, group: int | str | None, default: bool = False
    ) -> tuple[int, int, bytes | None, str]:
        """(kind, id, job bytes, words) of one target; ValueError for none or several."""
        given = [x is not None for x in (job, uid, user, group)] + [default]
        if sum(given) > 1:
            raise ValueError("name one target: a job, uid, user, group (or default)")
        if uid is not None:
            u = _uint(uid, "uid", 0, (1 << 32) - 2)
            return _lib.TIER_QUOTA_UID, u, None, f"uid {u}"
        if user is not None:
            import pwd

            try:
                u = pwd.getpwnam(user).pw_uid
            except KeyError:
                raise ValueError(f"no user {user!r}") from None
            return _lib.TIER_QUOTA_UID, u, None, f"uid {u}"
        if group is not None:
            if isinstance(group, str):
                import grp

                try:
                    g = grp.getgrnam(group).gr_gid
                except KeyError:
                    raise ValueError(f"no group {group!r}") from None
            else:
                g = _uint(group, "gid", 0, (1 << 32) - 2)
            return _lib.TIER_QUOTA_GROUP, g, None, f"group {g}"
        if default:
            return _lib.TIER_QUOTA_DEFAULT, 0, None, "the default"
        return _lib.TIER_QUOTA_JOB, 0, _name(job, "job") if job is not None else None, f"job {job!r}"

    @staticmethod
    def _quota2(q: _lib.TierQuota) -> Quota:
        n = _lib.TIER_LEVEL_MAX
        sources: dict[str, str] = {}
        for i in range(n):
            sources[_LEVEL_NAMES[i]] = q.max_from[i].value.decode("utf-8", "replace")
            sources[_LEVEL_NAMES[i] + "_min"] = q.min_from[i].value.decode("utf-8", "replace")
        sources["weight"] = q.weight_from.decode("utf-8", "replace")
        return Quota(
            limits=PerTier((_LEVEL_NAMES[i], int(q.max[i])) for i in range(n)),
            weight=int(q.weight),
            minimums=PerTier((_LEVEL_NAMES[i], int(q.min[i])) for i in range(n)),
            sources=sources,
            running=bool(q.running),
            warning=q.warning.decode("utf-8", "replace"),
        )

    def get_quota(
        self,
        job: str | None = None,
        *,
        uid: int | None = None,
        user: str | None = None,
        group: int | str | None = None,
        default: bool = False,
    ) -> Quota:
        """``tier_quota_get()``: the quota of a job name (None: this client's job),
        a uid, a user, a group (gid or name) or the default, with minimums and
        where each value comes from (Quota.sources).

        Anyone may read the default, their own jobs, uid and groups, and a job name
        that does not run; the rest needs root or group tier-admin.
        """
        kind, ident, jb, words = self._quota_target(job, uid, user, group, default)
        q = _lib.TierQuota()
        op = f"quota of {words}" if kind != _lib.TIER_QUOTA_JOB or job is not None else f"quota of job {self._job!r}"
        self._check(_L.tier_quota_get(self._handle(op), kind, ident, jb, byref(q)), op)
        return self._quota2(q)

    def set_quota(
        self,
        job: str | None = None,
        *,
        uid: int | None = None,
        user: str | None = None,
        group: int | str | None = None,
        vram: int | None = None,
        host: int | None = None,
        nvme: int | None = None,
        vram_min: int | None = None,
        host_min: int | None = None,
        nvme_min: int | None = None,
        weight: int | None = None,
        clear: bool = False,
    ) -> Quota:
        """``tier_quota_set()``: set maxima (vram, host, nvme: bytes), guaranteed
        minimums (vram_min, ...: bytes, 0 for none) and the weight of a job name
        (None: this client's job), a uid, a user or a group.

        None leaves a value unchanged; clear=True first drops what was set for the
        target at run time.  A job name's quota holds before the job starts and for
        every later run of that name; tierd keeps it across restarts.  Returns the
        target's quota afterwards (Quota.warning: a max below a job's use).  Needs
        root or group tier-admin (PermissionDeniedError otherwise).
        """
        if job is None and uid is None and user is None and group is None:
            if not self._job:
                raise ValueError("a control connection has no job of its own: name one")
            job = self._job
        kind, ident, jb, words = self._quota_target(job, uid, user, group)
        q = _lib.TierQuota()
        for i, v in enumerate((vram, host, nvme)):
            if v is not None:
                q.max[i] = _uint(v, f"the {_LEVEL_NAMES[i]} limit", 1, (1 << 64) - 1)
        for i, v in enumerate((vram_min, host_min, nvme_min)):
            if v is not None:
                q.min[i] = _uint(v, f"the {_LEVEL_NAMES[i]} minimum", 0, (1 << 64) - 1)
                q.min_set |= 1 << i
        if weight is not None:
            q.weight = _uint(weight, "weight", 1, 1000)
        q.clear = 1 if clear else 0
        now = _lib.TierQuota()
        op = f"set quota of {words}"
        self._check(_L.tier_quota_set(self._handle(op), kind, ident, jb, byref(q), byref(now)), op)
        return self._quota2(now)

    @staticmethod
    def _quota_total(q: _lib.TierQuotaTotal) -> QuotaTotal:
        n = _lib.TIER_LEVEL_MAX
        return QuotaTotal(
            totals=PerTier((_LEVEL_NAMES[i], int(q.total[i])) for i in range(n)),
            used=PerTier((_LEVEL_NAMES[i], int(q.used[i])) for i in range(n)),
            sources={_LEVEL_NAMES[i]: q.from_[i].value.decode("utf-8", "replace") for i in range(n)},
        )

    def get_quota_total(
        self, *, uid: int | None = None, user: str | None = None, group: int | str | None = None
    ) -> QuotaTotal:
        """``tier_quota_total_get()``: the totals of a uid, a user or a group (what all its jobs
        together may use per tier, lingering ones too), where they come from and what the jobs use."""
        if uid is None and user is None and group is None:
            raise ValueError("name a uid, user or group: totals are of all its jobs together")
        kind, ident, _, words = self._quota_target(None, uid, user, group)
        q = _lib.TierQuotaTotal()
        op = f"totals of {words}"
        self._check(_L.tier_quota_total_get(self._handle(op), kind, ident, byref(q)), op)
        return self._quota_total(q)

    def commit(self, step: int) -> None:
        """``tier_job_commit()``: what every tensor of the job holds now is its committed state
        (``step``: the caller's number for it); tierd keeps, for each tensor written after it, that
        version on NVMe until the next commit, so that :meth:`rollback` finds it.  A round trip;
        BusyError while a tensor is pinned for reading and writing."""
        op = f"commit {step}"
        self._check(_L.tier_job_commit(self._handle(op), _uint(step, "the step", 0, (1 << 64) - 1)), op)

    def rollback(self) -> "Commit":
        """``tier_job_rollback()``: every tensor of the job written since its last commit gets that
        commit's data back.  Returns the commit (``committed`` False: the job has none, nothing
        changed).  A round trip, which waits for the transfers tierd itself has in flight on the
        job's tensors; BusyError while a tensor is pinned or a request of a client is on one."""
        c = _lib.TierCommit()
        self._check(_L.tier_job_rollback(self._handle("rollback"), byref(c)), "rollback")
        return Commit(step=int(c.step), rolled_back=int(c.rolled_back), lost=int(c.lost),
                      committed=bool(c.committed))

    def set_quota_total(
        self,
        *,
        uid: int | None = None,
        user: str | None = None,
        group: int | str | None = None,
        vram: int | None = None,
        host: int | None = None,
        nvme: int | None = None,
    ) -> QuotaTotal:
        """``tier_quota_total_set()``: set the totals (bytes; 0: none, which for a uid also lifts
        tierd.conf's uid_share) of a uid, a user or a group; None leaves a tier's as it is; one above
        the tier's capacity is refused (TierError, EINVAL), as a max is.  Kept across restarts; needs
        root or group tier-admin.  Returns the totals afterwards."""
        if uid is None and user is None and group is None:
            raise ValueError("name a uid, user or group: totals are of all its jobs together")
        kind, ident, _, words = self._quota_target(None, uid, user, group)
        arr = (c_uint64 * _lib.TIER_LEVEL_SLOTS)()
        mask = 0
        for i, v in enumerate((vram, host, nvme)):
            if v is not None:
                arr[i] = _uint(v, f"the {_LEVEL_NAMES[i]} total", 0, (1 << 64) - 1)
                mask |= 1 << i
        if not mask:
            raise ValueError("nothing to set: give vram, host or nvme")
        now = _lib.TierQuotaTotal()
        op = f"set totals of {words}"
        self._check(_L.tier_quota_total_set(self._handle(op), kind, ident, arr, mask, byref(now)), op)
        return self._quota_total(now)

    # -- tensors
    def _register(self, handle: int) -> Tensor:
        t = Tensor(self, handle, _MADE_HERE)
        self._tensors.add(t)
        return t

    def create(self, name: str, size: int) -> Tensor:
        """Create tensor @name of @size bytes (zeros): ExistsError if it exists, TooLargeError if too big."""
        nb = _name(name, "tensor")
        sz = _uint(size, "tensor size", 1, _SIZE_MAX)
        h = c_void_p()
        op = f"create '{name}' ({sz} bytes)"
        self._check(_L.tier_tensor_create(self._handle(op), nb, sz, byref(h)), op)
        return self._register(h.value)  # type: ignore[arg-type]

    def open(self, name: str) -> Tensor:
        """Open the job's tensor @name (e.g. made by another rank): NotFoundError if there is none."""
        nb = _name(name, "tensor")
        h = c_void_p()
        op = f"open '{name}'"
        self._check(_L.tier_tensor_open(self._handle(op), nb, byref(h)), op)
        return self._register(h.value)  # type: ignore[arg-type]

    def tensor(self, name: str, size: int) -> Tensor:
        """Open tensor @name, or create it with @size bytes if there is none.

        ExistsError if it exists with another size.
        """
        sz = _uint(size, "tensor size", 1, _SIZE_MAX)
        for _ in range(3):  # another rank may create or destroy it meanwhile
            try:
                t = self.open(name)
            except TierError as e:
                if e.errno != errno.ENOENT:
                    raise
            else:
                if t.size != sz:
                    t.close()
                    raise error_class(errno.EEXIST)(
                        errno.EEXIST, f"tensor '{name}' exists with {t.size} bytes, not {sz}", f"tensor '{name}'"
                    )
                return t
            try:
                return self.create(name, sz)
            except TierError as e:
                if e.errno != errno.EEXIST:
                    raise
        raise error_class(errno.EAGAIN)(errno.EAGAIN, f"tensor '{name}' keeps appearing and going", f"tensor '{name}'")

    # -- fences and events
    def wait(self, fence_or_list: Fence | Iterable[Fence], timeout: float | None = None) -> None:
        """Wait for a fence, or for every fence of a list (``tier_fence_wait()``).

        @timeout: seconds for all of them together, None (or infinity):
        forever.  TimedOutError when it runs out (the requests go on); a
        failed request raises its error.  A wait cannot be interrupted by a
        signal (Ctrl-C): libtier retries the system call, and Python's
        KeyboardInterrupt is raised only once the wait returns; give a
        timeout, in a loop, to stay interruptible.
        """
        fl = [fence_or_list] if isinstance(fence_or_list, Fence) else list(fence_or_list)
        for f in fl:
            if not isinstance(f, Fence):
                raise TypeError(f"wait() takes tier.Fence objects, not {type(f).__name__}")
            if f.client is not self:
                raise ValueError(f"fence {f.value} belongs to another client")
        ms = _timeout_ms(timeout)
        deadline = None if ms < 0 else time.monotonic() + ms / 1000
        c = self._handle("wait")
        for f in fl:
            left = -1
            if deadline is not None:
                left = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            try:
                self._check(_L.tier_fence_wait(c, f.value, left), f"wait for fence {f.value}")
            except TierError as e:
                f._failed(e)
                raise

    def process(self) -> None:
        """Handle what tierd sent without blocking (``tier_client_process()``).

        Call it when ``fileno()`` is readable if the client talks to tierd
        seldom.  ShutdownError once tierd announced its shutdown.
        """
        self._check(_L.tier_client_process(self._handle("process")), "process events")

    # -- plans
    def plan(self) -> Plan:
        """A new, empty plan (``tier_plan_new()``)."""
        return Plan(self)

    def phase(self, k: int) -> None:
        """Enter phase @k of the submitted plan (``tier_phase_enter()``).

        The previous phase's pins go (and the views of its phase grants).
        NoSpaceError when tierd refuses the phase: it can never be pinned while
        pins of this client's own (outside the plan) stay, which the message
        names; the plan lives on: unpin them and enter the phase again.
        """
        ph = _uint(k, "phase")
        c = self._handle(f"phase {ph}")
        self._invalidate_phase_grants()
        self._phase = None
        self._check(_L.tier_phase_enter(c, ph), f"phase {ph}")
        self._phase = ph

    def end_plan(self) -> None:
        """End the submitted plan (``tier_plan_end()``): its current phase's pins go (as dirty where
        the plan writes), its tensors may be destroyed again and another plan may be submitted.

        Raises NotFoundError if this client runs no plan.
        """
        c = self._handle("end plan")
        self._invalidate_phase_grants()
        self._phase = None
        self._check(_L.tier_plan_end(c), "end plan")

    def phase_grant(self, tensor: Tensor, tier: TierLike) -> Grant:
        """Where @tensor, pinned in @tier (VRAM or HOST) for the current phase, is mapped.

        The grant (a phase grant) is valid until the next ``phase()``; its
        ``unpin()`` and ``with`` only invalidate its views.  Its mode is the
        phase's access there.  NotFoundError when the current phase does not
        access @tensor in @tier, TierError (EINVAL) when no phase is entered
        (none yet, or the last ``phase()`` failed).
        """
        lv = _level(tier)
        if lv not in (Level.VRAM, Level.HOST):
            raise ValueError(f"a plan places tensors in vram or host, not {lv}")
        if not isinstance(tensor, Tensor):
            raise TypeError(f"phase_grant() takes a tier.Tensor, not {type(tensor).__name__}")
        if tensor.client is not self:
            raise ValueError(f"tensor '{tensor.name}' belongs to another client")
        op = f"phase grant of '{tensor.name}' in {lv}"
        raw = _lib.TierGrant()
        self._check(_L.tier_phase_grant(self._handle(op), tensor._handle(op), lv, byref(raw)), op)
        # the phase's own access (libtier refused a tensor and tier the phase does not access)
        mode = self._planned_modes.get((self._phase, lv, tensor.name), Mode(0))
        if not mode:
            raise NotFoundError(errno.ENOENT, f"phase {self._phase} of the submitted plan does not access "
                                f"'{tensor.name}' in {lv}", op)
        g = Grant(tensor, raw, mode, phase=True, _key=_MADE_HERE)
        self._phase_grants.append(g)
        return g

    @property
    def phase_stall(self) -> float:
        """Seconds this client has waited in ``phase()`` so far."""
        return float(_L.tier_phase_stall(self._handle("phase stall")))

    def register_cuda_host(self) -> int:
        """``tier_client_cuda_register_host()``: register the host segments with CUDA.

        Returns the number registered now; raises (ENODEV) without CUDA here.
        """
        return self._check(_L.tier_client_cuda_register_host(self._handle("register host")), "register host segments")

    # -- lifetime
    def close(self) -> None:
        """Close the open Tensor handles, then the connection (``tier_client_free()``).

        tierd drops the pins; views are invalidated (numpy/torch views lose
        their mapping).  Idempotent.
        """
        if self._c is None:
            return
        self._free_doomed()
        self._invalidate_phase_grants()
        self._drop_grants()  # before the unmapping, grants of handles gone from _tensors too
        for t in list(self._tensors):
            t.close()
        for p in list(self._plans):
            p.close()
        c, self._c = self._c, None
        _LIVE.discard(self)
        _L.tier_client_free(c)
        self._free_doomed()  # any queued meanwhile by another thread: detached now, closed locally

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    __reduce_ex__ = _uncopyable("Client", "share the object itself (threads may), or make a new tier.Client "
                                "in the other process")

    def __repr__(self) -> str:
        state = "closed" if self._c is None else "open"
        return f"<tier.Client job={self._job!r} rank={self._rank} {state}>"
