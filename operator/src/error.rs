//! Errors of the operator: one variant per stage of the reconcile pipeline, so a failure says where it
//! happened, is counted by that kind and maps to one condition reason.

use leasehold_crds::FieldError;

/// Result of a reconcile step.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong while reconciling. Each variant belongs to one stage (its doc names it) and is
/// counted under that stage's [`Error::kind`], so the failure metric says which stage failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// validate: the spec breaks rules the worker checks (the API server should have refused it).
    #[error("invalid spec: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    InvalidSpec(Vec<FieldError>),
    /// validate: restricted templates are on and the pod template asks for host access or privilege.
    #[error("pod template refused (restricted templates): {}", .0.join("; "))]
    TemplateRefused(Vec<String>),
    /// ensure table: a DynamoDB call on the lease table failed (also when deleting it).
    #[error("lease table {table}: {message}")]
    Table {
        /// The table.
        table: String,
        /// What happened (stable across retries: no request ids).
        message: String,
    },
    /// ensure table: the table the spec names exists but is not a lease table (its key is not `lease_key`).
    #[error("table {table} is not a lease table ({found}; a lease table's key is the string hash key lease_key)")]
    NotLeaseTable {
        /// The table.
        table: String,
        /// Its key schema as found.
        found: String,
    },
    /// ensure consumer: a call on a stream's registered consumer (enhanced fan-out) failed.
    #[error("stream consumer on {stream}: {message}")]
    StreamConsumer {
        /// The stream (or the consumer's ARN).
        stream: String,
        /// What happened (stable across retries: no request ids).
        message: String,
    },
    /// ensure consumer: the ARN of a registered consumer could not be recorded on the resource.
    #[error("recording a registered stream consumer: {0}")]
    Record(#[source] kube::Error),
    /// ensure consumer: a stream to register the consumer on does not exist.
    #[error("stream(s) not found: {}", .0.join(", "))]
    ConsumerStreamNotFound(Vec<String>),
    /// ensure streams: a stream to create when missing could not be described or created.
    #[error("streams: {0}")]
    EnsureStream(String),
    /// cleanup: the workers could not be stopped before their consumers were to be deregistered.
    #[error("workers still running: {0}")]
    WorkersRunning(String),
    /// observe: some streams do not exist.
    #[error("stream(s) not found: {}", .0.join(", "))]
    StreamNotFound(Vec<String>),
    /// observe: the shard counts of some streams could not be read.
    #[error("streams: {0}")]
    Stream(String),
    /// build: the worker config could not be written.
    #[error("worker config: {0}")]
    Build(#[from] serde_yaml_ng::Error),
    /// apply: server-side apply of a worker object failed.
    #[error("applying {object}: {source}")]
    Apply {
        /// The object, `Kind/name`.
        object: String,
        /// The API error.
        source: kube::Error,
    },
    /// status: the status could not be written.
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    /// The finalizer could not be added or removed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    /// The object has no namespace or name (never for a namespaced resource read from the API).
    #[error("object without namespace or name")]
    MissingMeta,
}

impl Error {
    /// The stage that failed, as the `kind` label of `leasehold_operator_reconcile_failures_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidSpec(_) | Error::TemplateRefused(_) => "validate",
            Error::Table { .. } | Error::NotLeaseTable { .. } => "table",
            Error::EnsureStream(_) => "streams",
            Error::StreamConsumer { .. } | Error::Record(_) | Error::ConsumerStreamNotFound(_) => "consumer",
            Error::StreamNotFound(_) | Error::Stream(_) => "observe",
            Error::WorkersRunning(_) => "cleanup",
            Error::Build(_) => "build",
            Error::Apply { .. } => "apply",
            Error::Status(_) => "status",
            Error::Finalizer(_) => "finalizer",
            Error::MissingMeta => "metadata",
        }
    }

    /// The condition reason (and event reason) of this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::TemplateRefused(_) => "TemplateRefused",
            Error::Table { .. } => "TableError",
            Error::NotLeaseTable { .. } => "NotALeaseTable",
            Error::StreamNotFound(_) | Error::ConsumerStreamNotFound(_) => "StreamNotFound",
            Error::Stream(_) | Error::EnsureStream(_) => "StreamError",
            Error::StreamConsumer { .. } | Error::Record(_) => "StreamConsumerError",
            Error::WorkersRunning(_) => "WorkersRunning",
            Error::Build(_) => "BuildFailed",
            Error::Apply { .. } => "ApplyFailed",
            Error::Status(_) => "StatusFailed",
            Error::Finalizer(_) => "FinalizerFailed",
            Error::MissingMeta => "MissingMetadata",
        }
    }

    /// The message of this failure without the stage prefix, as a condition shows it.
    pub fn message(&self) -> String {
        match self {
            Error::InvalidSpec(errors) => errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "),
            Error::TemplateRefused(refused) => {
                format!("restricted templates refuse {} (the operator's --restrict-templates)", refused.join("; "))
            }
            Error::Table { table, message } => format!("lease table {table}: {message}"),
            Error::Stream(message) | Error::EnsureStream(message) => message.clone(),
            other => other.to_string(),
        }
    }

    /// Folds the finalizer helper's error back into ours, keeping the stage that failed.
    pub fn from_finalizer(error: kube::runtime::finalizer::Error<Error>) -> Self {
        use kube::runtime::finalizer::Error as Finalizer;
        match error {
            Finalizer::ApplyFailed(e) | Finalizer::CleanupFailed(e) => e,
            Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => Error::Finalizer(e),
            Finalizer::UnnamedObject | Finalizer::InvalidFinalizer => Error::MissingMeta,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_has_its_kind_and_reason() {
        let table = Error::Table { table: "t".into(), message: "UnrecognizedClientException".into() };
        assert_eq!((table.kind(), table.reason()), ("table", "TableError"));
        assert_eq!(table.message(), "lease table t: UnrecognizedClientException");
        let missing = Error::StreamNotFound(vec!["a".into(), "b".into()]);
        assert_eq!(
            (missing.kind(), missing.reason(), missing.message().as_str()),
            ("observe", "StreamNotFound", "stream(s) not found: a, b")
        );
        let inner = Error::from_finalizer(kube::runtime::finalizer::Error::ApplyFailed(table));
        assert_eq!(inner.kind(), "table", "the stage survives the finalizer wrapper");
    }
}
