//! AWS plumbing shared by the Kinesis and DynamoDB clients: SDK configuration from the spec, and the
//! sorting of SDK errors into what callers act on.

mod config;
pub mod credentials;
mod fault;

pub use config::{dynamodb_client, kinesis_client, s3_client, sdk_config, sqs_client};
pub use fault::{Fault, classify};
