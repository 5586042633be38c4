# SPDX-License-Identifier: MIT
"""The exceptions of the tier package.

Every libtier call that fails raises a :class:`TierError` (never returns a
negative number): ``errno`` is the positive errno value, ``strerror`` the
reason text (tierd's own when it gave one, i.e. ``tier_client_last_error()``,
else ``tier_strerror()``), ``operation`` what was being done
(``"pin 'w0' in host"``).  The subclass follows the errno, so that callers
can catch the cases they handle::

    try:
        g = t.pin(tier.HOST)
    except tier.RetryLaterError:      # EAGAIN: the pool is held by other jobs
        ...

Invalid Python arguments raise ValueError or TypeError before anything
reaches libtier.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
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
    "error_class",
    "ReadPinWrittenWarning",
]


class ReadPinWrittenWarning(UserWarning):
    """A ``torch()`` tensor of a pin without WRITE was written: its unpin was made dirty to keep the write
    (torch has no read-only tensors); pin with WRITE to write."""



class TierError(OSError):
    """A failed libtier call.

    Attributes:
        errno: the error, a positive errno value (``errno.ENOSPC``...).
        strerror: the reason: tierd's text when it gave one, else the errno's.
        operation: what failed, e.g. ``"pin 'w0' in host"`` (may be None).
    """

    operation: str | None

    def __init__(self, errno: int, strerror: str, operation: str | None = None) -> None:
        super().__init__(errno, strerror)
        self.operation = operation

    def __reduce__(self):  # type: ignore[override]
        return (type(self), (self.errno, self.strerror, self.operation))

    def __str__(self) -> str:
        name = _errno.errorcode.get(self.errno or 0, str(self.errno))
        where = f"{self.operation}: " if self.operation else ""
        return f"{where}{self.strerror} [{name}]"


class NoSpaceError(TierError):
    """ENOSPC: the job is at its limit in the tier (what it uses is pinned or
    needed), its room there is fragmented, or the NVMe targets are full."""


class QuotaError(TierError):
    """EDQUOT: larger than the job's limit in the tier; raise the quota."""


class TooLargeError(TierError):
    """EFBIG: larger than the whole tier (or, at create, than any tier the
    job may use): it can never be there."""


class RetryLaterError(TierError):
    """EAGAIN: the pool's segments are held by other jobs, or kept for their guarantees; retry later."""


class NotFoundError(TierError):
    """ENOENT: no such tensor, job or plan entry."""


class ExistsError(TierError):
    """EEXIST: a tensor of that name exists already (or, for
    ``Client.tensor()``, exists with another size)."""


class PermissionDeniedError(TierError):
    """EPERM, EACCES: not allowed (another user's job, setting quotas
    without being root or in group tier-admin, a control connection)."""


class BusyError(TierError):
    """EBUSY: the tensor is pinned, in use by a request, or named by a plan;
    or too many asynchronous fences are outstanding."""


class ShutdownError(TierError):
    """ESHUTDOWN, ECONNRESET, ENOTCONN, EPIPE, EBADMSG: tierd stopped or the
    connection is gone (EBADMSG: tierd's reply was unreadable and the
    connection unusable); ECONNREFUSED: no tierd listens on the socket.
    Connect again (a new Client).  EPROTO (a reply libtier could not use, the
    connection still usable) stays a plain TierError, and so does an EBADMSG
    after which the connection is still usable (libtier does not call it
    broken): an older tierd's report of a crc32c mismatch in a request.
    ``error_class()`` alone cannot tell these apart: it says ShutdownError."""


class TimedOutError(TierError):
    """ETIMEDOUT: a wait with a timeout ran out; the request goes on.  Or tierd did not answer a
    request within the Client's timeout (``Client.set_timeout()``): then the connection is closed, and
    later calls raise ShutdownError (ECONNRESET), or RestartedError with ``reconnect=``."""


class RestartedError(TierError):
    """ERESTART: tierd restarted while this call ran (a Client made with ``reconnect=``); the
    connection, the job and every Tensor handle are back, but pins, the plan, phases and fences
    of before are gone: pin again, submit the plan again (``Client.resubmit_plan()``), enter the
    phase again.  The call itself may or may not have happened.  A fence of before raises it at
    every later check; that is no new restart and leaves the pins taken since alone (only a call
    that finds ``Client.restarts`` grown invalidates the grants)."""


class LostError(TierError):
    """ENODATA: the tensor's newest data is gone (it was in memory when tierd
    stopped, or a rollback had nothing to go back to), or was dropped because
    a plan writes it whole next (the message names its rank; that plan's own
    phases read zeros there).  Write it whole (a ``WRITE`` pin) or destroy it."""


_BY_ERRNO: dict[int, type[TierError]] = {
    _errno.ENOSPC: NoSpaceError,
    _errno.EDQUOT: QuotaError,
    _errno.EFBIG: TooLargeError,
    _errno.EAGAIN: RetryLaterError,
    _errno.ENOENT: NotFoundError,
    _errno.EEXIST: ExistsError,
    _errno.EPERM: PermissionDeniedError,
    _errno.EACCES: PermissionDeniedError,
    _errno.EBUSY: BusyError,
    _errno.ESHUTDOWN: ShutdownError,
    _errno.ECONNRESET: ShutdownError,
    _errno.ENOTCONN: ShutdownError,
    _errno.EPIPE: ShutdownError,
    _errno.EBADMSG: ShutdownError,
    _errno.ECONNREFUSED: ShutdownError,
    _errno.ETIMEDOUT: TimedOutError,
    _errno.ENODATA: LostError,
    _errno.ERESTART: RestartedError,
    _errno.ESTALE: NotFoundError,
}


def error_class(err: int) -> type[TierError]:
    """The TierError subclass for errno @err (positive or negative)."""
    return _BY_ERRNO.get(abs(err), TierError)
