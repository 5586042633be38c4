#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/prepare.sh: build what tests/gpu/run.sh needs, here, for a GPU machine that has no compiler.
#
# usage: tests/gpu/prepare.sh [BUILD_DIR]        (default: build-gpu)
#
# Configures BUILD_DIR with the CUDA backend required (cuda.h from the toolkit
# under -Dcudadir, default /usr/local/cuda; nothing CUDA is linked), builds it,
# and copies the shared libraries the programs need beyond glibc (liburing,
# libnuma, libprotobuf-c, libsystemd and what it pulls in, libcmocka) into
# BUILD_DIR/runtime-libs, so the GPU machine needs only its NVIDIA driver.
# run.sh uses a copied library only where that machine lacks its own.
# Carry BUILD_DIR to the GPU machine (it is ignored by git: build-*/).
set -euo pipefail

root=$(CDPATH='' cd -- "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-build-gpu}
cd "$root"

if [[ ! -f $build/build.ninja ]]; then
        meson setup "$build" -Dcuda=enabled -Dtests=enabled -Dbench=enabled -Dbuildtype=debugoptimized -Dwerror=true
else
        meson configure "$build" -Dcuda=enabled >/dev/null
fi
ninja -C "$build"

programs=(daemon/tierd client/tierctl client/libtier.so.1 tests/integration/test-cuda tests/vmm-probe bench/bench-vram-cuda)
for p in "${programs[@]}"; do
        [[ -e $build/$p ]] || { echo "prepare.sh: $build/$p was not built" >&2; exit 1; }
done

# Everything ldd resolves outside glibc and outside the build itself.
libs=$build/runtime-libs
rm -rf "$libs"
mkdir -p "$libs"
for p in "${programs[@]}"; do
        LD_LIBRARY_PATH=$build/client ldd "$build/$p"
done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
        case $(basename "$lib") in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libresolv.so*) continue ;;
        libtier.so*) continue ;;
        esac
        cp -L "$lib" "$libs/"
done
echo "prepare.sh: $build is ready; runtime libraries in $libs:"
ls "$libs"
du -sh "$build"
