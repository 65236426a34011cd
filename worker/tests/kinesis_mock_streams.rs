//! What only the second emulator (kinesis-mock) can show: a stream named by ARN is read through its
//! ARN; an on-demand stream is read like any other; `UpdateShardCount` 2 -> 4 -> 2 under load (and
//! 4 -> 8 -> 4 read with kinesis-mock's own SubscribeToShard) loses nothing and keeps each key's order
//! across the generations, with every record processed exactly once.

mod common;

use std::time::Duration;

use aws_sdk_kinesis::types::{ScalingType, StreamMode, StreamModeDetails};
use common::*;
use leasehold_testkit::kinesis::{put_records, wait_active};
use leasehold_testkit::process::wait_for;

/// A config reading `streams` (a YAML list) from kinesis-mock, leases in dynalite.
fn config_for(streams: &str, table: &str, extra: &str) -> String {
    let placeholder = "placeholder-stream";
    Emulator::KinesisMock
        .config(placeholder, Some(table), extra)
        .replace(&format!("streams: [{{name: {placeholder}}}]"), &format!("streams: {streams}"))
}

async fn arn_of(client: &aws_sdk_kinesis::Client, stream: &str) -> String {
    let summary = client.describe_stream_summary().stream_name(stream).send().await.expect("summary");
    summary.stream_description_summary.expect("summary").stream_arn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_named_by_arn_is_read_through_its_arn() {
    let kinesis = Emulator::KinesisMock.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "byarn", 2).await;
    let arn = arn_of(&kinesis, &stream).await;
    let table = leasehold_testkit::unique_name("byarn");
    let config = config_for(&format!("[{{arn: '{arn}'}}]"), &table, "startPosition: TRIM_HORIZON\n");
    let workers = [spawn(&config, "arn-a"), spawn(&config, "arn-b")];
    let refs: Vec<_> = workers.iter().collect();
    let written = records(20, 0, 10);
    put_records(&kinesis, &stream, &written).await;
    wait_for("every record processed", Duration::from_secs(40), async || {
        distinct(&all_deliveries(&refs)).len() == written.len()
    })
    .await;
    assert_exactly_once(&all_deliveries(&refs), &written);
    assert_per_key_order(&refs);
    // Lease keys stay `<stream name>:<shardId>`.
    let held: Vec<String> = workers.iter().flat_map(|w| w.held_shards()).collect();
    assert!(held.iter().all(|k| k.starts_with(&format!("{stream}:shardId-"))), "{held:?}");

    // The ARN is what the calls use: the same name under another account is another stream.
    let elsewhere = arn.replace(":000000000000:", ":111111111111:");
    let stray_table = leasehold_testkit::unique_name("byarn-other");
    let stray = spawn(
        &config_for(&format!("[{{arn: '{elsewhere}'}}]"), &stray_table, "startPosition: TRIM_HORIZON\n"),
        "arn-other",
    );
    wait_for("the other account's stream reported missing", Duration::from_secs(20), async || {
        stray.stderr_text().contains("cannot list shards")
    })
    .await;
    assert!(stray.deliveries().is_empty(), "records of another account's stream were read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_stream_is_read_like_any_other() {
    let kinesis = Emulator::KinesisMock.client().await;
    let stream = leasehold_testkit::unique_name("ondemand");
    let mode = StreamModeDetails::builder().stream_mode(StreamMode::OnDemand).build().expect("mode");
    kinesis.create_stream().stream_name(&stream).stream_mode_details(mode).send().await.expect("create");
    wait_active(&kinesis, &stream).await;
    let table = leasehold_testkit::unique_name("ondemand");
    let config = Emulator::KinesisMock.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let workers = [spawn(&config, "od-a"), spawn(&config, "od-b")];
    let refs: Vec<_> = workers.iter().collect();
    let written = records(30, 0, 5);
    put_records(&kinesis, &stream, &written).await;
    wait_for("every record processed", Duration::from_secs(40), async || {
        distinct(&all_deliveries(&refs)).len() == written.len()
    })
    .await;
    assert_exactly_once(&all_deliveries(&refs), &written);
    assert_per_key_order(&refs);
}

/// `UpdateShardCount` `from` -> `to` -> `from` under load on kinesis-mock, read by polling or by its
/// own SubscribeToShard (`emulator`): every record once, in key order across the generations.
async fn update_shard_count_under_load(emulator: Emulator, from: i32, to: i32) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "usc", from).await;
    let table = leasehold_testkit::unique_name("usc");
    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let workers = [spawn(&config, "usc-a"), spawn(&config, "usc-b")];
    let refs: Vec<_> = workers.iter().collect();
    let producer = Producer::start(kinesis.clone(), &stream, 20, Duration::from_millis(100));
    for target in [to, from] {
        tokio::time::sleep(Duration::from_secs(3)).await;
        kinesis
            .update_shard_count()
            .stream_name(&stream)
            .target_shard_count(target)
            .scaling_type(ScalingType::UniformScaling)
            .send()
            .await
            .unwrap_or_else(|e| panic!("UpdateShardCount {target}: {e:?}"));
        wait_active(&kinesis, &stream).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let written = producer.stop().await;
    wait_for("every record processed across the generations", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&refs)).len() >= written.len()
    })
    .await;
    assert_exactly_once(&all_deliveries(&refs), &written);
    assert_per_key_order(&refs);
    assert_key_order_across_shards(&refs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_shard_count_two_four_two_under_load_keeps_order_and_repeats_nothing() {
    update_shard_count_under_load(Emulator::KinesisMock, 2, 4).await;
}

/// kinesis-mock never ends a closed shard's subscription (empty events with a continuation, no child
/// shards): the parents must still be finished, or their children are never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_shard_count_four_eight_four_with_its_own_fan_out_reads_every_generation() {
    update_shard_count_under_load(Emulator::KinesisMockFanOut, 4, 8).await;
}
