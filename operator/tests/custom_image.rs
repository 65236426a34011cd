//! A user's own worker binary as a consumer's worker image: the operator runs
//! `worker/examples/custom_processor.rs` (built on `leasehold_worker::main_with_processor`) through
//! `spec.template` with `processor: {custom: {}}`, exactly as it runs `leasehold-worker`: the same
//! `--config FILE --owner-id $(POD_NAME)` args, and it processes every record exactly once.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use leasehold_testkit::kinesis::{numbered, put_records};
use serde_json::json;
use support::kubelet::{CUSTOM_PROCESSOR_IMAGE, Kubelet};
use support::{aws, wait};

const SLOW: Duration = Duration::from_secs(60);

/// Every `<stream>/<shard> #<sequence>` the example printed, with how often.
fn processed(kubelet: &Kubelet) -> HashMap<String, usize> {
    let running = kubelet.running.lock().expect("running");
    let mut seen = HashMap::new();
    for line in running.values().flat_map(|w| w.stdout_lines()) {
        if let Some((record, _)) = line.split_once(": ").filter(|(_, rest)| rest.contains(" bytes (shard ")) {
            *seen.entry(record.to_string()).or_default() += 1;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_processor_example_runs_as_the_workers_image() {
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "custom", false).await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "custom", 2).await;
    let table = leasehold_testkit::unique_name("custom");
    let operator_binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_leasehold-operator"));
    let mut operator = support::spawn_operator(&operator_binary, &ns, &support::kubeconfig_path(), "1s");
    let kubelet = Kubelet::start(client.clone(), &ns, "app.kubernetes.io/name=leasehold-worker");

    let consumer = support::stand_in_consumer(
        "bytes",
        json!({
            "streams": [{"name": stream}], "aws": aws(),
            "leaseTable": {"name": table, "deletionPolicy": "Delete"},
            "workers": {"replicas": 2},
            "startPosition": "TRIM_HORIZON",
            "lease": {"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"},
            "processor": {"custom": {}},
            "template": {"spec": {"containers": [{"name": "worker", "image": CUSTOM_PROCESSOR_IMAGE}]}}
        }),
    );
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &ns);
    consumers.create(&PostParams::default(), &consumer).await.expect("apply");
    wait("two custom worker processes", SLOW, async || kubelet.pods().len() == 2).await;

    let records: Vec<_> = (0..20).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &records).await;
    wait("every record processed by the custom processor", SLOW, async || processed(&kubelet).len() >= records.len())
        .await;
    // No process failed: every record exactly once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = processed(&kubelet);
    assert_eq!(seen.len(), records.len(), "distinct records processed");
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "records processed more than once: {repeated:?}");
    // The example serves the same endpoints as leasehold-worker, counting its records.
    let addresses: Vec<String> = {
        let running = kubelet.running.lock().expect("running");
        running.values().filter_map(|w| w.metrics_addr()).collect()
    };
    assert_eq!(addresses.len(), 2, "both processes serve /metrics");
    let mut counted = 0.0;
    for address in &addresses {
        let (status, body) = leasehold_testkit::server::http_get(address, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        counted += body
            .lines()
            .find_map(|l| l.strip_prefix("leasehold_records_processed_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("records counter");
    }
    assert_eq!(counted as usize, records.len(), "the metrics count every record once");

    consumers.delete("bytes", &DeleteParams::default()).await.expect("delete");
    wait("workers stopped", SLOW, async || kubelet.pods().is_empty()).await;
    let _ = operator.kill();
    let _ = operator.wait();
}
