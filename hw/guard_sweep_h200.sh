#!/usr/bin/env bash
# The guard sweeps of docs/validation.md §3d (issue 25) on one H200, under the API double's
# faithful kubelet (SIGTERM to PID 1 — a job shell that ignores it — SIGKILL at max(grace, 2 s)):
# the default policy (evictionGracePeriodSeconds 5) in enforce mode at two headrooms, today's
# ~32 GiB free and an emulated A10G (24 GiB shared by four jobs). SWEEP picks the series
# (hw/guard_h200.py --sweep syntax; `%h=a10g`, `%a=stop|kill|evict`, `%k=instant`, `%p=exits`).
#
#   OUT=/tmp/out SWEEP="guard*5:4,16,64,128,250" bash hw/guard_sweep_h200.sh \
#       target/release/gpu-warden target/release/apiserver-double [before-binary]
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
  --skip-attribution --budget "${BUDGET:-520}" --out "$out" "${idle[@]}" \
  --sweep "${SWEEP:-guard*5%h=a10g:4,16,64,128,250;guard*5:4,16,64,128,250}" 2>&1 | tee "$out/sweep.log"
