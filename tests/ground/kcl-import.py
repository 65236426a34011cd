#!/usr/bin/env python3
"""Run by tests/ground/kcl-import.sh: the real KCL writes a lease table, `leasehold import-kcl` copies
it, a leasehold-worker resumes. Prints one JSON line with the counts; exits 1 when a rule is broken."""
import base64, json, os, signal, subprocess, sys, tempfile, time, uuid

import boto3
from aws_kinesis_agg.aggregator import RecordAggregator

HERE = os.path.dirname(os.path.abspath(__file__))
LOW, HIGH = "0", str(2**128 - 1)


def endpoints():
    out = subprocess.run([os.path.join(HERE, "emulators.sh"), "status"], capture_output=True, text=True).stdout
    env = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    return env["LEASEHOLD_KINESIS_ENDPOINT"], env["LEASEHOLD_DYNAMODB_ENDPOINT"]


def fail(message):
    print(json.dumps({"ok": False, "error": message}), flush=True)
    sys.exit(1)


def main():
    kin_ep, ddb_ep = endpoints()
    # The KCL 3.x keeps its tables in a DynamoDB that accepts them (tests/ground/moto-kcl.sh): dynalite
    # refuses its lease table's GSI. The import then reads the KCL table there.
    kcl_ddb_ep = os.environ.get("LEASEHOLD_KCL_DYNAMODB_ENDPOINT", ddb_ep)
    kcl_version = os.environ.get("KCL_VERSION", "2.5.4")
    creds = dict(region_name="us-east-1", aws_access_key_id="leasehold-test", aws_secret_access_key="leasehold-test")
    kinesis = boto3.client("kinesis", endpoint_url=kin_ep, **creds)
    dynamo = boto3.client("dynamodb", endpoint_url=ddb_ep, **creds)
    kcl_dynamo = boto3.client("dynamodb", endpoint_url=kcl_ddb_ep, **creds)
    name = f"kcl{kcl_version[0]}-import-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})

    # What is written, as (shard, sequence, sub, data); plain records have sub 0, as the KCL numbers them.
    written = []
    for shard, hash_key in (("shardId-000000000000", LOW), ("shardId-000000000001", HIGH)):
        def plain(i):
            data = f"plain-{shard[-1]}-{i}"
            seq = kinesis.put_record(StreamName=name, Data=data.encode(), PartitionKey="p", ExplicitHashKey=hash_key)["SequenceNumber"]
            written.append((shard, seq, 0, data))
        for i in range(30):
            plain(i)
        for j in range(5):
            agg = RecordAggregator()
            users = [f"agg-{shard[-1]}-{j}-{k}" for k in range(4)]
            for u in users:
                agg.add_user_record(f"user-{u}", u.encode(), hash_key)
            record = agg.clear_and_get()
            pk, ehk, data = record.get_contents()
            seq = kinesis.put_record(StreamName=name, Data=data, PartitionKey=pk, ExplicitHashKey=ehk)["SequenceNumber"]
            written.extend((shard, seq, k, u) for k, u in enumerate(users))
        for i in range(30, 60):
            plain(i)

    work = tempfile.mkdtemp(prefix="kcl-import-")
    kcl_log = os.path.join(work, "kcl.log")
    open(kcl_log, "w").close()
    child = os.path.join(work, "processor.sh")
    with open(child, "w") as f:
        f.write(f"#!/bin/sh\nexport PYTHONPATH='{os.environ['KCLPY']}' KCL_IMPORT_LOG='{kcl_log}'\n"
                f"exec python3 '{os.path.join(HERE, 'kcl-import-processor.py')}'\n")
    os.chmod(child, 0o755)
    jars = subprocess.run([os.path.join(HERE, "kcl-java.sh"), "classpath"], capture_output=True, text=True, check=True).stdout.strip()
    port = kin_ep.rsplit(":", 1)[1]
    proxy = subprocess.Popen(["node", os.path.join(HERE, "h2c-proxy.js"), "0", port], stdout=subprocess.PIPE, text=True)
    kcl_kin_ep = "http://127.0.0.1:" + proxy.stdout.readline().strip()
    props = os.path.join(work, "kcl.properties")
    with open(props, "w") as f:
        f.write(f"""executableName = {child}
streamName = {name}
applicationName = {name}
AWSCredentialsProvider = {"DefaultAWSCredentialsProviderChain" if kcl_version.startswith("2.") else "DefaultCredentialsProvider"}
initialPositionInStream = TRIM_HORIZON
retrievalMode = POLLING
regionName = us-east-1
kinesisEndpoint = {kcl_kin_ep}
dynamoDBEndpoint = {kcl_ddb_ep}
metricsLevel = NONE
""")
    env = dict(os.environ, AWS_ACCESS_KEY_ID="leasehold-test", AWS_SECRET_ACCESS_KEY="leasehold-test", AWS_REGION="us-east-1")
    daemon_log = open(os.path.join(work, "daemon.log"), "wb")
    daemon = subprocess.Popen(["java", "-Daws.cborEnabled=false", "-cp", jars, "software.amazon.kinesis.multilang.MultiLangDaemon",
                               "--properties-file", props], env=env, stdout=daemon_log, stderr=subprocess.STDOUT, start_new_session=True)

    def kcl_lines():
        with open(kcl_log) as f:
            return [l.split() for l in f if l.strip()]

    # Kill the KCL mid-stream: once both shards are under way, shard 0's checkpoint sits inside an
    # aggregate and at least 60 records were processed (a third of the stream).
    deadline = time.monotonic() + 240
    while True:
        lines = kcl_lines()
        processed = [l for l in lines if l[0] != "CHECKPOINT"]
        frozen = any(l[0] == "CHECKPOINT" and l[1].endswith("0") and l[3] == "1" for l in lines)
        shards = {l[0] for l in processed}
        if frozen and len(shards) == 2 and len(processed) >= 60:
            break
        if time.monotonic() > deadline or daemon.poll() is not None:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGKILL)
            fail(f"the KCL did not get under way (log in {work}): {len(processed)} records, frozen={frozen}")
        time.sleep(0.05)
    os.killpg(daemon.pid, signal.SIGKILL)
    daemon.wait()
    proxy.terminate()
    time.sleep(0.5)
    lines = kcl_lines()
    kcl_processed = [(l[0], l[1], int(l[2]), l[3]) for l in lines if l[0] != "CHECKPOINT"]

    # The KCL's own table: its checkpoints are the truth the import must follow.
    items = kcl_dynamo.scan(TableName=name, ConsistentRead=True)["Items"]
    # What the KCL wrote, for the report: its lease rows' attributes and (3.x) its other tables.
    attributes = sorted({a for item in items for a in item})
    kcl_tables = sorted(t for t in kcl_dynamo.list_tables()["TableNames"] if t.startswith(name))
    checkpoints = {}
    for item in items:
        if item.get("entityType", {}).get("S", "LEASE") != "LEASE":
            continue
        cp = item["checkpoint"]["S"]
        sub = int(item.get("checkpointSubSequenceNumber", {}).get("N", "0"))
        checkpoints[item["leaseKey"]["S"]] = (cp, sub)

    def after(shard, seq, sub):
        cp, csub = checkpoints.get(shard, ("TRIM_HORIZON", 0))
        if cp == "TRIM_HORIZON":
            return True
        return (int(seq), sub) > (int(cp), csub)

    expected = {data for (shard, seq, sub, data) in written if after(shard, seq, sub)}

    table = f"leasehold-{name}"
    dynamo.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "lease_key", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "lease_key", "KeyType": "HASH"}])
    dynamo.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1})
    cli_env = dict(env, LEASEHOLD_KINESIS_ENDPOINT=kin_ep, LEASEHOLD_DYNAMODB_ENDPOINT=ddb_ep)
    from_ep = ["--from-dynamodb-endpoint", kcl_ddb_ep] if kcl_ddb_ep != ddb_ep else []
    imported = subprocess.run([os.environ["LEASEHOLD_BIN"], "import-kcl", "--table", table, "--stream", name, "--from", name,
                               *from_ep, "--execute", "--watch", "11s", "-o", "json"], env=cli_env, capture_output=True, text=True)
    if imported.returncode != 0:
        fail(f"import-kcl exited {imported.returncode}: {imported.stderr}")
    report = json.loads(imported.stdout)

    config = os.path.join(work, "worker.yaml")
    with open(config, "w") as f:
        f.write(f"""streams: [{{name: {name}}}]
aws: {{region: us-east-1, kinesisEndpoint: '{kin_ep}', dynamodbEndpoint: '{ddb_ep}'}}
leaseTable: {{name: {table}}}
startPosition: LATEST
processor: {{stdout: {{}}}}
lease: {{duration: 2s, renewInterval: 500ms, scanInterval: 250ms, shardSyncInterval: 1s}}
reader: {{idleTime: 100ms}}
""")
    out_path = os.path.join(work, "worker.out")
    with open(out_path, "wb") as out, open(os.path.join(work, "worker.err"), "wb") as err:
        worker = subprocess.Popen([os.environ["LEASEHOLD_WORKER_BIN"], "--config", config, "--owner-id", "after-kcl",
                                   "--metrics-addr", "127.0.0.1:0"], env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + 60
        delivered = []
        while time.monotonic() < deadline:
            with open(out_path) as f:
                delivered = [json.loads(l) for l in f if l.strip()]
            if len(delivered) >= len(expected):
                time.sleep(2)
                with open(out_path) as f:
                    delivered = [json.loads(l) for l in f if l.strip()]
                break
            time.sleep(0.2)
        worker.terminate()
        worker.wait(20)
    got = [base64.b64decode(d["data"]).decode() for d in delivered]
    missing = sorted(expected - set(got))
    extra = sorted(set(got) - expected)
    repeats = len(got) - len(set(got))
    kcl_data = {d for (_, _, _, d) in kcl_processed}
    tail = sorted(kcl_data & set(got))
    result = {
        "ok": not missing and not extra and repeats == 0,
        "kcl_version": kcl_version, "kcl_dynamodb": kcl_ddb_ep, "kcl_row_attributes": attributes, "kcl_tables": kcl_tables,
        "written": len(written), "kcl_processed": len(kcl_processed), "kcl_checkpoints": checkpoints,
        "imported": [(i["shard"], i["after"]) for i in report["imports"]],
        "leasehold_processed": len(got), "expected": len(expected),
        "gaps": missing[:10], "before_checkpoint": extra[:10], "leasehold_repeats": repeats,
        "kcl_uncheckpointed_tail_processed_again": len(tail), "work": work,
    }
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
