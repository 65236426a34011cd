//! Processor and footprint benchmarks: the http processor against a local server (records/s and
//! per-record latency), and a worker process's resident memory while holding 100 leases. Run with
//! `make bench`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use bytes::Bytes;
use futures::StreamExt;
use leasehold_testkit::process::wait_for;
use leasehold_worker::processor::{HttpProcessor, Record, RecordProcessor};

const HTTP_RECORDS: usize = 20_000;

fn record(n: usize) -> Record {
    Record {
        stream: Arc::from("bench"),
        shard_id: Arc::from("shardId-000000000000"),
        sequence_number: format!("{:056}", n),
        partition_key: format!("key-{}", n % 100),
        data: Bytes::from(vec![b'x'; 100]),
        arrival_ms: None,
    }
}

async fn http_run(processor: Arc<HttpProcessor>, concurrency: usize) -> (f64, Duration, Duration) {
    let started = Instant::now();
    let mut latencies: Vec<Duration> = futures::stream::iter(0..HTTP_RECORDS)
        .map(|n| {
            let processor = processor.clone();
            async move {
                let begun = Instant::now();
                processor.process(&record(n)).await.expect("2xx");
                begun.elapsed()
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let rate = HTTP_RECORDS as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    (rate, latencies[latencies.len() / 2], latencies[latencies.len() * 99 / 100])
}

#[tokio::main]
async fn main() {
    let server = leasehold_testkit::server::LocalServer::start(Router::new().fallback(|| async { "" })).await;
    let url = format!("{}/records", server.endpoint());
    let processor = Arc::new(HttpProcessor::new(&url, Duration::from_secs(5)).expect("processor"));
    println!("## Processors and footprint\n");
    println!(
        "| http processor, local server answering 200, {HTTP_RECORDS} records | records/s | p50 | p99 |\n|---|---|---|---|"
    );
    for concurrency in [1, 8, 32] {
        let (rate, p50, p99) = http_run(processor.clone(), concurrency).await;
        println!(
            "| {concurrency} in flight | {rate:.0} | {:.2} ms | {:.2} ms |",
            p50.as_secs_f64() * 1000.0,
            p99.as_secs_f64() * 1000.0
        );
    }

    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "bench-rss", 100).await;
    let table = leasehold_testkit::unique_name("bench-rss");
    let config = common::config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let worker = common::spawn(&config, "rss-1");
    wait_for("100 leases held", Duration::from_secs(120), || worker.held_shards().len() == 100);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = leasehold_testkit::process::rss_mib(worker.pid());
    let data = common::records(1000, 0, 10);
    leasehold_testkit::kinesis::put_records(&kinesis, &stream, &data).await;
    wait_for("10k records processed", Duration::from_secs(120), || worker.delivery_count() >= data.len());
    let busy = leasehold_testkit::process::rss_mib(worker.pid());
    println!(
        "\n- worker RSS holding 100 leases (release binary, DynamoDB leases): {idle:.1} MiB idle, {busy:.1} MiB after processing 10,000 records"
    );
}
