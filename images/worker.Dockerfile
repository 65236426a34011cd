# The worker image: a static binary on scratch, non-root, for a read-only root filesystem.
# Build from the repository root:  docker build -f images/worker.Dockerfile -t leasehold/worker .
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools cmake clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p leasehold-worker --bin leasehold-worker \
 && cp target/x86_64-unknown-linux-musl/release/leasehold-worker /leasehold-worker

FROM scratch
# TLS roots for the AWS endpoints.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /leasehold-worker /leasehold-worker
USER 65532:65532
ENTRYPOINT ["/leasehold-worker"]
