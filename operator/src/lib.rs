//! The Leasehold operator: reconciles `StreamConsumer` resources into a lease table, a worker
//! ConfigMap and Deployment, scaling and status (see `docs/architecture.md`).
//!
//! The reconcile is a pipeline ([`pipeline`]): validate -> ensure table -> observe (streams, lease
//! spread) -> build (pure, in [`build`]) -> apply (server-side apply under [`FIELD_MANAGER`]) -> status
//! (conditions computed in [`conditions`]). A failure is counted by stage and retried with a per-object
//! backoff ([`backoff`], [`controller::error_policy`]).

pub mod aws;
pub mod backoff;
pub mod conditions;
pub mod context;
pub mod controller;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod pipeline;
pub mod readiness;
#[cfg(test)]
mod test_rows;
pub mod window;

/// Field manager under which the operator writes every object with server-side apply.
pub const FIELD_MANAGER: &str = "leasehold-operator";

/// Finalizer that lets the operator apply the table's deletion policy before the resource goes.
pub const FINALIZER: &str = "leasehold.io/lease-table";
