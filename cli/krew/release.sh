#!/usr/bin/env bash
# Builds the kubectl plugin's release archive and writes its krew manifest with the archive's real
# sha256 (`make release-cli`). Nothing is published: upload the archive to BASE_URL yourself (a GitHub
# release, an S3 bucket), then `kubectl krew install --manifest=<out>/leasehold.yaml`, or install
# straight from the files: `kubectl krew install --manifest=<out>/leasehold.yaml --archive=<archive>`.
#
#   cli/krew/release.sh --base-url URL [--out DIR] [--binary PATH]
#
# --base-url  where the archive will be downloadable from (the manifest's uri is URL/<archive name>)
# --out       where the archive and manifest go (default $CARGO_TARGET_DIR/krew, else target/krew)
# --binary    package this kubectl-leasehold instead of building it (`cargo build --release`)
# The version is the CLI crate's (cargo metadata); the platform is this machine's (linux/amd64 or arm64).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
die() { echo "release.sh: $*" >&2; exit 1; }

base_url="" out="" binary=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base-url) base_url="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --binary) binary="${2:-}"; shift 2 ;;
    *) die "unknown argument $1 (usage: $0 --base-url URL [--out DIR] [--binary PATH])" ;;
  esac
done
[ -n "$base_url" ] || die "--base-url is required: where the archive will be served from (https://...)"
case "$base_url" in
  https://*|http://*|file://*) ;;
  *) die "--base-url must be an https://, http:// or file:// URL, not $base_url" ;;
esac
base_url="${base_url%/}"

version="v$(cd "$ROOT" && cargo metadata --locked --no-deps --format-version 1 |
  jq -r '.packages[] | select(.name == "leasehold-cli") | .version')"
[ "$version" != "v" ] && [ "$version" != "vnull" ] || die "no version for leasehold-cli in cargo metadata"
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64|arm64) arch=arm64 ;;
  *) die "unsupported machine $(uname -m)" ;;
esac
os=linux
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
out="${out:-$target_dir/krew}"

if [ -z "$binary" ]; then
  (cd "$ROOT" && cargo build --locked --release -p leasehold-cli --bin kubectl-leasehold >&2) ||
    die "cargo build --release failed"
  binary="$target_dir/release/kubectl-leasehold"
fi
[ -x "$binary" ] || die "$binary is not an executable"

mkdir -p "$out"
name="leasehold-$version-$os-$arch.tar.gz"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$binary" "$stage/kubectl-leasehold"
# Reproducible: fixed owner, order and time, so one binary always gives one checksum.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - . | gzip -n > "$out/$name"
sha="$(sha256sum "$out/$name" | cut -d' ' -f1)"

cat > "$out/leasehold.yaml" <<EOF
# krew plugin manifest for \`kubectl leasehold\`, written by cli/krew/release.sh for $name
# (sha256 of that file below). https://krew.sigs.k8s.io/docs/developer-guide/plugin-manifest/
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: leasehold
spec:
  version: $version
  shortDescription: Describe, rewind, pause and drain Leasehold Kinesis consumers
  description: |
    Day-2 tool for Leasehold StreamConsumers (Kinesis consumers on Kubernetes): describe a consumer's
    shards, owners, checkpoints and workers; reset checkpoints (dry run first, conditional writes,
    refused while workers run); pause and resume; drain one worker by cooperative handoff; import the
    checkpoints of a Java KCL application to switch without reprocessing.
  platforms:
    - selector:
        matchLabels:
          os: $os
          arch: $arch
      uri: $base_url/$name
      sha256: "$sha"
      bin: kubectl-leasehold
      files:
        - from: kubectl-leasehold
          to: .
EOF
echo "$out/$name"
echo "$out/leasehold.yaml"
