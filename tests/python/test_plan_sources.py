#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tierctl plan's hardware from a running tierd, from `tierctl bench` results, and the precedence.

tierd here: emulated VRAM of 32M at 32M/s ([vram] bandwidth), a 64M host pool,
two NVMe targets at [nvme] bandwidth 400000000 B/s each; the status JSON has them
(tiers[].bandwidth) and `tierctl plan` takes them when no option or bench file does.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import tierd
from tierd import MiB

CONFIG = tierd.CONFIG.replace("target = @DIR@/t0.img:256M",
                              "target = @DIR@/t0.img:128M\ntarget = @DIR@/t1.img:128M\nbandwidth = 400000000")
BENCH = os.path.join(tierd.source_dir(), "tests", "unit", "data", "bench-fixture.json")
MODEL = ["--params", "13B", "--tflops", "100"]


def tierctl_path() -> str:
    return os.path.join(tierd.build_dir(), "client", "tierctl")


class TestPlanSources(tierd.DaemonTestCase):
    config = CONFIG

    def plan(self, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as cache:   # no bench results of the machine's user
            p = subprocess.run([tierctl_path(), "plan", *args], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "XDG_CACHE_HOME": cache})
        self.assertEqual(p.returncode, expect, f"tierctl plan {' '.join(args)}: {p.stdout!r} {p.stderr!r}")
        return p

    def test_status_bandwidth(self) -> None:
        p = subprocess.run([tierctl_path(), "--socket", self.socket, "status", "--json"], capture_output=True,
                           text=True, timeout=60, check=True)
        tiers = {t["tier"]: t for t in json.loads(p.stdout)["tiers"]}
        self.assertEqual(tiers["vram"]["bandwidth"], 32 * MiB)
        self.assertEqual(tiers["nvme"]["bandwidth"], 400000000)
        self.assertEqual(tiers["host"]["bandwidth"], 0)

    def test_from_tierd(self) -> None:
        d = json.loads(self.plan("--json", "--socket", self.socket, *MODEL).stdout)
        h, s = d["hardware"], d["sources"]
        self.assertEqual(h["vram_bytes"], 32 * MiB)
        self.assertEqual(h["host_bytes"], 64 * MiB)
        self.assertEqual(h["drives"], 2)
        self.assertAlmostEqual(h["drive_read_gbps"], 0.4)
        self.assertAlmostEqual(h["drive_write_gbps"], 0.4)
        self.assertAlmostEqual(h["link_gbps"], 32 * MiB / 1e9)
        self.assertTrue(h["link_shared"])       # emulated VRAM: one throttle for both directions
        for k in ("vram_bytes", "host_bytes", "drives", "drive_read_gbps", "drive_write_gbps", "link_gbps",
                  "link_shared"):
            self.assertEqual(s[k], "tierd", k)
        self.assertEqual(d["notes"], [])

    def test_precedence(self) -> None:
        # flag > bench results > tierd > default
        d = json.loads(self.plan("--json", "--socket", self.socket, "--bench", BENCH, "--vram", "16G",
                                 *MODEL).stdout)
        h, s = d["hardware"], d["sources"]
        self.assertEqual((h["vram_bytes"], s["vram_bytes"]), (16 << 30, "flag"))
        self.assertEqual((h["drive_read_gbps"], s["drive_read_gbps"]), (3.0, "bench:" + BENCH))
        self.assertEqual((h["drive_write_gbps"], s["drive_write_gbps"]), (1.0, "bench:" + BENCH))
        self.assertEqual((h["drives"], s["drives"]), (2, "tierd"))
        self.assertEqual(s["host_bytes"], "tierd")
        # --no-bench: tierd's drives figures; --no-tierd as well: nothing but options and defaults
        d = json.loads(self.plan("--json", "--socket", self.socket, "--bench", BENCH, "--no-bench",
                                 *MODEL).stdout)
        self.assertEqual(d["sources"]["drive_read_gbps"], "tierd")
        p = self.plan("--socket", self.socket, "--no-bench", "--no-tierd", *MODEL, expect=2)
        self.assertIn("--vram must be above 0", p.stderr)

    def test_empty_socket(self) -> None:
        """plan --socket "" is a usage error, as tierctl --socket "" is: libtier took "" as "the default", so a
        script's --socket "$UNSET" planned from $TIER_SOCKET's (or the system's) tierd, sources saying "tierd"."""
        with tempfile.TemporaryDirectory() as cache:
            p = subprocess.run([tierctl_path(), "plan", "--json", "--socket", "", "--vram", "16G", "--host-ram",
                                "64G", *MODEL], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "XDG_CACHE_HOME": cache, "TIER_SOCKET": self.socket})
        self.assertEqual(p.returncode, 2, p)     # it was 0, the drives and their speed from $TIER_SOCKET's tierd
        self.assertIn("tierctl plan: --socket needs a path, not an empty string", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_unreachable_tierd(self) -> None:
        d = json.loads(self.plan("--json", "--socket", "/nonexistent/tierd.sock", "--vram", "16G",
                                 "--host-ram", "64G", *MODEL).stdout)
        self.assertEqual(d["sources"]["link_gbps"], "default")
        self.assertTrue(any("no figures from tierd" in n for n in d["notes"]), d["notes"])



class TestPlanUnthrottledTierd(tierd.DaemonTestCase):
    """A tierd with one target and the default [nvme] bandwidth = 0 (unthrottled: no speed known)."""

    def test_drives_without_speed(self) -> None:
        """tierd's target count came without a speed, and `tierctl plan` failed (exit 2) with "with --drives 1,
        --drive-read and --drive-write must be above 0 GB/s", an option the user never gave.  Now no drives
        are planned from tierd, and a note says why and what to give."""
        p = TestPlanSources.plan(self, "--json", "--socket", self.socket, *MODEL)
        d = json.loads(p.stdout)
        self.assertEqual(d["hardware"]["drives"], 0)
        self.assertTrue(any("tierd has 1 NVMe target(s) but no speed" in n for n in d["notes"]), d["notes"])
        d = json.loads(TestPlanSources.plan(self, "--json", "--socket", self.socket, "--drive-read", "2",
                                            "--drive-write", "1", *MODEL).stdout)
        self.assertEqual((d["hardware"]["drives"], d["sources"]["drives"]), (1, "tierd"))


if __name__ == "__main__":
    tierd.main()
