//! `leasehold redrive namespace/name` on the local control plane (`tests/ground/control-plane.sh
//! start`): the destinations come from the StreamConsumer's spec, the records go back to its stream,
//! and a `Redriven` event lands on the StreamConsumer.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt, ResourceExt};
use leasehold_crds::StreamConsumer;
use leasehold_testkit::kinesis::{open_shards, put_records, read_shard};
use leasehold_testkit::{Service, endpoint};

fn kubeconfig() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| leasehold_testkit::state_dir().join("control-plane/kubeconfig"))
}

async fn client() -> Client {
    let path = kubeconfig();
    let config = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "no kubeconfig at {} ({e}): start the local control plane with `tests/ground/control-plane.sh start`",
            path.display()
        )
    });
    let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await.expect("kubeconfig");
    let client = Client::try_from(config).expect("client");
    client.apiserver_version().await.unwrap_or_else(|e| panic!("kube-apiserver is not answering ({e})"));
    client
}

async fn install_crd(client: &Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = StreamConsumer::crd();
    crds.patch(&crd.name_any(), &PatchParams::apply("leasehold-cli-tests").force(), &Patch::Apply(&crd))
        .await
        .expect("apply CRD");
    wait_for("the CRD is established", Duration::from_secs(20), async || {
        crds.get(&crd.name_any())
            .await
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    })
    .await;
}

#[test]
fn a_redrive_by_name_reads_the_spec_and_posts_an_event() {
    run_test(async {
        let kube = client().await;
        install_crd(&kube).await;
        let ns = leasehold_testkit::unique_name("redrive").to_lowercase();
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
        Api::<Namespace>::all(kube.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "redrive-k8s", 1).await;
        let dead = leasehold_testkit::create_stream(&kinesis, "redrive-k8s-dlq", 1).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "redrive-k8s").await;
        let consumer: StreamConsumer = serde_json::from_value(serde_json::json!({
            "apiVersion": "leasehold.io/v1alpha1", "kind": "StreamConsumer",
            "metadata": {"name": "orders"},
            "spec": {
                "streams": [{"name": stream}],
                "aws": {"region": "us-east-1", "kinesisEndpoint": endpoint(Service::Kinesis), "dynamodbEndpoint": endpoint(Service::DynamoDb)},
                "leaseTable": {"name": table},
                "workers": {"replicas": 1},
                "processor": {"stdout": {}},
                "retry": {"maxAttempts": 2, "onExhausted": "deadLetter", "deadLetterStream": dead}
            }
        }))
        .expect("consumer");
        Api::<StreamConsumer>::namespaced(kube.clone(), &ns)
            .create(&PostParams::default(), &consumer)
            .await
            .expect("create consumer");
        // Letters as the consumer's workers write them (the worker's own are tested in redrive.rs).
        let letters: Vec<(String, Vec<u8>)> = (0..3)
            .map(|n| {
                let data = base64_of(format!("order-{n}").as_bytes());
                let letter = serde_json::json!({
                    "stream": stream, "shardId": "shardId-000000000000", "sequenceNumber": format!("{}", 100 + n),
                    "partitionKey": "customer-7", "data": data, "attempts": 2, "requeues": 0, "error": "e",
                    "owner": "pod-a", "leaseTable": table,
                });
                ("customer-7".to_string(), letter.to_string().into_bytes())
            })
            .collect();
        put_records(&kinesis, &dead, &letters).await;
        let env = [("KUBECONFIG", kubeconfig().display().to_string())];
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let name = format!("{ns}/orders");
        let out = run_with_env(&["redrive", &name, "--execute", "-o", "json"], &env).expect_code(0).json();
        assert_eq!(out["put"], 3, "{out:#}");
        let (shard, _, _) = open_shards(&kinesis, &stream).await.remove(0);
        let back: Vec<String> = read_shard(&kinesis, &stream, &shard)
            .await
            .iter()
            .map(|r| format!("{}={}", r.partition_key, String::from_utf8_lossy(r.data.as_ref())))
            .collect();
        assert_eq!(back, ["customer-7=order-0", "customer-7=order-1", "customer-7=order-2"]);
        let events: Api<Event> = Api::namespaced(kube.clone(), &ns);
        let redriven = async || {
            let list = events.list(&ListParams::default()).await.expect("events");
            list.items.into_iter().find(|e| e.reason.as_deref() == Some("Redriven"))
        };
        wait_for("the Redriven event", Duration::from_secs(20), async || redriven().await.is_some()).await;
        let event = redriven().await.expect("event");
        assert_eq!(event.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("orders"));
        assert!(event.note.as_deref().is_some_and(|n| n.contains("put 3 dead-lettered record(s) back")), "{event:?}");
        let again = run_with_env(&["redrive", &name, "-o", "json"], &env).expect_code(0).json();
        assert_eq!(again["records"], 0, "{again:#}");
    });
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
