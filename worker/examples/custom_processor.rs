//! A worker binary with its own processor, built on the `leasehold-worker` library: the same runtime,
//! flags, endpoints, signals and exit codes as `leasehold-worker` (leases, balancing, ordering, retries,
//! `/metrics`), with business logic in Rust. Under the operator it is a consumer's worker image:
//! `spec.processor: {custom: {}}` and `spec.template` naming the image.
//!
//! ```sh
//! cargo run -p leasehold-worker --example custom_processor -- --config consumer.yaml
//! ```
//!
//! Each shard gets its own `ByteCounter` (the KCL's one-processor-per-shard shape); the total over
//! every shard is shared through what the factory closure captures. It prints one line per record:
//! `<stream>/<shard> #<sequence>: <bytes> bytes (shard <n>, worker <m>)`.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use leasehold_worker::{LeaseKey, Outputs, ProcessError, Record, ShardProcessor, ShardStart};

/// Sums the bytes of one shard's records; refuses empty records.
struct ByteCounter {
    shard: LeaseKey,
    bytes: AtomicU64,
    worker_total: Arc<AtomicU64>,
}

#[async_trait]
impl ShardProcessor for ByteCounter {
    async fn initialize(&self, start: &ShardStart) {
        println!("initialize {} after {}", start.shard, start.checkpoint);
    }

    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        if record.data.is_empty() {
            // Permanent: retrying cannot help, so `retry.onExhausted` applies at once.
            return Err(ProcessError::permanent("empty record"));
        }
        // A call that may fail for a while (a database, a service) would return
        // `ProcessError::retryable(..)`: the record is retried in place with backoff.
        let size = record.data.len() as u64;
        let shard = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        let worker = self.worker_total.fetch_add(size, Ordering::Relaxed) + size;
        println!(
            "{}/{} #{}: {size} bytes (shard {shard}, worker {worker})",
            record.stream, record.shard_id, record.sequence_number
        );
        Ok(())
    }

    async fn shard_ended(&self) {
        println!("ended {} after {} bytes", self.shard, self.bytes.load(Ordering::Relaxed));
    }

    async fn shutdown_requested(&self) {
        // Graceful: the records running have finished; the done prefix is checkpointed after this.
        println!("shutdown requested for {}", self.shard);
    }

    async fn lease_lost(&self) {
        // Another worker owns it now; its records not yet checkpointed may be delivered there again.
        println!("lease lost for {}", self.shard);
    }
}

fn main() -> ExitCode {
    let worker_total = Arc::new(AtomicU64::new(0));
    leasehold_worker::main_with_processor(move |shard: &LeaseKey| ByteCounter {
        shard: shard.clone(),
        bytes: AtomicU64::new(0),
        worker_total: worker_total.clone(),
    })
}
