#!/usr/bin/env bash
# gpu-warden's whole test suite, as CI runs it (.ci/run calls this script):
#   formatting, clippy with warnings as errors, every unit and integration test of the
#   workspace, the criterion benches in quick mode, the real-Prometheus test and the
#   offline deployment checks (deploy/check.sh: kustomize overlays, the Helm chart through
#   Helm's engine, and the container image built with buildah and run from its unpacked
#   root filesystem; a release build for it). Installs the system packages it needs when
#   run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]} (apt-get install ${need[*]})" >&2
    exit 1
  fi
fi
if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

echo "== cargo fmt --check"
cargo fmt --all --check

# The image's binary (deploy/check.sh, step 9: the dist profile, fat LTO and one codegen
# unit) spends most of its 10 minutes in one single-threaded LTO step: built in the
# background beside clippy and the debug builds, it costs CI a few minutes instead of ten.
# Its own lock (target/dist/) keeps it out of the debug builds' way; the tests run only
# once it is done, so no timing-sensitive test shares the cores with it.
dist_pid=
dist_log=target/dist-build.log
if [ -x deploy/check.sh ] && [ -z "${GPU_WARDEN_SKIP_IMAGE:-}" ] && [ "$(id -u)" = 0 ]; then
  mkdir -p target
  echo "== cargo build --profile dist (in the background, for the image; log: $dist_log)"
  cargo build --profile dist --locked -p gpu-warden >"$dist_log" 2>&1 &
  dist_pid=$!
fi
wait_dist() {
  [ -n "$dist_pid" ] || return 0
  local started=$SECONDS
  if ! wait "$dist_pid"; then
    echo "cargo build --profile dist failed:" >&2
    tail -40 "$dist_log" >&2
    exit 1
  fi
  dist_pid=
  echo "== dist build done (waited $((SECONDS - started)) s for it)"
}
trap '[ -z "$dist_pid" ] || kill "$dist_pid" 2>/dev/null' EXIT

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test: build"
cargo test --workspace --locked --no-run
have_benches=
if [ -d benches ] && ls benches/*.rs >/dev/null 2>&1; then
  have_benches=1
  cargo test --locked --benches --no-run
fi
wait_dist
echo "== cargo test"
cargo test --workspace --locked
if [ -n "$have_benches" ]; then
  # In the test profile: each bench runs once, on the debug build the tests already made
  # (the bench profile's optimised build of every dependency cost CI minutes for a smoke run;
  # the measured figures come from `cargo bench`, docs/performance.md).
  echo "== benches (quick mode: each runs once)"
  cargo test --locked --benches -- --test
fi
echo "== real Prometheus"
tests/prometheus/run.sh target/debug/gpu-warden
if [ -x deploy/check.sh ]; then
  echo "== deployment checks"
  # The binary the tests ran: `cargo build -p gpu-warden` alone resolves the dependencies'
  # features for one package, not the workspace, and rebuilt it (100 s of CI).
  GPU_WARDEN_BIN=target/debug/gpu-warden deploy/check.sh
fi
echo "== all tests passed"
