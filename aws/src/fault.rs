//! Sorting an SDK error into the few kinds callers treat differently.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

/// What kind of failure an AWS call met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The request did not complete in time; it may have been applied.
    Timeout,
    /// The request could not be sent or its response not read; it may have been applied.
    Transport(String),
    /// The service answered with an error.
    Service {
        /// The error code, e.g. `ProvisionedThroughputExceededException`.
        code: String,
        /// The service's message.
        message: String,
        /// True for 5xx answers.
        server_error: bool,
    },
}

impl Fault {
    /// True when the service refused the caller's credentials or signature (expired, revoked, unknown).
    pub fn refuses_credentials(&self) -> bool {
        matches!(self, Fault::Service { code, .. } if super::credentials::is_credentials_code(code))
    }

    /// True for the throttling codes of Kinesis and DynamoDB.
    pub fn is_throttling(&self) -> bool {
        matches!(self, Fault::Service { code, .. } if matches!(code.as_str(),
            "ProvisionedThroughputExceededException" | "ThrottlingException" | "RequestLimitExceeded"
                | "LimitExceededException" | "Throttling"))
    }
}

/// Sorts an SDK error of any AWS operation. Pure: a caller that counts refused credentials does so
/// itself ([`crate::credentials::note`]).
pub fn classify<E>(error: &SdkError<E, HttpResponse>) -> Fault
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match error {
        SdkError::TimeoutError(_) => Fault::Timeout,
        SdkError::DispatchFailure(failure) if failure.is_timeout() => Fault::Timeout,
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) | SdkError::ConstructionFailure(_) => {
            Fault::Transport(aws_smithy_types::error::display::DisplayErrorContext(error).to_string())
        }
        _ => {
            let server_error = matches!(error, SdkError::ServiceError(e) if e.raw().status().is_server_error());
            let code = error.code().unwrap_or("Unknown").to_string();
            let message = error.message().unwrap_or_default().to_string();
            Fault::Service { code, message, server_error }
        }
    }
}
