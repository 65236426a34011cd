//! Kinesis helpers for tests: producing numbered records, splitting and merging shards.

use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, Record, ShardIteratorType, StreamStatus};

/// Record `n` of key `key`, as the tests write it: data `"<key>:<n>"`, partition key `key`.
pub fn numbered(key: &str, n: u64) -> (String, Vec<u8>) {
    (key.to_string(), format!("{key}:{n}").into_bytes())
}

/// Writes `records` (partition key, data) in order, 500 per PutRecords call, retrying failed entries
/// so that every record is stored, and in order per key.
pub async fn put_records(client: &Client, stream: &str, records: &[(String, Vec<u8>)]) {
    put_entries(client, stream, records.iter().map(|(key, data)| entry(key, data).build().expect("entry")).collect())
        .await;
}

/// Writes `records` (partition key, data, explicit hash key) as [`put_records`] does, each to the shard
/// whose hash key range holds its explicit hash key: records placed on chosen shards.
pub async fn put_explicit(client: &Client, stream: &str, records: &[(String, Vec<u8>, u128)]) {
    let entries = records
        .iter()
        .map(|(key, data, hash)| entry(key, data).explicit_hash_key(hash.to_string()).build().expect("entry"))
        .collect();
    put_entries(client, stream, entries).await;
}

fn entry(key: &str, data: &[u8]) -> aws_sdk_kinesis::types::builders::PutRecordsRequestEntryBuilder {
    PutRecordsRequestEntry::builder().partition_key(key).data(Blob::new(data.to_vec()))
}

/// The write loop of [`put_records`] and [`put_explicit`]: 500 entries per call, and after a partial
/// failure the rest resent from the first failed entry (records of one key must land in order); panics
/// when a chunk is still not stored after 20 attempts.
async fn put_entries(client: &Client, stream: &str, entries: Vec<PutRecordsRequestEntry>) {
    for chunk in entries.chunks(500) {
        let mut pending = chunk.to_vec();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match client.put_records().stream_name(stream).set_records(Some(pending.clone())).send().await {
                Ok(out) => match out.records.iter().position(|r| r.error_code.is_some()) {
                    None => break,
                    Some(i) => pending = pending.split_off(i),
                },
                Err(e) if attempt < 20 => eprintln!("put_records retry: {e}"),
                Err(e) => panic!("put_records to {stream}: {e:?}"),
            }
            assert!(attempt < 20, "put_records to {stream}: {} entries still failing after 20 attempts", pending.len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits until `stream` is ACTIVE again (after a split or merge).
pub async fn wait_active(client: &Client, stream: &str) {
    for _ in 0..200 {
        let summary = client.describe_stream_summary().stream_name(stream).send().await;
        let status = summary.ok().and_then(|s| s.stream_description_summary).map(|s| s.stream_status);
        if status == Some(StreamStatus::Active) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("stream {stream} did not become ACTIVE within 10 s");
}

/// The open shards of `stream` with their hash key ranges (start, end).
pub async fn open_shards(client: &Client, stream: &str) -> Vec<(String, u128, u128)> {
    let out = client.list_shards().stream_name(stream).send().await.expect("list shards");
    out.shards
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.sequence_number_range.as_ref().and_then(|r| r.ending_sequence_number.as_ref()).is_none())
        .map(|s| {
            let range = s.hash_key_range.expect("hash range");
            (s.shard_id, range.starting_hash_key.parse().expect("start"), range.ending_hash_key.parse().expect("end"))
        })
        .collect()
}

/// Splits `shard` in the middle of its hash key range and waits for the stream to settle.
pub async fn split(client: &Client, stream: &str, shard: &str) {
    let (_, start, end) =
        open_shards(client, stream).await.into_iter().find(|(id, _, _)| id == shard).expect("open shard");
    let middle = start + (end - start) / 2 + 1;
    client
        .split_shard()
        .stream_name(stream)
        .shard_to_split(shard)
        .new_starting_hash_key(middle.to_string())
        .send()
        .await
        .expect("split shard");
    wait_active(client, stream).await;
}

/// Merges two adjacent open shards and waits for the stream to settle.
pub async fn merge(client: &Client, stream: &str, shard: &str, adjacent: &str) {
    client
        .merge_shards()
        .stream_name(stream)
        .shard_to_merge(shard)
        .adjacent_shard_to_merge(adjacent)
        .send()
        .await
        .expect("merge shards");
    wait_active(client, stream).await;
}

/// A TRIM_HORIZON iterator on `shard` of `stream`.
pub async fn trim_horizon(client: &Client, stream: &str, shard: &str) -> Option<String> {
    client
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .expect("shard iterator")
        .shard_iterator
}

/// One record read back from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Its partition key.
    pub partition_key: String,
    /// Its sequence number.
    pub sequence_number: String,
    /// Its payload as text.
    pub data: String,
}

/// Every record now in `shard` of `stream`, from TRIM_HORIZON up to the first empty page, as the SDK
/// returns them (payloads as raw bytes).
pub async fn read_shard(client: &Client, stream: &str, shard: &str) -> Vec<Record> {
    let mut records = Vec::new();
    let mut iterator = trim_horizon(client, stream, shard).await;
    while let Some(current) = iterator {
        let out = client.get_records().shard_iterator(current).send().await.expect("get records");
        if out.records.is_empty() {
            break;
        }
        records.extend(out.records);
        iterator = out.next_shard_iterator;
    }
    records
}

/// Every record now in the open shards of `stream`, shard by shard, in shard order.
pub async fn read_all(client: &Client, stream: &str) -> Vec<StoredRecord> {
    let mut all = Vec::new();
    for (shard, _, _) in open_shards(client, stream).await {
        all.extend(read_shard(client, stream, &shard).await.into_iter().map(|r| StoredRecord {
            partition_key: r.partition_key,
            sequence_number: r.sequence_number,
            data: String::from_utf8_lossy(r.data.as_ref()).into_owned(),
        }));
    }
    all
}
