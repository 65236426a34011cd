# The operator image: a static binary on scratch, non-root, for a read-only root filesystem.
# Build from the repository root:  docker build -f images/operator.Dockerfile -t leasehold/operator .
FROM rust:1.95-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl \
 && apt-get update && apt-get install -y --no-install-recommends musl-tools cmake clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p leasehold-operator --bin leasehold-operator \
 && cp target/x86_64-unknown-linux-musl/release/leasehold-operator /leasehold-operator

FROM scratch
# TLS roots for the AWS endpoints.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /leasehold-operator /leasehold-operator
USER 65532:65532
ENTRYPOINT ["/leasehold-operator"]
