#!/usr/bin/env bash
# Builds gpu-warden's container image offline and without a Docker daemon: Debian's buildah
# (vfs storage driver, its own storage under the output directory), skopeo and no base image.
#
#   scripts/image-build.sh [OUT_DIR]            # default: target/artifacts
#
# Environment: GPU_WARDEN_RELEASE_BIN (the binary to put in; default: cargo build --profile dist
# --locked -p gpu-warden, then target/dist/gpu-warden: Cargo.toml's shipped profile), IMAGE_NAME (default
# ghcr.io/gpu-warden/gpu-warden), IMAGE_TAG (default: the version in Cargo.toml),
# SOURCE_DATE_EPOCH (file and image timestamps and the created label; default: the time of
# the last commit that changed the image's inputs), IMAGE_REVISION (default: that commit),
# IMAGE_SOURCE (the source label; default https://github.com/gpu-warden/gpu-warden).
#
# Writes into OUT_DIR:
#   gpu-warden-image.oci.tar   the image as an OCI archive (skopeo copy … oci-archive:…),
#                              tagged IMAGE_TAG; push it with scripts/image-push.sh;
#   gpu-warden-image.packages  the runtime layer's Debian packages (name version arch sha256);
#   gpu-warden-image.digest    the image's manifest digest (sha256:…), as a registry will show it;
#   gpu-warden-image.rootfs/   the root filesystem that went into the image.
# The filesystem comes from scripts/image-rootfs.sh, the same recipe the Dockerfile runs; the
# entrypoint, user and exposed port are read from the Dockerfile's final stage, so both
# builds give the same image (docs/deploy.md, "Image").
# Needs root and Debian: installs buildah, skopeo (and umoci, for deploy/tests/check_image.py)
# with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-$ROOT/target/artifacts}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
NAME=${IMAGE_NAME:-ghcr.io/gpu-warden/gpu-warden}
TAG=${IMAGE_TAG:-$VERSION}
# The last change to what goes into the image, so a commit that touches only docs or tests
# rebuilds the same image (same binary and .debs: same digest).
inputs=(src examples build.rs link Cargo.toml Cargo.lock crates/heap-trim crates/nvml-scoped Dockerfile scripts/image-rootfs.sh scripts/image-build.sh)
# Not exported to cargo: the cc crate's build scripts (ring) read it, and a changed value
# rebuilds every dependency.
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct -- "${inputs[@]}" 2>/dev/null || true)}
EPOCH=${EPOCH:-0}

[ "$(id -u)" = 0 ] || { echo "$0: needs root (buildah's vfs storage, file ownership)" >&2; exit 1; }
need=()
for tool in buildah skopeo umoci; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]} (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

BIN=${GPU_WARDEN_RELEASE_BIN:-}
if [ -z "$BIN" ]; then
  echo "== cargo build --profile dist --locked -p gpu-warden"
  cargo build -q --profile dist --locked -p gpu-warden
  BIN=${CARGO_TARGET_DIR:-target}/dist/gpu-warden
  # The dist binary this toolchain links must be laid out by link/hot-symbols.txt
  # (build.rs): the agent's resident memory depends on it (docs/performance.md). A stale
  # list (functions renamed since it was recorded) is a WARN line with its cost, not a failure.
  echo "== link order (scripts/link_order.py check)"
  python3 scripts/link_order.py check "$BIN"
fi

# The image configuration, from the Dockerfile's final stage (one source for both builds).
final=$(awk 'toupper($1) == "FROM" { stage = "" } { stage = stage $0 "\n" } END { printf "%s", stage }' Dockerfile)
USER_=$(printf '%s' "$final" | awk 'toupper($1) == "USER" { print $2 }' | tail -1)
PORTS=$(printf '%s' "$final" | awk 'toupper($1) == "EXPOSE" { $1 = ""; print }' | xargs)
ENTRY=$(printf '%s' "$final" | sed -n 's/^ENTRYPOINT[[:space:]]*//p' | tail -1)
if [ -z "$USER_" ] || [ -z "$PORTS" ] || [ "${ENTRY:0:1}" != "[" ]; then
  echo "$0: the Dockerfile's final stage needs USER, EXPOSE and an exec-form ENTRYPOINT" >&2
  exit 1
fi

echo "== root filesystem (scripts/image-rootfs.sh)"
ROOTFS=$OUT/gpu-warden-image.rootfs
rm -rf "$ROOTFS"
SOURCE_DATE_EPOCH=$EPOCH scripts/image-rootfs.sh "$ROOTFS" "$BIN" "$OUT/gpu-warden-image.packages"

echo "== buildah (vfs), from scratch"
STORE=$(mktemp -d -t gpu-warden-buildah.XXXXXX)
BUILDAH=(buildah --root "$STORE/root" --runroot "$STORE/run" --storage-driver vfs)
ctr=
cleanup() {
  [ -n "$ctr" ] && "${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1
  rm -rf "$STORE" 2>/dev/null || true
}
trap cleanup EXIT
# One layer: the root filesystem as a tar with numeric owners (home/nonroot is 65532's).
tar --create --file "$STORE/rootfs.tar" --directory "$ROOTFS" --sort=name --numeric-owner \
  --mtime="@$EPOCH" .
ctr=$("${BUILDAH[@]}" from --quiet scratch)
"${BUILDAH[@]}" add --quiet "$ctr" "$STORE/rootfs.tar" /
# OCI annotation keys as labels (image-spec annotations.md). `revision` is the last commit
# that changed the image's inputs (as SOURCE_DATE_EPOCH is), so a docs-only commit keeps the
# digest; "-dirty" marks uncommitted changes to them. `created` is SOURCE_DATE_EPOCH's time.
REVISION=${IMAGE_REVISION:-$(git log -1 --format=%H -- "${inputs[@]}" 2>/dev/null || true)}
if [ -n "$REVISION" ] && [ -z "${IMAGE_REVISION:-}" ] && [ -n "$(git status --porcelain -- "${inputs[@]}" 2>/dev/null)" ]; then
  REVISION=$REVISION-dirty
fi
CREATED=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)
DESCRIPTION=$(sed -n 's/^description = "\(.*\)"/\1/p' Cargo.toml | head -1)
SOURCE=${IMAGE_SOURCE:-https://github.com/gpu-warden/gpu-warden}
config=(--user "$USER_" --entrypoint "$ENTRY" --cmd '' --workingdir /
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  --label org.opencontainers.image.title=gpu-warden
  --label "org.opencontainers.image.description=$DESCRIPTION"
  --label "org.opencontainers.image.version=$VERSION"
  --label "org.opencontainers.image.revision=${REVISION:-unknown}"
  --label "org.opencontainers.image.created=$CREATED"
  --label "org.opencontainers.image.source=$SOURCE"
  --label org.opencontainers.image.licenses=Apache-2.0)
# Docker writes EXPOSE 9400 as "9400/tcp"; buildah as given.
for p in $PORTS; do [[ $p == */* ]] || p=$p/tcp; config+=(--port "$p"); done
"${BUILDAH[@]}" config "${config[@]}" "$ctr"
# --identity-label=false: no io.buildah.version label, so the digest does not depend on the
# builder's version (buildah 1.26 and later).
"${BUILDAH[@]}" commit --quiet --identity-label=false --timestamp "$EPOCH" --format oci "$ctr" "$NAME:$TAG" >/dev/null

echo "== skopeo copy → OCI archive"
rm -f "$OUT/gpu-warden-image.oci.tar"
skopeo copy --quiet "containers-storage:[vfs@$STORE/root+$STORE/run]$NAME:$TAG" \
  "oci-archive:$OUT/gpu-warden-image.oci.tar:$TAG"
skopeo inspect --format '{{.Digest}}' "oci-archive:$OUT/gpu-warden-image.oci.tar:$TAG" > "$OUT/gpu-warden-image.digest"
size=$(stat -c %s "$OUT/gpu-warden-image.oci.tar")
echo "image $NAME:$TAG: $(cat "$OUT/gpu-warden-image.digest"), OCI archive $((size / 1024)) KiB," \
  "user $USER_, ports $PORTS, entrypoint $ENTRY"
echo "runtime layer packages:"
sed 's/^/  /' "$OUT/gpu-warden-image.packages"
