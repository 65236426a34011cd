//! AWS plumbing shared by the worker, the operator and the CLI: the sorting of SDK errors into what
//! callers act on, and the process-wide count of calls refused for their credentials.

pub mod credentials;
mod fault;

pub use fault::{Fault, classify};
