//! Shared pieces of the worker's end-to-end tests: configs for the emulators, the worker binary, and
//! checks over what the workers printed.

#![allow(dead_code)]

pub mod fanout;
pub mod moto;
pub mod skew;

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use leasehold_testkit::process::{Delivery, WorkerProcess};
use leasehold_worker::Metrics;

/// Timing for tests: short leases so failover is quick, fast scans so balancing is too.
pub const FAST_TIMING: &str = "lease: {duration: 2s, renewInterval: 500ms, scanInterval: 250ms, shardSyncInterval: 1s, \
                               checkpointInterval: 200ms, gracefulTimeout: 3s}\n";

/// A worker config for `stream` on the emulators; `table` None means the memory store.
pub fn config(stream: &str, table: Option<&str>, extra: &str) -> String {
    config_with_timing(stream, table, FAST_TIMING, extra)
}

/// A worker config for `stream` on the emulators with `timing` (a `lease:` line) instead of the fast one.
pub fn config_with_timing(stream: &str, table: Option<&str>, timing: &str, extra: &str) -> String {
    // LEASEHOLD_TEST_SCAN=full (or segmented) runs a suite with that `lease.scan`, to compare the two.
    let timing = match std::env::var("LEASEHOLD_TEST_SCAN") {
        Ok(scan) if timing.contains("lease: {") && !timing.contains("scan:") => {
            timing.replacen("lease: {", &format!("lease: {{scan: {scan}, "), 1)
        }
        _ => timing.to_string(),
    };
    let kinesis = leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis);
    let dynamodb = leasehold_testkit::endpoint(leasehold_testkit::Service::DynamoDb);
    let table = table.map(|t| format!("leaseTable: {{name: {t}}}\n")).unwrap_or_default();
    let reader = if extra.contains("reader:") { "" } else { "reader: {idleTime: 100ms}\n" };
    format!(
        "streams: [{{name: {stream}}}]\naws: {{region: us-east-1, kinesisEndpoint: '{kinesis}', dynamodbEndpoint: '{dynamodb}'}}\n\
         {table}processor: {{stdout: {{}}}}\n{timing}{reader}{extra}"
    )
}

/// `config` (from [`config`]) with `service`'s emulator endpoint replaced by `endpoint`, e.g. a proxy
/// in front of the emulator.
pub fn with_endpoint(config: &str, service: leasehold_testkit::Service, endpoint: &str) -> String {
    let field = match service {
        leasehold_testkit::Service::Kinesis | leasehold_testkit::Service::KinesisMock => "kinesisEndpoint",
        leasehold_testkit::Service::DynamoDb => "dynamodbEndpoint",
    };
    let real = leasehold_testkit::endpoint(service);
    config.replace(&format!("{field}: '{real}'"), &format!("{field}: '{endpoint}'"))
}

/// Starts a worker process of the binary under test (`LEASEHOLD_WORKER_BIN` names another build, for
/// long runs that must not see the build directory change under them).
pub fn spawn(config: &str, owner: &str) -> WorkerProcess {
    let binary = std::env::var_os("LEASEHOLD_WORKER_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_BIN_EXE_leasehold-worker")).to_path_buf());
    WorkerProcess::spawn(&binary, config, owner)
}

/// Every record `keys` x `per_key` as written by [`leasehold_testkit::kinesis::numbered`], numbered from
/// `first`.
pub fn records(keys: usize, first: u64, per_key: u64) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in first..first + per_key {
        for k in 0..keys {
            out.push(leasehold_testkit::kinesis::numbered(&format!("key-{k}"), n));
        }
    }
    out
}

/// Kinesis sequence numbers compared as the big decimal numbers they are.
pub fn sequence_cmp(a: &str, b: &str) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// The record number `n` of data `<key>:<n>` (as [`leasehold_testkit::kinesis::numbered`] writes it).
pub fn data_number(data: &str) -> u64 {
    data.rsplit(':').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("bad data {data}"))
}

/// All deliveries of all workers.
pub fn all_deliveries(workers: &[&WorkerProcess]) -> Vec<Delivery> {
    workers.iter().flat_map(|w| w.deliveries()).collect()
}

/// Distinct records delivered (by data).
pub fn distinct(deliveries: &[Delivery]) -> HashSet<String> {
    deliveries.iter().map(|d| d.data.clone()).collect()
}

/// Every expected record was delivered at least once.
pub fn assert_complete(deliveries: &[Delivery], expected: &[(String, Vec<u8>)]) {
    let seen = distinct(deliveries);
    let missing: Vec<String> =
        expected.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).filter(|d| !seen.contains(d)).collect();
    assert!(
        missing.is_empty(),
        "{} records never delivered, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

/// Within each worker, each key's records arrive in increasing order (a worker reads each shard in
/// order, and a key lives on one shard at a time).
pub fn assert_per_key_order(workers: &[&WorkerProcess]) {
    for worker in workers {
        let mut last: HashMap<String, u64> = HashMap::new();
        let mut last_shard: HashMap<String, String> = HashMap::new();
        for d in worker.deliveries() {
            let n = data_number(&d.data);
            // A shard re-taken by the same worker after losing it restarts from its checkpoint.
            let restarted = last_shard.get(&d.partition_key).is_some_and(|s| *s != d.shard_id);
            if let Some(prev) = last.get(&d.partition_key)
                && !restarted
            {
                assert!(
                    n > *prev || worker_retook(worker, &d),
                    "{}: key {} went {prev} -> {n}",
                    worker.owner,
                    d.partition_key
                );
            }
            last.insert(d.partition_key.clone(), n);
            last_shard.insert(d.partition_key.clone(), d.shard_id.clone());
        }
    }
}

fn worker_retook(worker: &WorkerProcess, delivery: &Delivery) -> bool {
    let shard = format!("{}:{}", delivery.stream, delivery.shard_id);
    worker.events("lease acquired").iter().filter(|(_, s)| *s == shard).count() > 1
}

/// Per shard, in the order the test saw them: owners take turns in blocks, and each new owner starts
/// no later than just after the previous owner's last record (no gap), repeating at most what came
/// after the last checkpoint. Returns the number of redelivered records.
pub fn check_handovers(deliveries: &[Delivery]) -> usize {
    let mut by_shard: BTreeMap<String, Vec<&Delivery>> = BTreeMap::new();
    for d in deliveries {
        by_shard.entry(format!("{}:{}", d.stream, d.shard_id)).or_default().push(d);
    }
    let mut redelivered = 0;
    for (shard, mut list) in by_shard {
        list.sort_by_key(|d| d.seen_at);
        let mut seen: HashSet<&str> = HashSet::new();
        for d in &list {
            if !seen.insert(d.sequence_number.as_str()) {
                redelivered += 1;
            }
        }
        // Within one owner's turn, sequence numbers increase.
        let mut turn_owner = "";
        let mut last_seq = "";
        for d in &list {
            if d.owner != turn_owner {
                turn_owner = &d.owner;
            } else {
                assert_eq!(
                    sequence_cmp(&d.sequence_number, last_seq),
                    Ordering::Greater,
                    "{shard}: {} went back from {last_seq} to {}",
                    d.owner,
                    d.sequence_number
                );
            }
            last_seq = &d.sequence_number;
        }
    }
    redelivered
}

/// Writes one record per key every `every`, numbering each key's records 0, 1, 2, ..., until stopped;
/// `stop()` returns everything written.
pub struct Producer {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Vec<(String, Vec<u8>)>>,
}

impl Producer {
    /// Starts writing to `stream`.
    pub fn start(client: aws_sdk_kinesis::Client, stream: &str, keys: usize, every: std::time::Duration) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let stream = stream.to_string();
        let task = tokio::spawn(async move {
            let mut written = Vec::new();
            let mut n = 0;
            while !token.is_cancelled() {
                let batch = records(keys, n, 1);
                leasehold_testkit::kinesis::put_records(&client, &stream, &batch).await;
                written.extend(batch);
                n += 1;
                tokio::time::sleep(every).await;
            }
            written
        });
        Self { stop, task }
    }

    /// Stops writing and returns every record written.
    pub async fn stop(self) -> Vec<(String, Vec<u8>)> {
        self.stop.cancel();
        self.task.await.expect("producer task")
    }
}

/// When `worker` logged `message` for `shard` (the last time), by the worker's own clock: compare it with
/// the test's `SystemTime::now()` or another worker's, never with when the test read the line.
pub fn event_time(worker: &WorkerProcess, message: &str, shard: &str) -> Option<std::time::SystemTime> {
    worker.events_logged(message).into_iter().filter(|(_, s)| s == shard).map(|(at, _)| at).max()
}

/// Runs `test` on a runtime of its own, after giving the SDK's default credential chain the test
/// credentials (a worker in this process finds them in the environment, as the binary does).
pub fn run_test(test: impl std::future::Future<Output = ()>) {
    static ENV: std::sync::Once = std::sync::Once::new();
    // SAFETY: every test calls this before anything reads the environment, and the Once makes the
    // other tests wait until the variables are set, so no read runs alongside the write.
    ENV.call_once(|| unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "leasehold-test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "leasehold-test");
    });
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime").block_on(test);
}

/// Where a record was processed more times than the rules allow.
fn describe(shard: &str, sequence: &str, list: &[&Delivery]) -> String {
    let owners: Vec<&str> = list.iter().map(|d| d.owner.as_str()).collect();
    format!("{shard} {sequence} ({}) processed by {owners:?}", list[0].data)
}

/// Every delivery grouped by shard (`stream:shard`) and sequence number, in the order the test saw them.
fn by_record(deliveries: &[Delivery]) -> BTreeMap<(String, String), Vec<&Delivery>> {
    let mut out: BTreeMap<(String, String), Vec<&Delivery>> = BTreeMap::new();
    for d in deliveries {
        out.entry((format!("{}:{}", d.stream, d.shard_id), d.sequence_number.clone())).or_default().push(d);
    }
    for list in out.values_mut() {
        list.sort_by_key(|d| d.seen_at);
    }
    out
}

/// Each record (by shard and sequence number: a producer's retry may store the same data twice)
/// processed at most once: for runs in which no process crashed.
pub fn assert_no_repeats(deliveries: &[Delivery]) {
    let repeated: Vec<String> = by_record(deliveries)
        .iter()
        .filter(|(_, list)| list.len() > 1)
        .map(|((shard, sequence), list)| describe(shard, sequence, list))
        .collect();
    assert!(
        repeated.is_empty(),
        "{} records processed more than once with no crash, e.g. {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(5)]
    );
}

/// Every expected record delivered, each exactly once: for runs in which no process crashed.
pub fn assert_exactly_once(deliveries: &[Delivery], expected: &[(String, Vec<u8>)]) {
    assert_complete(deliveries, expected);
    assert_no_repeats(deliveries);
}

/// A process that crashed (kill -9) or was stopped past its lease: records it processed that were not
/// yet checkpointed may be processed again by the next owner.
pub struct Victim<'a> {
    /// Its owner id.
    pub owner: &'a str,
    /// Its deliveries seen before this instant belong to the crashed run (None: all of them).
    pub crashed_before: Option<std::time::Instant>,
}

/// Every expected record delivered; a record processed twice only when one of the two was a victim's,
/// in its crashed run, and never more than twice; and per shard and victim the repeated records are a
/// suffix, in sequence order, of what the victim processed there (its uncheckpointed window). Returns
/// the number of repeats.
pub fn assert_repeats_only_from_crashes(
    deliveries: &[Delivery],
    expected: &[(String, Vec<u8>)],
    victims: &[Victim<'_>],
) -> usize {
    assert_complete(deliveries, expected);
    let in_crashed_run =
        |d: &Delivery| victims.iter().any(|v| v.owner == d.owner && v.crashed_before.is_none_or(|at| d.seen_at < at));
    let mut repeats = 0;
    // (shard, victim) -> sequence numbers the victim processed in its crashed run, and those repeated.
    let mut windows: BTreeMap<(String, String), (Vec<String>, HashSet<String>)> = BTreeMap::new();
    for ((shard, sequence), list) in &by_record(deliveries) {
        let crashed: Vec<&&Delivery> = list.iter().filter(|d| in_crashed_run(d)).collect();
        for d in &crashed {
            let window = windows.entry((shard.clone(), d.owner.clone())).or_default();
            window.0.push(sequence.clone());
            if list.len() > 1 {
                window.1.insert(sequence.clone());
            }
        }
        if list.len() == 1 {
            continue;
        }
        assert!(
            list.len() == 2 && crashed.len() == 1,
            "processed again with no crash to explain it: {}",
            describe(shard, sequence, list)
        );
        repeats += 1;
    }
    for ((shard, owner), (mut processed, repeated)) in windows {
        processed.sort_by(|a, b| sequence_cmp(a, b));
        let Some(first_repeat) = processed.iter().position(|s| repeated.contains(s)) else { continue };
        let gaps: Vec<&String> = processed[first_repeat..].iter().filter(|s| !repeated.contains(*s)).collect();
        assert!(
            gaps.is_empty(),
            "{shard}: the repeats of {owner}'s records are not a suffix of what it processed: {} records after \
             the first repeat ({}) were not repeated, e.g. {:?}",
            gaps.len(),
            processed[first_repeat],
            gaps.first()
        );
    }
    repeats
}

/// Fails unless every worker is still running (none crashed during a run that asserts exactly once).
pub fn assert_running(workers: &mut [&mut WorkerProcess]) {
    for worker in workers {
        if let Some(status) = worker.wait_exit(std::time::Duration::from_millis(1)) {
            panic!("{} exited with {status:?}:\n{}", worker.owner, worker.stderr_text());
        }
    }
}

/// The Kinesis emulator a test body runs against: the same body runs on both, as two tests (and, with
/// [`on_every_ground!`], read with enhanced fan-out as a third).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emulator {
    /// kinesalite.
    Kinesalite,
    /// kinesis-mock (npm `kinesis-local`).
    KinesisMock,
    /// kinesalite, the workers reading with enhanced fan-out through the process's shared fan-out
    /// server ([`fanout::shared_fan_out`]).
    FanOut,
    /// kinesis-mock, the workers reading with enhanced fan-out through its own SubscribeToShard (a
    /// second implementation: it pushes once a second and never ends a closed shard's subscription).
    KinesisMockFanOut,
}

impl Emulator {
    /// The testkit service of this emulator.
    pub fn service(self) -> leasehold_testkit::Service {
        match self {
            Emulator::Kinesalite | Emulator::FanOut => leasehold_testkit::Service::Kinesis,
            Emulator::KinesisMock | Emulator::KinesisMockFanOut => leasehold_testkit::Service::KinesisMock,
        }
    }

    /// A client of this emulator (with fan-out: of kinesalite, which the fan-out server reads).
    pub async fn client(self) -> aws_sdk_kinesis::Client {
        match self {
            Emulator::Kinesalite | Emulator::FanOut => leasehold_testkit::kinesis_client().await,
            Emulator::KinesisMock | Emulator::KinesisMockFanOut => leasehold_testkit::kinesis_mock_client().await,
        }
    }

    /// [`config`] reading from this emulator.
    pub fn config(self, stream: &str, table: Option<&str>, extra: &str) -> String {
        self.config_with_timing(stream, table, FAST_TIMING, extra)
    }

    /// [`config_with_timing`] reading from this emulator.
    pub fn config_with_timing(self, stream: &str, table: Option<&str>, timing: &str, extra: &str) -> String {
        match self {
            Emulator::FanOut => {
                return fanout::fan_out_config_at(&fanout::shared_fan_out().endpoint, stream, table, timing, extra);
            }
            Emulator::KinesisMockFanOut => {
                let endpoint = leasehold_testkit::endpoint(self.service());
                return fanout::fan_out_config_at(&endpoint, stream, table, timing, extra);
            }
            Emulator::Kinesalite | Emulator::KinesisMock => {}
        }
        let config = config_with_timing(stream, table, timing, extra);
        with_endpoint(&config, leasehold_testkit::Service::Kinesis, &leasehold_testkit::endpoint(self.service()))
    }
}

/// The tests `<name>::<test>` running the body `<name>` (an `async fn(Emulator)`) on each `<ground>`.
#[macro_export]
macro_rules! ground_tests {
    ($name:ident: $($test:ident => $ground:ident),*) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$name(super::Emulator::$ground).await
                }
            )*
        }
    };
}

/// Runs each named test body (an `async fn(Emulator)`) once per Kinesis emulator, as the tests
/// `<name>::kinesalite` and `<name>::kinesis_mock`.
#[macro_export]
macro_rules! on_both_emulators {
    ($($name:ident),* $(,)?) => {
        $( $crate::ground_tests!($name: kinesalite => Kinesalite, kinesis_mock => KinesisMock); )*
    };
}

/// [`on_both_emulators!`], plus the tests `<name>::fan_out` on [`Emulator::FanOut`] and
/// `<name>::fan_out_kinesis_mock` on [`Emulator::KinesisMockFanOut`].
#[macro_export]
macro_rules! on_every_ground {
    ($($name:ident),* $(,)?) => {
        $( $crate::ground_tests!($name: kinesalite => Kinesalite, kinesis_mock => KinesisMock, fan_out => FanOut,
            fan_out_kinesis_mock => KinesisMockFanOut); )*
    };
}

/// Per key, the first deliveries in the order `workers` processed them carry increasing numbers,
/// across every parent -> child change, and at least one key moved between shards (so the test did
/// reshard). The order is rebuilt from the workers' own records
/// ([`leasehold_testkit::holds::in_processing_order`]), not from when the test read their lines: the
/// parent's last records on one worker may be read after the child's first on another.
pub fn assert_key_order_across_shards(workers: &[&WorkerProcess]) {
    let mut first_seen: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut seen: HashSet<String> = HashSet::new();
    let sorted = leasehold_testkit::holds::in_processing_order(workers);
    for d in &sorted {
        if seen.insert(d.data.clone()) {
            first_seen.entry(d.partition_key.clone()).or_default().push((data_number(&d.data), d.shard_id.clone()));
        }
    }
    let mut crossed = 0;
    for (key, list) in &first_seen {
        for pair in list.windows(2) {
            assert!(
                pair[1].0 > pair[0].0,
                "key {key}: {} ({}) after {} ({})",
                pair[1].0,
                pair[1].1,
                pair[0].0,
                pair[0].1
            );
        }
        crossed += usize::from(list.iter().map(|(_, s)| s).collect::<HashSet<_>>().len() >= 2);
    }
    assert!(crossed > 0, "no key moved between shards: the test did not exercise resharding");
}

/// Each child shard of `stream` was first acquired only after every one of its parents ended
/// (`(child, parents)` pairs), over all `workers`, by the times the workers logged them (their own
/// clocks: the lines of two processes are not read in the order they were written).
pub fn assert_children_after_parents(workers: &[&WorkerProcess], stream: &str, family: &[(&str, &[&str])]) {
    let ended = |shard: &str| {
        workers
            .iter()
            .flat_map(|w| w.events_logged("shard ended"))
            .filter(|(_, s)| *s == format!("{stream}:{shard}"))
            .map(|(at, _)| at)
            .min()
    };
    let started = |shard: &str| {
        workers
            .iter()
            .flat_map(|w| w.events_logged("lease acquired"))
            .filter(|(_, s)| *s == format!("{stream}:{shard}"))
            .map(|(at, _)| at)
            .min()
    };
    for (child, parents) in family {
        let child_start = started(child).unwrap_or_else(|| panic!("{child} never started"));
        for parent in *parents {
            let parent_end = ended(parent).unwrap_or_else(|| panic!("{parent} never ended"));
            assert!(child_start > parent_end, "{child} started before its parent {parent} ended");
        }
    }
}

/// The value of the series `name` (with its labels, e.g. `leasehold_x_total{reason="y"}`) on
/// `worker`'s `/metrics`; panics when it is not there.
pub async fn metric(worker: &WorkerProcess, name: &str) -> f64 {
    match try_metric(worker, name).await {
        Ok(value) => value,
        Err(body) => panic!("{name} not in /metrics:\n{body}"),
    }
}

/// [`metric`], or 0 for a labelled series never counted (a family shows only the labels it has seen).
pub async fn metric_or_zero(worker: &WorkerProcess, name: &str) -> f64 {
    try_metric(worker, name).await.unwrap_or(0.0)
}

/// The value of the series `name` on `worker`'s `/metrics`, or the whole answer when it is not there.
async fn try_metric(worker: &WorkerProcess, name: &str) -> Result<f64, String> {
    leasehold_testkit::process::wait_for(
        "the metrics address logged",
        std::time::Duration::from_secs(20),
        async || worker.metrics_addr().is_some(),
    )
    .await;
    let address = worker.metrics_addr().expect("address");
    let (_, body) = leasehold_testkit::server::http_get(&address, "/metrics").await;
    body.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok())).ok_or(body)
}

/// The value of the series `series` (with its labels, e.g. `leasehold_records_exhausted_total{policy="skip"}`)
/// as an in-process worker's `metrics` encode it for `/metrics`; 0 for a series not counted yet (a
/// family shows only the labels it has seen). Metrics' fields are the worker crate's own: tests read
/// what an operator would.
pub fn counted(metrics: &Metrics, series: &str) -> u64 {
    let text = metrics.encode();
    let value = text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok());
    value.unwrap_or(0.0) as u64
}
