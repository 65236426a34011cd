//! AWS plumbing shared by the worker, the operator and the CLI: the sorting of SDK errors into what
//! callers act on, the process-wide count of calls refused for their credentials, the Kinesis
//! control-plane calls (shards, stream summary) and the one backoff every retry loop waits with.

pub mod backoff;
pub mod credentials;
mod fault;
pub mod kinesis;

pub use fault::{Fault, classify};
