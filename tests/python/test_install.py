#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""pip install ./client/python works offline into a venv, and the installed package imports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import tierd


class TestInstall(unittest.TestCase):
    def run_cmd(self, argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
        if p.returncode != 0:
            print(f"$ {' '.join(argv)}\n{p.stdout}{p.stderr}", file=sys.stderr)
        return p

    def test_pip_install_offline(self) -> None:
        for mod in ("venv", "ensurepip", "setuptools"):
            p = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True)
            if p.returncode != 0:
                self.skipTest(f"{sys.executable} lacks {mod} (python3-venv, python3-setuptools)")
        tmp = tempfile.mkdtemp(prefix="tier-pip.")
        self.addCleanup(shutil.rmtree, tmp, True)
        # a copy of the package, so that the build writes nothing into the source tree
        src = os.path.join(tmp, "src")
        shutil.copytree(os.path.join(tierd.source_dir(), "client", "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        venv = os.path.join(tmp, "venv")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "TIER_BUILD", "TIER_SOURCE", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
        env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", HOME=tmp)
        self.assertEqual(self.run_cmd([sys.executable, "-m", "venv", "--system-site-packages", venv], env=env).returncode, 0)
        py = os.path.join(venv, "bin", "python")
        p = self.run_cmd([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", src], env=env, cwd=tmp)
        self.assertEqual(p.returncode, 0, "pip install failed")

        code = (
            "import os, sys, tier\n"
            "assert tier.__file__.startswith(sys.prefix), tier.__file__\n"
            "assert os.path.exists(os.path.join(os.path.dirname(tier.__file__), 'py.typed'))\n"
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
            "import importlib.util as u\n"
            "mods = ['tier.torch'] + ['tier.torch.' + m for m in ('engine', 'layout', 'discovery', 'hooks',\n"
            "                                                     'tracer', 'optim', 'collective', 'placement',\n"
            "                                                     'clip', 'state')]\n"
            "for m in mods:\n"
            "    spec = u.find_spec(m)\n"
            "    assert spec and spec.origin.startswith(sys.prefix), (m, spec)\n"
            "print(tier.__version__, tier.library_path(), tier.strerror(-28))\n"
        )
        env_lib = dict(env, TIER_LIBTIER=os.environ["TIER_LIBTIER"])
        p = self.run_cmd([py, "-c", code], env=env_lib, cwd=tmp)
        self.assertEqual(p.returncode, 0)
        version, path, text = p.stdout.split(maxsplit=2)
        self.assertEqual(path, os.environ["TIER_LIBTIER"])
        self.assertEqual(text.strip(), "No space left on device")
        p = self.run_cmd([py, "-m", "pip", "show", "tier"], env=env, cwd=tmp)
        self.assertIn(f"Version: {version}", p.stdout)

        # installed, outside any checkout and without the variables: the system's libtier.so.1 or a clear error
        p = subprocess.run([py, "-c", "import tier; print(tier.library_path())"], env=env, cwd=tmp,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            self.assertIn("TierError", p.stderr)
            self.assertIn("$TIER_LIBTIER and $TIER_BUILD (not set)", p.stderr)
            self.assertIn("libtier.so.1", p.stderr)
            self.assertNotIn("not built", p.stderr)


class TestInstallDocs(unittest.TestCase):
    """The install steps of README.md, client/python/README.md and tierd(8) work as written."""

    def read(self, *path: str) -> str:
        with open(os.path.join(tierd.source_dir(), *path)) as f:
            return f.read()

    def test_build_directory_of_its_own(self) -> None:
        # "meson setup build --prefix=/usr" where ./scripts/demo had set up ./build (for /usr/local)
        # changed nothing ("Directory already configured", status 0): the install went to /usr/local
        demo = re.search(r"^build=\$TIER_ROOT/(\S+)$", self.read("scripts", "demo"), re.M)
        self.assertIsNotNone(demo, "scripts/demo: no build=$TIER_ROOT/DIR line")
        install = re.search(r"### Install\n\n```sh\n(.*?)```", self.read("README.md"), re.S)
        self.assertIsNotNone(install, "README.md: no ### Install section with a sh block")
        for where, text in (("README.md", install.group(1)), ("man/tierd.8.scd", self.read("man", "tierd.8.scd"))):
            setup = re.findall(r"meson setup (\S+) --prefix=/usr", text)
            self.assertEqual(len(setup), 1, f"{where}: one 'meson setup DIR --prefix=/usr'")
            self.assertNotEqual(setup[0], demo.group(1), f"{where}: installs from the build directory of scripts/demo")
            self.assertIn(f"ninja -C {setup[0]} install", text, where)

    def test_demo_state_directory(self) -> None:
        """scripts/demo makes ./run, tierd's state directory, as tierd takes it whatever the caller's umask
        (0750), and refuses one left there that another user can write, saying how to mend it, before it
        writes anything into it (build.log, tierd.conf): tierd would refuse it only after the build."""
        demo = self.read("scripts", "demo")
        self.assertIn('make_state_dir "$run_dir"', demo)
        self.assertNotIn('mkdir -p "$run_dir"', demo)
        self.assertLess(demo.index('make_state_dir "$run_dir"'), demo.index('"$run_dir/build.log"'))
        tmp = tempfile.mkdtemp(prefix="tier-demo.", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, tmp, True)
        lib = os.path.join(tierd.source_dir(), "scripts", "lib.sh")

        def make(d: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["bash", "-c", 'umask 0; source "$1"; make_state_dir "$2"', "bash", lib, d],
                                  capture_output=True, text=True, timeout=60)

        run = os.path.join(tmp, "run")
        p = make(run)                                           # made: 0750 under umask 0
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(os.stat(run).st_mode & 0o7777, 0o750)
        self.assertEqual(make(run).returncode, 0)               # and taken again
        for mode, says in ((0o777, "chmod o-w"), (0o1777, "chmod o-w")):
            os.chmod(run, mode)
            p = make(run)
            self.assertEqual(p.returncode, 1, oct(mode))
            self.assertIn(says, p.stderr)
            self.assertEqual(os.stat(run).st_mode & 0o7777, mode)  # left as it was: the user decides
        if os.geteuid() == 0:                                   # another user's: refused; root's own group: taken
            os.chmod(run, 0o750)
            os.chown(run, 65534, 0)
            p = make(run)
            self.assertEqual(p.returncode, 1)
            self.assertIn("belongs to uid 65534", p.stderr)
            os.chown(run, 0, 0)
            os.chmod(run, 0o770)
            self.assertEqual(make(run).returncode, 0, p.stderr)
            os.chown(run, 0, 65534)
            p = make(run)
            self.assertEqual(p.returncode, 1)
            self.assertIn("chmod g-w", p.stderr)
        target = os.path.join(tmp, "file")
        open(target, "w").close()
        p = make(target)
        self.assertEqual(p.returncode, 1)
        self.assertIn("not a directory", p.stderr)

    def test_pip_into_a_venv(self) -> None:
        # Debian 12's python3 refuses "pip install" outside a venv (PEP 668): the steps make one that sees
        # Debian's numpy and torch and run its pip, as test_pip_install_offline does
        for path in (("README.md",), ("client", "python", "README.md")):
            text = self.read(*path)
            where = os.path.join(*path)
            outside = re.findall(r"(?<![\w/.-])pip3? install [-./\w]", text)
            self.assertEqual(outside, [], f"{where}: a pip install outside a venv")
            venv = re.search(r"python3 -m venv --system-site-packages (\S+)", text)
            self.assertIsNotNone(venv, f"{where}: no 'python3 -m venv --system-site-packages DIR'")
            self.assertIn(f"{venv.group(1)}/bin/pip install ./client/python", text, where)


if __name__ == "__main__":
    tierd.main()
