//! AWS clients per `spec.aws` (region and endpoints), built once and shared by every consumer that
//! names the same ones.

use std::collections::HashMap;

use leasehold_crds::AwsSpec;
use tokio::sync::Mutex;

/// DynamoDB and Kinesis clients for one `spec.aws`.
#[derive(Clone, Debug)]
pub struct AwsClients {
    /// For the lease table.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// For shard counts.
    pub kinesis: aws_sdk_kinesis::Client,
}

/// `spec.aws` as a cache key: region, Kinesis endpoint, DynamoDB endpoint.
type AwsKey = (Option<String>, Option<String>, Option<String>);

/// Clients keyed by `spec.aws`.
#[derive(Default, Debug)]
pub struct ClientCache {
    credentials: Option<(String, String)>,
    clients: Mutex<HashMap<AwsKey, AwsClients>>,
}

impl ClientCache {
    /// A cache whose clients use `credentials` when given, else the SDK's default chain.
    pub fn new(credentials: Option<(String, String)>) -> Self {
        Self { credentials, clients: Mutex::default() }
    }

    /// The clients for `aws`, built on first use.
    pub async fn get(&self, aws: &AwsSpec) -> AwsClients {
        let key = (aws.region.clone(), aws.kinesis_endpoint.clone(), aws.dynamodb_endpoint.clone());
        let mut clients = self.clients.lock().await;
        if let Some(found) = clients.get(&key) {
            return found.clone();
        }
        let mut sdk = leasehold_worker::aws::sdk_config(aws).await;
        if let Some((key, secret)) = &self.credentials {
            let credentials = aws_sdk_dynamodb::config::Credentials::new(key, secret, None, None, "leasehold-static");
            sdk = sdk
                .into_builder()
                .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(credentials))
                .build();
        }
        let built = AwsClients {
            dynamodb: leasehold_worker::aws::dynamodb_client(&sdk, aws),
            kinesis: leasehold_worker::aws::kinesis_client(&sdk, aws),
        };
        clients.insert(key, built.clone());
        built
    }
}

/// An AWS SDK error as a condition message: the service's error code and message for a service error
/// (without the request id, which differs on every call: a message that changes on every retry would
/// rewrite the status each time, and every status write starts another reconcile), else the error
/// with its causes.
pub fn error_message<E, R>(error: &aws_sdk_dynamodb::error::SdkError<E, R>) -> String
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match error.as_service_error() {
        Some(service) => match (service.code(), service.message()) {
            (Some(code), Some(message)) if !message.is_empty() => format!("{code}: {message}"),
            (Some(code), _) => code.to_string(),
            (None, _) => aws_sdk_dynamodb::error::DisplayErrorContext(service).to_string(),
        },
        None => aws_sdk_dynamodb::error::DisplayErrorContext(error).to_string(),
    }
}
