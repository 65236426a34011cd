//! `lease.scan: segmented` (the default) with the table split into several segments (`segmentRows`
//! small), so each worker reads only part of it: a dead worker's shards are still taken within a
//! lease duration and a few scans, a joiner gets its share within 10 s, and the shard list is synced by
//! one worker, whose loss another takes over.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use leasehold_testkit::holds::double_holds;
use leasehold_testkit::kinesis::split;
use leasehold_testkit::process::{WorkerProcess, poll_until, wait_for};
use leasehold_testkit::proxy::{FaultPolicy, FaultProxy};

const LEASE: Duration = Duration::from_secs(2);

const START: &str = "startPosition: TRIM_HORIZON\n";

/// How long past the lease a dead worker's shard may take to be held elsewhere. Quiet, it is a few
/// scans (250 ms each); with both cores busy, 1.1-1.8 s were seen on both emulators (the checks, the
/// acquire and the log line all wait for a core). The slow paths this guards against are at least
/// 4 s late: a row no survivor watches is found at a whole read (every 4 scans x 4 workers) and then
/// watched for a whole lease.
const TAKEOVER_SLACK: Duration = Duration::from_millis(2500);

/// A config with `scan: segmented` and segments of about `rows` rows.
fn segmented_config(emulator: Emulator, stream: &str, table: &str, timing: &str, rows: usize) -> String {
    let timing = timing.replace('}', &format!(", scan: segmented, segmentRows: {rows}}}"));
    emulator.config_with_timing(stream, Some(table), &timing, START)
}

/// The number of segments `worker` last logged reading, and which.
fn reading(worker: &WorkerProcess) -> Option<(u64, String)> {
    worker.logs().into_iter().rev().find_map(|(_, v)| {
        (v.get("message")?.as_str()? == "reading segments of the lease table")
            .then(|| Some((v.get("total")?.as_u64()?, v.get("segments")?.to_string())))
            .flatten()
    })
}

/// [`wait_for`], printing every worker's log lines about leases and segments when it times out.
async fn wait_or_show(
    workers: &[&WorkerProcess],
    what: &str,
    timeout: Duration,
    condition: impl AsyncFnMut() -> bool,
) -> Duration {
    if let Some(took) = poll_until(timeout, condition).await {
        return took;
    }
    show(workers);
    panic!("timed out after {timeout:?} waiting for {what}: {:?}", spread(workers));
}

/// Prints every worker's log lines but row creations.
fn show(workers: &[&WorkerProcess]) {
    for worker in workers {
        eprintln!("--- {} holds {:?}", worker.owner, worker.held_shards());
        for (_, line) in worker.logs() {
            let message = line.get("message").and_then(|m| m.as_str()).unwrap_or_default();
            if !message.starts_with("lease row created") {
                eprintln!("{line}");
            }
        }
    }
}

fn spread(workers: &[&WorkerProcess]) -> Vec<usize> {
    workers.iter().map(|w| w.held_shards().len()).collect()
}

fn no_shard_twice(workers: &[&WorkerProcess]) -> bool {
    let held: Vec<String> = workers.iter().flat_map(|w| w.held_shards()).collect();
    held.iter().collect::<HashSet<_>>().len() == held.len()
}

async fn a_dead_workers_shards_are_taken_within_a_lease_and_a_few_scans(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "segkill", 8).await;
    let table = leasehold_testkit::unique_name("segkill");
    // 8 shards, 4 members and the term row in segments of about 2 rows: 4 segments (never more than
    // the workers), each read by 2 workers.
    let config = segmented_config(emulator, &stream, &table, FAST_TIMING, 2);
    let mut workers: Vec<WorkerProcess> = (1..=4).map(|i| spawn(&config, &format!("segkill-{i}"))).collect();
    let refs: Vec<&WorkerProcess> = workers.iter().collect();
    wait_or_show(&refs, "four workers balanced", Duration::from_secs(40), async || {
        spread(&refs) == vec![2, 2, 2, 2] && no_shard_twice(&refs)
    })
    .await;
    drop(refs);
    // Let every worker read the group as it is now (a whole read at least every 4 scans x 4 workers).
    tokio::time::sleep(Duration::from_secs(5)).await;
    // 4 segments (3 while a worker's view misses a member on a loaded machine), of which each worker
    // reads two.
    for worker in &workers {
        let (total, segments) = reading(worker).expect("each worker reads segments");
        let read = segments.matches(',').count() + 1;
        assert!(total >= 3 && read <= 2, "{}: reads {segments} of {total} segments", worker.owner);
    }
    let producer = Producer::start(kinesis.clone(), &stream, 16, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut victim = workers.remove(0);
    let orphaned = victim.held_shards();
    victim.signal("KILL");
    let killed_at = SystemTime::now();
    victim.wait_exit(Duration::from_secs(5)).expect("killed");
    let survivors: Vec<&WorkerProcess> = workers.iter().collect();
    wait_or_show(&survivors, "the survivors hold all 8", Duration::from_secs(15), async || {
        spread(&survivors).iter().sum::<usize>() == 8 && no_shard_twice(&survivors)
    })
    .await;
    for shard in &orphaned {
        let taken = survivors
            .iter()
            .filter_map(|w| event_time(w, "lease acquired", shard))
            .max()
            .expect("taken over")
            .duration_since(killed_at)
            .unwrap_or_default();
        println!("{shard}: failover {taken:?}");
        if taken > LEASE + TAKEOVER_SLACK {
            show(&std::iter::once(&victim).chain(survivors.iter().copied()).collect::<Vec<_>>());
            panic!("{shard} took {taken:?} (lease {LEASE:?} + {TAKEOVER_SLACK:?})");
        }
    }
    let written = producer.stop().await;
    let all: Vec<&WorkerProcess> = std::iter::once(&victim).chain(workers.iter()).collect();
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&all)).len() >= written.len()
    })
    .await;
    assert_repeats_only_from_crashes(
        &all_deliveries(&all),
        &written,
        &[Victim { owner: &victim.owner, crashed_before: None }],
    );
    assert_per_key_order(&all);
}

async fn a_joiner_gets_its_share_within_ten_seconds(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "segjoin", 12).await;
    let table = leasehold_testkit::unique_name("segjoin");
    // The default lease timing (10 s, renewals every 3 s, scans every 500 ms): handoff requests reach
    // holders in their renewals' answers, not by scans.
    let timing = "lease: {checkpointInterval: 200ms, gracefulTimeout: 3s}\n";
    // 12 shards, 4 members and the term row in segments of about 4 rows: 4 segments.
    let config = segmented_config(emulator, &stream, &table, timing, 4);
    let mut workers: Vec<WorkerProcess> = (1..=3).map(|i| spawn(&config, &format!("segjoin-{i}"))).collect();
    let refs: Vec<&WorkerProcess> = workers.iter().collect();
    wait_or_show(&refs, "three workers balanced", Duration::from_secs(60), async || {
        spread(&refs) == vec![4, 4, 4] && no_shard_twice(&refs)
    })
    .await;
    drop(refs);
    let producer = Producer::start(kinesis.clone(), &stream, 24, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let joined_at = SystemTime::now();
    workers.push(spawn(&config, "segjoin-4"));
    let refs: Vec<&WorkerProcess> = workers.iter().collect();
    // Each worker's own view; whether two held a shard at once is judged at the end, from complete
    // logs (one worker's line may be read before another's earlier one).
    let took = wait_or_show(&refs, "four workers hold 3 each", Duration::from_secs(20), async || {
        spread(&refs) == vec![3, 3, 3, 3]
    })
    .await;
    // From the joiner's start (its process launch on a loaded machine is not the protocol's time).
    // By the machine's one clock: when the joiner logged its start, not when the test read the line.
    let started = workers[3].events_logged("worker started").first().map(|(at, _)| *at).unwrap_or(joined_at);
    let balanced = (joined_at + took).duration_since(started).unwrap_or_default();
    println!("joiner balanced {balanced:?} after it started");
    assert!(balanced <= Duration::from_secs(10), "rebalance on join took {balanced:?}");
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&refs)).len() >= written.len()
    })
    .await;
    assert_exactly_once(&all_deliveries(&refs), &written);
    assert_per_key_order(&refs);
    drop(refs);
    // No shard held by two workers at once, by the row's counters and the workers' own clocks, over
    // their whole logs (read after they stopped).
    for worker in &workers {
        worker.signal("TERM");
    }
    for worker in &mut workers {
        assert!(worker.wait_exit(Duration::from_secs(30)).is_some(), "{} did not stop", worker.owner);
    }
    let refs: Vec<&WorkerProcess> = workers.iter().collect();
    let double_held = double_holds(&refs);
    assert!(double_held.is_empty(), "a shard was held by two workers at once: {:?}", double_held.first());
}

/// Workers that logged taking the discovery term.
fn term_holders(workers: &[&WorkerProcess]) -> Vec<String> {
    workers
        .iter()
        .filter(|w| !w.events("discovery term taken: this worker lists the shards for the group").is_empty())
        .map(|w| w.owner.clone())
        .collect()
}

async fn one_worker_syncs_the_shards_and_another_takes_over_when_it_dies(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "segsync", 4).await;
    let table = leasehold_testkit::unique_name("segsync");
    let config = segmented_config(emulator, &stream, &table, FAST_TIMING, 2);
    let mut workers: Vec<WorkerProcess> = (1..=3).map(|i| spawn(&config, &format!("segsync-{i}"))).collect();
    wait_for("every shard leased", Duration::from_secs(30), async || {
        workers.iter().map(|w| w.held_shards().len()).sum::<usize>() == 4
    })
    .await;
    // Several shard sync intervals (1 s) pass: only the term's holder lists shards and writes rows.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let refs: Vec<&WorkerProcess> = workers.iter().collect();
    let holders = term_holders(&refs);
    assert_eq!(holders.len(), 1, "exactly one worker holds the discovery term: {holders:?}");
    let creators: Vec<String> =
        refs.iter().filter(|w| !w.events("lease row created").is_empty()).map(|w| w.owner.clone()).collect();
    assert_eq!(creators, holders, "only the holder created rows");
    let at = workers.iter().position(|w| w.owner == holders[0]).expect("holder");
    let mut holder = workers.remove(at);
    holder.signal("KILL");
    let killed_at = Instant::now();
    holder.wait_exit(Duration::from_secs(5)).expect("killed");
    let survivors: Vec<&WorkerProcess> = workers.iter().collect();
    let took = wait_for("another worker takes the term", Duration::from_secs(10), async || {
        term_holders(&survivors).len() == 1
    })
    .await;
    println!("discovery term taken over {took:?} after the holder died");
    assert!(killed_at.elapsed() <= LEASE + Duration::from_secs(1), "term takeover took {:?}", killed_at.elapsed());
    // The new holder syncs: a split's children get rows and are read.
    split(&kinesis, &stream, "shardId-000000000000").await;
    wait_for("both children leased", Duration::from_secs(20), async || {
        let held: Vec<String> = survivors.iter().flat_map(|w| w.held_shards()).collect();
        ["shardId-000000000004", "shardId-000000000005"].iter().all(|c| held.iter().any(|h| h.ends_with(c)))
    })
    .await;
    let new_holder = term_holders(&survivors);
    let creators: Vec<String> =
        survivors.iter().filter(|w| !w.events("lease row created").is_empty()).map(|w| w.owner.clone()).collect();
    assert_eq!(creators, new_holder, "the children's rows were written by the new holder alone");
}

async fn only_the_term_holder_lists_shards_and_a_throttled_listing_still_completes(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "seglist", 6).await;
    let table = leasehold_testkit::unique_name("seglist");
    let config = segmented_config(emulator, &stream, &table, FAST_TIMING, 2);
    // Each worker talks to Kinesis through a proxy of its own, which counts its ListShards calls and
    // refuses four of every five with LimitExceededException (more than the SDK's own retries absorb).
    let upstream = leasehold_testkit::endpoint(emulator.service());
    let mut proxies = Vec::new();
    let mut workers = Vec::new();
    for i in 1..=3 {
        let policy: FaultPolicy =
            Arc::new(|operation, n| (operation == "ListShards" && n % 5 != 4).then_some("LimitExceededException"));
        let proxy = FaultProxy::start(&upstream, policy).await;
        workers.push(spawn(&with_endpoint(&config, emulator.service(), &proxy.endpoint()), &format!("seglist-{i}")));
        proxies.push(proxy);
    }
    let refs: Vec<&WorkerProcess> = workers.iter().collect();
    wait_or_show(&refs, "every shard leased", Duration::from_secs(60), async || {
        spread(&refs).iter().sum::<usize>() == 6 && no_shard_twice(&refs)
    })
    .await;
    // Several sync intervals (1 s) more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let calls: Vec<u64> = proxies.iter().map(|p| p.counts().get("ListShards").copied().unwrap_or(0)).collect();
    println!("ListShards calls per worker: {calls:?}");
    let holders = term_holders(&refs);
    assert_eq!(holders.len(), 1, "{holders:?}");
    for (worker, calls) in workers.iter().zip(&calls) {
        if worker.owner == holders[0] {
            assert!(*calls >= 10, "the holder lists at every sync, throttled pages retried: {calls}");
            let retried = worker.events("ListShards throttled; retrying the page").len();
            assert!(retried >= 1, "a page the SDK's own retries could not get was asked again: {retried}");
        } else {
            assert_eq!(*calls, 0, "{} never lists shards", worker.owner);
        }
    }
}

on_both_emulators!(
    only_the_term_holder_lists_shards_and_a_throttled_listing_still_completes,
    a_dead_workers_shards_are_taken_within_a_lease_and_a_few_scans,
    a_joiner_gets_its_share_within_ten_seconds,
    one_worker_syncs_the_shards_and_another_takes_over_when_it_dies,
);
