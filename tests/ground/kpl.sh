#!/usr/bin/env bash
# Installs AWS's KPL aggregation library for Python (aws-kinesis-agg, pinned, with the two modules it
# imports: protobuf, and six, which it uses without declaring it) into a venv in the cache, and prints
# the path of that venv's python. Tests run tests/ground/kpl-agg.py with it to make KPL aggregates, so the
# worker's de-aggregation is checked against AWS's encoder rather than one written here.
#
#   tests/ground/kpl.sh            # install if needed (idempotent), print the python to run
source "$(dirname "$0")/common.sh"
AGG_VERSION=1.2.3
PROTOBUF_VERSION=7.36.2
SIX_VERSION=1.17.0
VENV="$LEASEHOLD_CACHE/kpl-agg/venv-$AGG_VERSION"
STAMP="$VENV/.installed-$AGG_VERSION-$PROTOBUF_VERSION-$SIX_VERSION"
if [ ! -f "$STAMP" ]; then
  command -v python3 >/dev/null || die "python3 is needed to make KPL aggregates (aws-kinesis-agg)"
  log "installing aws-kinesis-agg==$AGG_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "aws-kinesis-agg==$AGG_VERSION" "protobuf==$PROTOBUF_VERSION" "six==$SIX_VERSION" >&2
  "$VENV/bin/python" -c 'import aws_kinesis_agg.aggregator' >&2 || die "aws-kinesis-agg does not import"
  touch "$STAMP"
fi
echo "$VENV/bin/python"
