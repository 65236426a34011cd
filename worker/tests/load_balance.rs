//! `lease.balance: load` with real worker processes on kinesalite and dynalite: 4 workers, 8 shards, 2
//! of them carrying 3× the others' records, a processor whose cost per record is fixed (the `http`
//! processor against a local server that takes 10 ms per record). With `load` the busiest worker
//! settles at ≤ 1.15× the best achievable (the larger of the mean and the hottest shard) within 60 s,
//! by cooperative handoffs (every record processed exactly once); with `count` the group stays where
//! placement put it (≥ 1.33×). Both print their figures: busiest / best, time to settle, moves. The
//! workers' `/metrics` show each held shard's load. `load` is run with `scan: full` and `segmented`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::skew::{holders, ratio};
use common::*;
use leasehold_testkit::kinesis::put_explicit;
use leasehold_testkit::process::{Delivery, WorkerProcess, wait_for};
use leasehold_testkit::server::LocalServer;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

/// What each record costs the processor.
const COST: Duration = Duration::from_millis(10);
/// Records per producer tick on a cold shard and on a hot one.
const COLD: usize = 1;
const HOT: usize = 3;
/// How often the producer writes a tick.
const TICK: Duration = Duration::from_millis(100);
const SHARDS: usize = 8;
const WORKERS: usize = 4;
/// Which shards (by index in the stream's shard list) are hot.
const HOT_SHARDS: [usize; 2] = [1, 6];

/// The two runs share the machine's two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

type Seen = Arc<Mutex<Vec<Delivery>>>;

/// The processor's server: each record takes [`COST`], then is acknowledged and remembered.
async fn processor_server(seen: Seen) -> LocalServer {
    async fn record(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) -> StatusCode {
        tokio::time::sleep(COST).await;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let source = header("ce-source");
        seen.lock().unwrap().push(Delivery {
            stream: source.strip_prefix("kinesis:").unwrap_or(&source).to_string(),
            shard_id: header("ce-shardid"),
            sequence_number: header("ce-sequencenumber"),
            partition_key: header("ce-partitionkey"),
            data: String::from_utf8_lossy(&body).into_owned(),
            owner: String::new(),
            seen_at: Instant::now(),
        });
        StatusCode::OK
    }
    LocalServer::start(Router::new().route("/records", post(record)).with_state(seen)).await
}

/// Writes, every [`TICK`], [`COLD`] records to each cold shard and [`HOT`] to each hot one (by explicit
/// hash key: the shard's range start), numbering each shard's records; returns everything written once
/// stopped.
struct SkewedProducer {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Vec<(String, Vec<u8>)>>,
}

impl SkewedProducer {
    fn start(client: aws_sdk_kinesis::Client, stream: &str, shards: &[(String, u128, u128)]) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let stream = stream.to_string();
        let targets: Vec<(String, u128, usize)> = shards
            .iter()
            .enumerate()
            .map(|(i, (id, start, _))| {
                let hot = HOT_SHARDS.contains(&i);
                (format!("{}-{id}", if hot { "hot" } else { "cold" }), *start, if hot { HOT } else { COLD })
            })
            .collect();
        let task = tokio::spawn(async move {
            let mut written = Vec::new();
            let mut n = 0u64;
            while !token.is_cancelled() {
                let mut batch: Vec<(String, Vec<u8>, u128)> = Vec::new();
                for (key, hash, per_tick) in &targets {
                    for i in 0..*per_tick as u64 {
                        batch.push((key.clone(), format!("{key}:{}", n * HOT as u64 + i).into_bytes(), *hash));
                    }
                }
                n += 1;
                put_explicit(&client, &stream, &batch).await;
                written.extend(batch.into_iter().map(|(key, data, _)| (key, data)));
                tokio::time::sleep(TICK).await;
            }
            written
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<(String, Vec<u8>)> {
        self.stop.cancel();
        self.task.await.expect("producer task")
    }
}

/// What one run saw.
#[derive(Debug)]
struct Figures {
    /// Busiest worker over the best achievable, by the records the producer puts on each shard.
    ratio: f64,
    /// The same by the loads measured in the rows (records/s by arrival).
    measured_ratio: f64,
    /// From the producer's start until both ratios were ≤ 1.15 (`None`: not within the run).
    settled_after: Option<Duration>,
    /// Handoffs made (the workers' `leasehold_lease_handoffs_total`).
    moves: f64,
    /// Moves seen in the rows after settling.
    moves_after_settling: usize,
}

async fn skewed_group(balance: &str, scan: &str, watch: Duration) -> Figures {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "load-balance", SHARDS as i32).await;
    let table = leasehold_testkit::unique_name("load-balance");
    let mut shards = leasehold_testkit::kinesis::open_shards(&kinesis, &stream).await;
    shards.sort_by_key(|(_, start, _)| *start);
    let hot: Vec<String> = HOT_SHARDS.iter().map(|&i| shards[i].0.clone()).collect();
    let seen: Seen = Arc::default();
    let server = processor_server(seen.clone()).await;

    // A 10 s lease renewed every second: nothing moves by expiry on a loaded machine.
    let timing = format!(
        "lease: {{duration: 10s, renewInterval: 1s, scanInterval: 250ms, shardSyncInterval: 1s, \
         checkpointInterval: 200ms, gracefulTimeout: 3s, balance: {balance}, scan: {scan}}}\n"
    );
    let config = config_with_timing(
        &stream,
        Some(&table),
        &timing,
        "startPosition: TRIM_HORIZON\nordering: shard\nconcurrency: 1\n",
    )
    .replace(
        "processor: {stdout: {}}",
        &format!("processor: {{http: {{url: '{}/records', timeout: 5s}}}}", server.endpoint()),
    );
    let workers: Vec<WorkerProcess> = (0..WORKERS).map(|i| spawn(&config, &format!("{balance}-w{i}"))).collect();
    let observer = DynamoLeaseStore::new(dynamodb.clone(), table.clone(), LeaseSettings::new("observer"));
    let rows = async || observer.list().await.map(|page| page.leases).unwrap_or_default();
    wait_for("every shard held, two per worker", Duration::from_secs(60), async || {
        let held = holders(&rows().await);
        held.len() == WORKERS && held.values().all(|s| s.len() == SHARDS / WORKERS)
    })
    .await;

    // Handoffs made while the group formed are not the balance's moves.
    let mut formed = 0.0;
    for worker in &workers {
        formed += metric_or_zero(worker, "leasehold_lease_handoffs_total").await;
    }
    let producer = SkewedProducer::start(kinesis.clone(), &stream, &shards);
    let started = Instant::now();
    let nominal = |shard: &str| if hot.iter().any(|h| h == shard) { HOT as f64 } else { COLD as f64 };
    let mut settled_after = None;
    let mut last: Option<BTreeMap<String, Vec<String>>> = None;
    let mut moves_after_settling = 0;
    let mut measured_ratio = f64::INFINITY;
    let mut tick = 0u32;
    while started.elapsed() < watch {
        let leases = rows().await;
        let held = holders(&leases);
        let measured: HashMap<String, f64> =
            leases.iter().map(|l| (l.key.shard_id().to_string(), l.load.map_or(0.0, |l| l.weight() as f64))).collect();
        let now = ratio(WORKERS, &held, nominal);
        measured_ratio = ratio(WORKERS, &held, |s| measured.get(s).copied().unwrap_or(0.0));
        if let Some(before) = &last
            && before != &held
        {
            println!(
                "[{balance} +{:.1}s] {held:?} ratio {now:.2} (measured {measured_ratio:.2})",
                started.elapsed().as_secs_f64()
            );
            if settled_after.is_some() {
                moves_after_settling += 1;
            }
        }
        if tick.is_multiple_of(10) {
            let delivered = seen.lock().unwrap().len();
            let weights: Vec<u64> = leases.iter().map(|l| l.load.map_or(0, |l| l.weight())).collect();
            println!(
                "[{balance} +{:.0}s] {delivered} delivered; records/s by shard {weights:?}",
                started.elapsed().as_secs_f64()
            );
        }
        tick += 1;
        // Settled: near the best by what the producer puts on each shard, and within the planner's own
        // margin (10 %) by the loads it reads in the rows: while those still converge it may rightly
        // move on.
        if settled_after.is_none() && now <= 1.15 && measured_ratio <= 1.10 {
            settled_after = Some(started.elapsed());
        }
        last = Some(held);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let last = last.unwrap_or_default();
    let final_ratio = ratio(WORKERS, &last, nominal);

    // The workers' /metrics show the load of each shard they hold.
    for worker in &workers {
        for shard in last.get(&worker.owner).into_iter().flatten() {
            let series =
                format!("leasehold_shard_load_busy_seconds_per_second{{stream=\"{stream}\",shard=\"{shard}\"}}");
            let busy = metric(worker, &series).await;
            let records = metric(worker, &series.replace("busy_seconds", "records")).await;
            assert!(
                busy > 0.0 && records > 0.0,
                "{} shows {shard} idle: busy {busy} s/s, {records} records/s",
                worker.owner
            );
        }
    }
    for worker in &workers {
        let count = |message: &str| worker.events(message).len();
        println!(
            "{}: asked {}, handing over on request {}, handed over {}",
            worker.owner,
            count("asked for a handoff"),
            count("handing lease over on request"),
            count("lease handed over")
        );
    }
    let mut moves = -formed;
    for worker in &workers {
        moves += metric_or_zero(worker, "leasehold_lease_handoffs_total").await;
    }

    let written = producer.stop().await;
    let waited = leasehold_testkit::process::poll_until(Duration::from_secs(60), async || {
        distinct(&seen.lock().unwrap()).len() >= written.len()
    })
    .await;
    if waited.is_none() {
        for worker in &workers {
            let text = worker.stderr_text();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            eprintln!("{} stderr (last lines, newest first):\n{}", worker.owner, tail.join("\n"));
        }
        panic!("{} of {} records processed", distinct(&seen.lock().unwrap()).len(), written.len());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_exactly_once(&seen.lock().unwrap(), &written);
    let figures = Figures { ratio: final_ratio, measured_ratio, settled_after, moves, moves_after_settling };
    println!(
        "balance {balance}, scan {scan}: busiest/best {:.2} (measured {:.2}), settled after {:?}, {} moves ({} after settling), {} records exactly once; final {last:?}",
        figures.ratio,
        figures.measured_ratio,
        figures.settled_after,
        figures.moves,
        figures.moves_after_settling,
        written.len()
    );
    figures
}

/// With `load`: settled within 60 s at ≤ 1.15× the best, by handoffs, and still after.
async fn settles_with_load(scan: &str) {
    let figures = skewed_group("load", scan, Duration::from_secs(75)).await;
    let settled = figures.settled_after.unwrap_or_else(|| panic!("never settled: {figures:?}"));
    assert!(settled <= Duration::from_secs(60), "settled only after {settled:?}: {figures:?}");
    assert!(figures.ratio <= 1.15, "{figures:?}");
    assert!(figures.moves >= 1.0, "placement by count leaves ≥ 1.33×: some lease had to move: {figures:?}");
    // At rest nothing moves (the planner's paused-clock tests: none in an hour); here the measured
    // figures keep converging for a while on a loaded machine, which may still move a cold shard or
    // two, but never flaps.
    assert!(figures.moves_after_settling <= 2, "moves once settled: {figures:?}");
}

#[test]
fn with_load_and_full_scans_the_busiest_worker_settles_near_the_best_achievable() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    run_test(settles_with_load("full"));
}

#[test]
fn with_load_and_segmented_scans_the_busiest_worker_settles_near_the_best_achievable() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    run_test(settles_with_load("segmented"));
}

#[test]
fn with_count_the_group_stays_where_placement_put_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    run_test(async {
        let figures = skewed_group("count", "full", Duration::from_secs(30)).await;
        // Two shards each: a hot shard's worker carries at least 3 + 1.
        assert!(figures.ratio >= 1.33, "{figures:?}");
        assert_eq!(figures.moves, 0.0, "count moves nothing once the group formed: {figures:?}");
    });
}
