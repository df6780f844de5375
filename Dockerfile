# memring container image: build in the Rust image (the profile-guided build
# of scripts/build-release), run from a slim Debian with only the binary and a
# default config.
#   docker build --build-arg MEMRING_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t memring:0.1.0 .
#   docker run -v $PWD/memring:/etc/memring:ro -p 22122:22122 -p 9100:9100 memring:0.1.0
# (.git is not sent to the build, so the commit for `memring --version` comes
# from the build argument, or reads `unknown`.)
# Port 22122 is for memcached clients, 9100 for /metrics, /live and /ready
# (admin_listen in the config). config/kubernetes/sidecar.yaml runs the image as
# a Kubernetes sidecar.

FROM rust:1-bookworm AS builder
# protoc compiles etcd's protobuf files for the etcd client (membership in etcd).
# memcached, python3 and llvm-tools (llvm-profdata) are for the profile-guided
# build: scripts/build-release trains memring against local memcached servers.
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler=3.21.* \
        memcached=1.6.* python3=3.11.* \
    && rm -rf /var/lib/apt/lists/* \
    && rustup component add llvm-tools
WORKDIR /src
# Cargo reads the whole manifest, including the [[bench]] targets, so bench/
# must be present even though only the binary is built; bench/load is the
# training load.
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY bench ./bench
COPY scripts ./scripts
ARG MEMRING_GIT_COMMIT=unknown
RUN scripts/build-release

FROM debian:bookworm-slim
# memring needs no root: it only listens on unprivileged ports.
RUN groupadd --system --gid 10001 memring \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --shell /usr/sbin/nologin memring
COPY --from=builder /src/target/dist/memring /usr/local/bin/memring
# A placeholder config (one server, `memcached:11211`, admin on 0.0.0.0:9100).
# Mount your own file over /etc/memring/memring.toml; `memring check FILE`
# validates it first.
COPY config/docker.toml /etc/memring/memring.toml
EXPOSE 22122 9100
# `memring healthcheck` asks the admin listener for /ready, so the image needs
# no curl. It needs admin_listen on port 9100 in the config; without it the
# container shows as unhealthy (or run with --no-healthcheck). Kubernetes
# ignores HEALTHCHECK and uses its own probes.
HEALTHCHECK --interval=10s --timeout=3s CMD ["/usr/local/bin/memring", "healthcheck", "127.0.0.1:9100"]
# The memring user, by number so that Kubernetes runAsNonRoot can verify it.
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/memring"]
CMD ["--config", "/etc/memring/memring.toml"]
