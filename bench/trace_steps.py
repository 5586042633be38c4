#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""trace_steps.py: one training step of a `tierctl trace` file as text.

Reads the Chrome Trace Event JSON that `tierctl trace -o FILE` writes and
prints one step of one plan (from a marker of phase 0 to the next): every
phase with its start and length, its stall, and each transfer that started
in the step with its link, tensor, length and how long it was queued, in
start order; then the busy time of each link in the step (the union of its
transfers' intervals, clipped to the step: transfers on one link overlap, as
the NVMe ring holds many extents at once, so their lengths do not add up)
and the stall of the step.  With several jobs in the trace, a transfer of
another job than the plan's is marked with that job's name, and a second
line gives each link's busy time with the plan's own job's transfers only:
the rest of the link's time went to the other jobs.
That is where a step's time goes, which the benchmarks' per-step totals do
not show (bench/README.md, the matrix).

    tierctl trace --seconds 3 -o /tmp/t.json    # while a job runs
    bench/trace_steps.py /tmp/t.json            # the second whole step
    bench/trace_steps.py /tmp/t.json --step 0 --plan 2 --json

Links print as R (NVMe -> host), W (host -> NVMe), u (host -> VRAM) and
d (VRAM -> host), indented one column per link.
"""

import argparse
import json
import sys

LINKS = {"nvme->host": "R", "host->nvme": "W", "host->vram": "u", "vram->host": "d"}


def load(path):
    """The trace's events: ([phases], [stalls], [transfers]), each a dict with ts and dur in us."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise SystemExit(f"trace_steps: cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"trace_steps: {path} is not JSON: {e}")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise SystemExit(f"trace_steps: {path} has no \"traceEvents\" array: not a tierctl trace file")
    phases, stalls, transfers, jobs = [], [], [], {}
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("args"), dict):
            continue
        cat, a = e.get("cat"), e["args"]
        # each job's events go under a pid of their own: the job's name, from its own transfers
        if cat == "job-io" and isinstance(a.get("job"), str):
            jobs[e.get("pid")] = a["job"]
        if e.get("ph") != "X":
            continue
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat == "phase":
            phases.append({"plan": a.get("plan"), "phase": a.get("phase"), "ts": ts, "dur": dur,
                           "pid": e.get("pid")})
        elif cat == "stall":
            stalls.append({"plan": a.get("plan"), "phase": a.get("phase"), "ts": ts, "dur": dur})
        elif cat == "transfer" and a.get("link") in LINKS:
            transfers.append({"link": a["link"], "tensor": a.get("tensor", e.get("name", "?")),
                              "job": a.get("job"), "ts": ts, "dur": dur,
                              "queued": float(a.get("queued_us", 0))})
    for p in phases:
        p["job"] = jobs.get(p.pop("pid"))
    return phases, stalls, transfers


def busy_us(intervals, t0, t1):
    """The time in [@t0, @t1) covered by at least one of @intervals ((start, end) pairs)."""
    total, end = 0.0, t0
    for a, b in sorted((max(a, t0), min(b, t1)) for a, b in intervals):
        if b <= a or b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def step(phases, stalls, transfers, plan=None, index=1):
    """Step @index (0: the first whole one) of @plan (None: the first plan seen), as a dict."""
    plans = sorted({p["plan"] for p in phases if p["plan"] is not None})
    if not plans:
        raise SystemExit("trace_steps: the trace has no phases: was a plan running while it recorded?")
    if plan is None:
        plan = plans[0]
    elif plan not in plans:
        raise SystemExit(f"trace_steps: no plan {plan} in the trace (plans: {', '.join(map(str, plans))})")
    mine = sorted((p for p in phases if p["plan"] == plan), key=lambda p: p["ts"])
    starts = [p["ts"] for p in mine if p["phase"] == 0]
    if len(starts) < index + 2:
        raise SystemExit(f"trace_steps: plan {plan} has {max(len(starts) - 1, 0)} whole step(s) in the trace; "
                         f"step {index} asked for: record longer")
    t0, t1 = starts[index], starts[index + 1]
    job = mine[0]["job"]        # None: not known (no transfer of it in the trace), all count as its own
    own = [x for x in transfers if job is None or x["job"] == job]
    rows = []
    for p in mine:
        if t0 <= p["ts"] < t1:
            rows.append({"kind": "phase", "phase": p["phase"], "start_ms": (p["ts"] - t0) / 1e3, "ms": p["dur"] / 1e3})
    for s in stalls:
        if s["plan"] == plan and t0 <= s["ts"] < t1:
            rows.append({"kind": "stall", "phase": s["phase"], "start_ms": (s["ts"] - t0) / 1e3, "ms": s["dur"] / 1e3})
    busy = {link: busy_us([(x["ts"], x["ts"] + x["dur"]) for x in transfers if x["link"] == link], t0, t1) / 1e3
            for link in LINKS}
    busy_own = {link: busy_us([(x["ts"], x["ts"] + x["dur"]) for x in own if x["link"] == link], t0, t1) / 1e3
                for link in LINKS}
    for x in transfers:
        if t0 <= x["ts"] < t1:
            rows.append({"kind": "transfer", "link": x["link"], "tensor": x["tensor"], "job": x["job"],
                         "own": job is None or x["job"] == job,
                         "start_ms": (x["ts"] - t0) / 1e3, "ms": x["dur"] / 1e3, "queued_ms": x["queued"] / 1e3})
    rows.sort(key=lambda r: (r["start_ms"], r["kind"] != "phase"))
    return {"plan": plan, "job": job, "step": index, "step_ms": (t1 - t0) / 1e3,
            "stall_ms": sum(r["ms"] for r in rows if r["kind"] == "stall"),
            "busy_ms": busy, "busy_own_ms": busy_own, "rows": rows}


def render(s):
    out = [f"plan {s['plan']} step {s['step']}: {s['step_ms']:.1f} ms, stall {s['stall_ms']:.1f} ms"]
    col = {link: "  " * (i + 2) for i, link in enumerate(LINKS)}
    for r in s["rows"]:
        if r["kind"] == "phase":
            out.append(f"{r['start_ms']:8.1f} {r['ms']:6.1f}  phase {r['phase']}")
        elif r["kind"] == "stall":
            out.append(f"{r['start_ms']:8.1f} {r['ms']:6.1f}    stall before phase {r['phase']}")
        else:
            q = f" (queued {r['queued_ms']:.1f})" if r["queued_ms"] >= 0.05 else ""
            who = "" if r["own"] else f" [job {r['job']}]"
            out.append(f"{r['start_ms']:8.1f} {r['ms']:6.1f}  {col[r['link']]}{LINKS[r['link']]} {r['tensor']}{q}{who}")
    out.append("busy ms: " + ", ".join(f"{LINKS[k]} ({k}) {v:.1f}" for k, v in s["busy_ms"].items()))
    if s["busy_own_ms"] != s["busy_ms"]:
        out.append(f"busy ms, job {s['job']}'s own: " +
                   ", ".join(f"{LINKS[k]} {v:.1f}" for k, v in s["busy_own_ms"].items()))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description="One training step of a tierctl trace file as text.")
    ap.add_argument("trace", help="the file `tierctl trace -o FILE` wrote")
    ap.add_argument("--step", type=int, default=1, help="which whole step (0: the first; default 1)")
    ap.add_argument("--plan", type=int, help="the plan's number in the trace (default: the first)")
    ap.add_argument("--json", action="store_true", help="print the step as one JSON document")
    args = ap.parse_args(argv)
    if args.step < 0:
        ap.error("--step must be 0 or more")
    s = step(*load(args.trace), plan=args.plan, index=args.step)
    print(json.dumps(s) if args.json else render(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
