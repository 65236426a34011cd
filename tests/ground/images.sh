#!/usr/bin/env bash
# The project's images as OCI archives, built without a container daemon, and imported into the real
# node's containerd (tests/ground/node.sh).
#
#   tests/ground/images.sh build    # static binaries -> worker.tar, operator.tar; pause.tar;
#                                   # http-sink.tar (the http processor's test sidecar, worker/examples/http_sink.rs)
#   tests/ground/images.sh pause    # only the pause image (a few lines of C, linked statically)
#   tests/ground/images.sh check    # each archive agrees with its images/*.Dockerfile (user, entrypoint, files)
#   tests/ground/images.sh import   # load the archives into the running node's containerd
#   tests/ground/images.sh sizes    # markdown table of the archive and layer sizes
#
# Content is that of images/*.Dockerfile: FROM scratch, the static binary, the CA bundle, user 65532,
# the binary as entrypoint. The Dockerfiles build for musl; this machine has no musl target, so the
# binaries link glibc statically (+crt-static), as tests/ground/check-binaries.sh does.
# Archives go to $LEASEHOLD_CACHE/images; names are the chart's defaults (ghcr.io/leasehold/*:<version>).
# LEASEHOLD_IMAGE_PROFILE picks the cargo profile of the binaries: `release` (the default: what ships,
# what docs/benchmarks.md measures) or `test-image` (Cargo.toml: unoptimized, stripped; `make test` uses
# it, because a cold CI machine would otherwise spend ~15 minutes on an optimized build of every
# dependency for images the tests only run).
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$LEASEHOLD_CACHE/images"
OCI="$ROOT/tests/ground/oci-image.py"
TARGET=x86_64-unknown-linux-gnu
STATIC_TARGET_DIR="${CARGO_TARGET_DIR:-$LEASEHOLD_CACHE/target-static}"
PROFILE="${LEASEHOLD_IMAGE_PROFILE:-release}"
VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/leasehold/Chart.yaml")"
PAUSE_IMAGE=leasehold.local/pause:3.10
HTTP_SINK_IMAGE=leasehold.local/http-sink:test
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

pause() {
  command -v gcc >/dev/null || die "gcc is needed for the pause image (apt-get install gcc libc6-dev)"
  mkdir -p "$OUT"
  local src="$ROOT/images/pause/pause.c" stamp
  stamp="$OUT/.pause-$(sha256sum "$src" | cut -c1-16)"
  [ -f "$stamp" ] && [ -f "$OUT/pause.tar" ] && return 0
  local tmp
  tmp="$(mktemp -d)"
  gcc -Os -static -s -o "$tmp/pause" "$src" || { rm -rf "$tmp"; die "gcc pause.c failed"; }
  python3 "$OCI" build --out "$OUT/pause.tar" --name "$PAUSE_IMAGE" --user 65535:65535 --entrypoint /pause \
    --file "$tmp/pause:/pause:755" > "$OUT/pause.json"
  rm -rf "$tmp" "$OUT"/.pause-*
  touch "$stamp"
  log "pause image: $OUT/pause.tar"
}

build() {
  pause
  [ -f "$CA_BUNDLE" ] || die "$CA_BUNDLE is missing (apt-get install ca-certificates)"
  log "building the $PROFILE binaries, statically linked (target dir $STATIC_TARGET_DIR)"
  (cd "$ROOT" && RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$STATIC_TARGET_DIR" \
    cargo build --profile "$PROFILE" --locked --target "$TARGET" \
    -p leasehold-worker --bin leasehold-worker --example http_sink \
    -p leasehold-operator --bin leasehold-operator >&2) ||
    die "cargo build --profile $PROFILE failed"
  local component bin target_dir
  # Where cargo really put them (a cargo wrapper may choose the target dir).
  target_dir="$(cd "$ROOT" && CARGO_TARGET_DIR="$STATIC_TARGET_DIR" cargo metadata --format-version 1 --no-deps |
    jq -r .target_directory)"
  for component in worker operator; do
    bin="$target_dir/$TARGET/$PROFILE/leasehold-$component"
    file -b "$bin" | grep -q 'statically linked\|static-pie' || die "$bin is not statically linked: $(file -b "$bin")"
    python3 "$OCI" build --out "$OUT/$component.tar" --name "ghcr.io/leasehold/$component:$VERSION" \
      --user 65532:65532 --entrypoint "/leasehold-$component" \
      --file "$CA_BUNDLE:$CA_BUNDLE:644" --file "$bin:/leasehold-$component:755" > "$OUT/$component.json"
    log "$component image: $OUT/$component.tar ($(jq -r .name "$OUT/$component.json"))"
  done
  # Not a product image: the receiving end of the http processor, run as a sidecar by the node tests.
  bin="$target_dir/$TARGET/$PROFILE/examples/http_sink"
  file -b "$bin" | grep -q 'statically linked\|static-pie' || die "$bin is not statically linked: $(file -b "$bin")"
  python3 "$OCI" build --out "$OUT/http-sink.tar" --name "$HTTP_SINK_IMAGE" --user 65532:65532 \
    --entrypoint /http-sink --file "$bin:/http-sink:755" > "$OUT/http-sink.json"
  log "http-sink image: $OUT/http-sink.tar ($HTTP_SINK_IMAGE)"
  check
}

check() {
  local component status=0
  for component in worker operator; do
    [ -f "$OUT/$component.tar" ] || die "$OUT/$component.tar is missing: run tests/ground/images.sh build"
    python3 "$OCI" check --dockerfile "$ROOT/images/$component.Dockerfile" --archive "$OUT/$component.tar" || status=1
  done
  return $status
}

import() {
  local state="$LEASEHOLD_STATE/node.env" archive
  [ -f "$state" ] || die "the node is not running: tests/ground/node.sh start"
  local sock
  sock="$(sed -n 's/^CONTAINERD_ADDRESS=//p' "$state")"
  for archive in "$OUT"/*.tar; do
    ctr --address "$sock" -n k8s.io images import "$archive" >/dev/null || die "ctr images import $archive failed"
    log "imported $(jq -r .name "${archive%.tar}.json")"
  done
}

sizes() {
  echo "| image | archive | layer (uncompressed) |"
  echo "|---|---|---|"
  local j
  for j in "$OUT"/worker.json "$OUT"/operator.json "$OUT"/pause.json; do
    [ -f "$j" ] || continue
    jq -r '"| `\(.name)` | \(.archive_bytes / 1048576 * 10 | round / 10) MiB | \(.layer_bytes / 1048576 * 10 | round / 10) MiB |"' "$j"
  done
}

case "${1:-}" in
  build) build ;;
  pause) pause ;;
  check) check ;;
  import) import ;;
  sizes) sizes ;;
  *) echo "usage: $0 build|pause|check|import|sizes" >&2; exit 2 ;;
esac
