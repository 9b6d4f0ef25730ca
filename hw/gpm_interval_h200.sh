#!/usr/bin/env bash
# GPM's cost against --gpm-interval on a Hopper GPU (docs/gpm.md, docs/performance.md): runs
# the agent with a bf16 matmul on GPU 0, for each interval, and reports the full poll's wall
# time, the agent's CPU (schedstat, all threads) per second, and how often
# DCGM_FI_PROF_PIPE_TENSOR_ACTIVE changes — it must stay present (repeated between samples).
#
#   OUT=/tmp/out [MODES="off 1s 10s"] hw/gpm_interval_h200.sh [target/dist/gpu-warden] [seconds per interval]
set -uo pipefail
BIN=${1:-target/dist/gpu-warden}
SECS=${2:-20}
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
python3 hw/gpu_load.py --device 0 --hold-gib 1 --compute --matmul 8192 --seconds 600 > /tmp/gpm-load.log 2>&1 &
LOAD=$!
for _ in $(seq 60); do grep -q '"ready"' /tmp/gpm-load.log && break; sleep 0.5; done
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {print s}'; }
metric() { grep -E "^$2(\{| )" <<<"$1" | head -1 | awk '{print $NF}'; }
echo "| GPM | --gpm-interval | polls | wall per full poll, ms | agent CPU, ms per s | distinct PIPE_TENSOR_ACTIVE values over $SECS s (1 scrape/s) | last value |"
echo "|---|---|---|---|---|---|---|"
for mode in ${MODES:-off 1s 10s}; do
  if [ "$mode" = off ]; then env=(GPU_WARDEN_GPM=off); iv=1s; else env=(); iv=$mode; fi
  env "${env[@]}" "$BIN" --backend nvml --kube off --listen 127.0.0.1:19630 --poll-interval 1s \
    --guard-mode off --gpm-interval "$iv" > "/tmp/gpm-agent-$mode.log" 2>&1 &
  A=$!
  sleep 3
  m0=$(curl -s 127.0.0.1:19630/metrics); c0=$(cpu_ns $A); t0=$(date +%s.%N)
  vals=()
  for _ in $(seq "$SECS"); do
    sleep 1
    m=$(curl -s 127.0.0.1:19630/metrics)
    vals+=("$(grep -E '^DCGM_FI_PROF_PIPE_TENSOR_ACTIVE\{[^}]*gpu="0"' <<<"$m" | awk '{print $NF}')")
  done
  c1=$(cpu_ns $A); t1=$(date +%s.%N)
  kill $A; wait $A 2>/dev/null
  python3 - "$mode" "$iv" "$m0" "$m" "$c0" "$c1" "$t0" "$t1" "${vals[@]}" <<'EOF'
import sys
mode, iv, m0, m1, c0, c1, t0, t1, *vals = sys.argv[1:]
def f(text, name):
    for l in text.splitlines():
        if l.startswith(name + " "):
            return float(l.split()[-1])
polls = f(m1, "gpu_warden_poll_duration_seconds_count") - f(m0, "gpu_warden_poll_duration_seconds_count")
wall = (f(m1, "gpu_warden_poll_duration_seconds_sum") - f(m0, "gpu_warden_poll_duration_seconds_sum")) / polls * 1000
cpu = (int(c1) - int(c0)) / 1e6 / (float(t1) - float(t0))
present = [v for v in vals if v]
print(f"| {'off' if mode == 'off' else 'on'} | {iv if mode != 'off' else '—'} | {polls:.0f} | {wall:.3f} | {cpu:.3f} | "
      f"{len(set(present))} (present in {len(present)}/{len(vals)}) | {present[-1] if present else '—'} |")
EOF
done
kill $LOAD 2>/dev/null
