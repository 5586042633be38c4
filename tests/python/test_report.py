#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench/run all (bench/report.py): results JSON, markdown summary, gnuplot PNGs; a real quick run."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import tierd

SOURCE = os.environ.get("TIER_SOURCE", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RUN = os.path.join(SOURCE, "bench", "run")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fixture() -> dict:
    cells = []
    for op in ("read", "write"):
        for bs in (131072, 1048576):
            for qd in (1, 4, 16):
                cells.append({"target": "striped", "op": op, "bs": bs, "qd": qd,
                              "gbps": 0.1 * qd * (bs / 131072) ** 0.5, "iops": 1000.0, "lat_us_p50": 100.0,
                              "suspect": op == "read" and qd == 16 and bs == 1048576})
    tl = [{"bench": "timeline", "config": "balanced", "policy": p, "step_s": s, "lower_bound_s": b,
           "capacity_bound_s": c, "time_bound_s": 0.52, "ratio": s / b, "nvme_read_gb": 0.1, "nvme_write_gb": 0.05, "stall_s": 0.01,
           "verified": True}
          for p, s, b, c in (("timeline", 0.58, 0.54, 0.53), ("lru", 1.02, 0.6, 0.53))]
    return {"kind": "tierd-bench-results", "version": 1, "time": "2026-12-01T00:00:00+00:00",
            "host": {"cpus": 2, "kernel": "6.1", "commit": "abc1234"}, "options": {},
            "results": {"timeline": tl,
                        "storage": {"bench": "storage", "version": 1, "cells": cells,
                                    "best": {"read": {"target": "striped", "bs": 1048576, "qd": 16, "gbps": 0.8},
                                             "write": {"target": "striped", "bs": 1048576, "qd": 16,
                                                       "gbps": 0.6}},
                                    "fio": {"read_gbps": 0.82, "write_gbps": 0.61, "bs": 1048576, "qd": 16}},
                        "ipc": [{"bench": "ipc", "pin_rtt_us_p50": 30.0, "raw_rtt_us_p50": 10.0, "pin_vs_raw": 3.0,
                                 "ops_per_s": 90000.0, "raw_ops_per_s": 300000.0, "ops_vs_raw": 0.3}]},
            "failed": {"torch": "bench/run torch exited with status 1"}}


def run_all(*args: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([RUN, "all", *args], capture_output=True, text=True, check=False, timeout=300)
    if check_rc is not None and p.returncode != check_rc:
        raise AssertionError(f"bench/run all {' '.join(args)}: exit {p.returncode}, expected {check_rc}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p


class TestReport(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tier-report-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_render_from_results(self) -> None:
        """--from: the summary has every benchmark's table and the failure; the plots are PNGs."""
        path = os.path.join(self.dir, "results.json")
        with open(path, "w") as f:
            json.dump(fixture(), f)
        # the results had a failed benchmark: exit 1, everything still written
        run_all("--from", path, check_rc=1)
        with open(os.path.join(self.dir, "summary.md")) as f:
            md = f.read()
        self.assertIn("**torch failed:** bench/run torch exited with status 1", md)
        self.assertIn("## Storage sweep (tierctl bench)", md)
        self.assertIn("12 cells, 1 above the link speed (suspect)", md)
        self.assertIn("| read | striped | 1048576 | 16 | 0.800 | 0.820 |", md)
        # the heuristic's least found is not shown as a bound; time_bound_s is
        self.assertIn("| policy | step s | bound s | time bound s | least found s |", md)
        self.assertIn("| lru | 1.020 | 0.600 | 0.520 | 0.530 |", md)
        self.assertIn("| round trip p50 (µs) | 30.000 | 10.000 | 3.000 |", md)
        if shutil.which("gnuplot") is None:
            self.skipTest("gnuplot is not installed (./scripts/test installs gnuplot-nox)")
        for png in ("storage-sweep.png", "timeline.png"):
            with open(os.path.join(self.dir, png), "rb") as f:
                self.assertEqual(f.read(8), PNG_MAGIC, png)
            self.assertIn(f"]({png})", md)
        with open(path) as f:
            self.assertEqual(json.load(f)["plots"], ["storage-sweep.png", "timeline.png"])
        # two series per panel: one line per block size in the data file
        with open(os.path.join(self.dir, "storage-sweep.dat")) as f:
            self.assertEqual(f.read().count("# "), 4)

    def test_errors(self) -> None:
        p = run_all("--kinds", "io,disk", check_rc=2)
        self.assertIn('unknown benchmark "disk"', p.stderr)
        p = run_all("--from", os.path.join(self.dir, "missing.json"), check_rc=2)
        self.assertIn("cannot read", p.stderr)
        other = os.path.join(self.dir, "other.json")
        with open(other, "w") as f:
            json.dump({"bench": "io"}, f)
        p = run_all("--from", other, check_rc=2)
        self.assertIn("is not a results file of bench/run all", p.stderr)

    @unittest.skipUnless(os.geteuid() == 0, "bench/run needs root (it mlocks tierd's host pool)")
    def test_quick_run(self) -> None:
        """A real run of one benchmark through bench/run, collected into the results."""
        out = os.path.join(self.dir, "out")
        env_dir = tempfile.mkdtemp(prefix="tier-report-run-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, env_dir, True)
        run_all("--kinds", "ipc", "--quick", "--no-plots", "--dir", env_dir, "--out", out)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        self.assertEqual(res["failed"], {})
        (ipc,) = res["results"]["ipc"]
        self.assertEqual(ipc["bench"], "ipc")
        self.assertGreater(ipc["raw_ops_per_s"], 0)
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("## Requests vs a raw socket (bench-ipc)", f.read())

    @unittest.skipUnless(os.geteuid() == 0, "bench/run needs root (it mlocks tierd's host pool)")
    @unittest.skipIf(shutil.which("fio") is None, "fio is not installed (./scripts/test installs it)")
    def test_io_fio_as_tierd(self) -> None:
        """bench/run io: fio runs at tierd's queue depth with registered buffers and files, and says so."""
        env_dir = tempfile.mkdtemp(prefix="tier-report-io-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, env_dir, True)
        p = subprocess.run([RUN, "io", "--dir", env_dir, "--total", "32M", "--tensor-size", "16M", "--repeat", "3"],
                           capture_output=True, text=True, check=False, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        line = json.loads(p.stdout)
        # bench/run writes [nvme] queue_depth = 64 and extent_size = 1M
        self.assertEqual((line["fio_bs"], line["fio_iodepth"]), ("1M", 64))
        self.assertIs(line["fio_fixedbufs"], True)
        self.assertIs(line["fio_registerfiles"], True)
        self.assertGreater(line["fio_read_gbps"], 0)
        # the ratios are paired: the median of each round's tierd / fio, not a ratio of medians
        for op in ("write", "read"):
            rounds = [t / f for t, f in zip(line[f"{op}_gbps_rounds"], line[f"fio_{op}_gbps_rounds"])]
            self.assertEqual(len(line[f"{op}_ratio_rounds"]), 3)
            for got, want in zip(line[f"{op}_ratio_rounds"], rounds):
                self.assertAlmostEqual(got, want, delta=1e-4 * want)
            self.assertAlmostEqual(line[f"{op}_ratio"], sorted(rounds)[1], delta=1e-4 * sorted(rounds)[1])

    def test_matrix_rows_checked(self) -> None:
        """bench/report.py's check of the matrix: a row that printed nothing fails, one that says why is skipped."""
        spec = importlib.util.spec_from_file_location("bench_report", os.path.join(SOURCE, "bench", "report.py"))
        report = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(report)
        synthetic = [c for c in report.MATRIX_CASES if c != "torch-lm"]
        lines = [{"case": c, "policy": p, "step_s": 1.0} for c in synthetic for p in report.MATRIX_POLICIES]
        self.assertEqual(len(synthetic), 18)
        missing, skipped = report.matrix_check(lines)
        self.assertEqual(missing, ["torch-lm/timeline", "torch-lm/lru", "torch-lm/ondemand"])
        self.assertEqual(skipped, {})
        missing, skipped = report.matrix_check(lines + [{"case": "torch-lm", "skipped": "no torch"}])
        self.assertEqual((missing, skipped), ([], {"torch-lm": "no torch"}))
        # --matrix-cases and --configs (passed after --) narrow what is expected
        argv = ["--matrix-cases", "L8-r1-j1,torch-lm", "--configs=timeline"]
        cases = report.option_value(argv, "--matrix-cases").split(",")
        policies = report.option_value(argv, "--configs").split(",")
        self.assertEqual(report.matrix_check(lines[:1], cases, policies), (["L8-r1-j1/timeline", "torch-lm/timeline"], {}))
        # a skipped row is shown in the summary, and is no failure
        res = fixture()
        res["failed"] = {}
        res["skipped"] = {"matrix torch-lm": "torch cannot be imported by /usr/bin/python3"}
        path = os.path.join(self.dir, "results.json")
        with open(path, "w") as f:
            json.dump(res, f)
        run_all("--from", path, "--no-plots", check_rc=0)
        with open(os.path.join(self.dir, "summary.md")) as f:
            self.assertIn("* **matrix torch-lm skipped:** torch cannot be imported by /usr/bin/python3", f.read())

    def test_matrix_torch_row_skipped(self) -> None:
        """bench/run timeline --matrix without torch prints the torch-lm row as skipped, with why."""
        fake = os.path.join(self.dir, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('no torch here (test)')\n")
        env_dir = tempfile.mkdtemp(prefix="tier-report-matrix-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, env_dir, True)
        md = os.path.join(self.dir, "matrix.md")
        env = dict(os.environ, PYTHONPATH=fake + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([RUN, "timeline", "--matrix", "--matrix-cases", "torch-lm", "--matrix-markdown", md,
                            "--dir", env_dir], capture_output=True, text=True, check=False, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        (line,) = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        self.assertEqual(line["case"], "torch-lm")
        self.assertIn("torch cannot be imported", line["skipped"])
        with open(md) as f:
            self.assertIn("torch-lm: skipped (torch cannot be imported", f.read())

    def load_bench(self, name: str):
        spec = importlib.util.spec_from_file_location(name, os.path.join(SOURCE, "bench", name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def test_torch_skip_is_no_failure(self) -> None:
        """bench/run all without torch: bench/run torch exits 77, recorded as skipped, and all exits 0."""
        fake = os.path.join(self.dir, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('no torch here (test)')\n")
        out = os.path.join(self.dir, "out")
        env = dict(os.environ, PYTHONPATH=fake + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([RUN, "all", "--kinds", "torch", "--no-plots", "--out", out, "--dir", self.dir],
                           capture_output=True, text=True, check=False, timeout=120, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        self.assertEqual(res["failed"], {})
        self.assertIn("status 77", res["skipped"]["torch"])
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("* **torch skipped:** bench/run torch exited with status 77", f.read())

    def test_churn_p99_nearest_rank(self) -> None:
        """bench_churn's p99 is the ceil(0.99 n)-th smallest, as bench-ipc's: of 1..100 ms, 99 ms, not the max."""
        churn = self.load_bench("bench_churn")
        fig = churn.figures([i / 1000 for i in range(100, 0, -1)])
        self.assertEqual((fig["samples"], fig["p99_ms"], fig["max_ms"]), (100, 99.0, 100.0))
        self.assertEqual(churn.figures([i / 1000 for i in range(1, 102)])["p99_ms"], 100.0)
        self.assertEqual(churn.figures([0.005])["p99_ms"], 5.0)

    def test_share_bytes_per_step_per_job(self) -> None:
        """bench_share: each job's NVMe bytes over its own steps, and their sum (not both over the fewer steps)."""
        share = self.load_bench("bench_share")
        jobs = {"big": {"steps": 10, "nvme_bytes": 1000}, "small": {"steps": 40, "nvme_bytes": 400}}
        self.assertEqual(share.nvme_per_step(jobs), 110)
        self.assertEqual((jobs["big"]["nvme_bytes_per_step"], jobs["small"]["nvme_bytes_per_step"]), (100, 10))
        jobs = {"big": {"steps": 0, "nvme_bytes": 0}, "small": {"steps": 3, "nvme_bytes": 30}}
        self.assertEqual(share.nvme_per_step(jobs), 10)
        self.assertIsNone(jobs["big"]["nvme_bytes_per_step"])


if __name__ == "__main__":
    tierd.main()
