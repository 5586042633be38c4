#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench/torch_plan.py: the plan tier.torch derives for ByteLM, as bench-timeline --plan reads it.

No tierd: the script traces tier.torch's own engine against a stand-in
client.  The expected structure is tier.torch's documented one: per block
p, g, m, v (float32 model: no w), a forward phase per block in call order,
then per block, last first, its backward (p VRAM read, g VRAM write)
followed at once by its optimizer phase (p host read-write, g host read,
m and v host read-write).  Then bench-timeline --plan FILE --capbound
reads the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

import tierd

try:
    import torch
except ImportError:  # pragma: no cover - the suite skips without torch
    torch = None

SCRIPT = os.path.join(tierd.source_dir(), "bench", "torch_plan.py")


@unittest.skipIf(torch is None, "no torch (apt-get install python3-torch)")
class TorchPlan(unittest.TestCase):
    def plan(self, *args: str) -> dict:
        out = subprocess.run([sys.executable, SCRIPT, *args], check=True, stdout=subprocess.PIPE, text=True,
                             timeout=120).stdout
        return json.loads(out)

    def test_structure(self) -> None:
        p = self.plan("--dim", "64", "--layers", "2", "--heads", "2", "--context", "16", "--batch", "2")
        # blocks: tok, pos, 2 transformer blocks, ln, head
        self.assertEqual(len(p["tensors"]), 6 * 4)
        names = [t["name"] for t in p["tensors"]]
        self.assertEqual(names[:4], ["torch.0.0.p", "torch.0.0.g", "torch.0.0.m", "torch.0.0.v"])
        self.assertEqual(p["tensors"][0]["size"], 256 * 64 * 4)      # tok: 256 x dim float32
        kinds = "".join(ph["kind"] for ph in p["phases"])
        self.assertEqual(kinds, "ffffff" + "bo" * 6)
        for k, ph in enumerate(p["phases"]):
            acc = {(names[t].rsplit(".", 1)[1], tier, mode) for t, tier, mode in ph["access"]}
            blocks = {names[t].split(".")[2] for t, _, _ in ph["access"]}
            self.assertEqual(len(blocks), 1, f"phase {k} spans blocks {blocks}")
            if ph["kind"] == "f":
                self.assertEqual(acc, {("p", "vram", "r")})
                self.assertEqual(blocks, {str(k)})
            elif ph["kind"] == "b":
                self.assertEqual(acc, {("p", "vram", "r"), ("g", "vram", "w")})
                # backward runs the head first
                self.assertEqual(blocks, {str(5 - (k - 6) // 2)})
            else:
                self.assertEqual(acc, {("p", "host", "rw"), ("g", "host", "r"), ("m", "host", "rw"),
                                       ("v", "host", "rw")})

    def test_placement_write_downs(self) -> None:
        args = ("--dim", "64", "--layers", "2", "--heads", "2", "--context", "16", "--batch", "2")
        a = self.plan(*args)
        self.assertFalse(any("write_down" in ph for ph in a["phases"]))
        for placement, kinds in (("B", {"m", "v"}), ("C", {"m", "v", "p"})):
            p = self.plan(*args, "--placement", placement)
            names = [t["name"] for t in p["tensors"]]
            # the same accesses; tier.torch writes down each block's state on entering the phase after
            # its optimizer phase (the last block's, at the step's end: before the next step's first)
            self.assertEqual([ph["access"] for ph in p["phases"]], [ph["access"] for ph in a["phases"]])
            downs = {k: ph["write_down"] for k, ph in enumerate(p["phases"]) if "write_down" in ph}
            expect = {}
            for k, ph in enumerate(p["phases"]):
                if ph["kind"] == "o":
                    block = names[ph["access"][0][0]].split(".")[2]
                    nxt = (k + 1) % len(p["phases"])
                    # but what the phase entered then pins itself (the first block's p, at the step's end)
                    pinned = {names[t] for t, _, _ in p["phases"][nxt]["access"]}
                    expect[nxt] = {f"torch.0.{block}.{x}" for x in kinds} - pinned
            self.assertEqual({k: {names[t] for t in v} for k, v in downs.items()}, expect, placement)

    def test_capbound_reads_it(self) -> None:
        exe = os.path.join(os.environ["TIER_BUILD"], "bench", "bench-timeline")
        # built with the tests (tests/ exists only where bench/ is built): missing, the build is incomplete
        self.assertTrue(os.access(exe, os.X_OK), f"no {exe}: build it first (ninja -C {os.environ['TIER_BUILD']})")
        p = self.plan("--dim", "64", "--layers", "2", "--heads", "2", "--context", "16", "--batch", "2")
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"torch-plan-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(p, f)
        try:
            big = max(t["size"] for t in p["tensors"])
            total = sum(t["size"] for t in p["tensors"])
            # everything fits: nothing moves to or from NVMe in steady state
            out = subprocess.run([exe, "--plan", path, "--capbound", f"{total},{total}"], check=True,
                                 stdout=subprocess.PIPE, text=True, timeout=60).stdout
            cb = json.loads(out)
            self.assertEqual(cb["tensors"], len(p["tensors"]))
            self.assertEqual(cb["min_nvme_read_bytes"] + cb["min_nvme_write_bytes"], 0)
            # p up and g down once per block and step, at least
            self.assertGreaterEqual(cb["min_link_bytes"], 2 * sum(t["size"] for t in p["tensors"]
                                                                  if t["name"].endswith(".p")))
            # host for one optimizer phase only: NVMe is in play
            out = subprocess.run([exe, "--plan", path, "--capbound", f"{4 * big},{4 * big}"], check=True,
                                 stdout=subprocess.PIPE, text=True, timeout=60).stdout
            self.assertGreater(json.loads(out)["min_nvme_read_bytes"], 0)
            # with bandwidths: a timed schedule of the model, never faster than the time-aware bound
            out = subprocess.run([exe, "--plan", path, "--nvme-bw", "400M", "--link-bw", "1G", "--capbound",
                                  f"{4 * big},{4 * big}"], check=True, stdout=subprocess.PIPE, text=True,
                                 timeout=120).stdout
            cb = json.loads(out)
            for key in ("planned_s", "planned_held2_s"):
                self.assertGreaterEqual(cb[key], cb["time_bound_s"] - 1e-9, key)
            # write-downs (placement C) are tierctl plan's to replay, not bench-timeline's: refused
            with open(path, "w") as f:
                json.dump(self.plan("--dim", "64", "--layers", "2", "--heads", "2", "--context", "16", "--batch",
                                    "2", "--placement", "C"), f)
            r = subprocess.run([exe, "--plan", path, "--capbound", "1M,1M"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn("write-downs", r.stderr)
            # a broken file is refused with a message and exit status 2
            with open(path, "w") as f:
                f.write('{"tensors": [], "phases": []}')
            r = subprocess.run([exe, "--plan", path, "--capbound", "1M,1M"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn("non-empty", r.stderr)
        finally:
            os.unlink(path)


if __name__ == "__main__":
    tierd.main()
