//! A worker binary with its own processor, built on the `leasehold-worker` library: the same runtime
//! as `leasehold-worker` (leases, balancing, ordering, retries, metrics), with business logic in Rust.
//!
//! ```sh
//! cargo run -p leasehold-worker --example custom_processor -- consumer.yaml
//! ```
//!
//! `consumer.yaml` is a StreamConsumer spec as for `leasehold-worker --config`; its `processor` section
//! must still name one kind (for example `stdout: {}`) to be valid, and is ignored here.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use leasehold_worker::config::WorkerConfig;
use leasehold_worker::lease::LeaseKey;
use leasehold_worker::metrics::Metrics;
use leasehold_worker::processor::{ProcessError, Record, RecordProcessor};
use leasehold_worker::runtime;
use tokio_util::sync::CancellationToken;

/// Sums the bytes of every record; refuses empty records.
#[derive(Default)]
struct ByteCounter {
    bytes: AtomicU64,
}

#[async_trait]
impl RecordProcessor for ByteCounter {
    async fn process(&self, record: &Record) -> Result<(), ProcessError> {
        if record.data.is_empty() {
            // Permanent: retrying cannot help, so `retry.onExhausted` applies at once.
            return Err(ProcessError::permanent("empty record"));
        }
        // A call that may fail for a while (a database, a service) would return
        // `ProcessError::retryable(..)`: the record is retried in place with backoff.
        let size = record.data.len() as u64;
        let total = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        println!("{}/{} #{}: {} bytes so far", record.stream, record.shard_id, record.sequence_number, total);
        Ok(())
    }

    async fn shard_assigned(&self, shard: &LeaseKey) {
        println!("assigned {shard}");
    }

    async fn shard_revoked(&self, shard: &LeaseKey) {
        // Graceful: the records running finish and the done prefix is checkpointed after this.
        println!("revoked {shard}");
    }

    async fn shard_lost(&self, shard: &LeaseKey) {
        // Another worker owns it now; its records may be delivered there again.
        println!("lost {shard}");
    }

    async fn shard_ended(&self, shard: &LeaseKey) {
        println!("ended {shard}");
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: custom_processor CONFIG.yaml");
        return ExitCode::from(2);
    };
    let config = match WorkerConfig::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let owner = runtime::owner_id(&config, None);
    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });
    // Serve `metrics` with `leasehold_worker::observe::serve` to expose /metrics as the binary does.
    let metrics = Arc::new(Metrics::default());
    match runtime::run_with_metrics(config, owner, Arc::new(ByteCounter::default()), metrics, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
