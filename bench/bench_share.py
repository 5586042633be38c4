#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench_share.py: two planned jobs on one tierd, static limits vs capacity that flows (bench/run share).

Two synthetic training jobs share the host pool (HOST bytes): a big one
whose working set (BIG tensors) is more than half the pool and a small one
(SMALL tensors), together within it.  Each step of a job is one phase per
tensor, reading and writing it in host memory (the tensor's stamp checked,
then written anew: a lost byte is counted).  Two runs, in the same tierd:

  static    each job's host limit is half the pool (the advice before
            capacity flowed: keep the sum of the limits within the capacity);
  flowing   each job may use the whole pool (its maximum), the share
            between them decided by demand and weights.

For each, each job's NVMe bytes per step of its own (as tierd counted
them, per job; the two jobs run at different speeds, so one job's step count
would not do for both), their sum, and the step times.  Then a third run, converge:
two jobs that each want more than the pool holds, with weights 1 and 2;
their host occupancy is sampled every 100 ms and compared with their
weighted shares (x = used / share; Jain's index (sum x)^2 / (n sum x^2),
1 when both hold exactly their share).

One JSON line on stdout: {"bench":"share", "static": {...}, "flowing": {...},
"nvme_bytes_per_step_static", "nvme_bytes_per_step_flowing", "converge": {...},
"verified"}.  Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))

import tier  # noqa: E402

MiB = 1 << 20
STAMP_OFFSETS = (0, 4096, 65536, 1 << 20)


def log(msg: str) -> None:
    print(f"bench_share: {msg}", file=sys.stderr, flush=True)


def child(a: argparse.Namespace) -> int:
    """One job: create its tensors, plan one phase per tensor, run until told to stop."""
    c = tier.Client(a.job, socket=a.socket)
    print("up", flush=True)
    sys.stdin.readline()            # the parent set the job's quota
    ts = [c.create(f"s{i}", a.tensor_size) for i in range(a.tensors)]
    plan = c.plan()
    for i, t in enumerate(ts):
        plan.add(i, t, tier.Level.HOST, tier.Mode.READ_WRITE)
    plan.submit()
    ver = [0] * len(ts)
    lost = 0
    steps = 0
    phase_s = a.compute_ms / 1000.0
    start_moved = None
    t_start = 0.0
    # the parent reads "ready" and answers with the number of seconds to run
    while True:
        for i, t in enumerate(ts):
            c.phase(i)
            g = c.phase_grant(t, tier.Level.HOST)
            mv = g.memoryview()
            want = (ver[i] * 37 + i) & 0xFF if ver[i] else 0
            for off in STAMP_OFFSETS:
                if off < len(mv) and mv[off] != want:
                    lost += 1
            ver[i] += 1
            for off in STAMP_OFFSETS:
                if off < len(mv):
                    mv[off] = (ver[i] * 37 + i) & 0xFF
            del mv
            end = time.monotonic() + phase_s
            while time.monotonic() < end:
                pass
        steps += 1
        if steps == a.warmup:
            print("ready", flush=True)
            duration = float(sys.stdin.readline())
            start_moved = c.moved()
            t_start = time.monotonic()
            steps_at_start = steps
        if start_moved is not None and time.monotonic() - t_start >= duration:
            break
    moved = c.moved()
    el = time.monotonic() - t_start
    n = steps - steps_at_start
    c.phase(0)              # the last phase's writes are released
    c.end_plan()
    for t in ts:
        t.destroy()
    c.close()
    d = {k: moved[k] - start_moved[k] for k in moved}
    print(json.dumps({"steps": n, "seconds": el, "step_s": el / n if n else None,
                      "nvme_bytes": d["nvme->host"] + d["host->nvme"], "moved": d, "lost": lost}), flush=True)
    return 0


def start_job(a: argparse.Namespace, job: str, tensors: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", "--socket", a.socket, "--job", job,
         "--tensors", str(tensors), "--tensor-size", str(a.tensor_size), "--warmup", str(a.warmup),
         "--compute-ms", str(a.compute_ms)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def wait_for(p: subprocess.Popen, job: str, word: str = "ready") -> None:
    line = p.stdout.readline()
    if line.strip() != word:
        raise RuntimeError(f"job {job} did not start (said {line!r}, exit status {p.poll()})")


def used_host(status: dict, job: str) -> int:
    for j in status.get("jobs", []):
        if j.get("name") == job:
            return int(j["usage"]["host"]["used"])
    return 0


def pair(a: argparse.Namespace, ctl: tier.Client, mode: str) -> dict:
    """The big and the small job at once, under static limits or flowing capacity."""
    jobs = {f"{mode}-big": a.big, f"{mode}-small": a.small}
    limit = a.host // 2 if mode == "static" else a.host
    procs = {}
    for job, n in jobs.items():
        procs[job] = start_job(a, job, n)
    # the jobs exist once their connection is up: their limits are set before they make tensors
    for job, p in procs.items():
        wait_for(p, job, "up")
        ctl.set_quota(job, host=limit)
        p.stdin.write("go\n")
        p.stdin.flush()
    for job, p in procs.items():
        wait_for(p, job)
    samples = {job: [] for job in jobs}
    for p in procs.values():
        p.stdin.write(f"{a.duration}\n")
        p.stdin.flush()
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.duration:
        st = ctl.status()
        for job in jobs:
            samples[job].append(used_host(st, job))
        time.sleep(0.1)
    out = {}
    for job, p in procs.items():
        res = json.loads(p.stdout.readline())
        p.wait()
        res["host_used_mean_bytes"] = int(sum(samples[job]) / max(len(samples[job]), 1))
        out[job.split("-", 1)[1]] = res
    out["nvme_bytes_per_step"] = nvme_per_step(out)
    out["host_limit_bytes"] = limit
    log(f"{mode}: limits {limit // MiB} MiB each; big {out['big']['step_s']:.3f} s/step, "
        f"{out['big']['nvme_bytes'] / max(out['big']['steps'], 1) / MiB:.1f} MiB NVMe/step, host "
        f"{out['big']['host_used_mean_bytes'] // MiB} MiB; small {out['small']['step_s']:.3f} s/step, "
        f"{out['small']['nvme_bytes'] / max(out['small']['steps'], 1) / MiB:.1f} MiB NVMe/step, host "
        f"{out['small']['host_used_mean_bytes'] // MiB} MiB")
    return out


def nvme_per_step(jobs: dict) -> int:
    """Set each job's "nvme_bytes_per_step" (its NVMe bytes over its own steps; None without a step) and
    return their sum: NVMe bytes per step of both jobs, each step counted for its own job."""
    total = 0
    for r in jobs.values():
        r["nvme_bytes_per_step"] = round(r["nvme_bytes"] / r["steps"]) if r.get("steps") else None
        total += r["nvme_bytes_per_step"] or 0
    return total


def jain(xs: list[float]) -> float:
    s = sum(xs)
    q = sum(x * x for x in xs)
    return s * s / (len(xs) * q) if q > 0 else 1.0


def converge(a: argparse.Namespace, ctl: tier.Client) -> dict:
    """Two jobs that each want more than the pool, weights 1 and 2: occupancy against weighted share."""
    weights = {"w1": 1, "w2": 2}
    n = a.host // a.tensor_size            # each wants the whole pool
    procs = {job: start_job(a, job, n) for job in weights}
    for job, p in procs.items():
        wait_for(p, job, "up")
        ctl.set_quota(job, host=a.host, weight=weights[job])
        p.stdin.write("go\n")
        p.stdin.flush()
    wsum = sum(weights.values())
    share = {job: a.host * w / wsum for job, w in weights.items()}
    for job, p in procs.items():
        wait_for(p, job)
    for p in procs.values():
        p.stdin.write(f"{a.duration}\n")
        p.stdin.flush()
    series = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.duration:
        st = ctl.status()
        used = {job: used_host(st, job) for job in weights}
        series.append((round(time.monotonic() - t0, 2), used["w1"], used["w2"],
                       round(jain([used[j] / share[j] for j in weights]), 4)))
        time.sleep(0.1)
    res = {}
    for job, p in procs.items():
        res[job] = json.loads(p.stdout.readline())
        p.wait()
    half = series[len(series) // 2:]
    out = {
        "weights": weights,
        "share_bytes": {j: int(s) for j, s in share.items()},
        "jain_first_s": [s[3] for s in series if s[0] < 1.0][:10],
        "jain_second_half_mean": round(sum(s[3] for s in half) / max(len(half), 1), 4),
        "jain_second_half_min": min((s[3] for s in half), default=None),
        "used_second_half_mean_bytes": {"w1": int(sum(s[1] for s in half) / max(len(half), 1)),
                                        "w2": int(sum(s[2] for s in half) / max(len(half), 1))},
        "series": series[:: max(len(series) // 40, 1)],
        "jobs": res,
    }
    log(f"converge: shares {int(share['w1']) // MiB} / {int(share['w2']) // MiB} MiB; held on average "
        f"{out['used_second_half_mean_bytes']['w1'] // MiB} / {out['used_second_half_mean_bytes']['w2'] // MiB} "
        f"MiB in the second half; Jain's index there {out['jain_second_half_mean']} (min "
        f"{out['jain_second_half_min']})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--host", type=int, default=128 * MiB, help="the host pool's capacity (bytes)")
    ap.add_argument("--tensor-size", type=int, default=4 * MiB)
    ap.add_argument("--big", type=int, default=22, help="tensors of the big job")
    ap.add_argument("--small", type=int, default=8, help="tensors of the small job")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the timed window")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of each timed window")
    ap.add_argument("--compute-ms", type=float, default=5.0, help="busy time per phase")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--tensors", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if (a.big + a.small) * a.tensor_size > a.host:
        ap.error("the two jobs together must fit the pool (--big + --small tensors)")
    if a.big * a.tensor_size <= a.host // 2:
        ap.error("the big job must want more than half the pool")
    t0 = time.monotonic()
    ctl = tier.Client("", socket=a.socket)   # a control connection
    static = pair(a, ctl, "static")
    flowing = pair(a, ctl, "flowing")
    conv = converge(a, ctl)
    lost = sum(r["lost"] for d in (static, flowing) for r in (d["big"], d["small"])) + \
        sum(r["lost"] for r in conv["jobs"].values())
    out = {
        "bench": "share",
        "nvme_bytes_per_step_static": static["nvme_bytes_per_step"],
        "nvme_bytes_per_step_flowing": flowing["nvme_bytes_per_step"],
        "jain_second_half_mean": conv["jain_second_half_mean"],
        "verified": lost == 0,
        "host_bytes": a.host,
        "tensor_bytes": a.tensor_size,
        "big_tensors": a.big,
        "small_tensors": a.small,
        "static": static,
        "flowing": flowing,
        "converge": conv,
        "runtime_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(out, separators=(",", ":")))
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
