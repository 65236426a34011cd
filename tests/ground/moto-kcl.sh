#!/usr/bin/env bash
# A SEPARATE moto server (the same pinned venv as tests/ground/moto.sh) on its own loopback port, used
# only as the DynamoDB of the Java KCL 3.x MultiLangDaemon (kcl-import-3x, `make bench-kcl`'s KCL 3.x
# column): KCL 3.x creates its lease table with a global secondary index (LeaseOwnerToLeaseKeyIndex)
# and two more tables (WorkerMetricStats, CoordinatorState), which dynalite refuses (docs/testing.md,
# "The Java KCL 3.x"). moto's conditional writes are not atomic under concurrent requests: the KCL 3.x
# figures measured on it carry that caveat; Leasehold's own lease tables stay on dynalite. The SQS/S3
# moto of moto.sh is never touched.
#
#   tests/ground/moto-kcl.sh install  # the venv (idempotent)
#   tests/ground/moto-kcl.sh start    # install if needed, start unless running, wait until it answers
#   tests/ground/moto-kcl.sh stop     # stop it by PID
#   tests/ground/moto-kcl.sh status   # print the endpoint, exit 1 if not running
#
# The endpoint is written to $LEASEHOLD_STATE/moto-kcl.env (LEASEHOLD_KCL_DYNAMODB_ENDPOINT).
MOTO_WHAT="moto for the KCL 3.x"
MOTO_NAME=moto-kcl
MOTO_ENDPOINT=LEASEHOLD_KCL_DYNAMODB_ENDPOINT
source "$(dirname "$0")/moto-server.sh"
moto_main "$@"
