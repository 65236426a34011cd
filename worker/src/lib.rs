//! Leasehold worker: reads Kinesis shards shared with other workers through a lease table and hands
//! each record to a processor, at least once and in order per shard.
//!
//! The binary (`leasehold-worker --config FILE`) is a thin shell over [`runtime::run`]; a Rust program
//! can embed the same runtime with its own [`processor::RecordProcessor`].

pub mod aws;
pub mod config;
pub mod coordinator;
pub mod discovery;
pub mod dispatch;
pub mod health;
pub mod kinesis;
pub mod lease;
pub mod metrics;
pub mod observe;
pub mod processor;
pub mod runtime;
pub mod shard;
