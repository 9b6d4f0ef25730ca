#!/usr/bin/env bash
# Tier-3 test (DESIGN §5): a real Prometheus server scrapes the agent every second on
# loopback; PromQL checks families, labels and values; promtool lints the exposition.
#   tests/prometheus/run.sh [path/to/gpu-warden]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/debug/gpu-warden}
for tool in prometheus promtool curl python3; do
  command -v "$tool" >/dev/null || { echo "prometheus test: $tool is missing (apt-get install prometheus curl)"; exit 1; }
done
WORK=$(mktemp -d)
AGENT_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
PROM_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" --backend sim --scenario tests/prometheus/scenario.yaml --listen "127.0.0.1:$AGENT_PORT" \
  --poll-interval 500ms --process-util-interval 500ms --node-name ci-node-1 --per-process-metrics \
  > "$WORK/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "127.0.0.1:$AGENT_PORT/readyz" >/dev/null && break; sleep 0.1; done

curl -sf "127.0.0.1:$AGENT_PORT/metrics" > "$WORK/scrape.txt"
# promtool exits 1 on a parse error and 3 on style findings. dcgm-exporter's own names
# (camelCase labels such as UUID and modelName, counters without _total) are part of the
# drop-in contract (DESIGN §3.3), so exactly those findings on DCGM_FI_* families are
# expected; anything else — a parse error, or any finding on gpu-warden's own families —
# fails the test.
set +e
lint=$(promtool check metrics < "$WORK/scrape.txt" 2>&1)
rc=$?
set -e
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
  echo "$lint"; echo "FAIL: promtool could not parse the exposition (exit $rc)"; exit 1
fi
unexpected=$(printf '%s\n' "$lint" | grep -v '^$' | grep -Ev "^DCGM_FI_[A-Z0-9_]+ (label names should be written in 'snake_case' not 'camelCase'|counter metrics should have \"_total\" suffix|metric name should not include type 'counter')$" || true)
if [ -n "$unexpected" ]; then
  echo "$unexpected"; echo "FAIL: promtool findings beyond dcgm-exporter's naming"; exit 1
fi
echo "ok   promtool: exposition parses; $(printf '%s\n' "$lint" | grep -c . || true) findings, all dcgm-exporter naming kept for compatibility"

cat > "$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpu-warden
    static_configs:
      - targets: ["127.0.0.1:$AGENT_PORT"]
YAML
promtool check config "$WORK/prometheus.yml" >/dev/null
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" > "$WORK/prometheus.log" 2>&1 &
pids+=($!)
if ! python3 tests/prometheus/check.py "http://127.0.0.1:$PROM_PORT"; then
  echo "--- prometheus log"; tail -20 "$WORK/prometheus.log"
  echo "--- agent log"; tail -20 "$WORK/agent.log"
  exit 1
fi
