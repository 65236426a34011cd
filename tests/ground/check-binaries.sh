#!/usr/bin/env bash
# What can be checked of the images without a container engine: the release binaries link statically
# and how big they are. The images build for musl (images/*.Dockerfile); this machine has no musl
# target, so the check links glibc statically (+crt-static), the nearest equivalent.
source "$(dirname "$0")/common.sh"
cd "$(dirname "$0")/../.."
target_dir="$LEASEHOLD_CACHE/target-static"
RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target_dir" \
  cargo build --release --locked --target x86_64-unknown-linux-gnu \
  -p leasehold-worker --bin leasehold-worker -p leasehold-operator --bin leasehold-operator >&2
status=0
for bin in leasehold-worker leasehold-operator; do
  path="$target_dir/x86_64-unknown-linux-gnu/release/$bin"
  size=$(stat -c %s "$path")
  kind=$(file -b "$path")
  if echo "$kind" | grep -q "static"; then linked=static; else linked=dynamic; status=1; fi
  awk -v b="$bin" -v l="$linked" -v s="$size" -v k="$kind" 'BEGIN { printf "%s: %s, %.1f MiB (%s)\n", b, l, s / 1048576, k }'
done
exit $status
