#!/usr/bin/env bash
# The Java KCL MultiLangDaemon and leasehold-worker side by side on the emulators, running the same
# unmodified amazon_kclpy sample on the same backlog (`make bench-kcl`). Installs what the comparison
# needs into the cache (the KCL jars with Maven, amazon_kclpy, boto3 in a venv), builds the release
# worker, then runs tests/ground/kcl-bench.py with the given arguments (default: all, 100,000 records).
source "$(dirname "$0")/common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
# kcl-sample.sh (the child both consumers run) finds the sample through KCLPY.
KCLPY="$("$HERE/kclpy.sh")"
export KCLPY
"$HERE/kcl-java.sh" install >/dev/null
# The KCL 3.x beside it (consumer java3): its jars, and the separate moto that keeps its tables.
KCL_VERSION="${KCL3_VERSION:-3.1.3}" "$HERE/kcl-java.sh" install >/dev/null
"$HERE/moto-kcl.sh" start
PY="$(pinned_venv aws)"   # boto3, pinned: tests/ground/python/aws.txt
log "building the release worker"
cargo build --locked --quiet --release -p leasehold-worker --bin leasehold-worker
export LEASEHOLD_WORKER_BIN="${CARGO_TARGET_DIR:-$LEASEHOLD_CACHE/target}/release/leasehold-worker"
[ $# -gt 0 ] || set -- all --records 100000
exec "$PY" "$HERE/kcl-bench.py" "$@"
