#!/usr/bin/env bash
# The guard sweeps of docs/validation.md §3d (issue 25) on one H200, under the API double's
# faithful kubelet (SIGTERM to PID 1 — a job shell that ignores it — SIGKILL at max(grace, 2 s)):
# the default policy (evictionGracePeriodSeconds 5) in enforce mode at two headrooms, today's
# ~32 GiB free and an emulated A10G (24 GiB shared by four jobs). SWEEP picks the series
# (hw/guard_h200.py --sweep syntax; `%h=a10g`, `%a=stop|kill|evict`, `%k=instant`, `%p=exits`,
# `%s=ws|runner|two` the neighbours' shape, `%r=3s` slow pod reads).
#
# Issue 38's table (each cell 5 runs; ~150 runs, several calls at BUDGET 520 — split by shape):
#   SWEEP="guard*5%s=ws:4,16,64,128,250;guard*5%s=ws%h=a10g:4,16,64,128,250"
#   SWEEP="guard*5%s=runner:4,16,64,128,250;guard*5%s=runner%h=a10g:4,16,64,128,250"
#   SWEEP="guard*5%s=two:4,16,64,128,250;guard*5%s=two%h=a10g:4,16,64,128,250"
#   SWEEP="guard*5%s=ws%r=3s:64;guard*5%s=ws%r=3s%h=a10g:64"   (the slow fresh read)
#
# TRAIN_GIB sizes today's trainer (default 100 GiB, for the H200's 141 GiB); on an H100's
# 80 GiB, TRAIN_GIB=42 leaves the same ~32 GiB free (the a10g headroom needs no change).
#
#   OUT=/tmp/out BUDGET=520 SWEEP="guard*5:4,16,64,128,250" bash hw/guard_sweep_h200.sh \
#       target/release/gpu-warden target/release/apiserver-double [before-binary]
#
# IDLE_SECONDS / IDLE_WATCH_RATES: the idle CPU rows (below).
#
# AGENT_B: a second agent binary, run by the sweep's series with `%b=1` (an A/B of two builds
# in one call; hw/guard_h200.py's --agent-b).
#
# BUDGET (seconds, default 520) is the harness's whole wall time, its report included: it
# starts no run (or headroom) it does not expect to end inside it. As a backstop, the harness
# gets SIGTERM at BUDGET + 30 s (it then drops the run in progress and writes the report from
# the finished ones) and SIGKILL 20 s later. So give the device command at least BUDGET + 60 s
# (a 600 s call: BUDGET 530 or less). Exit status 3: the backstop fired (the report is there).
set -euo pipefail
agent=${1:?agent binary}
double=${2:?apiserver-double binary}
before=${3:-}
out=${OUT:-/tmp/guard-sweep}
budget=${BUDGET:-520}
case $budget in ''|*[!0-9]*) echo "BUDGET must be whole seconds, not '$budget'" >&2; exit 2 ;; esac
mkdir -p "$out"
idle=()
if [ -n "$before" ]; then
  idle=(--idle-agents "$before,$agent" --idle-seconds "${IDLE_SECONDS:-20}")
fi
# IDLE_WATCH_RATES (e.g. 48Gi,256Gi): the agent's CPU measured the same way at each of these
# watchRates and at the policy's own, beside the build above if there is one: what a faster
# watch costs when nothing grows.
if [ -n "${IDLE_WATCH_RATES:-}" ]; then
  list=${before:+$before,}$agent
  for r in ${IDLE_WATCH_RATES//,/ }; do list="$list,$agent@$r"; done
  idle=(--idle-agents "$list" --idle-seconds "${IDLE_SECONDS:-20}")
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv"
set +e
# ${idle[@]+...}: an empty array under `set -u` is an error before bash 4.4.
# BACKSTOP_S / KILL_AFTER_S: the backstop's margins (hw/test_guard_report.py shortens them).
PYTHONUNBUFFERED=1 timeout --signal=TERM --kill-after="${KILL_AFTER_S:-20}" "$((budget + ${BACKSTOP_S:-30}))" \
  python3 "$(dirname "$0")/guard_h200.py" --agent "$agent" --double "$double" --runs 5 \
  --skip-attribution --budget "$budget" --out "$out" ${idle[@]+"${idle[@]}"} ${TRAIN_GIB:+--train-gib "$TRAIN_GIB"} \
  ${AGENT_B:+--agent-b "$AGENT_B"} \
  --sweep "${SWEEP:-guard*5%h=a10g:4,16,64,128,250;guard*5:4,16,64,128,250}" 2>&1 | tee "$out/sweep.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "guard_sweep_h200.sh: the harness ran past BUDGET + 30 s and was stopped (timeout status $rc);" \
    "$( [ -s "$out/guard-report.md" ] && echo "its report covers the runs that finished" || echo "no report was written")" >&2
  exit 3
fi
exit "$rc"
