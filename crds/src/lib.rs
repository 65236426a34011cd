//! The `StreamConsumer` API of Leasehold (group `leasehold.io`).
//!
//! The resource types arrive with the operator issue; this crate holds the names that are already fixed
//! so the worker and the operator agree on them.

/// API group of every Leasehold resource.
pub const API_GROUP: &str = "leasehold.io";

/// Version of the `StreamConsumer` API served today.
pub const API_VERSION: &str = "v1alpha1";

#[cfg(test)]
mod tests {
    #[test]
    fn api_version_is_group_qualified() {
        assert_eq!(format!("{}/{}", super::API_GROUP, super::API_VERSION), "leasehold.io/v1alpha1");
    }
}
