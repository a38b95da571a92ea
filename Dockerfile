# syntax=docker/dockerfile:1
# kubegrace images for anyone with Docker or Buildah: one target per image, each FROM
# scratch (no shell, no libc: the binaries are static), non-root (65532), OCI labels.
#
#   docker build --target sidecar  -t kubegrace/sidecar:dev .
#   docker build --target operator -t kubegrace/operator:dev .
#   docker build --target demo-app -t kubegrace/demo-app:dev .
#   docker build --target loadgen  -t kubegrace/loadgen:dev .   (what `kubectl kubegrace verify` runs)
#   docker buildx build --platform linux/amd64,linux/arm64 --target sidecar ...
#   buildah build --target sidecar -t kubegrace/sidecar:dev .
#
# BINARIES picks where the binaries come from:
#   source    (default) built here from the checkout by e2e/images/build-static, natively
#             for each platform (arm64 under emulation when the host is amd64); needs the
#             rust image and crates.io;
#   prebuilt  copied from dist/<TARGETARCH>/ in the build context, as build-static writes
#             them (`e2e/images/build-static arm64 dist/arm64 kubegrace-sidecar:kubegrace-sidecar`,
#             cross-compiled); nothing is pulled, so this works offline. The release
#             workflow builds this way.
# The project's own offline tool, e2e/cluster/images, writes the same images as OCI
# archives without a container engine (plus an empty /tmp, which these leave out: the
# chart mounts an emptyDir there for the operator, and the sidecar writes no files).
ARG BINARIES=source
ARG RUST_VERSION=1.90

FROM rust:${RUST_VERSION}-bookworm AS source
ARG TARGETARCH
# The revision baked into `--version` and kubegrace_build_info; .git is not in the context.
ARG KUBEGRACE_GIT_REVISION=unknown
WORKDIR /src
COPY . .
RUN KUBEGRACE_GIT_REVISION="${KUBEGRACE_GIT_REVISION}" CARGO_TARGET_DIR=/src/target \
    e2e/images/build-static "${TARGETARCH}" /out \
      kubegrace-sidecar:kubegrace-sidecar kubegrace-operator:kubegrace-operator \
      kubegrace-e2e:kubegrace-demo-app kubegrace-e2e:kubegrace-loadgen

FROM scratch AS prebuilt
ARG TARGETARCH
COPY dist/${TARGETARCH}/kubegrace-* /out/

# hadolint ignore=DL3006
FROM ${BINARIES} AS binaries

FROM scratch AS runtime
ARG VERSION=0.1.0
ARG KUBEGRACE_GIT_REVISION=unknown
LABEL org.opencontainers.image.source="https://github.com/kubegrace/kubegrace" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${KUBEGRACE_GIT_REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="kubegrace"
USER 65532:65532

FROM runtime AS demo-app
LABEL org.opencontainers.image.title="kubegrace-demo-app" \
      org.opencontainers.image.description="A deliberately naive HTTP/1.1, h2c, gRPC and WebSocket app to try kubegrace on"
COPY --from=binaries /out/kubegrace-demo-app /usr/local/bin/kubegrace-demo-app
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kubegrace-demo-app"]

FROM runtime AS loadgen
LABEL org.opencontainers.image.title="kubegrace-loadgen" \
      org.opencontainers.image.description="The load kubectl kubegrace verify sends through a rollout, recording every request outcome"
COPY --from=binaries /out/kubegrace-loadgen /usr/local/bin/kubegrace-loadgen
# 9000: GET /ready, POST /stop (the Job's control port).
EXPOSE 9000
ENTRYPOINT ["/usr/local/bin/kubegrace-loadgen"]

FROM runtime AS operator
LABEL org.opencontainers.image.title="kubegrace-operator" \
      org.opencontainers.image.description="kubegrace operator: GraceRoute controller and sidecar-injection webhook"
COPY --from=binaries /out/kubegrace-operator /usr/local/bin/kubegrace-operator
EXPOSE 9443 8080
ENTRYPOINT ["/usr/local/bin/kubegrace-operator"]

# Last, so a plain `docker build .` gives the sidecar.
FROM runtime AS sidecar
LABEL org.opencontainers.image.title="kubegrace-sidecar" \
      org.opencontainers.image.description="kubegrace sidecar: drain-aware inbound proxy"
COPY --from=binaries /out/kubegrace-sidecar /usr/local/bin/kubegrace-sidecar
EXPOSE 8080 15180
ENTRYPOINT ["/usr/local/bin/kubegrace-sidecar"]
