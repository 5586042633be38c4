#!/bin/sh
# SPDX-License-Identifier: MIT
# check-abi.sh: libtier.so's ABI is the one committed in abi/libtier.abi.
#
# usage: check-abi.sh ABIDIFF COMMITTED.abi TIER_H LIBRARY
#
# abidiff compares the committed corpus (abidw's XML of libtier.so.1 at the
# release) with the library just built, over the types of the public header
# only: tier.h is copied into a folder of its own for --headers-dir, since
# client/ also holds the private headers (struct tier_client is opaque, and
# its layout is libtier's business).  Any difference fails: a removed or changed function or struct
# layout breaks programs built against libtier.so.1 (that needs a new
# soname), and an added function must come in a new version node of
# client/libtier.sym, after which scripts/abi-update records it.
set -eu

if [ $# -ne 4 ]; then
        echo "usage: $0 ABIDIFF COMMITTED.abi TIER_H LIBRARY" >&2
        exit 2
fi
abidiff=$1 committed=$2 header=$3 lib=$4

if ! command -v "$abidiff" >/dev/null 2>&1; then
        echo "abidiff not found: apt-get install abigail-tools (./scripts/test installs it)" >&2
        exit 1
fi
for f in "$committed" "$header" "$lib"; do
        if [ ! -r "$f" ]; then
                echo "$f: missing" >&2
                exit 1
        fi
done

headers=$(mktemp -d)
trap 'rm -rf "$headers"' EXIT
cp "$header" "$headers/tier.h"
rc=0
"$abidiff" --drop-private-types --headers-dir2 "$headers" "$committed" "$lib" || rc=$?
# abidiff's status is a bit field: 1 error, 2 usage, 4 an ABI change, 8 an incompatible one.
if [ "$rc" -ne 0 ]; then
        if [ $((rc & 3)) -ne 0 ]; then
                echo "abidiff failed (status $rc)" >&2
        elif [ $((rc & 8)) -ne 0 ]; then
                echo "libtier's ABI changed incompatibly against $committed (status $rc): a program built" \
                     "against libtier.so.1 would break.  Undo the change, or make a new soname." >&2
        else
                echo "libtier's ABI differs from $committed (status $rc).  A changed struct layout or" \
                     "function type breaks programs built against libtier.so.1: undo it, or make a new" \
                     "soname.  An added function goes into a new version node of client/libtier.sym, then" \
                     "scripts/abi-update records it." >&2
        fi
        exit 1
fi
echo "libtier ABI: as committed in $committed"
