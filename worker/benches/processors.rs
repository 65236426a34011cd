//! Processor and footprint benchmarks: the http processor against a local server, one record per
//! request and in batches (records/s and per-record latency), and a worker process's resident memory
//! while holding 100 leases. Run with `make bench`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use bytes::Bytes;
use futures::StreamExt;
use leasehold_testkit::process::wait_for;
use leasehold_worker::processor::{HttpBatching, HttpProcessor, Outputs, Record, ShardProcessor};

const HTTP_RECORDS: usize = 20_000;

fn record(n: usize) -> Record {
    Record {
        stream: Arc::from("bench"),
        shard_id: Arc::from("shardId-000000000000"),
        sequence_number: format!("{:056}", n),
        partition_key: format!("key-{}", n % 100),
        data: Bytes::from(vec![b'x'; 100]),
        arrival_ms: None,
        explicit_hash_key: None,
        sub_sequence_number: None,
    }
}

async fn http_run(processor: Arc<HttpProcessor>, concurrency: usize) -> (f64, Duration, Duration) {
    let started = Instant::now();
    let mut latencies: Vec<Duration> = futures::stream::iter(0..HTTP_RECORDS)
        .map(|n| {
            let processor = processor.clone();
            async move {
                let begun = Instant::now();
                processor.process(&record(n), &mut Outputs::default()).await.expect("2xx");
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

/// The http rows: unbatched, then batched (`maxRecords`, 5 ms linger), against a server answering 200
/// after `delay` (none: at once), each row a fresh processor.
async fn http_table(delay: Duration) {
    let app = Router::new().fallback(move || async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        ""
    });
    let server = leasehold_testkit::server::LocalServer::start(app).await;
    let url = format!("{}/records", server.endpoint());
    let answering = if delay.is_zero() { "at once".to_string() } else { format!("after {delay:?}") };
    println!(
        "\n| http processor, local server answering 200 {answering}, {HTTP_RECORDS} records | in flight | records/s | p50 | p99 |\n|---|---|---|---|---|"
    );
    let rows: &[(usize, usize)] = &[(1, 1), (1, 8), (1, 32), (32, 32), (50, 32), (50, 256)];
    for &(max_records, concurrency) in rows {
        let batching = HttpBatching { max_records, max_delay: Duration::from_millis(5), bisect: false };
        let processor = HttpProcessor::new(&url, Duration::from_secs(5)).expect("processor").with_batching(batching);
        let (rate, p50, p99) = http_run(Arc::new(processor), concurrency).await;
        let batch = if max_records == 1 { "unbatched".to_string() } else { format!("batches of up to {max_records}") };
        println!(
            "| {batch} | {concurrency} | {rate:.0} | {:.2} ms | {:.2} ms |",
            p50.as_secs_f64() * 1000.0,
            p99.as_secs_f64() * 1000.0
        );
    }
}

#[tokio::main]
async fn main() {
    println!("## Processors and footprint");
    http_table(Duration::ZERO).await;
    http_table(Duration::from_millis(1)).await;

    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "bench-rss", 100).await;
    let table = leasehold_testkit::unique_name("bench-rss");
    let config = common::config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let worker = common::spawn(&config, "rss-1");
    wait_for("100 leases held", Duration::from_secs(120), async || worker.held_shards().len() == 100).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = leasehold_testkit::process::rss_mib(worker.pid());
    let data = common::records(1000, 0, 10);
    leasehold_testkit::kinesis::put_records(&kinesis, &stream, &data).await;
    wait_for("10k records processed", Duration::from_secs(120), async || worker.delivery_count() >= data.len()).await;
    let busy = leasehold_testkit::process::rss_mib(worker.pid());
    println!(
        "\n- worker RSS holding 100 leases (release binary, DynamoDB leases): {idle:.1} MiB idle, {busy:.1} MiB after processing 10,000 records"
    );
}
