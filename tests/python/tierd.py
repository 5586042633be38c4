# SPDX-License-Identifier: MIT
"""A real tierd from this build on a temporary directory, for the Python tests.

What tests/helpers/harness.c does for the C tests, in Python: the program
is $TIER_BUILD/daemon/tierd (never a copy), started with --config,
--state-dir and --socket on a directory under /var/tmp (tierd opens its NVMe
target files with O_DIRECT, which a tmpfs may refuse).  We own
NOTIFY_SOCKET, a datagram socket in that directory, and "started" means
READY=1 arrived.  tierd's stdout and stderr go to DIR/tierd.log, printed
when it fails to start, exits while we wait, stops with a non-zero status or
is still running at clean-up.  The directory goes unless $TIER_TEST_KEEP
is set.

``Tierd(fd_store=True)`` plays the service manager's fd store as well: a
thread reads NOTIFY_SOCKET as messages come, keeps the fds tierd sends with
FDSTORE=1 under their FDNAME= (FDSTOREREMOVE=1 drops them) and the next
start passes them on from fd 3 with LISTEN_FDS, LISTEN_FDNAMES and
LISTEN_PID, as systemd does across a restart.

``main()`` runs a test module with unittest and exits 77 (meson's SKIP)
when every test skipped, e.g. for want of numpy or torch.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

SKIP = 77

# $TIER_PYTHON_SKIP (set by tests/python/meson.build when this build's libtier
# cannot be loaded into Python) skips every test module, which all import
# this one before they import tier.
if os.environ.get("TIER_PYTHON_SKIP"):
    print(f"skipped: {os.environ['TIER_PYTHON_SKIP']}")
    sys.exit(SKIP)

READY_TIMEOUT = 30.0  # start-up takes longer under ASan
STOP_TIMEOUT = 15.0  # tierd's own bound on the drain is 10 s

#: Small pools: 4 host segments of 16M (48M per job), emulated VRAM throttled
#: to 32M/s (a 16M copy takes half a second: fences can be caught unfinished),
#: one 256M target.  No linger: a job goes with its last connection, so tests
#: with different jobs do not hold segments for each other.
CONFIG = """\
[daemon]
linger_sec = 0
[limits]
max_inflight = 64
[host]
capacity = 64M
segment_size = 16M
job_limit = 48M
[vram]
backend = emulated
capacity = 32M
chunk_size = 8M
job_limit = 16M
bandwidth = 32M
[nvme]
target = @DIR@/t0.img:256M
extent_size = 1M
"""

MiB = 1 << 20
HOST_CAPACITY = 64 * MiB

_CAP_IPC_LOCK = 14


def source_dir() -> str:
    """$TIER_SOURCE, else the checkout this file lies in."""
    return os.environ.get("TIER_SOURCE") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_dir() -> str:
    """$TIER_BUILD (meson sets it), else the checkout's build/."""
    return os.environ.get("TIER_BUILD") or os.path.join(source_dir(), "build")


def _cap_set(name: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def can_lock_memory(nbytes: int) -> str | None:
    """None if a tierd started here can lock a host pool of @nbytes, else why not (test_can_lock_memory())."""
    bit = 1 << _CAP_IPC_LOCK
    if os.geteuid() == 0 and _cap_set("CapBnd") & bit:
        return None
    if os.geteuid() != 0 and _cap_set("CapAmb") & bit:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= nbytes + MiB:
        return None
    return (
        f"tierd's host pool of {nbytes >> 20} MiB needs CAP_IPC_LOCK or RLIMIT_MEMLOCK above it; "
        f"the limit here is {soft >> 10} KiB (ulimit -l)"
    )


def _pdeathsig() -> None:  # in the child, before exec: die with a timed-out test
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Tierd:
    """One tierd on a temporary directory.  ``with Tierd() as d:`` starts and stops it."""

    def __init__(self, config: str = CONFIG, log_level: str = "debug", fd_store: bool = False) -> None:
        self.log_level = log_level
        self.fd_store = fd_store
        self.stored: list[tuple[str, int]] = []       # the fd store: (name, fd), in the order they came
        self._store_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._closing = False
        self._sync_sent = self._sync_seen = 0
        self.dir = tempfile.mkdtemp(prefix="tierd-py.", dir="/var/tmp")
        self.socket = os.path.join(self.dir, "tierd.sock")
        self.config = os.path.join(self.dir, "tierd.conf")
        self.log = os.path.join(self.dir, "tierd.log")
        self.notify_path = os.path.join(self.dir, "notify")
        self.proc: subprocess.Popen[bytes] | None = None
        self.notes: list[str] = []
        with open(self.config, "w") as f:
            f.write(config.replace("@DIR@", self.dir))
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._notify.bind(self.notify_path)
        if fd_store:
            self._reader = threading.Thread(target=self._read_store, daemon=True)
            self._reader.start()

    # -- the fd store
    def _store_message(self, text: str, fds: list[int]) -> None:
        name = "stored"
        for line in text.splitlines():
            if line.startswith("FDNAME="):
                name = line[len("FDNAME="):]
        with self._store_lock:
            if "FDSTOREREMOVE=1" in text:
                for n, fd in [x for x in self.stored if x[0] == name]:
                    os.close(fd)
                self.stored = [x for x in self.stored if x[0] != name]
            for fd in fds:
                if "FDSTORE=1" in text:
                    self.stored.append((name, fd))
                else:
                    os.close(fd)

    def _read_store(self) -> None:
        """The fd store's reader: every message as it comes (tierd's sends never wait on us)."""
        self._notify.settimeout(0.2)
        while not self._closing:
            try:
                msg, fds, _, _ = socket.recv_fds(self._notify, 4096, 64)
            except socket.timeout:
                continue
            except OSError:
                return
            text = msg.decode("utf-8", "replace")
            if text.startswith("HARNESS_SYNC="):
                self._sync_seen = int(text.split("=", 1)[1])
                continue
            self._store_message(text, list(fds))
            self.notes.append(text)

    def sync_store(self) -> None:
        """Once this returns, the reader has taken every message sent to NOTIFY_SOCKET before the call: a
        marker of ours goes behind them (datagrams keep their order) and we wait for the reader to see it."""
        if self._reader is None:
            return
        self._sync_sent += 1
        want = self._sync_sent
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(f"HARNESS_SYNC={want}".encode(), self.notify_path)
        deadline = time.monotonic() + 30
        while self._sync_seen < want:
            if time.monotonic() > deadline or not self._reader.is_alive():
                raise RuntimeError("the fd store's reader did not catch up")
            time.sleep(0.005)

    def stored_names(self, prefix: str = "") -> list[str]:
        with self._store_lock:
            return [n for n, _ in self.stored if n.startswith(prefix)]

    def wait_stored(self, prefix: str, n: int, timeout: float = 10.0) -> None:
        """Wait until the fd store holds @n fds named @prefix... (the reader thread takes them as they come)."""
        deadline = time.monotonic() + timeout
        while len(self.stored_names(prefix)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fd store holds {self.stored_names()} after {timeout} s, not {n} of {prefix}")
            time.sleep(0.01)

    # -- start
    def start(self, timeout: float = READY_TIMEOUT) -> Tierd:
        env = dict(os.environ)
        for k in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "JOURNAL_STREAM", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(k, None)
        env["NOTIFY_SOCKET"] = self.notify_path
        env.pop("FDSTORE", None)
        if self.fd_store:
            env["FDSTORE"] = "4096"     # what systemd >= 254 sets: FileDescriptorStoreMax=
        # an ASan build: Python runs with LD_PRELOAD=libasan and detect_leaks=0 (its own
        # leaks at exit are by design); tierd gets the C tests' options back
        if "TIER_TIERD_ASAN_OPTIONS" in env:
            env["ASAN_OPTIONS"] = env.pop("TIER_TIERD_ASAN_OPTIONS")
        argv = [
            os.path.join(build_dir(), "daemon", "tierd"),
            "--config", self.config,
            "--state-dir", self.dir,
            "--socket", self.socket,
            "--log-target", "stderr",
            "--log-level", self.log_level,
        ]
        pass_fds: tuple[int, ...] = ()
        with self._store_lock:
            stored = list(self.stored)
        if stored:
            # as systemd passes the store: from fd 3 on, named, LISTEN_PID the daemon's (bash's, which execs it)
            fds = [fd for _, fd in stored]
            script = [f"exec {200 + i}<&{fd}" for i, fd in enumerate(fds)]
            script += [f"exec {fd}<&-" for fd in fds]
            script += [f"exec {3 + i}<&{200 + i} {200 + i}<&-" for i in range(len(fds))]
            script.append('export LISTEN_PID=$$; exec "$@"')
            argv = ["/bin/bash", "-c", "; ".join(script), "tierd"] + argv
            env["LISTEN_FDS"] = str(len(fds))
            env["LISTEN_FDNAMES"] = ":".join(n for n, _ in stored)
            pass_fds = tuple(fds)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                preexec_fn=_pdeathsig, close_fds=True, pass_fds=pass_fds,
            )
        since = len(self.notes)
        try:
            self.wait_notify("READY=1", timeout, since)
        except Exception:
            self.kill()
            raise
        return self

    def restart(self) -> int:
        """Stop (SIGTERM) and start again on the same directory; the stop's exit status."""
        status = self.stop()
        self.start()
        return status

    def _drain(self, timeout: float) -> None:
        if self._reader is not None:
            time.sleep(timeout)     # the reader thread takes the messages
            return
        self._notify.settimeout(timeout)
        try:
            while True:
                self.notes.append(self._notify.recv(4096).decode("utf-8", "replace"))
                self._notify.settimeout(0)
        except (BlockingIOError, socket.timeout):
            pass

    def wait_notify(self, needle: str, timeout: float, since: int = 0) -> str:
        """The first notify message (from the @since-th on) containing @needle, waiting up to @timeout s."""
        deadline = time.monotonic() + timeout
        seen = since
        while True:
            for m in self.notes[seen:]:
                if needle in m:
                    return m
            seen = len(self.notes)
            if self.proc is not None and self.proc.poll() is not None:
                self.dump_log()
                raise RuntimeError(f"tierd exited (status {self.proc.returncode}) while we waited for {needle!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                self.dump_log()
                raise RuntimeError(f"tierd did not send {needle!r} within {timeout} s")
            self._drain(min(left, 0.1))

    # -- stop
    def stop(self) -> int:
        """SIGTERM, wait (15 s at most, then SIGKILL); returns the exit status, the log printed unless 0."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"tierd did not exit within {STOP_TIMEOUT} s: killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
            status = -signal.SIGKILL
        self.proc = None
        self._drain(0)
        if status != 0:
            self.dump_log()
        return status

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill_and_start(self) -> float:
        """SIGKILL tierd and start it again on the same directory (with the fd store, if kept); the seconds
        from the kill to READY=1."""
        t0 = time.monotonic()
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self.sync_store()       # what tierd sent before it died is in the store
        self.start()
        return time.monotonic() - t0

    def cleanup(self) -> None:
        """Kill tierd if it still runs (a test failed half-way: log printed), remove the directory."""
        if self.proc is not None:
            running = self.proc.poll() is None
            self.kill()
            if running:
                print("tierd was still running at clean-up: killed", file=sys.stderr)
                self.dump_log()
        self._closing = True
        if self._reader is not None:
            self._reader.join(5)
        self._notify.close()
        with self._store_lock:
            for _, fd in self.stored:
                os.close(fd)
            self.stored = []
        if os.environ.get("TIER_TEST_KEEP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def dump_log(self) -> None:
        try:
            with open(self.log, errors="replace") as f:
                text = f.read()
        except OSError:
            text = "(none)\n"
        print(f"---- tierd log ({self.log}) ----\n{text}---- end of log ----", file=sys.stderr)

    def log_text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def __enter__(self) -> Tierd:
        try:
            return self.start()
        except Exception:
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            status = self.stop()
        finally:
            self.cleanup()
        if status != 0 and exc[0] is None:
            raise AssertionError(f"tierd did not exit cleanly (status {status})")


class DaemonTestCase(unittest.TestCase):
    """Test cases sharing one tierd (started in setUpClass): ``cls.d``, ``cls.socket``."""

    config = CONFIG
    d: Tierd
    socket: str

    @classmethod
    def setUpClass(cls) -> None:
        why = can_lock_memory(HOST_CAPACITY)
        if why:
            raise unittest.SkipTest(why)
        cls.d = Tierd(cls.config)
        try:
            cls.d.start()
        except Exception:
            cls.d.cleanup()
            raise
        cls.socket = cls.d.socket

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            status = cls.d.stop()
        finally:
            cls.d.cleanup()
        if status != 0:
            raise AssertionError(f"tierd did not exit cleanly (status {status})")

    def client(self, job: str | None = None, rank: int = 0):
        """A Client of a job named after the test (closed at clean-up)."""
        import tier

        c = tier.Client(job if job is not None else self.id().rsplit(".", 1)[-1][:60], rank, socket=self.socket)
        self.addCleanup(c.close)
        return c


def main() -> None:
    """unittest.main(), exiting 77 when every test skipped (or the module's set-up did).

    """
    prog = unittest.main(exit=False, verbosity=2)
    r = prog.result
    if not r.wasSuccessful():
        sys.exit(1)
    if r.testsRun == 0 or len(r.skipped) >= r.testsRun:
        sys.exit(SKIP)
    sys.exit(0)
