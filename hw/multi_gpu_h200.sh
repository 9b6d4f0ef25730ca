#!/usr/bin/env bash
# One device run on a multi-GPU H200 machine (issue 10, and the open points of issues 7 and 9):
#   1. hw/validate-nvml.sh on every GPU (every DCGM family against nvidia-smi/pynvml);
#   2. hw/gpm_h200.py loads on GPU 0 (idle, bf16 matmul, device copy, PCIe copy);
#   3. the per-call NVML cost with 64 CUDA processes on GPU 0 (examples/nvml_floor --per-call),
#      and the agent's poll with those 64 processes, with process utilization at its default
#      5 s cadence and with it effectively off, to pin what makes a crowded GPU's poll slow;
#   4. hw/perf_h200.py's idle phase and comparisons on all GPUs (per-poll cost against
#      GPU count);
#   5. hw/guard_h200.py on two GPUs: pressure on GPU 0 alone, then on both at once; every
#      GPU has its own training process and small CI pod, which must never be evicted.
#
#   cargo build --profile dist -p gpu-warden && cargo build --release -p apiserver-double && cargo build --release --example nvml_floor --example scrape_load
#   OUT=/tmp/out hw/multi_gpu_h200.sh        # on the device, from the repository root
set -uo pipefail
OUT=${OUT:-/tmp/multi-gpu-out}
R=/tmp/multi
BIN=target/dist/gpu-warden
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
T0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }

nvidia-smi -L
stamp validate
OUT=$R/validate timeout 120 bash hw/validate-nvml.sh "$BIN" > "$R/validate.md" 2>&1
echo "validate rc=$?"; grep -E "RESULT|DIFFERS" "$R/validate.md"

stamp gpm
timeout 200 python3 hw/gpm_h200.py --agent "$BIN" --out "$R/gpm" --seconds 8 --cost-seconds 10 \
  --budget 170 > "$R/gpm.md" 2>&1
echo "gpm rc=$?"; grep -E "^- (PASS|FAIL)" "$R/gpm.md"

stamp "64 processes on GPU 0"
pids=()
for _ in $(seq 64); do
  python3 hw/gpu_load.py --device 0 --hold-gib 0.25 --seconds 300 > /dev/null 2>&1 & pids+=($!)
done
for _ in $(seq 90); do
  n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0 | wc -l)
  [ "$n" -ge 64 ] && break
  sleep 1
done
echo "CUDA processes on GPU 0: $n"
{
  echo "### nvml_floor --per-call with $n CUDA processes on GPU 0"
  echo '```'
  timeout 60 target/release/examples/nvml_floor 20 --per-call
  echo '```'
  for util in 5s 1h; do
    port=19610
    "$BIN" --backend nvml --kube off --listen 127.0.0.1:$port --poll-interval 1s --guard-mode off \
      --process-util-interval $util > "$R/agent-64-$util.log" 2>&1 &
    a=$!
    sleep 2
    b0=$(curl -s 127.0.0.1:$port/metrics | grep -E '^gpu_warden_poll_duration_seconds_(sum|count)')
    sleep 15
    b1=$(curl -s 127.0.0.1:$port/metrics | grep -E '^gpu_warden_poll_duration_seconds_(sum|count)')
    kill $a; wait $a 2>/dev/null
    python3 - "$util" "$b0" "$b1" <<'EOF'
import sys
def parse(t):
    d = {l.split()[0]: float(l.split()[1]) for l in t.splitlines() if l.strip()}
    return d["gpu_warden_poll_duration_seconds_sum"], d["gpu_warden_poll_duration_seconds_count"]
(s0, c0), (s1, c1) = parse(sys.argv[2]), parse(sys.argv[3])
print(f"agent, --process-util-interval {sys.argv[1]}: {c1 - c0:.0f} polls, {(s1 - s0) / (c1 - c0) * 1000:.2f} ms wall per poll")
EOF
  done
} > "$R/crowded.md" 2>&1
cat "$R/crowded.md"
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null

stamp perf
OUT=$R/perf timeout 150 python3 hw/perf_h200.py --agent "$BIN" --procs-list 0 --window-seconds 20 \
  --floor target/release/examples/nvml_floor --floor-iterations 200 --scrape-load target/release/examples/scrape_load \
  --pynvml-collections 50 --smi-runs 3 --deadline-seconds 130 > "$R/perf.txt" 2>&1
echo "perf rc=$?"

stamp guard
timeout 240 python3 hw/guard_h200.py --agent "$BIN" --double target/release/apiserver-double --gpus 0,1 \
  --runs 3 --budget 200 --sweep "guard/0:16,64;guard/0+1:16,64" --out "$R/guard" > "$R/guard.log" 2>&1
echo "guard rc=$?"; tail -8 "$R/guard.log"

stamp done
cp "$R/validate.md" "$R/gpm.md" "$R/crowded.md" "$OUT/" 2>/dev/null
cp "$R/perf/perf.md" "$OUT/perf.md" 2>/dev/null
cp "$R/guard/guard-vram.png" "$R/guard/guard-report.md" "$OUT/" 2>/dev/null
tar czf "$OUT/all.tgz" -C /tmp multi 2>/dev/null
