# memring container image: build in the Rust image, run from a slim Debian with
# only the binary and a default config.
#   docker build -t memring .
#   docker run -v $PWD/my.toml:/etc/memring/memring.toml:ro -p 22122:22122 memring

FROM rust:1-bookworm AS builder
WORKDIR /src
# Cargo reads the whole manifest, including the [[bench]] targets, so bench/
# must be present even though only the binary is built.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY bench ./bench
RUN cargo build --release --locked --bin memring

FROM debian:bookworm-slim
# memring needs no root: it only listens on an unprivileged port.
RUN groupadd --system --gid 10001 memring \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --shell /usr/sbin/nologin memring
COPY --from=builder /src/target/release/memring /usr/local/bin/memring
# A placeholder config (one server, `memcached:11211`). Mount your own file over
# /etc/memring/memring.toml; `memring check FILE` validates it first.
COPY config/docker.toml /etc/memring/memring.toml
EXPOSE 22122
# The memring user, by number so that Kubernetes runAsNonRoot can verify it.
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/memring"]
CMD ["--config", "/etc/memring/memring.toml"]
