#!/usr/bin/env python3
"""Side by side: the Java KCL MultiLangDaemon and leasehold-worker running the same amazon_kclpy sample.

  kcl-bench.py java|worker|worker-batched|both|all [--records 100000] [--shards 4] [--rounds 1]
  kcl-bench.py java|worker|both --failover TRIALS
  kcl-bench.py java,java3,worker --handoff TRIALS | --join TRIALS

The consumer may be a comma-separated list: java (the Java KCL 2.5.4), java3 (the Java KCL 3.x, 3.1.3,
its tables in the separate moto of tests/ground/moto-kcl.sh: dynalite refuses its lease table's GSI, and
moto's conditional writes are not atomic under concurrent requests, so its figures carry that caveat),
worker, worker-batched.

--handoff: as --failover, but SIGTERM instead of kill -9 (the KCL's graceful shutdown, the worker's
cooperative handoff): seconds until the survivor has started a child for the leaving one's shard.
--join: one consumer holding all 4 shards of a stream, a second one joins: seconds from the second's
start until each holds 2 (the first time, and whether it then held for 10 s).

--failover: two consumers of a 2-shard stream, one lease each (children counted in their process trees),
kill -9 one at a random moment up to 20 s later, and time until the survivor has started a child for the victim's shard; a fresh stream per
trial. Otherwise (throughput):

Starts a kinesalite of its own for each run (a long-lived one slows down with every record it ever
kept: fresh_kinesalite), creates a fresh stream (and lease table name), writes the records first, then starts the
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
import argparse, contextlib, json, os, random, signal, socket, subprocess, sys, tempfile, threading, time, uuid
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
    batched worker last). KCL_BENCH_SHARED_KINESALITE=1 keeps the shared one."""
    if os.environ.get("KCL_BENCH_SHARED_KINESALITE") == "1":
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    module = os.path.join(CACHE, "npm-emulators", "node_modules", "kinesalite")
    proc = subprocess.Popen(
        ["node", os.path.join(HERE, "kinesalite-loopback.js"), module, "--port", str(port), "--shardLimit", "100000",
         "--createStreamMs", "50", "--deleteStreamMs", "50", "--updateStreamMs", "50"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"a kinesalite of its own did not start on port {port}")
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


def java_command(work, name, kin_ep, ddb_ep, child, version=None):
    """The MultiLangDaemon's command line and the h2c proxy it needs in front of kinesalite. version:
    KCL_VERSION (default 2.5.4); a 3.x keeps its tables in moto (kcl3_dynamodb) and names the SDK v2
    credentials provider (the 3.x multilang no longer knows the v1 chain)."""
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
{os.environ.get('KCL_BENCH_EXTRA_PROPERTIES', '')}
""")
    opts = ["-Daws.cborEnabled=false", *os.environ.get("KCL_BENCH_JAVA_OPTS", "").split()]
    return ["java", *opts, "-cp", jars, "software.amazon.kinesis.multilang.MultiLangDaemon", "--properties-file", props], proxy


def consumer_command(consumer, work, name, kin_ep, ddb_ep, child, owner="bench-1"):
    """The command line (and proxy) of any consumer kind."""
    if consumer == "java":
        return java_command(work, name, kin_ep, ddb_ep, child, os.environ.get("KCL_VERSION", "2.5.4"))
    if consumer == "java3":
        return java_command(work, name, kin_ep, ddb_ep, child, os.environ.get("KCL3_VERSION", "3.1.3"))
    return worker_command(work, name, kin_ep, ddb_ep, child, batched=consumer == "worker-batched", owner=owner)


def worker_command(work, name, kin_ep, ddb_ep, child, batched=False, owner="bench-1"):
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
    result = {"emulator": "kinesalite", "records": read, "emulator_get_records_cpu_s": round(cpu, 2),
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
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for proxy in proxies:
            if proxy:
                proxy.terminate(); proxy.wait()
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
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for proxy in proxies:
            if proxy:
                proxy.terminate(); proxy.wait()
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
    a = ap.parse_args()
    consumers = a.consumer
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
