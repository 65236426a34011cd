//! A consumer group of worker processes on kinesalite and dynalite: shards split exclusively, every
//! record processed, per-key order kept; polling, and with enhanced fan-out (one stream consumer
//! registered for the group, however many workers find it absent at once).

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use leasehold_testkit::holds::double_holds;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};

async fn three_workers_share_four_shards_and_process_every_record_in_key_order(emulator: Emulator) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "group", 4).await;
    let table = leasehold_testkit::unique_name("group");
    let first = records(50, 0, 10);
    put_records(&kinesis, &stream, &first).await;

    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let mut workers = [spawn(&config, "w1"), spawn(&config, "w2"), spawn(&config, "w3")];
    let refs: Vec<_> = workers.iter().collect();
    wait_for("every shard held", Duration::from_secs(30), async || {
        workers.iter().flat_map(|w| w.held_shards()).collect::<HashSet<_>>().len() == 4
    })
    .await;
    let second = records(50, 10, 10);
    put_records(&kinesis, &stream, &second).await;
    let expected: Vec<_> = first.iter().chain(&second).cloned().collect();
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() >= expected.len()
    })
    .await;
    // Give balancing time to settle, then check the spread: 4 shards over 3 workers, each holding 1 or 2
    // (never one shard in two workers: judged at the end, from complete logs).
    wait_for("shards spread 2/1/1", Duration::from_secs(20), async || {
        let counts: Vec<usize> = workers.iter().map(|w| w.held_shards().len()).collect();
        counts.iter().sum::<usize>() == 4 && counts.iter().all(|c| (1..=2).contains(c))
    })
    .await;

    let deliveries = all_deliveries(&refs);
    for w in &workers {
        println!("{} holds {:?}, delivered {}", w.owner, w.held_shards(), w.deliveries().len());
    }
    assert_exactly_once(&deliveries, &expected);
    assert_per_key_order(&refs);
    assert_eq!(check_handovers(&deliveries), 0, "cooperative handoffs must not redeliver");
    if matches!(emulator, Emulator::FanOut | Emulator::KinesisMockFanOut) {
        let consumers = registered_consumers(emulator, &kinesis, &stream).await;
        assert_one_consumer_read_every_shard(&refs, &table, consumers).await;
    }
    let [a, b, c] = &mut workers;
    assert_running(&mut [a, b, c]);
    // No shard held by two workers at once, by the row's counters and the workers' own clocks, over
    // their whole logs (read after they stopped): one worker's line may be read before another's
    // earlier one.
    for worker in &workers {
        worker.signal("TERM");
    }
    for worker in &mut workers {
        assert!(worker.wait_exit(Duration::from_secs(30)).is_some(), "{} did not stop", worker.owner);
    }
    let double_held = double_holds(&workers.iter().collect::<Vec<_>>());
    assert!(double_held.is_empty(), "a shard held twice: {:?}", double_held.first());
}

/// The workers registered one stream consumer for their group (named after its lease table), read
/// every shard through subscriptions (each reporting how far behind it is), and no subscription went
/// silent or broke.
async fn assert_one_consumer_read_every_shard(workers: &[&WorkerProcess], table: &str, consumers: Vec<String>) {
    let mine: Vec<String> = consumers.into_iter().filter(|arn| arn.contains(&format!("consumer/{table}:"))).collect();
    assert_eq!(mine.len(), 1, "one stream consumer for the group: {mine:?}");
    let mut sums = [0.0; 4];
    for worker in workers {
        for (sum, series) in sums.iter_mut().zip([
            "leasehold_fanout_consumers_registered_total",
            "leasehold_fanout_subscriptions_total",
            "leasehold_fanout_subscriptions_replaced_total{reason=\"idle\"}",
            "leasehold_fanout_subscriptions_replaced_total{reason=\"broken\"}",
        ]) {
            *sum += metric_or_zero(worker, series).await;
        }
    }
    // Every event's MillisBehindLatest feeds the shard's gauge.
    for worker in workers {
        for shard in worker.held_shards() {
            let behind = metric(worker, &format!("leasehold_millis_behind_latest{{shard=\"{shard}\"}}")).await;
            assert!(behind >= 0.0, "{shard}: {behind}");
        }
    }
    let [registered, subscriptions, idle, broken] = sums;
    assert_eq!(registered, 1.0, "registered once");
    assert!(subscriptions >= 4.0, "every shard subscribed, {subscriptions}");
    // A healthy server: nothing silent or broken (the SDK's timeouts leave event streams be).
    assert_eq!((idle, broken), (0.0, 0.0), "subscriptions replaced as idle, broken");
}

/// The ARNs of the stream consumers registered on `stream`: as the test's fan-out server recorded
/// them, or as kinesis-mock lists them.
async fn registered_consumers(emulator: Emulator, kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Vec<String> {
    if emulator == Emulator::FanOut {
        return common::fanout::shared_fan_out().controls.registered_consumers();
    }
    let summary = kinesis.describe_stream_summary().stream_name(stream).send().await.expect("describe the stream");
    let arn = summary.stream_description_summary.expect("a summary").stream_arn;
    let listed = kinesis.list_stream_consumers().stream_arn(arn).send().await.expect("list stream consumers");
    listed.consumers.unwrap_or_default().into_iter().map(|c| c.consumer_arn).collect()
}

on_every_ground!(three_workers_share_four_shards_and_process_every_record_in_key_order);
