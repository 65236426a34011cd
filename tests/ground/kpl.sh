#!/usr/bin/env bash
# Installs AWS's KPL aggregation library for Python (aws-kinesis-agg, pinned, with the two modules it
# imports: protobuf, and six, which it uses without declaring it) into a venv in the cache, and prints
# the path of that venv's python. Tests run tests/ground/kpl-agg.py with it to make KPL aggregates, so the
# worker's de-aggregation is checked against AWS's encoder rather than one written here.
#
#   tests/ground/kpl.sh            # install if needed (idempotent), print the python to run
source "$(dirname "$0")/common.sh"
# aws-kinesis-agg 1.2.3 with protobuf and six (which it uses without declaring), pinned in
# tests/ground/python/aws.txt.
py="$(pinned_venv aws)"
"$py" -c 'import aws_kinesis_agg.aggregator' >&2 || die "aws-kinesis-agg does not import"
echo "$py"
