#!/usr/bin/env bash
# The container image on a real GPU (issue 17): the image's root filesystem, with the host
# driver's libnvidia-ml.so.1 and /dev/nvidia* made visible the way NVIDIA's container toolkit
# injects them, run as UID/GID 65532 with no capabilities and no_new_privs, with the host's
# /proc (hostPID: true) and /sys; then hw/validate-nvml.sh compares every family and
# every process's VRAM with nvidia-smi, against the agent in the image.
#
# Run as root on a GPU machine (no container runtime needed):
#   OUT=/tmp/out deploy/tests/image-h200.sh ROOTFS_TAR
# ROOTFS_TAR: the image's root filesystem as a tar (scripts/image-build.sh's
# gpu-warden-image.rootfs, packed with numeric owners), or the OCI archive's single layer.
# Needs python3 with torch (hw/gpu_load.py), pynvml, curl, setpriv (util-linux), mount.
set -euo pipefail
TAR=${1:?usage: $0 ROOTFS_TAR}
OUT=${OUT:-/tmp/gpu-warden-image-h200}
R=${ROOTFS:-/tmp/gpu-warden-image-rootfs}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
TAR=$(realpath "$TAR")

mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
rm -rf "$R" && mkdir -p "$R"
tar -xpf "$TAR" -C "$R" --numeric-owner

# What the NVIDIA container toolkit does for NVIDIA_DRIVER_CAPABILITIES=utility: the host's
# libnvidia-ml.so.<driver version> bind-mounted into the image's /usr/lib/<multiarch>, the
# libnvidia-ml.so.1 link ldconfig makes for it, and the device nodes (same major/minor, the
# host's mode).
lib=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 .*x86-64/ { print $NF; exit }')
real=$(readlink -f "$lib")
dest=$R/usr/lib/x86_64-linux-gnu/$(basename "$real")
touch "$dest" && mount --bind "$real" "$dest" && mounts+=("$dest")
mount -o remount,bind,ro "$dest" || true
ln -sf "$(basename "$real")" "$R/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
mkdir -p "$R/dev"
for node in /dev/nvidiactl /dev/nvidia[0-9]*; do
  # mknod with the host's major/minor and mode, as the runtime does; a bind mount of the
  # node where mknod is not allowed (gVisor).
  cp -a "$node" "$R/dev/" 2>/dev/null || { touch "$R/dev/${node#/dev/}" && mount --bind "$node" "$R/dev/${node#/dev/}" && mounts+=("$R/dev/${node#/dev/}"); }
done
# hostPID: true, and the /sys every container has.
mkdir -p "$R/proc" "$R/sys"
mount --bind /proc "$R/proc" && mounts+=("$R/proc")
mount --rbind /sys "$R/sys" && mounts+=("$R/sys")
mount --make-rslave "$R/sys" || true

{
  echo "## host"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "## injected"; ls -l "$R/usr/lib/x86_64-linux-gnu/" "$R/dev/"
  echo "## image root filesystem (top)"; ls -la "$R"
} > "$OUT/image-env.txt"

# The entrypoint as the image's runtime spec says (umoci: ["/gpu-warden"] as 65532:65532),
# with the image's environment only; exec all the way, so the PID is the agent's.
cat > /tmp/gpu-warden-in-image <<EOF
#!/bin/sh
exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin NODE_NAME=h200-image \\
  setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all \\
  chroot --userspec=65532:65532 --groups=65532 "$R" /gpu-warden --kube off "\$@"
EOF
chmod 0755 /tmp/gpu-warden-in-image

# The agent's identity, read while validate-nvml.sh runs it.
(
  for _ in $(seq 1 100); do
    pid=$(pgrep -x gpu-warden | head -1 || true)
    if [ -n "$pid" ] && grep -q '^Uid:.*65532' "/proc/$pid/status" 2>/dev/null; then
      sleep 2
      { echo "pid $pid, root $(readlink /proc/$pid/root)"
        grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs)' "/proc/$pid/status"
        echo "maps: $(grep -o '/usr/lib/x86_64-linux-gnu/libnvidia-ml[^ ]*' "/proc/$pid/maps" | sort -u | tr '\n' ' ')"
      } > "$OUT/agent-identity.txt"
      break
    fi
    sleep 0.2
  done
) &
status=0
OUT=$OUT hw/validate-nvml.sh /tmp/gpu-warden-in-image || status=1
wait || true
echo "## agent identity"; cat "$OUT/agent-identity.txt" 2>/dev/null || { echo "(not captured)"; status=1; }
grep -q 'CapEff:.*0000000000000000' "$OUT/agent-identity.txt" || status=1
grep -q 'NoNewPrivs:.*1' "$OUT/agent-identity.txt" || status=1
echo "image-h200: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
