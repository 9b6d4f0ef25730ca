#!/usr/bin/env bash
# The guard sweep of docs/validation.md §3c on one H200, with the idle-cost comparison:
# five guarded runs at each of 4, 16, 64, 128 and 250 GiB/s (default policy in enforce mode,
# the adaptive fast watch), two unguarded runs per rate, and the CPU of the agent before and
# after the adaptive watch with the guard armed (idle GPU, then calm training + CI load).
#
#   OUT=/tmp/out bash hw/guard_sweep_h200.sh target/release/gpu-warden \
#       target/release/apiserver-double target/release/gpu-warden-before
set -euo pipefail
agent=${1:?agent binary}
double=${2:?apiserver-double binary}
before=${3:-}
out=${OUT:-/tmp/guard-sweep}
mkdir -p "$out"
idle=()
if [ -n "$before" ]; then
  idle=(--idle-agents "$before,$agent" --idle-seconds "${IDLE_SECONDS:-20}")
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv"
python3 "$(dirname "$0")/guard_h200.py" --agent "$agent" --double "$double" --runs 5 \
  --skip-attribution --budget "${BUDGET:-540}" --out "$out" "${idle[@]}" \
  --sweep "${SWEEP:-guard:4,16,64,128,250;none*2:4,16,64,128,250}" 2>&1 | tee "$out/sweep.log"
