//! The `StreamConsumer` API of Leasehold (group `leasehold.io`, version `v1alpha1`): the resource the
//! operator reconciles and, as its `spec`, the configuration file the worker binary reads.

mod bounds;
pub mod filter;
mod reference;
mod resolved;
mod spec;
mod status;
mod validate;
mod window;

pub use reference::reference_markdown;
pub use resolved::{LagTarget, ResolvedDurations, ResolvedSpec, defaults};
pub use spec::*;
pub use status::*;
pub use validate::{FieldError, MAX_HTTP_BATCH, default_consumer_name, kinesis_consumer_name, valid_consumer_name};
pub use window::*;

/// API group of every Leasehold resource.
pub const API_GROUP: &str = "leasehold.io";

/// Version of the `StreamConsumer` API served today.
pub const API_VERSION: &str = "v1alpha1";

/// The `StreamConsumer` CustomResourceDefinition as YAML, as committed in `crds/streamconsumer.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&StreamConsumer::crd())
}

#[cfg(test)]
mod tests {
    #[test]
    fn api_version_is_group_qualified() {
        assert_eq!(format!("{}/{}", super::API_GROUP, super::API_VERSION), "leasehold.io/v1alpha1");
    }
}
