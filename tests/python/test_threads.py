#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A tier.Client shared by threads (a monitoring thread beside the training one)."""

from __future__ import annotations

import threading

import tierd
from tierd import MiB

import tier


class TestThreads(tierd.DaemonTestCase):
    def test_calls_of_two_threads_serialized(self) -> None:
        """A second thread's status() while the training thread was inside libtier on the same Client
        went in beside it (libtier's client is one thread at a time): their requests interleaved and
        the connection broke for both (EPROTO, "tierd answered request 4 while request 3 was in
        flight").  Now the second call waits for the first.  The order is made explicit: the first
        call is held inside tier_tensor_stat() until the second has reached the Client's lock (or,
        without one, libtier)."""
        c = self.client()
        t = c.create("t", MiB)
        lib = tier._base._L
        order: list[str] = []
        inside, second_ready, release = threading.Event(), threading.Event(), threading.Event()
        for name in ("tier_tensor_stat", "tier_client_status"):
            real = getattr(lib, name)
            self.addCleanup(setattr, lib, name, real)

            def spy(*args, real=real, name=name):
                order.append(f"{name} in {threading.current_thread().name}")
                if name == "tier_tensor_stat":
                    inside.set()
                    self.assertTrue(release.wait(30))
                else:
                    second_ready.set()
                r = real(*args)
                order.append(f"{name} out")
                return r
            setattr(lib, name, spy)

        class Observed:
            """The Client's lock, saying when a thread comes to wait for it."""

            def __init__(self, lock) -> None:
                self.lock = lock

            def __enter__(self) -> None:
                if threading.current_thread().name == "monitor":
                    second_ready.set()
                self.lock.acquire()

            def __exit__(self, *exc: object) -> None:
                self.lock.release()
        c._lock = Observed(getattr(c, "_lock", threading.RLock()))
        errors: list[BaseException] = []

        def run(call) -> None:
            try:
                call()
            except BaseException as e:  # noqa: B036 - reported by the assertion below
                errors.append(e)
        training = threading.Thread(target=run, args=(t.stat,), name="training")
        training.start()
        self.assertTrue(inside.wait(30))
        monitor = threading.Thread(target=run, args=(c.status,), name="monitor")
        monitor.start()
        self.assertTrue(second_ready.wait(30))
        release.set()
        training.join(30)
        monitor.join(30)
        self.assertEqual(errors, [])
        self.assertEqual(order, ["tier_tensor_stat in training", "tier_tensor_stat out",
                                 "tier_client_status in monitor", "tier_client_status out"])
        t.stat()                        # the connection is fine
        t.destroy()


if __name__ == "__main__":
    tierd.main()
