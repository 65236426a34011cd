//! Sorting the SDK's errors into [`LeaseError`]s: a refused condition, throttling, timeouts, transport.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use crate::lease::error::LeaseError;
use crate::lease::key::LeaseKey;

/// What the failed request was, for the error message.
pub(crate) struct Request<'a> {
    pub table: &'a str,
    pub key: Option<&'a LeaseKey>,
    pub operation: &'static str,
}

/// Sorts an SDK error into a [`LeaseError`].
pub(crate) fn classify<E>(error: SdkError<E, HttpResponse>, request: Request<'_>) -> LeaseError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let table = request.table.to_string();
    match &error {
        SdkError::TimeoutError(_) => return LeaseError::Timeout { table },
        SdkError::DispatchFailure(failure) if failure.is_timeout() => return LeaseError::Timeout { table },
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) | SdkError::ConstructionFailure(_) => {
            let message = aws_smithy_types::error::display::DisplayErrorContext(&error).to_string();
            return LeaseError::Transport { table, message };
        }
        _ => {}
    }
    let code = error.code().unwrap_or("Unknown").to_string();
    let message = error.message().unwrap_or_default().to_string();
    match code.as_str() {
        "ConditionalCheckFailedException" => match request.key {
            Some(key) => LeaseError::ConditionFailed { key: key.clone(), operation: request.operation },
            None => LeaseError::Service { table, code, message, retryable: false },
        },
        "ProvisionedThroughputExceededException"
        | "RequestLimitExceeded"
        | "ThrottlingException"
        | "LimitExceededException" => LeaseError::Throttled { table, message },
        "ResourceNotFoundException" => LeaseError::TableNotFound { table },
        "InternalServerError" | "InternalFailure" | "ServiceUnavailable" => {
            LeaseError::Service { table, code, message, retryable: true }
        }
        _ => {
            let retryable = matches!(&error, SdkError::ServiceError(e) if e.raw().status().is_server_error());
            LeaseError::Service { table, code, message, retryable }
        }
    }
}
