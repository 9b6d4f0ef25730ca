# syntax=docker/dockerfile:1
# gpu-warden container image: a glibc Rust build in Debian 12, run on distroless/cc
# (glibc, libgcc, CA certificates; no shell, no package manager) as UID 65532.
#
#   docker build -t ghcr.io/gpu-warden/gpu-warden:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/gpu-warden:<tag> --push .
#
# libnvidia-ml.so.1 is NOT in the image: the NVIDIA container runtime mounts the host
# driver's copy at run time (NVIDIA_DRIVER_CAPABILITIES=utility in the DaemonSet), so the
# image works with whatever driver each node runs. See docs/deploy.md.

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole workspace: Cargo needs every member's manifest and the declared bench target
# to load the workspace, even to build one package. .dockerignore keeps target/ and .git out.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gpu-warden \
 && install -D -m 0755 target/release/gpu-warden /out/gpu-warden

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpu-warden /gpu-warden
# 65532:65532, distroless's "nonroot"; the DaemonSet also sets runAsUser/runAsNonRoot.
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["/gpu-warden"]
