//! Scale and cost: N workers on S shards against kinesalite and dynalite, the workers' DynamoDB traffic
//! going through a counting endpoint ([`leasehold_testkit::dynamo_meter`]) that bills it as DynamoDB
//! would. Run with `make bench` or `cargo bench -p leasehold-worker --bench scale`; prints markdown for
//! docs/benchmarks.md.
//!
//! The workers are worker runtimes ([`leasehold_worker::runtime::run_worker`]) sharing this process, not
//! processes: see docs/benchmarks.md ("Scale and cost") for why. The lease table is watched directly
//! on dynalite (not through the meter), so watching costs nothing on the bill.
//!
//! Settings (environment):
//! - `LEASEHOLD_SCALE_SIZES`: `workers x shards` list, default `10x100,50x500,100x1000`; empty skips.
//! - `LEASEHOLD_SCALE_DESIGNS`: which lease-table designs, by name (see [`DESIGNS`]), default all.
//! - `LEASEHOLD_SCALE_WINDOW`: seconds of each measuring window (at rest, then 1 record/s/shard), default 60.
//! - `LEASEHOLD_SCALE_IDLE`: the readers' `idleTime`; default `auto`: 1 s per 100 shards, at least 1 s
//!   (kinesalite serves a few hundred GetRecords a second on 2 cores).
//! - `LEASEHOLD_SCALE_SYNC`: `shardSyncInterval`, default 60s (the KCL's shardSyncIntervalMillis): with 10 s,
//!   100 workers listing 1,000 shards keep kinesalite busy on ListShards alone.
//! - `LEASEHOLD_SCALE_STREAM_SHARDS`: shards per stream, default 100 (S shards are S/100 streams, all
//!   in one lease table): a GetRecords on a 1,000-shard kinesalite stream costs about 3 on a 100-shard one.
//! - `LEASEHOLD_SCALE_LOG`: a `RUST_LOG`-style filter for the runtimes' logs on stderr (each line names
//!   its worker), default none.
//! - `LEASEHOLD_SCALE_SINGLE`: lease counts for the one-worker memory and CPU figures, default `100,1000`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use leasehold_testkit::dynamo_meter::{DynamoMeter, MeterSnapshot, difference, sdk_item_size, totals};
use leasehold_testkit::process::{cpu_time, rss_mib};
use leasehold_testkit::{Service, endpoint};
use leasehold_worker::Metrics;
use leasehold_worker::processor::shared;
use leasehold_worker::{Outputs, ProcessError, Record, ShardProcessor, WorkerConfig};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Lease-table designs to compare: name and what it adds inside the `lease:` map of the config.
/// `full-scan` is the design before issue 13 (every worker reads the whole table every `scanInterval`);
/// `segmented` is issue 13's (`lease.scan: segmented`, see docs/architecture.md).
const DESIGNS: &[(&str, &str)] = &[("full-scan", "scan: full"), ("segmented", "scan: segmented")];

/// The default lease timing (`leasehold_crds::defaults`), spelled out so the figures say what they used.
const TIMING: &str = "duration: 10s, renewInterval: 3s, scanInterval: 500ms";

/// Everything a run is set up with besides its size and design.
#[derive(Clone)]
struct Setup {
    seconds: u64,
    idle: Option<String>,
    sync: String,
    stream_shards: usize,
}

impl Setup {
    fn from_env() -> Self {
        let idle = env_or("LEASEHOLD_SCALE_IDLE", "auto");
        Self {
            seconds: env_or("LEASEHOLD_SCALE_WINDOW", "60").parse().expect("LEASEHOLD_SCALE_WINDOW"),
            idle: (idle != "auto").then_some(idle),
            sync: env_or("LEASEHOLD_SCALE_SYNC", "60s"),
            stream_shards: env_or("LEASEHOLD_SCALE_STREAM_SHARDS", "100")
                .parse()
                .expect("LEASEHOLD_SCALE_STREAM_SHARDS"),
        }
    }

    fn idle(&self, shards: usize) -> String {
        self.idle.clone().unwrap_or_else(|| format!("{}s", shards.div_ceil(100).max(1)))
    }

    /// The `lease:` line with a design's additions.
    fn lease(&self, design: &str) -> String {
        let design = if design.is_empty() { String::new() } else { format!(", {design}") };
        format!("lease: {{{TIMING}, shardSyncInterval: {}{design}}}\n", self.sync)
    }

    /// The `reader:` line for `shards` shards.
    fn reader(&self, shards: usize) -> String {
        format!("reader: {{idleTime: {}}}\n", self.idle(shards))
    }
}

/// Streams making up `shards` shards, at most `per_stream` each, created and ACTIVE.
async fn create_streams(
    kinesis: &aws_sdk_kinesis::Client,
    prefix: &str,
    shards: usize,
    per_stream: usize,
) -> Vec<String> {
    let mut names = Vec::new();
    let mut left = shards;
    while left > 0 {
        let n = left.min(per_stream.max(1));
        names.push(leasehold_testkit::create_stream(kinesis, prefix, n as i32).await);
        left -= n;
    }
    names
}

/// Each stream's open shards' first hash keys.
async fn hash_keys(kinesis: &aws_sdk_kinesis::Client, streams: &[String]) -> Vec<(String, Vec<u128>)> {
    let mut out = Vec::new();
    for stream in streams {
        let shards = leasehold_testkit::kinesis::open_shards(kinesis, stream).await;
        out.push((stream.clone(), shards.into_iter().map(|(_, start, _)| start).collect()));
    }
    out
}

fn stream_list(streams: &[String]) -> String {
    streams.iter().map(|s| format!("{{name: {s}}}")).collect::<Vec<_>>().join(", ")
}

/// Longest wait for all shards leased, and again for balance (`LEASEHOLD_SCALE_TIMEOUT` seconds).
static PHASE_TIMEOUT: std::sync::LazyLock<Duration> = std::sync::LazyLock::new(|| {
    Duration::from_secs(env_or("LEASEHOLD_SCALE_TIMEOUT", "300").parse().expect("LEASEHOLD_SCALE_TIMEOUT"))
});

/// Counts records and does nothing else, so the figures are the worker's and the emulators'.
struct Counting(Arc<AtomicU64>);

#[async_trait]
impl ShardProcessor for Counting {
    async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn sizes() -> Vec<(usize, usize)> {
    env_or("LEASEHOLD_SCALE_SIZES", "10x100,50x500,100x1000")
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let (w, sh) = s.trim().split_once('x').unwrap_or_else(|| panic!("size {s}: want WORKERSxSHARDS"));
            (w.parse().expect("workers"), sh.parse().expect("shards"))
        })
        .collect()
}

fn designs() -> Vec<(&'static str, &'static str)> {
    let wanted = env_or("LEASEHOLD_SCALE_DESIGNS", "");
    DESIGNS.iter().copied().filter(|(name, _)| wanted.is_empty() || wanted.split(',').any(|w| w == *name)).collect()
}

/// Owner of each shard row (membership rows left out), read directly from dynalite.
async fn owners(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> (HashMap<String, Option<String>>, usize) {
    let mut out = HashMap::new();
    let mut bytes = 0;
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    loop {
        let page = dynamodb.scan().table_name(table).consistent_read(true).set_exclusive_start_key(start).send().await;
        let Ok(page) = page else { return (out, 0) };
        for item in page.items.unwrap_or_default() {
            let Some(AttributeValue::S(key)) = item.get("lease_key") else { continue };
            if key.starts_with('#') {
                continue;
            }
            bytes += sdk_item_size(&item);
            let owner = match item.get("lease_owner") {
                Some(AttributeValue::S(owner)) => Some(owner.clone()),
                _ => None,
            };
            out.insert(key.clone(), owner);
        }
        start = page.last_evaluated_key;
        if start.is_none() {
            return (out, bytes);
        }
    }
}

fn all_leased(owners: &HashMap<String, Option<String>>, shards: usize) -> bool {
    owners.len() == shards && owners.values().all(Option::is_some)
}

fn balanced(owners: &HashMap<String, Option<String>>, shards: usize, workers: &[String]) -> bool {
    if !all_leased(owners, shards) {
        return false;
    }
    let mut held: HashMap<&str, usize> = workers.iter().map(|w| (w.as_str(), 0)).collect();
    for owner in owners.values().flatten() {
        *held.entry(owner.as_str()).or_default() += 1;
    }
    let (min, max) = (held.values().min().copied().unwrap_or(0), held.values().max().copied().unwrap_or(0));
    max - min <= 1
}

/// How many shards each worker holds, in id order, and last how many rows are free.
fn spread(owners: &HashMap<String, Option<String>>, workers: &[String]) -> Vec<usize> {
    let mut held: Vec<usize> =
        workers.iter().map(|w| owners.values().filter(|o| o.as_deref() == Some(w)).count()).collect();
    held.push(owners.values().filter(|o| o.is_none()).count());
    held
}

fn moves(before: &HashMap<String, Option<String>>, after: &HashMap<String, Option<String>>) -> usize {
    after.iter().filter(|(key, owner)| before.get(*key).is_some_and(|b| b != *owner)).count()
}

/// Writes one record to every shard each second (by explicit hash key) until cancelled.
fn produce(kinesis: aws_sdk_kinesis::Client, streams: Vec<(String, Vec<u128>)>, stop: CancellationToken) {
    // One PutRecords call per 500 shards of a stream.
    let batches: Vec<(String, Vec<u128>)> = streams
        .into_iter()
        .flat_map(|(stream, keys)| keys.chunks(500).map(|c| (stream.clone(), c.to_vec())).collect::<Vec<_>>())
        .collect();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n = 0u64;
        while !stop.is_cancelled() {
            tick.tick().await;
            for (stream, chunk) in &batches {
                let entries: Vec<PutRecordsRequestEntry> = chunk
                    .iter()
                    .map(|hash| {
                        PutRecordsRequestEntry::builder()
                            .partition_key("k")
                            .explicit_hash_key(hash.to_string())
                            .data(Blob::new(format!("{hash}:{n}")))
                            .build()
                            .expect("entry")
                    })
                    .collect();
                let put = kinesis.put_records().stream_name(stream).set_records(Some(entries)).send().await;
                // After the stop the streams are deleted under a call in flight: not worth a line.
                if let Err(e) = put
                    && !stop.is_cancelled()
                {
                    eprintln!("scale producer: {e}");
                }
            }
            n += 1;
        }
    });
}

/// What one window measured.
struct Window {
    cost: MeterSnapshot,
    moves: usize,
    processed: u64,
    seconds: f64,
    cpu_percent: f64,
}

/// Watches the table for `seconds`, counting owner changes, and returns what the meter billed.
async fn window(
    meter: &DynamoMeter,
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    processed: &AtomicU64,
    seconds: u64,
) -> Window {
    let (mut last, _) = owners(dynamodb, table).await;
    let before = meter.snapshot();
    let records_before = processed.load(Ordering::Relaxed);
    let cpu_before = cpu_time(std::process::id());
    let started = Instant::now();
    let mut moved = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (now, _) = owners(dynamodb, table).await;
        if !now.is_empty() {
            moved += moves(&last, &now);
            last = now;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Window {
        cost: difference(&meter.snapshot(), &before),
        moves: moved,
        processed: processed.load(Ordering::Relaxed) - records_before,
        seconds,
        cpu_percent: (cpu_time(std::process::id()) - cpu_before).as_secs_f64() / seconds * 100.0,
    }
}

fn per_shard_hour(units: f64, w: &Window, shards: usize) -> f64 {
    units * 3600.0 / w.seconds / shards as f64
}

fn detail(w: &Window, shards: usize) -> String {
    w.cost
        .iter()
        .map(|(op, c)| {
            let rate = |x: f64| per_shard_hour(x, w, shards);
            format!(
                "{op} {:.0} req ({:.0} R, {:.0} W)",
                rate(c.requests as f64),
                rate(c.read_units),
                rate(c.write_units)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The KCL 2's published cadence as arithmetic, per shard-hour, for `workers` on `shards` with lease rows
/// of `row_bytes`: (renewal write units, lease-taker scan read units, consistent). From
/// awslabs/amazon-kinesis-client, `DynamoDBLeaseCoordinator`: renewals every
/// `failoverTimeMillis / 3 - epsilonMillis`, the taker (a full table scan) every
/// `(failoverTimeMillis + epsilonMillis) * 2`; `LeaseManagementConfig` defaults: failover 10 000 ms,
/// epsilon 25 ms.
fn kcl2(workers: usize, shards: usize, row_bytes: f64) -> (f64, f64) {
    let (failover, epsilon) = (10_000.0, 25.0);
    let renew_ms: f64 = failover / 3.0 - epsilon;
    let taker_ms: f64 = (failover + epsilon) * 2.0;
    let renewals = 3_600_000.0 / renew_ms * (row_bytes / 1024.0).ceil().max(1.0);
    let scan_units = (shards as f64 * row_bytes / 4096.0).ceil().max(1.0);
    let scans = workers as f64 * 3_600_000.0 / taker_ms * scan_units / shards as f64;
    (renewals, scans)
}

/// One fleet run: `workers` runtimes on a fresh `shards`-shard stream with `design`.
async fn fleet(design: (&str, &str), workers: usize, shards: usize, setup: &Setup) -> (String, String) {
    let seconds = setup.seconds;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let streams = create_streams(&kinesis, "scale", shards, setup.stream_shards).await;
    let table = leasehold_testkit::create_lease_table(&dynamodb, "scale").await;
    let meter = DynamoMeter::start(&endpoint(Service::DynamoDb)).await;
    let yaml = format!(
        "streams: [{}]\naws: {{region: us-east-1, kinesisEndpoint: '{}', dynamodbEndpoint: '{}'}}\n\
         leaseTable: {{name: {table}}}\nprocessor: {{custom: {{}}}}\n{}{}startPosition: LATEST\n",
        stream_list(&streams),
        endpoint(Service::Kinesis),
        meter.endpoint(),
        setup.lease(design.1),
        setup.reader(shards),
    );
    let config = WorkerConfig::parse(&yaml, Path::new("scale.yaml")).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let processed = Arc::new(AtomicU64::new(0));
    let factory = Arc::new(shared(Counting(processed.clone())));
    let shutdown = CancellationToken::new();
    let names: Vec<String> = (0..workers).map(|i| format!("scale-{i:03}")).collect();
    let started = Instant::now();
    let tasks: Vec<_> = names
        .iter()
        .map(|owner| {
            let (config, owner, factory, token) = (config.clone(), owner.clone(), factory.clone(), shutdown.clone());
            let span = tracing::info_span!("worker", owner = %owner);
            tokio::spawn(
                async move {
                    if let Err(e) = leasehold_worker::runtime::run_worker(leasehold_worker::runtime::Worker {
                        config,
                        owner: owner.clone(),
                        processors: factory,
                        metrics: Arc::new(Metrics::default()),
                        shutdown: token,
                    })
                    .await
                    {
                        eprintln!("{owner}: {e}");
                    }
                }
                .instrument(span),
            )
        })
        .collect();

    let mut leased_at = None;
    let mut balanced_at = None;
    let mut table_bytes = 0;
    let mut last_spread_at = 0;
    while started.elapsed() < *PHASE_TIMEOUT * 2 && balanced_at.is_none() {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (now, bytes) = owners(&dynamodb, &table).await;
        if leased_at.is_none() && all_leased(&now, shards) {
            leased_at = Some(started.elapsed());
        }
        if bytes > 0 {
            table_bytes = bytes;
        }
        if leased_at.is_some() && balanced(&now, shards, &names) {
            balanced_at = Some(started.elapsed());
        }
        if started.elapsed().as_secs() / 10 != last_spread_at {
            last_spread_at = started.elapsed().as_secs() / 10;
            eprintln!(
                "scale {}: {:>4} s: held per worker {:?}",
                design.0,
                started.elapsed().as_secs(),
                spread(&now, &names)
            );
        }
        if leased_at.is_none() && started.elapsed() > *PHASE_TIMEOUT {
            break;
        }
    }
    let secs = |d: Option<Duration>| {
        d.map_or(format!("> {} s", PHASE_TIMEOUT.as_secs()), |d| format!("{:.1} s", d.as_secs_f64()))
    };
    eprintln!("scale {}: {workers} x {shards}: leased {}, balanced {}", design.0, secs(leased_at), secs(balanced_at));
    // Let the joins' handoffs and the first renewals of the last takers settle.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rest = window(&meter, &dynamodb, &table, &processed, seconds).await;
    let stop = CancellationToken::new();
    produce(kinesis.clone(), hash_keys(&kinesis, &streams).await, stop.clone());
    // Readers start from LATEST; let the first records reach every shard before counting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let busy = window(&meter, &dynamodb, &table, &processed, seconds).await;
    stop.cancel();
    shutdown.cancel();
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }
    for stream in &streams {
        let _ = kinesis.delete_stream().stream_name(stream).send().await;
    }
    let _ = dynamodb.delete_table().table_name(&table).send().await;

    let per_minute = |w: &Window| w.moves as f64 * 60.0 / w.seconds;
    let (rest_total, busy_total) = (totals(&rest.cost), totals(&busy.cost));
    let row_bytes = if shards > 0 { table_bytes as f64 / shards as f64 } else { 0.0 };
    let row = format!(
        "| {} | {workers} x {shards} ({} streams, idleTime {}) | {} | {} | {:.1} / {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} / {:.0} | {:.0} % / {:.0} % |",
        design.0,
        streams.len(),
        setup.idle(shards),
        secs(leased_at),
        secs(balanced_at),
        per_minute(&rest),
        per_minute(&busy),
        per_shard_hour(rest_total.read_units, &rest, shards),
        per_shard_hour(rest_total.write_units, &rest, shards),
        per_shard_hour(busy_total.read_units, &busy, shards),
        per_shard_hour(busy_total.write_units, &busy, shards),
        rest_total.requests as f64 / rest.seconds,
        busy_total.requests as f64 / busy.seconds,
        rest.cpu_percent,
        busy.cpu_percent,
    );
    let (kcl_writes, kcl_reads) = kcl2(workers, shards, row_bytes);
    let notes = format!(
        "- {} {workers} x {shards}: KCL 2 cadence by arithmetic at this size and row size: {kcl_writes:.0} renewal \
         write units + {kcl_reads:.0} read units (taker scans, strongly consistent; half if eventual) per shard-hour at \
         rest; lease rows {row_bytes:.0} B on average; records processed in the 1 record/s window \
         {} of {} expected ({:.0} %); per shard-hour at rest: {}; with traffic: {}",
        design.0,
        busy.processed,
        (busy.seconds as u64) * shards as u64,
        busy.processed as f64 * 100.0 / (busy.seconds * shards as f64),
        detail(&rest, shards),
        detail(&busy, shards)
    );
    (row, notes)
}

/// One worker process holding `shards` leases: its resident memory and CPU at rest and at 1 record/s
/// per shard.
async fn single(shards: usize, setup: &Setup) -> String {
    let seconds = setup.seconds;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let streams = create_streams(&kinesis, "scale-one", shards, setup.stream_shards).await;
    let table = leasehold_testkit::unique_name("scale-one");
    let config = common::config_with_timing(
        &streams[0],
        Some(&table),
        &setup.lease(""),
        &format!("startPosition: LATEST\n{}", setup.reader(shards)),
    )
    .replacen(&format!("streams: [{{name: {}}}]", streams[0]), &format!("streams: [{}]", stream_list(&streams)), 1);
    let worker = common::spawn(&config, "scale-one");
    let started = Instant::now();
    while worker.held_shards().len() < shards && started.elapsed() < *PHASE_TIMEOUT {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let leased = started.elapsed();
    let held = worker.held_shards().len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let measure = |pid: u32| async move {
        let before = cpu_time(pid);
        let at = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        ((cpu_time(pid) - before).as_secs_f64() / at.elapsed().as_secs_f64() * 100.0, rss_mib(pid))
    };
    let (rest_cpu, rest_rss) = measure(worker.pid()).await;
    let stop = CancellationToken::new();
    produce(kinesis.clone(), hash_keys(&kinesis, &streams).await, stop.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let delivered_before = worker.delivery_count();
    let (busy_cpu, busy_rss) = measure(worker.pid()).await;
    let delivered = worker.delivery_count() - delivered_before;
    stop.cancel();
    let peak = std::fs::read_to_string(format!("/proc/{}/status", worker.pid()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<f64>().ok()))
        .unwrap_or(0.0)
        / 1024.0;
    drop(worker);
    for stream in &streams {
        let _ = kinesis.delete_stream().stream_name(stream).send().await;
    }
    format!(
        "| {shards} ({} streams, idleTime {}) | {held} in {:.1} s | {rest_rss:.1} MiB | {rest_cpu:.1} % | {busy_rss:.1} MiB | {busy_cpu:.1} % ({:.0} records/s) | {peak:.1} MiB |",
        streams.len(),
        setup.idle(shards),
        leased.as_secs_f64(),
        delivered as f64 / seconds as f64
    )
}

fn main() {
    // SAFETY: set before the runtime starts any thread, so nothing reads the environment meanwhile. The
    // worker runtimes in this process find the test credentials there, as the binary does.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "leasehold-test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "leasehold-test");
    }
    if let Ok(filter) = std::env::var("LEASEHOLD_SCALE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let setup = Setup::from_env();
        println!(
            "## Scale and cost (lease {TIMING}, shardSyncInterval {}; windows of {} s)\n",
            setup.sync, setup.seconds
        );
        let sizes = sizes();
        if !sizes.is_empty() {
            println!(
                "| design | workers x shards | all leased | balanced | moves/min at rest / 1 rec/s | read units/shard-h \
                 at rest | write units/shard-h at rest | read units/shard-h 1 rec/s | write units/shard-h 1 rec/s | \
                 requests/s rest / 1 rec/s | harness CPU rest / 1 rec/s |"
            );
            println!("|---|---|---|---|---|---|---|---|---|---|---|");
            let mut notes = Vec::new();
            for (workers, shards) in sizes {
                for design in designs() {
                    let (row, note) = fleet(design, workers, shards, &setup).await;
                    println!("{row}");
                    notes.push(note);
                }
            }
            println!();
            for note in notes {
                println!("{note}");
            }
            println!();
        }
        let singles: Vec<usize> = env_or("LEASEHOLD_SCALE_SINGLE", "100,1000")
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().expect("LEASEHOLD_SCALE_SINGLE"))
            .collect();
        if !singles.is_empty() {
            println!(
                "| leases on one worker process | leased | RSS at rest | CPU at rest | RSS at 1 rec/s/shard | CPU at 1 \
                 rec/s/shard | peak RSS |"
            );
            println!("|---|---|---|---|---|---|---|");
            for shards in singles {
                println!("{}", single(shards, &setup).await);
            }
        }
    });
}
