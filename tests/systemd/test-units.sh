#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-units.sh: the installed units pass "systemd-analyze verify" without a
# single message, score at most 2.0 in "systemd-analyze security", and the
# sysusers.d/tmpfiles.d snippets do what they say.
#
# usage: test-units.sh [--have-man=0|1] [...]   (run by meson test; needs $TIER_BUILD)
#
# The build is installed into a temporary DESTDIR, which then serves as the
# --root of systemd-analyze: ExecStart= must name the installed tierd, and
# Documentation=man: pages are looked up in the installed man pages.  The
# targets the units hang off (sysinit.target, sockets.target, ...) and
# /bin/kill (ExecReload=) are copied in from the host, as on a real system.
set -euo pipefail

# The goal of the issue; systemd 252 gives the shipped unit 1.1.
EXPOSURE_MAX=2.0

have_man=1
for arg in "$@"; do
        case $arg in
        --have-man=*) have_man=${arg#*=} ;;
        esac
done

build=${TIER_BUILD:?TIER_BUILD is not set (run through meson test)}
for prog in systemd-analyze:systemd meson:meson; do
        if ! command -v "${prog%%:*}" >/dev/null; then
                echo "${prog%%:*} not found (Debian package ${prog#*:}): skipped"
                exit 77
        fi
done

root=$(mktemp -d "${TMPDIR:-/tmp}/tierd-units.XXXXXX")
trap 'rm -rf "$root"' EXIT
fail=0
bad() {
        echo "FAIL: $*" >&2
        fail=1
}

meson install -C "$build" --no-rebuild --quiet --destdir "$root" >/dev/null

service=$(find "$root" -name tierd.service -path '*/systemd/system/*' | head -n1)
socket=$(find "$root" -name tierd.socket -path '*/systemd/system/*' | head -n1)
[[ -n $service && -n $socket ]] || {
        echo "FAIL: tierd.service or tierd.socket not installed under $root" >&2
        find "$root" >&2
        exit 1
}
echo "units: ${service#"$root"} ${socket#"$root"}"

# ---- the rest of a system, for --root ---------------------------------------------
for dir in /usr/lib/systemd/system /lib/systemd/system; do
        if [[ -d $dir ]]; then
                mkdir -p "$root/usr/lib/systemd/system"
                find "$dir" -maxdepth 1 \( -name '*.target' -o -name '*.slice' \) -type f \
                        -exec cp -n {} "$root/usr/lib/systemd/system/" \;
                break
        fi
done
kill_path=$(sed -n 's/^ExecReload=\([^ ]*\).*/\1/p' "$service")
if [[ $kill_path == /* && ! -e $root$kill_path ]]; then
        kill_prog=$(type -P kill || true)
        if [[ -z $kill_prog ]]; then
                echo "FAIL: no kill(1) program to put at $kill_path (ExecReload=): install Debian's procps" >&2
                exit 1
        fi
        mkdir -p "$root$(dirname "$kill_path")"
        cp "$kill_prog" "$root$kill_path"
fi
man_args=()
if ((have_man)); then
        if ! command -v man >/dev/null; then
                echo "FAIL: no man(1) to check the units' Documentation=man: pages with: install Debian's man-db" >&2
                exit 1
        fi
        mandir=$(dirname "$(dirname "$(find "$root" -name tierd.8 | head -n1)")")
        export MANPATH=$mandir
        echo "man pages: ${mandir#"$root"}"
else
        man_args=(--man=no)
        echo "no man pages in this build (scdoc missing): Documentation= not checked"
fi

# ---- systemd-analyze verify: no output at all -----------------------------------
out=$(systemd-analyze verify --root="$root" "${man_args[@]}" "$service" "$socket" 2>&1) || bad "systemd-analyze verify failed"
if [[ -n $out ]]; then
        printf '%s\n' "$out" >&2
        bad "systemd-analyze verify printed messages"
else
        echo "systemd-analyze verify: clean"
fi

# The unit starts the tierd that was installed.
exec_start=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$service")
[[ -x $root$exec_start ]] || bad "ExecStart=$exec_start is not the installed tierd"
grep -qE '@[a-z_]+@' "$service" && bad "unsubstituted @variable@ left in tierd.service"
grep -qx 'Type=notify' "$service" || bad "tierd.service is not Type=notify"
grep -q '^WatchdogSec=' "$service" || bad "tierd.service has no WatchdogSec="
# a refused configuration (tierd(8) EXIT STATUS 6) is not restarted in a loop by Restart=on-failure
grep -qx 'RestartPreventExitStatus=6' "$service" || bad "tierd.service does not keep exit status 6 from a restart"
grep -qx 'After=nss-user-lookup.target' "$service" || bad "tierd.service is not ordered after nss-user-lookup.target"
grep -qx 'ListenSequentialPacket=/run/tierd/tierd.sock' "$socket" || bad "tierd.socket: unexpected listener"

# ---- systemd-analyze security --offline=yes ------------------------------------
sec=$(systemd-analyze security --offline=yes --root="$root" "$service" 2>&1) || bad "systemd-analyze security failed"
score=$(sed -n 's/.*Overall exposure level for tierd.service: \([0-9.]*\).*/\1/p' <<<"$sec")
if [[ -z $score ]]; then
        printf '%s\n' "$sec" >&2
        bad "no exposure level in the output of systemd-analyze security"
else
        echo "systemd-analyze security --offline=yes: exposure $score (goal <= $EXPOSURE_MAX)"
        if ! awk -v s="$score" -v max="$EXPOSURE_MAX" 'BEGIN { exit !(s <= max) }'; then
                grep '✗' <<<"$sec" >&2 || true
                bad "exposure $score is above $EXPOSURE_MAX"
        fi
fi

# ---- sysusers.d and tmpfiles.d snippets, applied to the root ---------------------
sysusers=$(find "$root" -path '*/sysusers.d/tierd.conf' | head -n1)
tmpfiles=$(find "$root" -path '*/tmpfiles.d/tierd.conf' | head -n1)
[[ -n $sysusers && -n $tmpfiles ]] || bad "sysusers.d or tmpfiles.d snippet not installed"
if command -v systemd-sysusers >/dev/null && [[ -n $sysusers ]]; then
        mkdir -p "$root/etc"
        systemd-sysusers --root="$root" "$sysusers" || bad "systemd-sysusers refused ${sysusers#"$root"}"
        grep -q '^tier:' "$root/etc/group" || bad "sysusers did not create group tier"
        grep -q '^tier-admin:' "$root/etc/group" || bad "sysusers did not create group tier-admin"
        echo "systemd-sysusers: groups $(grep -o '^tier[^:]*' "$root/etc/group" | paste -sd,)"
fi
if command -v systemd-tmpfiles >/dev/null && [[ -n $tmpfiles ]]; then
        systemd-tmpfiles --root="$root" --create "$tmpfiles" || bad "systemd-tmpfiles refused ${tmpfiles#"$root"}"
        [[ $(stat -c %a "$root/var/lib/tierd" 2>/dev/null) == 750 ]] || bad "/var/lib/tierd is not 0750"
        [[ -d $root/run/tierd ]] || bad "/run/tierd was not created"
        echo "systemd-tmpfiles: /var/lib/tierd $(stat -c %a "$root/var/lib/tierd"), /run/tierd $(stat -c %a "$root/run/tierd")"
fi

if ((fail)); then
        exit 1
fi
echo "OK"
