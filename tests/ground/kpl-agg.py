#!/usr/bin/env python3
"""Makes KPL aggregated records with AWS's aws-kinesis-agg library (run it with tests/ground/kpl.sh's python).

Reads JSON from stdin: {"records": [{"partition_key": str, "data_b64": str, "explicit_hash_key": str?}],
"max_size": int?, "max_records": int?}. Writes JSON to stdout: {"aggregates": [{"partition_key": str, "explicit_hash_key":
str|null, "data_b64": str, "user_records": int}]}, one entry per aggregated Kinesis record, in order;
the library starts a new aggregate when one would exceed max_size (default: its 1 MiB limit), and this
script when one holds max_records user records (default: no limit).
"""
import base64
import json
import sys

import aws_kinesis_agg
from aws_kinesis_agg.aggregator import RecordAggregator


def main():
    spec = json.load(sys.stdin)
    aggregator = RecordAggregator(spec.get("max_size", aws_kinesis_agg.MAX_BYTES_PER_RECORD))
    full = []
    for record in spec["records"]:
        done = aggregator.add_user_record(
            record["partition_key"], base64.b64decode(record["data_b64"]), record.get("explicit_hash_key"))
        if done is not None:
            full.append(done)
        if aggregator.get_num_user_records() >= spec.get("max_records", float("inf")):
            full.append(aggregator.clear_and_get())
    last = aggregator.clear_and_get()
    if last is not None:
        full.append(last)
    out = []
    for agg in full:
        partition_key, explicit_hash_key, data = agg.get_contents()
        out.append({"partition_key": partition_key, "explicit_hash_key": explicit_hash_key,
                    "data_b64": base64.b64encode(data).decode("ascii"), "user_records": agg.get_num_user_records()})
    json.dump({"aggregates": out}, sys.stdout)


if __name__ == "__main__":
    main()
