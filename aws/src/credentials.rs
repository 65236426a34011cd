//! Calls refused because of the worker's credentials (expired, revoked, unknown): counted in
//! `leasehold_aws_credential_failures_total` and logged at most once per [`LOG_EVERY`] with a count, for
//! every client of the process. Nothing else changes: each caller goes on retrying as it does for any
//! service error, leases are kept or lost by the ordinary rules, and once the default credential chain
//! hands out working credentials again (it refreshes expiring ones on its own) the calls succeed.

use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

/// At most one log line per this interval while calls keep being refused.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Error codes by which AWS refuses a caller's credentials or signature.
const CODES: &[&str] = &[
    "ExpiredTokenException",
    "ExpiredToken",
    "RequestExpired",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
];

/// Refused calls over every client of this process (one set of credentials serves them all).
static FAILURES: LazyLock<Counter> = LazyLock::new(Counter::default);

/// When the last line was logged, and how many refusals came since.
static LOGGED: Mutex<(Option<Instant>, u64)> = Mutex::new((None, 0));

/// True when `code` means the credentials were refused.
pub fn is_credentials_code(code: &str) -> bool {
    CODES.contains(&code)
}

/// The process-wide counter (every worker `Metrics` registry serves it).
pub fn failures() -> Counter {
    FAILURES.clone()
}

/// Counts `fault` when it is a refusal of the credentials ([`crate::Fault::refuses_credentials`]), and
/// logs it unless a line went out less than [`LOG_EVERY`] ago. Called by each caller of
/// [`crate::classify`] that reports AWS failures, after classifying.
pub fn note(fault: &crate::Fault) {
    if let crate::Fault::Service { code, message, .. } = fault
        && fault.refuses_credentials()
    {
        refused(code, message);
    }
}

/// Counts one refused call and logs it unless a line went out less than [`LOG_EVERY`] ago.
fn refused(code: &str, message: &str) {
    FAILURES.inc();
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    logged.1 += 1;
    let now = Instant::now();
    if logged.0.is_none_or(|at| now.duration_since(at) >= LOG_EVERY) {
        tracing::error!(
            code,
            detail = message,
            refused = logged.1,
            total = FAILURES.get(),
            "AWS refused the worker's credentials; calls are retried until they are accepted again"
        );
        *logged = (Some(now), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_codes_are_told_from_other_errors() {
        assert!(is_credentials_code("ExpiredTokenException"));
        assert!(is_credentials_code("UnrecognizedClientException"));
        assert!(!is_credentials_code("ProvisionedThroughputExceededException"));
        assert!(!is_credentials_code("ResourceNotFoundException"));
        let before = FAILURES.get();
        note(&crate::Fault::Service {
            code: "ExpiredTokenException".into(),
            message: "test".into(),
            server_error: false,
        });
        assert!(FAILURES.get() > before);
    }
}
