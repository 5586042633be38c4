#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# check-rooms.py: the daemon's folders ("rooms") depend on each other one way only.
#
# usage: check-rooms.py SOURCE_ROOT [LIBTIERD_STATIC_A]
#
# Rooms, top to bottom: core -> ipc -> sched -> engine -> state -> tiers -> base.
# A room may use the rooms below it, never one above (an upper room that needs
# to hear from a lower one registers an ops table with it).  Checked:
#   1. #include "daemon/ROOM/..." only of the same or a lower room;
#   2. with the static library: every symbol an object of one room uses from
#      another room's object is defined in a lower room (calls, not only includes);
#   3. no .c file declares a function it does not define (prototypes go in headers);
#   4. no source file (daemon, client, proto, util, tests, bench) over MAX_LINES lines.
# Prints each violation and exits 1 when there is any.

import os
import re
import subprocess
import sys

ROOMS = ["base", "tiers", "state", "engine", "sched", "ipc", "core"]   # bottom up
MAX_LINES = 1000
SOURCE_DIRS = ["daemon", "client", "proto", "util", "tests", "bench"]

errors = []


def rank(room):
    return ROOMS.index(room)


def room_of(path):
    parts = path.split(os.sep)
    if len(parts) >= 3 and parts[0] == "daemon" and parts[1] in ROOMS:
        return parts[1]
    return None


def check_includes(root):
    inc = re.compile(r'^\s*#\s*include\s+"daemon/([^/"]+)/')
    for dirpath, _, files in os.walk(os.path.join(root, "daemon")):
        for f in files:
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.relpath(os.path.join(dirpath, f), root)
            room = room_of(path)
            if room is None:
                errors.append("%s: a daemon source outside the rooms (%s)" % (path, ", ".join(ROOMS)))
                continue
            with open(os.path.join(root, path), errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = inc.match(line)
                    if not m:
                        continue
                    other = m.group(1)
                    if other not in ROOMS:
                        errors.append("%s:%d: includes unknown room '%s'" % (path, n, other))
                    elif rank(other) > rank(room):
                        errors.append("%s:%d: room '%s' includes the room above it, '%s'" % (path, n, room, other))


def check_prototypes(root):
    # A declaration at file scope that is not static and ends in ");": a
    # prototype of a function written in another file.
    decl = re.compile(r'^(?!static\b|typedef\b|extern\s+"C")[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)\s*;\s*$')
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(".c"):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                with open(os.path.join(root, path), errors="replace") as fh:
                    text = fh.read()
                for n, line in enumerate(text.splitlines(), 1):
                    m = decl.match(line)
                    if not m:
                        continue
                    name = m.group(1)
                    if name.startswith(("__wrap_", "__real_")):
                        continue        # a test's -Wl,--wrap= pair: the linker provides the other half
                    if re.search(r'^[^\n;]*\b%s\s*\([^;]*\)\s*\{' % re.escape(name), text, re.M):
                        continue        # declared and defined here (a forward declaration)
                    errors.append("%s:%d: declares '%s', defined elsewhere: put it in a header" % (path, n, name))


def check_lengths(root):
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".c", ".h", ".py")):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, errors="replace") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    errors.append("%s: %d lines (at most %d: split it by concern)"
                                  % (os.path.relpath(path, root), n, MAX_LINES))


def member_room(member):
    # meson names objects after their source path: "core_manager.c.o"
    for room in ROOMS:
        if member.startswith(room + "_"):
            return room
    return None


def check_symbols(lib):
    out = subprocess.run(["nm", "-A", lib], check=True, capture_output=True, text=True).stdout
    defined = {}
    used = []
    for line in out.splitlines():
        # "lib.a:member.o:                 U name" or "lib.a:member.o:0000 T name"
        m = re.match(r'^[^:]+:([^:]+):\s*(?:[0-9a-fA-F]+)?\s+([A-Za-z])\s+(\S+)$', line)
        if not m:
            continue
        member, kind, name = m.groups()
        room = member_room(member)
        if room is None:
            continue
        if kind == "U":
            used.append((member, room, name))
        elif kind in "TDBRGSV":
            defined[name] = (member, room)
    for member, room, name in used:
        if name not in defined:
            continue
        dmember, droom = defined[name]
        if rank(droom) > rank(room):
            errors.append("%s (room '%s') calls %s() of %s, in the room above it, '%s'"
                          % (member, room, name, dmember, droom))


def main():
    if len(sys.argv) < 2:
        print(__doc__ or "usage: check-rooms.py SOURCE_ROOT [LIB]", file=sys.stderr)
        return 2
    root = sys.argv[1]
    check_includes(root)
    check_prototypes(root)
    check_lengths(root)
    if len(sys.argv) > 2:
        check_symbols(sys.argv[2])
    for e in errors:
        print(e)
    if errors:
        print("%d problem(s)" % len(errors))
        return 1
    print("rooms: %s, one way; no stray prototypes; no file over %d lines" % (" <- ".join(reversed(ROOMS)), MAX_LINES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
