#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into fuzz/corpus/<target>/seed-*, from the inputs the
tests use: the KPL fixtures (made by AWS's aws-kinesis-agg), amazon_kclpy's protocol lines, the http
processor's answer examples and Lambda's, the filter patterns of the tests and docs, lease rows, the
checkpoint forms, handoff notices, requeue headers and the specs of docs/worker.md.

Run it from anywhere (`python3 fuzz/seeds.py`); it only adds or rewrites seed-* files, so the inputs a
fuzz run added to the corpus stay. Standard library and PyYAML (for the docs' specs as JSON) only.
"""
import base64
import hashlib
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
MAGIC = bytes([0xF3, 0x89, 0x9A, 0xC2])
SEQ = "49590338271490256608559692538361571095921575989136588898"


def put(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes):
        data = json.dumps(data).encode()
    path = CORPUS / target / f"seed-{name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(tag, wire, payload):
    key = varint(tag << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def aggregate_body(keys, hash_keys, records):
    """The protobuf AggregatedRecord: records are (key index, hash key index or None, data, tags)."""
    body = b"".join(field(1, 2, k.encode()) for k in keys)
    body += b"".join(field(2, 2, h.encode()) for h in hash_keys)
    for key, hash_key, data, tags in records:
        record = field(1, 0, key)
        if hash_key is not None:
            record += field(2, 0, hash_key)
        if data is not None:
            record += field(3, 2, data)
        for tag_key, tag_value in tags:
            tag = field(1, 2, tag_key.encode()) if tag_key is not None else b""
            if tag_value is not None:
                tag += field(2, 2, tag_value.encode())
            record += field(4, 2, tag)
        body += field(3, 2, record)
    return body


def kpl():
    # The target tries each input as it is and framed (magic + input + MD5): bodies are the useful seeds,
    # whole aggregates exercise the framing checks.
    for fixture in sorted((ROOT / "worker/tests/fixtures/kpl").glob("*.json")):
        spec = json.loads(fixture.read_text())
        for i, agg in enumerate(spec["output"]["aggregates"][:2]):
            data = base64.b64decode(agg["data_b64"])
            if len(data) > 16 * 1024:
                continue
            put("kpl_aggregate", f"{fixture.stem}-{i}", data)
            put("kpl_aggregate", f"{fixture.stem}-{i}-body", data[4:-16])
    shapes = {
        "one": aggregate_body(["k"], [], [(0, None, b"x", [])]),
        "explicit-hash-keys": aggregate_body(
            ["a", "b"], ["0", "170141183460469231731687303715884105728", str(2**128 - 1)],
            [(0, 0, b"low", []), (1, 1, b"mid", []), (0, 2, b"top", [("t", "v")])]),
        "bad-hash-key": aggregate_body(["a"], ["12x"], [(0, 0, b"d", [])]),
        "hash-key-too-big": aggregate_body(["a"], [str(2**128)], [(0, 0, b"d", [])]),
        "missing-data": aggregate_body(["a"], [], [(0, None, None, [])]),
        "missing-tag-key": aggregate_body(["a"], [], [(0, None, b"d", [(None, "v")])]),
        "key-index-out-of-range": aggregate_body(["a"], [], [(3, None, b"d", [])]),
        "empty": aggregate_body(["a"], [], []),
        # One long key shared by many user records: the shape that once expanded without bound.
        "shared-key": aggregate_body(["k" * 300], [], [(0, None, b"", [])] * 64),
        "many-keys": aggregate_body([f"key-{i}" for i in range(64)], [], [(i, None, b"v", []) for i in range(64)]),
    }
    for name, body in shapes.items():
        put("kpl_aggregate", f"shape-{name}", body)
    body = shapes["one"]
    put("kpl_aggregate", "framed-bad-digest", MAGIC + body + b"\0" * 16)
    put("kpl_aggregate", "framed-too-short", MAGIC + b"\0" * 16)
    put("kpl_aggregate", "framed-ok", MAGIC + body + hashlib.md5(body).digest())
    put("kpl_aggregate", "plain", b'{"order": 7}')


def multilang():
    lines = {
        "status": {"action": "status", "responseFor": "processRecords"},
        "status-other": {"action": "status", "responseFor": "initialize"},
        "checkpoint-null": {"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None},
        "checkpoint-seq": {"action": "checkpoint", "sequenceNumber": SEQ, "subSequenceNumber": None},
        "checkpoint-sub": {"action": "checkpoint", "sequenceNumber": SEQ, "subSequenceNumber": 2},
        "checkpoint-past": {"action": "checkpoint", "sequenceNumber": SEQ + "0", "subSequenceNumber": 0},
        "checkpoint-number": {"action": "checkpoint", "sequenceNumber": 4959, "subSequenceNumber": -1},
        "checkpoint-leading-zeros": {"action": "checkpoint", "sequenceNumber": "000" + SEQ, "subSequenceNumber": 3},
        "unknown-action": {"action": "shutdown", "reason": "TERMINATE"},
    }
    for name, line in lines.items():
        put("multilang_message", name, json.dumps(line))
    # amazon_kclpy writes json.dumps(...) lines; a child may also print stray text before its answers.
    put("multilang_message", "session",
        "starting up\n" + "\n".join(json.dumps(lines[n]) for n in
                                    ["checkpoint-sub", "checkpoint-seq", "checkpoint-sub", "status"]) + "\n")
    put("multilang_message", "not-utf8", b"\xff\xfe{\"action\":\"status\"}\n")


def http():
    ids = ["shardId-000000000001-1", "shardId-000000000001-2", "shardId-000000000001-3-0"]
    answers = {
        "empty": "",
        "ok": "OK",
        "array": "[]",
        "object": "{}",
        "failed-null": {"failed": None},
        "failed-and-outputs": {
            "failed": [{"id": ids[1], "error": "busy"}, {"id": ids[2], "retryable": False, "error": "bad"}],
            "outputs": [{"id": ids[0], "data": "b25l", "carryPartitionKey": True},
                        {"id": ids[0], "data": "dHdv", "partitionKey": "mine"}],
        },
        "by-source": {"failed": [{"id": ids[0], "source": "kinesis:refunds"}]},
        "unknown-id": {"failed": [{"id": "shardId-000000000001-9"}]},
        "no-id": {"failed": [{"retryable": True}]},
        "not-a-list": {"failed": {"id": ids[0]}},
        "bad-base64": {"outputs": [{"id": ids[0], "data": "not base64!"}]},
        "lambda-partial": {"batchItemFailures": [{"itemIdentifier": "2"}]},
        "lambda-by-id": {"batchItemFailures": [{"itemIdentifier": ids[2]}]},
        "lambda-empty": {"batchItemFailures": []},
        "lambda-null": {"batchItemFailures": None},
        "lambda-no-identifier": {"batchItemFailures": [{}]},
        "lambda-empty-identifier": {"batchItemFailures": [{"itemIdentifier": ""}]},
        "lambda-unknown": {"batchItemFailures": [{"itemIdentifier": "77"}]},
        "single-outputs": {"outputs": [{"data": "b25l", "partitionKey": "k"}, {"data": "", "carryPartitionKey": True}]},
        "single-bad-output": {"outputs": [{"partitionKey": "k"}]},
    }
    for name, answer in answers.items():
        put("http_answer", name, answer)
    put("http_answer", "cut", json.dumps(answers["failed-and-outputs"])[:40])


FILTERS = [
    ([{"data": {"type": ["buy"], "n": [{"numeric": [">=", 10, "<", 30]}]}}], "plain-12", {"n": 12, "type": "buy"}),
    ([{"partitionKey": [{"prefix": "vip-"}]}], "vip-3", "not json 3"),
    ([{"data": {"$or": [{"note": [{"suffix": "!"}]}, {"urgent": [True]}]}}], "k", {"note": "hurry!"}),
    ([{"data": {"order": {"type": ["buy"], "quantity": [{"numeric": [">", 10, "<=", 1000]}]}}}], "k",
     {"order": {"type": "buy", "quantity": 11}}),
    ([{"data": {"UserID": [None]}}], "k", {"UserID": None}),
    ([{"data": {"Name": [{"equals-ignore-case": "alice"}]}}], "k", {"Name": "ALICE"}),
    ([{"data": {"Weather": [{"anything-but": ["Raining"]}]}}], "k", {"Weather": "Sunny"}),
    ([{"data": {"Weather": [{"anything-but": {"prefix": "Rain"}}]}}], "k", {"Weather": "Rainy"}),
    ([{"data": {"Price": [{"numeric": ["=", 100]}]}}], "k", {"Price": 100.0}),
    ([{"data": {"ProductName": [{"exists": False}]}}], "k", {"Other": [1, 2, {"ProductName": "x"}]}),
    ([{"data": {"Tags": ["a"]}}], "k", {"Tags": ["b", "a"]}),
    ([{"data": {"a": {"b": {"c": [1]}}}}, {"partitionKey": ["exact"]}], "exact", b"\x00binary"),
    ([{"data": {"x": [{"numeric": [">", "ten"]}]}}], "k", {"x": 1}),
    ([{"data": {"x": "not a list"}}], "k", {"x": 1}),
    ([[]], "k", {}),
]


def filters():
    for i, (patterns, key, data) in enumerate(FILTERS):
        data = data if isinstance(data, bytes) else json.dumps(data).encode()
        put("filter_pattern", f"{i:02}", json.dumps(patterns).encode() + b"\0" + key.encode() + b"\0" + data)
    put("filter_pattern", "one-object", json.dumps(FILTERS[0][0][0]).encode() + b"\0k\0" + b'{"type":"buy","n":10}')


def rows():
    base = {"lease_key": {"S": "orders:shardId-000000000001"}, "lease_counter": {"N": "7"},
            "checkpoint": {"S": "TRIM_HORIZON"}}
    items = {
        "free": base,
        "held": {**base, "lease_owner": {"S": "worker-a"}, "lease_expiry": {"N": "1700000000000"},
                 "checkpoint": {"S": SEQ}, "checkpoint_subsequence": {"N": "41"},
                 "parent_shard_ids": {"SS": ["shardId-000000000000"]}, "handoff_to": {"S": "worker-b"},
                 "stream_created": {"N": "1700000000123"}, "lag_ms": {"N": "250"}},
        "shard-end-with-sub": {**base, "checkpoint": {"S": "SHARD_END"}, "checkpoint_subsequence": {"N": "3"}},
        "at-timestamp": {**base, "checkpoint": {"S": "AT_TIMESTAMP:1700000000000"}},
        "negative-counter": {**base, "lease_counter": {"N": "-1"}},
        "counter-as-string": {**base, "lease_counter": {"S": "7"}},
        "no-colon": {**base, "lease_key": {"S": "nocolon"}},
        "other-types": {**base, "x": {"BOOL": True}, "y": {"NULL": True}, "z": {"L": [{"N": "1"}, {"M": {}}]},
                        "b": {"B": "AAEC"}, "ns": {"NS": ["1", "2"]}, "bs": {"BS": ["AA=="]}},
        "parents-wrong-type": {**base, "parent_shard_ids": {"S": "shardId-0"}},
        "member": {"lease_key": {"S": "#worker:w1"}, "lease_counter": {"N": "4"},
                   "member_address": {"S": "10.0.0.7:9090"}, "member_draining": {"N": "1700000000000"}},
        "term": {"lease_key": {"S": "#term:discovery"}, "lease_counter": {"N": "2"}, "checkpoint": {"S": "LATEST"},
                 "lease_owner": {"S": "w1"}},
        "missing-key": {"lease_counter": {"N": "1"}},
    }
    for name, item in items.items():
        put("lease_row", name, item)


def checkpoints():
    for name, text in {"trim-horizon": "TRIM_HORIZON", "latest": "LATEST", "shard-end": "SHARD_END",
                       "at-timestamp": "AT_TIMESTAMP:1700000000000", "at-timestamp-negative": "AT_TIMESTAMP:-5",
                       "at-timestamp-plus": "AT_TIMESTAMP:+5", "sequence": SEQ, "sub-sequence": f"{SEQ}/7",
                       "shard-end-sub": "SHARD_END/1", "garbage": "12a4", "lower": "latest",
                       "long": "9" * 129, "empty": ""}.items():
        put("checkpoint", name, text)


def notices():
    for name, notice in {
        "one": {"from": "me", "leases": ["s:shardId-000000000001"]},
        "several": {"from": "worker-a", "leases": ["orders:shardId-000000000001", "#term:discovery", "nocolon", ""]},
        "empty": {"from": "", "leases": []},
        "extra-field": {"from": "a", "leases": [], "to": "b"},
        "wrong-type": {"from": 7, "leases": "s:0"},
    }.items():
        put("handoff_notice", name, notice)
    put("handoff_notice", "cut", b"{")


def requeue():
    for name, data in {
        "copy": b"\0leasehold-requeue requeues=2 attempts=9\n{\"order\":7}",
        "copy-empty": b"\0leasehold-requeue requeues=1 attempts=3\n",
        "junk": b"\0leasehold-requeue junk\n",
        "overflow": b"\0leasehold-requeue requeues=4294967296 attempts=1\nx",
        "no-newline": b"\0leasehold-requeue requeues=1 attempts=1",
        "plain": b"{\"order\":7}",
    }.items():
        put("requeue_header", name, data)


def specs():
    import yaml

    text = (ROOT / "docs/worker.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    n = 0
    for block in blocks:
        block = re.sub(r"^  ", "", block, flags=re.M) if block.startswith("  ") else block
        try:
            doc = yaml.safe_load(block)
        except yaml.YAMLError:
            continue
        if not isinstance(doc, dict):
            continue
        if "streams" not in doc and "streamPattern" not in doc and "assignment" not in doc:
            doc = {"streams": [{"name": "orders"}], "processor": {"stdout": {}}, **doc}
            block = yaml.safe_dump(doc)
        put("spec", f"docs-{n:02}.yaml", block)
        put("spec", f"docs-{n:02}.json", json.dumps(doc, default=str))
        n += 1
    tests = [
        "streams: [{name: orders}]\naws: {region: us-east-1}\nleaseTable: {name: orders-leases}\n"
        "workers: {replicas: 2}\nstartPosition: TRIM_HORIZON\nlease: {duration: 10s, renewInterval: 3s}\n"
        "processor: {stdout: {}}\nordering: key\nconcurrency: 4\n",
        "streams: [{name: orders}, {name: orders}]\nprocessor: {stdout: {}}",
        "streams: [{name: orders}]\nprocessor: {stdout: {}}\nconcurency: 3",
        "streamPattern: '('\nprocessor: {stdout: {}}",
        "streams: [{name: orders}]\nprocessor: {http: {url: 'http://x/', batch: {maxRecords: 501}}}",
        "streams: [{name: orders}]\nprocessor: {http: {url: 'http://x/', batch: {maxRecords: 50, maxDelay: 20ms}}}",
        "streams: [{name: orders}]\nleaseTable: {name: orders-leases}\nprocessor: {stdout: {}}\nreader: {mode: fanOut}",
        "assignment: {shards: ['orders:shardId-000000000001']}\nprocessor: {stdout: {}}",
        "streams: [{name: orders}]\nprocessor: {stdout: {}}\nstartPosition: AT_TIMESTAMP\n"
        "startTimestamp: '2026-01-02T03:04:05Z'",
        "streams: [{arn: 'arn:aws:kinesis:us-east-1:123456789012:stream/orders'}]\nprocessor: {multilang: "
        "{command: [python3, app.py], timeout: 30s}}\nretry: {maxAttempts: 3, onExhausted: deadLetter, "
        "deadLetterStream: orders-dlq}\nfilter: {patterns: [{data: {type: [buy]}}]}",
        "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\nstreams: [{name: orders}]\nprocessor: {stdout: {}}",
    ]
    for i, text in enumerate(tests):
        put("spec", f"test-{i:02}.yaml", text)


def main():
    kpl()
    multilang()
    http()
    filters()
    rows()
    checkpoints()
    notices()
    requeue()
    specs()


if __name__ == "__main__":
    main()
