//! The Leasehold operator: reconciles `StreamConsumer` resources (see `docs/architecture.md`).
//!
//! The reconcile pipeline arrives with the operator issue; the crate exists so the workspace has its
//! final shape from the start.

/// Field manager under which the operator writes every object with server-side apply.
pub const FIELD_MANAGER: &str = "leasehold-operator";

/// The API group the operator reconciles.
pub fn api_group() -> &'static str {
    leasehold_crds::API_GROUP
}
