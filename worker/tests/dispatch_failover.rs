//! Concurrency inside shards across failures: three worker processes with `ordering: key` and
//! `concurrency: 8` POST to a local server that answers after a random delay (so records finish out of
//! order); one is killed (-9), one shut down gracefully. Nothing may be lost (the checkpoint never
//! passes an unfinished record) and each worker keeps every key's order.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::*;
use leasehold_testkit::process::wait_for;
use rand::Rng;

/// (worker, data) per acknowledged request, in arrival order.
type Acks = Arc<Mutex<Vec<(String, String)>>>;

fn number(data: &str) -> u64 {
    data.rsplit(':').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("bad data {data}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_completion_loses_nothing_across_kill_and_shutdown() {
    let acks: Acks = Arc::default();
    let router = Router::new()
        .route(
            "/{worker}",
            post(|Path(worker): Path<String>, State(acks): State<Acks>, body: Bytes| async move {
                let delay = rand::rng().random_range(0..15);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                acks.lock().unwrap().push((worker, String::from_utf8_lossy(&body).into_owned()));
                StatusCode::OK
            }),
        )
        .with_state(acks.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });

    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "fanout", 4).await;
    let table = leasehold_testkit::unique_name("fanout");
    let base_config = config(&stream, Some(&table), "startPosition: TRIM_HORIZON\nordering: key\nconcurrency: 8\n");
    let worker = |name: &str| {
        let config = base_config
            .replace("processor: {stdout: {}}", &format!("processor: {{http: {{url: '{base}/{name}', timeout: 2s}}}}"));
        spawn(&config, &format!("fanout-{name}"))
    };
    let producer = Producer::start(kinesis.clone(), &stream, 40, Duration::from_millis(40));
    let mut killed = worker("a");
    let stopped = worker("b");
    let survivor = worker("c");
    wait_for("three workers balanced", Duration::from_secs(30), || {
        [&killed, &stopped, &survivor].iter().all(|w| !w.held_shards().is_empty())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    killed.signal("KILL");
    killed.wait_exit(Duration::from_secs(5)).expect("killed");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stopped.signal("TERM");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = producer.stop().await;
    let expected: HashSet<String> = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    wait_for("every record acknowledged", Duration::from_secs(60), || {
        let acks = acks.lock().unwrap();
        let seen: HashSet<&str> = acks.iter().map(|(_, d)| d.as_str()).collect();
        expected.iter().all(|d| seen.contains(d.as_str()))
    });
    assert!(survivor.held_shards().len() == 4, "the survivor ends with every shard");

    let acks = acks.lock().unwrap().clone();
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for (worker, data) in &acks {
        let key = data.rsplit_once(':').map(|(k, _)| k.to_string()).unwrap_or_default();
        let n = number(data);
        if let Some(previous) = last.insert((worker.clone(), key.clone()), n) {
            assert!(n > previous, "worker {worker}: key {key} went {previous} -> {n}");
        }
    }
    let per_worker = |name: &str| acks.iter().filter(|(w, _)| w == name).count();
    assert!(per_worker("a") > 0 && per_worker("b") > 0, "every worker did some of the work");
    let repeats = acks.len() - expected.len();
    println!("{} records, {} acknowledgements, {repeats} repeated", expected.len(), acks.len());
}
