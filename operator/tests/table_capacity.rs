//! `billingMode: PROVISIONED` on dynalite: the operator sizes the lease table from the open shards and
//! the lease timings (docs/capacity.md), resizes it when the stream is resharded, applies
//! `leaseTable.readCapacity` / `writeCapacity` when set, and says so with the `TableCapacity` condition
//! (False, `UnderProvisioned`, with a Warning event) when the table holds less than the group needs.

mod support;

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ProvisionedThroughput, ScalarAttributeType,
};
use aws_sdk_kinesis::types::ScalingType;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use leasehold_crds::{LeaseScan, StreamConsumerSpec};
use leasehold_operator::pipeline::table_capacity::{Capacity, Group, demand};
use serde_json::json;
use support::{TestNamespace, wait};

const SLOW: Duration = Duration::from_secs(90);

/// The lease timings' defaults, with the test operator's 1 s poll interval.
fn group(shards: u32) -> Group {
    let spec: StreamConsumerSpec =
        serde_json::from_value(json!({"streams": [{"name": "s"}], "processor": {"stdout": {}}})).expect("spec");
    let resolved = spec.validate().expect("valid");
    assert_eq!(resolved.lease_scan, LeaseScan::Segmented);
    Group::of(&resolved, shards, 1, Duration::from_secs(1))
}

async fn provisioned(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> Option<Capacity> {
    let out = dynamodb.describe_table().table_name(table).send().await.ok()?;
    let throughput = out.table?.provisioned_throughput?;
    Some(Capacity { read: throughput.read_capacity_units?, write: throughput.write_capacity_units? })
}

/// Notes of the events on `consumer` with `type_` and `reason`.
async fn events(ns: &TestNamespace, consumer: &str, type_: &str, reason: &str) -> Vec<String> {
    let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name);
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some(type_))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(consumer))
        .filter_map(|e| e.note)
        .collect()
}

/// AWS settings reaching kinesis-mock (it has UpdateShardCount) for Kinesis and dynalite for DynamoDB.
fn mock_aws() -> serde_json::Value {
    let mut aws = support::aws();
    aws["kinesisEndpoint"] = json!(leasehold_testkit::endpoint(leasehold_testkit::Service::KinesisMock));
    aws
}

#[tokio::test]
async fn a_provisioned_table_is_sized_for_sixteen_busy_shards_and_resized_on_resharding() {
    let ns = TestNamespace::new("op-tablecap").await;
    let kinesis = leasehold_testkit::kinesis_mock_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-tablecap", 16).await;
    let table = leasehold_testkit::unique_name("op-tablecap");
    ns.create(
        "sized",
        json!({"streams": [{"name": stream}], "aws": mock_aws(),
               "leaseTable": {"name": table, "billingMode": "PROVISIONED", "deletionPolicy": "Delete"},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");

    // The bar, computed and asserted: 16 shards renewing every 3 s and checkpointing every 1 s
    // (every shard busy), the heartbeat, the term and every read the group and the operator make.
    let sixteen = demand(&group(16));
    assert!(sixteen.writes() > 21.0, "16 x (1/3 + 1) WCU and more: {sixteen:?}");
    let want = Capacity::sized(&sixteen);
    wait("the table sized for 16 shards", SLOW, || async { provisioned(&dynamodb, &table).await == Some(want) }).await;
    assert!(want.covers(&Capacity::floor(&sixteen)) && want.write > 10, "{want} over the old fixed 10 / 10");
    wait("TableCapacity True, Sized", SLOW, || async {
        ns.condition("sized", "TableCapacity").await == Some(("True".into(), "Sized".into()))
    })
    .await;

    // Resharding 16 -> 32 raises it at once.
    kinesis
        .update_shard_count()
        .stream_name(&stream)
        .target_shard_count(32)
        .scaling_type(ScalingType::UniformScaling)
        .send()
        .await
        .expect("UpdateShardCount");
    leasehold_testkit::kinesis::wait_active(&kinesis, &stream).await;
    let thirty_two = Capacity::sized(&demand(&group(32)));
    assert!(thirty_two.write > want.write);
    wait("the table resized for 32 shards", SLOW, || async {
        provisioned(&dynamodb, &table).await == Some(thirty_two)
    })
    .await;
    let resized = events(&ns, "sized", "Normal", "TableResized").await;
    assert!(resized.iter().any(|n| n.contains(&format!("-> {thirty_two}"))), "{resized:?}");

    // Back to 16: the table holds less than twice what 16 need, so no decrease is spent on it (DynamoDB
    // allows 4 a day, then one an hour).
    kinesis
        .update_shard_count()
        .stream_name(&stream)
        .target_shard_count(16)
        .scaling_type(ScalingType::UniformScaling)
        .send()
        .await
        .expect("UpdateShardCount");
    leasehold_testkit::kinesis::wait_active(&kinesis, &stream).await;
    wait("the group counted at 16 open shards again", SLOW, || async {
        let status = ns.consumers().get("sized").await.ok().and_then(|c| c.status);
        status.and_then(|s| s.open_shards) == Some(16)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(provisioned(&dynamodb, &table).await, Some(thirty_two), "kept: a decrease is not worth spending");
    assert_eq!(ns.condition("sized", "TableCapacity").await, Some(("True".into(), "Sized".into())));
}

#[tokio::test]
async fn capacity_set_too_low_or_a_table_made_elsewhere_is_reported_under_provisioned() {
    let ns = TestNamespace::new("op-tablelow").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-tablelow", 16).await;

    // The schema refuses capacity figures without PROVISIONED.
    let refused = ns
        .create(
            "refused",
            json!({"streams": [{"name": stream}], "aws": support::aws(),
                   "leaseTable": {"name": leasehold_testkit::unique_name("op-refused"), "writeCapacity": 5},
                   "processor": {"stdout": {}}}),
        )
        .await
        .expect_err("refused");
    assert!(refused.to_string().contains("need billingMode: PROVISIONED"), "{refused}");

    // Figures set by hand are applied, and a too-low one is reported.
    let table = leasehold_testkit::unique_name("op-tablelow");
    ns.create(
        "low",
        json!({"streams": [{"name": stream}], "aws": support::aws(),
               "leaseTable": {"name": table, "billingMode": "PROVISIONED", "deletionPolicy": "Delete",
                              "readCapacity": 50, "writeCapacity": 5},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    wait("TableCapacity False, UnderProvisioned", SLOW, || async {
        ns.condition("low", "TableCapacity").await == Some(("False".into(), "UnderProvisioned".into()))
    })
    .await;
    assert_eq!(provisioned(&dynamodb, &table).await, Some(Capacity { read: 50, write: 5 }), "the spec's own figures");
    let floor = Capacity::floor(&demand(&group(16)));
    let warnings = events(&ns, "low", "Warning", "UnderProvisioned").await;
    assert!(
        warnings.iter().any(|n| n.contains("holds 50 RCU / 5 WCU") && n.contains(&format!("needs {floor}"))),
        "{warnings:?}"
    );
    // Ready is not held back: a throttled table still serves (no kubelet here, so it waits for workers).
    let ready = ns.condition("low", "Ready").await.expect("Ready");
    assert_ne!(ready.1, "UnderProvisioned");

    // Raised in the spec: applied, and the condition clears.
    ns.consumers()
        .patch("low", &PatchParams::default(), &Patch::Merge(json!({"spec": {"leaseTable": {"writeCapacity": 40}}})))
        .await
        .expect("patch");
    wait("the spec's raise applied", SLOW, || async {
        provisioned(&dynamodb, &table).await == Some(Capacity { read: 50, write: 40 })
    })
    .await;
    wait("TableCapacity True", SLOW, || async {
        ns.condition("low", "TableCapacity").await == Some(("True".into(), "Sized".into()))
    })
    .await;

    // A provisioned table made elsewhere (no tags naming the resource) is reported, never resized.
    let elsewhere = leasehold_testkit::unique_name("op-elsewhere");
    dynamodb
        .create_table()
        .table_name(&elsewhere)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("lease_key")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("definition"),
        )
        .key_schema(
            KeySchemaElement::builder().attribute_name("lease_key").key_type(KeyType::Hash).build().expect("key"),
        )
        .billing_mode(BillingMode::Provisioned)
        .provisioned_throughput(
            ProvisionedThroughput::builder()
                .read_capacity_units(2)
                .write_capacity_units(2)
                .build()
                .expect("throughput"),
        )
        .send()
        .await
        .expect("create table");
    ns.create(
        "elsewhere",
        json!({"streams": [{"name": stream}], "aws": support::aws(),
               "leaseTable": {"name": elsewhere, "billingMode": "PROVISIONED"},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    wait("TableCapacity False for the table made elsewhere", SLOW, || async {
        ns.condition("elsewhere", "TableCapacity").await == Some(("False".into(), "UnderProvisioned".into()))
    })
    .await;
    let status = ns.consumers().get("elsewhere").await.expect("consumer").status.expect("status");
    let message = status.conditions.iter().find(|c| c.type_ == "TableCapacity").map(|c| c.message.clone());
    assert!(
        message.as_deref().is_some_and(|m| m.contains("resizes only a table this resource created")),
        "{message:?}"
    );
    assert_eq!(provisioned(&dynamodb, &elsewhere).await, Some(Capacity { read: 2, write: 2 }), "left as it is");
    dynamodb.delete_table().table_name(&elsewhere).send().await.expect("delete");
}
