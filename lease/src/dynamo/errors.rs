//! Sorting the SDK's errors into [`LeaseError`]s: a refused condition, throttling, timeouts, transport.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

use crate::error::LeaseError;
use crate::key::LeaseKey;
use leasehold_aws::Fault;

/// What the failed request was, for the error message.
pub struct Request<'a> {
    pub table: &'a str,
    pub key: Option<&'a LeaseKey>,
    pub operation: &'static str,
}

/// Sorts an SDK error into a [`LeaseError`].
pub fn classify<E>(error: SdkError<E, HttpResponse>, request: Request<'_>) -> LeaseError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let table = request.table.to_string();
    let fault = leasehold_aws::classify(&error);
    leasehold_aws::credentials::note(&fault);
    let throttled = fault.is_throttling();
    match fault {
        Fault::Timeout => LeaseError::Timeout { table },
        Fault::Transport(message) => LeaseError::Transport { table, message },
        Fault::Service { message, .. } if throttled => LeaseError::Throttled { table, message },
        Fault::Service { code, message, server_error } => match (code.as_str(), request.key) {
            ("ConditionalCheckFailedException", Some(key)) => {
                LeaseError::ConditionFailed { key: key.clone(), operation: request.operation }
            }
            ("ResourceNotFoundException", _) => LeaseError::TableNotFound { table },
            ("ValidationException", Some(key)) if message.contains("maximum allowed size") => {
                LeaseError::ItemTooLarge { key: key.clone(), operation: request.operation }
            }
            ("InternalServerError" | "InternalFailure" | "ServiceUnavailable", _) => {
                LeaseError::Service { table, code, message, retryable: true }
            }
            _ => LeaseError::Service { table, code, message, retryable: server_error },
        },
    }
}
