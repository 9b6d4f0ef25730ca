#!/bin/bash
# Records which functions the agent's NVML backend runs, on a GPU machine, for the dist
# link order (scripts/link_order.py, link/h200-functions.txt; docs/performance.md,
# "Resident memory"): the agent under valgrind's callgrind for 70 s, standalone
# (`--kube off`), GPM every 5 s, with two CUDA processes on the GPU (this folder's
# perf_h200.py holders) and /metrics and /state scraped six times.
#
#   OUT=/tmp/lo VALGRIND_LIB=<folder> bash hw/record_link_order_h200.sh <valgrind.bin> [agent]
#
# The H200 machine has no valgrind: carry Debian's `valgrind.bin`, `callgrind-amd64-linux`,
# `vgpreload_core-amd64-linux.so` and `default.supp` (static tools; the launcher needs only
# glibc) in one folder and point VALGRIND_LIB at it. Then, here:
#   python3 scripts/link_order.py record --agent target/dist/gpu-warden \
#       --double target/release/apiserver-double --ran-on-gpu $OUT/nvml.callgrind \
#       --save-gpu link/h200-functions.txt
set -u
VG=${1:?usage: record_link_order_h200.sh VALGRIND_BIN [AGENT]}
B=${2:-target/dist/gpu-warden}
: "${OUT:?set OUT to the output folder}" "${VALGRIND_LIB:?set VALGRIND_LIB to the folder with callgrind-amd64-linux}"
export VALGRIND_LIB
here=$(dirname "$0")
for _ in 1 2; do python3 "$here/perf_h200.py" --cuda-hold 256 > /dev/null 2>&1 & done
sleep 8
echo "CUDA processes: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
timeout -s INT 70 "$VG" --tool=callgrind --demangle=no --dump-instr=no --callgrind-out-file="$OUT/nvml.callgrind" \
  "$B" --backend nvml --kube off --guard-mode off --poll-interval 1s --gpm on --gpm-interval 5s \
  --listen 127.0.0.1:9555 > "$OUT/vg.log" 2>&1 &
pid=$!
sleep 40
for _ in 1 2 3 4 5 6; do
  curl -s -m 10 127.0.0.1:9555/metrics | wc -c
  curl -s -m 10 127.0.0.1:9555/state | wc -c
  sleep 3
done
wait "$pid"
pkill -f -- "--cuda-hold"
tail -3 "$OUT/vg.log"
