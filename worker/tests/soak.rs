//! Soak: a group under steady load (1 record/s per shard) while workers are killed (-9), terminated and
//! restarted around two that stay up, DynamoDB throttles about 2 % of the requests (a fault proxy), and
//! a shard is split and later two are merged; the stayers' memory and open file descriptors are
//! sampled, and must not grow beyond a stated bound once warmed up; at the end every record written was
//! processed.
//!
//! `make test` runs it for `LEASEHOLD_SOAK_SECS` (default 40 s); `make soak` for 30 minutes. It prints
//! the samples' summary (RSS and fds at warm-up and at the end, per stayer) for docs/benchmarks.md.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::process::{WorkerProcess, rss_mib, wait_for};
use rand::{Rng, SeedableRng};

/// RSS growth allowed from the end of warm-up to the end of the run, per stayer.
const RSS_BOUND_MIB: f64 = 16.0;
/// Open file descriptors growth allowed over the same span.
const FD_BOUND: usize = 16;
const SHARDS: i32 = 8;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rss_mib: f64,
    fds: usize,
}

fn sample(worker: &WorkerProcess) -> Sample {
    Sample { rss_mib: rss_mib(worker.pid()), fds: open_fds(worker.pid()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churning_group_under_steady_load_keeps_memory_and_fds_bounded() {
    let secs: u64 = std::env::var("LEASEHOLD_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let seed: u64 = std::env::var("LEASEHOLD_SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("soak: {secs} s, seed {seed} (LEASEHOLD_SOAK_SEED={seed} repeats the churn)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "soak", SHARDS).await;
    let table = leasehold_testkit::unique_name("soak");
    let throttle_seed = seed;
    let proxy = leasehold_testkit::proxy::FaultProxy::start(
        &leasehold_testkit::endpoint(leasehold_testkit::Service::DynamoDb),
        std::sync::Arc::new(move |_, n| {
            (n.wrapping_mul(2654435761).wrapping_add(throttle_seed) % 50 == 0)
                .then_some("ProvisionedThroughputExceededException")
        }),
    )
    .await;
    let config = with_endpoint(
        &config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n"),
        leasehold_testkit::Service::DynamoDb,
        &proxy.endpoint(),
    );
    let stayers = [spawn(&config, "soak-stay-a"), spawn(&config, "soak-stay-b")];
    let mut churners = vec![spawn(&config, "soak-churn-0"), spawn(&config, "soak-churn-1")];
    let mut retired: Vec<WorkerProcess> = Vec::new();
    // One record per second per shard: 8 keys a second spread over the shards by their hash.
    let producer = Producer::start(kinesis.clone(), &stream, SHARDS as usize, Duration::from_secs(1));
    let started = Instant::now();
    let warm_up = Duration::from_secs(secs / 4);
    let mut warm: Option<Vec<Sample>> = None;
    let mut peak = [Sample { rss_mib: 0.0, fds: 0 }; 2];
    let mut restarts = 0;
    let (mut split, mut merged) = (false, false);
    while started.elapsed() < Duration::from_secs(secs) {
        if !split && started.elapsed() >= Duration::from_secs(secs / 3) {
            leasehold_testkit::kinesis::split(&kinesis, &stream, "shardId-000000000000").await;
            split = true;
        }
        if !merged && started.elapsed() >= Duration::from_secs(2 * secs / 3) {
            leasehold_testkit::kinesis::merge(&kinesis, &stream, "shardId-000000000002", "shardId-000000000003").await;
            merged = true;
        }
        tokio::time::sleep(Duration::from_secs(rng.random_range(3..8))).await;
        // Churn: one churner killed or terminated, then started again (same owner id or a new one).
        let victim = rng.random_range(0..churners.len());
        let old = churners.remove(victim);
        old.signal(if rng.random_bool(0.5) { "KILL" } else { "TERM" });
        let owner = if rng.random_bool(0.5) { old.owner.clone() } else { format!("soak-churn-{}", 2 + restarts) };
        retired.push(old);
        churners.push(spawn(&config, &owner));
        restarts += 1;
        let now: Vec<Sample> = stayers.iter().map(sample).collect();
        for (max, s) in peak.iter_mut().zip(&now) {
            max.rss_mib = max.rss_mib.max(s.rss_mib);
            max.fds = max.fds.max(s.fds);
        }
        if warm.is_none() && started.elapsed() >= warm_up {
            warm = Some(now);
        }
    }
    let written = producer.stop().await;
    assert!(proxy.injected() > 0, "no DynamoDB throttling was injected");
    let all: Vec<&WorkerProcess> = stayers.iter().chain(&churners).chain(&retired).collect();
    wait_for("every record processed", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&all)).len() >= written.len()
    })
    .await;
    assert_complete(&all_deliveries(&all), &written);
    let end: Vec<Sample> = stayers.iter().map(sample).collect();
    let warm = warm.expect("warm-up sample");
    for (i, stayer) in stayers.iter().enumerate() {
        println!(
            "soak {}: RSS {:.1} -> {:.1} MiB (peak {:.1}), fds {} -> {} (peak {}), {restarts} restarts of others",
            stayer.owner, warm[i].rss_mib, end[i].rss_mib, peak[i].rss_mib, warm[i].fds, end[i].fds, peak[i].fds
        );
        assert!(warm[i].rss_mib > 0.0 && warm[i].fds > 0, "{}: not sampled", stayer.owner);
        assert!(
            end[i].rss_mib - warm[i].rss_mib <= RSS_BOUND_MIB,
            "{}: RSS grew {:.1} MiB (bound {RSS_BOUND_MIB})",
            stayer.owner,
            end[i].rss_mib - warm[i].rss_mib
        );
        assert!(end[i].fds <= warm[i].fds + FD_BOUND, "{}: fds {} -> {}", stayer.owner, warm[i].fds, end[i].fds);
    }
    let mut stayers = stayers;
    let [a, b] = &mut stayers;
    assert_running(&mut [a, b]);
}
