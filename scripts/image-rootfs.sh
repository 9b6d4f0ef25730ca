#!/usr/bin/env bash
# The container image's root filesystem, assembled from Debian packages the way distroless
# is: no base image, no shell, no package manager. One recipe for both builds: CI's
# daemonless scripts/image-build.sh and the Dockerfile (its rootfs stage runs this script).
#
#   scripts/image-rootfs.sh ROOTFS BINARY [PACKAGE_LIST_OUT]
#
# ROOTFS (created, must not exist or be empty) receives:
#   - the runtime layer: the Debian packages in PACKAGES below, fetched with `apt-get
#     download` from the machine's apt sources (Debian 12 here and in the Dockerfile's
#     rust:1-bookworm stage) and unpacked with `dpkg-deb -x`; their maintainer scripts never
#     run, so what they would generate is written here: the CA bundle
#     /etc/ssl/certs/ca-certificates.crt. Documentation is dropped except each package's
#     copyright file; glibc's iconv modules (gconv) and locale data are dropped (the agent
#     uses neither). /var/lib/dpkg/status.d/<package> records each package, as distroless
#     does, so image scanners (Trivy, Grype) see the runtime layer's packages and versions;
#   - /etc/passwd and /etc/group with root, nobody and nonroot (65532:65532, distroless's
#     UID), /home/nonroot (65532, 0700), /tmp (1777: the simulator fallback needs it);
#   - BINARY as /gpu-warden (root-owned, 0755).
# PACKAGE_LIST_OUT (optional) receives the runtime layer's package list: name, version,
# architecture, the .deb's SHA-256 (an SBOM in brief).
# Files carry SOURCE_DATE_EPOCH (default: 0) as their modification time.
# Needs: apt-get, dpkg-deb (Debian), root (file ownership).
set -euo pipefail

# glibc, GCC's runtime (Rust's unwinder), CA certificates: what distroless/cc holds that the
# agent (ELF NEEDED: libc.so.6, libm.so.6, libgcc_s.so.1, ld-linux) uses. gcc-<N>-base is
# libgcc-s1's dependency that carries its copyright file; its version follows libgcc-s1.
PACKAGES=(libc6 libgcc-s1 ca-certificates)

if [ $# -lt 2 ]; then
  echo "usage: $0 ROOTFS BINARY [PACKAGE_LIST_OUT]" >&2
  exit 2
fi
ROOTFS=$1
BINARY=$2
LIST=${3:-}
EPOCH=${SOURCE_DATE_EPOCH:-0}
[ -x "$BINARY" ] || { echo "$0: $BINARY is not an executable" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "$0: must run as root (file ownership in the image)" >&2; exit 1; }
if [ -e "$ROOTFS" ] && [ -n "$(ls -A "$ROOTFS")" ]; then
  echo "$0: $ROOTFS is not empty" >&2
  exit 1
fi
mkdir -p "$ROOTFS"
ROOTFS=$(cd "$ROOTFS" && pwd)
DEBS=$(mktemp -d -t gpu-warden-debs.XXXXXX)
trap 'rm -rf "$DEBS"' EXIT

# -- the runtime layer
if ! (cd "$DEBS" && apt-get -o APT::Sandbox::User=root download -qq "${PACKAGES[@]}" 2>/dev/null); then
  # No package lists yet (a fresh container): fetch them once.
  apt-get update -qq
  (cd "$DEBS" && apt-get -o APT::Sandbox::User=root download -qq "${PACKAGES[@]}")
fi
base=$(dpkg-deb -f "$DEBS"/libgcc-s1_*.deb Depends | grep -o 'gcc-[0-9]*-base' | head -1)
(cd "$DEBS" && apt-get -o APT::Sandbox::User=root download -qq "$base")
PACKAGES+=("$base")
mkdir -p "$ROOTFS/var/lib/dpkg/status.d"
[ -n "$LIST" ] && : > "$LIST"
for pkg in "${PACKAGES[@]}"; do
  deb=$(ls "$DEBS/${pkg}"_*.deb)
  dpkg-deb -x "$deb" "$ROOTFS"
  # Package, Version, Architecture, … as dpkg's status file has them (distroless's status.d).
  { dpkg-deb -f "$deb"; echo "Status: install ok installed"; } > "$ROOTFS/var/lib/dpkg/status.d/$pkg"
  if [ -n "$LIST" ]; then
    printf '%s %s %s sha256:%s\n' "$pkg" "$(dpkg-deb -f "$deb" Version)" \
      "$(dpkg-deb -f "$deb" Architecture)" "$(sha256sum "$deb" | cut -d' ' -f1)" >> "$LIST"
  fi
done
# What ca-certificates' postinst (update-ca-certificates) would write: every certificate it
# ships, in one bundle, sorted as it sorts them.
mkdir -p "$ROOTFS/etc/ssl/certs"
find "$ROOTFS/usr/share/ca-certificates" -name '*.crt' -print0 | LC_ALL=C sort -z |
  xargs -0 cat > "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
[ -s "$ROOTFS/etc/ssl/certs/ca-certificates.crt" ] || { echo "$0: empty CA bundle" >&2; exit 1; }
# Nothing the agent runs: docs (copyright files stay), man pages, locales, iconv modules,
# lintian overrides, ca-certificates' update script and its configuration hooks.
find "$ROOTFS/usr/share/doc" -mindepth 2 -maxdepth 2 ! -name copyright -exec rm -rf {} +
rm -rf "$ROOTFS/usr/share/man" "$ROOTFS/usr/share/info" "$ROOTFS/usr/share/locale" \
  "$ROOTFS/usr/share/lintian" "$ROOTFS/usr/sbin" "$ROOTFS/etc/ca-certificates" \
  "$ROOTFS/usr/share/ca-certificates"
find "$ROOTFS" -type d -name gconv -prune -exec rm -rf {} +
find "$ROOTFS" -depth -type d -empty -delete
# Where NVIDIA's container toolkit mounts the host's libnvidia-ml.so.1 (on the loader's
# default path and in etc/ld.so.conf.d/<multiarch>.conf).
multiarch=$(basename "$(dirname "$(find "$ROOTFS/lib" -name 'libc.so.6' | head -1)")")
mkdir -p "$ROOTFS/usr/lib/$multiarch"
# -- users, /tmp, the binary
mkdir -p "$ROOTFS/etc" "$ROOTFS/tmp" "$ROOTFS/home/nonroot"
cat > "$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$ROOTFS/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
chmod 0644 "$ROOTFS/etc/passwd" "$ROOTFS/etc/group"
chmod 1777 "$ROOTFS/tmp"
chown 65532:65532 "$ROOTFS/home/nonroot"
chmod 0700 "$ROOTFS/home/nonroot"
install -m 0755 -o 0 -g 0 "$BINARY" "$ROOTFS/gpu-warden"
find "$ROOTFS" -exec touch -h -d "@$EPOCH" {} +
