//! Leasehold worker: reads Kinesis shards shared with other workers through a lease table and hands
//! each record to a processor, at least once and in order per partition key.
//!
//! The `leasehold-worker` binary is [`main`]. A worker binary with business logic in Rust is
//! [`main_with_processor`] given a [`ProcessorFactory`] that makes one [`ShardProcessor`] per shard:
//! the same flags, endpoints, signals and exit codes, so the operator runs it as a consumer's image
//! (`spec.processor.custom`). [`runtime::run_worker`] embeds the worker in a program that owns its own
//! runtime and shutdown.
//!
//! ```no_run
//! use leasehold_worker::{LeaseKey, Output, Outputs, ProcessError, Record, ShardProcessor};
//!
//! /// Forwards each order as a receipt, keyed by the order's customer.
//! struct Receipts;
//!
//! #[async_trait::async_trait]
//! impl ShardProcessor for Receipts {
//!     async fn process(&self, record: &Record, outputs: &mut Outputs) -> Result<(), ProcessError> {
//!         if record.data.is_empty() {
//!             return Err(ProcessError::permanent("empty order"));
//!         }
//!         outputs.emit(Output::new(record.data.clone()).carrying_key_of(record));
//!         Ok(())
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     leasehold_worker::main_with_processor(|_shard: &LeaseKey| Receipts)
//! }
//! ```

pub mod aws;
pub use leasehold_aws::backoff;
#[cfg(feature = "cli")]
mod cli;
mod config;
mod coordinator;
mod destination;
mod discovery;
mod dispatch;
pub mod health;
#[doc(hidden)]
pub mod internals;
mod kinesis;
mod kpl;
/// The lease protocol, in a crate of its own (`leasehold-lease`); `crate::lease::...` paths keep working.
pub use leasehold_lease as lease;
mod metrics;
pub mod processor;
#[cfg(feature = "cli")]
pub mod reference;
pub mod runtime;
mod shard;
pub mod signals;
pub mod stream_consumer;
pub mod streams;
#[cfg(test)]
mod test_rows;
pub mod window;

#[cfg(feature = "cli")]
pub use cli::{main, main_with_processor};
pub use config::{ConfigError, WorkerConfig};
/// The rule by which a child shard waits for its parents (used by the `leasehold` CLI to show and keep it).
pub use discovery::parents_done;
pub use lease::{Checkpoint, LeaseKey};
pub use metrics::Metrics;
pub use processor::{Output, Outputs, ProcessError, ProcessorFactory, Record, ShardProcessor, ShardStart, shared};
