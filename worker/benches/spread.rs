//! The spread of a skewed stream over a group (`lease.balance: count`, then `load`), with real worker
//! processes on kinesalite and dynalite. Run with `make bench` (or `cargo bench -p leasehold-worker
//! --bench spread`); prints JSON lines and markdown for docs/benchmarks.md.
//!
//! 4 workers, 8 shards. The processor is the `http` processor against one local server per worker
//! that models the worker's CPU: it serves its worker's requests one at a time, [`COST`] each (on a
//! schedule of its own, so the timer's slack does not lower the capacity), whatever shard they come
//! from; each shard may have several records in flight (`ordering: key`, several partition keys per
//! shard), so a worker's capacity is 1 / [`COST`] records/s however its shards are shaped.
//!
//! Two stream shapes: 2 hot shards carrying 3× the others' records (a perfect spread exists: each hot
//! shard alone, the cold ones three by three), and 1 shard at 10× (hotter than a fair share: the rest
//! spread around it). For each, the producer's rate is chosen so that a perfect spread keeps up while
//! a worker holding a hot shard and a cold one under `count` does not (3×: the producer outruns the
//! busiest worker; 10×: it nearly does). Per mode: the busiest worker's load over the best achievable
//! (the larger of the mean and the hottest shard, by the rates the producer writes), when it settled
//! (≤ 1.15× from then to the end), the moves made (the workers' handoffs after the group formed),
//! repeats over every delivery (by shard and sequence number), and the group's records/s over the last
//! [`WINDOW`] of the run beside the rate the producer wrote.
//!
//! A third run, `3x-light`, is the 3x stream at two thirds of the rate, below every worker's capacity
//! under either mode: the control for the first (no worker saturated, so no shard's holder falls
//! behind and every figure is what the shard asks).
//!
//! `LEASEHOLD_SPREAD_SECS` sets how long each run is watched after the producer starts (default 90);
//! `LEASEHOLD_SPREAD=3x,10x,3x-light` and `LEASEHOLD_SPREAD_BALANCE=count,load` pick the runs.

#[path = "../tests/common/mod.rs"]
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
use common::{config_with_timing, metric_or_zero, spawn};
use leasehold_testkit::kinesis::put_explicit;
use leasehold_testkit::process::{Delivery, WorkerProcess, poll_until, wait_for};
use leasehold_testkit::server::LocalServer;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

/// What each record costs its worker's CPU: a worker processes at most 1 / COST records/s.
const COST: Duration = Duration::from_millis(5);
const SHARDS: usize = 8;
const WORKERS: usize = 4;
/// Partition keys per shard: how many records of one shard may be in flight at once.
const KEYS_PER_SHARD: usize = 4;
/// The window, at the end of a run, over which the group's records/s are measured.
const WINDOW: Duration = Duration::from_secs(40);
/// The busiest worker over the best achievable at or under which a group counts as settled.
const SETTLED: f64 = 1.15;

/// A stream's shape and the producer's rate.
struct Shape {
    name: &'static str,
    /// Records per producer tick on each shard, by index in the stream's shard list (sorted by hash).
    per_tick: [usize; SHARDS],
    tick: Duration,
}

const SHAPES: [Shape; 3] = [
    // 60 records/s on a cold shard, 180 on a hot one: a perfect spread asks 180/s of each worker (90 %
    // of 200), a hot and a cold shard together 240/s.
    Shape { name: "3x", per_tick: [6, 18, 6, 6, 6, 6, 18, 6], tick: Duration::from_millis(100) },
    // 18 records/s on a cold shard, 180 on the hot one: the hot shard alone asks 180/s of its worker,
    // with a cold shard beside it 198/s.
    Shape { name: "10x", per_tick: [9, 9, 9, 90, 9, 9, 9, 9], tick: Duration::from_millis(500) },
    // The 3x stream below saturation (40 and 120 records/s: a hot and a cold shard together ask 160/s,
    // 80 % of a worker): no worker falls behind.
    Shape { name: "3x-light", per_tick: [4, 12, 4, 4, 4, 4, 12, 4], tick: Duration::from_millis(100) },
];

type Seen = Arc<Mutex<Vec<Delivery>>>;

/// One worker's processor: its requests served one at a time, [`COST`] each, on a schedule kept in
/// `free` (when the worker's CPU is next free); every record remembered.
async fn processor_server(seen: Seen) -> LocalServer {
    #[derive(Clone)]
    struct Cpu {
        seen: Seen,
        free: Arc<Mutex<Instant>>,
    }
    async fn record(State(cpu): State<Cpu>, headers: HeaderMap, body: Bytes) -> StatusCode {
        let done = {
            let mut free = cpu.free.lock().expect("cpu");
            let start = (*free).max(Instant::now());
            *free = start + COST;
            *free
        };
        tokio::time::sleep_until(done.into()).await;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let source = header("ce-source");
        cpu.seen.lock().expect("seen").push(Delivery {
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
    let cpu = Cpu { seen, free: Arc::new(Mutex::new(Instant::now())) };
    LocalServer::start(Router::new().route("/records", post(record)).with_state(cpu)).await
}

/// Writes `shape.per_tick` records to each shard every tick (by explicit hash key: the shard's range
/// start; partition keys spread over [`KEYS_PER_SHARD`]), numbering each shard's records; returns
/// everything written, with when, once stopped.
struct SkewedProducer {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Vec<(String, Instant)>>,
}

impl SkewedProducer {
    fn start(client: aws_sdk_kinesis::Client, stream: &str, shards: &[(String, u128, u128)], shape: &Shape) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let stream = stream.to_string();
        let targets: Vec<(String, u128, usize)> =
            shards.iter().zip(shape.per_tick).map(|((id, start, _), n)| (id.clone(), *start, n)).collect();
        let tick = shape.tick;
        let task = tokio::spawn(async move {
            let mut written = Vec::new();
            let mut n = 0u64;
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = interval.tick() => {}
                }
                let mut batch: Vec<(String, Vec<u8>, u128)> = Vec::new();
                for (shard, hash, per_tick) in &targets {
                    for i in 0..*per_tick {
                        let key = format!("{shard}-k{}", i % KEYS_PER_SHARD);
                        batch.push((key, format!("{shard}:{n}:{i}").into_bytes(), *hash));
                    }
                }
                n += 1;
                put_explicit(&client, &stream, &batch).await;
                let at = Instant::now();
                written.extend(batch.into_iter().map(|(_, data, _)| (String::from_utf8_lossy(&data).into_owned(), at)));
            }
            written
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<(String, Instant)> {
        self.stop.cancel();
        self.task.await.expect("producer task")
    }
}

/// What one run saw.
struct Figures {
    shape: &'static str,
    balance: &'static str,
    /// At the end, by the rates the producer writes.
    ratio: f64,
    /// At the end, by the loads the rows carry (records/s by arrival).
    measured_ratio: f64,
    /// The worst seen in the run.
    worst_ratio: f64,
    /// From the producer's start until the ratio was ≤ [`SETTLED`] and stayed there.
    settled_after: Option<Duration>,
    moves: f64,
    /// Placements seen changing after the group first settled.
    moves_after_settling: usize,
    written: usize,
    missing: usize,
    repeats: usize,
    produced_per_s: f64,
    processed_per_s: f64,
    /// Records written but not processed when the producer stopped.
    backlog: usize,
    final_holders: BTreeMap<String, Vec<String>>,
}

async fn run(shape: &Shape, balance: &'static str, watch: Duration) -> Figures {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "spread", SHARDS as i32).await;
    let table = leasehold_testkit::unique_name("spread");
    let mut shards = leasehold_testkit::kinesis::open_shards(&kinesis, &stream).await;
    shards.sort_by_key(|(_, start, _)| *start);
    let rate: HashMap<String, f64> = shards
        .iter()
        .zip(shape.per_tick)
        .map(|((id, _, _), n)| (id.clone(), n as f64 / shape.tick.as_secs_f64()))
        .collect();
    let seen: Seen = Arc::default();
    let mut servers = Vec::new();
    for _ in 0..WORKERS {
        servers.push(processor_server(seen.clone()).await);
    }

    // The timing of worker/tests/load_balance.rs: a 10 s lease renewed every second.
    let timing = format!(
        "lease: {{duration: 10s, renewInterval: 1s, scanInterval: 250ms, shardSyncInterval: 1s, \
         checkpointInterval: 200ms, gracefulTimeout: 3s, balance: {balance}}}\n"
    );
    // LEASEHOLD_SPREAD_ORDERING=shard: one record of a shard at a time (a hot shard then cannot use
    // its whole worker: 4 in flight per shard under `ordering: key` can).
    let ordering = match std::env::var("LEASEHOLD_SPREAD_ORDERING").as_deref() {
        Ok("shard") => "ordering: shard\nconcurrency: 1\n".to_string(),
        _ => format!("ordering: key\nconcurrency: {KEYS_PER_SHARD}\n"),
    };
    let config =
        config_with_timing(&stream, Some(&table), &timing, &format!("startPosition: TRIM_HORIZON\n{ordering}"));
    let workers: Vec<WorkerProcess> = servers
        .iter()
        .enumerate()
        .map(|(i, server)| {
            let config = config.replace(
                "processor: {stdout: {}}",
                &format!("processor: {{http: {{url: '{}/records', timeout: 10s}}}}", server.endpoint()),
            );
            spawn(&config, &format!("{}-{balance}-w{i}", shape.name))
        })
        .collect();
    let observer = DynamoLeaseStore::new(dynamodb.clone(), table.clone(), LeaseSettings::new("observer"));
    let rows = async || observer.list().await.map(|page| page.leases).unwrap_or_default();
    wait_for("every shard held, two per worker", Duration::from_secs(90), async || {
        let held = holders(&rows().await);
        held.len() == WORKERS && held.values().all(|s| s.len() == SHARDS / WORKERS)
    })
    .await;
    let mut formed = 0.0;
    for worker in &workers {
        formed += metric_or_zero(worker, "leasehold_lease_handoffs_total").await;
    }

    let producer = SkewedProducer::start(kinesis.clone(), &stream, &shards, shape);
    let started = Instant::now();
    let nominal = |shard: &str| rate.get(shard).copied().unwrap_or(0.0);
    let mut settled_after = None;
    let mut first_settled = None;
    let mut worst_ratio: f64 = 0.0;
    let mut last: Option<BTreeMap<String, Vec<String>>> = None;
    let mut moves_after_settling = 0;
    let mut measured_ratio = f64::INFINITY;
    let mut tick = 0u32;
    while started.elapsed() < watch {
        let leases = rows().await;
        let held = holders(&leases);
        if held.values().map(Vec::len).sum::<usize>() < SHARDS {
            // A lease between two holders: not a placement.
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let measured: HashMap<String, f64> =
            leases.iter().map(|l| (l.key.shard_id().to_string(), l.load.map_or(0.0, |l| l.weight() as f64))).collect();
        let now = ratio(WORKERS, &held, nominal);
        worst_ratio = worst_ratio.max(now);
        measured_ratio = ratio(WORKERS, &held, |s| measured.get(s).copied().unwrap_or(0.0));
        if let Some(before) = &last
            && before != &held
        {
            eprintln!(
                "[{} {balance} +{:.1}s] {held:?} busiest/best {now:.2} (measured {measured_ratio:.2})",
                shape.name,
                started.elapsed().as_secs_f64()
            );
            if first_settled.is_some() {
                moves_after_settling += 1;
            }
        }
        if tick.is_multiple_of(20) {
            // Each worker's shards with the load (records/s) their rows carry.
            let weights: BTreeMap<&String, Vec<(String, f64)>> = held
                .iter()
                .map(|(w, ss)| {
                    (
                        w,
                        ss.iter()
                            .map(|s| (s.replace("shardId-0000000000", ""), measured.get(s).copied().unwrap_or(0.0)))
                            .collect(),
                    )
                })
                .collect();
            eprintln!("[{} {balance} +{:.0}s] records/s {weights:?}", shape.name, started.elapsed().as_secs_f64());
        }
        tick += 1;
        if now <= SETTLED {
            settled_after.get_or_insert(started.elapsed());
            first_settled.get_or_insert(started.elapsed());
        } else {
            settled_after = None;
        }
        last = Some(held);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let final_holders = last.unwrap_or_default();
    let final_ratio = ratio(WORKERS, &final_holders, nominal);
    let mut moves = -formed;
    for worker in &workers {
        moves += metric_or_zero(worker, "leasehold_lease_handoffs_total").await;
    }

    let written = producer.stop().await;
    let stopped = Instant::now();
    let window_start = stopped.checked_sub(WINDOW).unwrap_or(started);
    let (processed_in_window, backlog) = {
        let seen = seen.lock().expect("seen");
        let processed = seen.iter().filter(|d| d.seen_at >= window_start && d.seen_at <= stopped).count();
        (processed, written.len().saturating_sub(common::distinct(&seen).len()))
    };
    let produced_in_window = written.iter().filter(|(_, at)| *at >= window_start).count();
    let window = stopped.duration_since(window_start).as_secs_f64();

    // Drain what is left, then count.
    let expected: std::collections::HashSet<&str> = written.iter().map(|(d, _)| d.as_str()).collect();
    poll_until(Duration::from_secs(180), async || {
        common::distinct(&seen.lock().expect("seen")).len() >= expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (missing, repeats) = {
        let seen = seen.lock().expect("seen");
        let got = common::distinct(&seen);
        let missing = expected.iter().filter(|d| !got.contains(**d)).count();
        let mut per_record: HashMap<(&str, &str), usize> = HashMap::new();
        for d in seen.iter() {
            *per_record.entry((d.shard_id.as_str(), d.sequence_number.as_str())).or_default() += 1;
        }
        (missing, per_record.values().map(|n| n - 1).sum())
    };
    drop(workers);
    Figures {
        shape: shape.name,
        balance,
        ratio: final_ratio,
        measured_ratio,
        worst_ratio,
        settled_after,
        moves,
        moves_after_settling,
        written: written.len(),
        missing,
        repeats,
        produced_per_s: produced_in_window as f64 / window,
        processed_per_s: processed_in_window as f64 / window,
        backlog,
        final_holders,
    }
}

/// `key` (several records of a shard in flight) or `shard` (`LEASEHOLD_SPREAD_ORDERING=shard`).
fn ordering_name() -> &'static str {
    if std::env::var("LEASEHOLD_SPREAD_ORDERING").as_deref() == Ok("shard") { "shard" } else { "key" }
}

fn json(f: &Figures) -> serde_json::Value {
    serde_json::json!({
        "bench": "spread",
        "shape": f.shape,
        "balance": f.balance,
        "ordering": ordering_name(),
        "busiest_over_best": (f.ratio * 100.0).round() / 100.0,
        "busiest_over_best_measured": (f.measured_ratio * 100.0).round() / 100.0,
        "worst_busiest_over_best": (f.worst_ratio * 100.0).round() / 100.0,
        "settled_after_s": f.settled_after.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0),
        "moves": f.moves,
        "moves_after_settling": f.moves_after_settling,
        "records": f.written,
        "missing": f.missing,
        "repeats": f.repeats,
        "produced_per_s": f.produced_per_s.round(),
        "processed_per_s": f.processed_per_s.round(),
        "backlog_at_stop": f.backlog,
        "final": f.final_holders,
    })
}

fn markdown(f: &Figures) -> String {
    let settled = f.settled_after.map_or("never".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
    format!(
        "| {} | `{}` | {:.2} (worst {:.2}) | {settled} | {} | {} / {} | {:.0} / {:.0} | {} |",
        f.shape,
        f.balance,
        f.ratio,
        f.worst_ratio,
        f.moves,
        f.repeats,
        f.missing,
        f.processed_per_s,
        f.produced_per_s,
        f.backlog
    )
}

#[tokio::main]
async fn main() {
    let watch =
        Duration::from_secs(std::env::var("LEASEHOLD_SPREAD_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(90));
    let pick = |var: &str, name: &str| {
        let only = std::env::var(var).unwrap_or_default();
        only.is_empty() || only.split(',').any(|o| o == name)
    };
    let mut all = Vec::new();
    for shape in SHAPES.iter().filter(|s| pick("LEASEHOLD_SPREAD", s.name)) {
        for balance in ["count", "load"].into_iter().filter(|b| pick("LEASEHOLD_SPREAD_BALANCE", b)) {
            let figures = run(shape, balance, watch).await;
            println!("{}", json(&figures));
            all.push(figures);
        }
    }
    println!(
        "\n## Spread ({WORKERS} workers, {SHARDS} shards, {} ms a record per worker, ordering: {}, watched {} s, records/s over the last {} s)\n",
        COST.as_millis(),
        ordering_name(),
        watch.as_secs(),
        WINDOW.as_secs()
    );
    println!(
        "| stream | `lease.balance` | busiest / best at the end | settled (≤ {SETTLED}×) after | moves | repeats / missing | records/s processed / produced | backlog at stop |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for figures in &all {
        println!("{}", markdown(figures));
    }
}
