//! Records through the workers: a producer writing numbered records while the test moves leases, and
//! the exactly-once check of what the workers printed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_testkit::process::{Delivery, WorkerProcess};

/// Writes one record per key every `every` (data `key-<k>:<n>`), until stopped.
pub struct Producer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(String, Vec<u8>)>>,
}

impl Producer {
    /// Starts writing to `stream`.
    pub fn start(client: aws_sdk_kinesis::Client, stream: &str, keys: usize, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, stream) = (stop.clone(), stream.to_string());
        let task = tokio::spawn(async move {
            let mut written = Vec::new();
            let mut n = 0;
            while !stopped.load(Ordering::SeqCst) {
                let batch: Vec<_> =
                    (0..keys).map(|k| leasehold_testkit::kinesis::numbered(&format!("key-{k}"), n)).collect();
                leasehold_testkit::kinesis::put_records(&client, &stream, &batch).await;
                written.extend(batch);
                n += 1;
                tokio::time::sleep(every).await;
            }
            written
        });
        Self { stop, task }
    }

    /// Stops writing; every record written.
    pub async fn stop(self) -> Vec<(String, Vec<u8>)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("producer task")
    }
}

/// Every record the workers printed.
pub fn deliveries(workers: &[&WorkerProcess]) -> Vec<Delivery> {
    workers.iter().flat_map(|w| w.deliveries()).collect()
}

/// Distinct records delivered (by data).
pub fn distinct(deliveries: &[Delivery]) -> HashSet<String> {
    deliveries.iter().map(|d| d.data.clone()).collect()
}

/// Every written record delivered (no gap), and each (shard, sequence number) delivered once (no
/// repeat): for runs in which no process failed.
pub fn assert_exactly_once(deliveries: &[Delivery], written: &[(String, Vec<u8>)]) {
    let seen = distinct(deliveries);
    let missing: Vec<String> =
        written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).filter(|d| !seen.contains(d)).collect();
    assert!(
        missing.is_empty(),
        "{} records never delivered, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let mut by_record: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
    for d in deliveries {
        by_record.entry((d.shard_id.clone(), d.sequence_number.clone())).or_default().push(&d.owner);
    }
    let repeated: Vec<String> = by_record
        .iter()
        .filter(|(_, owners)| owners.len() > 1)
        .map(|((shard, sequence), owners)| format!("{shard} {sequence} by {owners:?}"))
        .collect();
    assert!(
        repeated.is_empty(),
        "{} records processed twice, e.g. {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(5)]
    );
}
