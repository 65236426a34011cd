//! Hostile KPL aggregates (issue 30): one Kinesis record of 1 MiB whose key tables and user records
//! a producer filled to hurt, read by a real `leasehold-worker` process on kinesalite + dynalite. For
//! each shape, the worker's peak RSS (VmHWM in /proc/PID/status) after the aggregate is compared with
//! its own peak before it: the rise stays within [`LIMIT_MIB`], every user record reaches the
//! processor exactly once with its own key and data (or the whole aggregate once, when Kinesis would
//! never have taken its keys), and the shard's checkpoint moves past it.
//!
//! The aggregates are written by hand (no library writes these shapes). kinesalite takes a record of
//! 1,048,576 bytes of data, Kinesis's limit before its 10 MiB records; each aggregate here is as close
//! to that as its shape allows. A regression must fail this test, not the machine: the worker runs
//! under `ulimit -v` ([`ADDRESS_SPACE_KIB`]) and is killed as soon as its peak passes [`KILL_MIB`] over
//! the baseline.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::*;
use leasehold_testkit::process::{WorkerProcess, cpu_time, wait_for};
use leasehold_testkit::server::LocalServer;
use leasehold_worker::internals::kpl::{MAGIC, MAX_PARTITION_KEY_CHARS, partition_key_hash};
use leasehold_worker::lease::{Checkpoint, DynamoLeaseStore, LeaseKey, LeaseSettings, ShardLeases};
use md5::{Digest, Md5};
use serde_json::Value;

const SHARD0: &str = "shardId-000000000000";

/// The target: a 1 MiB aggregate raises the worker's peak RSS by at most this much.
const LIMIT_MIB: f64 = 64.0;
/// Past this rise the worker is killed and the test fails (the code before issue 30 needed ~45 GB for
/// the over-limit shape).
const KILL_MIB: f64 = 512.0;
/// The worker's address space, a backstop should the test's own polling fall behind.
const ADDRESS_SPACE_KIB: u64 = 4 << 20;
/// The largest record kinesalite (and Kinesis before 10 MiB records) takes.
const MAX_RECORD: usize = 1 << 20;

/// The worker's settings: user records in batches of 500 to a sink, up to 500 at once (a window of
/// 2,000 records admitted), so that a whole expansion would show in memory.
const SETTINGS: &str = "startPosition: TRIM_HORIZON\nordering: none\nconcurrency: 500\n";

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn length_delimited(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push((tag << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `AggregatedRecord` being written: key tables first, then user records while they fit.
#[derive(Default)]
struct Builder {
    body: Vec<u8>,
    keys: Vec<String>,
    hash_keys: Vec<String>,
    /// (partition key index, explicit hash key index, data) of each user record.
    users: Vec<(usize, Option<usize>, Vec<u8>)>,
}

impl Builder {
    fn room(&self) -> usize {
        MAX_RECORD - MAGIC.len() - 16 - self.body.len()
    }

    fn key(&mut self, key: String) -> usize {
        length_delimited(&mut self.body, 1, key.as_bytes());
        self.keys.push(key);
        self.keys.len() - 1
    }

    fn hash_key(&mut self, key: String) -> usize {
        length_delimited(&mut self.body, 2, key.as_bytes());
        self.hash_keys.push(key);
        self.hash_keys.len() - 1
    }

    /// The bytes of one user record field.
    fn user_bytes(key: usize, hash_key: Option<usize>, data: &[u8]) -> Vec<u8> {
        let mut record = vec![0x08];
        varint(&mut record, key as u64);
        if let Some(h) = hash_key {
            record.push(0x10);
            varint(&mut record, h as u64);
        }
        length_delimited(&mut record, 3, data);
        let mut field = Vec::new();
        length_delimited(&mut field, 3, &record);
        field
    }

    fn fits(&self, key: usize, hash_key: Option<usize>, data: &[u8]) -> bool {
        Self::user_bytes(key, hash_key, data).len() <= self.room()
    }

    fn user(&mut self, key: usize, hash_key: Option<usize>, data: Vec<u8>) {
        let field = Self::user_bytes(key, hash_key, &data);
        self.body.extend_from_slice(&field);
        self.users.push((key, hash_key, data));
    }

    /// Magic, protobuf, MD5; the key table; and each user record's (key index, data) in order (not
    /// its key: 91,000 copies of a 500 KB key would be this test's own 45 GB).
    fn finish(self) -> (Vec<u8>, Users) {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.body);
        out.extend_from_slice(&Md5::digest(&self.body));
        assert!(out.len() <= MAX_RECORD);
        let records = self.users.into_iter().map(|(k, _, data)| (k, data)).collect();
        (out, Users { keys: self.keys, records })
    }
}

/// The user records of an aggregate: the key table, and each record's key index and data.
struct Users {
    keys: Vec<String>,
    records: Vec<(usize, Vec<u8>)>,
}

/// One hostile aggregate: its bytes, the outer partition key it is put under, and what the worker must
/// deliver of it (`None`: the aggregate whole, as one plain record).
struct Shape {
    name: &'static str,
    data: Vec<u8>,
    outer_key: String,
    users: Option<Users>,
}

/// A key of exactly 256 characters of 4 bytes each (1 KiB, the most a valid key can weigh), shared by
/// every user record, each with its number as data: ~95,000 of them.
fn key_at_the_limit() -> Shape {
    let mut b = Builder::default();
    let key = b.key("𝄞".repeat(MAX_PARTITION_KEY_CHARS));
    let mut n = 0u64;
    while b.fits(key, None, n.to_string().as_bytes()) {
        b.user(key, None, n.to_string().into_bytes());
        n += 1;
    }
    let (data, users) = b.finish();
    Shape { name: "key at the limit", data, outer_key: "outer".into(), users: Some(users) }
}

/// The issue's shape: a 500 KB key named by ~91,000 user records (before issue 30, one copy each: 45
/// GB). Kinesis never takes such a key: the aggregate is corrupt and delivered whole.
fn key_over_the_limit() -> Shape {
    let mut b = Builder::default();
    let key = b.key("k".repeat(500_000));
    while b.fits(key, None, b"") {
        b.user(key, None, Vec::new());
    }
    let references = b.users.len();
    assert!(references > 80_000, "{references} references");
    let (data, _) = b.finish();
    Shape { name: "key over the limit", data, outer_key: "outer".into(), users: None }
}

/// As many distinct keys as fit (the key table at its largest), each named by one user record.
fn many_distinct_keys() -> Shape {
    let mut b = Builder::default();
    let mut n = 0u64;
    loop {
        let key = format!("{n:x}");
        // The key's table entry and the user record naming it.
        if 2 + key.len() + Builder::user_bytes(b.keys.len(), None, b"").len() > b.room() {
            break;
        }
        let index = b.key(key);
        b.user(index, None, Vec::new());
        n += 1;
    }
    let (data, users) = b.finish();
    Shape { name: "many distinct keys", data, outer_key: "outer".into(), users: Some(users) }
}

/// As many user records as fit: one 1-character key, empty data, 6 bytes each (~175,000).
fn many_tiny_records() -> Shape {
    let mut b = Builder::default();
    let key = b.key("k".into());
    while b.fits(key, None, b"") {
        b.user(key, None, Vec::new());
    }
    let (data, users) = b.finish();
    Shape { name: "many tiny records", data, outer_key: "outer".into(), users: Some(users) }
}

/// As many distinct 39-digit explicit hash keys as fit, each named by one user record; put as the KPL
/// puts an aggregate (outer key "a"), so the reader also checks each against the shard's range.
fn deep_explicit_hash_key_table() -> Shape {
    let mut b = Builder::default();
    let key = b.key("k".into());
    let mut n = 0u128;
    loop {
        let hash_key = (u128::MAX - n * 7_919).to_string();
        if 2 + hash_key.len() + Builder::user_bytes(key, Some(b.hash_keys.len()), b"").len() > b.room() {
            break;
        }
        let index = b.hash_key(hash_key);
        b.user(key, Some(index), Vec::new());
        n += 1;
    }
    let (data, users) = b.finish();
    Shape { name: "deep explicit hash key table", data, outer_key: "a".into(), users: Some(users) }
}

/// One event the sink was sent: enough to check a user record came once with its own key and data.
struct Event {
    sequence: String,
    sub_sequence: Option<u32>,
    key_hash: u128,
    data: Vec<u8>,
}

/// An HTTP sink taking CloudEvents batches, keeping a digest of each event (a test watching memory must
/// not hold 175,000 keys of 1 KiB itself).
struct Sink {
    server: LocalServer,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Sink {
    async fn start() -> Self {
        let events: Arc<Mutex<Vec<Event>>> = Arc::default();
        let log = events.clone();
        let app = Router::new()
            .route(
                "/",
                post(move |body: Bytes| {
                    let log = log.clone();
                    async move {
                        let batch: Vec<Value> = serde_json::from_slice(&body).expect("a CloudEvents batch");
                        let text = |e: &Value, name: &str| e[name].as_str().unwrap_or_default().to_string();
                        let mut seen: Vec<Event> = batch
                            .iter()
                            .map(|e| Event {
                                sequence: text(e, "sequencenumber"),
                                sub_sequence: e["subsequencenumber"].as_str().and_then(|s| s.parse().ok()),
                                key_hash: partition_key_hash(&text(e, "partitionkey")),
                                data: STANDARD.decode(text(e, "data_base64")).expect("base64"),
                            })
                            .collect();
                        log.lock().unwrap().append(&mut seen);
                        r#"{"batchItemFailures": []}"#
                    }
                }),
            )
            .layer(DefaultBodyLimit::max(64 << 20));
        Self { server: LocalServer::start(app).await, events }
    }

    fn processor(&self) -> String {
        format!("processor: {{http: {{url: '{}/', batch: {{maxRecords: 500}}}}}}\n", self.server.endpoint())
    }

    fn count(&self, sequence: &str) -> usize {
        self.events.lock().unwrap().iter().filter(|e| e.sequence == sequence).count()
    }
}

/// A script running the worker binary under `ulimit -v`.
fn capped_binary() -> PathBuf {
    let binary = std::env::var_os("LEASEHOLD_WORKER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_BIN_EXE_leasehold-worker")).to_path_buf());
    let dir = std::env::temp_dir().join("leasehold-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let script = dir.join(format!("{}.sh", leasehold_testkit::unique_name("capped-worker")));
    let text = format!("#!/bin/sh\nulimit -v {ADDRESS_SPACE_KIB}\nexec '{}' \"$@\"\n", binary.display());
    std::fs::write(&script, text).expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// A field of /proc/PID/status in MiB (`VmHWM`: peak resident set); `None` once the process is gone.
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

async fn put(client: &Client, stream: &str, key: &str, data: &[u8]) -> String {
    client
        .put_record()
        .stream_name(stream)
        .partition_key(key)
        .data(Blob::new(data.to_vec()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("put a record of {} bytes: {e:?}", data.len()))
        .sequence_number
}

async fn lease_row(table: &str, stream: &str) -> Option<Checkpoint> {
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let store = DynamoLeaseStore::new(dynamodb, table, LeaseSettings::new("viewer"));
    store.get(&LeaseKey::new(stream, SHARD0)).await.expect("get").map(|lease| lease.checkpoint)
}

/// Puts a plain record, starts a worker, takes its peak RSS once that record is done; puts `shape`'s
/// aggregate and a plain record after it; watches the peak until both are done; checks what was
/// delivered and the checkpoint. Returns the rise in MiB.
async fn peak_rise(shape: Shape) -> f64 {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kplmem", 1).await;
    let table = leasehold_testkit::unique_name("kplmem");
    let sink = Sink::start().await;
    let warm = put(&kinesis, &stream, "warm", b"warm").await;
    let config = config(&stream, Some(&table), SETTINGS).replace("processor: {stdout: {}}\n", &sink.processor());
    let worker = WorkerProcess::spawn(&capped_binary(), &config, "kplmem-1");
    let pid = worker.pid();
    wait_for("the first plain record done", Duration::from_secs(60), async || sink.count(&warm) == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = status_mib(pid, "VmHWM:").expect("the worker runs");

    let aggregate = put(&kinesis, &stream, &shape.outer_key, &shape.data).await;
    let after = put(&kinesis, &stream, "after", b"after").await;
    let expected = shape.users.as_ref().map_or(1, |users| users.records.len());
    let started = Instant::now();
    let mut peak = before;
    loop {
        let Some(now) = status_mib(pid, "VmHWM:") else {
            panic!("{}: the worker died (peak {peak:.1} MiB)\n{}", shape.name, tail(&worker))
        };
        peak = peak.max(now);
        if peak - before > KILL_MIB {
            drop(worker);
            panic!("{}: peak RSS rose past {KILL_MIB} MiB ({before:.1} -> {peak:.1} MiB); worker killed", shape.name);
        }
        if sink.count(&after) >= 1 && sink.count(&aggregate) >= expected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{}: {} of {expected} deliveries of the aggregate in 300 s\n{}",
            shape.name,
            sink.count(&aggregate),
            tail(&worker)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What a late record would add shows within the checkpoint's wait below.
    let checkpointed = Instant::now() + Duration::from_secs(20);
    while lease_row(&table, &stream).await != Some(Checkpoint::Sequence(after.clone())) {
        assert!(Instant::now() < checkpointed, "{}: the checkpoint never moved past the aggregate", shape.name);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let peak = peak.max(status_mib(pid, "VmHWM:").expect("the worker runs"));
    let rise = peak - before;
    println!(
        "{}: {} bytes, {expected} deliveries in {:.1?} (worker CPU {:.1?} in all); VmHWM {before:.1} -> {peak:.1} MiB (+{rise:.1} MiB)",
        shape.name,
        shape.data.len(),
        started.elapsed(),
        cpu_time(pid),
    );

    let corrupt = metric(&worker, "leasehold_records_not_deaggregated_total").await;
    let events = sink.events.lock().unwrap();
    let of_aggregate: Vec<&Event> = events.iter().filter(|e| e.sequence == aggregate).collect();
    match &shape.users {
        Some(users) => {
            let mut seen: HashMap<u32, &Event> = HashMap::new();
            for event in &of_aggregate {
                let sub =
                    event.sub_sequence.unwrap_or_else(|| panic!("{}: a user record without sub-sequence", shape.name));
                assert!(seen.insert(sub, event).is_none(), "{}: user record {sub} delivered twice", shape.name);
            }
            assert_eq!(seen.len(), users.records.len(), "{}: every user record once", shape.name);
            let hashes: Vec<u128> = users.keys.iter().map(|k| partition_key_hash(k)).collect();
            for (sub, (key, data)) in users.records.iter().enumerate() {
                let event =
                    seen.get(&(sub as u32)).unwrap_or_else(|| panic!("{}: user record {sub} missing", shape.name));
                assert_eq!((event.key_hash, &event.data), (hashes[*key], data), "{}: user record {sub}", shape.name);
            }
        }
        None => {
            assert_eq!(of_aggregate.len(), 1, "{}: the aggregate delivered once, whole", shape.name);
            assert_eq!(of_aggregate[0].sub_sequence, None);
            assert!(of_aggregate[0].data == shape.data, "{}: the Kinesis record whole", shape.name);
        }
    }
    for plain in [&warm, &after] {
        assert_eq!(events.iter().filter(|e| e.sequence == *plain).count(), 1, "plain record {plain} once");
    }
    assert_eq!(events.len(), expected + 2, "{}: nothing else delivered", shape.name);
    assert_eq!(corrupt, if shape.users.is_none() { 1.0 } else { 0.0 }, "{}: counted as corrupt", shape.name);
    assert!(
        rise <= LIMIT_MIB,
        "{}: peak RSS rose {rise:.1} MiB ({before:.1} -> {peak:.1}), over {LIMIT_MIB} MiB",
        shape.name
    );
    rise
}

fn tail(worker: &WorkerProcess) -> String {
    let text = worker.stderr_text();
    let lines: Vec<&str> = text.lines().rev().take(20).collect();
    lines.into_iter().rev().map(|l| l.chars().take(400).collect::<String>()).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_the_limit_shared_by_every_user_record_stays_within_64_mib() {
    peak_rise(key_at_the_limit()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_the_limit_makes_the_aggregate_corrupt_and_it_is_delivered_whole() {
    peak_rise(key_over_the_limit()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_key_table_stays_within_64_mib() {
    peak_rise(many_distinct_keys()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_user_records_stay_within_64_mib() {
    peak_rise(many_tiny_records()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_explicit_hash_key_table_stays_within_64_mib() {
    peak_rise(deep_explicit_hash_key_table()).await;
}
