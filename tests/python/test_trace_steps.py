#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench/trace_steps.py: one step of a tierctl trace file, on a hand-made trace and on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ.get("TIER_SOURCE", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOOL = os.path.join(SOURCE, "bench", "trace_steps.py")


def phase(plan: int, k: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "phase", "name": f"phase {k}", "pid": 100, "tid": 10, "ts": ts, "dur": dur,
            "args": {"plan": plan, "marker": 1, "phase": k}}


def xfer(link: str, tensor: str, ts: float, dur: float, queued: float = 0.0, job: str = "j") -> dict:
    return {"ph": "X", "cat": "transfer", "name": tensor, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"job": job, "tensor": tensor, "link": link, "bytes": 4, "size": 4, "queued_us": queued}}


def trace() -> dict:
    """Plan 1, two phases a step: three phase-0 markers at 0, 10 and 25 ms, so two whole steps."""
    ev = [{"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "tierd links"}}]
    for start, p0, p1 in ((0, 4000, 6000), (10000, 5000, 10000), (25000, 5000, 5000)):
        ev.append(phase(1, 0, start, p0))
        ev.append(phase(1, 1, start + p0, p1))
    ev.append({"ph": "X", "cat": "stall", "name": "stall: phase 1", "pid": 100, "tid": 11, "ts": 15000, "dur": 2000,
               "args": {"plan": 1, "marker": 2, "phase": 1}})
    ev += [xfer("nvme->host", "O1", 11000, 3000, 500), xfer("host->nvme", "O0", 16000, 2500),
           xfer("host->vram", "P0", 20000, 1000), xfer("vram->host", "G0", 2000, 1000)]
    # another plan's phase and a decision: ignored
    ev.append(phase(2, 0, 12000, 1000))
    ev.append({"ph": "i", "cat": "decision", "name": "pin next P1", "pid": 100, "tid": 1, "ts": 13000,
               "args": {"why": "x"}})
    return {"displayTimeUnit": "ms", "traceEvents": ev}


class TraceSteps(unittest.TestCase):
    def run_tool(self, doc, *args: str) -> subprocess.CompletedProcess:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            if isinstance(doc, str):
                f.write(doc)
            else:
                json.dump(doc, f)
            path = f.name
        try:
            return subprocess.run([sys.executable, TOOL, path, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.unlink(path)

    def test_step_json(self) -> None:
        r = self.run_tool(trace(), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        # step 1 (the default) runs from 10 to 25 ms: its phases, its stall, the three transfers in it
        self.assertEqual((s["plan"], s["step"], s["step_ms"], s["stall_ms"]), (1, 1, 15.0, 2.0))
        self.assertEqual(s["busy_ms"], {"nvme->host": 3.0, "host->nvme": 2.5, "host->vram": 1.0, "vram->host": 0.0})
        kinds = [(r["kind"], r.get("phase", r.get("tensor")), r["start_ms"]) for r in s["rows"]]
        self.assertEqual(kinds, [("phase", 0, 0.0), ("transfer", "O1", 1.0), ("phase", 1, 5.0), ("stall", 1, 5.0),
                                 ("transfer", "O0", 6.0), ("transfer", "P0", 10.0)])
        self.assertEqual(s["rows"][1]["queued_ms"], 0.5)

    def test_busy_is_a_union(self) -> None:
        """Overlapping transfers on one link count once; a transfer across the step's edge, its part inside."""
        doc = trace()
        doc["traceEvents"] += [
            xfer("nvme->host", "O2", 11500, 3000),      # 11.5-14.5: overlaps O1 (11-14), adds 0.5
            xfer("nvme->host", "O3", 12000, 1000),      # inside both: adds nothing
            xfer("nvme->host", "O4", 24000, 3000),      # 24-27: 1 ms of it in the step (to 25)
            xfer("nvme->host", "O5", 8000, 2500),       # 8-10.5, started in step 0: 0.5 ms in step 1
        ]
        r = self.run_tool(doc, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        # the sum would be 3 + 3 + 1 + 3 = 10 ms of 15; the link was busy 11-14.5, 24-25 and 10-10.5
        self.assertAlmostEqual(s["busy_ms"]["nvme->host"], 5.0)
        self.assertLessEqual(max(s["busy_ms"].values()), s["step_ms"])
        # the rows are still the transfers that started in the step
        self.assertEqual([r["tensor"] for r in s["rows"] if r["kind"] == "transfer"], ["O1", "O2", "O3", "O0", "P0", "O4"])

    def test_step_zero_and_text(self) -> None:
        r = self.run_tool(trace(), "--step", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "plan 1 step 0: 10.0 ms, stall 0.0 ms")
        self.assertIn("d G0", lines[2])         # the VRAM -> host copy at 2 ms, between the two phases
        self.assertTrue(lines[-1].startswith("busy ms: R (nvme->host) 0.0, W (host->nvme) 0.0"), lines[-1])
        self.assertEqual(len(lines), 5)

    def test_other_jobs_marked(self) -> None:
        """With two jobs, the plan's job (from its own transfers, under its phases' pid) is told apart."""
        doc = trace()
        # job j's own copy of its transfers, under its pid (100, as its phases); job k's under pid 101
        doc["traceEvents"] += [dict(xfer("nvme->host", "O1", 11000, 3000, 500), cat="job-io", pid=100),
                               dict(xfer("nvme->host", "O7", 13000, 3000, job="k"), cat="job-io", pid=101),
                               xfer("nvme->host", "O7", 13000, 3000, job="k")]     # 13-16: 2 ms beyond O1
        r = self.run_tool(doc, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        self.assertEqual(s["job"], "j")
        self.assertEqual([(r["tensor"], r["own"]) for r in s["rows"] if r["kind"] == "transfer"],
                         [("O1", True), ("O7", False), ("O0", True), ("P0", True)])
        self.assertEqual(s["busy_ms"]["nvme->host"], 5.0)       # 11-16, both jobs
        self.assertEqual(s["busy_own_ms"], {"nvme->host": 3.0, "host->nvme": 2.5, "host->vram": 1.0,
                                            "vram->host": 0.0})
        r = self.run_tool(doc)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertIn("R O7 [job k]", lines[3])
        self.assertNotIn("[job", lines[2])      # O1 is the plan's own
        self.assertEqual(lines[-1], "busy ms, job j's own: R 3.0, W 2.5, u 1.0, d 0.0")
        # one job only: no second line, as before
        self.assertTrue(self.run_tool(trace()).stdout.splitlines()[-1].startswith("busy ms: R"))

    def test_errors(self) -> None:
        r = self.run_tool(trace(), "--step", "2")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("has 2 whole step(s)", r.stderr)
        r = self.run_tool(trace(), "--plan", "7")
        self.assertIn("no plan 7 in the trace (plans: 1, 2)", r.stderr)
        r = self.run_tool(trace(), "--step", "-1")
        self.assertIn("--step must be 0 or more", r.stderr)
        r = self.run_tool("not json")
        self.assertIn("is not JSON", r.stderr)
        r = self.run_tool({"traceEvents": []})
        self.assertIn("has no phases", r.stderr)
        r = self.run_tool([1, 2])
        self.assertIn("not a tierctl trace file", r.stderr)
        r = subprocess.run([sys.executable, TOOL, "/nonexistent/t.json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertIn("cannot read /nonexistent/t.json", r.stderr)


if __name__ == "__main__":
    unittest.main()
