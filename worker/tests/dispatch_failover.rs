//! Concurrency inside shards across failures and resharding: worker processes with `ordering: key` and
//! `concurrency: 8` POST to a local server that answers after a random delay (so records finish out of
//! order). Nothing may be lost (the checkpoint never passes an unfinished record) and every key's order
//! holds, also from a split parent to its children (a parent ends only once all its records are done).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{Delivery, wait_for};
use leasehold_testkit::server::LocalServer;
use rand::Rng;

/// (worker, data) per acknowledged request, in arrival order.
type Acks = Arc<Mutex<Vec<(String, String)>>>;

/// Every acknowledged request as a delivery by worker `/{worker}` (stream, shard and sequence number
/// from its CloudEvents headers), in arrival order.
type Received = Arc<Mutex<Vec<Delivery>>>;

/// A server on a free loopback port acknowledging `POST /{worker}` after `delay(data)`; serves until
/// dropped.
async fn slow_server(acks: Acks, delay: fn(&str) -> Duration) -> LocalServer {
    slow_server_recording(acks, Received::default(), delay).await
}

/// [`slow_server`], also recording each acknowledgement in `received`.
async fn slow_server_recording(acks: Acks, received: Received, delay: fn(&str) -> Duration) -> LocalServer {
    let router = Router::new()
        .route(
            "/{worker}",
            post(
                move |Path(worker): Path<String>,
                      State((acks, received)): State<(Acks, Received)>,
                      headers: HeaderMap,
                      body: Bytes| async move {
                    let data = String::from_utf8_lossy(&body).into_owned();
                    tokio::time::sleep(delay(&data)).await;
                    let header =
                        |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                    let source = header("ce-source");
                    received.lock().unwrap().push(Delivery {
                        stream: source.strip_prefix("kinesis:").unwrap_or(&source).to_string(),
                        shard_id: header("ce-shardid"),
                        sequence_number: header("ce-sequencenumber"),
                        partition_key: data.rsplit_once(':').map(|(k, _)| k.to_string()).unwrap_or_default(),
                        data: data.clone(),
                        owner: worker.clone(),
                        seen_at: Instant::now(),
                    });
                    acks.lock().unwrap().push((worker, data));
                    StatusCode::OK
                },
            ),
        )
        .with_state((acks, received));
    LocalServer::start(router).await
}

/// 0-15 ms at random: records finish out of order.
fn random_delay(_data: &str) -> Duration {
    Duration::from_millis(rand::rng().random_range(0..15))
}

/// The config of worker `name` POSTing to `base/name`.
fn http_config(base_config: &str, base: &str, name: &str) -> String {
    base_config
        .replace("processor: {stdout: {}}", &format!("processor: {{http: {{url: '{base}/{name}', timeout: 2s}}}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_completion_loses_nothing_across_kill_and_shutdown() {
    let acks: Acks = Arc::default();
    let received: Received = Arc::default();
    let server = slow_server_recording(acks.clone(), received.clone(), random_delay).await;

    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "fanout", 4).await;
    let table = leasehold_testkit::unique_name("fanout");
    let base_config = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 8\n");
    let worker = |name: &str| spawn(&http_config(&base_config, &server.endpoint(), name), &format!("fanout-{name}"));
    let producer = Producer::start(kinesis.clone(), &stream, 40, Duration::from_millis(40));
    let mut killed = worker("a");
    let stopped = worker("b");
    let survivor = worker("c");
    wait_for("three workers balanced", Duration::from_secs(30), async || {
        [&killed, &stopped, &survivor].iter().all(|w| !w.held_shards().is_empty())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    killed.signal("KILL");
    killed.wait_exit(Duration::from_secs(5)).expect("killed");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stopped.signal("TERM");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = producer.stop().await;
    let expected: HashSet<String> = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    wait_for("every record acknowledged", Duration::from_secs(60), async || {
        let acks = acks.lock().unwrap();
        let seen: HashSet<&str> = acks.iter().map(|(_, d)| d.as_str()).collect();
        expected.iter().all(|d| seen.contains(d.as_str()))
    })
    .await;
    assert!(survivor.held_shards().len() == 4, "the survivor ends with every shard");

    let acks = acks.lock().unwrap().clone();
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for (worker, data) in &acks {
        let key = data.rsplit_once(':').map(|(k, _)| k.to_string()).unwrap_or_default();
        let n = data_number(data);
        if let Some(previous) = last.insert((worker.clone(), key.clone()), n) {
            assert!(n > previous, "worker {worker}: key {key} went {previous} -> {n}");
        }
    }
    let per_worker = |name: &str| acks.iter().filter(|(w, _)| w == name).count();
    assert!(per_worker("a") > 0 && per_worker("b") > 0, "every worker did some of the work");
    // Only the killed worker's uncheckpointed records may come again (b stopped gracefully).
    let received = received.lock().unwrap().clone();
    let repeats = assert_repeats_only_from_crashes(&received, &written, &[Victim { owner: "a", crashed_before: None }]);
    println!("{} records, {} acknowledgements, {repeats} repeated", expected.len(), acks.len());
}

/// The last round written to the parent before the split.
const LAST_PARENT_ROUND: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_ends_only_once_its_records_are_done_and_keys_keep_order_into_children() {
    let acks: Acks = Arc::default();
    // The parent's last records take 700 ms, longer than the 200 ms between GetRecords calls: its end
    // is reached while they run, and it must not end (nor its children start) before they finish.
    let server = slow_server(acks.clone(), |data| {
        if data_number(data) == LAST_PARENT_ROUND { Duration::from_millis(700) } else { random_delay(data) }
    })
    .await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "fansplit", 2).await;
    let table = leasehold_testkit::unique_name("fansplit");
    let base_config = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 8\n");
    let worker = spawn(&http_config(&base_config, &server.endpoint(), "solo"), "fansplit-solo");
    let before = records(20, 0, LAST_PARENT_ROUND + 1);
    put_records(&kinesis, &stream, &before).await;
    leasehold_testkit::kinesis::split(&kinesis, &stream, "shardId-000000000000").await;
    let after = records(20, LAST_PARENT_ROUND + 1, 5);
    put_records(&kinesis, &stream, &after).await;
    let expected: HashSet<String> =
        before.iter().chain(&after).map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    wait_for("every record acknowledged", Duration::from_secs(30), async || {
        let acks = acks.lock().unwrap();
        let seen: HashSet<&str> = acks.iter().map(|(_, d)| d.as_str()).collect();
        expected.iter().all(|d| seen.contains(d.as_str()))
    })
    .await;
    wait_for("the parent ended", Duration::from_secs(10), async || !worker.events("shard ended").is_empty()).await;
    let acks = acks.lock().unwrap().clone();
    assert_eq!(acks.len(), expected.len(), "one worker, no failure: nothing is repeated");
    let mut last: HashMap<String, u64> = HashMap::new();
    for (_, data) in &acks {
        let key = data.rsplit_once(':').map(|(k, _)| k.to_string()).unwrap_or_default();
        let n = data_number(data);
        if let Some(previous) = last.insert(key.clone(), n) {
            assert!(n > previous, "key {key} went {previous} -> {n} (across the split?)");
        }
    }
}
