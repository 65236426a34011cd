//! Enhanced fan-out on the operator's side, on the real kube-apiserver with the testkit's fan-out
//! server standing in for Kinesis: the stream consumer is registered on apply (once, however many
//! reconciles), workers start only once it is ACTIVE and are told its name, and deletion deregisters
//! exactly the consumers this resource registered.

mod support;

use std::time::Duration;

use kube::ResourceExt;
use kube::api::DeleteParams;
use leasehold_operator::pipeline::stream_consumers::REGISTERED_ANNOTATION;
use leasehold_testkit::fanout::{FanOutControls, FanOutServer};
use serde_json::json;
use support::{TestNamespace, wait};

const SLOW: Duration = Duration::from_secs(60);

/// `spec.aws` with Kinesis at the fan-out server.
fn fan_out_aws(server: &FanOutServer) -> serde_json::Value {
    let mut aws = support::aws();
    aws["kinesisEndpoint"] = json!(server.endpoint());
    aws
}

async fn stream_arn(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> String {
    let summary = kinesis.describe_stream_summary().stream_name(stream).send().await.expect("summary");
    summary.stream_description_summary.expect("summary").stream_arn
}

/// The consumers registered now on the stream `arn`.
fn on_stream(controls: &FanOutControls, arn: &str) -> Vec<String> {
    controls.registered_consumers().into_iter().filter(|c| c.starts_with(&format!("{arn}/consumer/"))).collect()
}

async fn wait_gone(ns: &TestNamespace, name: &str) {
    wait(&format!("{name} deleted (finalizer done)"), SLOW, async || {
        ns.consumers().get_opt(name).await.ok().flatten().is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_on_apply_once_then_deregistered_on_delete() {
    let ns = TestNamespace::new("op-fanout").await;
    let server = FanOutServer::start(&leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis))
        .await
        .expect("fan-out server");
    let controls = server.controls();
    // Long enough to see the workers wait for it.
    controls.set_consumer_transition(Duration::from_secs(5));
    let kinesis = leasehold_testkit::kinesis_client().await;
    let first = leasehold_testkit::create_stream(&kinesis, "op-fo", 1).await;
    let second = leasehold_testkit::create_stream(&kinesis, "op-fo", 2).await;
    let (first_arn, second_arn) = (stream_arn(&kinesis, &first).await, stream_arn(&kinesis, &second).await);
    ns.create(
        "orders",
        json!({"streams": [{"name": first}, {"name": second}], "aws": fan_out_aws(&server),
               "leaseTable": {"name": leasehold_testkit::unique_name("op-fo")},
               "reader": {"mode": "fanOut"}, "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    let expected_name = format!("{}.orders", ns.name);

    wait("the consumer registered on both streams", SLOW, async || {
        on_stream(&controls, &first_arn).len() == 1 && on_stream(&controls, &second_arn).len() == 1
    })
    .await;
    wait("ConsumerReady=False while CREATING", SLOW, async || {
        ns.condition("orders", "ConsumerReady").await == Some(("False".into(), "ConsumerNotActive".into()))
    })
    .await;
    assert_eq!(ns.replicas("orders-workers").await, None, "no workers before the consumer is ACTIVE");
    wait("ConsumerReady", SLOW, async || {
        ns.condition("orders", "ConsumerReady").await == Some(("True".into(), "Active".into()))
    })
    .await;
    wait("the workers", SLOW, async || ns.replicas("orders-workers").await.is_some()).await;
    let registered = controls.registered_consumers();
    for arn in &registered {
        assert!(arn.contains(&format!("/consumer/{expected_name}:")), "{arn}");
    }
    // The workers are told the name the operator registered.
    let config_maps = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(ns.client.clone(), &ns.name);
    let config = config_maps.get("orders-workers").await.expect("config map");
    let text = config.data.unwrap_or_default().into_values().collect::<String>();
    assert!(text.contains(&format!("consumerName: {expected_name}")), "{text}");
    // The proof of ownership: both ARNs recorded on the resource.
    let resource = ns.consumers().get("orders").await.expect("consumer");
    let recorded: Vec<String> =
        serde_json::from_str(resource.annotations().get(REGISTERED_ANNOTATION).expect("annotation")).expect("json");
    let mut sorted = recorded.clone();
    sorted.sort();
    let mut expected = registered.clone();
    expected.sort();
    assert_eq!(sorted, expected);

    // Idempotent: reconciles every second (the shard poll interval) register nothing more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(controls.registered_consumers(), registered, "no second registration");
    let listed = kinesis_through(&server).await.list_stream_consumers().stream_arn(&first_arn).send().await;
    assert_eq!(listed.expect("list").consumers.unwrap_or_default().len(), 1);

    ns.consumers().delete("orders", &DeleteParams::default()).await.expect("delete");
    wait_gone(&ns, "orders").await;
    assert!(on_stream(&controls, &first_arn).is_empty() && on_stream(&controls, &second_arn).is_empty());
    assert_eq!(ns.replicas("orders-workers").await, None, "the workers were stopped first");
}

async fn kinesis_through(server: &FanOutServer) -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::new(&leasehold_testkit::sdk_config(server.endpoint()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_it_did_not_register_is_left_alone() {
    let ns = TestNamespace::new("op-fanout-kept").await;
    let server = FanOutServer::start(&leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis))
        .await
        .expect("fan-out server");
    let controls = server.controls();
    let kinesis = leasehold_testkit::kinesis_client().await;
    let ours = leasehold_testkit::create_stream(&kinesis, "op-fo-ours", 1).await;
    let theirs = leasehold_testkit::create_stream(&kinesis, "op-fo-theirs", 1).await;
    let (ours_arn, theirs_arn) = (stream_arn(&kinesis, &ours).await, stream_arn(&kinesis, &theirs).await);
    // Someone registered the very name the operator will use, on one of the two streams.
    let name = format!("{}.mixed", ns.name);
    let client = kinesis_through(&server).await;
    let foreign = client.register_stream_consumer().stream_arn(&theirs_arn).consumer_name(&name).send().await;
    let foreign = foreign.expect("register").consumer.expect("consumer").consumer_arn;

    ns.create(
        "mixed",
        json!({"streams": [{"name": ours}, {"name": theirs}], "aws": fan_out_aws(&server),
               "leaseTable": {"name": leasehold_testkit::unique_name("op-fo")},
               "reader": {"mode": "fanOut"}, "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    wait("ConsumerReady", SLOW, async || {
        ns.condition("mixed", "ConsumerReady").await == Some(("True".into(), "Active".into()))
    })
    .await;
    assert_eq!(on_stream(&controls, &theirs_arn), vec![foreign.clone()], "the existing one is used");
    let registered = on_stream(&controls, &ours_arn);
    assert_eq!(registered.len(), 1);
    let resource = ns.consumers().get("mixed").await.expect("consumer");
    let recorded: Vec<String> =
        serde_json::from_str(resource.annotations().get(REGISTERED_ANNOTATION).expect("annotation")).expect("json");
    assert_eq!(recorded, registered, "only what it registered is recorded");

    ns.consumers().delete("mixed", &DeleteParams::default()).await.expect("delete");
    wait_gone(&ns, "mixed").await;
    assert!(on_stream(&controls, &ours_arn).is_empty(), "its own consumer deregistered");
    assert_eq!(on_stream(&controls, &theirs_arn), vec![foreign], "the foreign one left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_consumer_registers_nothing() {
    let ns = TestNamespace::new("op-fanout-poll").await;
    let server = FanOutServer::start(&leasehold_testkit::endpoint(leasehold_testkit::Service::Kinesis))
        .await
        .expect("fan-out server");
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-fo-poll", 1).await;
    ns.create(
        "plain",
        json!({"streams": [{"name": stream}], "aws": fan_out_aws(&server),
               "leaseTable": {"name": leasehold_testkit::unique_name("op-fo")}, "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    wait("the workers", SLOW, async || ns.replicas("plain-workers").await.is_some()).await;
    assert_eq!(ns.condition("plain", "ConsumerReady").await, Some(("True".into(), "Polling".into())));
    assert!(server.controls().registered_consumers().is_empty());
}
