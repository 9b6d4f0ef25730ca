#!/bin/bash
# Every device run still owed (issue 38's cells, then issue 40's cost run) as one batch that
# outlives the device tool's 10-minute calls: the first call starts it in its own session and
# waits; later calls only wait (`wait`); each call brings back what exists so far.
#
#   first call:  LEFT=<status's budget_left_s> bash hw/outstanding_h200.sh start BIN PEERBIN
#   next calls:  bash hw/outstanding_h200.sh wait [SECONDS]      (default 530)
#
# BIN holds the dist `gpu-warden` and a release `apiserver-double`; PEERBIN the baseline agent
# (`gpu-warden-before`), `nvml_floor`, `scrape_load` and the nvitop-exporter wheels (`whl/`,
# docs/performance.md says which). Both are copied before anything runs, so a later call's
# carry cannot replace a binary the harness is about to exec. On an H200 the sweep gets all the
# time (LEFT less 150 s for the start and the transfers) and the cost run is skipped, unless
# less than 900 s is left (then the cost run gets its 260 s first); on an H100 the a10g cells
# (an emulation that needs no more than 24 GiB) come first, today's headroom is set up with
# TRAIN_GIB=42 (the same ~32 GiB free on 80 GiB), and no cost run (the H100's is recorded). The SWEEP
# strings are docs/validation.md §9c's cells.
set -u
# OUTSTANDING_DIR: where the batch keeps its state (hw/test_guard_report.py sets its own).
R=${OUTSTANDING_DIR:-/tmp/outstanding}
case ${1:-} in
wait)
  s=${2:-530}; t0=$(date +%s)
  while [ ! -e $R/all.done ] && [ $(( $(date +%s) - t0 )) -lt "$s" ]; do sleep 5; done
  tail -4 $R/guard/sweep.log 2>/dev/null; tail -3 $R/peers.log 2>/dev/null; ls $R
  tar czf "${OUT:?}/outstanding.tgz" --exclude=bin --exclude=pbin -C "$(dirname $R)" "$(basename $R)"
  exit 0 ;;
start)
  bin=${2:?BIN}; pbin=${3:?PEERBIN}; : "${LEFT:?set LEFT to the budget_left_s that status reports}"
  mkdir -p $R/guard $R/peers
  cp -r "$bin" $R/bin && cp -r "$pbin" $R/pbin || exit 1
  echo "$LEFT" > $R/left
  setsid nohup bash "$0" run > $R/daemon.log 2>&1 < /dev/null &
  sleep 3
  exec bash "$0" wait "${WAIT_S:-530}" ;;
run) ;;
*) echo "usage: $0 start BIN PEERBIN | wait [SECONDS]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
LEFT=$(cat $R/left)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.csv
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
COST_FIRST=0
if [ "$total" -gt 120000 ]; then TRAIN_GIB=100; BUDGET=$((LEFT - 150)); PEERS=0
  # Under 900 s the sweep could finish one row of cells at most, which resolves nothing, while
  # the cost run (issue 40's last figure, on the card it names) fits: it goes first.
  if [ "$LEFT" -lt 900 ]; then BUDGET=$((LEFT - 150 - 260)); PEERS=1; COST_FIRST=1; fi
  SWEEP="guard*5%s=ws:64,128,16,250,4;guard*5%s=two:128,250,16,4;guard*5%s=ws%h=a10g:64,128,250,16,4;guard*5%s=two%h=a10g:64,250,128,16,4;guard*2%s=runner%h=a10g:4"
else TRAIN_GIB=42; BUDGET=$((LEFT - 150)); PEERS=0
  # The H100 already gave ws a10g's row and the H100 cost figure (docs/evidence/*h100*): the rest.
  SWEEP="guard*5%s=two%h=a10g:64,250,128,16,4;guard*2%s=runner%h=a10g:4;guard*5%s=ws:64,128,16,250,4;guard*5%s=two:64,128,250,16,4"
fi
echo "BUDGET=$BUDGET PEERS=$PEERS COST_FIRST=$COST_FIRST TRAIN_GIB=$TRAIN_GIB SWEEP=$SWEEP" > $R/plan
sweep() {
  [ "$BUDGET" -gt 60 ] || return 0
  OUT=$R/guard BUDGET=$BUDGET TRAIN_GIB=$TRAIN_GIB SWEEP="$SWEEP" \
    bash "$here/guard_sweep_h200.sh" $R/bin/gpu-warden $R/bin/apiserver-double > $R/guard.log 2>&1
  echo "rc=$?" >> $R/guard.log
}
peers() {
  [ "$PEERS" = 1 ] || return 0
  python3 -m pip install -q --no-index --no-deps --target /tmp/nvt $R/pbin/whl/*.whl > $R/pip.log 2>&1
  PYTHONUNBUFFERED=1 timeout 260 python3 "$here/perf_h200.py" --plan peers --agent $R/bin/gpu-warden \
    --agent-baseline $R/pbin/gpu-warden-before --baseline-label "gpu-warden before issue 40 (0b89742, one crate)" \
    --floor $R/pbin/nvml_floor --scrape-load $R/pbin/scrape_load --nvitop-site /tmp/nvt --peer-procs 2 \
    --peer-seconds 45 --crowded "" --per-call-iterations 50 --deadline-seconds 230 --out $R/peers > $R/peers.log 2>&1
  echo "rc=$?" >> $R/peers.log
}
if [ "$COST_FIRST" = 1 ]; then peers; sweep; else sweep; peers; fi
date -u +%T > $R/all.done
