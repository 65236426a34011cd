#!/usr/bin/env bash
# `leasehold import-kcl` against a lease table written by the real Java KCL 2.5.4 MultiLangDaemon
# (`make test-kcl-import`; KCL_VERSION=3.1.3 for the KCL 3.x, its tables on tests/ground/moto-kcl.sh): the KCL processes part of a stream (plain records and KPL aggregates made
# by AWS's aws-kinesis-agg), checkpoints inside an aggregate on one shard, and is killed mid-stream;
# the CLI imports its checkpoints; a leasehold-worker then processes every record after the KCL's
# checkpoints and none before them (0 gaps, 0 repeats beyond the KCL's own uncheckpointed tail).
# Needs the emulators (tests/ground/emulators.sh start) and python3; installs a JDK and Maven when missing
# (tests/ground/kcl-java.sh). Run by `make test` through cli/tests/import_kcl_java.rs.
source "$(dirname "$0")/common.sh"
HERE="$(cd "$(dirname "$0")" && pwd)"
KCLPY="$("$HERE/kclpy.sh")"
export KCLPY
"$HERE/kcl-java.sh" install >/dev/null
# The KCL 3.x (KCL_VERSION=3.1.3, `make test` runs it as cli/tests/import_kcl3_java.rs) keeps its tables in
# the separate moto of tests/ground/moto-kcl.sh: dynalite refuses its lease table's GSI (docs/testing.md).
if [[ "${KCL_VERSION:-2.5.4}" == 3.* ]] && [ -z "${LEASEHOLD_KCL_DYNAMODB_ENDPOINT:-}" ]; then
  MOTO_KCL_ENV="$("$HERE/moto-kcl.sh" status)" \
    || die "the KCL 3.x's DynamoDB (moto) is not running: start it with tests/ground/moto-kcl.sh start (make test does)"
  LEASEHOLD_KCL_DYNAMODB_ENDPOINT="$(sed -n 's/^LEASEHOLD_KCL_DYNAMODB_ENDPOINT=//p' <<<"$MOTO_KCL_ENV")"
  export LEASEHOLD_KCL_DYNAMODB_ENDPOINT
fi
PY="$(pinned_venv aws)"   # boto3 and aws-kinesis-agg, pinned: tests/ground/python/aws.txt
# The cargo test that runs this script (cli/tests/import_kcl_java.rs) passes the binaries it was built
# with: a cargo build from inside `cargo test` would wait on the build directory's lock.
if [ -z "${LEASEHOLD_BIN:-}" ] || [ -z "${LEASEHOLD_WORKER_BIN:-}" ]; then
  log "building leasehold and leasehold-worker"
  cargo build --locked --quiet -p leasehold-cli --bin leasehold -p leasehold-worker --bin leasehold-worker
  TARGET="${CARGO_TARGET_DIR:-$LEASEHOLD_CACHE/target}/debug"
  export LEASEHOLD_BIN="$TARGET/leasehold" LEASEHOLD_WORKER_BIN="$TARGET/leasehold-worker"
fi
[ -x "$LEASEHOLD_BIN" ] || die "$LEASEHOLD_BIN is missing"
[ -x "$LEASEHOLD_WORKER_BIN" ] || die "$LEASEHOLD_WORKER_BIN is missing"
exec "$PY" "$HERE/kcl-import.py" "$@"
