//! `filter` end to end on the emulators: a worker run in-process with a recording processor over a
//! stream of JSON, non-JSON and KPL-aggregated records. Exactly the matching records reach the
//! processor, once each; the others are counted, and the checkpoint advances over them (the last
//! record of the shard is one that does not match).

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use leasehold_testkit::kinesis::{open_shards, put_records, read_shard};
use leasehold_testkit::kpl::{library_aggregates, put_aggregates};
use leasehold_worker::Metrics;
use leasehold_worker::WorkerConfig;
use leasehold_worker::lease::{Checkpoint, DynamoLeaseStore, LeaseKey, LeaseSettings, ShardLeases};
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor, shared};
use leasehold_worker::runtime;
use tokio_util::sync::CancellationToken;

/// Remembers every record it is given: (partition key, data).
#[derive(Default)]
struct Recording(Mutex<Vec<(String, String)>>);

#[async_trait]
impl ShardProcessor for Recording {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        self.0.lock().unwrap().push((record.partition_key.clone(), data));
        Ok(())
    }
}

const FILTER: &str = r#"filter: {patterns: [
  {"data": {"type": ["buy"], "n": [{"numeric": [">=", 10, "<", 30]}]}},
  {"partitionKey": [{"prefix": "vip-"}]},
  {"data": {"$or": [{"note": [{"suffix": "!"}]}, {"urgent": [true]}]}}
]}
"#;

/// The test's records, (partition key, data), and whether each matches [`FILTER`].
fn records() -> Vec<(String, Vec<u8>, bool)> {
    let mut out = Vec::new();
    for n in 0..40u32 {
        let kind = if n % 2 == 0 { "buy" } else { "sell" };
        let key = match n % 5 {
            0 => format!("vip-{n}"),
            _ => format!("plain-{n}"),
        };
        let data = match n % 7 {
            3 => format!("not json {n}"),
            5 => format!(r#"{{"n": {n}, "type": "{kind}", "note": "hurry!"}}"#),
            6 => format!(r#"{{"n": {n}, "type": "{kind}", "urgent": {}}}"#, n % 3 == 0),
            _ => format!(r#"{{"n": {n}, "type": "{kind}"}}"#),
        };
        let json = n % 7 != 3;
        let matches = (json && kind == "buy" && (10..30).contains(&n))
            || key.starts_with("vip-")
            || (json && n % 7 == 5)
            || (json && n % 7 == 6 && n % 3 == 0);
        out.push((key, data.into_bytes(), matches));
    }
    // The shard ends with a record that matches nothing: the checkpoint must still reach it.
    out.push(("plain-last".into(), br#"{"n": 99, "type": "sell"}"#.to_vec(), false));
    out
}

async fn run_filtered(prefix: &str, aggregated: bool) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    let table = leasehold_testkit::create_lease_table(&dynamodb, prefix).await;
    let all = records();
    let plain: Vec<(String, Vec<u8>)> = all.iter().map(|(k, d, _)| (k.clone(), d.clone())).collect();
    if aggregated {
        put_aggregates(&kinesis, &stream, &library_aggregates(&plain, 6)).await;
    } else {
        put_records(&kinesis, &stream, &plain).await;
    }
    let yaml = config(&stream, Some(&table), &format!("startPosition: TRIM_HORIZON\nconcurrency: 4\n{FILTER}"));
    let config = WorkerConfig::parse(&yaml, Path::new("test.yaml")).expect("valid config");
    let recording = Arc::new(Recording::default());
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(runtime::run_worker(runtime::Worker {
        config,
        owner: "filter-test".into(),
        processors: Arc::new(shared(recording.clone())),
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
    }));
    let (shard, _, _) = open_shards(&kinesis, &stream).await.remove(0);
    let last = read_shard(&kinesis, &stream, &shard).await.pop().expect("records").sequence_number;
    let store = DynamoLeaseStore::new(dynamodb, &table, LeaseSettings::new("viewer"));
    let key = LeaseKey::new(&stream, &shard);
    let expected_last = if aggregated {
        // The last aggregate holds the last records; its last user record is the last one.
        let per_last = all.len() - (all.len() - 1) / 6 * 6;
        Checkpoint::SubSequence { sequence: last.clone(), sub_sequence: u32::try_from(per_last - 1).unwrap() }
    } else {
        Checkpoint::Sequence(last.clone())
    };
    let started = std::time::Instant::now();
    loop {
        let row = store.get(&key).await.expect("get");
        let at = row.map(|r| r.checkpoint);
        // A finished aggregate may be checkpointed by its sequence alone.
        if at.as_ref() == Some(&expected_last) || at.as_ref() == Some(&Checkpoint::Sequence(last.clone())) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the checkpoint never reached the last record: {at:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), task).await.expect("stops").expect("task").expect("runtime");

    let mut seen = recording.0.lock().unwrap().clone();
    let mut wanted: Vec<(String, String)> = all
        .iter()
        .filter(|(_, _, m)| *m)
        .map(|(k, d, _)| (k.clone(), String::from_utf8_lossy(d).into_owned()))
        .collect();
    seen.sort();
    wanted.sort();
    assert_eq!(seen, wanted, "exactly the matching records, once each");
    let skipped = all.len() - wanted.len();
    assert!(wanted.len() > 10 && skipped > 10, "both kinds: {} matching, {skipped} not", wanted.len());
    assert_eq!(
        counted(&metrics, "leasehold_records_filtered_total"),
        skipped as u64,
        "each record filtered out is counted"
    );
    assert_eq!(counted(&metrics, "leasehold_records_processed_total"), wanted.len() as u64);
}

#[test]
fn only_matching_records_reach_the_processor_and_the_checkpoint_passes_the_rest() {
    run_test(run_filtered("filter", false));
}

#[test]
fn user_records_of_an_aggregate_are_filtered_one_by_one() {
    run_test(run_filtered("filter-kpl", true));
}
