//! The chaos suite: real worker processes on a resharding stream under load while a seeded nemesis
//! kills, stops, terminates and restarts them, throttles, delays and cuts their DynamoDB and Kinesis,
//! skews their wall clocks and splits and merges shards; then a checker holds what they printed against
//! an independent log of every accepted lease write (see docs/testing.md, "The chaos suite").
//!
//! `LEASEHOLD_CHAOS_SEED` replays a run (each round prints its own seed, which replays that round
//! alone), `LEASEHOLD_CHAOS_ROUNDS` (default 1) and `LEASEHOLD_CHAOS_SECONDS` (nemesis time per round,
//! default 60) size it, `LEASEHOLD_CHAOS_WORKERS` (4) and `LEASEHOLD_CHAOS_SHARDS` (8) shape it, and
//! `LEASEHOLD_CHAOS_VERBOSE=1` prints the nemesis as it acts. `make chaos` runs it alone.
//!
//! Every round samples each worker's RSS and open descriptors (every process under a cap).
//! `LEASEHOLD_CHAOS_SOAK=1` makes each round a soak (`make soak-chaos`, 30 minutes): the producer
//! writes one record per second per shard, and two slots are stayers, whose workers the nemesis never
//! kills, stops or terminates (every other fault still reaches them): their growth from the end of the
//! warm-up (a quarter of the round) to its end is bounded.
//! `LEASEHOLD_CHAOS_SCAN` (`segmented`, the product's default, or `full`) and `LEASEHOLD_CHAOS_SEGMENT_ROWS` (2) choose how the
//! workers read the lease table.

#[path = "common/mod.rs"]
mod common;

#[path = "chaos/checker.rs"]
mod checker;
#[path = "chaos/cluster.rs"]
mod cluster;
#[path = "chaos/nemesis.rs"]
mod nemesis;
#[path = "chaos/usage.rs"]
mod usage;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold_testkit::nemesis::{SeededRng, fresh_seed};

use cluster::{Cluster, End};

/// The workers' lease duration (from `common::FAST_TIMING`).
const LEASE: Duration = Duration::from_secs(2);
/// Lateness allowed for a line the test saw, for pipe and scheduling latency on a loaded machine.
const MARGIN: Duration = Duration::from_millis(300);
/// How long a SIGTERM'd worker may take to exit (its graceful timeout is 3 s).
const PATIENCE: Duration = Duration::from_secs(20);
/// Keys the producer writes, one record each per tick.
const KEYS: usize = 12;
const TICK: Duration = Duration::from_millis(100);
/// Slots whose workers a soak never kills or stops.
const STAYERS: usize = 2;
/// How often every worker's RSS and descriptors are read.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// RSS any worker process may reach (debug build), MiB.
const RSS_CAP_MIB: f64 = 256.0;
/// Open descriptors any worker process may hold.
const FD_CAP: usize = 256;
/// A stayer's RSS growth allowed after the warm-up, MiB.
const RSS_GROWTH_MIB: f64 = 16.0;
/// A stayer's descriptor growth allowed after the warm-up.
const FD_GROWTH: usize = 16;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// libfaketime, unpacked by tests/ground/faketime.sh (which the test runs; it is idempotent).
fn faketime_library() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/ground/faketime.sh");
    let out =
        std::process::Command::new(script).arg("install").output().unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} install failed (libfaketime skews the workers' clocks; see docs/testing.md):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "{script} printed {path:?}, which is not a file");
    path
}

#[test]
fn seeded_nemesis_rounds_break_no_rule() {
    let seed = env_u64("LEASEHOLD_CHAOS_SEED", fresh_seed());
    let rounds = env_u64("LEASEHOLD_CHAOS_ROUNDS", 1);
    let seconds = env_u64("LEASEHOLD_CHAOS_SECONDS", 60);
    let workers = env_u64("LEASEHOLD_CHAOS_WORKERS", 4) as usize;
    let shards = env_u64("LEASEHOLD_CHAOS_SHARDS", 8) as i32;
    let soak = env_u64("LEASEHOLD_CHAOS_SOAK", 0) != 0;
    eprintln!(
        "chaos: seed {seed}, {rounds} round(s) of {seconds} s, {workers} workers, {shards} shards{}",
        if soak { ", soak (1 record/s per shard, 2 stayers)" } else { "" }
    );
    let faketime = faketime_library();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    let mut seeds = SeededRng::new(seed);
    for n in 0..rounds {
        // Round 0 uses the seed itself, so a round's printed seed replays it as round 0 of a new run.
        let round_seed = if n == 0 { seed } else { seeds.next_u64() };
        eprintln!("chaos round {}/{rounds}: seed {round_seed}", n + 1);
        let summary = runtime.block_on(round(round_seed, seconds, workers, shards, soak, faketime.clone()));
        match summary {
            Ok(summary) => eprintln!("chaos round {}/{rounds} (seed {round_seed}) passed: {summary}", n + 1),
            Err(report) => panic!("{report}"),
        }
    }
}

async fn round(
    seed: u64,
    seconds: u64,
    workers: usize,
    shards: i32,
    soak: bool,
    faketime: PathBuf,
) -> Result<String, String> {
    let mut rng = SeededRng::new(seed);
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "chaos", shards).await;
    let table = leasehold_testkit::create_lease_table(&dynamodb, "chaos").await;
    let keyed = rng.chance(50);
    let extra = if keyed {
        "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 4\n"
    } else {
        "startPosition: TRIM_HORIZON\n"
    };
    // The default page limit (1000): a loaded kinesalite takes about 1 s per 100 records on deep
    // lineages, and the reader shrinks a page that outlasts the SDK's 3 s attempt timeout (seed
    // 4491231873834608077 stalled a shard for good before it did).
    let extra = format!("{extra}reader: {{idleTime: 100ms}}\n");
    // Segmented reads (the default) in segments of about 2 rows (4 segments over 4 workers and 8
    // shards), so the nemesis hits workers that each read only part of the table;
    // LEASEHOLD_CHAOS_SCAN=full for whole-table reads.
    let scan = std::env::var("LEASEHOLD_CHAOS_SCAN").unwrap_or_else(|_| "segmented".into());
    let segment_rows = env_u64("LEASEHOLD_CHAOS_SEGMENT_ROWS", 2);
    let timing = common::FAST_TIMING.replace('}', &format!(", scan: {scan}, segmentRows: {segment_rows}}}"));
    let config = common::config_with_timing(&stream, Some(&table), &timing, &extra);
    let dir = std::env::temp_dir().join("leasehold-tests").join(leasehold_testkit::unique_name("chaos"));
    std::fs::create_dir_all(&dir).expect("chaos dir");
    let cluster = Arc::new(Cluster::new(&stream, config, workers, workers.min(2), Some(faketime), &dir).await);
    cluster.note(format!(
        "seed {seed}: stream {stream} ({shards} shards), table {table}, {}",
        if keyed { "ordering: key, concurrency 4" } else { "ordering: shard" }
    ));
    // One skewed clock from the start in every round; the nemesis moves it and others later.
    if let Some(file) = &cluster.slots[0].lock().await.skew_file {
        let offset = nemesis::OFFSETS[rng.below(nemesis::OFFSETS.len() as u64 - 1) as usize];
        std::fs::write(file, format!("{offset}\n")).expect("skew file");
        cluster.note(format!("wall clock of slot w0 set {offset} s off"));
    }
    // The last slots (never the skewed first ones when there are enough).
    let stayers = if soak { STAYERS.min(workers) } else { 0 };
    for (i, slot) in cluster.slots.iter().enumerate() {
        let mut slot = slot.lock().await;
        slot.stayer = i >= workers - stayers;
        cluster.start_worker(&mut slot, false).await;
    }
    let producer = if soak {
        common::Producer::start(kinesis.clone(), &stream, shards as usize, Duration::from_secs(1))
    } else {
        common::Producer::start(kinesis.clone(), &stream, KEYS, TICK)
    };
    let sampled = usage::Samples::default();
    let sampling_done = Arc::new(AtomicBool::new(false));
    let sampler = usage::spawn_sampler(cluster.clone(), SAMPLE_EVERY, sampling_done.clone(), sampled.clone());
    let plan = Arc::new(nemesis::Plan {
        lease: LEASE,
        patience: PATIENCE,
        shards: (shards as usize / 2, shards as usize + 4),
    });
    let until = Instant::now() + Duration::from_secs(seconds);
    let reshard = Arc::new(tokio::sync::Mutex::new(()));
    let lanes: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(nemesis::lane(
                cluster.clone(),
                kinesis.clone(),
                plan.clone(),
                rng.fork(),
                until,
                reshard.clone(),
            ))
        })
        .collect();
    for lane in lanes {
        if let Err(e) = lane.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    // Heal everything, and every slot runs a worker again.
    for slot in &cluster.slots {
        let mut slot = slot.lock().await;
        slot.kinesis.faults().heal();
        match &slot.current {
            Some(incarnation) => incarnation.dynamo.faults().heal(),
            None => cluster.start_worker(&mut slot, false).await,
        }
    }
    cluster.note("nemesis done; all healed".into());
    let written = producer.stop().await;
    let expected: HashSet<String> = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    let drained = wait_drained(&cluster, &expected, Duration::from_secs(180)).await;
    cluster.note(format!("drain: {}", if drained { "every record processed" } else { "timed out" }));
    // Late repeats (a resumed worker, a late takeover) have time to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sampling_done.store(true, Ordering::SeqCst);
    let _ = sampler.await;
    let bounds = usage::Bounds {
        rss_cap_mib: RSS_CAP_MIB,
        fd_cap: FD_CAP,
        rss_growth_mib: RSS_GROWTH_MIB,
        fd_growth: FD_GROWTH,
        warm_up: Duration::from_secs(seconds / 4),
    };
    let (usage, overuse) = usage::judge(&sampled, &bounds);
    for slot in &cluster.slots {
        let mut slot = slot.lock().await;
        cluster.stop_worker(&mut slot, "TERM", End::Final, PATIENCE).await;
    }
    let incarnations = cluster.take_all();
    let log = cluster.log.lock().expect("write log").clone();
    let rules = checker::Rules { lease: LEASE, margin: MARGIN };
    let seen = checker::deliveries(&incarnations);
    let facts: Vec<checker::Facts> = incarnations.iter().map(checker::Facts::of).collect();
    let verdict = checker::check(&seen, &facts, &log, &written, &rules);
    let actions = cluster.history.lock().expect("history").len();
    let summary = format!(
        "{} records, {} deliveries, {} repeats ({} after an unforced lease expiry), {} lease writes, {} takeovers, {} incarnations, {actions} history entries, {} lease writes with a skewed wall clock",
        verdict.expected,
        verdict.deliveries,
        verdict.repeats,
        verdict.unforced_repeats,
        verdict.writes,
        verdict.takeovers,
        incarnations.len(),
        verdict.skewed_writes
    );
    // Pages shrunk after a timed-out GetRecords (a loaded or delayed Kinesis; seed 4491231873834608077).
    let shrunk: usize =
        incarnations.iter().map(|i| i.process.events("GetRecords timed out; asking for smaller pages").len()).sum();
    let summary = format!("{summary}, {shrunk} GetRecords pages shrunk after a timeout; {usage}");
    if !overuse.is_empty() {
        return Err(format!("seed {seed}: memory or descriptors out of bounds:\n{}\n{summary}", overuse.join("\n")));
    }
    if verdict.violations.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        Ok(summary)
    } else {
        // The workers' own output, for what the checker cannot see (their logs).
        for i in &incarnations {
            let _ = std::fs::write(dir.join(format!("{}.stderr", i.id)), i.process.stderr_text());
            let _ = std::fs::write(dir.join(format!("{}.stdout", i.id)), i.process.stdout_lines().join("\n"));
        }
        let report = checker::report(seed, &cluster, &verdict, &log, &seen);
        Err(format!("{report}\n{summary}\nevery worker's stdout and stderr: {}", dir.display()))
    }
}

/// Waits until every expected record has been processed by some incarnation, or `timeout`.
async fn wait_drained(cluster: &Cluster, expected: &HashSet<String>, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        let mut seen: HashSet<String> = HashSet::new();
        for i in cluster.ended.lock().expect("ended").iter() {
            seen.extend(i.process.deliveries().into_iter().map(|d| d.data));
        }
        for slot in &cluster.slots {
            if let Some(i) = &slot.lock().await.current {
                seen.extend(i.process.deliveries().into_iter().map(|d| d.data));
            }
        }
        if expected.iter().all(|d| seen.contains(d)) {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    false
}
