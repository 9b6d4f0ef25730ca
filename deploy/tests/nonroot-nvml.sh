#!/usr/bin/env bash
# Real-hardware check behind the DaemonSet's securityContext (docs/deploy.md, "Non-root and
# NVML"): can gpu-warden read every GPU and every GPU process through NVML as UID/GID 65532
# (the distroless "nonroot" user), with no capabilities and no_new_privs, while the CUDA
# process it must see belongs to root?
#
# Run as root on a GPU machine (it starts the root-owned CUDA process itself):
#   OUT=/tmp/out deploy/tests/nonroot-nvml.sh [path/to/gpu-warden]
# No KUBECONFIG and no in-cluster config: the agent runs standalone (metrics only).
# Needs python3 with torch (hw/gpu_load.py), curl, and setpriv (util-linux) or python3.
set -euo pipefail
BIN=${1:-target/release/gpu-warden}
OUT=${OUT:-/tmp/gpu-warden-nonroot}
PORT=${PORT:-19401}
UID_NONROOT=65532
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1

{
  echo "## id"; id
  echo "## device nodes"; ls -l /dev/nvidia* 2>&1 || true
  echo "## NVreg_DeviceFileMode"; grep -h DeviceFileMode /proc/driver/nvidia/params 2>&1 || true
  echo "## libnvidia-ml"; ldconfig -p 2>/dev/null | grep libnvidia-ml || true
} > "$OUT/env.txt"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

# A root-owned CUDA process holding 4 GiB.
python3 hw/gpu_load.py --device 0 --hold-gib 4 --seconds 60 > "$OUT/load.log" 2>&1 & pids+=($!)
LOAD=$!
for _ in $(seq 1 120); do grep -q '"ready"' "$OUT/load.log" 2>/dev/null && break; sleep 0.5; done

cp "$BIN" /tmp/gpu-warden-nonroot-bin && chmod 0755 /tmp/gpu-warden-nonroot-bin
ARGS=(--backend nvml --listen "127.0.0.1:$PORT" --poll-interval 1s
  --process-util-interval 1s --per-process-metrics --node-name nonroot-check)
if command -v setpriv >/dev/null; then
  # drop ALL capabilities (bounding, inheritable, ambient), no_new_privs, UID/GID 65532
  setpriv --reuid=$UID_NONROOT --regid=$UID_NONROOT --clear-groups \
    --inh-caps=-all --ambient-caps=-all --bounding-set=-all --no-new-privs \
    /tmp/gpu-warden-nonroot-bin "${ARGS[@]}" > "$OUT/agent.log" 2>&1 & pids+=($!)
  echo "dropped privileges with setpriv" >> "$OUT/env.txt"
else
  python3 - "$UID_NONROOT" /tmp/gpu-warden-nonroot-bin "${ARGS[@]}" > "$OUT/agent.log" 2>&1 <<'EOF' & pids+=($!)
import ctypes, os, sys
uid = int(sys.argv[1])
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
libc = ctypes.CDLL(None, use_errno=True)
for cap in range(64):
    libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
os.setgroups([]); os.setgid(uid); os.setuid(uid)
libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
os.execv(sys.argv[2], sys.argv[2:])
EOF
  echo "dropped privileges with python (setpriv missing)" >> "$OUT/env.txt"
fi
AGENT=${pids[-1]}
for _ in $(seq 1 50); do curl -sf "127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.2; done
sleep 4
grep -E '^(Uid|Gid|CapEff|CapBnd|NoNewPrivs)' "/proc/$AGENT/status" > "$OUT/agent-status.txt" || true
curl -sf "127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt"
curl -sf "127.0.0.1:$PORT/state" > "$OUT/state.json" || true
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$OUT/smi-apps.csv"

status=0
{
  echo "## agent process"; cat "$OUT/agent-status.txt"
  echo "## root CUDA process $LOAD as seen by nvidia-smi"; grep "^$LOAD," "$OUT/smi-apps.csv" || echo "(not listed)"
  echo "## as seen by gpu-warden (non-root)"
  grep -E "^gpu_warden_process_gpu_memory_used_bytes\{.*pid=\"$LOAD\"" "$OUT/metrics.txt" || { echo "(missing)"; status=1; }
  grep -E '^(DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_POWER_USAGE)\{' "$OUT/metrics.txt" | head -3
  grep -E '^gpu_warden_invisible_processes' "$OUT/metrics.txt" || true
  grep -E '^gpu_warden_nvml_errors_total' "$OUT/metrics.txt" || echo "gpu_warden_nvml_errors_total: no series (no failed call)"
  echo "## DCGM families exported"; grep -v '^#' "$OUT/metrics.txt" | grep -oE '^DCGM_FI_[A-Z0-9_]+' | sort -u | tr '\n' ' '; echo
} > "$OUT/summary.txt"
grep -q '^gpu_warden_invisible_processes 0$' "$OUT/metrics.txt" || status=1
cat "$OUT/summary.txt"
echo "nonroot-nvml: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
