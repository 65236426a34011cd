#!/usr/bin/env python3
"""Side by side: the Java KCL MultiLangDaemon and leasehold-worker running the same amazon_kclpy sample.

  kcl-bench.py java|worker|worker-batched|both|all [--records 100000] [--shards 4] [--rounds 1]
  kcl-bench.py java|worker|both --failover TRIALS
  kcl-bench.py java,java3,worker --handoff TRIALS | --join TRIALS
  kcl-bench.py java,java3,worker --spread TRIALS [--watch 300] [--scale 1]

The consumer may be a comma-separated list: java (the Java KCL 2.5.4), java3 (the Java KCL 3.x, 3.1.3,
its tables in the separate moto of tests/ground/moto-kcl.sh: dynalite refuses its lease table's GSI, and
moto's conditional writes are not atomic under concurrent requests, so its figures carry that caveat),
worker, worker-batched.

--handoff: as --failover, but SIGTERM instead of kill -9 (the KCL's graceful shutdown, the worker's
cooperative handoff): seconds until the survivor has started a child for the leaving one's shard.
--join: one consumer holding all 4 shards of a stream, a second one joins: seconds from the second's
start until each holds 2 (the first time, and whether it then held for 10 s).

--spread: the hot-shard spread of worker/benches/spread.rs beside the Java KCL. 4 consumers (daemons or
worker processes, started together) of a fresh 8-shard stream; a producer thread writes each shard its
own rate by explicit hash keys: 2 hot shards at 180 records/s, 6 cold at 60 (720/s; --scale multiplies
every rate and divides the cost). Every record costs 5 ms of its consumer's one CPU, shared by all that
consumer's children (tests/ground/kcl-spread-sample.py, the unchanged sample behind a per-consumer
schedule file: 200 records/s a consumer whatever shards it holds; kcl-sample.sh runs it when
KCL_BENCH_RECORD_COST_MS is set, so both sides pay the same). The worker runs `lease: {balance: load}`,
the Java daemons their defaults (the 2.5.4 balances lease counts, the 3.x by measured throughput) with
workerId bench-0..3. The group forms on a trickle of 5 records/s a shard (the KCL 3.x assigns nothing on
an idle stream); once every lease is held and steady and the backlog read, the hot rates start and every
second for --watch seconds the lease table (leaseOwner, or the worker's lease_owner) and each consumer's
children (their shard, from the KCL_BENCH_SHARD line each child logs) are sampled, with the records each
consumer's children logged. One JSON line per consumer kind: the busiest consumer's offered load (the
producer's rates of the shards it holds) over the best achievable (max(mean, hottest shard)) at the
start, at the end and the worst after the first 60 s, by the table and by the children; seconds until it
was <= 1.15x for good; lease owner changes during the watch; repeats (records logged twice, by shard and
sequence number); records/s processed over the last 60 s against produced. Each second's sample is in
the `series` file next to the first consumer's log.

--failover: two consumers of a 2-shard stream, one lease each (children counted in their process trees),
kill -9 one at a random moment up to 20 s later, and time until the survivor has started a child for the victim's shard; a fresh stream per
trial. Otherwise (throughput):

Starts a kinesalite of its own for each run (a long-lived one slows down with every record it ever
kept; and it parses sequence numbers with BigInt: fresh_kinesalite), creates a fresh stream (and lease table name), writes the records first, then starts the
consumer and waits until the sample has logged every record (counted in the per-child stderr files that
kcl-sample.sh writes). Both consumers start a child as soon as they hold a shard's lease, so the main
figure is records/s from the first child's start to the last record: fetching and processing the backlog,
without the consumers' different start-up. Samples utime+stime and RSS of the consumer's whole process
tree (JVM or worker, plus the python children) and of the consumer process alone every 100 ms. Prints one
JSON line per run; `both` alternates java and worker, `all` java, worker and worker-batched, for --rounds
rounds, and prints each round's ratios (worker / java) last. Each run also reports kinesalite's CPU over
the same span (`emulator_cpu_s_backlog`, and `emulator_busy`: that CPU over the span, near 1 when the
emulator's one thread set the pace); `--emulator-ceiling` first measures how fast kinesalite can serve the
same backlog to a plain GetRecords loop (`ceiling_records_per_s`) and prints it over the Java KCL's
records/s: the highest ratio any consumer could reach on this machine. Needs boto3, the emulators
(tests/ground/emulators.sh start), tests/ground/kcl-java.sh install for `java`, and a release
leasehold-worker (LEASEHOLD_WORKER_BIN) for the workers; kcl-bench.sh sets all that up.

The Java daemon runs with what it needs on the emulators: KCL 2.5.4 (KCL_VERSION), polling retrieval
(kinesalite has no enhanced fan-out), the v1 credentials chain, CBOR off (kinesalite's CBOR answers to
GetRecords break the SDK's parser) and its h2c proxy; KCL_BENCH_EXTRA_PROPERTIES adds properties.
`worker` runs `ordering: shard` (the KCL's guarantee: one record at a time per shard, so one record
per message) and its default GetRecords limit, 1,000. `worker-batched` runs `ordering: key,
concurrency: 500` (up to 500 waiting records of distinct keys per message) with the KCL's GetRecords
limit, 10,000. KCL_BENCH_WORKER_CONCURRENCY and KCL_BENCH_WORKER_MAX_RECORDS override those.
"""
import argparse, contextlib, json, os, random, re, signal, socket, subprocess, sys, tempfile, threading, time, uuid
import boto3

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("LEASEHOLD_CACHE", os.path.expanduser("~/.cache/leasehold"))
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# The kinesalite of the current throughput run when it has one of its own (fresh_kinesalite).
OWN_KINESALITE = {}


def emulators():
    out = subprocess.run([os.path.join(HERE, "emulators.sh"), "status"], capture_output=True, text=True).stdout
    env = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    if OWN_KINESALITE:
        env["LEASEHOLD_KINESIS_ENDPOINT"] = OWN_KINESALITE["endpoint"]
        env["KINESALITE_PID"] = str(OWN_KINESALITE["pid"])
    return env


def endpoints():
    env = emulators()
    return env["LEASEHOLD_KINESIS_ENDPOINT"], env["LEASEHOLD_DYNAMODB_ENDPOINT"]


@contextlib.contextmanager
def fresh_kinesalite():
    """A kinesalite of its own for one throughput run (and the ceiling), stopped after it. kinesalite
    keeps every record it was ever given in memory, deleted streams too, and each GetRecords costs it
    more CPU as that grows: on a kinesalite of 1.8 GB (a day of tests and benches) a backlog cost 5.6
    CPU-s per 100,000 records against 3.1-3.4 on a fresh one. Sharing one across a round made every
    later run pay for the records the earlier ones left (the Java KCL runs first in a round, the
    batched worker last). KCL_BENCH_SHARED_KINESALITE=1 keeps the shared one.

    It parses sequence numbers with BigInt (kinesalite-bigint.js, checked against kinesalite's own
    parser at start): bignumber.js took half of its GetRecords CPU, and its one thread capped every
    consumer at ~30,000 records/s on a slow machine, under twice the Java KCL's rate.
    KCL_BENCH_STOCK_KINESALITE=1 runs kinesalite as published."""
    if os.environ.get("KCL_BENCH_SHARED_KINESALITE") == "1":
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    module = os.path.join(CACHE, "npm-emulators", "node_modules", "kinesalite")
    parser = [] if stock_kinesalite() else ["--bigintSequences"]
    # A file, not a pipe: nobody reads a pipe while the run goes on, and a full one would stall kinesalite.
    stderr_file = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        ["node", os.path.join(HERE, "kinesalite-loopback.js"), module, "--port", str(port), "--shardLimit", "100000",
         "--createStreamMs", "50", "--deleteStreamMs", "50", "--updateStreamMs", "50", *parser],
        stdout=subprocess.DEVNULL, stderr=stderr_file, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    stderr_file.seek(0)
                    why = stderr_file.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"a kinesalite of its own did not start on port {port}: {why}")
                time.sleep(0.1)
        OWN_KINESALITE.update(endpoint=f"http://127.0.0.1:{port}", pid=proc.pid)
        yield
    finally:
        OWN_KINESALITE.clear()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill(); proc.wait()


def stock_kinesalite():
    """Whether the throughput runs' kinesalite parses sequence numbers with its own bignumber.js."""
    return os.environ.get("KCL_BENCH_STOCK_KINESALITE") == "1" or os.environ.get("KCL_BENCH_SHARED_KINESALITE") == "1"


def kinesalite_cpu():
    """kinesalite's utime+stime seconds: one Node thread serves every GetRecords, so the CPU it spends
    over a run against the run's length tells whether the emulator, not the consumer, set the pace."""
    seen = {}
    sample([emulators().get("KINESALITE_PID", "0")], seen)
    return sum(seen.values())


def tree(root):
    """root and all its descendants."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(p))
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def sample(pids, cpu_seen):
    """Updates cpu_seen[pid] = utime+stime seconds; returns the tree's RSS in bytes."""
    rss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu_seen[p] = (int(fields[11]) + int(fields[12])) / TICK
            rss += int(fields[21]) * PAGE
        except OSError:
            pass
    return rss


def count(d):
    n = 0
    for name in os.listdir(d):
        with open(os.path.join(d, name), "rb") as f:
            n += f.read().count(b"Record (Partition Key:")
    return n


def kcl3_dynamodb():
    """The KCL 3.x's DynamoDB: the separate moto of tests/ground/moto-kcl.sh (fails when it is not running)."""
    out = subprocess.run([os.path.join(HERE, "moto-kcl.sh"), "status"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("the KCL 3.x's DynamoDB is not running: tests/ground/moto-kcl.sh start")
    return dict(l.split("=", 1) for l in out.stdout.splitlines() if "=" in l)["LEASEHOLD_KCL_DYNAMODB_ENDPOINT"]


def java_command(work, name, kin_ep, ddb_ep, child, version=None, worker_id=None):
    """The MultiLangDaemon's command line and the h2c proxy it needs in front of kinesalite. version:
    KCL_VERSION (default 2.5.4); a 3.x keeps its tables in moto (kcl3_dynamodb) and names the SDK v2
    credentials provider (the 3.x multilang no longer knows the v1 chain). worker_id: the daemon's
    workerId (the lease owner its rows name; by default the KCL makes one up)."""
    version = version or os.environ.get("KCL_VERSION", "2.5.4")
    if version.startswith("3."):
        ddb_ep = kcl3_dynamodb()
    jars = subprocess.run([os.path.join(HERE, "kcl-java.sh"), "classpath"], capture_output=True, text=True, check=True,
                          env=dict(os.environ, KCL_VERSION=version)).stdout.strip()
    credentials = "DefaultCredentialsProvider" if version.startswith("3.") else "DefaultAWSCredentialsProviderChain"
    # The KCL's Kinesis client speaks only HTTP/2; kinesalite only HTTP/1.1: a translating proxy
    # (its CPU is not counted: it stands in for the network).
    port = kin_ep.rsplit(":", 1)[1]
    proxy = subprocess.Popen(["node", os.path.join(HERE, "h2c-proxy.js"), "0", port], stdout=subprocess.PIPE, text=True)
    kin_ep = "http://127.0.0.1:" + proxy.stdout.readline().strip()
    props = os.path.join(work, "kcl.properties")
    with open(props, "w") as f:
        f.write(f"""executableName = {child}
streamName = {name}
applicationName = {name}
AWSCredentialsProvider = {credentials}
initialPositionInStream = TRIM_HORIZON
retrievalMode = POLLING
regionName = us-east-1
kinesisEndpoint = {kin_ep}
dynamoDBEndpoint = {ddb_ep}
metricsLevel = NONE
{f"workerId = {worker_id}" if worker_id else ""}
{os.environ.get('KCL_BENCH_EXTRA_PROPERTIES', '')}
""")
    opts = ["-Daws.cborEnabled=false", *os.environ.get("KCL_BENCH_JAVA_OPTS", "").split()]
    return ["java", *opts, "-cp", jars, "software.amazon.kinesis.multilang.MultiLangDaemon", "--properties-file", props], proxy


def consumer_command(consumer, work, name, kin_ep, ddb_ep, child, owner="bench-1", java_worker_id=False, lease=None):
    """The command line (and proxy) of any consumer kind. java_worker_id: the Java daemons too run as
    `owner`; lease: the worker's `lease:` settings."""
    worker_id = owner if java_worker_id else None
    if consumer == "java":
        return java_command(work, name, kin_ep, ddb_ep, child, os.environ.get("KCL_VERSION", "2.5.4"), worker_id)
    if consumer == "java3":
        return java_command(work, name, kin_ep, ddb_ep, child, os.environ.get("KCL3_VERSION", "3.1.3"), worker_id)
    return worker_command(work, name, kin_ep, ddb_ep, child, batched=consumer == "worker-batched", owner=owner, lease=lease)


def worker_command(work, name, kin_ep, ddb_ep, child, batched=False, owner="bench-1", lease=None):
    binary = os.environ.get("LEASEHOLD_WORKER_BIN", os.path.join(CACHE, "target/release/leasehold-worker"))
    cfg = os.path.join(work, "worker.yaml")
    concurrency = os.environ.get("KCL_BENCH_WORKER_CONCURRENCY", "500" if batched else None)
    ordering = f"ordering: key\nconcurrency: {concurrency}" if concurrency else "ordering: shard"
    max_records = os.environ.get("KCL_BENCH_WORKER_MAX_RECORDS", "10000" if batched else None)
    if max_records:
        ordering += f"\nreader: {{maxRecords: {max_records}}}"
    with open(cfg, "w") as f:
        f.write(f"""streams: [{{name: {name}}}]
aws: {{region: us-east-1, kinesisEndpoint: '{kin_ep}', dynamodbEndpoint: '{ddb_ep}'}}
leaseTable: {{name: {name}}}
startPosition: TRIM_HORIZON
processor: {{multilang: {{command: ['{child}'], timeout: 60s}}}}
{ordering}
""")
        if lease:
            f.write(f"lease: {lease}\n")
    return [binary, "--config", cfg, "--owner-id", owner, "--metrics-addr", "127.0.0.1:0"], None


def run(consumer, records, shards, timeout):
    kin_ep, ddb_ep = endpoints()
    creds = dict(region_name="us-east-1", aws_access_key_id="leasehold-test", aws_secret_access_key="leasehold-test")
    kinesis = boto3.client("kinesis", endpoint_url=kin_ep, **creds)
    name = f"kclbench-{consumer}-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    payload = b"x" * 100
    for i in range(0, records, 500):
        batch = [{"Data": payload, "PartitionKey": f"key-{j}"} for j in range(i, min(i + 500, records))]
        r = kinesis.put_records(StreamName=name, Records=batch)
        assert r["FailedRecordCount"] == 0, r
    work = tempfile.mkdtemp(prefix=name + "-")
    counts = os.path.join(work, "counts"); os.mkdir(counts)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="leasehold-test", AWS_SECRET_ACCESS_KEY="leasehold-test",
               AWS_REGION="us-east-1", KCL_BENCH_COUNT_DIR=counts,
               # One interpreter, resolved once: a pyenv shim would add its own processes to the CPU figures.
               KCL_BENCH_PYTHON=os.environ.get("KCL_BENCH_PYTHON", sys.executable))
    env.setdefault("RUST_LOG", "info")
    child = os.path.join(HERE, "kcl-sample.sh")
    cmd, proxy = consumer_command(consumer, work, name, kin_ep, ddb_ep, child)
    log = open(os.path.join(work, "consumer.log"), "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cpu, own_cpu, peak, own_peak, first_child, first, n = {}, {}, 0, 0, None, None, 0
    while True:
        peak = max(peak, sample(tree(proc.pid), cpu))
        own_peak = max(own_peak, sample([proc.pid], own_cpu))
        n = count(counts)
        now = time.monotonic()
        # kcl-sample.sh's stderr file appears when a child starts.
        if first_child is None and os.listdir(counts):
            first_child = now
            cpu_at_first_child, own_cpu_at_first_child = sum(cpu.values()), sum(own_cpu.values())
            emulator_at_first_child = kinesalite_cpu()
        if n and first is None:
            first = now
        if n >= records or proc.poll() is not None or now - t0 > timeout:
            break
        time.sleep(0.1)
    done = time.monotonic()
    emulator_at_done = kinesalite_cpu()
    peak = max(peak, sample(tree(proc.pid), cpu))
    own_peak = max(own_peak, sample([proc.pid], own_cpu))
    ok = n >= records
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL); proc.wait()
    if proxy:
        proxy.terminate(); proxy.wait()
    span = done - first_child if first_child else None
    result = {
        "consumer": consumer, "ok": ok, "records": records, "shards": shards, "processed": n,
        "start_to_first_child_s": round(first_child - t0, 2) if first_child else None,
        "first_child_to_last_record_s": round(span, 2) if span else None,
        "records_per_s": round(n / span, 1) if span else None,
        "first_to_last_record_s": round(done - first, 2) if first else None,
        "wall_s_incl_startup": round(done - t0, 2),
        "cpu_s_tree": round(sum(cpu.values()), 2), "cpu_s_consumer": round(sum(own_cpu.values()), 2),
        # From the first child's start to the last record: the backlog's cost without start-up.
        "cpu_s_tree_backlog": round(sum(cpu.values()) - cpu_at_first_child, 2) if first_child else None,
        "cpu_s_consumer_backlog": round(sum(own_cpu.values()) - own_cpu_at_first_child, 2) if first_child else None,
        # kinesalite's CPU over the same span, and that over the span: near 1, the emulator's one thread
        # was busy the whole time and records/s is its ceiling, whatever the consumer does.
        "emulator_cpu_s_backlog": round(emulator_at_done - emulator_at_first_child, 2) if first_child else None,
        "emulator_busy": round((emulator_at_done - emulator_at_first_child) / span, 2) if span else None,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "kinesalite_sequences": "bignumber.js" if stock_kinesalite() else "BigInt",
        "processes_seen": len(cpu),
        "peak_rss_mib_tree": round(peak / 2**20, 1), "peak_rss_mib_consumer": round(own_peak / 2**20, 1),
        "log": log.name,
    }
    print(json.dumps(result), flush=True)
    if not ok:
        with open(log.name, "rb") as f:
            sys.stderr.write(f.read()[-6000:].decode(errors="replace"))
    return result

def emulator_ceiling(records, shards):
    """The emulator's own ceiling: kinesalite's CPU to serve the same backlog to a plain GetRecords loop
    (pages of 10,000, one shard after another). Its one thread cannot serve faster than records over
    that CPU, so no consumer's records/s can pass it on this machine."""
    kin_ep, _ = endpoints()
    creds = dict(region_name="us-east-1", aws_access_key_id="leasehold-test", aws_secret_access_key="leasehold-test")
    kinesis = boto3.client("kinesis", endpoint_url=kin_ep, **creds)
    name = f"kclbench-emulator-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    for i in range(0, records, 500):
        batch = [{"Data": b"x" * 100, "PartitionKey": f"key-{j}"} for j in range(i, min(i + 500, records))]
        kinesis.put_records(StreamName=name, Records=batch)
    before, read = kinesalite_cpu(), 0
    for shard in kinesis.list_shards(StreamName=name)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=name, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            read += len(page["Records"])
            iterator = page.get("NextShardIterator") if page["Records"] else None
    cpu = kinesalite_cpu() - before
    kinesis.delete_stream(StreamName=name)
    result = {"emulator": "kinesalite" if stock_kinesalite() else "kinesalite, BigInt sequences", "records": read, "emulator_get_records_cpu_s": round(cpu, 2),
              "ceiling_records_per_s": round(read / cpu, 1) if cpu else None}
    print(json.dumps(result), flush=True)
    return result


def trickle(kinesis, name, rate):
    """Writes `rate` records/s (random keys, so every shard gets some) to `name` until the returned
    event is set: the KCL 3.x assigns leases by measured load, and on an idle stream (no throughput, no
    CPU metric off EC2/ECS/EKS: every worker's WorkerMetricStats is NaN) it never moves one."""
    stop = threading.Event()

    def loop():
        while not stop.wait(1.0):
            batch = [{"Data": b"t" * 100, "PartitionKey": uuid.uuid4().hex} for _ in range(rate)]
            try:
                kinesis.put_records(StreamName=name, Records=batch)
            except Exception as e:  # a failed put only thins the trickle; the figures are lease timing
                print(json.dumps({"trickle_error": str(e)}), file=sys.stderr, flush=True)
    if rate:
        threading.Thread(target=loop, daemon=True).start()
    return stop


def stop_consumers(procs, proxies):
    """Kills every consumer's process group and stops the KCL daemons' h2c proxies."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    for proxy in proxies:
        if proxy:
            proxy.terminate(); proxy.wait()


def children(pid):
    """How many shard children (processes below the consumer) are alive: one per lease held."""
    return len(tree(pid)) - 1


def failover(consumer, timeout, sig=signal.SIGKILL, rate=0):
    """Two consumers of one stream with 2 shards, one lease each; kill -9 one; seconds until the survivor
    has started a child for the victim's shard. Both consumers with their default lease timing (the KCL's
    failoverTimeMillis 10 s, the worker's lease.duration 10 s)."""
    kin_ep, ddb_ep = endpoints()
    creds = dict(region_name="us-east-1", aws_access_key_id="leasehold-test", aws_secret_access_key="leasehold-test")
    kinesis = boto3.client("kinesis", endpoint_url=kin_ep, **creds)
    name = f"kcl{'fail' if sig == signal.SIGKILL else 'term'}-{consumer}-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    stop_trickle = trickle(kinesis, name, rate)
    child = os.path.join(HERE, "kcl-sample.sh")
    procs, proxies, logs = [], [], []
    for i in range(2):
        work = tempfile.mkdtemp(prefix=f"{name}-{i}-")
        counts = os.path.join(work, "counts"); os.mkdir(counts)
        env = dict(os.environ, AWS_ACCESS_KEY_ID="leasehold-test", AWS_SECRET_ACCESS_KEY="leasehold-test",
                   AWS_REGION="us-east-1", KCL_BENCH_COUNT_DIR=counts,
                   KCL_BENCH_PYTHON=os.environ.get("KCL_BENCH_PYTHON", sys.executable))
        env.setdefault("RUST_LOG", "info")
        cmd, proxy = consumer_command(consumer, work, name, kin_ep, ddb_ep, child, owner=f"bench-{i}")
        proxies.append(proxy)
        log = open(os.path.join(work, "consumer.log"), "wb")
        logs.append(log.name)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    t0 = time.monotonic()
    result = {"consumer": consumer, "ok": False, "signal": signal.Signals(sig).name, "trickle_per_s": rate, "logs": logs}
    try:
        # Balanced and steady: one child each for 2 s.
        steady = None
        while True:
            now = time.monotonic()
            if now - t0 > timeout:
                result["error"] = f"never one lease each: children {[children(p.pid) for p in procs]}"
                return result
            if all(children(p.pid) == 1 for p in procs):
                steady = steady or now
                if now - steady >= 2:
                    break
            else:
                steady = None
            time.sleep(0.05)
        result["balanced_after_s"] = round(time.monotonic() - t0, 1)
        # A random moment within the KCL's 20 s lease-taking cycle (and many of the worker's 3 s renewals).
        time.sleep(random.uniform(0, 20))
        if not all(children(p.pid) == 1 for p in procs):
            result["error"] = "the leases moved before the kill"
            return result
        victim, survivor = procs
        # SIGTERM goes to the consumer alone (its children are its to stop), kill -9 to the whole group.
        if sig == signal.SIGKILL:
            os.killpg(victim.pid, sig)
        else:
            victim.send_signal(sig)
        killed = time.monotonic()
        while children(survivor.pid) < 2:
            if time.monotonic() - killed > timeout:
                result["error"] = "the survivor never took the victim's shard"
                return result
            time.sleep(0.05)
        result["failover_s"] = round(time.monotonic() - killed, 2)
        if sig != signal.SIGKILL:
            try:
                victim.wait(timeout)
                result["leaver_exit"] = victim.returncode
            except subprocess.TimeoutExpired:
                result["leaver_exit"] = None
        result["ok"] = True
        return result
    finally:
        stop_trickle.set()
        stop_consumers(procs, proxies)
        print(json.dumps(result), flush=True)


def join(consumer, timeout, rate=0):
    """One consumer holding all 4 shards of a stream; a second joins: seconds from its start until each
    holds 2 leases (children), and whether that held for 10 s. Default lease timing on both sides."""
    kin_ep, ddb_ep = endpoints()
    creds = dict(region_name="us-east-1", aws_access_key_id="leasehold-test", aws_secret_access_key="leasehold-test")
    kinesis = boto3.client("kinesis", endpoint_url=kin_ep, **creds)
    name = f"kcljoin-{consumer}-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=4)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    stop_trickle = trickle(kinesis, name, rate)
    child = os.path.join(HERE, "kcl-sample.sh")
    procs, proxies, logs = [], [], []

    def start(i):
        work = tempfile.mkdtemp(prefix=f"{name}-{i}-")
        counts = os.path.join(work, "counts"); os.mkdir(counts)
        env = dict(os.environ, AWS_ACCESS_KEY_ID="leasehold-test", AWS_SECRET_ACCESS_KEY="leasehold-test",
                   AWS_REGION="us-east-1", KCL_BENCH_COUNT_DIR=counts,
                   KCL_BENCH_PYTHON=os.environ.get("KCL_BENCH_PYTHON", sys.executable))
        env.setdefault("RUST_LOG", "info")
        cmd, proxy = consumer_command(consumer, work, name, kin_ep, ddb_ep, child, owner=f"bench-{i}")
        proxies.append(proxy)
        log = open(os.path.join(work, "consumer.log"), "wb")
        logs.append(log.name)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    result = {"consumer": consumer, "ok": False, "trickle_per_s": rate, "logs": logs}
    t0 = time.monotonic()
    try:
        start(0)
        steady = None
        while True:
            now = time.monotonic()
            if now - t0 > timeout:
                result["error"] = f"the first never held all 4: children {children(procs[0].pid)}"
                return result
            if children(procs[0].pid) == 4:
                steady = steady or now
                if now - steady >= 2:
                    break
            else:
                steady = None
            time.sleep(0.05)
        result["first_holds_all_after_s"] = round(time.monotonic() - t0, 1)
        start(1)
        joined = time.monotonic()
        while [children(p.pid) for p in procs] != [2, 2]:
            if time.monotonic() - joined > timeout:
                result["error"] = f"never 2 each: children {[children(p.pid) for p in procs]}"
                return result
            time.sleep(0.05)
        result["rebalance_s"] = round(time.monotonic() - joined, 2)
        held = time.monotonic()
        while time.monotonic() - held < 10:
            if [children(p.pid) for p in procs] != [2, 2]:
                break
            time.sleep(0.05)
        result["held_10s"] = time.monotonic() - held >= 10
        result["ok"] = True
        return result
    finally:
        stop_trickle.set()
        stop_consumers(procs, proxies)
        print(json.dumps(result), flush=True)


# --spread: 4 consumers of 8 shards, 2 of them hot (worker/benches/spread.rs's 3x stream).
SPREAD_CONSUMERS = 4
# Records/s per shard, the shards in the order of their hash ranges: 2 hot shards at 3x the others.
SPREAD_RATES = (60, 180, 60, 60, 60, 60, 180, 60)
# Each record's cost on its consumer's one CPU: 200 records/s a consumer, whatever shards it holds.
SPREAD_COST_MS = 5.0
# Records/s per shard while the group forms (the KCL 3.x assigns nothing on an idle stream).
SPREAD_FORMATION_RATE = 5
SPREAD_SETTLED = 1.15
SPREAD_WINDOW = 60


class SkewedProducer:
    """Writes rates[i] records/s of 100 B to the i-th shard (by its hash range: explicit hash keys, the
    range's start; 4 partition keys a shard) in ticks of 100 ms, from a thread, until stop(); a late
    tick is not made up. `rates` may be replaced while it runs. written: (monotonic time, records) a tick."""

    def __init__(self, kinesis, name, shards, rates):
        self.kinesis, self.name, self.shards, self.rates = kinesis, name, shards, list(rates)
        self.written, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        owed, n, tick = [0.0] * len(self.shards), 0, 0.1
        due = time.monotonic()
        while not self._stop.is_set():
            batch = []
            for i, (shard, start) in enumerate(self.shards):
                owed[i] += self.rates[i] * tick
                k = int(owed[i])
                owed[i] -= k
                batch += [{"Data": f"{shard}:{n}:{j}:".encode().ljust(100, b"x"), "PartitionKey": f"{shard}-k{j % 4}",
                           "ExplicitHashKey": str(start)} for j in range(k)]
            n += 1
            for i in range(0, len(batch), 500):
                pending = batch[i:i + 500]
                while pending:
                    try:
                        r = self.kinesis.put_records(StreamName=self.name, Records=pending)
                        pending = [e for e, out in zip(pending, r["Records"]) if out.get("ErrorCode")]
                    except Exception as e:  # retried: every record is written once
                        print(json.dumps({"producer_error": str(e)}), file=sys.stderr, flush=True)
                        time.sleep(0.1)
            self.written.append((time.monotonic(), len(batch)))
            due += tick
            if due > time.monotonic():
                self._stop.wait(due - time.monotonic())
            else:
                due = time.monotonic()

    def total(self, since=0.0):
        return sum(n for t, n in self.written if t >= since)

    def stop(self):
        self._stop.set()
        self._thread.join()


class ChildFiles:
    """One consumer's per-child stderr files (kcl-sample.sh, named <pid>.err): the records logged in them,
    counted as the files grow, and each child's shard (the KCL_BENCH_SHARD line of kcl-spread-sample.py)."""
    MARK = b"Record (Partition Key:"

    def __init__(self, d):
        self.d, self.offsets, self.tails, self.shards, self.n = d, {}, {}, {}, 0

    def update(self):
        for name in os.listdir(self.d):
            with open(os.path.join(self.d, name), "rb") as f:
                if name not in self.shards:
                    found = re.search(rb"KCL_BENCH_SHARD (\S+)\n", f.read(512))
                    if found:
                        self.shards[name] = found.group(1).decode()
                f.seek(self.offsets.get(name, 0))
                new = f.read()
            if new:
                self.offsets[name] = self.offsets.get(name, 0) + len(new)
                tail = self.tails.get(name, b"")  # shorter than MARK: holds none whole
                self.n += (tail + new).count(self.MARK)
                self.tails[name] = (tail + new)[-(len(self.MARK) - 1):]
        return self.n

    def shard_of(self, pid):
        return self.shards.get(f"{pid}.err")

    def records(self):
        """(shard, sequence number) of every record logged, repeats included."""
        out = []
        for name in os.listdir(self.d):
            with open(os.path.join(self.d, name), "rb") as f:
                data = f.read()
            shard = self.shards.get(name) or "?"
            out += [(shard, seq) for seq in re.findall(rb"Sequence Number: (\d+),", data)]
        return out


def lease_owners(dynamodb, table):
    """shardId -> owner (None while free) from any side's lease table: the KCL's leaseKey (the shard id)
    and leaseOwner, the worker's lease_key (<stream>:<shardId>) and lease_owner. {} until it exists."""
    items, kwargs = [], {"TableName": table, "ConsistentRead": True}
    try:
        while True:
            page = dynamodb.scan(**kwargs)
            items += page["Items"]
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    except dynamodb.exceptions.ResourceNotFoundException:
        return {}
    out = {}
    for item in items:
        key = (item.get("leaseKey") or item.get("lease_key") or {}).get("S", "")
        if "shardId-" in key:
            out[key.rsplit(":", 1)[-1]] = (item.get("leaseOwner") or item.get("lease_owner") or {}).get("S")
    return out


def by_owner(owners):
    out = {}
    for shard, owner in sorted(owners.items()):
        out.setdefault(owner, []).append(shard)
    return out


def busiest_over_best(owners, rate, consumers):
    """The busiest consumer's offered load (the producer's rates of the shards it holds) over the best
    achievable: the larger of the mean over `consumers` and the hottest shard."""
    loads = {}
    for shard, owner in owners.items():
        loads[owner] = loads.get(owner, 0) + rate[shard]
    best = max(sum(rate.values()) / consumers, max(rate.values()))
    return round(max(loads.values()) / best, 3)


class Settling:
    """busiest / best over a watch: the worst, the worst after the first 60 s, the last, and since when
    it has been <= SPREAD_SETTLED (None: not at the end)."""

    def __init__(self):
        self.worst, self.worst_after_60, self.last, self.settled = 0.0, 0.0, None, None

    def add(self, t, ratio):
        self.worst, self.last = max(self.worst, ratio), ratio
        if t >= 60:
            self.worst_after_60 = max(self.worst_after_60, ratio)
        if ratio > SPREAD_SETTLED:
            self.settled = None
        elif self.settled is None:
            self.settled = t


def spread(consumer, timeout, watch, scale=1.0):
    """4 consumers of one 8-shard stream, 2 shards hot (SPREAD_RATES x scale records/s), every record
    costing SPREAD_COST_MS / scale of its consumer's one CPU; the worker with `lease: {balance: load}`.
    The group forms on a trickle (SPREAD_FORMATION_RATE a shard); once every lease is held, the same
    owners for 20 s (or 60 s since every lease was first held), every Java daemon initialized and the
    backlog read, the hot rates start and the
    lease table and the children's files are sampled every second for `watch` seconds."""
    kin_ep, ddb_ep = endpoints()
    creds = dict(region_name="us-east-1", aws_access_key_id="leasehold-test", aws_secret_access_key="leasehold-test")
    kinesis = boto3.client("kinesis", endpoint_url=kin_ep, **creds)
    table_ep = kcl3_dynamodb() if consumer == "java3" else ddb_ep
    dynamodb = boto3.client("dynamodb", endpoint_url=table_ep, **creds)
    name = f"kclspread-{consumer}-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=name, ShardCount=len(SPREAD_RATES))
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1})
    shards = sorted(((s["ShardId"], int(s["HashKeyRange"]["StartingHashKey"]))
                     for s in kinesis.list_shards(StreamName=name)["Shards"]), key=lambda s: s[1])
    rates = [r * scale for r in SPREAD_RATES]
    rate = {shard: r for (shard, _), r in zip(shards, rates)}
    producer = SkewedProducer(kinesis, name, shards, [SPREAD_FORMATION_RATE] * len(shards))
    child = os.path.join(HERE, "kcl-sample.sh")
    procs, proxies, logs, files = [], [], [], []
    binary = os.environ.get("LEASEHOLD_WORKER_BIN", os.path.join(CACHE, "target/release/leasehold-worker"))
    result = {"consumer": consumer, "mode": "spread", "ok": False, "consumers": SPREAD_CONSUMERS,
              "rates_per_s": rates, "record_cost_ms": round(SPREAD_COST_MS / scale, 2), "watch_s": watch,
              "lease": "{balance: load}" if consumer.startswith("worker") else "default", "logs": logs,
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if consumer.startswith("worker"):
        result["worker_bin_mtime_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.stat(binary).st_mtime))
    t0 = time.monotonic()
    for i in range(SPREAD_CONSUMERS):
        work = tempfile.mkdtemp(prefix=f"{name}-{i}-")
        counts = os.path.join(work, "counts"); os.mkdir(counts)
        env = dict(os.environ, AWS_ACCESS_KEY_ID="leasehold-test", AWS_SECRET_ACCESS_KEY="leasehold-test",
                   AWS_REGION="us-east-1", KCL_BENCH_COUNT_DIR=counts,
                   KCL_BENCH_RECORD_COST_MS=str(SPREAD_COST_MS / scale), KCL_BENCH_CPU_FILE=os.path.join(work, "cpu"),
                   KCL_BENCH_PYTHON=os.environ.get("KCL_BENCH_PYTHON", sys.executable))
        env.setdefault("RUST_LOG", "info")
        cmd, proxy = consumer_command(consumer, work, name, kin_ep, ddb_ep, child, owner=f"bench-{i}",
                                      java_worker_id=True, lease="{balance: load}")
        proxies.append(proxy)
        log = open(os.path.join(work, "consumer.log"), "wb")
        logs.append(log.name)
        files.append(ChildFiles(counts))
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    series_path = os.path.join(os.path.dirname(logs[0]), "spread-series.jsonl")
    result["series"] = series_path

    def ready(i):
        # A MultiLangDaemon is up once its scheduler has initialized; a worker at once.
        if not consumer.startswith("java"):
            return True
        with open(logs[i], "rb") as f:
            return b"Initialization complete" in f.read()

    def processed():
        return sum(f.update() for f in files)

    try:
        # The group forms.
        first_all_held, same_since, last, formation_moves = None, None, None, 0
        while True:
            now = time.monotonic()
            if now - t0 > timeout:
                result["error"] = f"never formed: owners {by_owner(lease_owners(dynamodb, name))}"
                return result
            owners = lease_owners(dynamodb, name)
            all_held = len(owners) == len(shards) and all(owners.values())
            if all_held:
                first_all_held = first_all_held or now
                if last is not None:
                    formation_moves += sum(last.get(s) not in (None, o) for s, o in owners.items())
                same_since = same_since if owners == last else now
                last = owners
            # Steady: 20 s unchanged, or 60 s after every lease was first held (a group that keeps
            # moving leases at rest starts anyway: moves_while_forming says how many it made).
            if (all_held and (now - same_since >= 20 or now - first_all_held >= 60)
                    and all(ready(i) for i in range(SPREAD_CONSUMERS))
                    and processed() >= producer.total() - 2 * SPREAD_FORMATION_RATE * len(shards)):
                break
            time.sleep(1)
        result["formed_after_s"] = round(time.monotonic() - t0, 1)
        result["all_held_after_s"] = round(first_all_held - t0, 1)
        result["moves_while_forming"] = formation_moves
        result["placement_at_start"] = by_owner(last)
        result["busiest_over_best_at_start"] = busiest_over_best(last, rate, SPREAD_CONSUMERS)

        # The hot shards start; watch.
        producer.rates = rates
        start = time.monotonic()
        series, moves, unowned, idle, table, processing = [], 0, 0, 0, Settling(), Settling()
        prev = last
        with open(series_path, "w") as out:
            while time.monotonic() - start < watch:
                t = round(time.monotonic() - start, 1)
                owners = lease_owners(dynamodb, name)
                counts = [f.update() for f in files]
                kids = [sorted(filter(None, (files[i].shard_of(p) for p in tree(proc.pid)[1:])))
                        for i, proc in enumerate(procs)]
                row = {"t": t, "owners": by_owner(owners), "processed": counts, "children": kids,
                       "written": producer.total()}
                if len(owners) == len(shards) and all(owners.values()):
                    moves += sum(prev.get(s) not in (None, o) for s, o in owners.items())
                    prev = owners
                    row["ratio"] = busiest_over_best(owners, rate, SPREAD_CONSUMERS)
                    table.add(t, row["ratio"])
                else:
                    unowned += 1
                # Where the records are processed: the children. A shard between two owners has none
                # (idle) or two (the old one finishing): no placement then.
                running = {}
                for i, ks in enumerate(kids):
                    for k in ks:
                        running.setdefault(k, []).append(f"bench-{i}")
                idle += len(shards) - len(running)
                if len(running) == len(shards) and all(len(h) == 1 for h in running.values()):
                    row["children_ratio"] = busiest_over_best({k: h[0] for k, h in running.items()}, rate, SPREAD_CONSUMERS)
                    processing.add(t, row["children_ratio"])
                series.append(row)
                out.write(json.dumps(row) + "\n"); out.flush()
                time.sleep(max(0.0, start + len(series) - time.monotonic()))
        stopped = time.monotonic()
        window = [r for r in series if r["t"] >= series[-1]["t"] - SPREAD_WINDOW]
        span = window[-1]["t"] - window[0]["t"]
        per_consumer = [round((b - a) / span, 1) for a, b in zip(window[0]["processed"], window[-1]["processed"])]
        result.update({
            "busiest_over_best_end": table.last, "worst_busiest_over_best": table.worst,
            "worst_after_60s": table.worst_after_60, "settled_after_s": table.settled,
            # The same by the children (where records are processed), and the shard-seconds no child ran.
            "children_busiest_over_best_end": processing.last, "children_worst_after_60s": processing.worst_after_60,
            "children_settled_after_s": processing.settled, "shard_s_without_child": idle,
            "moves": moves, "samples_with_a_free_lease": unowned,
            "final": by_owner(prev),
            "processed_per_s_last_60s": round(sum(per_consumer), 1), "per_consumer_per_s_last_60s": per_consumer,
            "produced_per_s_last_60s": round(producer.total(stopped - span) / span, 1),
        })
        producer.stop()
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL); p.wait()
        records = [r for f in files for r in f.records()]
        result.update({"written": producer.total(), "processed": len(records), "repeats": len(records) - len(set(records)),
                       "backlog_at_stop": producer.total() - len(set(records)),
                       "unknown_shard_records": sum(s == "?" for s, _ in records),
                       "load_average_1m": round(os.getloadavg()[0], 1)})
        result["ok"] = True
        return result
    finally:
        producer.stop()
        stop_consumers(procs, proxies)
        print(json.dumps(result), flush=True)


def main():
    ap = argparse.ArgumentParser()
    kinds = ["java", "java3", "worker", "worker-batched"]

    def consumer_list(text):
        named = {"both": ["java", "worker"], "all": ["java", "worker", "worker-batched"]}.get(text, text.split(","))
        if any(c not in kinds for c in named):
            raise argparse.ArgumentTypeError(f"consumers are {', '.join(kinds)}, both or all")
        return named
    ap.add_argument("consumer", type=consumer_list, help="java, java3, worker, worker-batched (comma-separated), both or all")
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--failover", type=int, metavar="TRIALS", default=0,
                    help="instead of throughput: kill -9 one of two consumers TRIALS times per consumer")
    ap.add_argument("--handoff", type=int, metavar="TRIALS", default=0,
                    help="instead of throughput: SIGTERM one of two consumers TRIALS times per consumer")
    ap.add_argument("--join", type=int, metavar="TRIALS", default=0,
                    help="instead of throughput: a second consumer joins one holding 4 shards, TRIALS times")
    ap.add_argument("--trickle", type=int, metavar="RECORDS_PER_S", default=0,
                    help="with --failover/--handoff/--join: write this many records/s to the stream meanwhile")
    ap.add_argument("--emulator-ceiling", action="store_true",
                    help="with throughput rounds: first measure kinesalite's own ceiling (a plain GetRecords loop)")
    ap.add_argument("--spread", type=int, metavar="TRIALS", default=0,
                    help="instead of throughput: 4 consumers of 8 shards, 2 of them hot, TRIALS times per consumer")
    ap.add_argument("--watch", type=float, metavar="SECONDS", default=300,
                    help="with --spread: how long to watch once the hot shards start")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="with --spread: every shard's rate times this, every record's cost over it")
    a = ap.parse_args()
    consumers = a.consumer
    if a.spread:
        ok = True
        for _ in range(a.spread):
            for c in consumers:
                ok &= spread(c, a.timeout, a.watch, a.scale)["ok"]
        sys.exit(0 if ok else 1)
    for mode, trials, figure, trial in (("failover", a.failover, "failover_s", lambda c: failover(c, a.timeout, rate=a.trickle)),
                                        ("handoff", a.handoff, "failover_s", lambda c: failover(c, a.timeout, signal.SIGTERM, a.trickle)),
                                        ("join", a.join, "rebalance_s", lambda c: join(c, a.timeout, a.trickle))):
        if not trials:
            continue
        times = {c: [] for c in consumers if c != "worker-batched"}
        for _ in range(trials):
            for c in times:
                r = trial(c)
                if not r["ok"]:
                    sys.exit(1)
                times[c].append(r[figure])
        for c, t in times.items():
            print(json.dumps({"consumer": c, "mode": mode, "trickle_per_s": a.trickle, figure: sorted(t), "max_s": max(t), "median_s": sorted(t)[len(t) // 2]}))
        return
    failed = False
    for _ in range(a.rounds):
        ceiling = None
        if a.emulator_ceiling:
            with fresh_kinesalite():
                ceiling = emulator_ceiling(a.records, a.shards)
        results = {}
        for c in consumers:
            with fresh_kinesalite():
                results[c] = run(c, a.records, a.shards, a.timeout)
        failed |= not all(r["ok"] for r in results.values())
        for base in ("java", "java3"):
            if base not in results or failed:
                continue
            j = results[base]
            for name, w in results.items():
                if name.startswith("java"):
                    continue
                print(json.dumps({f"{name}_over_{base}": {
                    key: round(w[key] / j[key], 2)
                    for key in ["records_per_s", "cpu_s_tree", "cpu_s_tree_backlog", "cpu_s_consumer_backlog",
                                "peak_rss_mib_tree", "peak_rss_mib_consumer"]
                }}), flush=True)
            if ceiling and ceiling["ceiling_records_per_s"]:
                # The most any consumer could reach over this baseline here: below 2, a 2x target for the
                # worker cannot be met on this machine with kinesalite, whatever the worker does.
                print(json.dumps({f"emulator_ceiling_over_{base}":
                                  round(ceiling["ceiling_records_per_s"] / j["records_per_s"], 2)}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
