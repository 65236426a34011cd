//! [`reconcile`] and [`error_policy`] against a mocked API server (kube-rs/controller-rs's fixture
//! approach): a `tower_test` service pair behind a real `kube::Client`, answering the requests a
//! scenario expects in order and failing on any other. These run with no cluster and no AWS; the
//! control-plane tests (`operator/tests/`) run the same code against a real kube-apiserver.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::{Client, Resource, ResourceExt};
use leasehold_crds::{StreamConsumer, StreamConsumerSpec};
use serde_json::{Value, json};

use super::{error_policy, reconcile};
use crate::FINALIZER;
use crate::context::{Context, Settings};
use crate::error::Error;
use crate::metrics::Metrics;

const NAMESPACE: &str = "shop";
const NAME: &str = "orders";
const SHARD_POLL: Duration = Duration::from_secs(1);

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The mocked API server's side: takes each request the code under test sends, checks it is the one
/// expected next, and answers it.
struct ApiServerVerifier(ApiServerHandle);

impl ApiServerVerifier {
    /// The next request, which must come within a few seconds: (method, path and query, JSON body).
    async fn next(&mut self) -> (Method, String, Value, tower_test::mock::SendResponse<Response<Body>>) {
        let (request, send) = tokio::time::timeout(Duration::from_secs(5), self.0.next_request())
            .await
            .expect("a request within 5 s")
            .expect("the client is still alive");
        let method = request.method().clone();
        let uri = request.uri().to_string();
        let bytes = request.into_body().collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
        (method, uri, body, send)
    }

    /// No request comes for a while.
    async fn expect_silence(&mut self) {
        let next = tokio::time::timeout(Duration::from_millis(300), self.0.next_request()).await;
        assert!(next.is_err(), "no request expected");
    }

    /// The JSON patch adding the finalizer to an object that has none; answered with the object.
    async fn finalizer_added(&mut self, consumer: &StreamConsumer) {
        let (method, uri, body, send) = self.next().await;
        assert_eq!(method, Method::PATCH);
        assert_eq!(uri, format!("{}?", object_path()));
        assert_eq!(
            body,
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        );
        let mut patched = consumer.clone();
        patched.meta_mut().finalizers = Some(vec![FINALIZER.into()]);
        send.send_response(json_response(&patched));
    }

    /// The JSON patch removing the finalizer (the first and only one); answered with the object.
    async fn finalizer_removed(&mut self, consumer: &StreamConsumer) {
        let (method, uri, body, send) = self.next().await;
        assert_eq!(method, Method::PATCH);
        assert_eq!(uri, format!("{}?", object_path()));
        assert_eq!(
            body,
            json!([{"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                   {"op": "remove", "path": "/metadata/finalizers/0"}])
        );
        let mut patched = consumer.clone();
        patched.meta_mut().finalizers = None;
        send.send_response(json_response(&patched));
    }

    /// The status written by server-side apply under the operator's field manager; returns the
    /// conditions it wrote.
    async fn status_applied(&mut self, consumer: &StreamConsumer) -> Vec<Value> {
        let (method, uri, body, send) = self.next().await;
        assert_eq!(method, Method::PATCH);
        assert_eq!(uri, format!("{}/status?&force=true&fieldManager=leasehold-operator", object_path()));
        assert_eq!(body["kind"], "StreamConsumer");
        send.send_response(json_response(consumer));
        body["status"]["conditions"].as_array().cloned().unwrap_or_default()
    }

    /// An event created on the consumer; returns it.
    async fn event_created(&mut self) -> Value {
        let (method, uri, body, send) = self.next().await;
        assert_eq!(method, Method::POST);
        assert_eq!(uri, format!("/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events?"));
        send.send_response(json_response(&body));
        body
    }
}

fn object_path() -> String {
    format!("/apis/leasehold.io/v1alpha1/namespaces/{NAMESPACE}/streamconsumers/{NAME}")
}

fn json_response(body: &impl serde::Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("serializable");
    Response::builder().body(Body::from(bytes)).expect("a response")
}

/// A context whose Kubernetes client talks to the returned mocked API server.
fn mocked() -> (Arc<Context>, ApiServerVerifier) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, NAMESPACE);
    let settings = Settings {
        worker_image: "leasehold-worker:test".into(),
        shard_poll_interval: SHARD_POLL,
        static_credentials: Some(("test".into(), "test".into())),
        restrict_templates: false,
        worker_network_policy: None,
    };
    (Arc::new(Context::new(client, settings, Metrics::default())), ApiServerVerifier(handle))
}

/// A StreamConsumer of `spec` (YAML) as read from the API server.
fn consumer(spec: &str) -> StreamConsumer {
    let spec: StreamConsumerSpec = serde_yaml_ng::from_str(spec).expect("a spec");
    let mut consumer = StreamConsumer::new(NAME, spec);
    let meta = consumer.meta_mut();
    meta.namespace = Some(NAMESPACE.into());
    meta.uid = Some("0b9e0c1e-7d55-4a1b-9b7e-5a3c2f1d0e01".into());
    meta.generation = Some(1);
    consumer
}

fn with_finalizer(mut consumer: StreamConsumer) -> StreamConsumer {
    consumer.meta_mut().finalizers = Some(vec![FINALIZER.into()]);
    consumer
}

/// Runs `reconcile` while `server` answers; returns both outcomes.
async fn reconciled<T>(
    consumer: StreamConsumer,
    ctx: &Arc<Context>,
    server: impl std::future::Future<Output = T>,
) -> (crate::error::Result<Action>, T) {
    tokio::join!(reconcile(Arc::new(consumer), ctx.clone()), server)
}

const VALID: &str = "streams: [{name: orders}]\nleaseTable: {name: orders-leases}\nprocessor: {stdout: {}}";
/// Passes the CRD's schema but not the rules (`StreamConsumerSpec::validate`).
const INVALID: &str = "streams: [{name: orders}, {name: orders}]\nprocessor: {stdout: {}}";

#[tokio::test]
async fn a_new_consumer_first_gets_the_finalizer_and_nothing_else() {
    let (ctx, mut server) = mocked();
    let fresh = consumer(VALID);
    let (result, ()) = reconciled(fresh.clone(), &ctx, server.finalizer_added(&fresh)).await;
    assert_eq!(result.expect("reconciled"), Action::await_change(), "the patch itself triggers the next reconcile");
    server.expect_silence().await;
    assert_eq!(ctx.metrics.reconciles.get(), 1);
}

#[tokio::test]
async fn an_invalid_spec_writes_its_condition_and_fails_without_touching_anything_else() {
    let (ctx, mut server) = mocked();
    let invalid = with_finalizer(consumer(INVALID));
    let (result, conditions) = reconciled(invalid.clone(), &ctx, server.status_applied(&invalid)).await;
    let error = result.expect_err("an invalid spec fails the reconcile");
    assert!(matches!(error, Error::InvalidSpec(_)), "{error:?}");
    assert_eq!(conditions.len(), 5, "every condition written: {conditions:?}");
    for condition in &conditions {
        assert_eq!((&condition["status"], &condition["reason"]), (&json!("False"), &json!("InvalidSpec")));
        assert!(condition["message"].as_str().unwrap_or_default().contains("spec.streams[1].name"), "{condition}");
    }
    server.expect_silence().await;
}

#[tokio::test]
async fn a_deleted_consumer_keeping_its_table_loses_its_finalizer() {
    let (ctx, mut server) = mocked();
    let mut deleted = with_finalizer(consumer(
        "streams: [{name: orders}]\nleaseTable: {name: orders-leases, deletionPolicy: Retain}\nprocessor: {stdout: {}}",
    ));
    deleted.meta_mut().deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let (result, ()) = reconciled(deleted.clone(), &ctx, server.finalizer_removed(&deleted)).await;
    assert_eq!(result.expect("cleaned up"), Action::await_change());
    server.expect_silence().await;
}

#[tokio::test]
async fn error_policy_announces_a_failure_once_and_waits_for_a_change_of_an_invalid_spec() {
    let (ctx, mut server) = mocked();
    let invalid = Arc::new(with_finalizer(consumer(INVALID)));
    let error = Error::InvalidSpec(vec![leasehold_crds::FieldError {
        field: "spec.streams[1].name".into(),
        message: "repeats spec.streams[0]".into(),
    }]);

    assert_eq!(error_policy(invalid.clone(), &error, ctx.clone()), Action::await_change());
    let event = server.event_created().await;
    assert_eq!((&event["type"], &event["reason"]), (&json!("Warning"), &json!("InvalidSpec")));
    assert_eq!(event["regarding"]["name"], NAME);

    assert_eq!(error_policy(invalid.clone(), &error, ctx.clone()), Action::await_change());
    server.expect_silence().await;
    assert_eq!(ctx.metrics.failures_of("validate"), 2, "every failure counted, one announced");
}

#[tokio::test]
async fn error_policy_looks_at_a_missing_stream_again_within_a_shard_poll() {
    let (ctx, mut server) = mocked();
    let missing = Arc::new(with_finalizer(consumer(VALID)));
    let error = Error::StreamNotFound(vec!["orders".into()]);
    // The first backoff is 2 s and more; a missing stream is looked at again every shard poll anyway.
    assert_eq!(error_policy(missing.clone(), &error, ctx.clone()), Action::requeue(SHARD_POLL));
    let event = server.event_created().await;
    assert_eq!(event["reason"], "StreamNotFound");
    assert_eq!(ctx.metrics.failures_of("observe"), 1);
    assert!(missing.meta().deletion_timestamp.is_none() && missing.finalizers().len() == 1);
}

/// A deleted fan-out consumer that recorded a stream consumer it registered, keeping its table.
fn deleted_fan_out() -> StreamConsumer {
    let mut deleted = with_finalizer(consumer(
        "streams: [{name: orders}]\nreader: {mode: fanOut}\n\
         leaseTable: {name: orders-leases, deletionPolicy: Delete}\nprocessor: {stdout: {}}",
    ));
    deleted.meta_mut().deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let arn = "arn:aws:kinesis:us-east-1:000000000000:stream/orders/consumer/shop.orders:1700000000";
    deleted.annotations_mut().insert(
        crate::pipeline::stream_consumers::REGISTERED_ANNOTATION.into(),
        serde_json::to_string(&[arn]).expect("a JSON list"),
    );
    deleted
}

/// The workers' Deployment as the API server shows it, being deleted since `since` or not.
fn workers_deployment(since: Option<k8s_openapi::jiff::Timestamp>) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": format!("{NAME}-workers"), "namespace": NAMESPACE,
                        "deletionTimestamp": since.map(Time), "finalizers": ["foregroundDeletion"]}})
}

fn deployment_path() -> String {
    format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}-workers")
}

#[tokio::test]
async fn a_deletion_stops_the_workers_by_requeueing_never_sleeping_and_touches_nothing_else_meanwhile() {
    let (ctx, mut server) = mocked();
    let deleted = deleted_fan_out();
    // First pass: the Deployment is there, not yet being deleted: deleted in the foreground, then requeued.
    let first = async {
        let (method, uri, _, send) = server.next().await;
        assert_eq!((method, uri), (Method::GET, deployment_path()));
        send.send_response(json_response(&workers_deployment(None)));
        let (method, uri, body, send) = server.next().await;
        assert_eq!((method, uri.split('?').next().map(str::to_string)), (Method::DELETE, Some(deployment_path())));
        assert_eq!(body["propagationPolicy"], "Foreground", "{body}");
        send.send_response(json_response(&workers_deployment(Some(k8s_openapi::jiff::Timestamp::now()))));
    };
    let pass = tokio::time::timeout(Duration::from_secs(5), reconciled(deleted.clone(), &ctx, first));
    let (result, ()) = pass.await.expect("the reconcile returns promptly");
    assert_eq!(result.expect("a requeue, not a failure"), Action::requeue(super::WORKERS_STOP_POLL));
    server.expect_silence().await;
    // Next pass: still being deleted (its pods are going): requeued again; no finalizer removed, no event.
    let second = async {
        let (method, uri, _, send) = server.next().await;
        assert_eq!((method, uri), (Method::GET, deployment_path()));
        send.send_response(json_response(&workers_deployment(Some(k8s_openapi::jiff::Timestamp::now()))));
    };
    let pass = tokio::time::timeout(Duration::from_secs(5), reconciled(deleted.clone(), &ctx, second));
    let (result, ()) = pass.await.expect("the reconcile returns promptly");
    assert_eq!(result.expect("a requeue, not a failure"), Action::requeue(super::WORKERS_STOP_POLL));
    server.expect_silence().await;
    assert_eq!(ctx.metrics.reconciles.get(), 2);
    assert_eq!(ctx.metrics.failures_of("cleanup"), 0, "waiting for the workers is not a failure");
}

#[tokio::test]
async fn each_stage_s_error_is_counted_under_its_own_kind() {
    let (ctx, mut server) = mocked();
    let object = Arc::new(with_finalizer(consumer(VALID)));
    let status = || kube::Error::Api(Box::new(kube::core::Status::failure("refused", "Forbidden")));
    let by_stage = [
        ("validate", Error::TemplateRefused(vec!["hostNetwork".into()])),
        ("table", Error::NotLeaseTable { table: "t".into(), found: "key id (HASH)".into() }),
        ("streams", Error::EnsureStream("orders: LimitExceededException".into())),
        ("consumer", Error::ConsumerStreamNotFound(vec!["orders".into()])),
        ("observe", Error::Stream("orders: ThrottlingException".into())),
        ("build", Error::Build(serde_yaml_ng::from_str::<u8>("[").expect_err("not YAML"))),
        ("apply", Error::Apply { object: "Deployment/orders-workers".into(), source: status() }),
        ("status", Error::Status(status())),
        ("cleanup", Error::WorkersRunning("deleting orders-workers: refused".into())),
    ];
    for (kind, error) in &by_stage {
        assert_eq!(error.kind(), *kind, "{error:?}");
        error_policy(object.clone(), error, ctx.clone());
        // The Warning event (created, or a series patched): answered, whatever its form.
        let (_, _, body, send) = server.next().await;
        send.send_response(json_response(&body));
    }
    let text = ctx.metrics.text();
    for (kind, _) in &by_stage {
        let line = format!("leasehold_operator_reconcile_failures_total{{kind=\"{kind}\"}} 1");
        assert!(text.contains(&line), "{kind} counted once under its own kind: {text}");
    }
}
