#!/usr/bin/env bash
# Real-hardware validation of the NVML backend (issue 2, DESIGN §5 tier 4).
# Starts PyTorch processes that hold and use VRAM, runs the dist binary (cargo build --profile dist) with the NVML
# backend, and compares every exported DCGM family with nvidia-smi (and pynvml for the
# counters nvidia-smi's CSV query lacks), and every process's VRAM with
# nvidia-smi --query-compute-apps.
#
#   OUT=/tmp/out hw/validate-nvml.sh [path/to/gpu-warden]
set -euo pipefail
BIN=${1:-target/dist/gpu-warden}
OUT=${OUT:-/tmp/gpu-warden-validate}
PORT=${PORT:-19400}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

nvidia-smi > "$OUT/nvidia-smi.txt"
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
for ((g = 0; g < NGPU; g++)); do
  python3 hw/gpu_load.py --device "$g" --hold-gib 16 --compute --seconds 40 > "$OUT/load-$g-a.log" 2>&1 & pids+=($!)
  python3 hw/gpu_load.py --device "$g" --hold-gib 6 --seconds 40 > "$OUT/load-$g-b.log" 2>&1 & pids+=($!)
done
# Wait for the loads to hold their memory.
for _ in $(seq 1 60); do
  n=$(cat "$OUT"/load-*.log 2>/dev/null | grep -c '"ready"' || true)
  [ "$n" -ge $((NGPU * 2)) ] && break
  sleep 0.5
done

"$BIN" --backend nvml --listen "127.0.0.1:$PORT" --poll-interval 1s --process-util-interval 1s --slow-counter-interval 1s \
  --per-process-metrics --node-name h200-validation > "$OUT/agent.log" 2>&1 & pids+=($!)
AGENT=$!
for _ in $(seq 1 50); do curl -sf "127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.2; done
sleep 4  # let utilization and process-utilization windows fill

Q=index,uuid,pci.bus_id,name,driver_version,memory.total,memory.used,memory.free,memory.reserved,utilization.gpu,utilization.memory,utilization.encoder,utilization.decoder,temperature.gpu,temperature.memory,power.draw,clocks.current.sm,clocks.current.memory
for round in 1 2 3; do
  curl -sf "127.0.0.1:$PORT/metrics" > "$OUT/metrics-$round.txt"
  nvidia-smi --query-gpu=$Q --format=csv,nounits > "$OUT/smi-gpu-$round.csv"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,process_name,used_memory --format=csv,nounits > "$OUT/smi-apps-$round.csv"
  python3 hw/nvml_reference.py > "$OUT/nvml-$round.json"
  sleep 1.5
done
curl -sf "127.0.0.1:$PORT/state" > "$OUT/state.json"
curl -s -o /dev/null -w '%{http_code}\n' "127.0.0.1:$PORT/healthz" > "$OUT/healthz.txt"

status=0
for round in 1 2 3; do
  echo "## round $round" >> "$OUT/compare.md"
  python3 hw/compare_nvidia_smi.py "$OUT/metrics-$round.txt" "$OUT/smi-gpu-$round.csv" \
    "$OUT/smi-apps-$round.csv" "$OUT/nvml-$round.json" >> "$OUT/compare.md" || status=1
done
kill -TERM "$AGENT"; t0=$(date +%s.%N); wait "$AGENT" || true; t1=$(date +%s.%N)
python3 -c "import sys; print(\"agent exit after SIGTERM: %.2f s\" % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$t1" >> "$OUT/compare.md"
grep -E 'poll_duration_seconds_(sum|count)|nvml_errors' "$OUT/metrics-3.txt" >> "$OUT/compare.md" || true
cat "$OUT/compare.md"
exit $status
