#!/usr/bin/env bash
# Runs the unmodified amazon_kclpy sample record processor as a multilang child, its stderr appended to
# a per-process file in $KCL_BENCH_COUNT_DIR. The sample writes "Record (Partition Key: ..." without a
# newline, which the Java daemon (reading its child's stderr by lines) would only pass on when the child
# exits; a file per child lets kcl-bench.py count records as they are processed, the same way for the
# Java MultiLangDaemon and for leasehold-worker. exec: no extra process in the CPU figures.
KCLPY="${KCLPY:-${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/kclpy/amazon_kclpy-3.2.0}"
export PYTHONPATH="$KCLPY${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1  # count records as written, not when an 8 KiB buffer fills
exec "${KCL_BENCH_PYTHON:-python3}" "$KCLPY/samples/sample_kclpy_app.py" 2>>"${KCL_BENCH_COUNT_DIR:?}/$$.err"
