#!/usr/bin/env bash
# Fetches the amazon_kclpy sdist (the Python side of the Java KCL MultiLangDaemon protocol) into the
# cache and prints the directory to put on PYTHONPATH. Its setup.py downloads jars at build time, which
# cannot work offline, so the sdist is unpacked rather than installed; the protocol code needs only the
# standard library.
source "$(dirname "$0")/common.sh"
VERSION=3.2.0
DIR="$LEASEHOLD_CACHE/kclpy/amazon_kclpy-$VERSION"
if [ ! -f "$DIR/amazon_kclpy/kcl.py" ]; then
  command -v python3 >/dev/null || die "python3 is needed for the multilang tests"
  mkdir -p "$LEASEHOLD_CACHE/kclpy"
  python3 -m pip download --quiet --no-deps --no-binary :all: "amazon_kclpy==$VERSION" -d "$LEASEHOLD_CACHE/kclpy" >&2
  tar -xzf "$LEASEHOLD_CACHE/kclpy/amazon_kclpy-$VERSION.tar.gz" -C "$LEASEHOLD_CACHE/kclpy"
fi
echo "$DIR"
