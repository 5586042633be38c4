# shellcheck shell=bash
# SPDX-License-Identifier: MIT
# scripts/lib.sh: helpers shared by scripts/demo, scripts/test and scripts/fuzz (sourced, not run).
#
#   ensure_packages PKG...          install the Debian packages that are missing
#   require_packages PKG...         die, naming them, when any is missing
#   ensure_test_venv [--no-install] .venv-tests with tests/python/requirements-models.txt
#   build_dir_setup DIR [ARGS...]   meson setup (or --reconfigure) DIR, then ninja -C DIR
#   section TEXT / info TEXT / warn TEXT / die TEXT
#
# The sourcing script sets its own shell options (set -euo pipefail) and may set
# $prog (its name, for messages) before sourcing.

if [[ -n ${_TIER_LIB_SH:-} ]]; then
        return 0
fi
_TIER_LIB_SH=1

: "${prog:=$(basename "$0")}"

# Repository root (the parent of scripts/).
# (CDPATH emptied: with CDPATH set, cd on a relative path prints where it went.)
TIER_ROOT=$(CDPATH='' cd -- "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# shellcheck disable=SC2034  # used by the scripts that source this file
# What a plain build of tierd needs (gcc pulls in libasan/libubsan through
# libgcc-*-dev): every lookup of the top-level meson.build, client/, daemon/
# and man/ names its package in a "# debian:" comment, and the layout test
# "packages" (tests/layout/check-packages.py) checks these lists against them.
TIER_BUILD_PACKAGES=(
        gcc libc6-dev meson ninja-build pkg-config
        liburing-dev libnuma-dev libprotobuf-c-dev protobuf-c-compiler
        libsystemd-dev scdoc
)
# shellcheck disable=SC2034
# What training through tier.torch needs (the demo's second example, the python
# suite): Debian's CPU build of PyTorch for /usr/bin/python3, and OpenBLAS,
# which python3-torch only recommends: without it torch's matrix products run
# on the reference BLAS, ten times slower.
TIER_TORCH_PACKAGES=(
        python3 python3-numpy python3-torch libopenblas0-pthread
)
# shellcheck disable=SC2034
# What the test suites and benchmarks need on top (meson -Dtests=enabled
# -Dbench=enabled, as scripts/test builds): cmocka (the C suites), jansson
# (the tests and bench-timeline read tierd's status JSON with it; tierd,
# libtier and tierctl do not use it), fio (baselines), valgrind, python3,
# systemd (systemd-analyze, systemd-socket-activate, systemd.pc), util-linux
# (setpriv), procps (kill(1): the unit's ExecReload=), man-db (man(1):
# systemd-analyze verify opens the units' Documentation=man: pages, and the
# installed pages are read with it), prometheus (promtool
# checks tierd's metrics text), gnuplot-nox (bench/run all's plots),
# abigail-tools (abidiff: libtier's ABI against abi/libtier.abi).  The
# python suite (tests/python/, the tier package of client/python/) needs numpy
# and torch for its views (skipped without them), and setuptools, wheel, venv
# and pip to check "pip install ./client/python" offline; all through Debian,
# for /usr/bin/python3.  The model suite (tests/python/test_models.py) trains
# torchvision's resnet18 (python3-torchvision) and Hugging Face transformers
# models: transformers is not in Debian 12, so it comes from PyPI into a venv
# over Debian's packages (ensure_test_venv below), whose other dependencies
# Debian has (python3-requests, python3-yaml; python3-psutil for accelerate,
# which transformers' Trainer needs).
TIER_TEST_PACKAGES=(
        "${TIER_BUILD_PACKAGES[@]}"
        libcmocka-dev libjansson-dev fio valgrind python3 systemd util-linux procps man-db prometheus gnuplot-nox
        abigail-tools
        "${TIER_TORCH_PACKAGES[@]}" python3-setuptools python3-wheel python3-venv python3-pip
        python3-torchvision python3-requests python3-yaml python3-psutil
)

# shellcheck disable=SC2034
# What scripts/fuzz needs on top of building: clang and its runtime libraries
# (libclang-rt-14-dev holds libFuzzer, ASan and UBSan for Debian 12's clang),
# and what the test tree's meson.build looks for (jansson).  ./scripts/test
# does not need them: it replays the fuzz corpora with gcc.
TIER_FUZZ_PACKAGES=(
        "${TIER_BUILD_PACKAGES[@]}"
        libcmocka-dev libjansson-dev python3 clang libclang-rt-14-dev
)

if [[ -t 1 ]]; then
        _c_bold=$'\e[1m' _c_red=$'\e[31m' _c_yellow=$'\e[33m' _c_off=$'\e[0m'
else
        _c_bold='' _c_red='' _c_yellow='' _c_off=''
fi

section() {
        printf '\n%s==> %s%s\n' "$_c_bold" "$*" "$_c_off"
}

info() {
        printf '    %s\n' "$*"
}

warn() {
        printf '%s%s: warning: %s%s\n' "$_c_yellow" "$prog" "$*" "$_c_off" >&2
}

die() {
        printf '%s%s: error: %s%s\n' "$_c_red" "$prog" "$*" "$_c_off" >&2
        exit 1
}

# Seconds since the epoch, for timings.
now_s() {
        date +%s
}

# make_state_dir DIR: DIR made, or taken, as a state directory that a tierd of
# this user accepts (tierd.conf(5) state_dir): one that is missing is made
# 0750 whatever the umask; one that is there must be a directory (a link to
# one will do) of this user's or root's, writable by its group only when that
# is this user's group, and by no one else: else die saying how to mend it,
# before anything is written there (what another user can put a link in, a
# script of root's must not write into either).  Nothing is changed in one
# that is there.
make_state_dir() {
        local dir=$1 uid gid mode

        if [[ ! -e $dir && ! -L $dir ]]; then
                mkdir -m 0750 -- "$dir" || die "cannot create $dir"
        fi
        [[ -d $dir ]] || die "$dir is not a directory: remove it, or make it a directory of ${USER:-uid $EUID}'s"
        read -r uid gid mode < <(stat -L -c '%u %g %a' -- "$dir") || die "cannot stat $dir"
        mode=$((8#$mode))
        if ((uid != EUID && uid != 0)); then
                die "$dir belongs to uid $uid, and tierd refuses a state directory another user can put links in
    chown $EUID $dir (or remove it: it is made again)"
        fi
        if ((mode & 8#002)); then
                die "$dir is writable by every user (mode $(printf '%04o' "$mode")), and tierd refuses a state directory another user can put links in
    chmod o-w $dir (or remove it: it is made again, 0750)"
        fi
        if ((mode & 8#020 && gid != $(id -g))); then
                die "$dir is writable by group $gid (mode $(printf '%04o' "$mode")), not this user's, and tierd refuses a state directory another user can put links in
    chmod g-w $dir (or remove it: it is made again, 0750)"
        fi
}

# "1m23s" from a number of seconds.
fmt_duration() {
        local s=$1
        if ((s >= 60)); then
                printf '%dm%02ds' $((s / 60)) $((s % 60))
        else
                printf '%ds' "$s"
        fi
}

# True when the Debian package $1 is installed.
package_installed() {
        [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

# ensure_packages PKG...: install whichever of PKG... is not installed yet.
# Runs apt-get update once, and only when something is missing.
ensure_packages() {
        local missing=() p

        command -v dpkg-query >/dev/null 2>&1 ||
                die "dpkg-query not found: ensure_packages needs a Debian system (install these yourself: $*)"
        for p in "$@"; do
                package_installed "$p" || missing+=("$p")
        done
        if ((${#missing[@]} == 0)); then
                return 0
        fi
        if ((EUID != 0)); then
                die "missing Debian packages: ${missing[*]}
    run as root, or install them first:  sudo apt-get install ${missing[*]}"
        fi
        info "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q || die "apt-get update failed"
        apt-get install -y -q --no-install-recommends "${missing[@]}" ||
                die "apt-get install failed for: ${missing[*]}"
}

# require_packages PKG...: die, naming them, when any of PKG... is not installed
# (for --no-install: what ensure_packages would have installed).
require_packages() {
        local missing=() p

        command -v dpkg-query >/dev/null 2>&1 || {
                warn "dpkg-query not found: cannot check for the Debian packages $*"
                return 0
        }
        for p in "$@"; do
                package_installed "$p" || missing+=("$p")
        done
        if ((${#missing[@]})); then
                die "missing Debian packages: ${missing[*]}
    install them (apt-get install ${missing[*]}), or run without --no-install"
        fi
}

# The venv of test-only Python packages Debian 12 lacks (tests/python/venv.py).
TIER_TEST_VENV=$TIER_ROOT/.venv-tests
TIER_TEST_REQUIREMENTS=$TIER_ROOT/tests/python/requirements-models.txt

# ensure_test_venv [--no-install]: $TIER_TEST_VENV, made with Debian's
# python3 -m venv --system-site-packages (so that Debian's torch, numpy and
# torchvision are the ones used) and $TIER_TEST_REQUIREMENTS installed into
# it from PyPI; made again when the requirements file changed.  With
# --no-install a missing or stale venv is an error.
ensure_test_venv() {
        local venv=$TIER_TEST_VENV req=$TIER_TEST_REQUIREMENTS

        if [[ -x $venv/bin/python3 ]] && cmp -s "$req" "$venv/requirements-models.txt"; then
                return 0
        fi
        if [[ ${1:-} == --no-install ]]; then
                die "the test venv $venv is missing or older than $req: run once without --no-install"
        fi
        info "making $venv (python3 -m venv --system-site-packages; pip install -r ${req#"$TIER_ROOT"/})"
        rm -rf "$venv"
        /usr/bin/python3 -m venv --system-site-packages "$venv" || die "python3 -m venv $venv failed"
        if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r "$req"; then
                rm -rf "$venv"
                die "pip install -r $req failed (is PyPI reachable?)"
        fi
        cp "$req" "$venv/requirements-models.txt"
}

# build_dir_setup DIR [MESON_ARGS...]: configure DIR (meson setup, or
# meson setup --reconfigure when DIR already holds a build tree, so that
# MESON_ARGS apply to it too) and build it with ninja.
build_dir_setup() {
        local dir=$1
        shift

        if [[ -f $dir/meson-private/coredata.dat ]]; then
                meson setup --reconfigure "$dir" "$TIER_ROOT" "$@" || return
        else
                meson setup "$dir" "$TIER_ROOT" "$@" || return
        fi
        ninja -C "$dir"
}
