#!/usr/bin/env bash
# moto's server mode (PyPI `moto[server]`), standing in for SQS and S3: the on-failure destinations of
# retry.onExhausted deadLetter. Never for lease tables (its conditional writes are not atomic under
# concurrent requests; docs/testing.md). Installed into a venv in the cache, started on a free loopback
# port, shared like the emulators (a running server is left as it is).
#
#   tests/ground/moto.sh install   # the venv (idempotent)
#   tests/ground/moto.sh start     # install if needed, start unless running, wait until it answers
#   tests/ground/moto.sh stop      # stop it by PID
#   tests/ground/moto.sh status    # print the endpoint, exit 1 if not running
#
# The endpoint is written to $LEASEHOLD_STATE/moto.env (LEASEHOLD_MOTO_ENDPOINT), which the tests read.
MOTO_WHAT="moto"
MOTO_NAME=moto
MOTO_ENDPOINT=LEASEHOLD_MOTO_ENDPOINT
source "$(dirname "$0")/moto-server.sh"
moto_main "$@"
