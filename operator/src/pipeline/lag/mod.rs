//! Lag in the operator: what a read of the lease rows shows ([`reading`]) and scaling on it
//! ([`scaling`]). The holders write their lag into their rows (`lag_ms`); the operator only reads.

pub mod reading;
pub mod scaling;
