//! SDK configuration from a spec's `aws` section.

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use leasehold_crds::AwsSpec;

/// Shared SDK configuration: region from the spec (else the environment), credentials from the default
/// chain, bounded attempts so a hung call cannot outlive a lease.
pub async fn sdk_config(aws: &AwsSpec) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(3))
                .build(),
        );
    if let Some(region) = &aws.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    loader.load().await
}

/// A Kinesis client, at `aws.kinesisEndpoint` when set.
pub fn kinesis_client(sdk: &aws_config::SdkConfig, aws: &AwsSpec) -> aws_sdk_kinesis::Client {
    let mut config = aws_sdk_kinesis::config::Builder::from(sdk);
    if let Some(endpoint) = &aws.kinesis_endpoint {
        config = config.endpoint_url(endpoint);
    }
    aws_sdk_kinesis::Client::from_conf(config.build())
}

/// A DynamoDB client, at `aws.dynamodbEndpoint` when set.
pub fn dynamodb_client(sdk: &aws_config::SdkConfig, aws: &AwsSpec) -> aws_sdk_dynamodb::Client {
    let mut config = aws_sdk_dynamodb::config::Builder::from(sdk);
    if let Some(endpoint) = &aws.dynamodb_endpoint {
        config = config.endpoint_url(endpoint);
    }
    aws_sdk_dynamodb::Client::from_conf(config.build())
}

/// An SQS client, at `aws.sqsEndpoint` when set.
pub fn sqs_client(sdk: &aws_config::SdkConfig, aws: &AwsSpec) -> aws_sdk_sqs::Client {
    let mut config = aws_sdk_sqs::config::Builder::from(sdk);
    if let Some(endpoint) = &aws.sqs_endpoint {
        config = config.endpoint_url(endpoint);
    }
    aws_sdk_sqs::Client::from_conf(config.build())
}

/// An S3 client, at `aws.s3Endpoint` (path-style addressing) when set.
pub fn s3_client(sdk: &aws_config::SdkConfig, aws: &AwsSpec) -> aws_sdk_s3::Client {
    let mut config = aws_sdk_s3::config::Builder::from(sdk);
    if let Some(endpoint) = &aws.s3_endpoint {
        config = config.endpoint_url(endpoint).force_path_style(true);
    }
    aws_sdk_s3::Client::from_conf(config.build())
}
