//! The second Kinesis emulator, kinesis-mock, does what the worker's tests need of it, through the
//! same aws-sdk-kinesis the worker uses: streams, records, ListShards, UpdateShardCount, on-demand
//! streams and calls addressed by StreamARN. docs/testing.md lists where it and kinesalite disagree.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{ScalingType, Shard, ShardIteratorType, StreamMode, StreamModeDetails};
use leasehold_testkit::kinesis::{numbered, put_records, read_shard, wait_active};
use leasehold_testkit::{create_stream, kinesis_mock_client, unique_name};

async fn all_shards(client: &Client, stream: &str) -> Vec<Shard> {
    let out = client.list_shards().stream_name(stream).send().await.expect("list shards");
    assert!(out.next_token.is_none(), "one page is enough here");
    out.shards.unwrap_or_default()
}

fn range(shard: &Shard) -> (u128, u128) {
    let r = shard.hash_key_range.as_ref().expect("hash key range");
    (r.starting_hash_key.parse().expect("start"), r.ending_hash_key.parse().expect("end"))
}

fn is_open(shard: &Shard) -> bool {
    shard.sequence_number_range.as_ref().and_then(|r| r.ending_sequence_number.as_ref()).is_none()
}

/// The ranges of `shards`, sorted, cover every hash key exactly once.
fn assert_tiles_hash_space(shards: &[&Shard]) {
    let mut ranges: Vec<(u128, u128)> = shards.iter().map(|s| range(s)).collect();
    ranges.sort();
    assert_eq!(ranges.first().map(|r| r.0), Some(0), "{ranges:?}");
    assert_eq!(ranges.last().map(|r| r.1), Some(u128::MAX), "{ranges:?}");
    for pair in ranges.windows(2) {
        assert_eq!(pair[0].1 + 1, pair[1].0, "gap or overlap: {ranges:?}");
    }
}

/// Every record of every shard (open or closed) of `stream`, by shard id.
async fn read_every_shard(client: &Client, stream: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out = BTreeMap::new();
    for shard in all_shards(client, stream).await {
        let records = read_shard(client, stream, &shard.shard_id).await;
        let records = records
            .into_iter()
            .map(|r| (r.partition_key, String::from_utf8_lossy(r.data.as_ref()).into_owned()))
            .collect();
        out.insert(shard.shard_id, records);
    }
    out
}

fn batch(keys: usize, per_key: u64, first: u64) -> Vec<(String, Vec<u8>)> {
    (first..first + per_key).flat_map(|n| (0..keys).map(move |k| numbered(&format!("key-{k}"), n))).collect()
}

/// Counts how often each data string was read; asserts each of `expected` exactly once and nothing else.
fn assert_exactly_once(read: &BTreeMap<String, Vec<(String, String)>>, expected: &[(String, Vec<u8>)]) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (_, data) in read.values().flatten() {
        *seen.entry(data.as_str()).or_default() += 1;
    }
    for (_, data) in expected {
        let data = std::str::from_utf8(data).expect("utf8");
        assert_eq!(seen.remove(data), Some(1), "{data} read other than once");
    }
    assert!(seen.is_empty(), "unexpected records: {seen:?}");
}

#[tokio::test]
async fn streams_records_and_list_shards() {
    let client = kinesis_mock_client().await;
    let stream = create_stream(&client, "mock-basic", 2).await;
    let shards = all_shards(&client, &stream).await;
    assert_eq!(shards.len(), 2);
    assert_tiles_hash_space(&shards.iter().collect::<Vec<_>>());
    let records = batch(8, 25, 0);
    put_records(&client, &stream, &records).await;
    let read = read_every_shard(&client, &stream).await;
    assert_exactly_once(&read, &records);
    // Each key is on one shard, in the order written.
    for records in read.values() {
        let mut last: HashMap<&str, u64> = HashMap::new();
        for (key, data) in records {
            let n: u64 = data.rsplit(':').next().and_then(|n| n.parse().ok()).expect("number");
            if let Some(previous) = last.insert(key, n) {
                assert!(n > previous, "{key}: {n} after {previous}");
            }
        }
    }
}

#[tokio::test]
async fn update_shard_count_2_to_4_splits_every_shard() {
    let client = kinesis_mock_client().await;
    let stream = create_stream(&client, "mock-scale", 2).await;
    let before = batch(16, 10, 0);
    put_records(&client, &stream, &before).await;
    let out = client
        .update_shard_count()
        .stream_name(&stream)
        .target_shard_count(4)
        .scaling_type(ScalingType::UniformScaling)
        .send()
        .await
        .expect("UpdateShardCount");
    assert_eq!(out.current_shard_count, Some(2));
    assert_eq!(out.target_shard_count, Some(4));
    wait_active(&client, &stream).await;
    let summary = client.describe_stream_summary().stream_name(&stream).send().await.expect("summary");
    assert_eq!(summary.stream_description_summary.map(|s| s.open_shard_count), Some(4));

    let shards = all_shards(&client, &stream).await;
    let (open, closed): (Vec<&Shard>, Vec<&Shard>) = shards.iter().partition(|s| is_open(s));
    assert_eq!((open.len(), closed.len()), (4, 2), "{shards:?}");
    assert_tiles_hash_space(&open);
    assert_tiles_hash_space(&closed);
    for child in &open {
        let parent = child.parent_shard_id.as_deref().expect("child has a parent");
        let parent = closed.iter().find(|s| s.shard_id == parent).expect("parent is a closed shard");
        let (start, end) = range(child);
        let (p_start, p_end) = range(parent);
        assert!(p_start <= start && end <= p_end, "child {child:?} outside parent {parent:?}");
        assert!(child.adjacent_parent_shard_id.is_none(), "a split has one parent");
    }

    let after = batch(16, 10, 10);
    put_records(&client, &stream, &after).await;
    let read = read_every_shard(&client, &stream).await;
    let mut all = before.clone();
    all.extend(after.iter().cloned());
    assert_exactly_once(&read, &all);
    // Records written before the update are in the parents, those after in the children.
    let closed_ids: Vec<&str> = closed.iter().map(|s| s.shard_id.as_str()).collect();
    for (shard, records) in &read {
        let numbers = records.iter().map(|(_, d)| d.rsplit(':').next().and_then(|n| n.parse::<u64>().ok()));
        let numbers: Vec<u64> = numbers.map(|n| n.expect("number")).collect();
        if closed_ids.contains(&shard.as_str()) {
            assert!(numbers.iter().all(|n| *n < 10), "{shard}: {numbers:?}");
        } else {
            assert!(numbers.iter().all(|n| *n >= 10), "{shard}: {numbers:?}");
        }
    }
}

#[tokio::test]
async fn on_demand_stream() {
    let client = kinesis_mock_client().await;
    let stream = unique_name("mock-on-demand");
    client
        .create_stream()
        .stream_name(&stream)
        .stream_mode_details(StreamModeDetails::builder().stream_mode(StreamMode::OnDemand).build().expect("mode"))
        .send()
        .await
        .expect("create an on-demand stream without a shard count");
    wait_active(&client, &stream).await;
    let summary = client.describe_stream_summary().stream_name(&stream).send().await.expect("summary");
    let summary = summary.stream_description_summary.expect("summary");
    assert_eq!(summary.stream_mode_details.map(|m| m.stream_mode), Some(StreamMode::OnDemand));
    let shards = all_shards(&client, &stream).await;
    // The real service starts an on-demand stream with 4 shards (Kinesis Developer Guide).
    assert_eq!(shards.len(), 4, "{shards:?}");
    assert_eq!(summary.open_shard_count, 4);
    assert_tiles_hash_space(&shards.iter().collect::<Vec<_>>());
    let records = batch(8, 5, 0);
    put_records(&client, &stream, &records).await;
    assert_exactly_once(&read_every_shard(&client, &stream).await, &records);
}

#[tokio::test]
async fn calls_addressed_by_stream_arn() {
    let client = kinesis_mock_client().await;
    let stream = create_stream(&client, "mock-arn", 1).await;
    let summary = client.describe_stream_summary().stream_name(&stream).send().await.expect("summary");
    let arn = summary.stream_description_summary.expect("summary").stream_arn;
    assert_eq!(arn, format!("arn:aws:kinesis:us-east-1:000000000000:stream/{stream}"));

    let by_arn = client.describe_stream_summary().stream_arn(&arn).send().await.expect("summary by ARN");
    assert_eq!(by_arn.stream_description_summary.expect("summary").stream_name, stream);
    let put = client
        .put_record()
        .stream_arn(&arn)
        .partition_key("k")
        .data(Blob::new("by-arn"))
        .send()
        .await
        .expect("PutRecord by ARN");
    let shards = client.list_shards().stream_arn(&arn).send().await.expect("ListShards by ARN");
    let shard = shards.shards.unwrap_or_default().remove(0);
    assert_eq!(shard.shard_id, put.shard_id);
    let iterator = client
        .get_shard_iterator()
        .stream_arn(&arn)
        .shard_id(&shard.shard_id)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .expect("GetShardIterator by ARN")
        .shard_iterator
        .expect("iterator");
    let out = client.get_records().stream_arn(&arn).shard_iterator(iterator).send().await.expect("GetRecords by ARN");
    let data: Vec<&[u8]> = out.records.iter().map(|r| r.data.as_ref()).collect();
    assert_eq!(data, vec![b"by-arn".as_slice()]);
    assert_eq!(out.records[0].sequence_number, put.sequence_number);
}
