//! AWS plumbing shared by the Kinesis and DynamoDB clients: SDK configuration from the spec, and the
//! sorting of SDK errors into what callers act on.

mod config;

pub use config::{dynamodb_client, kinesis_client, s3_client, sdk_config, sqs_client};
/// The sorting of SDK errors and the credentials count, in a crate of their own (`leasehold-aws`).
pub use leasehold_aws::{Fault, classify, credentials, kinesis};
