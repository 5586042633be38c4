#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench_churn.py: tierd's answers to a status request while jobs of 1-3 GiB start and end.

A job that ends gives its segments back, and each gets fresh memory (made,
locked and faulted in: in proportion to its size).  Done on the event loop,
every other client waits meanwhile; done on the renewer's thread
(daemon/tiers/renew.c), nobody does.  This benchmark measures it from a
client's side: one thread asks tierd for its status back to back, timing
each round trip, while the main thread runs jobs that take 1, 2 and 3 GiB of
the host pool (64 MiB tensors pinned write-only), then end (their
connection closes, linger 0).  Two tierds from the same build, one after
the other: the renewer on (``thread``), and the renewal on the loop as
before it (``loop``, ``TIERD_TEST_RENEW_ON_LOOP=1``); each first answers for
two seconds with no job at all (``idle``: the baseline of the same run).

One JSON line on stdout: {"bench":"churn", "status_p99_ms": thread's p99
during churn, "thread": {...}, "loop": {...}}; each has ``idle`` and
``churn`` latency figures (p50, p99 by nearest rank as bench-ipc's, max ms,
samples) and ``back_s``: how
long after a job's end the whole pool was free again.  Needs root (the pool
is locked memory) and TIER_BUILD (default build/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

MiB = 1 << 20
GiB = 1 << 30


def log(msg: str) -> None:
    print(f"bench_churn: {msg}", file=sys.stderr, flush=True)


def config(host: int) -> str:
    return f"""[daemon]
linger_sec = 0
[limits]
max_tensors = 4096
[host]
capacity = {host // MiB}M
segment_size = 64M
job_limit = {host // MiB}M
[vram]
backend = emulated
capacity = 64M
chunk_size = 16M
job_limit = 64M
[nvme]
target = @DIR@/t0.img:256M
"""


class Poller(threading.Thread):
    def __init__(self, socket: str) -> None:
        super().__init__(daemon=True)
        import tier

        self.c = tier.Client("", socket=socket)
        self.samples: list[tuple[float, float]] = []     # (when, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.c.status()
            self.samples.append((t0, time.perf_counter() - t0))


def figures(xs: list[float]) -> dict:
    if not xs:
        return {"samples": 0}
    s = sorted(xs)
    # nearest rank, as bench-ipc (bench_percentile_us()) and bench_torch: the ceil(0.99 n)-th smallest
    p99 = s[max(0, -(-99 * len(s) // 100) - 1)]
    return {"samples": len(s), "p50_ms": round(1e3 * statistics.median(s), 3),
            "p99_ms": round(1e3 * p99, 3), "max_ms": round(1e3 * s[-1], 3)}


def run(mode: str, host: int, sizes: list[int], rounds: int) -> dict:
    import tier
    import tierd

    if mode == "loop":
        os.environ["TIERD_TEST_RENEW_ON_LOOP"] = "1"
    else:
        os.environ.pop("TIERD_TEST_RENEW_ON_LOOP", None)
    d = tierd.Tierd(config(host), log_level="info")
    d.start(timeout=120)
    try:
        poller = Poller(d.socket)
        poller.start()
        time.sleep(2.0)
        ctl = tier.Client("", socket=d.socket)          # (a Client is one thread's)
        t_churn = time.perf_counter()
        backs = []
        for r in range(rounds):
            for size in sizes:
                c = tier.Client(f"churn-{r}-{size // GiB}", socket=d.socket)
                ts = [c.create(f"t{i}", 64 * MiB) for i in range(size // (64 * MiB))]
                for t in ts:
                    t.pin(tier.HOST, tier.WRITE)
                    t.unpin(tier.HOST, False)
                c.close()               # the job ends: its segments go back
                t0 = time.perf_counter()
                while True:
                    st = ctl.status()
                    host_tier = next(x for x in st["tiers"] if x["tier"] == "host")
                    if host_tier["used"] == 0 and not any(j["name"].startswith("churn") for j in st["jobs"]):
                        break
                    time.sleep(0.005)
                # the segments are back once a new job can take them all: measured by taking them
                probe = tier.Client("churn-probe", socket=d.socket)
                pts = [probe.create(f"p{i}", 64 * MiB) for i in range(host // (64 * MiB))]
                for t in pts:
                    t.pin(tier.HOST, tier.WRITE)
                backs.append(time.perf_counter() - t0)
                probe.close()
                log(f"{mode}: a {size // GiB} GiB job ended; the pool was whole again after {backs[-1]:.3f} s")
        t_end = time.perf_counter()
        ctl.close()
        time.sleep(1.0)                 # the last renewals
        poller.stop.set()
        poller.join(10)
        idle = [x for t, x in poller.samples if t < t_churn]
        churn = [x for t, x in poller.samples if t_churn <= t < t_end]
        return {"idle": figures(idle), "churn": figures(churn), "back_s": [round(b, 3) for b in backs]}
    finally:
        d.stop()
        d.cleanup()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="3584M", help="host pool (default 3584M: room for the 3 GiB job)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="thread,loop")
    a = p.parse_args()
    host = int(a.host[:-1]) * (GiB if a.host.endswith("G") else MiB) if a.host[-1] in "MG" else int(a.host)
    sizes = [s * GiB for s in (1, 2, 3) if s * GiB <= host]
    out = {"bench": "churn", "host_bytes": host, "job_sizes": sizes, "rounds": a.rounds}
    for mode in a.modes.split(","):
        out[mode] = run(mode, host, sizes, a.rounds)
        log(f"{mode}: status during churn {out[mode]['churn']}, idle {out[mode]['idle']}")
    out["status_p99_ms"] = out.get("thread", {}).get("churn", {}).get("p99_ms")
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
