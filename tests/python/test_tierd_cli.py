#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tierd's command line as an operator types it (no daemon starts): --help, --version, usage errors (2)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import unittest

import tierd


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.path.join(tierd.build_dir(), "daemon", "tierd"), *args], capture_output=True,
                          text=True, timeout=30, check=False)


class TestTierdCli(unittest.TestCase):
    def test_help_and_version(self) -> None:
        p = run("--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("Usage: tierd [OPTIONS]"), p.stdout)
        for opt in ("--config", "--socket", "--state-dir", "--check-config", "--log-target", "--log-level"):
            self.assertIn(opt, p.stdout)
        p = run("--version")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"^tierd \d+\.\d+\.\d+\n$")

    def test_usage_errors(self) -> None:
        """Exit 2 with what is wrong, before any file is read: an empty path ("$UNSET") names none (it was
        ': No such file or directory', exit 6, for --config)."""
        cases = [
            (["--bogus"], "Try 'tierd --help'"),
            (["extra"], "unexpected argument 'extra'"),
            (["--log-level", "loud"], "invalid --log-level 'loud'"),
            (["--log-target", "syslog"], "invalid --log-target 'syslog'"),
            (["-c", "", "--check-config"], "--config is empty: give a path"),
            (["--config=", "--check-config"], "--config is empty: give a path"),
            (["-s", "", "--check-config"], "--socket is empty: give a path"),
            (["-S", "", "--check-config"], "--state-dir is empty: give a path"),
        ]
        for args, msg in cases:
            with self.subTest(args=args):
                p = run(*args)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(msg, p.stderr)
                self.assertEqual(p.stdout, "")

    def test_key_twice_refused(self) -> None:
        """A key set twice in one file (here in a section opened again) refuses the start, exit 6 as any bad
        configuration, naming the key, its section and both lines: the last line used to win silently."""
        with tempfile.TemporaryDirectory() as tmp:
            conf = os.path.join(tmp, "tierd.conf")
            with open(conf, "w") as f:
                f.write(f"[daemon]\nstate_dir = {tmp}\n[host]\ncapacity = 64M\njob_limit = 8M\n\n"
                        "[host]\ncapacity = 128M\n")
            p = run("--check-config", "-c", conf)
            self.assertEqual(p.returncode, 6, p.stderr)
            self.assertIn(f"{conf}:8: [host] capacity: set a second time in this file (first at line 4)", p.stderr)
            self.assertEqual(p.stdout, "")


if __name__ == "__main__":
    unittest.main()
