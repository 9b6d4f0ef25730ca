#!/usr/bin/env bash
# One release command: builds the image and the chart, pushes both to an OCI registry and
# records each by digest.
#
#   scripts/release.sh IMAGE_REPOSITORY CHART_REPOSITORY [OUT_DIR]
#   scripts/release.sh registry.example.com/platform/gpu-warden oci://registry.example.com/helm-charts
#
# 1. the image: scripts/image-build.sh (offline, daemonless), or the OCI archive named by
#    GPU_WARDEN_IMAGE_ARCHIVE (one it already built); pushed with skopeo as
#    IMAGE_REPOSITORY:<version>, and the registry's digest checked against the archive's;
# 2. the chart (deploy/helm/gpu-warden, its files/ links resolved) with image.repository and
#    image.digest set to what was just pushed, so `helm install oci://…` needs no image value
#    and pulls exactly that image; packaged and pushed with Helm's own SDK (helm-python-sdk)
#    to CHART_REPOSITORY/gpu-warden:<chart version>;
# 3. OUT_DIR/release.json (default target/artifacts): the version, the git commit, and for
#    the image and the chart the repository, tag and digest, and a reference by digest.
# deploy/check.sh runs it against Debian's docker-registry started locally, then installs the
# chart from oci:// with Helm's engine and pulls the image back by digest
# (deploy/tests/check_release.py).
#
# Environment: GPU_WARDEN_IMAGE_ARCHIVE (skip the build), GPU_WARDEN_PYTHON (a python with
# helm-python-sdk; default: a virtualenv in ~/.cache/gpu-warden-release with the pin below),
# RELEASE_PLAIN_HTTP=1 (the registry speaks HTTP: a local test registry), REGISTRY_AUTH_FILE
# (skopeo's credentials: `skopeo login`), HELM_REGISTRY_CONFIG (Helm's, in Docker's
# config.json format: the file `skopeo login --authfile` writes serves both).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HELM_PIN="helm-python-sdk==0.2.2"   # as deploy/check.sh
if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
IMAGE_REPO=$1
CHART_REPO=$2
OUT=${3:-$ROOT/target/artifacts}
case $IMAGE_REPO in
  *://*|*@*) echo "$0: IMAGE_REPOSITORY is host/path, without a scheme, tag or digest: $IMAGE_REPO" >&2; exit 2 ;;
esac
case ${IMAGE_REPO##*/} in *:*) echo "$0: IMAGE_REPOSITORY takes no tag (the version is the tag): $IMAGE_REPO" >&2; exit 2 ;; esac
case $CHART_REPO in
  oci://*) ;;
  *) echo "$0: CHART_REPOSITORY must be an oci:// reference, e.g. oci://registry.example.com/helm-charts: $CHART_REPO" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
command -v skopeo >/dev/null || { echo "$0: skopeo missing (apt-get install skopeo)" >&2; exit 1; }
tls=()
[ -n "${RELEASE_PLAIN_HTTP:-}" ] && tls=(--dest-tls-verify=false)

PY=${GPU_WARDEN_PYTHON:-}
if [ -z "$PY" ]; then
  venv=${XDG_CACHE_HOME:-$HOME/.cache}/gpu-warden-release
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.pin" 2>/dev/null)" != "$HELM_PIN" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$HELM_PIN"
    echo "$HELM_PIN" > "$venv/.pin"
  fi
  PY=$venv/bin/python
fi

echo "== 1. image"
ARCHIVE=${GPU_WARDEN_IMAGE_ARCHIVE:-}
if [ -z "$ARCHIVE" ]; then
  IMAGE_NAME=$IMAGE_REPO IMAGE_TAG=$VERSION scripts/image-build.sh "$OUT"
  ARCHIVE=$OUT/gpu-warden-image.oci.tar
fi
[ -f "$ARCHIVE" ] || { echo "$0: no image archive at $ARCHIVE" >&2; exit 1; }
built=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$ARCHIVE")
digestfile=$(mktemp)
trap 'rm -f "$digestfile"' EXIT
skopeo copy --quiet "${tls[@]}" --digestfile "$digestfile" "oci-archive:$ARCHIVE" "docker://$IMAGE_REPO:$VERSION"
IMAGE_DIGEST=$(cat "$digestfile")
# skopeo copies an OCI archive's manifest as it is: the registry must hold the very image built.
if [ "$IMAGE_DIGEST" != "$built" ]; then
  echo "$0: the registry's digest $IMAGE_DIGEST is not the archive's $built (the manifest was converted)" >&2
  exit 1
fi
echo "image $IMAGE_REPO:$VERSION@$IMAGE_DIGEST"

echo "== 2. chart"
"$PY" scripts/release_chart.py "$ROOT/deploy/helm/gpu-warden" "$IMAGE_REPO" "$IMAGE_DIGEST" "$CHART_REPO" \
  "$OUT" "$VERSION" "$(git rev-parse HEAD 2>/dev/null || echo unknown)"
echo "== release manifest: $OUT/release.json"
cat "$OUT/release.json"
