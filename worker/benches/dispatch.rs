//! The in-shard dispatcher in-process with a no-op processor, on one core (a current-thread runtime):
//! records per second for each ordering and concurrency. Prints markdown for docs/benchmarks.md.
//!
//! `cargo bench -p leasehold-worker --bench dispatch`

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use leasehold_crds::Ordering;
use leasehold_worker::internals::dispatch::{DispatchSettings, Dispatcher, RecordRunner};
use leasehold_worker::lease::Checkpoint;
use leasehold_worker::processor::{Outputs, ProcessError, Record, ShardProcessor};
use tokio_util::sync::CancellationToken;

const RECORDS: usize = 1_000_000;
const KEYS: usize = 1_000;

struct NoOp;

#[async_trait]
impl ShardProcessor for NoOp {
    async fn process(&self, _record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn records() -> Vec<Record> {
    let stream: Arc<str> = Arc::from("bench");
    let shard: Arc<str> = Arc::from("shardId-000000000000");
    (0..RECORDS)
        .map(|n| Record {
            stream: stream.clone(),
            shard_id: shard.clone(),
            sequence_number: format!("{:056}", 49_590_000_000u64 + n as u64),
            partition_key: format!("key-{}", n % KEYS),
            data: Bytes::from_static(b"{\"order\":1}"),
            arrival_ms: None,
            explicit_hash_key: None,
            sub_sequence_number: None,
        })
        .collect()
}

/// Feeds every record as the shard reader does (admitting only when the window has room) and waits
/// for all; returns the watermark.
async fn feed(dispatcher: &mut Dispatcher, records: Vec<Record>) -> Option<String> {
    for record in records {
        while !dispatcher.has_room() {
            if dispatcher.step().await.is_err() {
                return None;
            }
        }
        let covers = Checkpoint::Sequence(record.sequence_number.clone());
        if dispatcher.push(record, covers).is_err() {
            return None;
        }
    }
    while let Ok(true) = dispatcher.step().await {}
    dispatcher.watermark().map(Checkpoint::to_string)
}

fn main() {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => panic!("runtime: {e}"),
    };
    println!("\n| ordering | concurrency | records | seconds | records/s |\n|---|---:|---:|---:|---:|");
    let cases = [
        (Ordering::Shard, 1),
        (Ordering::Key, 1),
        (Ordering::Key, 4),
        (Ordering::Key, 32),
        (Ordering::Key, 256),
        (Ordering::None, 4),
        (Ordering::None, 32),
    ];
    for (ordering, concurrency) in cases {
        let batch = records();
        let last = batch.last().map(|r| r.sequence_number.clone());
        let runner = Arc::new(RecordRunner::new(Arc::default()));
        let settings = DispatchSettings { ordering, concurrency };
        let mut dispatcher =
            Dispatcher::new(settings, runner, Arc::new(NoOp), CancellationToken::new(), Arc::new(|| true));
        let started = Instant::now();
        let watermark = runtime.block_on(feed(&mut dispatcher, batch));
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(watermark, last, "every record done");
        println!("| {ordering:?} | {concurrency} | {RECORDS} | {seconds:.3} | {:.0} |", RECORDS as f64 / seconds);
    }
}
