#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The tier package without a daemon: prototypes, loading, constants, errors, versions."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import tierd

import tier
from tier import _lib


def header_functions(path: str) -> set[str]:
    """Every function tier.h declares (comments dropped)."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return set(re.findall(r"\b(tier_\w+)\s*\(", text))


class TestPrototypes(unittest.TestCase):
    def test_every_function_of_tier_h(self) -> None:
        declared = header_functions(os.path.join(tierd.source_dir(), "client", "tier.h"))
        self.assertGreater(len(declared), 40)
        self.assertEqual(declared - set(_lib.PROTOTYPES), set(), "tier.h functions without a prototype")
        self.assertEqual(set(_lib.PROTOTYPES) - declared, set(), "prototypes of functions tier.h lacks")
        lib = _lib.lib()
        for name, (restype, argtypes) in _lib.PROTOTYPES.items():
            fn = getattr(lib, name)
            self.assertIs(fn.restype, restype, name)
            self.assertEqual(list(fn.argtypes), list(argtypes), name)

    def test_structures(self) -> None:
        # every ctypes structure has the C structure's size and field offsets, as the C compiler lays them out
        structs = {
            "tier_grant": _lib.TierGrant,
            "tier_stat": _lib.TierStat,
            "tier_quota": _lib.TierQuota,
            "tier_quota_total": _lib.TierQuotaTotal,
            "tier_commit": _lib.TierCommit,
        }
        lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <tier.h>", "int main(void) {"]
        for cname, cls in structs.items():
            lines.append(f'printf("{cname} %zu\\n", sizeof(struct {cname}));')
            for fname, *_ in cls._fields_:
                cf = fname.rstrip("_")
                lines.append(f'printf("{cname}.{fname} %zu\\n", offsetof(struct {cname}, {cf}));')
        lines += ["return 0;", "}"]
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "probe.c"), os.path.join(d, "probe")
            with open(src, "w") as f:
                f.write("\n".join(lines) + "\n")
            inc = os.path.join(tierd.source_dir(), "client")
            subprocess.run(["cc", "-std=c17", "-I", inc, "-o", exe, src], check=True)
            out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        c = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
        for cname, cls in structs.items():
            self.assertEqual(ctypes.sizeof(cls), c[cname], f"sizeof(struct {cname})")
            for fname, *_ in cls._fields_:
                self.assertEqual(getattr(cls, fname).offset, c[f"{cname}.{fname}"], f"struct {cname}.{fname}")

    def test_constants_match_header(self) -> None:
        with open(os.path.join(tierd.source_dir(), "client", "tier.h")) as f:
            h = f.read()
        consts = dict(re.findall(r"\b(TIER_[A-Z_]+)\s*=\s*(\d+)", h))
        self.assertEqual(int(consts["TIER_VRAM"]), tier.VRAM)
        self.assertEqual(int(consts["TIER_HOST"]), tier.HOST)
        self.assertEqual(int(consts["TIER_NVME"]), tier.NVME)
        self.assertEqual(int(consts["TIER_READ"]), tier.READ)
        self.assertEqual(int(consts["TIER_WRITE"]), tier.WRITE)
        self.assertEqual(int(consts["TIER_READ_WRITE"]), tier.READ_WRITE)
        self.assertEqual(int(consts["TIER_LINKS"]), _lib.TIER_LINKS)
        self.assertEqual(int(consts["TIER_LEVEL_MAX"]), _lib.TIER_LEVEL_MAX)
        slots = dict(re.findall(r"#define (TIER_\w+_SLOTS) (\d+)", h))
        self.assertEqual(int(slots["TIER_LEVEL_SLOTS"]), _lib.TIER_LEVEL_SLOTS)
        self.assertEqual(int(slots["TIER_LINK_SLOTS"]), _lib.TIER_LINK_SLOTS)
        self.assertEqual(int(consts["TIER_STATUS_JSON"]), _lib.TIER_STATUS_JSON)
        m = re.search(r"#define TIER_PROTOCOL_VERSION (\d+)", h)
        assert m
        self.assertEqual(int(m.group(1)), _lib.TIER_PROTOCOL_VERSION)


    def test_readme_example_compiles(self) -> None:
        # README's C quick example compiles and links against tier.h and the built libtier, warning-free
        with open(os.path.join(tierd.source_dir(), "README.md")) as f:
            blocks = re.findall(r"```c\n(.*?)```", f.read(), flags=re.S)
        mains = [b for b in blocks if "int main(void)" in b]
        self.assertEqual(len(mains), 1, "README.md has one complete C example")
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "ex.c")
            with open(src, "w") as f:
                f.write(mains[0])
            lib = os.path.join(tierd.build_dir(), "client")
            p = subprocess.run(
                ["cc", "-std=c17", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
                 "-I", os.path.join(tierd.source_dir(), "client"), "-o", os.path.join(d, "ex"), src,
                 "-L", lib, "-ltier"],
                capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)


    def _compile_header(self, cmd: list[str], suffix: str) -> subprocess.CompletedProcess[str]:
        # a unit that includes tier.h and touches each anonymous member, checked only (-fsyntax-only)
        src = ("#include <tier.h>\n"
               "int use(const struct tier_tensor_info *i);\n"
               "int use(const struct tier_tensor_info *i) { return i->state + (i->lost_why != 0); }\n")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "h" + suffix)
            with open(path, "w") as f:
                f.write(src)
            return subprocess.run(cmd + ["-fsyntax-only", "-Wall", "-Wextra", "-pedantic-errors", "-Werror",
                                         "-I", os.path.join(tierd.source_dir(), "client"), path],
                                  capture_output=True, text=True)

    def test_header_strict_c(self) -> None:
        # tier.h is clean ISO C from C99 on, with every warning and -pedantic-errors
        for std in ("c99", "c11", "c17"):
            with self.subTest(std=std):
                p = self._compile_header(["cc", "-std=" + std], ".c")
                self.assertEqual(p.returncode, 0, p.stderr)

    def test_header_cxx(self) -> None:
        # tier.h is usable from C++ (extern "C"), -pedantic-errors included
        cxx = shutil.which("g++") or shutil.which("c++")
        if not cxx:
            self.skipTest("no C++ compiler")
        for std in ("c++11", "c++17"):
            with self.subTest(std=std):
                p = self._compile_header([cxx, "-std=" + std], ".cc")
                self.assertEqual(p.returncode, 0, p.stderr)


class TestNames(unittest.TestCase):
    def test_levels_and_links(self) -> None:
        self.assertEqual([str(x) for x in tier.Level], ["vram", "host", "nvme"])
        self.assertEqual(f"{tier.NVME}", "nvme")
        self.assertEqual(tier.level_name("HOST"), "host")
        self.assertEqual(tier.level_name(0), "vram")
        self.assertEqual(tier.LINKS, ("nvme->host", "host->nvme", "host->vram", "vram->host"))
        self.assertEqual(tier.link_name(2), "host->vram")
        with self.assertRaises(ValueError):
            tier.level_name("disk")
        with self.assertRaises(ValueError):
            tier.level_name(3)
        with self.assertRaises(TypeError):
            tier.level_name(True)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            tier.level_name(1.0)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            tier.link_name(4)
        self.assertEqual(tier.READ | tier.WRITE, tier.READ_WRITE)

    def test_strerror(self) -> None:
        self.assertEqual(tier.strerror(-errno.ENOSPC), os.strerror(errno.ENOSPC))
        self.assertEqual(tier.strerror(errno.EDQUOT), os.strerror(errno.EDQUOT))

    def test_names_without_control_characters(self) -> None:
        # C0, DEL and C1 (U+009B is a terminal's CSI) are refused before connecting; U+00A0 is text
        for name in ("a\tb", "a\x7fb", "evil\x9b31m", "nel\x85"):
            with self.subTest(name=name), self.assertRaises(ValueError) as cm:
                tier.Client(name, socket="/nonexistent/tierd.sock")
            self.assertIn("control characters", str(cm.exception))
        with self.assertRaises(tier.TierError) as cm:
            tier.Client("caf\xe9\xa0", socket="/nonexistent/tierd.sock")
        self.assertEqual(cm.exception.errno, errno.ENOENT)

    def test_names_without_bidi_characters(self) -> None:
        """The bidirectional format characters (Unicode's Bidi_Control) are refused before connecting, named by
        their code point, with the escaped text (as util/escape.c writes it) an older tierd's job was restored
        under: printed raw, "abc\\u202egpj.exe" reads "abcexe.jpg".  They were sent to tierd.  Their neighbours
        (ZWJ U+200D) are text."""
        for ch in "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069":
            with self.subTest(ch=f"U+{ord(ch):04X}"), self.assertRaises(ValueError) as cm:
                tier.Client(f"abc{ch}gpj.exe", socket="/nonexistent/tierd.sock")
            self.assertEqual(str(cm.exception),
                             f"job name contains the bidirectional format character U+{ord(ch):04X}; a job an older "
                             f"tierd made under such a name was restored under its escaped text, 'abc\\u{ord(ch):04x}"
                             "gpj.exe' (tierctl jobs lists the name it was restored under, if any)")
        with self.assertRaises(ValueError) as cm:
            tier._base._name("w\u2069\x01", "tensor")
        self.assertIn("tensor name contains control characters; ", str(cm.exception))  # first, as libtier says it
        self.assertIn(", 'w\\u2069\\u0001' (tierctl tensors JOB lists", str(cm.exception))
        with self.assertRaises(tier.TierError) as cm:
            tier.Client("a\u200db\u2010\u202f\u206a", socket="/nonexistent/tierd.sock")
        self.assertEqual(cm.exception.errno, errno.ENOENT)

    def test_names_refusal_says_escaped_text(self) -> None:
        """A refused name says the escaped text (as tierd and libtier do: util/escape.c) a job or tensor an older
        tierd made under it was restored under; it said the name's Python repr ('evil\x9b31m'), which is no
        name tierd has.  One too long to say is not said, nor cut."""
        restored = "its escaped text, 'evil\\u009b31m' (tierctl jobs lists the name it was restored under, if any)"
        with self.assertRaises(ValueError) as cm:
            tier.Client("evil\x9b31m", socket="/nonexistent/tierd.sock")
        self.assertEqual(str(cm.exception), "job name contains control characters; a job an older tierd made under "
                         f"such a name was restored under {restored}")
        with self.assertRaises(ValueError) as cm:  # the byte 0xff, through surrogateescape
            tier.Client("a\udcffb\x01", socket="/nonexistent/tierd.sock")
        self.assertIn("job name contains control characters; ", str(cm.exception))  # first, as libtier says it
        self.assertIn(", 'a\\xffb\\u0001' (tierctl jobs lists", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            tier.Client("a\udcff\u20acb", socket="/nonexistent/tierd.sock")
        self.assertIn("job name is not valid UTF-8; a job an older tierd made under such a name was restored under "
                      "its escaped text, 'a\\xff\u20acb' (tierctl jobs lists", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            tier._base._name("w\x1b[2J", "tensor")
        self.assertIn("a tensor an older tierd made under such a name was restored under its escaped text, "
                      "'w\\u001b[2J' (tierctl tensors JOB lists", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            tier.Client("\x01" * 100, socket="/nonexistent/tierd.sock")
        self.assertIn("its escaped text, too long to say here (tierctl jobs", str(cm.exception))
        self.assertNotIn("\\u0001", str(cm.exception))


class TestErrors(unittest.TestCase):
    def test_classes(self) -> None:
        cases = {
            errno.ENOSPC: tier.NoSpaceError,
            errno.EDQUOT: tier.QuotaError,
            errno.EFBIG: tier.TooLargeError,
            errno.EAGAIN: tier.RetryLaterError,
            errno.ENOENT: tier.NotFoundError,
            errno.EEXIST: tier.ExistsError,
            errno.EPERM: tier.PermissionDeniedError,
            errno.EACCES: tier.PermissionDeniedError,
            errno.EBUSY: tier.BusyError,
            errno.ESHUTDOWN: tier.ShutdownError,
            errno.ECONNRESET: tier.ShutdownError,
            errno.ENOTCONN: tier.ShutdownError,
            errno.EPIPE: tier.ShutdownError,
            errno.EBADMSG: tier.ShutdownError,       # the connection is unusable (libtier(3))
            errno.ECONNREFUSED: tier.ShutdownError,  # no tierd listens
            errno.ENODATA: tier.LostError,
            errno.ERESTART: tier.RestartedError,
            errno.ESTALE: tier.NotFoundError,
            errno.EPROTO: tier.TierError,
            errno.ETIMEDOUT: tier.TimedOutError,
            errno.EIO: tier.TierError,
        }
        for e, cls in cases.items():
            self.assertIs(tier.errors.error_class(-e), cls)
            self.assertIs(tier.errors.error_class(e), cls)
            x = cls(e, "why", "what")
            self.assertIsInstance(x, tier.TierError)
            self.assertIsInstance(x, OSError)
            self.assertEqual((x.errno, x.strerror, x.operation), (e, "why", "what"))
            self.assertEqual(str(x), f"what: why [{errno.errorcode[e]}]")

    def test_pickle(self) -> None:
        import pickle

        x = pickle.loads(pickle.dumps(tier.NoSpaceError(errno.ENOSPC, "full", "pin")))
        self.assertIsInstance(x, tier.NoSpaceError)
        self.assertEqual((x.errno, x.strerror, x.operation), (errno.ENOSPC, "full", "pin"))

    def test_new_refused_says_why(self) -> None:
        # tier_client_new(3), NOTES: a call refused by its own argument checks sets its own text; a failed
        # tier_client_new() leaves it for tier_client_last_error(NULL), a NULL ret included (it was "")
        L = _lib.lib()
        r = L.tier_client_new(b"/nonexistent/tierd.sock", b"job", 0, None)
        self.assertEqual(r, -errno.EINVAL)
        self.assertIn(b"ret is NULL", L.tier_client_last_error(None))


def run_python(code: str, env: dict[str, str], cwd: str = "/") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


class TestLoading(unittest.TestCase):
    """The lookup order: $TIER_LIBTIER, $TIER_BUILD, the checkout's build/, the system."""

    def env(self, **kw: str | None) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if k not in ("TIER_LIBTIER", "TIER_BUILD")}
        e["PYTHONPATH"] = os.path.join(tierd.source_dir(), "client", "python")
        for k, v in kw.items():
            if v is not None:
                e[k] = v
        return e

    def test_import_is_lazy_about_numpy_and_torch(self) -> None:
        p = run_python("import sys, tier; print('numpy' in sys.modules, 'torch' in sys.modules)", self.env(
            TIER_LIBTIER=os.environ["TIER_LIBTIER"]))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["False", "False"])

    def test_tier_libtier(self) -> None:
        lib = os.environ["TIER_LIBTIER"]
        p = run_python("import tier; print(tier.library_path())", self.env(TIER_LIBTIER=lib, TIER_BUILD="/nonexistent"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), lib)

    def test_tier_build(self) -> None:
        p = run_python("import tier; print(tier.library_path())", self.env(TIER_BUILD=tierd.build_dir()))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), os.path.join(tierd.build_dir(), "client", "libtier.so"))

    def test_missing_library_names_the_places(self) -> None:
        code = (
            "import tier\n"
        )
        p = run_python(code, self.env(TIER_LIBTIER="/nonexistent/libtier.so"))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("TierError", p.stderr)
        self.assertIn("cannot load libtier; tried: /nonexistent/libtier.so", p.stderr)
        p = run_python(code, self.env(TIER_BUILD="/nonexistent"))
        self.assertIn("/nonexistent/client/libtier.so", p.stderr)

    def test_checkout_build_dir(self) -> None:
        # running from the checkout: <package>/../../../build/client/libtier.so, when it exists
        src_build = os.path.join(tierd.source_dir(), "build", "client", "libtier.so")
        p = run_python("import tier; print(tier.library_path())", self.env())
        if os.path.exists(src_build):
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.strip(), src_build)
        elif p.returncode != 0:  # no ./build and no system libtier
            self.assertIn("not built", p.stderr)
            self.assertIn("libtier.so.1", p.stderr)


class TestVersion(unittest.TestCase):
    def test_versions_agree(self) -> None:
        src = tierd.source_dir()
        with open(os.path.join(src, "meson.build")) as f:
            m = re.search(r"version\s*:\s*'([^']+)'", f.read())
        assert m
        with open(os.path.join(src, "client", "python", "pyproject.toml")) as f:
            p = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        assert p
        self.assertEqual(p.group(1), m.group(1))
        self.assertEqual(tier.__version__, m.group(1))


class TestReadme(unittest.TestCase):
    """client/python/README.md against the package: it names every public method, property and
    result field, and every tier.h function the package does not call is one it says is not
    wrapped (so it cannot claim the whole C API while leaving some out)."""

    def setUp(self) -> None:
        with open(os.path.join(tierd.source_dir(), "client", "python", "README.md")) as f:
            self.readme = f.read()
        self.words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", self.readme))

    def test_every_public_name(self) -> None:
        import dataclasses

        for cls in (tier.Client, tier.Tensor, tier.Grant, tier.Fence, tier.Plan):
            names = {n for n in vars(cls) if not n.startswith("_")}
            with self.subTest(cls=cls.__name__):
                self.assertEqual(sorted(names - self.words), [], f"{cls.__name__} members the README does not name")
        for cls in (tier.Quota, tier.QuotaTotal, tier.Commit, tier.Stat):
            names = {f.name for f in dataclasses.fields(cls)}
            with self.subTest(cls=cls.__name__):
                self.assertEqual(sorted(names - self.words), [], f"{cls.__name__} fields the README does not name")

    def test_unwrapped_functions_are_named(self) -> None:
        pkg = os.path.dirname(tier.__file__)
        called: set[str] = set()
        for name in ("client.py", "_tensor.py", "_base.py", "errors.py", "__init__.py"):
            with open(os.path.join(pkg, name)) as f:
                called |= set(re.findall(r"\b_?L\.(tier_\w+)\(", f.read()))
        self.assertIn("tier_pin", called)
        unwrapped = set(_lib.PROTOTYPES) - called
        not_named = {n for n in unwrapped
                     if f"`{n}()`" not in self.readme and not (n.startswith("tier_trace_") and "`tier_trace_*()`" in self.readme)}
        self.assertEqual(sorted(not_named), [], "tier.h functions the package neither wraps nor says it leaves out")


class TestArguments(unittest.TestCase):
    """Bad Python arguments are refused before any C call (no daemon needed)."""

    def test_client_arguments(self) -> None:
        with self.assertRaises(TypeError):
            tier.Client(None)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            tier.Client("bad\njob")
        with self.assertRaises(ValueError):
            tier.Client("j", rank=-1)
        with self.assertRaises(TypeError):
            tier.Client("j", rank="0")  # type: ignore[arg-type]

    def test_connect_failure(self) -> None:
        with self.assertRaises(tier.TierError) as cm:
            tier.Client("j", socket="/nonexistent/tierd.sock")
        self.assertIsInstance(cm.exception, tier.NotFoundError)
        self.assertIn("/nonexistent/tierd.sock", cm.exception.strerror)
        self.assertIn("is tierd running?", cm.exception.strerror)
        # a socket file nobody listens on (tierd gone): ECONNREFUSED, a ShutdownError
        import socket
        import tempfile

        with tempfile.TemporaryDirectory() as d, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.bind(f"{d}/tierd.sock")
            with self.assertRaises(tier.ShutdownError) as cm:
                tier.Client("j", socket=f"{d}/tierd.sock")
            self.assertEqual(cm.exception.errno, errno.ECONNREFUSED)


if __name__ == "__main__":
    tierd.main()
