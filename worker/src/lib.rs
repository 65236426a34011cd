//! Leasehold worker library.
pub mod lease;
