//! Outputs end to end: the http processor answers with records to emit, the worker publishes them to
//! `output.stream`, each under the key the documented order picks.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use base64::Engine;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::kpl::{library_aggregates, put_aggregates};
use serde_json::json;

/// Answers every record with three outputs: one under its own key, one carrying the input's key, one
/// with no key (the consumer's fixed key applies).
async fn answer(body: Bytes) -> ([(&'static str, &'static str); 1], String) {
    let text = String::from_utf8_lossy(&body).into_owned();
    let encode = |prefix: &str| base64::engine::general_purpose::STANDARD.encode(format!("{prefix}:{text}"));
    let answer = json!({"outputs": [
        {"data": encode("own"), "partitionKey": "own-key"},
        {"data": encode("carried"), "carryPartitionKey": true},
        {"data": encode("fixed")}
    ]});
    ([("content-type", "application/json")], answer.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_outputs_are_published_under_the_documented_keys() {
    outputs_case(false).await;
}

/// The same with the input packed into KPL aggregates by AWS's library: outputs are per user record, and
/// "carried" means the user record's own key, not the aggregate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_record_of_an_aggregate_publishes_its_own_outputs() {
    outputs_case(true).await;
}

async fn outputs_case(aggregated: bool) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let input = leasehold_testkit::create_stream(&kinesis, "outputs-in", 1).await;
    let output = leasehold_testkit::create_stream(&kinesis, "outputs-out", 2).await;
    let server = leasehold_testkit::server::LocalServer::start(Router::new().fallback(answer)).await;
    let url = format!("{}/records", server.endpoint());

    let extra = format!("startPosition: TRIM_HORIZON\noutput: {{stream: {output}, partitionKey: receipts}}\n");
    let config = config(&input, None, &extra)
        .replace("processor: {stdout: {}}", &format!("processor: {{http: {{url: '{url}'}}}}"));
    let _worker = spawn(&config, "outputs-1");
    let written = records(5, 0, 2);
    if aggregated {
        let aggregates = library_aggregates(&written, 4);
        assert!(aggregates.iter().all(|a| a.users.iter().any(|(key, _)| *key != a.partition_key)), "mixed keys");
        put_aggregates(&kinesis, &input, &aggregates).await;
    } else {
        put_records(&kinesis, &input, &written).await;
    }

    let read_published = || async {
        leasehold_testkit::kinesis::read_all(&kinesis, &output)
            .await
            .into_iter()
            .map(|r| (r.partition_key, r.data))
            .collect::<Vec<(String, String)>>()
    };
    for _ in 0..100 {
        if read_published().await.len() >= written.len() * 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Give a repeat time to show: a record processed twice publishes its outputs twice.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let published = read_published().await;
    assert_eq!(published.len(), written.len() * 3, "three outputs per record, once each: {published:?}");
    let distinct: std::collections::HashSet<&String> = published.iter().map(|(_, d)| d).collect();
    assert_eq!(distinct.len(), published.len(), "an output published twice: {published:?}");
    for (key, data) in &written {
        let data = String::from_utf8_lossy(data).into_owned();
        let find = |prefix: &str| {
            published.iter().find(|(_, d)| *d == format!("{prefix}:{data}")).map(|(k, _)| k.clone()).unwrap_or_default()
        };
        assert_eq!(find("own"), "own-key", "1: the processor's key");
        assert_eq!(&find("carried"), key, "2: the input's key, carried");
        assert_eq!(find("fixed"), "receipts", "3: the consumer's output.partitionKey");
    }
}
