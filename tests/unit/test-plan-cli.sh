#!/bin/sh
# SPDX-License-Identifier: MIT
# test-plan-cli.sh TIERCTL: tierctl plan's options: exit 2 with a reason for impossible
# inputs, --help, and --json with model_state_bytes (no tierd needed).
set -u
T=$1
# no bench results of this machine's user: only --bench FILE below
XDG_CACHE_HOME=/nonexistent/tierd-plan-test
export XDG_CACHE_HOME
HW="--vram 16G --host-ram 64G --link 25 --tflops 100"
fails=0

# usage_error EXPECTED_TEXT ARGS...: exit status 2 and EXPECTED_TEXT on stderr
usage_error() {
        want=$1; shift
        err=$("$T" plan "$@" 2>&1 >/dev/null); rc=$?
        if [ "$rc" -ne 2 ] || ! printf '%s' "$err" | grep -qF -- "$want"; then
                echo "FAIL: tierctl plan $*: exit $rc, '$err' (wanted 2 and '$want')"
                fails=$((fails + 1))
        fi
}

usage_error "--params '-1'" --params -1 $HW
usage_error "--params '13X'" --params 13X $HW
usage_error "no model" $HW
usage_error "not both" --params 13B --layers 2 $HW
usage_error "all of --layers" --layers 2 --hidden 4 $HW
usage_error "--drives is 0" --params 13B $HW --placement B
usage_error "--drive-read and --drive-write" --params 13B $HW --drives 1
usage_error "give --tflops" --params 13B --vram 16G --host-ram 64G --link 25
usage_error "--vram '-16G'" --params 13B --vram -16G
usage_error "--drive-read '-3'" --params 13B $HW --drives 1 --drive-read -3
usage_error "--placement 'D'" --params 13B $HW --placement D
usage_error "unknown option '--bogus'" --bogus
usage_error "unexpected argument 'extra'" --params 13B $HW extra

if ! "$T" plan --help | grep -q "Usage: tierctl plan"; then
        echo "FAIL: tierctl plan --help"; fails=$((fails + 1))
fi
out=$("$T" plan --json --params 13B $HW --drives 1 --drive-read 3.5 --drive-write 3 --micro-batch 4)
if ! printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["model_state_bytes"] == 208000000000, d["model_state_bytes"]
assert d["verdict"] == "placement" and d["placement"] == "B", d
b = d["placements"]["B"]
assert b["nvme_read_bytes"] == 156000000000 and b["drives_needed"] == 16, b
assert d["placements"]["A"]["fits_host"] is False
'; then
        echo "FAIL: tierctl plan --json: $out"; fails=$((fails + 1))
fi
# a count past 2^63 is its value (it was 2^63: llround()), past 2^64 null
out=$("$T" plan --json --no-tierd --params 2e18 $HW)
if ! printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["class_bytes"]["moments"] == 16 * 10**18, d["class_bytes"]
assert d["class_bytes"]["master"] == 8 * 10**18, d["class_bytes"]
assert d["model_state_bytes"] is None, d["model_state_bytes"]
'; then
        echo "FAIL: tierctl plan --json --params 2e18: $out"; fails=$((fails + 1))
fi
# hardware from `tierctl bench` results: best striped non-suspect read 6.0 over 2 targets -> 3.0 per
# drive, write the sustained 2.0 -> 1.0 per drive; a flag wins over the file; sources say which
FIX=$(dirname "$0")/data/bench-fixture.json
out=$("$T" plan --json --no-tierd --bench "$FIX" --params 13B --vram 16G --host-ram 64G --tflops 100 --drives 2 --drive-read 7)
if ! printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
h, s = d["hardware"], d["sources"]
assert h["drive_read_gbps"] == 7 and s["drive_read_gbps"] == "flag", d
assert h["drive_write_gbps"] == 1.0 and s["drive_write_gbps"].startswith("bench:"), d
assert s["link_gbps"] == "default" and h["link_gbps"] == 25, d
assert any("sustained" in n for n in d["notes"]), d
'; then
        echo "FAIL: tierctl plan --bench: $out"; fails=$((fails + 1))
fi
usage_error "cannot read --bench" --no-tierd --bench /nonexistent/bench.json --params 13B $HW
usage_error "both --vram-limit and --host-limit" --no-tierd --no-bench --params 13B $HW --vram-limit 1G
usage_error "--phase-times '1,2'" --no-tierd --params 13B $HW --phase-times 1,2
# plain decimal numbers only: no hexadecimal, no sign or blank, no fourth number
usage_error "--phase-times '0x10,34,16'" --no-tierd --params 13B $HW --phase-times 0x10,34,16
usage_error "--phase-times ' 16,34,16'" --no-tierd --params 13B $HW --phase-times ' 16,34,16'
usage_error "--phase-times '+16,34,16'" --no-tierd --params 13B $HW --phase-times +16,34,16
usage_error "--phase-times '16,34,16,'" --no-tierd --params 13B $HW --phase-times 16,34,16,
usage_error "--phase-times '16,,16'" --no-tierd --params 13B $HW --phase-times 16,,16
usage_error "cannot hold two backward phases" --no-tierd --no-bench --params 8M --blocks 8 --vram-limit 1M \
        --host-limit 64M --drives 1 --drive-read 1 --drive-write 1 --link 1 --tflops 1
LIM="--no-tierd --no-bench --params 8M --vram 16G --host-ram 64G --drives 1 --drive-read 1 --drive-write 1 --link 1 --tflops 1"
usage_error "give --vram-limit and --host-limit too" $LIM --plan /nonexistent/plan.json
usage_error "cannot read --plan /nonexistent/plan.json" $LIM --vram-limit 1G --host-limit 1G \
        --plan /nonexistent/plan.json
plan=$(mktemp) || exit 1
printf '{"tensors":[{"name":"w","size":1048576}],"phases":[{"kind":"f","access":[[0,"vram","r"]]},' > "$plan"
printf '{"kind":"o","access":[[0,"host","rw"]]}]}' >> "$plan"
usage_error "cannot hold phases 0 and 1" $LIM --vram-limit 512K --host-limit 1G --plan "$plan"
printf '{"tensors":[{"name":"w","size":1048576}],"phases":[{"kind":"q","access":[]}]}' > "$plan.bad"
usage_error "phases.0.kind" $LIM --vram-limit 1G --host-limit 1G --plan "$plan.bad"
# a size as JSON spells numbers: not hexadecimal, nothing after it
printf '{"tensors":[{"name":"w","size":0x100000}],"phases":[{"kind":"f","access":[[0,"vram","r"]]}]}' > "$plan.bad"
usage_error "tensors.0.size" $LIM --vram-limit 1G --host-limit 1G --plan "$plan.bad"
printf '{"tensors":[{"name":"w","size":1048576.5}],"phases":[{"kind":"f","access":[[0,"vram","r"]]}]}' > "$plan.bad"
usage_error "tensors.0.size" $LIM --vram-limit 1G --host-limit 1G --plan "$plan.bad"
printf '{"tensors":[{"name":"w","size":1048576abc}],"phases":[{"kind":"f","access":[[0,"vram","r"]]}]}' > "$plan.bad"
usage_error "tensors.0.size" $LIM --vram-limit 1G --host-limit 1G --plan "$plan.bad"
# a plan that fits: W goes to VRAM once a step and comes back rewritten, nothing touches NVMe
out=$("$T" plan --json $LIM --vram-limit 4M --host-limit 4M --plan "$plan") || { echo "FAIL: --plan"; fails=$((fails + 1)); }
case $out in
*'"link_down_bytes":1048576,"link_up_bytes":0,"nvme_read_bytes":0,'*) ;;
*) echo "FAIL: --plan replay: $out" | head -c 2000; fails=$((fails + 1)) ;;
esac
rm -f "$plan" "$plan.bad"
# output that cannot be written (a full disk) is a failure, not exit 0
if [ -w /dev/full ]; then
        for fmt in "" --json; do
                err=$("$T" plan $fmt --no-bench --no-tierd --params 13B --vram 16G --host-ram 64G --tflops 100 \
                        2>&1 >/dev/full); rc=$?
                case "$rc:$err" in
                1:*"cannot write the output"*) ;;
                *) echo "FAIL: plan $fmt >/dev/full: exit $rc: $err"; fails=$((fails + 1)) ;;
                esac
        done
fi
[ "$fails" -eq 0 ] && echo "ok" 
exit $((fails != 0))
