#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-install.sh: "meson install --destdir" lays out every file, and an
# outside program builds against the installed libtier with pkg-config and
# talks to the installed tierd.
#
# usage: test-install.sh [--have-man=0|1] [--sanitize=none|address,...] [--cc="cc ..."]
#        (run by meson test; needs $TIER_BUILD and $TIER_SOURCE)
set -euo pipefail

have_man=1 sanitize=none cc=cc
for arg in "$@"; do
        case $arg in
        --have-man=*) have_man=${arg#*=} ;;
        --sanitize=*) sanitize=${arg#*=} ;;
        --cc=*) cc=${arg#*=} ;;
        esac
done

build=${TIER_BUILD:?TIER_BUILD is not set (run through meson test)}
source=${TIER_SOURCE:?TIER_SOURCE is not set (run through meson test)}
for prog in meson pkg-config; do
        if ! command -v "$prog" >/dev/null; then
                echo "$prog not found: skipped"
                exit 77
        fi
done

dest=$(mktemp -d "${TMPDIR:-/tmp}/tierd-install.XXXXXX")
pid=
cleanup() {
        if [[ -n $pid ]]; then
                kill -KILL "$pid" 2>/dev/null || true
                wait "$pid" 2>/dev/null || true
        fi
        rm -rf "$dest"
}
trap cleanup EXIT
fail=0
bad() {
        echo "FAIL: $*" >&2
        fail=1
}

meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >/dev/null

# ---- the layout ------------------------------------------------------------------
# One pattern per file that must land (find -path, below DESTDIR).
expect=(
        '*/bin/tierd'
        '*/bin/tierctl'
        '*/lib*/libtier.so'
        '*/lib*/libtier.so.1'
        '*/include/tier.h'
        '*/pkgconfig/tier.pc'
        '*/systemd/system/tierd.service'
        '*/systemd/system/tierd.socket'
        '*/sysusers.d/tierd.conf'
        '*/tmpfiles.d/tierd.conf'
        '*/etc/tierd/tierd.conf'
)
if ((have_man)); then
        expect+=('*/man8/tierd.8' '*/man1/tierctl.1' '*/man5/tierd.conf.5' '*/man3/libtier.3')
else
        echo "no man pages in this build (scdoc missing): not checked"
fi
echo "installed:"
(cd "$dest" && find . \( -type f -o -type l \) | sort | sed 's/^\./    /')
for pattern in "${expect[@]}"; do
        [[ -n $(find "$dest" -path "$pattern" \( -type f -o -type l \) | head -n1) ]] || bad "nothing installed as $pattern"
done

# Everything meson says it installs is there.
while IFS= read -r path; do
        [[ -e $dest$path || -L $dest$path ]] || bad "meson lists $path, but it is not in DESTDIR"
done < <(meson introspect --installed "$build" | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin).values()))')

# The man pages are roff and name themselves.
if ((have_man)); then
        for page in man8/tierd.8 man1/tierctl.1 man5/tierd.conf.5 man3/libtier.3; do
                f=$(find "$dest" -path "*/$page" | head -n1)
                [[ -n $f ]] && ! grep -q '^\.TH' "$f" && bad "$page is not a man page"
        done
fi

# man(1) finds a page for every function of libtier, a group page's other functions through
# their aliases (.so man3/tier_pin.3 installed as tier_pin_async.3), and renders them.
if ((have_man)) && command -v man >/dev/null; then
        man3=$(find "$dest" -path '*/man3/libtier.3' | head -n1)
        mandir=$(dirname "$(dirname "$man3")")
        echo "man -M $mandir:"
        functions=$(sed -n '/global:/,/local:/p' "$source/client/libtier.sym" | sed -n 's/^[[:space:]]*\(tier_[a-z0-9_]*\);.*/\1/p')
        [[ $(wc -w <<<"$functions") -ge 60 ]] || bad "found $(wc -w <<<"$functions") functions in client/libtier.sym"
        for fn in $functions; do
                found=$(man -M "$mandir" -w "$fn" 2>/dev/null) || true
                [[ -n $found && -f $found && $found == "$mandir"/* ]] || bad "man -M ... -w $fn finds no installed page ('$found')"
        done
        for fn in tier_pin tier_pin_async; do
                echo "    man -w $fn: $(man -M "$mandir" -w "$fn" 2>&1)"
                text=$(MANPAGER=cat MANWIDTH=80 man -M "$mandir" "$fn" 2>&1) || bad "man -M ... $fn failed: $text"
                [[ $text == *tier_pin* && $text == *"$fn"* ]] || bad "man -M ... $fn renders no text naming it: $(head -c 300 <<<"$text")"
        done
elif ((have_man)); then
        echo "man(1) not found: the installed pages are not looked up"
fi

# tierd looks for its configuration where the sample one was installed.
tierd=$(find "$dest" -path '*/bin/tierd' | head -n1)
conf_default=$("$tierd" --help | sed -n 's/.*configuration file (default \(.*\)).*/\1/p')
echo "tierd's default configuration: $conf_default"
[[ $conf_default == /* ]] || bad "the default configuration path '$conf_default' is not absolute"
[[ -f $dest$conf_default ]] || bad "the sample configuration is not installed at tierd's default $conf_default"
# and its drop-in directory, where tierctl(1) tells "tierctl bench --write-config" to write one
[[ -d $dest$conf_default.d ]] || bad "the drop-in directory $conf_default.d is not installed"

# The sample configuration shows every key at its default ("Every key below shows its default"):
# with each "#key = value" line uncommented (not those of the commented-out [quota] examples) it
# sets every key tierd has, each to what tierd --check-config prints when nothing is set.
sample=$dest$conf_default
awk '/^\[/ { q = 0 } /^#\[/ { q = 1 } !q && /^#[a-z_]+ =/ { sub(/^#/, "") } { print }' "$sample" >"$dest/all-set.conf"
keys() {
        awk '/^\[/ { s = $0 } /^[a-z_]+ =/ { print s " " $1 }' | sort
}
# (a state directory of the test's own: --check-config reads the NVMe index there, and the
# machine's own /var/lib/tierd, if tierd is installed, is none of this test's business)
mkdir -m 0750 "$dest/state"     # 0750 whatever the umask: tierd refuses a state directory others can write
defaults=$("$tierd" --check-config --config "$sample" --state-dir "$dest/state" 2>&1) ||
        bad "tierd --check-config refused the sample configuration: $defaults"
# (what the sample says of state_dir, and of the default target, which lies in it: as without --state-dir)
state_default=$(sed -n 's/^#state_dir = //p' "$sample")
all_set=$("$tierd" --check-config --config "$dest/all-set.conf" --state-dir "$dest/state" 2>&1) ||
        bad "tierd --check-config refused the sample configuration uncommented: $all_set"
defaults=${defaults//"$dest/state"/$state_default}
all_set=${all_set//"$dest/state"/$state_default}
missing=$(comm -23 <(keys <<<"$defaults") <(keys <"$dest/all-set.conf"))
[[ -z $missing ]] || bad "keys of tierd --check-config missing from the sample configuration: $(paste -sd, <<<"$missing")"
if [[ $defaults != "$all_set" ]]; then
        diff <(cat <<<"$defaults") <(cat <<<"$all_set") >&2 || true
        bad "the sample configuration, uncommented, is not tierd's defaults (< defaults, > uncommented)"
fi

# ---- pkg-config against the DESTDIR ------------------------------------------------
pc=$(find "$dest" -name tier.pc | head -n1)
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR=$dest
flags=$(pkg-config --cflags --libs tier)
echo "pkg-config --cflags --libs tier: $flags"
pkg-config --modversion tier >/dev/null || bad "pkg-config --modversion tier failed"
[[ $flags == *"-I$dest/"* && $flags == *"-L$dest/"* && $flags == *-ltier* ]] || bad "pkg-config flags do not point into DESTDIR"

san_flags=()
if [[ $sanitize != none && -n $sanitize ]]; then
        # libtier.so of a sanitizer build needs the runtime linked first
        san_flags=("-fsanitize=$sanitize")
        export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
fi
# shellcheck disable=SC2086  # word splitting of $cc and $flags is wanted
$cc -Wall -Wextra -Werror "${san_flags[@]}" -o "$dest/train-step" \
        "$source/client/examples/train-step.c" $flags || bad "client/examples/train-step.c does not build against the installed libtier"

# ---- the installed pieces work together ----------------------------------------
libdir=$(dirname "$(find "$dest" -name 'libtier.so.1' | head -n1)")
tierctl=$(find "$dest" -path '*/bin/tierctl' | head -n1)
run=$dest/run
mkdir -m 0750 "$run"
cat >"$run/tierd.conf" <<EOF
[host]
capacity = 32M
segment_size = 8M
job_limit = 16M
[vram]
backend = emulated
capacity = 16M
chunk_size = 4M
job_limit = 8M
[nvme]
target = $run/t0.img:128M
EOF
"$tierd" --config "$run/tierd.conf" --socket "$run/tierd.sock" --state-dir "$run" --log-target stderr \
        >"$run/tierd.log" 2>&1 &
pid=$!
# until tierd answers, it exits, or 30 s passed (600 naps of 50 ms: a bound for "never", under ASan too)
answered=0
for _ in $(seq 600); do
        if LD_LIBRARY_PATH=$libdir "$tierctl" --socket "$run/tierd.sock" status >/dev/null 2>&1; then
                answered=1
                break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
done
if ((!answered)); then
        cat "$run/tierd.log" >&2
        if kill -0 "$pid" 2>/dev/null; then
                echo "FAIL: the installed tierd did not answer within 30 s" >&2
        else
                echo "FAIL: the installed tierd exited before it answered" >&2
        fi
        exit 1
fi
if [[ -x $dest/train-step ]]; then
        if LD_LIBRARY_PATH=$libdir "$dest/train-step" --socket "$run/tierd.sock" --job installed \
                --tensors 4 --size 1048576 --steps 1 >"$run/train-step.log" 2>&1; then
                echo "installed train-step against installed tierd: OK ($(tail -n1 "$run/train-step.log"))"
        else
                cat "$run/train-step.log" >&2
                bad "train-step built with pkg-config failed against the installed tierd"
        fi
        # capture first: "ldd | grep -q" fails under pipefail when grep exits early
        libs=$(ldd "$dest/train-step" 2>/dev/null || true)
        libs_ld=$(LD_LIBRARY_PATH=$libdir ldd "$dest/train-step" 2>/dev/null || true)
        case "$libs$libs_ld" in
        *"$libdir/libtier.so.1"*) ;;
        *) bad "train-step does not load the installed libtier" ;;
        esac
fi
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
if ((status != 0)); then
        cat "$run/tierd.log" >&2
        bad "the installed tierd exited with status $status after SIGTERM"
fi

if ((fail)); then
        exit 1
fi
echo "OK"
