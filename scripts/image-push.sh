#!/usr/bin/env bash
# Pushes the image scripts/image-build.sh built (an OCI archive) to a registry with skopeo;
# no Docker daemon needed.
#
#   scripts/image-push.sh REGISTRY/REPOSITORY[:TAG] [ARCHIVE]
#
# ARCHIVE defaults to target/artifacts/gpu-warden-image.oci.tar; TAG to the version in
# Cargo.toml (the archive's tag). Credentials: skopeo's (`skopeo login`, or
# REGISTRY_AUTH_FILE). Amazon ECR:
#
#   aws ecr create-repository --repository-name platform/gpu-warden        # once
#   aws ecr get-login-password --region eu-west-1 |
#     skopeo login --username AWS --password-stdin 123456789012.dkr.ecr.eu-west-1.amazonaws.com
#   scripts/image-push.sh 123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/gpu-warden:0.1.0
#
# Prints the pushed digest; pin it in the chart with image.digest (the tag can move, the
# digest cannot).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
DEST=$1
ARCHIVE=${2:-target/artifacts/gpu-warden-image.oci.tar}
[ -f "$ARCHIVE" ] || { echo "$0: no $ARCHIVE; build it with scripts/image-build.sh" >&2; exit 1; }
command -v skopeo >/dev/null || { echo "$0: skopeo missing (apt-get install skopeo)" >&2; exit 1; }
case ${DEST##*/} in
  *:*) ;;
  *) DEST=$DEST:$VERSION ;;
esac
digestfile=$(mktemp)
trap 'rm -f "$digestfile"' EXIT
# The archive holds one image (scripts/image-build.sh tags it IMAGE_TAG), so no reference.
skopeo copy --digestfile "$digestfile" "oci-archive:$ARCHIVE" "docker://$DEST"
echo "pushed $DEST@$(cat "$digestfile")"
