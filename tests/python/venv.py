# SPDX-License-Identifier: MIT
"""The test-only Python packages Debian 12 lacks (transformers), from a venv scripts/test makes.

scripts/test makes ``.venv-tests`` in the checkout (``python3 -m venv
--system-site-packages``, so Debian's torch, numpy and torchvision stay
the ones used) and installs ``tests/python/requirements-models.txt`` into
it from PyPI; $TIER_TEST_VENV names it.  :func:`enter` re-executes the
calling test module with that venv's interpreter when it is not running in
it already.  Without a venv the modules that need one skip, unless
$TIER_TEST_REQUIRE_VENV is set (scripts/test sets it): then they fail.
"""

from __future__ import annotations

import os
import sys


def path() -> str:
    """The venv's directory: $TIER_TEST_VENV, else .venv-tests in the source tree."""
    env = os.environ.get("TIER_TEST_VENV")
    if env:
        return env
    src = os.environ.get("TIER_SOURCE") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(src, ".venv-tests")


def enter() -> str | None:
    """Run in the venv: re-exec this interpreter's script with the venv's python (it never returns
    then), or return None when already in it; the reason there is none, if there is none."""
    venv = path()
    py = os.path.join(venv, "bin", "python3")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return None
    if not os.access(py, os.X_OK):
        why = f"no test venv at {venv} (./scripts/test makes it: python3 -m venv --system-site-packages " \
              f"{venv} && {venv}/bin/pip install -r tests/python/requirements-models.txt)"
        if os.environ.get("TIER_TEST_REQUIRE_VENV"):
            raise SystemExit(f"FAIL: {why}")
        return why
    os.execv(py, [py, os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    return None  # pragma: no cover
