#!/bin/bash
# Issue 38's table, re-run on the agent that kills a stopped victim once its eviction is
# accepted and projects a pod at its share of the GPU's climb (docs/validation.md §9f), as
# one batch that outlives the device tool's 10-minute calls: the first call starts it in its
# own session and waits; later calls only wait (`wait`); each call brings back what exists
# so far.
#
#   first call:  LEFT=<status's budget_left_s> [OUTSTANDING_SWEEP=<cells>] bash hw/outstanding_h200.sh start BIN
#   next calls:  bash hw/outstanding_h200.sh wait [SECONDS]      (default 530)
#
# BIN holds the dist `gpu-warden` and a release `apiserver-double`, copied before anything runs,
# so a later call's carry cannot replace a binary the harness is about to exec. The sweep gets
# the time left (LEFT less 150 s for the start and the transfers), the cells in the order that
# says most first: the runner shape at the A10G's headroom (the plateaus at 250 GiB/s of §9h
# and §9i), then the two greedy jobs at today's headroom (first run on the climbers-only agent
# in §9i), then the trainer's workspace with the slow fresh read first, then the cells §9h ran
# clean. The harness groups cells by headroom and shape in order of first mention.
# Where BIN also holds `gpu-warden-before` (an earlier build), the sweep first measures both
# agents' CPU with the guard armed, on the idle GPU and beside the first shape's base load
# (guard_h200.py --idle-agents, 20 s each), as a ratio in the same run.
# Where BIN holds `gpu-warden-b` (another build), the sweep's series with `%b=1` run it: an
# A/B in one batch, e.g. OUTSTANDING_SWEEP='guard*5%s=two%h=a10g:250;guard*5%s=two%h=a10g%b=1:250'.
# On an H100 today's headroom is set up with TRAIN_GIB=42 (about the same free memory on
# 80 GiB); the a10g headroom is an emulation and means the same on either card.
set -u
# OUTSTANDING_DIR: where the batch keeps its state (hw/test_guard_report.py sets its own).
R=${OUTSTANDING_DIR:-/tmp/outstanding}
case ${1:-} in
wait)
  s=${2:-530}; t0=$(date +%s)
  while [ ! -e $R/all.done ] && [ $(( $(date +%s) - t0 )) -lt "$s" ]; do sleep 5; done
  tail -4 $R/guard/sweep.log 2>/dev/null; ls $R
  tar czf "${OUT:?}/outstanding.tgz" --exclude=bin -C "$(dirname $R)" "$(basename $R)"
  exit 0 ;;
start)
  bin=${2:?BIN}; : "${LEFT:?set LEFT to the budget_left_s that status reports}"
  mkdir -p $R/guard
  cp -r "$bin" $R/bin || exit 1
  echo "$LEFT" > $R/left
  setsid nohup bash "$0" run > $R/daemon.log 2>&1 < /dev/null &
  sleep 3
  exec bash "$0" wait "${WAIT_S:-530}" ;;
run) ;;
*) echo "usage: $0 start BIN | wait [SECONDS]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
LEFT=$(cat $R/left)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.csv
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$total" -gt 120000 ]; then TRAIN_GIB=100; else TRAIN_GIB=42; fi
BUDGET=$((LEFT - 150))
SWEEP="guard*5%s=runner%h=a10g:250,128,64,16,4;guard*5%s=two:128,64,16,4,250"
SWEEP="$SWEEP;guard*5%s=ws%r=3s%h=a10g:64;guard*5%s=ws%h=a10g:250,128,64,16,4"
SWEEP="$SWEEP;guard*5%s=ws%r=3s:64;guard*5%s=ws:64,128,250,16,4"
SWEEP="$SWEEP;guard*5%s=runner:64,128,250,16,4;guard*5%s=two%h=a10g:250,128,64,16,4"
# OUTSTANDING_SWEEP: the cells instead of the whole table (a re-run of the cells a change
# touches, when the device time left is short).
SWEEP=${OUTSTANDING_SWEEP:-$SWEEP}
echo "BUDGET=$BUDGET TRAIN_GIB=$TRAIN_GIB SWEEP=$SWEEP" > $R/plan
if [ "$BUDGET" -gt 60 ]; then
  OUT=$R/guard BUDGET=$BUDGET TRAIN_GIB=$TRAIN_GIB SWEEP="$SWEEP" \
    AGENT_B=$( [ -x $R/bin/gpu-warden-b ] && echo $R/bin/gpu-warden-b ) \
    bash "$here/guard_sweep_h200.sh" $R/bin/gpu-warden $R/bin/apiserver-double \
      $( [ -x $R/bin/gpu-warden-before ] && echo $R/bin/gpu-warden-before ) > $R/guard.log 2>&1
  echo "rc=$?" >> $R/guard.log
fi
date -u +%T > $R/all.done
