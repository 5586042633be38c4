#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-sandbox.sh: tierd works inside the limits tierd.service sets, without
# systemd: root with no capability but CAP_IPC_LOCK (CapabilityBoundingSet=,
# AmbientCapabilities=), no new privileges (NoNewPrivileges=), and the
# system call rules of MemoryDenyWriteExecute= and
# RestrictAddressFamilies=AF_UNIX (tests/systemd/sandbox-run).  The host
# pool must still be locked, and a real client (client/examples/train-step)
# must run through every tier.
#
# usage: test-sandbox.sh SANDBOX-RUN    (run by meson test; needs $TIER_BUILD)
set -euo pipefail

sandbox_run=${1:?usage: test-sandbox.sh SANDBOX-RUN}
build=${TIER_BUILD:?TIER_BUILD is not set (run through meson test)}
if ((EUID != 0)); then
        echo "not root: skipped"
        exit 77
fi
if ! command -v setpriv >/dev/null; then
        echo "setpriv (util-linux) not found: skipped"
        exit 77
fi
rc=0
"$sandbox_run" --self-test || rc=$?
if ((rc == 77)); then
        echo "seccomp not available: skipped"
        exit 77
fi
((rc == 0)) || {
        echo "FAIL: the sandbox does not refuse what it should" >&2
        exit 1
}

dir=$(mktemp -d /var/tmp/tierd-sandbox.XXXXXX)
pid=
cleanup() {
        if [[ -n $pid ]]; then
                kill -KILL "$pid" 2>/dev/null || true
                wait "$pid" 2>/dev/null || true
        fi
        rm -rf "$dir"
}
trap cleanup EXIT
fail=0
bad() {
        echo "FAIL: $*" >&2
        fail=1
}

# 32M of pool with an 8M memlock limit: locking it needs CAP_IPC_LOCK
cat >"$dir/tierd.conf" <<EOF
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
target = $dir/t0.img:128M
EOF

# setpriv: only CAP_IPC_LOCK in every set (as the unit's bounding and ambient
# sets leave root), no new privileges; then the seccomp rules; then tierd.
# ASan needs no more than that; its leak check is off here because LeakSanitizer
# stops the process with ptrace, which the sandbox is not about.
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
        prlimit --memlock=8388608 \
        setpriv --bounding-set=-all,+ipc_lock --inh-caps=-all,+ipc_lock --ambient-caps=-all,+ipc_lock \
        --no-new-privs -- \
        "$sandbox_run" -- "$build/daemon/tierd" --config "$dir/tierd.conf" --socket "$dir/tierd.sock" \
        --state-dir "$dir" --log-target stderr >"$dir/tierd.log" 2>&1 &
pid=$!
# until tierd answers, it exits, or 30 s passed (600 naps of 50 ms: a bound for "never", under ASan too)
answered=0
for _ in $(seq 600); do
        if "$build/client/tierctl" --socket "$dir/tierd.sock" status >/dev/null 2>&1; then
                answered=1
                break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
done
if ! kill -0 "$pid" 2>/dev/null; then
        cat "$dir/tierd.log" >&2
        echo "FAIL: tierd did not start in the sandbox" >&2
        exit 1
fi
if ((!answered)); then
        cat "$dir/tierd.log" >&2
        echo "FAIL: tierd did not answer within 30 s in the sandbox" >&2
        exit 1
fi

status=/proc/$pid/status
echo "tierd in the sandbox: $(grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' "$status" | tr -s '\t ' ' ' | paste -sd, -)"
# CAP_IPC_LOCK is capability 14
[[ $(awk '/^CapEff:/ { print $2 }' "$status") == 0000000000004000 ]] || bad "tierd has capabilities other than CAP_IPC_LOCK"
[[ $(awk '/^NoNewPrivs:/ { print $2 }' "$status") == 1 ]] || bad "no_new_privs is not set"
[[ $(awk '/^Seccomp:/ { print $2 }' "$status") == 2 ]] || bad "no seccomp filter"

grep -q ' locked' "$dir/tierd.log" && ! grep -q 'NOT locked' "$dir/tierd.log" ||
        bad "the host pool is not locked with CAP_IPC_LOCK alone"

if "$build/client/train-step" --socket "$dir/tierd.sock" --job sandboxed --tensors 4 --size 1048576 \
        --steps 1 >"$dir/train-step.log" 2>&1; then
        echo "train-step through every tier: OK ($(tail -n1 "$dir/train-step.log"))"
else
        cat "$dir/train-step.log" >&2
        bad "train-step failed against the sandboxed tierd"
fi

kill -TERM "$pid"
st=0
wait "$pid" || st=$?
pid=
((st == 0)) || bad "tierd exited with status $st after SIGTERM"
if ((fail)); then
        cat "$dir/tierd.log" >&2
        exit 1
fi
echo "OK"
