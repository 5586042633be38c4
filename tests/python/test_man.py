#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The man pages of libtier against client/tier.h and client/libtier.sym: every exported function
has a page (its own, or an alias installed under its name), every SYNOPSIS is tier.h's, and no
page names a function tier.h does not declare; the code the pages show (libtier(3)'s and
tier_plan_new(3)'s examples, the initialiser of a struct passed in) compiles as ISO C17 with
-pedantic-errors.  And the Markdown docs name only what the sources have: every `function()` they
quote, and in docs/ARCHITECTURE.md every file, CONSTANT and `Struct.field` too."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import tempfile
import unittest

import tierd

MAN = os.path.join(tierd.source_dir(), "man")
HEADER = os.path.join(tierd.source_dir(), "client", "tier.h")
SYMBOLS = os.path.join(tierd.source_dir(), "client", "libtier.sym")


def strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def normalise(decl: str) -> str:
    """One declaration with whitespace normalised: runs become one space, none around punctuation."""
    decl = re.sub(r"\s+", " ", decl).strip()
    return re.sub(r"\s*([(),*\[\];])\s*", r"\1", decl)


def declarations(code: str) -> dict[str, str]:
    """Function name -> normalised declaration, for every function prototype in C @code."""
    code = strip_comments(code)
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))
    decls: dict[str, str] = {}
    for m in re.finditer(r"([^;{}]*?\b(tier_\w+)\s*\([^;{}]*\))\s*;", code):
        decl, name = m.group(1), m.group(2)
        if decl.lstrip().startswith("typedef"):
            continue
        decls[name] = normalise(decl + ";")
    return decls


def exported_symbols() -> set[str]:
    """The functions of libtier.sym's global lists (every version node)."""
    with open(SYMBOLS) as f:
        text = strip_comments(f.read())
    names: set[str] = set()
    for block in re.findall(r"global:(.*?)(?:local:|\})", text, flags=re.S):
        names.update(re.findall(r"\b(tier_\w+)\s*;", block))
    return names


class Page:
    """A libtier man page: man/NAME.3.scd."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(path)[: -len(".3.scd")]
        with open(path) as f:
            self.text = f.read()

    def section(self, title: str) -> str:
        m = re.search(rf"^# {re.escape(title)}\n(.*?)(?=^# |\Z)", self.text, flags=re.M | re.S)
        return m.group(1) if m else ""

    def names(self) -> list[str]:
        """The functions the NAME line lists, before its " - "."""
        line = self.section("NAME").strip().split("\n")[0]
        return [n.strip() for n in line.split(" - ")[0].split(",")]

    def synopsis(self) -> dict[str, str]:
        """The prototypes of the SYNOPSIS's code blocks."""
        blocks = re.findall(r"^```\n(.*?)^```", self.section("SYNOPSIS"), flags=re.M | re.S)
        return declarations("\n".join(blocks))


def pages() -> list[Page]:
    return [Page(p) for p in sorted(glob.glob(os.path.join(MAN, "tier_*.3.scd")))]


def all_pages() -> list[str]:
    return sorted(glob.glob(os.path.join(MAN, "*.scd")))


class TestManPages(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        with open(HEADER) as f:
            cls.header = declarations(f.read())
        cls.symbols = exported_symbols()
        cls.pages = pages()
        cls.listed: dict[str, list[str]] = {}
        for p in cls.pages:
            for n in p.names():
                cls.listed.setdefault(n, []).append(p.name)

    def test_inputs(self) -> None:
        # a parser that finds nothing would let every other test pass
        self.assertGreaterEqual(len(self.header), 60, "functions found in tier.h")
        self.assertGreaterEqual(len(self.symbols), 60, "functions found in libtier.sym")
        self.assertEqual(self.symbols, set(self.header), "libtier.sym and tier.h disagree")
        self.assertGreater(len(self.pages), 10)

    def test_every_symbol_has_a_page(self) -> None:
        missing = sorted(self.symbols - set(self.listed))
        self.assertEqual(missing, [], "exported functions that no page's NAME line lists")
        twice = {n: p for n, p in self.listed.items() if len(p) > 1}
        self.assertEqual(twice, {}, "functions listed on the NAME line of several pages")

    def test_page_names_itself_first(self) -> None:
        for p in self.pages:
            self.assertEqual(p.names()[0], p.name, f"{p.path}: the NAME line begins with another name")
            self.assertTrue(p.text.startswith(f"{p.name}(3)\n"), f"{p.path}: no title line {p.name}(3)")

    def test_synopsis_is_tier_h(self) -> None:
        in_synopsis: dict[str, str] = {}
        for p in self.pages:
            syn = p.synopsis()
            self.assertIn("#include <tier.h>", p.section("SYNOPSIS"), p.path)
            self.assertEqual(sorted(syn), sorted(p.names()),
                             f"{p.path}: the SYNOPSIS's prototypes are not the functions of the NAME line")
            for name, decl in syn.items():
                self.assertIn(name, self.header, f"{p.path}: SYNOPSIS declares {name}(), which tier.h does not")
                self.assertEqual(decl, self.header[name], f"{p.path}: the prototype of {name}() is not tier.h's")
                in_synopsis[name] = p.name
        self.assertEqual(sorted(set(self.header) - set(in_synopsis)), [],
                         "functions of tier.h in no page's SYNOPSIS")

    def test_no_stale_names(self) -> None:
        # libtier's own pages: every tier_* identifier is one of tier.h (a function, type or struct);
        # the other pages: every tier_*() they call a function is one
        with open(HEADER) as f:
            known = set(re.findall(r"\btier_[a-z0-9_]+\b", f.read()))
        stale: list[str] = []
        for path in all_pages():
            with open(path) as f:
                text = f.read()
            base = os.path.basename(path)
            if base.startswith("tier_") or base == "libtier.3.scd":
                found = re.findall(r"\btier_[a-z0-9_]+\b", text)
            else:
                found = re.findall(r"\b(tier_[a-z0-9_]+)\**\s*\(", text)
            stale += [f"{base}: {n}" for n in sorted(set(found) - known)]
        self.assertEqual(stale, [], "pages name what tier.h does not declare")
        for n in set(self.listed):
            self.assertIn(n, self.header, f"a NAME line lists {n}, which tier.h does not declare")

    def test_installed_under_every_name(self) -> None:
        info = os.path.join(tierd.build_dir(), "meson-info", "intro-installed.json")
        if not os.path.exists(info):
            self.skipTest(f"no {info}")
        with open(info) as f:
            installed = json.load(f)        # build path -> install path
        man3 = {os.path.basename(dest)[: -len(".3")]: src for src, dest in installed.items()
                if os.path.basename(os.path.dirname(dest)) == "man3" and dest.endswith(".3")}
        if not man3:
            self.skipTest("this build has no man pages (-Dman=disabled, or no scdoc)")
        self.assertTrue("libtier" in man3, "libtier(3) is not installed")
        for p in self.pages:
            self.assertIn(p.name, man3, f"{p.path} is not installed")
        for name in sorted(self.symbols):
            with self.subTest(function=name):
                self.assertTrue(name in man3, f"nothing is installed as man3/{name}.3")
                self.assertIn(name, self.listed, f"no page's NAME line lists {name}")
                page = self.listed[name][0]
                with open(man3[name]) as f:
                    roff = f.read()
                if name == page:
                    self.assertRegex(roff, r"(?m)^\.TH ", f"man3/{name}.3 is not a man page")
                else:
                    self.assertEqual(roff.strip(), f".so man3/{page}.3", f"man3/{name}.3 is not an alias of {page}(3)")


# ---- the Markdown docs against the sources --------------------------------------------------

# The docs whose backticked names are checked, and where the sources they name lie.
DOCS = ["README.md", "docs/ARCHITECTURE.md", "docs/cuda.md", "docs/PLANNING.md", "docs/BENCH.md",
        "bench/README.md", "client/python/README.md", "tests/fuzz/README.md"]
SOURCE_DIRS = ["daemon", "client", "proto", "util", "tests", "bench", "scripts", "systemd", "abi", "man", "docs"]
SOURCE_EXT = (".c", ".h", ".py", ".proto", ".sym", ".sh", ".in", ".build", ".scd", ".md")
# functions of other projects the docs quote (torch's DistributedDataParallel.no_sync())
FOREIGN = {"no_sync"}


def source_files() -> list[str]:
    """Paths (relative to the source root) of the project's files under SOURCE_DIRS, and the top level's."""
    root = tierd.source_dir()
    found = [f for f in os.listdir(root) if os.path.isfile(os.path.join(root, f))]
    for d in SOURCE_DIRS:
        for base, dirs, files in os.walk(os.path.join(root, d)):
            dirs[:] = [x for x in dirs if x not in ("corpus", "__pycache__") and not x.startswith(".")]
            found += [os.path.relpath(os.path.join(base, f), root) for f in files]
    return found


def braced_bodies(code: str, opener: str) -> dict[str, str]:
    """Name -> body (nested braces included) of each `struct NAME {` or `message NAME {` in @code."""
    bodies: dict[str, str] = {}
    for m in re.finditer(rf"\b{opener}\s+(\w+)\s*\{{", code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        bodies[m.group(1)] = bodies.get(m.group(1), "") + code[m.end():i]
    return bodies


class TestDocNames(unittest.TestCase):
    """What the docs quote in backticks exists: docs/ARCHITECTURE.md named `COLLIDE_NS` (admit.c has
    SCHED_COLLIDE_NS), tests/fuzz/README.md `plan_status()` (plan.h has plan_stats())."""

    @classmethod
    def setUpClass(cls) -> None:
        root = tierd.source_dir()
        cls.files = source_files()
        texts = []
        for f in cls.files:
            # not this file, which quotes stale names
            if f.endswith(SOURCE_EXT) and not f.endswith(".md") and os.path.basename(f) != "test_man.py":
                with open(os.path.join(root, f), errors="replace") as fh:
                    texts.append(fh.read())
        code = "\n".join(texts)
        cls.idents = set(re.findall(r"\b[A-Za-z_]\w*\b", code))
        cls.bodies = braced_bodies(code, "struct")
        for name, body in braced_bodies(code, "message").items():
            cls.bodies[name] = cls.bodies.get(name, "") + body
        cls.basenames = {os.path.basename(f) for f in cls.files}

    def quoted(self, doc: str) -> list[str]:
        with open(os.path.join(tierd.source_dir(), doc)) as f:
            return re.findall(r"`([^`\n]+)`", f.read())

    def test_inputs(self) -> None:
        self.assertIn("sched_run", self.idents)
        self.assertNotIn("plan_status", self.idents)
        self.assertIn("seg_sent", self.bodies.get("Conn", ""))
        self.assertIn("held_writes", self.bodies.get("Hello", ""))
        self.assertGreater(len(self.quoted("docs/ARCHITECTURE.md")), 500)

    def test_functions(self) -> None:
        # `name()`: a function (C or Python) of the sources, in every doc
        stale = [f"{doc}: {q}" for doc in DOCS for q in self.quoted(doc)
                 if re.fullmatch(r"(\w+)\(\)", q) and q[:-2] not in self.idents | FOREIGN]
        self.assertEqual(stale, [], "docs quote functions no source defines or calls")

    def test_architecture(self) -> None:
        # files (a path, or a name some file has), CONSTANTS and Struct.field (C structs, proto messages)
        stale = []
        for q in self.quoted("docs/ARCHITECTURE.md"):
            if re.fullmatch(r"[\w./-]+\.(c|h|py|sh|md|proto)", q):
                if not ("/" in q and any(f == q or f.endswith("/" + q) for f in self.files)
                        or "/" not in q and q in self.basenames):
                    stale.append(q)
            elif re.fullmatch(r"[A-Z][A-Z0-9_]{3,}", q) and q not in self.idents:
                stale.append(q)
            m = re.match(r"([A-Z]\w*)\.([a-z_]\w*)", q)
            if m and not re.search(rf"\b{m.group(2)}\b", self.bodies.get(m.group(1), "")):
                stale.append(q)
        self.assertEqual(stale, [], "docs/ARCHITECTURE.md quotes names the sources do not have")


class TestReadmeSuites(unittest.TestCase):
    """README's Testing section names every test of this build under its suite: its list had 15 of
    the unit suite's tests, 9 of integration's, 8 of python's, and no abi or plan-validate suite."""

    def test_every_test_named(self) -> None:
        info = os.path.join(tierd.build_dir(), "meson-info", "intro-tests.json")
        if not os.path.exists(info):
            self.skipTest(f"no {info}")
        with open(info) as f:
            tests = json.load(f)
        with open(os.path.join(tierd.source_dir(), "README.md")) as f:
            text = f.read()
        start = text.index("The suites (meson `suite:` names)")
        listing = text[start:text.index("\n## ", start)]
        # "* **SUITE**...": the suites' items, each up to the next
        items = {m.group(1): m.group(2) for m in
                 re.finditer(r"^\* \*\*([\w-]+)\*\*(.*?)(?=^\* \*\*|\Z)", listing, flags=re.M | re.S)}
        self.assertGreater(len(tests), 50)
        missing = []
        for t in tests:
            suite = t["suite"][0].split(":", 1)[-1]
            if suite not in items or f"`{t['name']}`" not in items[suite]:
                missing.append(f"{suite} / {t['name']}")
        self.assertEqual(sorted(missing), [], "tests README.md's Testing section does not name under their suite")

def scd_code(text: str) -> str:
    """scdoc's escapes undone in a code block (\\\\ is a backslash), as the reader sees it."""
    return text.replace("\\\\", "\\")


def compile_c(test: unittest.TestCase, src: str, link: bool) -> None:
    """@src compiles as ISO C17 with every warning an error (and links against libtier when @link)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ex.c")
        with open(path, "w") as f:
            f.write(src)
        cmd = ["cc", "-std=c17", "-Wall", "-Wextra", "-pedantic-errors", "-Werror",
               "-I", os.path.join(tierd.source_dir(), "client"), path]
        cmd += ["-o", os.path.join(d, "ex"), "-L", os.path.join(tierd.build_dir(), "client"), "-ltier"] if link \
            else ["-fsyntax-only"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        test.assertEqual(p.returncode, 0, src + p.stderr)


class TestExamples(unittest.TestCase):
    """What the pages show a reader to write compiles as they show it, -pedantic included."""

    def test_libtier_example(self) -> None:
        page = Page(os.path.join(MAN, "libtier.3.scd"))
        blocks = re.findall(r"^```\n(.*?)^```", page.section("EXAMPLE"), flags=re.M | re.S)
        mains = [b for b in blocks if "int main(void)" in b]
        self.assertEqual(len(mains), 1, "libtier(3) has one complete example")
        compile_c(self, scd_code(mains[0]), link=True)

    def test_plan_example(self) -> None:
        # a fragment: the names it takes from its surroundings are declared around it
        page = Page(os.path.join(MAN, "tier_plan_new.3.scd"))
        blocks = re.findall(r"^```\n(.*?)^```", page.section("EXAMPLE"), flags=re.M | re.S)
        self.assertEqual(len(blocks), 1)
        src = ("#include <tier.h>\n#define CHECK(x) do { if ((x) < 0) return -1; } while (0)\n"
               "int step(tier_client *c, tier_tensor *w, tier_tensor *grad, int steps);\n"
               "int step(tier_client *c, tier_tensor *w, tier_tensor *grad, int steps) {\n"
               + scd_code(blocks[0]) + "return 0;\n}\n")
        compile_c(self, src, link=False)

    def test_zero_initialisers(self) -> None:
        # the initialiser a page tells the reader to start a struct passed in from
        found = 0
        for path in all_pages():
            with open(path) as f:
                text = f.read()
            for m in re.finditer(r"\*(struct tier_\w+ (\w+) = \{[^}]*\})\*", text):
                found += 1
                body = m.group(1) + "; (void) " + m.group(2) + ";"
                compile_c(self, "#include <tier.h>\nvoid f(void);\nvoid f(void) { " + body + " }\n", link=False)
        self.assertGreater(found, 0, "no page shows how to start a struct passed in")


if __name__ == "__main__":
    tierd.main()
