//! What can go wrong, each with its own exit code (listed in `--help`).

use std::process::ExitCode;

/// Result of a CLI operation.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// Exit codes, one per kind of failure; `--help` lists them.
pub mod code {
    /// A usage error (clap's own code).
    pub const USAGE: u8 = 2;
    /// No such consumer, table, stream or shard.
    pub const NOT_FOUND: u8 = 3;
    /// Refused: workers of the group are alive, or the KCL application still holds leases.
    pub const REFUSED: u8 = 4;
    /// A row changed between the tool's read and its write; nothing more was written.
    pub const CONFLICT: u8 = 5;
    /// Malformed input: a lease row, a positions file, a KCL row, an argument value.
    pub const MALFORMED: u8 = 6;
    /// AWS or Kubernetes failed (credentials, throttling, network).
    pub const SERVICE: u8 = 7;
    /// Waited too long (pause, resume, drain).
    pub const TIMEOUT: u8 = 8;
}

/// Every exit code and its meaning: the end of `--help` ([`EXIT_CODES_HELP`], a test keeps the two
/// the same) and docs/reference/cli.md.
pub const EXIT_CODES: &[(u8, &str)] = &[
    (0, "done (or a dry run printed)"),
    (code::USAGE, "usage error"),
    (code::NOT_FOUND, "no such consumer, table, stream or shard"),
    (code::REFUSED, "refused: workers of the group are alive (pause first), or the KCL application holds leases"),
    (code::CONFLICT, "a row changed between read and write: nothing after it was written (the message lists what was)"),
    (code::MALFORMED, "malformed input: a lease row, a positions file, a KCL row or an argument value"),
    (code::SERVICE, "AWS or Kubernetes failed (credentials, throttling, network)"),
    (code::TIMEOUT, "timed out waiting (pause, resume, drain)"),
];

/// The exit codes as printed at the end of `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes:
  0  done (or a dry run printed)
  2  usage error
  3  no such consumer, table, stream or shard
  4  refused: workers of the group are alive (pause first), or the KCL application holds leases
  5  a row changed between read and write: nothing after it was written (the message lists what was)
  6  malformed input: a lease row, a positions file, a KCL row or an argument value
  7  AWS or Kubernetes failed (credentials, throttling, network)
  8  timed out waiting (pause, resume, drain)";

/// A failure of the CLI.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Something named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The operation is refused as things stand.
    #[error("{0}")]
    Refused(String),
    /// A conditional write lost to a concurrent change.
    #[error("{0}")]
    Conflict(String),
    /// Input that cannot be read.
    #[error("{0}")]
    Malformed(String),
    /// AWS or Kubernetes failed.
    #[error("{0}")]
    Service(String),
    /// A wait ran out.
    #[error("{0}")]
    Timeout(String),
    /// A bad combination of arguments.
    #[error("{0}")]
    Usage(String),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::NotFound(_) => code::NOT_FOUND,
            CliError::Refused(_) => code::REFUSED,
            CliError::Conflict(_) => code::CONFLICT,
            CliError::Malformed(_) => code::MALFORMED,
            CliError::Service(_) => code::SERVICE,
            CliError::Timeout(_) => code::TIMEOUT,
            CliError::Usage(_) => code::USAGE,
        })
    }
}

impl From<leasehold_worker::lease::LeaseError> for CliError {
    fn from(error: leasehold_worker::lease::LeaseError) -> Self {
        use leasehold_worker::lease::LeaseError;
        match error {
            LeaseError::TableNotFound { table } => CliError::NotFound(format!("lease table {table} does not exist")),
            LeaseError::Malformed { .. } => CliError::Malformed(error.to_string()),
            LeaseError::ConditionFailed { .. } => CliError::Conflict(error.to_string()),
            other => CliError::Service(other.to_string()),
        }
    }
}

impl From<kube::Error> for CliError {
    fn from(error: kube::Error) -> Self {
        match &error {
            kube::Error::Api(status) if status.code == 404 => CliError::NotFound(status.message.clone()),
            _ => CliError::Service(format!("kubernetes: {error}")),
        }
    }
}

/// An AWS SDK error as text: the service's code and message when it gave them.
pub fn sdk_message<E>(error: &aws_sdk_dynamodb::error::SdkError<E>) -> String
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    match error.as_service_error() {
        Some(service) => {
            format!("{}: {}", service.code().unwrap_or("error"), service.message().unwrap_or("no message"))
        }
        None => format!("{error}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_help_lists_every_exit_code_of_the_table() {
        let lines: Vec<String> =
            super::EXIT_CODES.iter().map(|(code, meaning)| format!("  {code}  {meaning}")).collect();
        assert_eq!(super::EXIT_CODES_HELP, format!("Exit codes:\n{}", lines.join("\n")));
    }
}
