#!/usr/bin/env bash
# Runs the unmodified amazon_kclpy sample record processor as a multilang child, its stderr appended to
# a per-process file in $KCL_BENCH_COUNT_DIR. The sample writes "Record (Partition Key: ..." without a
# newline, which the Java daemon (reading its child's stderr by lines) would only pass on when the child
# exits; a file per child lets kcl-bench.py count records as they are processed, the same way for the
# Java MultiLangDaemon and for leasehold-worker. exec: no extra process in the CPU figures.
KCLPY="${KCLPY:-${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/kclpy/amazon_kclpy-3.2.0}"
export KCLPY
APP="$KCLPY/samples/sample_kclpy_app.py"
# kcl-bench.py --spread: the same sample, each record paying a fixed cost on its consumer's one CPU.
[ -z "${KCL_BENCH_RECORD_COST_MS:-}" ] || APP="$(dirname "$0")/kcl-spread-sample.py"
export PYTHONPATH="$KCLPY${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1  # count records as written, not when an 8 KiB buffer fills
exec "${KCL_BENCH_PYTHON:-python3}" "$APP" 2>>"${KCL_BENCH_COUNT_DIR:?}/$$.err"
