//! KPL de-aggregation against AWS's own aggregation library, live: `aws-kinesis-agg` 1.2.3 installed by
//! tests/ground/kpl.sh makes the aggregates. The committed fixtures (worker/tests/fixtures/kpl/, used by
//! the unit tests) are remade and must match byte for byte, and library-made aggregates put to both
//! Kinesis emulators come back through GetRecords and de-aggregate to exactly what was given.

use std::path::{Path, PathBuf};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use leasehold_testkit::kinesis::{open_shards, read_shard};
use leasehold_testkit::{create_stream, kinesis_client, kinesis_mock_client};
use leasehold_worker::internals::kpl::{Deaggregated, HashKeyRange, Producer, deaggregate, for_shard, producer};
use serde_json::{Value, json};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

use leasehold_testkit::kpl::aggregate_with_library;

#[test]
fn committed_fixtures_are_what_the_library_makes() {
    let dir = repo_root().join("worker/tests/fixtures/kpl");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        assert_eq!(aggregate_with_library(&fixture["input"]), fixture["output"], "{} is stale", path.display());
        checked += 1;
    }
    assert_eq!(checked, 6, "fixtures in {}", dir.display());
}

/// (partition key, explicit hash key, data) of each user record the test gives the library.
type Given = Vec<(String, Option<String>, Vec<u8>)>;

fn spec(given: &Given, max_size: usize) -> Value {
    let records: Vec<Value> = given
        .iter()
        .map(|(key, explicit, data)| {
            let mut r = json!({"partition_key": key, "data_b64": STANDARD.encode(data)});
            if let Some(e) = explicit {
                r["explicit_hash_key"] = json!(e);
            }
            r
        })
        .collect();
    json!({"records": records, "max_size": max_size})
}

/// Puts each library aggregate (under the partition key and explicit hash key the library chose, as a
/// producer would) and a plain record between them, reads the stream back, de-aggregates, and checks
/// every user record came back once, in order, and the plain records as plain.
async fn library_aggregates_survive(client: &Client, prefix: &str) {
    let stream = create_stream(client, prefix, 1).await;
    let given: Given = (0..600u32)
        .map(|i| {
            let key = format!("user-{}", i % 13);
            let explicit = (i % 5 == 0).then(|| (u128::from(i) << 100).to_string());
            let data = if i % 7 == 0 { Vec::new() } else { format!("{key}:{i}").into_bytes() };
            (key, explicit, data)
        })
        .collect();
    // 4 KiB aggregates: several of them, so sub-sequences restart and plain records sit between.
    let answer = aggregate_with_library(&spec(&given, 4096));
    let aggregates = answer["aggregates"].as_array().expect("aggregates");
    assert!(aggregates.len() > 3, "expected several aggregates, got {}", aggregates.len());
    for (n, aggregate) in aggregates.iter().enumerate() {
        let data = STANDARD.decode(aggregate["data_b64"].as_str().expect("data")).expect("base64");
        client
            .put_record()
            .stream_name(&stream)
            .partition_key(aggregate["partition_key"].as_str().expect("key"))
            .set_explicit_hash_key(aggregate["explicit_hash_key"].as_str().map(str::to_string))
            .data(Blob::new(data))
            .send()
            .await
            .expect("put aggregate");
        client
            .put_record()
            .stream_name(&stream)
            .partition_key("plain")
            .data(Blob::new(format!("plain:{n}")))
            .send()
            .await
            .expect("put plain record");
    }

    let (shard, start, end) = open_shards(client, &stream).await.remove(0);
    let range = HashKeyRange { start, end };
    let mut user_records = Vec::new();
    let mut plain = Vec::new();
    for record in read_shard(client, &stream, &shard).await {
        let data = Bytes::copy_from_slice(record.data.as_ref());
        match deaggregate(&data) {
            Deaggregated::Plain => plain.push(String::from_utf8(data.to_vec()).expect("utf8")),
            Deaggregated::Aggregate(records) => {
                assert_eq!(producer(&record.partition_key, &records), Producer::Other);
                let kept = for_shard(&record.partition_key, records, range);
                assert!(kept.skip.is_empty());
                assert!(kept.deliver.iter().enumerate().all(|(i, r)| r.sub_sequence as usize == i));
                user_records.extend(kept.deliver);
            }
            Deaggregated::Corrupt(reason) => panic!("library aggregate read back corrupt: {reason}"),
        }
    }
    assert_eq!(plain, (0..aggregates.len()).map(|n| format!("plain:{n}")).collect::<Vec<_>>());
    let got: Given =
        user_records.into_iter().map(|r| (r.partition_key, r.explicit_hash_key, r.data.to_vec())).collect();
    assert_eq!(got.len(), given.len());
    assert_eq!(got, given);
}

#[tokio::test]
async fn library_aggregates_survive_kinesalite() {
    library_aggregates_survive(&kinesis_client().await, "kpl-kinesalite").await;
}

#[tokio::test]
async fn library_aggregates_survive_kinesis_mock() {
    library_aggregates_survive(&kinesis_mock_client().await, "kpl-kinesis-mock").await;
}
