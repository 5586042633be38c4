#!/usr/bin/python3
# SPDX-License-Identifier: MIT
""".ci/run, run for real in a copy of the scripts over stand-ins for what it starts.

No build, no Debian root: a stand-in scripts/fresh-check, and PATH stand-ins for meson, ninja and
dpkg-query.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import unittest

import tierd


def write_exe(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


class Tree:
    """A temporary checkout holding copies of some of the scripts (the rest: stand-ins)."""

    def __init__(self, case: unittest.TestCase, *scripts: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="tier-scripts.", dir="/var/tmp")
        case.addCleanup(shutil.rmtree, self.dir, True)
        for s in scripts:
            os.makedirs(os.path.dirname(self.path(s)), exist_ok=True)
            shutil.copy2(os.path.join(tierd.source_dir(), s), self.path(s))
        self.bin = self.path("bin")
        write_exe(os.path.join(self.bin, "meson"), "#!/bin/sh\nexit 0\n")
        write_exe(os.path.join(self.bin, "ninja"), "#!/bin/sh\nexit 0\n")
        write_exe(os.path.join(self.bin, "dpkg-query"), "#!/bin/sh\nprintf 'install ok installed'\n")
        # (without the ASan pass's preload: bash, flock and the rest are not ours)
        self.env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
        self.env["PATH"] = f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin"

    def path(self, *p: str) -> str:
        return os.path.join(self.dir, *p)


class TestCiRun(unittest.TestCase):
    """.ci/run takes no arguments: --help says what it runs, anything else is refused before it runs
    anything (it went on with what CI runs, a Debian bootstrap and every test pass, whatever it was given)."""

    def setUp(self) -> None:
        self.t = Tree(self, ".ci/run", "scripts/lib.sh")
        self.ran = self.t.path("fresh-check-ran")
        write_exe(self.t.path("scripts", "fresh-check"), f"#!/bin/sh\ntouch '{self.ran}'\necho '0 passed, 0 failed'\n")

    def ci_run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.t.path(".ci", "run"), *args], env=self.t.env, cwd="/",
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)

    def test_help(self) -> None:
        for arg in ("--help", "-h"):
            p = self.ci_run(arg)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("usage: .ci/run", p.stdout)
            self.assertIn("scripts/fresh-check", p.stdout)
            self.assertFalse(os.path.exists(self.ran), arg)

    def test_unknown_arguments_refused(self) -> None:
        for arg in ("--bogus", "HEAD", "--keep"):
            p = self.ci_run(arg)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            self.assertIn(f".ci/run: error: unknown argument '{arg}'", p.stderr)
            self.assertIn("scripts/fresh-check", p.stderr)
            self.assertFalse(os.path.exists(self.ran), arg)


if __name__ == "__main__":
    tierd.main()
