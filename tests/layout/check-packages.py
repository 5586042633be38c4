#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# check-packages.py: what meson looks for and what scripts/lib.sh installs agree.
#
# usage: check-packages.py SOURCE_ROOT
#
# Every dependency(), find_library() and find_program() of a system component
# in a meson.build carries a "# debian: PACKAGE [(tests)|(optional)]" comment
# on its line.  Checked:
#   1. every such lookup has the comment;
#   2. PACKAGE is in the list of scripts/lib.sh that must provide it:
#      TIER_BUILD_PACKAGES for what a plain build needs (what scripts/demo
#      installs), TIER_TEST_PACKAGES for "(tests)" and for every lookup under
#      tests/ and bench/; "(optional)" lookups need be in no list; Debian's
#      essential packages are always there;
#   3. PACKAGE really provides it, asked of dpkg: the file meson found (the
#      .pc file, the library, the program) belongs to PACKAGE or to a package
#      PACKAGE depends on (python3 -> python3-minimal), when it is installed;
#   4. the Debian packages meson.build names in its "missing" messages are
#      in the list that installs them: build_missing in TIER_BUILD_PACKAGES,
#      tests_missing and bench_missing in TIER_TEST_PACKAGES;
#   5. TIER_TEST_PACKAGES holds every package of TIER_BUILD_PACKAGES.
# Exits 77 (a skip) on a system without dpkg; prints each violation and
# exits 1 when there is any.

import glob
import os
import re
import shutil
import subprocess
import sys

LOOKUP = re.compile(r"\b(dependency|find_library|find_program)\(\s*'([^']*)'(\s*\+)?")
COMMENT = re.compile(r"#\s*debian:\s*([a-z0-9][a-z0-9+.-]*)\s*(?:\((tests|optional)\))?")
MISSING = re.compile(r"\b(build_missing|tests_missing|bench_missing)\s*\+=\s*'([^']+)'")

errors = []


def lib_lists(root):
    """The package arrays of scripts/lib.sh, as bash sees them."""
    out = subprocess.run(
        ["bash", "-c", 'source "$1"; for a in TIER_BUILD_PACKAGES TIER_TEST_PACKAGES; do '
         'declare -n l=$a; echo "$a ${l[*]}"; done', "sh", os.path.join(root, "scripts", "lib.sh")],
        check=True, capture_output=True, text=True).stdout
    lists = {}
    for line in out.splitlines():
        name, *pkgs = line.split()
        lists[name] = set(pkgs)
    return lists


def dpkg_query(fmt, pkg):
    p = subprocess.run(["dpkg-query", "-W", "-f=" + fmt, pkg], capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


def installed(pkg):
    return dpkg_query("${Status}", pkg) == "install ok installed"


def essential(pkg):
    return dpkg_query("${Essential}", pkg) == "yes"


def depends_of(pkg):
    deps = dpkg_query("${Depends}, ${Pre-Depends}", pkg) or ""
    return {re.split(r"[\s:(]", d.strip())[0] for d in re.split(r"[,|]", deps) if d.strip()}


def owners(path):
    """The packages dpkg says own PATH (trying the /usr-merged spellings too)."""
    cands = {path, os.path.realpath(path)}
    for c in list(cands):
        if c.startswith("/usr/"):
            cands.add(c[4:])
        else:
            cands.add("/usr" + c)
    found = set()
    for c in cands:
        p = subprocess.run(["dpkg-query", "-S", c], capture_output=True, text=True)
        if p.returncode == 0:
            for line in p.stdout.splitlines():
                pkgs, _, f = line.partition(": ")
                if f.strip() == c:
                    found |= {x.strip().split(":")[0] for x in pkgs.split(",")}
    return found


def files_of(kind, name):
    """The files on this system that a lookup of NAME stands for, or [] when unknown."""
    if kind == "dependency":
        if name == "threads":
            return glob.glob("/usr/include/pthread.h")
        p = subprocess.run(["pkg-config", "--path", name], capture_output=True, text=True)
        return [p.stdout.strip()] if p.returncode == 0 and p.stdout.strip() else []
    if kind == "find_library":
        return (glob.glob(f"/usr/lib/*/lib{name}.so") + glob.glob(f"/usr/lib/lib{name}.so")
                + glob.glob(f"/lib/*/lib{name}.so"))[:1]
    path = name if name.startswith("/") else shutil.which(name)
    return [path] if path and os.path.exists(path) else []


def main():
    root = sys.argv[1]
    if not shutil.which("dpkg-query"):
        print("SKIP: no dpkg-query (not a Debian system): the package lists are Debian's")
        sys.exit(77)
    lists = lib_lists(root)
    build, test = lists["TIER_BUILD_PACKAGES"], lists["TIER_TEST_PACKAGES"]
    for pkg in sorted(build - test):
        errors.append(f"scripts/lib.sh: {pkg} is in TIER_BUILD_PACKAGES but not in TIER_TEST_PACKAGES")

    builds = [d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "meson-private"))]
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and (rel_dir != "." or d not in builds)
                       and d not in ("run", "corpus")]
        if "meson.build" not in filenames:
            continue
        path = os.path.join(dirpath, "meson.build")
        rel = os.path.relpath(path, root)
        in_tests = rel.split(os.sep)[0] in ("tests", "bench")
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines, 1):
            code = line.split("#", 1)[0]
            for m in MISSING.finditer(code):
                need, need_name = (build, "TIER_BUILD_PACKAGES") if m.group(1) == "build_missing" else \
                    (test, "TIER_TEST_PACKAGES")
                if m.group(2) not in need:
                    errors.append(f"{rel}:{i}: {m.group(1)} names {m.group(2)}, which {need_name} lacks")
            for m in LOOKUP.finditer(code):
                kind, name, concat = m.groups()
                if not name:
                    continue
                if kind == "find_program" and not name.startswith("/") and (
                        glob.glob(os.path.join(dirpath, glob.escape(name) + ("*" if concat else "")))):
                    continue            # a script of ours
                n += 1
                c = COMMENT.search(line)
                if not c:
                    errors.append(f"{rel}:{i}: {kind}('{name}') has no '# debian: PACKAGE' comment")
                    continue
                pkg, tag = c.groups()
                need = test if (in_tests or tag == "tests") else build
                need_name = "TIER_TEST_PACKAGES" if need is test else "TIER_BUILD_PACKAGES"
                if tag != "optional" and pkg not in need and not essential(pkg):
                    errors.append(f"{rel}:{i}: {kind}('{name}') needs {pkg}, which {need_name} "
                                  "(scripts/lib.sh) does not install")
                if installed(pkg):
                    files = files_of(kind, name)
                    if files:
                        own = set().union(*(owners(f) for f in files))
                        if own and pkg not in own and not (own & depends_of(pkg)):
                            errors.append(f"{rel}:{i}: {kind}('{name}') found {files[0]}, which dpkg says "
                                          f"belongs to {', '.join(sorted(own))}, not {pkg}")
                elif tag != "optional":
                    # the build found it, so it came from somewhere else than Debian
                    files = files_of(kind, name)
                    if files:
                        errors.append(f"{rel}:{i}: {kind}('{name}') found {files[0]}, but {pkg} is not "
                                      "installed: the comment names the wrong package")
    if n == 0:
        errors.append("no lookups found in any meson.build: the parser is broken")
    for e in errors:
        print(e)
    print(f"{n} lookups checked against scripts/lib.sh and dpkg: {len(errors)} problem(s)")
    sys.exit(1 if errors else 0)


main()
