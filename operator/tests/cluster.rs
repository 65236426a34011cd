//! The operator against a real kube-apiserver, etcd and kube-controller-manager, with kinesalite and
//! dynalite: tables, workers, scaling, status, validation by the API server, deletion policies.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{TestNamespace, aws, wait};

const SLOW: Duration = Duration::from_secs(30);

async fn table_tags(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> Option<Vec<(String, String)>> {
    let arn = dynamodb.describe_table().table_name(table).send().await.ok()?.table?.table_arn?;
    let tags = dynamodb.list_tags_of_resource().resource_arn(arn).send().await.ok()?.tags.unwrap_or_default();
    Some(tags.into_iter().map(|t| (t.key, t.value)).collect())
}

async fn table_exists(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> bool {
    dynamodb.describe_table().table_name(table).send().await.is_ok()
}

#[tokio::test]
async fn a_consumer_gets_its_table_workers_and_a_ready_status() {
    let ns = TestNamespace::new("op-apply").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-apply", 2).await;
    let table = leasehold_testkit::unique_name("op-apply");
    let created = ns
        .create(
            "orders",
            json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
                   "workers": {"replicas": 2}, "processor": {"stdout": {}}}),
        )
        .await
        .expect("create consumer");

    wait("table ACTIVE", SLOW, async || table_exists(&dynamodb, &table).await).await;
    let tags = table_tags(&dynamodb, &table).await.expect("tags");
    for (key, value) in [
        ("leasehold.io/namespace", ns.name.clone()),
        ("leasehold.io/name", "orders".into()),
        ("leasehold.io/uid", created.uid().unwrap()),
    ] {
        assert!(tags.contains(&(key.to_string(), value.clone())), "tag {key}={value} missing in {tags:?}");
    }

    wait("deployment with 2 replicas", SLOW, async || ns.replicas("orders-workers").await == Some(2)).await;
    let deployment = ns.deployments().get("orders-workers").await.unwrap();
    let pod_spec = deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
    assert_eq!(pod_spec.termination_grace_period_seconds, Some(10), "gracefulTimeout 5 s + 5 s");
    let owner = &deployment.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("StreamConsumer", "orders", Some(true)));
    let config_map = Api::<ConfigMap>::namespaced(ns.client.clone(), &ns.name).get("orders-workers").await.unwrap();
    assert_eq!(config_map.owner_references()[0].uid, created.uid().unwrap());
    let worker_yaml = &config_map.data.unwrap()["worker.yaml"];
    assert!(worker_yaml.contains(&stream) && worker_yaml.contains(&table), "{worker_yaml}");

    // The pods pass the restricted Pod Security Standard: the ReplicaSet controller gets them admitted.
    let pods = Api::<Pod>::namespaced(ns.client.clone(), &ns.name);
    wait("2 worker pods admitted", SLOW, async || {
        pods.list(&ListParams::default().labels("leasehold.io/consumer=orders"))
            .await
            .map(|l| l.items.len())
            .unwrap_or(0)
            == 2
    })
    .await;
    wait("table and stream ready, workers not yet", SLOW, async || {
        ns.condition("orders", "TableReady").await.map(|c| c.0).as_deref() == Some("True")
            && ns.condition("orders", "StreamReady").await.map(|c| c.0).as_deref() == Some("True")
            && ns.condition("orders", "WorkersReady").await == Some(("False".into(), "WorkersNotReady".into()))
    })
    .await;

    ns.mark_pods_ready("orders").await;
    wait("Ready", SLOW, async || ns.condition("orders", "Ready").await.map(|c| c.0).as_deref() == Some("True")).await;
    let status = ns.consumers().get("orders").await.unwrap().status.unwrap();
    assert_eq!(status.open_shards, Some(2));
    assert_eq!(status.replicas, Some(2));
    assert_eq!(status.observed_generation, created.metadata.generation);
    assert_eq!(
        status.selector.as_deref(),
        Some("app.kubernetes.io/name=leasehold-worker,leasehold.io/consumer=orders")
    );

    // The spread of leases over workers comes from the lease table.
    let store = leasehold_worker::lease::DynamoLeaseStore::new(
        dynamodb.clone(),
        table.clone(),
        leasehold_worker::lease::LeaseSettings::new("orders-workers-abc"),
    );
    use leasehold_worker::lease::ShardLeases;
    let key = leasehold_worker::lease::LeaseKey::new(stream.as_str(), "shardId-000000000000");
    let row = leasehold_worker::lease::NewLease {
        key: key.clone(),
        checkpoint: leasehold_worker::lease::Checkpoint::TrimHorizon,
        parent_shard_ids: vec![],
        stream_created: None,
    };
    store.create_if_absent(&row).await.unwrap();
    store.acquire(&store.get(&key).await.unwrap().unwrap()).await.unwrap();
    wait("lease spread in status", SLOW, async || {
        let status = ns.consumers().get("orders").await.unwrap().status.unwrap();
        status.leases.iter().any(|w| w.owner == "orders-workers-abc" && w.leases == 1)
    })
    .await;

    // A spec change rolls the workers: the pod template's config hash changes.
    let before =
        deployment.spec.unwrap().template.metadata.unwrap().annotations.unwrap()["leasehold.io/config-hash"].clone();
    ns.consumers()
        .patch("orders", &PatchParams::default(), &Patch::Merge(json!({"spec": {"concurrency": 4}})))
        .await
        .unwrap();
    wait("new config hash", SLOW, async || {
        let d = ns.deployments().get("orders-workers").await.unwrap();
        d.spec.unwrap().template.metadata.unwrap().annotations.unwrap()["leasehold.io/config-hash"] != before
    })
    .await;

    // Paused: no workers.
    ns.consumers()
        .patch("orders", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true}})))
        .await
        .unwrap();
    wait("scaled to zero", SLOW, async || {
        ns.deployments().get("orders-workers").await.unwrap().spec.unwrap().replicas == Some(0)
    })
    .await;
}

#[tokio::test]
async fn autoscaling_follows_a_split() {
    let ns = TestNamespace::new("op-split").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-split", 2).await;
    ns.create(
        "scaled",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": leasehold_testkit::unique_name("op-split")},
               "workers": {"autoscaling": {"shardsPerWorker": 1, "minReplicas": 1, "maxReplicas": 10}},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    wait("2 workers for 2 shards", SLOW, async || ns.replicas("scaled-workers").await == Some(2)).await;
    leasehold_testkit::kinesis::split(&kinesis, &stream, "shardId-000000000000").await;
    wait("3 workers for 3 open shards", SLOW, async || ns.replicas("scaled-workers").await == Some(3)).await;
    wait("status shows 3 open shards", SLOW, async || {
        ns.consumers().get("scaled").await.ok().and_then(|c| c.status).and_then(|s| s.open_shards) == Some(3)
    })
    .await;
}

#[tokio::test]
async fn kubectl_scale_drives_the_workers_when_autoscaling_is_off() {
    let ns = TestNamespace::new("op-scale").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-scale", 1).await;
    ns.create(
        "fixed",
        json!({"streams": [{"name": stream}], "aws": aws(), "workers": {"replicas": 1}, "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    wait("status carries replicas and selector", SLOW, async || {
        ns.consumers()
            .get_scale("fixed")
            .await
            .ok()
            .and_then(|s| s.status)
            .is_some_and(|s| s.replicas == 1 && s.selector.is_some())
    })
    .await;
    ns.consumers()
        .patch_scale("fixed", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 4}})))
        .await
        .expect("scale");
    assert_eq!(ns.consumers().get("fixed").await.unwrap().spec.workers.replicas, Some(4));
    wait("deployment scaled to 4", SLOW, async || ns.replicas("fixed-workers").await == Some(4)).await;
}

/// The base spec of `refused-specs.json` with `patch` applied (a null removes the field).
fn patched(base: &serde_json::Value, patch: &serde_json::Value) -> serde_json::Value {
    let mut spec = base.clone();
    for (key, value) in patch.as_object().expect("a patch is an object") {
        if value.is_null() {
            spec.as_object_mut().expect("object").remove(key);
        } else {
            spec[key] = value.clone();
        }
    }
    spec
}

#[tokio::test]
async fn invalid_specs_are_refused_by_the_api_server_naming_the_field() {
    // The same cases `StreamConsumerSpec::validate` must refuse (crds/tests/refused_specs.rs).
    let all: serde_json::Value =
        serde_json::from_str(include_str!("../../crds/tests/refused-specs.json")).expect("refused-specs.json");
    let ns = TestNamespace::new("op-invalid").await;
    let cases = all["cases"].as_array().expect("cases");
    for (i, case) in cases.iter().enumerate() {
        let spec = patched(&all["base"], &case["patch"]);
        let (field, words) = (case["field"].as_str().unwrap(), case["says"].as_str().unwrap());
        let err =
            ns.create(&format!("bad-{i}"), spec.clone()).await.expect_err(&format!("case {i} must be refused: {spec}"));
        let message = match &err {
            kube::Error::Api(status) => {
                assert_eq!(status.code, 422, "case {i}: {status:?}");
                status.message.clone()
            }
            other => panic!("case {i}: unexpected error {other:?}"),
        };
        assert!(message.contains(field), "case {i}: {message:?} should name {field}");
        assert!(message.contains(words), "case {i}: {message:?} should say {words:?}");
    }
    // And the valid ones are accepted.
    ns.create("good", all["base"].clone()).await.expect("the valid base is accepted");
    for (i, patch) in all["accepted"].as_array().expect("accepted").iter().enumerate() {
        let spec = patched(&all["base"], patch);
        ns.create(&format!("good-{i}"), spec.clone()).await.unwrap_or_else(|e| panic!("{spec} is accepted: {e}"));
    }
}

#[tokio::test]
async fn deletion_keeps_or_deletes_the_table_by_policy_and_proof() {
    let ns = TestNamespace::new("op-delete").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-delete", 1).await;
    let spec = |table: &str, policy: &str| {
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table, "deletionPolicy": policy},
               "processor": {"stdout": {}}})
    };
    let kept = leasehold_testkit::unique_name("op-retain");
    let deleted = leasehold_testkit::unique_name("op-delete");
    // A table someone else created: Delete must not remove it.
    let foreign = leasehold_testkit::create_lease_table(&dynamodb, "op-foreign").await;
    ns.create("retain", spec(&kept, "Retain")).await.unwrap();
    ns.create("delete", spec(&deleted, "Delete")).await.unwrap();
    ns.create("foreign", spec(&foreign, "Delete")).await.unwrap();
    for table in [&kept, &deleted] {
        wait("table created", SLOW, async || table_exists(&dynamodb, table).await).await;
    }
    wait("finalizers in place", SLOW, async || {
        let mut all = true;
        for name in ["retain", "delete", "foreign"] {
            all &= ns
                .consumers()
                .get(name)
                .await
                .is_ok_and(|c| c.finalizers().contains(&"leasehold.io/lease-table".to_string()));
        }
        all
    })
    .await;
    for name in ["retain", "delete", "foreign"] {
        ns.consumers().delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait("resources gone", SLOW, async || {
        let mut gone = true;
        for name in ["retain", "delete", "foreign"] {
            gone &= ns.consumers().get_opt(name).await.ok().flatten().is_none();
        }
        gone
    })
    .await;
    assert!(table_exists(&dynamodb, &kept).await, "Retain keeps the table");
    wait("Delete removes the table it created", SLOW, async || !table_exists(&dynamodb, &deleted).await).await;
    assert!(table_exists(&dynamodb, &foreign).await, "Delete never removes a table it did not create");
}

#[tokio::test]
async fn a_missing_stream_is_reported_in_status() {
    let ns = TestNamespace::new("op-missing").await;
    let missing = leasehold_testkit::unique_name("op-missing");
    ns.create("lost", json!({"streams": [{"name": missing}], "aws": aws(), "processor": {"stdout": {}}}))
        .await
        .unwrap();
    wait("StreamReady False", SLOW, async || {
        ns.condition("lost", "StreamReady").await == Some(("False".into(), "StreamNotFound".into()))
    })
    .await;
    assert_eq!(ns.condition("lost", "Ready").await, Some(("False".into(), "StreamNotFound".into())));
}

/// A namespace with consumer `refused`, whose lease table's DynamoDB refuses the credentials (as AWS
/// does for an unknown access key); the refusing server lives as long as the returned handle.
async fn consumer_with_a_refused_table(prefix: &str) -> (TestNamespace, leasehold_testkit::FaultServer) {
    let ns = TestNamespace::new(prefix).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    let refusing = leasehold_testkit::FaultServer::start(leasehold_testkit::Fault::Error {
        status: 400,
        error_type: "UnrecognizedClientException",
    })
    .await;
    let mut aws = aws();
    aws["dynamodbEndpoint"] = json!(refusing.endpoint());
    ns.create(
        "refused",
        json!({"streams": [{"name": stream}], "aws": aws, "leaseTable": {"name": leasehold_testkit::unique_name(prefix)},
               "processor": {"stdout": {}}}),
    )
    .await
    .unwrap();
    (ns, refusing)
}

#[tokio::test]
async fn bad_credentials_show_in_status_with_the_aws_error() {
    let (ns, _refusing) = consumer_with_a_refused_table("op-creds").await;
    wait("TableReady False with the AWS error", SLOW, async || {
        let Some(current) = ns.consumers().get_opt("refused").await.ok().flatten() else { return false };
        current.status.is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "TableReady"
                    && c.status == "False"
                    && c.reason == "TableError"
                    && c.message.contains("UnrecognizedClientException")
            })
        })
    })
    .await;
    // No workers start without a usable table.
    assert!(ns.deployments().get_opt("refused-workers").await.unwrap().is_none());
}

/// Warning events on `consumer` with `reason`: (objects, highest series count; 1 for a single event).
async fn warnings(ns: &TestNamespace, consumer: &str, reason: &str) -> (usize, i32) {
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(ns.client.clone(), &ns.name);
    let found: Vec<_> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(consumer))
        .collect();
    let count = found.iter().map(|e| e.series.as_ref().map_or(1, |s| s.count)).max().unwrap_or(0);
    (found.len(), count)
}

#[tokio::test]
async fn a_persistent_table_error_backs_off_and_warns_once() {
    let (ns, refusing) = consumer_with_a_refused_table("op-backoff").await;
    wait("the first table failure", SLOW, async || {
        ns.condition("refused", "TableReady").await == Some(("False".into(), "TableError".into()))
    })
    .await;
    // Watch DescribeTable calls for 24 s: a fixed 2 s requeue makes 12 or more; the backoff (2, 4, 8,
    // 16 s, ±20 %) makes at most 5, with gaps that grow.
    let started = std::time::Instant::now();
    let mut calls = vec![(Duration::ZERO, refusing.requests())];
    while started.elapsed() < Duration::from_secs(24) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = refusing.requests();
        if now > calls.last().map_or(0, |c| c.1) {
            calls.push((started.elapsed(), now));
        }
    }
    let total = refusing.requests() - calls[0].1;
    assert!((2..=6).contains(&total), "{total} DescribeTable calls in 24 s: {calls:?}");
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(gaps.iter().any(|g| *g >= Duration::from_secs(6)), "the delay grows: {gaps:?}");
    assert!(ns.ctx.metrics.failures_of("table") >= 3, "failures counted by kind");
    assert_eq!(ns.ctx.metrics.failures_of("apply"), 0);
    assert_eq!(warnings(&ns, "refused", "TableError").await, (1, 1), "one Warning for the whole streak");
}

#[tokio::test]
async fn readiness_follows_the_controller() {
    use leasehold_operator::readiness::ControllerState;
    let ns = TestNamespace::new("op-ready").await;
    wait("the controller runs with its cache filled", SLOW, async || {
        ns.ctx.readiness.state() == ControllerState::Running
    })
    .await;
    assert!(ns.ctx.readiness.is_ready());
    ns.stop_operator();
    wait("stopping once shut down", SLOW, async || ns.ctx.readiness.state() == ControllerState::Stopping).await;
    assert!(!ns.ctx.readiness.is_ready());
}

#[tokio::test]
async fn the_operator_binary_serves_readyz_once_running_and_metrics_by_kind() {
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "op-readyz", false).await;
    let addr = format!("127.0.0.1:{}", support::free_port());
    let mut operator = support::start_operator(support::operator_command(
        std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-operator")),
        &ns,
        &support::kubeconfig_path(),
        "1s",
        &addr,
    ));
    wait("/readyz 200", SLOW, async || {
        leasehold_testkit::server::try_http_get(&addr, "/readyz").await.map(|r| r.0) == Some(200)
    })
    .await;
    assert_eq!(leasehold_testkit::server::try_http_get(&addr, "/healthz").await.map(|r| r.0), Some(200));
    // A consumer whose stream is missing fails in the observe stage, counted under that kind.
    let missing = leasehold_testkit::unique_name("op-readyz");
    Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns)
        .create(
            &kube::api::PostParams::default(),
            &support::stand_in_consumer(
                "lost",
                json!({"streams": [{"name": missing}], "aws": aws(), "processor": {"stdout": {}}}),
            ),
        )
        .await
        .unwrap();
    wait("an observe failure in /metrics", SLOW, async || {
        leasehold_testkit::server::try_http_get(&addr, "/metrics")
            .await
            .is_some_and(|(_, body)| body.contains(r#"leasehold_operator_reconcile_failures_total{kind="observe"}"#))
    })
    .await;
    // SIGTERM: a clean exit.
    let pid = operator.id().to_string();
    std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    let status = tokio::task::spawn_blocking(move || operator.wait()).await.unwrap().expect("wait");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_table_that_is_not_a_lease_table_is_refused_in_status() {
    let ns = TestNamespace::new("op-notlease").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-notlease", 1).await;
    // Somebody else's table, keyed by `id`: the operator must neither read its rows nor run workers on it.
    let table = leasehold_testkit::unique_name("op-notlease");
    dynamodb
        .create_table()
        .table_name(&table)
        .key_schema(
            aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(aws_sdk_dynamodb::types::KeyType::Hash)
                .build()
                .unwrap(),
        )
        .attribute_definitions(
            aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(aws_sdk_dynamodb::types::ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .billing_mode(aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create a foreign table");
    ns.create(
        "foreign",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table}, "processor": {"stdout": {}}}),
    )
    .await
    .unwrap();
    wait("TableReady False NotALeaseTable", SLOW, async || {
        ns.condition("foreign", "TableReady").await == Some(("False".into(), "NotALeaseTable".into()))
    })
    .await;
    wait("a Warning event naming the refusal", SLOW, async || warnings(&ns, "foreign", "NotALeaseTable").await.0 >= 1)
        .await;
    assert!(ns.deployments().get_opt("foreign-workers").await.unwrap().is_none(), "no workers on a foreign table");
    assert!(table_exists(&dynamodb, &table).await, "the foreign table is left as it was");
}
