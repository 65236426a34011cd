//! Test support for Leasehold: where the emulators are, clients for them, and uniquely named streams
//! and tables so tests run in parallel without seeing each other's data.
//!
//! A test that needs an emulator and cannot reach it panics with a message saying how to start it;
//! nothing here ever skips a test.

pub mod dynamo_meter;
pub mod fanout;
mod fault;
pub mod holds;
pub mod kinesis;
pub mod kpl;
pub mod modules;
pub mod nemesis;
pub mod process;
pub mod proxy;
pub mod server;

pub use fault::{Fault, FaultServer, closed_endpoint};

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};

/// Environment variable naming the DynamoDB emulator's endpoint.
pub const DYNAMODB_ENDPOINT_VAR: &str = "LEASEHOLD_DYNAMODB_ENDPOINT";
/// Environment variable naming the Kinesis emulator's endpoint.
pub const KINESIS_ENDPOINT_VAR: &str = "LEASEHOLD_KINESIS_ENDPOINT";
/// Environment variable naming the second Kinesis emulator's (kinesis-mock's) endpoint.
pub const KINESIS_MOCK_ENDPOINT_VAR: &str = "LEASEHOLD_KINESIS_MOCK_ENDPOINT";

const START_HINT: &str = "start the emulators with `make emulators` (or `tests/ground/emulators.sh start`), \
     or run the whole suite with `make test`, which starts them itself";

/// Which emulated AWS service a test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// dynalite, standing in for DynamoDB.
    DynamoDb,
    /// kinesalite, standing in for Kinesis.
    Kinesis,
    /// kinesis-mock (npm `kinesis-local`), the second Kinesis emulator: it has `UpdateShardCount`,
    /// on-demand streams and `StreamARN` parameters, which kinesalite lacks.
    KinesisMock,
}

impl Service {
    fn var(self) -> &'static str {
        match self {
            Service::DynamoDb => DYNAMODB_ENDPOINT_VAR,
            Service::Kinesis => KINESIS_ENDPOINT_VAR,
            Service::KinesisMock => KINESIS_MOCK_ENDPOINT_VAR,
        }
    }

    fn emulator(self) -> &'static str {
        match self {
            Service::DynamoDb => "dynalite",
            Service::Kinesis => "kinesalite",
            Service::KinesisMock => "kinesis-mock",
        }
    }
}

/// Where the test-ground scripts cache what they install: `$LEASEHOLD_CACHE`, else `~/.cache/leasehold`
/// (as `tests/ground/common.sh` decides).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("LEASEHOLD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/leasehold"))
}

/// Where the test-ground scripts keep run state (endpoints, kubeconfig): `$LEASEHOLD_STATE`, else
/// `<cache>/run`.
pub fn state_dir() -> PathBuf {
    std::env::var_os("LEASEHOLD_STATE").map(PathBuf::from).unwrap_or_else(|| cache_dir().join("run"))
}

/// The state file that `tests/ground/emulators.sh start` writes.
pub fn emulator_state_file() -> PathBuf {
    state_dir().join("emulators.env")
}

fn endpoint_from_state_file(var: &str) -> Option<String> {
    let text = std::fs::read_to_string(emulator_state_file()).ok()?;
    let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    vars.get(var).map(|v| v.to_string())
}

/// The endpoint of `service`'s emulator, checked to accept connections.
///
/// Panics with instructions when it is not configured or not reachable: a test that needs an emulator
/// must fail loudly rather than pass without it.
pub fn endpoint(service: Service) -> String {
    let var = service.var();
    let endpoint = std::env::var(var).ok().or_else(|| endpoint_from_state_file(var)).unwrap_or_else(|| {
        panic!(
            "{} endpoint unknown: neither ${var} nor {} names it; {START_HINT}",
            service.emulator(),
            emulator_state_file().display()
        )
    });
    let authority = endpoint.trim_start_matches("http://").trim_start_matches("https://");
    let reachable = authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok());
    assert!(reachable, "{} is not answering at {endpoint}; {START_HINT}", service.emulator());
    endpoint
}

/// SDK configuration for an endpoint of ours: fixed test credentials, region us-east-1.
pub async fn sdk_config(endpoint: String) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "leasehold-test",
            "leasehold-test",
            None,
            None,
            "leasehold-testkit",
        ))
        .endpoint_url(endpoint)
        .load()
        .await
}

/// A DynamoDB client for the emulator (panics with instructions if it is not running).
pub async fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(&sdk_config(endpoint(Service::DynamoDb)).await)
}

/// A Kinesis client for the emulator (panics with instructions if it is not running).
pub async fn kinesis_client() -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::new(&sdk_config(endpoint(Service::Kinesis)).await)
}

/// A Kinesis client for the second emulator, kinesis-mock (panics with instructions if it is not running).
pub async fn kinesis_mock_client() -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::new(&sdk_config(endpoint(Service::KinesisMock)).await)
}

/// A name no other test in any process will use: `prefix-<pid>-<n>-<random>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}-{n}-{}", std::process::id(), &random[..8])
}

/// Creates an empty lease table (hash key `lease_key`, on-demand) with a unique name and waits until it
/// is ACTIVE. Returns its name.
pub async fn create_lease_table(client: &aws_sdk_dynamodb::Client, prefix: &str) -> String {
    let name = unique_name(prefix);
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("lease_key")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute definition"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("lease_key")
                .key_type(KeyType::Hash)
                .build()
                .expect("key schema"),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create table {name}: {e:?}"));
    for _ in 0..200 {
        let table = client.describe_table().table_name(&name).send().await;
        let status = table.ok().and_then(|t| t.table).and_then(|t| t.table_status);
        if status == Some(TableStatus::Active) {
            return name;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("table {name} did not become ACTIVE within 10 s");
}

/// Creates a stream with `shards` shards and a unique name, and waits until it is ACTIVE. Returns its
/// name.
pub async fn create_stream(client: &aws_sdk_kinesis::Client, prefix: &str, shards: i32) -> String {
    let name = unique_name(prefix);
    create_named_stream(client, &name, shards).await;
    name
}

/// Creates the stream `name` (which the caller made unique, e.g. from [`unique_name`]) with `shards`
/// shards, and waits until it is ACTIVE.
pub async fn create_named_stream(client: &aws_sdk_kinesis::Client, name: &str, shards: i32) {
    client
        .create_stream()
        .stream_name(name)
        .shard_count(shards)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create stream {name}: {e:?}"));
    kinesis::wait_active(client, name).await;
}
