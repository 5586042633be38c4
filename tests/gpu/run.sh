#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/run.sh: the cuda VRAM backend on a real GPU: integration tests and bandwidth, one JSON file.
#
# usage: tests/gpu/run.sh [OUTDIR]
#   OUTDIR  where gpu-results.json and the step logs go (default: $OUT, else ./gpu-results)
#
# Meant for a machine with an NVIDIA GPU and its driver, and nothing else:
# no compiler, no package registry.  Carry build-gpu/ along, made here by
# tests/gpu/prepare.sh (the programs, plus the libraries they need beyond
# glibc in build-gpu/runtime-libs, used only where that machine lacks its own).
# Run it as root (tierd locks its host pool).
#
# Environment: TIER_GPU_BUILD (default build-gpu), TIER_GPU_BENCH_SIZE (4G, at
# least 4 GiB is the point), TIER_GPU_BENCH_TENSOR (256M), TIER_GPU_BENCH_ROUNDS (3),
# TIER_GPU_LIBCUDA (a driver library in place of libcuda.so.1: only for a dry
# run of this script without a GPU, on build-gpu/tests/libcuda-fake.so with
# TIER_GPU_BENCH_SIZE=256M; its numbers mean nothing).
#
# Steps, each under a time limit and in its own process group, which is
# killed afterwards (a tierd a step leaves behind goes with it; at exit any
# process running this build's tierd is killed too):
#   build   use the carried build; build it only if it is missing and meson is here
#   probe   a usable CUDA device?  None: "no CUDA device: REASON", exit 77
#   vmm     tests/vmm-probe: which VMM mappings the driver allows (a chunk
#           exported by fd, imported in another process, mapped whole and in
#           pieces the way libtier maps a tensor spanning chunks): a diagnostic
#           for the tests after it
#   tests   tests/integration/test-cuda on the real driver (two jobs' processes
#           writing VRAM through their own mappings, NVMe round trip, mapping
#           cache, stream-ordered pins, unpin after a pending GPU task, revoke
#           with and without the client's help, SIGKILLed client, host registration)
#   bench   bench/bench-vram-cuda: H2D/D2H GB/s through tierd vs the raw driver
#   train   client/python/examples/train_lm.py with tier.torch on the GPU (placement C,
#           budgets below its state), next to the same model in plain PyTorch on the GPU:
#           losses per step of both (python3 with torch, on that machine; skipped without)
# Exit status: 0 all passed, 77 no CUDA device (skipped), 1 anything failed.
# OUTDIR/gpu-results.json is written whatever happens, with "error" fields.
set -uo pipefail

root=$(CDPATH='' cd -- "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
out=${1:-${OUT:-$root/gpu-results}}
build=${TIER_GPU_BUILD:-$root/build-gpu}
[[ $build == /* ]] || build=$root/$build
bench_size=${TIER_GPU_BENCH_SIZE:-4G}
bench_tensor=${TIER_GPU_BENCH_TENSOR:-256M}
bench_rounds=${TIER_GPU_BENCH_ROUNDS:-3}

# Time limits, seconds: well inside 8 minutes together.
limit_build=240
limit_probe=60
limit_tests=200
limit_bench=150
limit_train=150

mkdir -p "$out" || exit 1
json=$out/gpu-results.json
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tier-gpu.XXXXXX") || exit 1
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)

declare -A step_rc step_secs step_note
steps=()
errors=()
skipped=false
device_json=null
bench_json=null
train_json=null
tests_passed=()
tests_failed=()

log() {
        printf 'run.sh: %s\n' "$*" >&2
}

# json_str TEXT: TEXT as a JSON string, quotes included.
json_str() {
        local s=$1
        s=${s//\\/\\\\}
        s=${s//\"/\\\"}
        s=${s//$'\n'/\\n}
        s=${s//$'\t'/\\t}
        s=${s//$'\r'/}
        s=$(printf '%s' "$s" | tr -d '\000-\010\013\014\016-\037')
        printf '"%s"' "$s"
}

# json_list WORD...: a JSON array of strings.
json_list() {
        local sep='' w
        printf '['
        for w in "$@"; do
                printf '%s%s' "$sep" "$(json_str "$w")"
                sep=,
        done
        printf ']'
}

# bench_field KEY: a number from the bench's JSON line, or null.
bench_field() {
        local v
        v=$(sed -n "s/.*\"$1\":\([-0-9.eE+]*\|null\|true\|false\)[,}].*/\1/p" <<<"$bench_json" | head -n 1)
        printf '%s' "${v:-null}"
}

# Kill every process running this build's tierd: only ours have that path.
kill_our_tierds() {
        local p exe
        for p in /proc/[0-9]*; do
                exe=$(readlink "$p/exe" 2>/dev/null) || continue
                if [[ $exe == "$build/daemon/tierd" ]]; then
                        log "killing tierd ${p#/proc/} left running"
                        kill -KILL "${p#/proc/}" 2>/dev/null
                fi
        done
}

write_json() {
        local ok=true name sep=''
        ((${#errors[@]} == 0)) || ok=false
        $skipped && ok=false
        {
                printf '{"script":"tests/gpu/run.sh","started":%s,"finished":%s,"host":%s,' \
                        "$(json_str "$started")" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" \
                        "$(json_str "$(uname -n) $(uname -r)")"
                printf '"ok":%s,"skipped":%s,"dry_run":%s,' "$ok" "$skipped" \
                        "$([[ -n ${TIER_GPU_LIBCUDA:-} ]] && echo true || echo false)"
                if ((${#errors[@]})); then
                        printf '"error":%s,"errors":%s,' "$(json_str "${errors[0]}")" "$(json_list "${errors[@]}")"
                fi
                printf '"build":%s,"device":%s,' "$(json_str "$build")" "$device_json"
                printf '"nvidia_smi":%s,' "$(json_str "$(cat "$tmp/nvidia-smi" 2>/dev/null)")"
                printf '"steps":{'
                for name in "${steps[@]}"; do
                        printf '%s%s:{"rc":%s,"seconds":%s,"log":%s' "$sep" "$(json_str "$name")" \
                                "${step_rc[$name]}" "${step_secs[$name]}" "$(json_str "$name.log")"
                        [[ -n ${step_note[$name]:-} ]] && printf ',"error":%s' "$(json_str "${step_note[$name]}")"
                        printf '}'
                        sep=,
                done
                printf '},'
                printf '"tests":{"passed":%d,"failed":%d,"passed_tests":%s,"failed_tests":%s},' \
                        "${#tests_passed[@]}" "${#tests_failed[@]}" "$(json_list "${tests_passed[@]}")" \
                        "$(json_list "${tests_failed[@]}")"
                printf '"h2d_gbps":%s,"d2h_gbps":%s,"raw_h2d_gbps":%s,"raw_d2h_gbps":%s,' \
                        "$(bench_field h2d_gbps)" "$(bench_field d2h_gbps)" "$(bench_field raw_h2d_gbps)" \
                        "$(bench_field raw_d2h_gbps)"
                printf '"h2d_ratio":%s,"d2h_ratio":%s,"goal_met":%s,' "$(bench_field h2d_ratio)" \
                        "$(bench_field d2h_ratio)" "$(bench_field goal_met)"
                printf '"train":%s,' "$train_json"
                printf '"bench":%s}\n' "$bench_json"
        } >"$json.tmp" && mv "$json.tmp" "$json"
}

finish() {
        local rc=$?
        trap - EXIT INT TERM
        kill_our_tierds
        write_json
        rm -rf "$tmp"
        log "results in $json"
        $skipped && exit 77
        if ((${#errors[@]})); then
                log "FAILED: ${errors[*]}"
                exit 1
        fi
        exit "$rc"
}
trap finish EXIT
trap 'errors+=("interrupted"); exit 1' INT TERM

# run_step NAME SECONDS COMMAND...: run COMMAND with output in OUTDIR/NAME.log
# under a time limit, in a process group of its own that is killed afterwards.
run_step() {
        local name=$1 secs=$2 pid rc t0
        shift 2
        steps+=("$name")
        t0=$(date +%s)
        log "step $name (at most $secs s): $*"
        set -m          # background jobs get their own process group
        timeout --kill-after=10 "$secs" "$@" >"$out/$name.log" 2>&1 &
        pid=$!
        set +m
        wait "$pid"
        rc=$?
        kill -KILL -- "-$pid" 2>/dev/null
        step_rc[$name]=$rc
        step_secs[$name]=$(($(date +%s) - t0))
        if ((rc == 124 || rc == 137)); then
                step_note[$name]="timed out after $secs s"
        fi
        return "$rc"
}

# Link the copied libraries the loader cannot find here (or finds too old) into $tmp/libs.
setup_libs() {
        local p lib
        mkdir -p "$tmp/libs"
        export LD_LIBRARY_PATH=$build/client:$tmp/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        for _ in 1 2 3 4; do
                local missing=()
                for p in daemon/tierd client/tierctl tests/integration/test-cuda tests/vmm-probe bench/bench-vram-cuda; do
                        [[ -e $build/$p ]] || continue
                        while read -r lib; do
                                missing+=("$lib")
                        done < <(ldd "$build/$p" 2>&1 | sed -n \
                                -e 's/^[[:space:]]*\([^[:space:]]*\) => not found.*/\1/p' \
                                -e "s/^.*: \/.*\/\([^/:]*\): version .* not found.*/\1/p")
                done
                ((${#missing[@]})) || return 0
                local added=0
                for lib in $(printf '%s\n' "${missing[@]}" | sort -u); do
                        if [[ -e $build/runtime-libs/$lib && ! -e $tmp/libs/$lib ]]; then
                                ln -s "$build/runtime-libs/$lib" "$tmp/libs/$lib"
                                log "using the carried $lib"
                                added=1
                        fi
                done
                ((added)) || { errors+=("libraries missing here and not carried: $(printf '%s ' "${missing[@]}")"); return 1; }
        done
}

# ---- build ---------------------------------------------------------------------------------------
command -v nvidia-smi >/dev/null 2>&1 &&
        timeout 30 nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total,memory.used \
                --format=csv,noheader >"$tmp/nvidia-smi" 2>&1

if [[ -x $build/daemon/tierd && -x $build/tests/integration/test-cuda && -x $build/bench/bench-vram-cuda ]]; then
        log "using the build in $build"
elif command -v meson >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
        run_step build "$limit_build" "$root/tests/gpu/prepare.sh" "$build" ||
                errors+=("build: cannot build $build (see build.log)")
else
        errors+=("no build in $build and no meson/ninja to make one: run tests/gpu/prepare.sh where the CUDA toolkit is and carry $build")
fi
((${#errors[@]})) && exit 1
setup_libs || exit 1
export TIER_BUILD=$build
unset TIER_LIBCUDA TIER_FAKE_CUDA       # the real driver, libcuda.so.1...
if [[ -n ${TIER_GPU_LIBCUDA:-} ]]; then # ...unless this is a dry run
        export TIER_LIBCUDA=$TIER_GPU_LIBCUDA
        log "DRY RUN on $TIER_LIBCUDA, not on a GPU"
fi

# ---- probe ---------------------------------------------------------------------------------------
run_step probe "$limit_probe" "$build/bench/bench-vram-cuda" --probe
rc=${step_rc[probe]}
if ((rc == 77)); then
        skipped=true
        why=$(grep -m 1 '^no CUDA device' "$out/probe.log")
        errors+=("${why:-no CUDA device}")
        log "${why:-no CUDA device}"
        exit 77
elif ((rc != 0)); then
        errors+=("probe: exit status $rc (see probe.log)")
        exit 1
fi
device_json=$(grep -m 1 '^{"bench":"vram-cuda-probe"' "$out/probe.log") || device_json=null
if [[ $(id -u) != 0 ]]; then
        errors+=("not root: tierd cannot lock its host pool")
        exit 1
fi

# ---- vmm -----------------------------------------------------------------------------------------
if [[ -x $build/tests/vmm-probe ]]; then
        run_step vmm "$limit_probe" "$build/tests/vmm-probe" 64 ||
                errors+=("vmm: exit status ${step_rc[vmm]}${step_note[vmm]:+ (${step_note[vmm]})}: the driver refused a mapping libtier needs (see vmm.log)")
fi

# ---- tests ---------------------------------------------------------------------------------------
run_step tests "$limit_tests" "$build/tests/integration/test-cuda"
rc=${step_rc[tests]}
mapfile -t tests_passed < <(sed -n 's/^\[ *OK *\] \(test_[A-Za-z0-9_]*\).*/\1/p' "$out/tests.log" | sort -u)
mapfile -t tests_failed < <(sed -n 's/^\[ *FAILED *\] \(test_[A-Za-z0-9_]*\).*/\1/p' "$out/tests.log" | sort -u)
if ((rc != 0)); then
        errors+=("tests: exit status $rc${step_note[tests]:+ (${step_note[tests]})}, failed: ${tests_failed[*]:-?} (see tests.log)")
fi

# ---- bench ---------------------------------------------------------------------------------------
run_step bench "$limit_bench" "$build/bench/bench-vram-cuda" --size "$bench_size" --tensor "$bench_tensor" \
        --rounds "$bench_rounds"
rc=${step_rc[bench]}
bench_json=$(grep -m 1 '^{"bench":"vram-cuda",' "$out/bench.log") || bench_json=null
if ((rc != 0)) || [[ $bench_json == null ]]; then
        errors+=("bench: exit status $rc${step_note[bench]:+ (${step_note[bench]})} (see bench.log)")
        bench_json=null
fi

# ---- train ---------------------------------------------------------------------------------------
if command -v python3 >/dev/null 2>&1 && python3 -c 'import torch' 2>/dev/null; then
        run_step train "$limit_train" "$root/tests/gpu/train.sh" "$build" "$tmp/train" "$out"
        rc=${step_rc[train]}
        train_json=$(tail -n 1 "$out/train.log" | grep '^{"rc"') || train_json=null
        if ((rc != 0)) || [[ $train_json == null ]]; then
                errors+=("train: exit status $rc${step_note[train]:+ (${step_note[train]})} (see train.log)")
        fi
else
        log "no python3 with torch here: train step skipped"
        train_json='{"skipped":"no python3 with torch"}'
fi
((${#errors[@]} == 0))
