#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/train.sh: train_lm.py through a tierd on the GPU, then in plain PyTorch on the GPU.
#
# usage: tests/gpu/train.sh BUILD DIR OUTDIR     (run by tests/gpu/run.sh as its train step)
#
# Starts BUILD/daemon/tierd with the cuda VRAM backend on DIR, trains
# client/python/examples/train_lm.py through it (tier.torch, placement C,
# host and VRAM budgets below the model's state, so every step goes through
# NVMe), then the same model, seed and batches in plain PyTorch on the GPU.
# TIER_GPU_TRAIN_MODEL (train_lm.py's model and step options),
# TIER_GPU_TRAIN_HOST_LIMIT and TIER_GPU_TRAIN_VRAM_LIMIT change the run.
# The last line printed is one JSON object: both runs' losses, their largest
# relative difference, tokens/s.  Exit status: that of the runs (0: both ran).
set -uo pipefail

root=$(CDPATH='' cd -- "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: train.sh BUILD DIR OUTDIR}
dir=${2:?usage: train.sh BUILD DIR OUTDIR}
out=${3:?usage: train.sh BUILD DIR OUTDIR}
# the state directory 0750 whatever the umask: tierd refuses one that others can write
mkdir -p "$out" && { [[ -d $dir ]] || mkdir -m 0750 "$dir"; } || exit 1
sock=$dir/tierd.sock
rc=0

cat >"$dir/tierd.conf" <<CONF
[daemon]
linger_sec = 0
[host]
capacity = 1G
segment_size = 64M
[vram]
backend = cuda
capacity = 1G
[nvme]
target = $dir/t0.img:2G
CONF

"$build/daemon/tierd" --config "$dir/tierd.conf" --socket "$sock" --state-dir "$dir" --log-target stderr \
        >"$out/train-tierd.log" 2>&1 &
tierd=$!
trap 'kill -TERM "$tierd" 2>/dev/null; wait "$tierd" 2>/dev/null' EXIT
for ((i = 0; i < 100; i++)); do
        [[ -S $sock ]] && break
        sleep 0.1
done
if [[ ! -S $sock ]]; then
        echo "train.sh: tierd did not start; its log:"
        cat "$out/train-tierd.log"
        echo '{"rc":1,"error":"tierd did not start"}'
        exit 1
fi

# The model and budgets: these defaults unless the environment says otherwise (a larger run by hand).
read -r -a model <<<"${TIER_GPU_TRAIN_MODEL:---steps 10 --dim 256 --layers 6 --context 128 --batch 16}"
lm=(python3 "$root/client/python/examples/train_lm.py" "${model[@]}")
PYTHONPATH=$root/client/python TIER_LIBTIER=$build/client/libtier.so.1 \
        "${lm[@]}" --socket "$sock" --job train-gpu --placement C --host-limit "${TIER_GPU_TRAIN_HOST_LIMIT:-48M}" \
        --vram-limit "${TIER_GPU_TRAIN_VRAM_LIMIT:-24M}" \
        >"$dir/tier.out" 2>&1 || rc=$?
echo "== tier.torch"
cat "$dir/tier.out"
"${lm[@]}" --plain --device cuda >"$dir/plain.out" 2>&1 || rc=$?
echo "== plain PyTorch"
cat "$dir/plain.out"

python3 - "$dir/tier.out" "$dir/plain.out" "$rc" <<'PY'
import json
import re
import sys

def grab(path, pattern):
    return [float(x) for x in re.findall(pattern, open(path, errors="replace").read())]

tier, plain = grab(sys.argv[1], r"loss (\S+)"), grab(sys.argv[2], r"loss (\S+)")
tok, ptok = grab(sys.argv[1], r"(\d+) tok/s"), grab(sys.argv[2], r"(\d+) tok/s")
diff = max((abs(a - b) / abs(b) for a, b in zip(tier, plain) if b), default=None)
print(json.dumps({"rc": int(sys.argv[3]), "losses_tier": tier, "losses_plain": plain, "max_rel_diff": diff,
                  "equal": bool(tier) and tier == plain, "tier_tok_s_last": tok[-1] if tok else None,
                  "plain_tok_s_last": ptok[-1] if ptok else None}))
PY
exit "$rc"
