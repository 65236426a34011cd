//! Errors of the operator.

/// Result of a reconcile step.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong while reconciling.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer could not be added, removed, or its step failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The worker config could not be written.
    #[error("worker config: {0}")]
    Config(#[from] serde_yaml_ng::Error),
    /// A DynamoDB call on the lease table failed.
    #[error("lease table {table}: {message}")]
    Table {
        /// The table.
        table: String,
        /// What happened.
        message: String,
    },
    /// The object has no namespace or name (never for a namespaced resource read from the API).
    #[error("object without namespace or name")]
    MissingMeta,
}
