# syntax=docker/dockerfile:1
# gpu-warden container image, for builds with network access (docker build, buildx).
#
#   docker build -t registry.example.com/platform/gpu-warden:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/gpu-warden:<tag> --push .
#
# A thin wrapper over the recipe CI builds daemonless with scripts/image-build.sh: the same
# scripts/image-rootfs.sh assembles the root filesystem from Debian 12 packages (glibc,
# libgcc, CA certificates: distroless/cc's runtime layer, no shell, no package manager) with
# a nonroot user 65532 and /tmp, and image-build.sh reads USER, EXPOSE and ENTRYPOINT below.
# So both give the same files, user, port and entrypoint (docs/deploy.md, "Image").
#
# libnvidia-ml.so.1 is NOT in the image: the NVIDIA container runtime mounts the host
# driver's copy at run time (NVIDIA_DRIVER_CAPABILITIES=utility in the DaemonSet), so the
# image works with whatever driver each node runs.

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole workspace: Cargo needs every member's manifest and the declared bench target
# to load the workspace, even to build one package. .dockerignore keeps target/ and .git out.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p gpu-warden \
 && install -D -m 0755 target/dist/gpu-warden /out/gpu-warden

# The runtime layer, from Debian packages (apt-get download + dpkg-deb -x), as in CI.
FROM debian:bookworm-slim AS rootfs
COPY scripts/image-rootfs.sh /usr/local/bin/image-rootfs.sh
COPY --from=build /out/gpu-warden /out/gpu-warden
RUN apt-get update -qq \
 && image-rootfs.sh /rootfs /out/gpu-warden /rootfs-packages.txt \
 && cat /rootfs-packages.txt

FROM scratch
# COPY --from keeps the owners and modes image-rootfs.sh set (/tmp 1777, /home/nonroot 65532).
COPY --from=rootfs /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# 65532:65532, "nonroot" in the image's /etc/passwd; the DaemonSet also sets runAsUser/runAsNonRoot.
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["/gpu-warden"]
