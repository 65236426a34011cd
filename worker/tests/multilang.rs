//! The multilang processor: the unmodified amazon_kclpy sample record processor runs as the child of a
//! worker process, and a child that crashes or stalls is restarted without losing records.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::wait_for;
use leasehold_worker::lease::{Checkpoint, DynamoLeaseStore, LeaseKey, LeaseSettings, ShardLeases};

/// The unpacked amazon_kclpy sdist (`tests/ground/kclpy.sh` fetches it; `make test` runs that).
fn kclpy() -> PathBuf {
    let dir = leasehold_testkit::cache_dir().join("kclpy/amazon_kclpy-3.2.0");
    assert!(
        dir.join("amazon_kclpy/kcl.py").exists(),
        "amazon_kclpy is missing: run tests/ground/kclpy.sh (or make test)"
    );
    dir
}

fn multilang(command: &[String], timeout: &str) -> String {
    let quoted: Vec<String> = command.iter().map(|c| format!("'{c}'")).collect();
    format!("processor: {{multilang: {{command: [{}], timeout: {timeout}}}}}\n", quoted.join(", "))
}

/// A fresh directory for a child's markers and logs.
fn scratch_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(leasehold_testkit::unique_name(prefix));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a python protocol child to `dir/name`: `body` runs with the usual modules imported and `DIR`
/// naming `dir`, where it leaves its markers and logs.
fn python_child(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
    let script = dir.join(name);
    let prelude = format!("import base64, json, os, sys, time\nDIR = {:?}\n", dir.display().to_string());
    std::fs::write(&script, prelude + body).unwrap();
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_amazon_kclpy_sample_runs_unchanged_and_checkpoints() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kclpy", 1).await;
    let table = leasehold_testkit::unique_name("kclpy");
    let dir = kclpy();
    let command = vec![
        "env".to_string(),
        format!("PYTHONPATH={}", dir.display()),
        "python3".to_string(),
        dir.join("samples/sample_kclpy_app.py").display().to_string(),
    ];
    let config = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n")
        .replace("processor: {stdout: {}}\n", &multilang(&command, "30s"));
    let mut worker = spawn(&config, "kclpy-1");
    let written = records(4, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    // The sample logs each record to stderr without a newline, so its last lines are only whole once
    // the worker exits: wait instead until the worker has checkpointed the last record.
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let store = DynamoLeaseStore::new(dynamodb, table, LeaseSettings::new("viewer"));
    let key = LeaseKey::new(stream.as_str(), "shardId-000000000000");
    let all = leasehold_testkit::kinesis::read_all(&kinesis, &stream).await;
    let last_sequence = all.last().expect("records").sequence_number.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while store.get(&key).await.ok().flatten().map(|l| l.checkpoint)
        != Some(Checkpoint::Sequence(last_sequence.clone()))
    {
        assert!(std::time::Instant::now() < deadline, "the last record never checkpointed:\n{}", worker.stderr_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // SIGTERM: the worker sends shutdownRequested; the sample checkpoints through the protocol.
    worker.signal("TERM");
    let status = worker.wait_exit(Duration::from_secs(30)).expect("exits");
    let logs = worker.stderr_text();
    assert!(status.success(), "{logs}");
    assert!(logs.contains("multilang child checkpoint acknowledged"), "the sample never checkpointed:\n{logs}");
    // The sample logs each record it processes: every sequence number once.
    let mut sequences: Vec<&str> =
        logs.split("Sequence Number: ").skip(1).map(|rest| rest.split(',').next().unwrap_or_default()).collect();
    assert_eq!(sequences.len(), written.len(), "each record processed once:\n{logs}");
    sequences.sort_unstable();
    sequences.dedup();
    assert_eq!(sequences.len(), written.len(), "a record processed twice:\n{logs}");
    let lease = store.get(&key).await.unwrap().expect("row");
    assert_eq!(
        lease.checkpoint,
        Checkpoint::Sequence(last_sequence),
        "the lease table holds the last record processed"
    );
}

/// A protocol child that crashes on its first sight of record n=3 and stalls on its first sight of n=6
/// (markers in `dir` remember it), and logs every record it completes to `dir/done`.
fn flaky_child(dir: &std::path::Path) -> PathBuf {
    python_child(
        dir,
        "flaky.py",
        r#"def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    action = msg["action"]
    if action == "processRecords":
        for r in msg["records"]:
            n = base64.b64decode(r["data"]).decode().split(":")[1]
            for trigger, marker in (("3", "crashed"), ("6", "stalled")):
                path = os.path.join(DIR, marker)
                if n == trigger and not os.path.exists(path):
                    open(path, "w").close()
                    if marker == "crashed":
                        sys.exit(3)
                    time.sleep(3600)
            with open(os.path.join(DIR, "done"), "a") as f:
                f.write(base64.b64decode(r["data"]).decode() + "\n")
        send({"action": "checkpoint", "sequenceNumber": msg["records"][-1]["sequenceNumber"], "subSequenceNumber": 0})
        json.loads(sys.stdin.readline())
    send({"action": "status", "responseFor": action})
"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_or_stalling_child_is_restarted_and_nothing_is_lost() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "flaky", 1).await;
    let dir = scratch_dir("flaky");
    let command = vec!["python3".to_string(), flaky_child(&dir).display().to_string()];
    let extra = "startPosition: TRIM_HORIZON\nretry: {backoff: 100ms}\n";
    let config = config(&stream, None, extra).replace("processor: {stdout: {}}\n", &multilang(&command, "2s"));
    let worker = spawn(&config, "flaky-1");
    let written = records(1, 0, 10);
    put_records(&kinesis, &stream, &written).await;
    let done = || std::fs::read_to_string(dir.join("done")).unwrap_or_default();
    wait_for("every record done despite a crash and a stall", Duration::from_secs(60), async || {
        done().lines().count() >= written.len()
    })
    .await;
    let seen: Vec<String> = done().lines().map(String::from).collect();
    let expected: Vec<String> = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    assert_eq!(seen, expected, "every record once, in order (the failed attempts never completed)");
    assert!(dir.join("crashed").exists() && dir.join("stalled").exists(), "both faults happened");
    let logs = worker.stderr_text();
    assert!(logs.matches("multilang child failed; restarting it").count() >= 2, "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_is_started_and_initialized_as_soon_as_the_lease_is_held() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "mlinit", 2).await;
    let dir = scratch_dir("mlinit");
    let script = python_child(
        &dir,
        "child.py",
        r#"for line in sys.stdin:
    msg = json.loads(line)
    if msg["action"] == "initialize":
        with open(os.path.join(DIR, "initialized"), "a") as f:
            f.write(msg["shardId"] + "\n")
    sys.stdout.write(json.dumps({"action": "status", "responseFor": msg["action"]}) + "\n"); sys.stdout.flush()
"#,
    );
    let command = vec!["python3".to_string(), script.display().to_string()];
    let config = config(&stream, None, "").replace("processor: {stdout: {}}\n", &multilang(&command, "10s"));
    let _worker = spawn(&config, "mlinit-1");
    // No record is ever written: like the KCL, the worker initializes a child per shard it holds.
    let initialized = || {
        let mut shards: Vec<String> =
            std::fs::read_to_string(dir.join("initialized")).unwrap_or_default().lines().map(String::from).collect();
        shards.sort();
        shards
    };
    wait_for("a child initialized for each shard", Duration::from_secs(30), async || initialized().len() >= 2).await;
    assert_eq!(initialized(), ["shardId-000000000000", "shardId-000000000001"]);
}

/// A protocol child that logs each processRecords message's size to `dir/sizes` and its records to
/// `dir/done`, and crashes once, on its second message of more than one record, before logging it.
fn batch_child(dir: &std::path::Path) -> PathBuf {
    python_child(
        dir,
        "batch.py",
        r#"for line in sys.stdin:
    msg = json.loads(line)
    if msg["action"] == "processRecords":
        records = msg["records"]
        if len(records) > 1:
            seen = os.path.join(DIR, "multi")
            crashed = os.path.join(DIR, "crashed")
            if os.path.exists(seen) and not os.path.exists(crashed):
                open(crashed, "w").close()
                sys.exit(3)
            open(seen, "a").close()
        with open(os.path.join(DIR, "sizes"), "a") as f:
            f.write(f"{len(records)}\n")
        with open(os.path.join(DIR, "done"), "a") as f:
            f.write("".join(base64.b64decode(r["data"]).decode() + "\n" for r in records))
    sys.stdout.write(json.dumps({"action": "status", "responseFor": msg["action"]}) + "\n"); sys.stdout.flush()
"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_in_flight_together_go_to_the_child_in_one_message_in_key_order() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "mlbatch", 1).await;
    let dir = scratch_dir("mlbatch");
    let written = records(20, 0, 25);
    put_records(&kinesis, &stream, &written).await;
    let command = vec!["python3".to_string(), batch_child(&dir).display().to_string()];
    let extra = "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 16\nretry: {backoff: 100ms}\n";
    let config = config(&stream, None, extra).replace("processor: {stdout: {}}\n", &multilang(&command, "10s"));
    let worker = spawn(&config, "mlbatch-1");
    let done = || std::fs::read_to_string(dir.join("done")).unwrap_or_default();
    wait_for("every record done despite a crash", Duration::from_secs(60), async || {
        done().lines().count() >= written.len()
    })
    .await;
    let sizes: Vec<usize> =
        std::fs::read_to_string(dir.join("sizes")).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    assert!(largest > 1 && largest <= 16, "messages carry up to `concurrency` records: {sizes:?}");
    assert!(dir.join("crashed").exists(), "the child crashed on a batch");
    let logs = worker.stderr_text();
    assert!(logs.contains("multilang child failed; restarting it"), "{logs}");
    // The crashed message's records were retried in the new child: each key's records once, in order.
    let seen: Vec<String> = done().lines().map(String::from).collect();
    for k in 0..20 {
        let key = format!("key-{k}:");
        let per_key: Vec<&str> = seen.iter().filter(|l| l.starts_with(&key)).map(String::as_str).collect();
        let expected: Vec<String> = (0..25).map(|n| format!("{key}{n}")).collect();
        assert_eq!(per_key, expected, "key-{k} once each, in order");
    }
}
