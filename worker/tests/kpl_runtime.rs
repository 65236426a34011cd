//! KPL aggregates read by real `leasehold-worker` processes on kinesalite + dynalite. The aggregates are
//! made by AWS's `aws-kinesis-agg` library (tests/ground/kpl.sh installs it, tests/ground/kpl-agg.py
//! drives it). Every user record is delivered under its own key, with its sub-sequence; checkpoints
//! inside an aggregate let a new holder resume exactly where the old one stopped. The tests marked so
//! run twice: reading by polling, and with enhanced fan-out through the testkit's fan-out server.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use axum::Router;
use axum::body::Bytes;
use axum::extract::Path as UrlPath;
use axum::http::HeaderMap;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::fanout::fan_out_config;
use common::fanout::fan_out_server;
use common::*;
use leasehold_testkit::fanout::FanOutServer;
use leasehold_testkit::kpl::{LibraryAggregate, library_aggregates};
use leasehold_testkit::process::{WorkerProcess, poll_until, wait_for};
use leasehold_testkit::server::LocalServer;
use leasehold_worker::internals::kpl::partition_key_hash;
use leasehold_worker::lease::{Checkpoint, DynamoLeaseStore, LeaseKey, LeaseSettings, ShardLeases};
use serde_json::{Value, json};

const SHARD0: &str = "shardId-000000000000";

/// Puts one record and returns its sequence number.
async fn put(client: &Client, stream: &str, key: &str, explicit_hash_key: Option<&str>, data: &[u8]) -> String {
    client
        .put_record()
        .stream_name(stream)
        .partition_key(key)
        .set_explicit_hash_key(explicit_hash_key.map(str::to_string))
        .data(Blob::new(data.to_vec()))
        .send()
        .await
        .expect("put record")
        .sequence_number
}

/// Puts an aggregate as aws-kinesis-agg's users do (under the key the library chose).
async fn put_aggregate(client: &Client, stream: &str, aggregate: &LibraryAggregate) -> String {
    put(client, stream, &aggregate.partition_key, aggregate.explicit_hash_key.as_deref(), &aggregate.data).await
}

/// `keys` keys, `per_key` records each, numbered from `first` (data `user-k:n`), interleaved.
fn users(prefix: &str, keys: usize, first: u64, per_key: u64) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in first..first + per_key {
        for k in 0..keys {
            out.push(leasehold_testkit::kinesis::numbered(&format!("{prefix}-{k}"), n));
        }
    }
    out
}

/// One record a worker handed its processor, as the stdout processor prints it or the sink saw it.
#[derive(Debug, Clone)]
struct Seen {
    owner: String,
    shard: String,
    sequence: String,
    sub_sequence: Option<u64>,
    key: String,
    data: Vec<u8>,
}

impl Seen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }

    /// Its place in the shard: (sequence, sub-sequence), plain records after none of their own.
    fn position(&self) -> (usize, String, u64) {
        (self.sequence.len(), self.sequence.clone(), self.sub_sequence.unwrap_or(0))
    }
}

/// Every record a stdout-processor worker printed.
fn printed(worker: &WorkerProcess) -> Vec<Seen> {
    worker
        .stdout_lines()
        .iter()
        .filter_map(|line| {
            let v: Value = serde_json::from_str(line).ok()?;
            let text = |name: &str| v[name].as_str().unwrap_or_default().to_string();
            Some(Seen {
                owner: text("owner"),
                shard: text("shardId"),
                sequence: text("sequenceNumber"),
                sub_sequence: v.get("subSequenceNumber").and_then(Value::as_u64),
                key: text("partitionKey"),
                data: STANDARD.decode(text("data")).ok()?,
            })
        })
        .collect()
}

/// An HTTP sink that takes `delay` per record (slow enough for a handoff to land inside an
/// aggregate) and logs what each worker (the URL path) sent, in arrival order.
struct Sink {
    server: LocalServer,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Sink {
    async fn start(delay: Duration) -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let app = Router::new().route(
            "/{owner}",
            post(move |UrlPath(owner): UrlPath<String>, headers: HeaderMap, body: Bytes| {
                let log = log.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    let header =
                        |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                    log.lock().unwrap().push(Seen {
                        owner,
                        shard: header("ce-shardid"),
                        sequence: header("ce-sequencenumber"),
                        sub_sequence: header("ce-subsequencenumber").parse().ok(),
                        key: header("ce-partitionkey"),
                        data: body.to_vec(),
                    });
                    "ok"
                }
            }),
        );
        Self { server: LocalServer::start(app).await, seen }
    }

    fn processor(&self, owner: &str) -> String {
        format!("processor: {{http: {{url: '{}/{owner}'}}}}\n", self.server.endpoint())
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn by(&self, owner: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.owner == owner).collect()
    }
}

/// How a test's workers read their shards.
#[derive(Clone, Copy)]
enum Reading<'a> {
    Polling,
    /// Enhanced fan-out through this server.
    FanOut(&'a FanOutServer),
}

/// A worker on `stream` with `processor` (a `processor:` line), the lease table `table`, `extra`.
fn worker(stream: &str, table: &str, processor: &str, extra: &str, owner: &str) -> WorkerProcess {
    reading_worker(Reading::Polling, stream, table, processor, extra, owner)
}

/// [`worker`], reading as `reading` says.
fn reading_worker(
    reading: Reading<'_>,
    stream: &str,
    table: &str,
    processor: &str,
    extra: &str,
    owner: &str,
) -> WorkerProcess {
    let extra = format!("startPosition: TRIM_HORIZON\n{extra}");
    let config = match reading {
        Reading::Polling => config(stream, Some(table), &extra),
        Reading::FanOut(server) => fan_out_config(server, stream, Some(table), &extra),
    };
    spawn(&config.replace("processor: {stdout: {}}\n", processor), owner)
}

/// Runs each named test body (an `async fn(Reading)`) polling and with fan-out, as the tests
/// `<name>::polling` and `<name>::fan_out`.
macro_rules! polling_and_fan_out {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn polling() {
                    super::$name(super::Reading::Polling).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn fan_out() {
                    let server = super::fan_out_server().await;
                    super::$name(super::Reading::FanOut(&server)).await
                }
            }
        )*
    };
}

/// How many times each data was delivered.
fn counts(seen: &[Seen]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for s in seen {
        *counts.entry(s.text()).or_default() += 1;
    }
    counts
}

/// Every `expected` data delivered exactly once, nothing else.
fn assert_exactly_once(seen: &[Seen], expected: &[(String, Vec<u8>)]) {
    let counts = counts(seen);
    let expected: HashSet<String> = expected.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    let missing: Vec<&String> = expected.iter().filter(|d| !counts.contains_key(*d)).collect();
    let repeated: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let unexpected: Vec<&String> = counts.keys().filter(|d| !expected.contains(*d)).collect();
    assert!(missing.is_empty(), "{} never delivered, e.g. {:?}", missing.len(), &missing[..missing.len().min(5)]);
    assert!(repeated.is_empty(), "{} repeated, e.g. {:?}", repeated.len(), &repeated[..repeated.len().min(5)]);
    assert!(unexpected.is_empty(), "unexpected deliveries {:?}", &unexpected[..unexpected.len().min(5)]);
}

/// In arrival order, each key's records (data `<key>:<n>`) have increasing numbers.
fn assert_key_order(seen: &[Seen]) {
    let mut last: HashMap<&str, u64> = HashMap::new();
    for s in seen {
        let n = data_number(&s.text());
        if let Some(prev) = last.insert(&s.key, n) {
            assert!(n > prev, "key {} went {prev} -> {n}", s.key);
        }
    }
}

async fn lease_row(table: &str, stream: &str, shard: &str) -> Checkpoint {
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let store = DynamoLeaseStore::new(dynamodb, table, LeaseSettings::new("viewer"));
    store.get(&LeaseKey::new(stream, shard)).await.expect("get").expect("lease row").checkpoint
}

async fn aggregates_and_plain_records_on_one_shard_are_each_delivered_once_under_their_own_key(reading: Reading<'_>) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kplmix", 1).await;
    let table = leasehold_testkit::unique_name("kplmix");
    let given = users("user", 13, 0, 60);
    let aggregates = library_aggregates(&given, 130);
    assert_eq!(aggregates.len(), 6);
    let mut expected = given.clone();
    let mut sequences = Vec::new();
    for (i, aggregate) in aggregates.iter().enumerate() {
        sequences.push(put_aggregate(&kinesis, &stream, aggregate).await);
        for p in 0..2 {
            let (key, data) = leasehold_testkit::kinesis::numbered(&format!("plain-{p}"), i as u64);
            put(&kinesis, &stream, &key, None, &data).await;
            expected.push((key, data));
        }
    }
    let w = reading_worker(
        reading,
        &stream,
        &table,
        "processor: {stdout: {}}\n",
        "ordering: key\nconcurrency: 8\n",
        "kplmix-1",
    );
    wait_for("every record delivered", Duration::from_secs(60), async || printed(&w).len() >= expected.len()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = printed(&w);
    assert_exactly_once(&seen, &expected);
    assert_key_order(&seen);
    // Each user record carries its aggregate's sequence number and its place in it; plain ones neither.
    let place: HashMap<String, (usize, usize)> = aggregates
        .iter()
        .enumerate()
        .flat_map(|(a, agg)| {
            agg.users.iter().enumerate().map(move |(u, (_, d))| (String::from_utf8_lossy(d).into_owned(), (a, u)))
        })
        .collect();
    for s in &seen {
        match place.get(&s.text()) {
            Some(&(a, u)) => {
                assert_eq!((&s.sequence, s.sub_sequence), (&sequences[a], Some(u as u64)), "{}", s.text());
                assert!(s.key.starts_with("user-") && s.text().starts_with(&format!("{}:", s.key)));
            }
            None => assert_eq!(s.sub_sequence, None, "plain record {} has no sub-sequence", s.text()),
        }
    }
    let last =
        leasehold_testkit::kinesis::read_all(&kinesis, &stream).await.last().expect("records").sequence_number.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease_row(&table, &stream, SHARD0).await != Checkpoint::Sequence(last.clone()) {
        assert!(Instant::now() < deadline, "the whole shard never checkpointed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_aggregates_are_delivered_whole_as_plain_records_and_counted() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kplbad", 1).await;
    let table = leasehold_testkit::unique_name("kplbad");
    let given = users("user", 4, 0, 10);
    let aggregates = library_aggregates(&given, 20);
    assert_eq!(aggregates.len(), 2);
    // One with its MD5 trailer wrong, one with its protobuf cut short under a recomputed MD5.
    let mut wrong_md5 = aggregates[0].data.clone();
    *wrong_md5.last_mut().unwrap() ^= 0xFF;
    let body = &aggregates[0].data[4..aggregates[0].data.len() - 16];
    let cut = &body[..body.len() / 2];
    let mut cut_short = leasehold_worker::internals::kpl::MAGIC.to_vec();
    cut_short.extend_from_slice(cut);
    cut_short.extend_from_slice(&md5_of(cut));
    put(&kinesis, &stream, "bad-1", None, &wrong_md5).await;
    put_aggregate(&kinesis, &stream, &aggregates[1]).await;
    put(&kinesis, &stream, "bad-2", None, &cut_short).await;
    let w = worker(&stream, &table, "processor: {stdout: {}}\n", "ordering: key\nconcurrency: 4\n", "kplbad-1");
    let total = aggregates[1].users.len() + 2;
    wait_for("every record delivered", Duration::from_secs(60), async || printed(&w).len() >= total).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = printed(&w);
    assert_eq!(seen.len(), total, "the good aggregate's user records and the two bad records, once each");
    for (key, data) in [("bad-1", &wrong_md5), ("bad-2", &cut_short)] {
        let whole: Vec<&Seen> = seen.iter().filter(|s| s.key == key).collect();
        assert_eq!(whole.len(), 1, "{key} delivered once");
        assert_eq!((&whole[0].data, whole[0].sub_sequence), (data, None), "{key}: the Kinesis record, whole");
    }
    assert_exactly_once(
        &seen.iter().filter(|s| s.key.starts_with("user-")).cloned().collect::<Vec<_>>(),
        &aggregates[1].users,
    );
    assert_eq!(metric(&w, "leasehold_records_not_deaggregated_total").await, 2.0);
    let logged = w.stderr_text().matches("is not a readable aggregate; delivered whole").count();
    assert_eq!(logged, 1, "logged once per shard:\n{}", w.stderr_text());
}

fn md5_of(bytes: &[u8]) -> [u8; 16] {
    // The MD5 that kpl-agg.py's library computes, through the library itself.
    let script = "import hashlib,sys; sys.stdout.write(hashlib.md5(sys.stdin.buffer.read()).hexdigest())";
    let mut child = Command::new(leasehold_testkit::kpl::agg_python())
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python");
    child.stdin.take().expect("stdin").write_all(bytes).expect("write");
    let out = child.wait_with_output().expect("md5");
    let hex = String::from_utf8(out.stdout).expect("hex");
    let mut digest = [0u8; 16];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digit");
    }
    digest
}

/// A 1-shard stream holding `aggregates` aggregates of 500 user records (20 keys), and the records.
async fn backlog(prefix: &str, aggregates: usize) -> (Client, String, Vec<(String, Vec<u8>)>) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    let given = users("user", 20, 0, (aggregates * 25) as u64);
    let made = library_aggregates(&given, 500);
    assert_eq!(made.len(), aggregates);
    for aggregate in &made {
        put_aggregate(&kinesis, &stream, aggregate).await;
    }
    (kinesis, stream, given)
}

const SLOW: &str = "ordering: key\nconcurrency: 4\n";

async fn sigterm_inside_an_aggregate_hands_over_with_no_repeats(reading: Reading<'_>) {
    let (_kinesis, stream, given) = backlog("kplterm", 10).await;
    let table = leasehold_testkit::unique_name("kplterm");
    let sink = Sink::start(Duration::from_millis(1)).await;
    let mut leaver = reading_worker(reading, &stream, &table, &sink.processor("leaver"), SLOW, "leaver");
    wait_for("leaver holds the shard", Duration::from_secs(20), async || leaver.held_shards().len() == 1).await;
    let stayer = reading_worker(reading, &stream, &table, &sink.processor("stayer"), SLOW, "stayer");
    wait_for("leaver is well into the backlog", Duration::from_secs(60), async || sink.by("leaver").len() >= 1200)
        .await;
    leaver.signal("TERM");
    let status = leaver.wait_exit(Duration::from_secs(15)).expect("leaver exits");
    assert!(status.success(), "graceful exit: {status:?}\n{}", leaver.stderr_text());
    wait_for("every user record delivered", Duration::from_secs(90), async || {
        counts(&sink.seen()).len() >= given.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = sink.seen();
    assert_exactly_once(&seen, &given);
    assert_key_order(&seen);
    // The handover fell inside an aggregate: both workers delivered user records of one Kinesis record.
    let of = |owner: &str| -> HashSet<String> {
        seen.iter().filter(|s| s.owner == owner).map(|s| s.sequence.clone()).collect()
    };
    let shared: Vec<String> = of("leaver").intersection(&of("stayer")).cloned().collect();
    assert_eq!(shared.len(), 1, "one aggregate split between the two workers, got {shared:?}");
    let split: Vec<u64> =
        seen.iter().filter(|s| s.sequence == shared[0] && s.owner == "stayer").filter_map(|s| s.sub_sequence).collect();
    println!("handover inside aggregate {} at sub-sequence {:?}", shared[0], split.iter().min());
    assert!(split.iter().min().is_some_and(|first| *first > 0));
    drop(stayer);
}

async fn kill_9_inside_an_aggregate_repeats_only_what_was_not_checkpointed(reading: Reading<'_>) {
    let (_kinesis, stream, given) = backlog("kplkill", 10).await;
    let table = leasehold_testkit::unique_name("kplkill");
    let sink = Sink::start(Duration::from_millis(1)).await;
    let mut victim = reading_worker(reading, &stream, &table, &sink.processor("victim"), SLOW, "victim");
    wait_for("victim is well into the backlog", Duration::from_secs(60), async || sink.by("victim").len() >= 1200)
        .await;
    victim.signal("KILL");
    victim.wait_exit(Duration::from_secs(5)).expect("killed");
    // A checkpoint write sent just before the kill lands within milliseconds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let checkpoint = lease_row(&table, &stream, SHARD0).await;
    let Checkpoint::SubSequence { sequence, sub_sequence } = checkpoint.clone() else {
        panic!("the victim's last checkpoint should be inside an aggregate, got {checkpoint:?}")
    };
    let done = (sequence.len(), sequence.clone(), u64::from(sub_sequence));
    let survivor = reading_worker(reading, &stream, &table, &sink.processor("survivor"), SLOW, "survivor");
    wait_for("every user record delivered", Duration::from_secs(90), async || {
        counts(&sink.seen()).len() >= given.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = sink.seen();
    let counted = counts(&seen);
    assert!(
        given.iter().all(|(_, d)| counted.contains_key(&*String::from_utf8_lossy(d))),
        "every user record delivered"
    );
    // The survivor resumed exactly after the checkpoint: everything after it once, nothing before it.
    let survivor_seen = sink.by("survivor");
    assert!(survivor_seen.iter().all(|s| s.position() > done), "the survivor repeated checkpointed user records");
    let after: Vec<(String, Vec<u8>)> = sink
        .by("victim")
        .into_iter()
        .chain(survivor_seen.iter().cloned())
        .filter(|s| s.position() > done)
        .map(|s| (s.key.clone(), s.data.clone()))
        .collect();
    let expected_after: HashSet<String> = after.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    let survivor_texts: HashSet<String> = survivor_seen.iter().map(Seen::text).collect();
    assert_eq!(survivor_texts, expected_after, "the survivor delivered every user record after the checkpoint");
    assert_eq!(survivor_seen.len(), survivor_texts.len(), "and each once");
    let victim_texts: HashSet<String> = sink.by("victim").iter().map(Seen::text).collect();
    let repeats = survivor_seen.iter().filter(|s| victim_texts.contains(&s.text())).count();
    println!("checkpoint {checkpoint:?}; {repeats} user records repeated by the survivor");
    assert!(repeats <= 600, "{repeats} repeated: checkpoints every 200 ms should bound the window");
    drop(survivor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_across_a_split_and_a_merge_are_each_delivered_once() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kplreshard", 1).await;
    let table = leasehold_testkit::unique_name("kplreshard");
    let w = worker(&stream, &table, "processor: {stdout: {}}\n", "ordering: key\nconcurrency: 4\n", "kplreshard-1");
    let mut expected = Vec::new();
    // Before the split: library aggregates under their first user record's key.
    let before = users("user", 16, 0, 20);
    for aggregate in library_aggregates(&before, 160) {
        put_aggregate(&kinesis, &stream, &aggregate).await;
    }
    expected.extend(before.clone());
    wait_for("the parent read", Duration::from_secs(60), async || printed(&w).len() >= before.len()).await;
    leasehold_testkit::kinesis::split(&kinesis, &stream, SHARD0).await;
    let children = leasehold_testkit::kinesis::open_shards(&kinesis, &stream).await;
    assert_eq!(children.len(), 2);
    // After the split, as the KPL does with a stale shard map: one aggregate under partition key "a",
    // routed by its first user record's hash, holding user records of both children. Those of the
    // other child are skipped there and put again, as the KPL's "Wrong Shard" retry does, to their own.
    let during = users("user", 16, 20, 10);
    let mut misplaced = 0;
    for chunk in library_aggregates(&during, 80) {
        let first_hash = partition_key_hash(&chunk.users[0].0);
        let landed = children.iter().find(|(_, s, e)| (*s..=*e).contains(&first_hash)).expect("a child");
        put(&kinesis, &stream, "a", Some(&first_hash.to_string()), &chunk.data).await;
        for (key, data) in &chunk.users {
            if !(landed.1..=landed.2).contains(&partition_key_hash(key)) {
                misplaced += 1;
                put(&kinesis, &stream, key, None, data).await;
            }
        }
    }
    assert!(misplaced > 0, "some user records hash into the other child");
    expected.extend(during.clone());
    // And aggregates of the library under their first key, whose user records hash anywhere: all
    // delivered where they land (their producer considers them delivered).
    let anywhere = users("user", 16, 30, 10);
    for aggregate in library_aggregates(&anywhere, 80) {
        put_aggregate(&kinesis, &stream, &aggregate).await;
    }
    expected.extend(anywhere.clone());
    wait_for("the children read", Duration::from_secs(60), async || printed(&w).len() >= expected.len()).await;
    let (a, b) = (children[0].0.clone(), children[1].0.clone());
    leasehold_testkit::kinesis::merge(&kinesis, &stream, &a, &b).await;
    let after = users("user", 16, 40, 20);
    for aggregate in library_aggregates(&after, 160) {
        put_aggregate(&kinesis, &stream, &aggregate).await;
    }
    expected.extend(after);
    wait_for("every user record delivered", Duration::from_secs(90), async || printed(&w).len() >= expected.len())
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = printed(&w);
    assert_exactly_once(&seen, &expected);
    // Per shard, each key in order; and each generation before the next.
    let mut per_shard: BTreeMap<&str, Vec<Seen>> = BTreeMap::new();
    for s in &seen {
        per_shard.entry(&s.shard).or_default().push(s.clone());
    }
    for list in per_shard.values() {
        assert_key_order(list);
    }
    let generation = |n: u64| {
        if n < 20 {
            0
        } else if n < 40 {
            1
        } else {
            2
        }
    };
    let mut reached: HashMap<&str, u8> = HashMap::new();
    for s in &seen {
        let g = generation(data_number(&s.text()));
        let prev = reached.entry(&s.key).or_default();
        assert!(g >= *prev, "key {}: a record of generation {g} after generation {prev}", s.key);
        *prev = g;
    }
    let skipped = metric(&w, "leasehold_user_records_skipped_total{reason=\"outside_shard\"}").await;
    assert_eq!(skipped, f64::from(misplaced), "the KPL aggregate's misplaced user records, skipped and counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_amazon_kclpy_sample_checkpoints_at_a_sub_sequence() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kplkclpy", 1).await;
    let table = leasehold_testkit::unique_name("kplkclpy");
    let dir = leasehold_testkit::cache_dir().join("kclpy/amazon_kclpy-3.2.0");
    assert!(dir.join("amazon_kclpy/kcl.py").exists(), "amazon_kclpy is missing: run tests/ground/kclpy.sh");
    let given = users("user", 5, 0, 10);
    let aggregate = library_aggregates(&given, 50).remove(0);
    let sequence = put_aggregate(&kinesis, &stream, &aggregate).await;
    let command = [
        "env".to_string(),
        format!("PYTHONPATH={}", dir.display()),
        "python3".to_string(),
        dir.join("samples/sample_kclpy_app.py").display().to_string(),
    ];
    let quoted: Vec<String> = command.iter().map(|c| format!("'{c}'")).collect();
    let processor = format!("processor: {{multilang: {{command: [{}], timeout: 30s}}}}\n", quoted.join(", "));
    let mut w = worker(&stream, &table, &processor, "", "kplkclpy-1");
    // The sample logs each record to the shared stderr without a newline, so its text shows only once
    // a line of the worker's follows it (or the worker exits): read the JSON of each line from its
    // first `{` once the worker has exited. The records may reach the sample in several messages:
    // stop the worker only once the sample checkpointed and the worker's own checkpoint shows every
    // user record answered (a SIGTERM between messages leaves the rest to the next owner).
    let store = DynamoLeaseStore::new(leasehold_testkit::dynamodb_client().await, &table, LeaseSettings::new("viewer"));
    let whole = Checkpoint::Sequence(sequence.clone());
    let last =
        Checkpoint::SubSequence { sequence: sequence.clone(), sub_sequence: (given.len() - 1).try_into().unwrap() };
    let answered_all = poll_until(Duration::from_secs(80), async || {
        let checkpoint = store.get(&LeaseKey::new(&stream, SHARD0)).await.ok().flatten().map(|row| row.checkpoint);
        w.stderr_text().contains("multilang child checkpoint acknowledged")
            && checkpoint.is_some_and(|c| c == whole || c == last)
    })
    .await;
    assert!(
        answered_all.is_some(),
        "timed out waiting for the sample to checkpoint and answer for every user record:\n{}",
        w.stderr_text()
    );
    w.signal("TERM");
    let status = w.wait_exit(Duration::from_secs(30)).expect("exits");
    let logs = w.stderr_text();
    assert!(status.success(), "{logs}");
    assert!(
        logs.matches("Record (Partition Key:").count() >= given.len(),
        "the sample logs every user record:\n{logs}"
    );
    // The sample checkpoints at the largest (sequence, sub-sequence) it has seen after its first
    // message: a user record inside the aggregate, which the worker accepts.
    let acknowledged: Vec<Value> = logs
        .lines()
        .filter_map(|line| line.find("{\"").and_then(|at| serde_json::from_str::<Value>(&line[at..]).ok()))
        .filter(|v| v["message"] == "multilang child checkpoint acknowledged")
        .collect();
    let inside = acknowledged.iter().find(|v| v["sequence"].as_str().is_some_and(|s| s.contains(&sequence)));
    let sub: u64 = inside
        .and_then(|v| v["sub_sequence"].as_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint at a sub-sequence: {acknowledged:?}"));
    assert!(sub < 49, "inside the aggregate, not at its end: {sub}");
    assert!(!logs.contains("multilang child checkpoint refused"), "{logs}");
    assert!(!logs.contains("Encountered an error while checkpointing"), "{logs}");
    for (sub, (key, _)) in given.iter().enumerate() {
        let line = format!("Record (Partition Key: {key}, Sequence Number: {sequence}, Subsequence Number: {sub},");
        assert!(logs.contains(&line), "the sample never saw {line}\n{logs}");
    }
    assert_eq!(lease_row(&table, &stream, SHARD0).await, Checkpoint::Sequence(sequence), "the whole aggregate done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multilang_child_checkpoint_past_what_it_was_sent_is_refused_as_the_kcl_refuses_it() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kplmlcp", 1).await;
    let table = leasehold_testkit::unique_name("kplmlcp");
    let given = users("user", 1, 0, 3);
    let aggregate = library_aggregates(&given, 3).remove(0);
    let sequence = put_aggregate(&kinesis, &stream, &aggregate).await;
    let dir = std::env::temp_dir().join(leasehold_testkit::unique_name("kplmlcp"));
    std::fs::create_dir_all(&dir).unwrap();
    let answers = dir.join("answers");
    // Per record: checkpoint one sub-sequence past it (refused), then at it (accepted).
    let script = dir.join("child.py");
    std::fs::write(
        &script,
        format!(
            r#"import json, sys
ANSWERS = {answers:?}
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    if msg["action"] == "processRecords":
        for r in msg["records"]:
            for sub in (r["subSequenceNumber"] + 1, r["subSequenceNumber"]):
                send({{"action": "checkpoint", "sequenceNumber": r["sequenceNumber"], "subSequenceNumber": sub}})
                with open(ANSWERS, "a") as f:
                    f.write(sys.stdin.readline())
    send({{"action": "status", "responseFor": msg["action"]}})
"#,
            answers = answers.display().to_string()
        ),
    )
    .unwrap();
    let processor =
        format!("processor: {{multilang: {{command: ['python3', '{}'], timeout: 10s}}}}\n", script.display());
    let w = worker(&stream, &table, &processor, "", "kplmlcp-1");
    let read = || std::fs::read_to_string(&answers).unwrap_or_default();
    wait_for("every checkpoint answered", Duration::from_secs(30), async || read().lines().count() >= 6).await;
    let got: Vec<Value> = read().lines().map(|l| serde_json::from_str(l).expect("json answer")).collect();
    let mut expected = Vec::new();
    for sub in 0..3u64 {
        // The last user record: one past it is past everything sent, like any other.
        expected.push(json!({"action": "checkpoint", "sequenceNumber": sequence, "subSequenceNumber": sub + 1,
            "error": "IllegalArgumentException"}));
        expected
            .push(json!({"action": "checkpoint", "sequenceNumber": sequence, "subSequenceNumber": sub, "error": null}));
    }
    assert_eq!(got, expected);
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_deaggregate_false_an_aggregate_is_one_opaque_record() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "kploff", 1).await;
    let table = leasehold_testkit::unique_name("kploff");
    let aggregate = library_aggregates(&users("user", 2, 0, 5), 10).remove(0);
    let sequence = put_aggregate(&kinesis, &stream, &aggregate).await;
    let extra = "reader: {idleTime: 100ms, deaggregate: false}\n";
    let w = worker(&stream, &table, "processor: {stdout: {}}\n", extra, "kploff-1");
    wait_for("the aggregate delivered", Duration::from_secs(30), async || !printed(&w).is_empty()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = printed(&w);
    assert_eq!(seen.len(), 1, "one record");
    assert_eq!((&seen[0].sequence, seen[0].sub_sequence, &seen[0].data), (&sequence, None, &aggregate.data));
    assert_eq!(seen[0].key, aggregate.partition_key);
}

polling_and_fan_out!(
    aggregates_and_plain_records_on_one_shard_are_each_delivered_once_under_their_own_key,
    sigterm_inside_an_aggregate_hands_over_with_no_repeats,
    kill_9_inside_an_aggregate_repeats_only_what_was_not_checkpointed,
);
