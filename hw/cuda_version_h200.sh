#!/usr/bin/env bash
# The driver's CUDA version, three ways, on a real GPU node (issue 43, docs/validation.md §7):
#  1. NVML's nvmlSystemGetCudaDriverVersion_v2 (what the agent calls through nvml-wrapper's
#     sys_cuda_driver_version; 12080 = 12.8) and the v1 call, through ctypes;
#  2. nvidia-smi's header ("CUDA Version: 13.0") and its driver version;
#  3. when a built agent is given, its DCGM_FI_CUDA_DRIVER_VERSION gauge, scraped once.
# Prints one Markdown table; exits 1 when the readings disagree.
#
#   hw/cuda_version_h200.sh [target/debug/gpu-warden]
set -uo pipefail
BIN=${1:-}
nvml=$(python3 - <<'PY'
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
out = []
for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
    v = ctypes.c_int(0)
    rc = getattr(lib, name)(ctypes.byref(v))
    out.append(f"{v.value}" if rc == 0 else f"error{rc}")
buf = ctypes.create_string_buffer(96)
lib.nvmlSystemGetDriverVersion(buf, 96)
out.append(buf.value.decode())
print(" ".join(out))
PY
)
read -r v2 v1 drv <<<"$nvml"
smi_cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
smi_drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
dec() { echo "$(( $1 / 1000 )).$(( ($1 % 1000) / 10 ))"; }
agent="(not run)"
if [ -n "$BIN" ]; then
  "$BIN" --backend nvml --kube off --listen 127.0.0.1:19643 --poll-interval 1s --guard-mode off > /tmp/cuda-agent.log 2>&1 &
  A=$!
  for _ in $(seq 60); do curl -sf 127.0.0.1:19643/readyz >/dev/null && break; sleep 0.5; done
  agent=$(curl -s 127.0.0.1:19643/metrics | awk '/^DCGM_FI_CUDA_DRIVER_VERSION\{/{print $NF; exit}')
  kill "$A" 2>/dev/null; wait "$A" 2>/dev/null
fi
echo "| reading | value |"
echo "|---|---|"
echo "| nvmlSystemGetCudaDriverVersion_v2 | $v2 ($(dec "$v2")) |"
echo "| nvmlSystemGetCudaDriverVersion (v1) | $v1 ($(dec "$v1")) |"
echo "| nvmlSystemGetDriverVersion | $drv |"
echo "| nvidia-smi \"CUDA Version\" | $smi_cuda |"
echo "| nvidia-smi driver_version | $smi_drv |"
echo "| agent DCGM_FI_CUDA_DRIVER_VERSION (GPU 0) | $agent |"
ok=1
[ "$(dec "$v2")" = "$smi_cuda" ] || ok=0
[ "$v1" = "$v2" ] || ok=0
[ "$drv" = "$smi_drv" ] || ok=0
if [ -n "$BIN" ] && [ "$agent" != "$v2" ]; then ok=0; fi
[ $ok = 1 ] && echo "PASS" || { echo "FAIL: the readings disagree"; exit 1; }
