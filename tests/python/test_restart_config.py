#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A restart with a changed tierd.conf, as an operator makes one: what the NVMe index finds, what is refused."""

from __future__ import annotations

import errno
import os
import subprocess
import unittest

import tierd
from tierd import MiB

import tier


class TestRestartConfig(unittest.TestCase):
    config = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 300")  # the job waits for the client

    def setUp(self) -> None:
        why = tierd.can_lock_memory(tierd.HOST_CAPACITY)
        if why:
            self.skipTest(why)

    def test_extent_size_changed_refused(self) -> None:
        """A start whose [nvme] extent_size is not the one the NVMe index was written with set the index
        aside (".corrupt"): every tensor on NVMe was gone, after a warning.  Now it is refused (exit status
        6) and changes nothing: with the size put back, the next start finds the tensors."""
        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        d.start()
        with tier.Client("extents", socket=d.socket) as c:
            t = c.create("t", MiB)
            with t.pin(tier.HOST, tier.WRITE) as g:
                g.memoryview()[0:4] = b"kept"
            t.evict(tier.NVME)
        self.assertEqual(d.stop(), 0)
        index = sorted(f for f in os.listdir(d.dir) if f.startswith("nvme-index"))
        with open(d.config, "w") as f:
            f.write(self.config.replace("extent_size = 1M", "extent_size = 4M").replace("@DIR@", d.dir))
        # --check-config refuses it as the start does (it passed: the start was the first to say), reading only
        tierd_bin = os.path.join(tierd.build_dir(), "daemon", "tierd")
        p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                            "--log-target", "stderr"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 6, p.stderr)
        self.assertIn("was written with [nvme] extent_size = 1M; it is 4M now. Nothing was changed. Set "
                      "extent_size = 1M again", p.stderr)
        self.assertEqual(sorted(f for f in os.listdir(d.dir) if f.startswith("nvme-index")), index)
        mark = len(d.log_text())
        with self.assertRaisesRegex(RuntimeError, r"exited \(status 6\)"):
            d.start()
        self.assertIn("was written with [nvme] extent_size = 1M; it is 4M now. Nothing was changed. Set "
                      "extent_size = 1M again", d.log_text()[mark:])
        self.assertEqual(sorted(f for f in os.listdir(d.dir) if f.startswith("nvme-index")), index)
        with open(d.config, "w") as f:
            f.write(self.config.replace("@DIR@", d.dir))
        p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                            "--log-target", "stderr"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        d.start()
        with tier.Client("extents", socket=d.socket) as c, c.open("t").pin(tier.HOST, tier.READ) as g:
            self.assertEqual(bytes(g.memoryview()[0:4]), b"kept")

    def test_check_config_leaves_a_damaged_index(self) -> None:
        """--check-config reads the NVMe index but changes nothing: a damaged index file, which a start
        sets aside, stays where it is, and it says that a start would move it (it said only "not read")."""
        d = tierd.Tierd(self.config)
        self.addCleanup(d.cleanup)
        os.makedirs(d.dir, exist_ok=True)
        with open(d.config, "w") as f:
            f.write(self.config.replace("@DIR@", d.dir))
        bad = os.path.join(d.dir, "nvme-index.0")
        with open(bad, "wb") as f:
            f.write(b"not an index" * 100)
        tierd_bin = os.path.join(tierd.build_dir(), "daemon", "tierd")
        p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                            "--log-target", "stderr"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(f"NVMe index {bad}: a start sets it aside", p.stderr)
        self.assertEqual(sorted(f for f in os.listdir(d.dir) if f.startswith("nvme-index")), ["nvme-index.0"])

    def test_lost_with_its_target_says_so(self) -> None:
        """A tensor lost because its extents lie on a target no longer configured: its reads fail with
        ENODATA saying so.  They said "its newest data was in memory, not on NVMe, when tierd stopped"
        whatever the reason (here the data was on NVMe, and the operator took its target away)."""
        two = self.config.replace("target = @DIR@/t0.img:256M", "target = @DIR@/t0.img:128M\ntarget = @DIR@/t1.img:128M")
        d = tierd.Tierd(two)
        self.addCleanup(d.cleanup)
        d.start()
        with tier.Client("gone", socket=d.socket) as c:
            t = c.create("t", 2 * MiB)             # two extents: one on each target
            with t.pin(tier.HOST, tier.WRITE) as g:
                g.memoryview()[0:4] = b"data"
            t.evict(tier.NVME)
        self.assertEqual(d.stop(), 0)
        with open(d.config, "w") as f:
            f.write(two.replace("target = @DIR@/t1.img:128M", "").replace("@DIR@", d.dir))
        d.start()
        with tier.Client("gone", socket=d.socket) as c:
            with self.assertRaises(tier.TierError) as cm:
                c.open("t").pin(tier.HOST, tier.READ)
        self.assertEqual(cm.exception.errno, errno.ENODATA)
        self.assertIn("is lost: its extents lie on an NVMe target that is no longer configured", str(cm.exception))
        self.assertNotIn("when tierd stopped", str(cm.exception))


if __name__ == "__main__":
    tierd.main()
