//! Faults the emulators cannot produce, injected at the HTTP layer: each must come back as its own
//! typed, correctly retryable `LeaseError`, never a panic and never "you lost the lease".

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use leasehold_testkit::{Fault, FaultServer, closed_endpoint};
use leasehold_worker::lease::{
    Checkpoint, DynamoLeaseStore, LeaseError, LeaseKey, LeaseSettings, LeaseStore, NewLease, ShardLeases,
};

async fn store_at(endpoint: String) -> DynamoLeaseStore {
    let config = leasehold_testkit::sdk_config(endpoint).await;
    let config = aws_sdk_dynamodb::config::Builder::from(&config)
        .retry_config(RetryConfig::disabled())
        .timeout_config(TimeoutConfig::builder().operation_attempt_timeout(Duration::from_millis(300)).build())
        .build();
    DynamoLeaseStore::new(aws_sdk_dynamodb::Client::from_conf(config), "leases", LeaseSettings::new("a"))
}

fn new_lease() -> NewLease {
    NewLease {
        key: LeaseKey::new("orders", "shardId-000000000000"),
        checkpoint: Checkpoint::Latest,
        parent_shard_ids: vec![],
        stream_created: None,
    }
}

#[tokio::test]
async fn throttling_is_typed_and_retryable() {
    for error_type in ["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"] {
        let server = FaultServer::start(Fault::Error { status: 400, error_type }).await;
        let store = store_at(server.endpoint()).await;
        let err = store.create_if_absent(&new_lease()).await.expect_err("throttled");
        assert!(matches!(err, LeaseError::Throttled { .. }), "{error_type}: {err:?}");
        assert!(err.is_retryable() && !err.is_not_held(), "{error_type}: {err:?}");
        assert!(err.to_string().contains("throttled"), "{err}");
        assert_eq!(server.requests(), 1);
    }
}

#[tokio::test]
async fn a_hung_call_times_out_as_retryable() {
    let server = FaultServer::start(Fault::Hang).await;
    let store = store_at(server.endpoint()).await;
    let started = std::time::Instant::now();
    let err = store.get(&new_lease().key).await.expect_err("hung");
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err:?}");
    assert!(err.is_retryable() && !err.is_not_held());
    assert!(started.elapsed() < Duration::from_secs(5), "the attempt timeout bounds the call");
}

#[tokio::test]
async fn refused_connections_are_transport_errors() {
    let store = store_at(closed_endpoint().await).await;
    let err = store.list().await.expect_err("nothing listens");
    assert!(matches!(err, LeaseError::Transport { .. }), "{err:?}");
    assert!(err.is_retryable() && !err.is_not_held());
}

#[tokio::test]
async fn server_errors_are_retryable_and_client_errors_are_not() {
    let server = FaultServer::start(Fault::Error { status: 500, error_type: "InternalServerError" }).await;
    let err = store_at(server.endpoint()).await.get(&new_lease().key).await.expect_err("500");
    assert!(matches!(err, LeaseError::Service { retryable: true, .. }), "{err:?}");
    let server = FaultServer::start(Fault::Error { status: 400, error_type: "ValidationException" }).await;
    let err = store_at(server.endpoint()).await.get(&new_lease().key).await.expect_err("400");
    assert!(
        matches!(err, LeaseError::Service { retryable: false, ref code, .. } if code == "ValidationException"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_missing_table_is_named() {
    let client = leasehold_testkit::dynamodb_client().await;
    let store = DynamoLeaseStore::new(client, "no-such-table", LeaseSettings::new("a"));
    let err = store.list().await.expect_err("no table");
    assert!(matches!(err, LeaseError::TableNotFound { ref table } if table == "no-such-table"), "{err:?}");
    assert!(err.to_string().contains("no-such-table"));
}

#[tokio::test]
async fn ensure_table_creates_once_and_waits_until_active() {
    let client = leasehold_testkit::dynamodb_client().await;
    let name = leasehold_testkit::unique_name("ensure");
    let tags = vec![("leasehold.io/owner".to_string(), "shop/orders".to_string())];
    let created = leasehold_worker::lease::ensure_table(&client, &name, &tags, Duration::from_secs(10)).await.unwrap();
    assert!(created);
    let again = leasehold_worker::lease::ensure_table(&client, &name, &tags, Duration::from_secs(10)).await.unwrap();
    assert!(!again, "an existing table is reused");
    let table = client.describe_table().table_name(&name).send().await.unwrap().table.unwrap();
    assert_eq!(table.table_status, Some(aws_sdk_dynamodb::types::TableStatus::Active));
    assert_eq!(table.key_schema.unwrap()[0].attribute_name, "lease_key");
    let store = DynamoLeaseStore::new(client, name, LeaseSettings::new("a"));
    assert!(store.create_if_absent(&new_lease()).await.unwrap());
}
