//! Hostile clients on a worker's ports (issue 31): a flood of bad handoff notices (garbage, group rows,
//! foreign senders and streams, unsigned, wrongly signed, stale and replayed ones, oversized bodies,
//! slow connections) leaves the log bounded, every refusal counted, the leases and their renewals
//! untouched, nothing taken and every record processed once; and 1,000 slow connections on the
//! metrics port leave `/healthz` and `/metrics` answering within a second.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::process::{TEST_HANDOFF_SECRET, WorkerProcess, wait_for};
use leasehold_worker::internals::handoff::{HandoffNotice, HandoffSecret, MAX_BODY_BYTES, now_ms, sign_notice};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the test keeps of one worker's log: enough to judge it, bounded whatever the worker writes.
const LOG_CAP: u64 = 4 * 1024 * 1024;

/// Raises this test process's open files limit: it holds a thousand connections.
fn enough_files() {
    let limit = rlimit::increase_nofile_limit(u64::MAX).expect("raise RLIMIT_NOFILE");
    assert!(limit >= 4096, "the test needs 4,096 open files; the hard limit is {limit}");
}

fn spawn_capped(config: &str, owner: &str) -> WorkerProcess {
    WorkerProcess::spawn_capped(std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-worker")), config, owner, LOG_CAP)
}

/// One request on a fresh connection: the status code the worker answered (0: the connection was
/// closed without an answer).
async fn request(address: &str, head: &str, body: &[u8]) -> u16 {
    let Ok(mut stream) = TcpStream::connect(address).await else { return 0 };
    let request = format!("{head}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    // A server refusing a large body may close before it is all written: the answer still says why.
    if stream.write_all(request.as_bytes()).await.is_ok() {
        let _ = stream.write_all(body).await;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    text.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// POSTs `body` to the handoff endpoint with `signature` (if any).
async fn post_notice(address: &str, signature: Option<&str>, body: &[u8]) -> u16 {
    let signed = signature.map(|s| format!("x-leasehold-signature: {s}\r\n")).unwrap_or_default();
    let head = format!("POST /v1/handoff HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n{signed}");
    request(address, &head, body).await
}

async fn get_within(address: &str, path: &str, within: Duration) -> (u16, Duration) {
    let started = Instant::now();
    let code = tokio::time::timeout(within, request(address, &format!("GET {path} HTTP/1.1\r\nHost: w\r\n"), b""))
        .await
        .unwrap_or(0);
    (code, started.elapsed())
}

/// `count` connections that each send part of a request's headers and stall.
async fn slow_connections(address: &str, count: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        // Past a port's connection limit the server closes at once: the write may fail then.
        let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: w\r\nX-Slow: ").await;
        open.push(stream);
    }
    open
}

/// How many of `streams` the server has closed, within `within`.
async fn closed_by_server(streams: &mut [TcpStream], within: Duration) -> usize {
    let until = tokio::time::Instant::now() + within;
    let mut closed = 0;
    for stream in streams.iter_mut() {
        let mut byte = [0u8; 64];
        // End of stream, a reset, or an answer (408/400) before the close: not kept open.
        if tokio::time::timeout_at(until, stream.read(&mut byte)).await.is_ok() {
            closed += 1;
        }
    }
    closed
}

fn signed(notice: &HandoffNotice) -> (Vec<u8>, String) {
    sign_notice(notice, &HandoffSecret::new(TEST_HANDOFF_SECRET.as_bytes()).expect("secret")).expect("signed")
}

fn notice(from: &str, sent_ms: u64, leases: &[String]) -> HandoffNotice {
    HandoffNotice { from: from.into(), sent_ms, leases: leases.to_vec() }
}

/// `lease_counter` of each of `shards` (`stream:shardId`) in `table`.
async fn counters(dynamodb: &aws_sdk_dynamodb::Client, table: &str, shards: &[String]) -> HashMap<String, u64> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut counters = HashMap::new();
    for shard in shards {
        let item = dynamodb
            .get_item()
            .table_name(table)
            .key("lease_key", AttributeValue::S(shard.clone()))
            .consistent_read(true)
            .send()
            .await
            .expect("read the row");
        let counter = item.item().and_then(|i| i.get("lease_counter")).and_then(|v| v.as_n().ok()).expect("a counter");
        counters.insert(shard.clone(), counter.parse().expect("a number"));
    }
    counters
}

async fn refused(worker: &WorkerProcess, reason: &str) -> f64 {
    metric_or_zero(worker, &format!("leasehold_handoff_notices_total{{event=\"refused\",reason=\"{reason}\"}}")).await
}

#[test]
fn a_flood_of_bad_notices_is_refused_counted_and_logged_briefly() {
    enough_files();
    run_test(async {
        let kinesis = Emulator::Kinesalite.client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "flood", 4).await;
        let table = leasehold_testkit::unique_name("flood");
        let config = Emulator::Kinesalite.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
        let mut target = spawn_capped(&config, "flood-a");
        let mut peer = spawn_capped(&config, "flood-b");
        wait_for("two workers balanced", Duration::from_secs(30), async || {
            [&target, &peer].iter().all(|w| w.held_shards().len() == 2)
        })
        .await;
        let address = target.handoff_addr().expect("the target takes notices");
        let metrics_address = target.metrics_addr().expect("metrics");
        let (held, peers) = (target.held_shards(), peer.held_shards());
        let producer = Producer::start(kinesis.clone(), &stream, 20, Duration::from_millis(50));
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let before = counters(&dynamodb, &table, &held).await;
        let log_before = target.stderr_bytes();
        let acquired_before = target.events("lease acquired").len();
        let flood_started = Instant::now();

        // Slow clients first, below the port's connection limit (128), open into the flood: each is
        // closed within the port's header timeout (2 s).
        let mut slow = slow_connections(&address, 100).await;
        let mut sent: HashMap<&str, usize> = HashMap::new();
        let mut expect = |reason: &'static str, code: u16, wanted: u16| {
            assert_eq!(code, wanted, "{reason}: answered {code}");
            *sent.entry(reason).or_default() += 1;
        };
        let long_sender = "m".repeat(10_000);
        let keys: Vec<String> = (0..2_000).map(|i| format!("not-a-key-{i}")).collect();
        for round in 0..20 {
            let now = now_ms() + round;
            // The flood: 2,000 malformed keys from a 10 KB sender, refused by size.
            let body = serde_json::to_vec(&notice(&long_sender, now, &keys)).expect("json");
            expect("too_large", post_notice(&address, None, &body).await, 413);
            let (body, signature) = signed(&notice(&long_sender, now, &keys));
            expect("too_large", post_notice(&address, Some(&signature), &body).await, 413);
            // Garbage, unsigned.
            let body = serde_json::to_vec(&notice("flood-b", now, &keys[..10])).expect("json");
            expect("unsigned", post_notice(&address, None, &body).await, 401);
            expect("unsigned", post_notice(&address, None, b"\xff\xfe not json").await, 401);
            // Signed, but not notices this worker takes.
            let (body, signature) = signed(&notice("flood-b", now, &keys[..3]));
            expect("bad_key", post_notice(&address, Some(&signature), &body).await, 400);
            let (body, signature) = signed(&notice("flood-b", now, &[format!("#worker:flood-b-{round}")]));
            expect("group_row", post_notice(&address, Some(&signature), &body).await, 400);
            let (body, signature) = signed(&notice(&long_sender[..300], now, &held[..1]));
            expect("malformed", post_notice(&address, Some(&signature), &body).await, 400);
            let many: Vec<String> = (0..17).map(|i| format!("{stream}:shardId-{i:012}")).collect();
            let (body, signature) = signed(&notice("flood-b", now, &many));
            expect("too_many_keys", post_notice(&address, Some(&signature), &body).await, 400);
            // Wrongly signed, stale, replayed.
            let (body, _) = signed(&notice("flood-b", now, &peers[..1]));
            let wrong = HandoffSecret::new(b"not the group's secret at all").expect("secret").sign(&body);
            expect("bad_signature", post_notice(&address, Some(&wrong), &body).await, 401);
            let (body, signature) = signed(&notice("flood-b", now - 120_000, &peers[..1]));
            expect("stale", post_notice(&address, Some(&signature), &body).await, 401);
            // A good notice from the peer naming rows it still holds (taken, read, not free: nothing
            // moves), then copies of it.
            let (body, signature) = signed(&notice("flood-b", now, &peers));
            assert_eq!(post_notice(&address, Some(&signature), &body).await, 202, "a good notice is queued");
            for _ in 0..3 {
                expect("replayed", post_notice(&address, Some(&signature), &body).await, 401);
            }
            // Signed by the group, but from a stranger, or about another stream: queued, then refused.
            let (body, signature) = signed(&notice(&format!("mallory-{round}"), now, &peers));
            expect("queued_not_member", post_notice(&address, Some(&signature), &body).await, 202);
            let (body, signature) =
                signed(&notice("flood-b", now + 1_000, &["other-stream:shardId-000000000000".into()]));
            expect("queued_foreign_stream", post_notice(&address, Some(&signature), &body).await, 202);
            // Oversized bodies.
            expect("too_large", post_notice(&address, None, &vec![b' '; MAX_BODY_BYTES + 1]).await, 413);
            expect("too_large", post_notice(&address, None, &vec![b'x'; 16 * 1024]).await, 413);
            // The probes answer throughout.
            let (code, took) = get_within(&metrics_address, "/healthz", Duration::from_secs(1)).await;
            assert_eq!(code, 200, "/healthz answered {code} after {took:?} during the flood");
        }
        let closed = closed_by_server(&mut slow, Duration::from_secs(4)).await;
        assert_eq!(closed, slow.len(), "slow clients are closed within the header timeout");
        drop(slow);
        // A burst past the connection limit: the ones over it closed at once, the rest within 2 s;
        // then the port takes notices again.
        let mut burst = slow_connections(&address, 300).await;
        let closed = closed_by_server(&mut burst, Duration::from_secs(4)).await;
        assert_eq!(closed, burst.len(), "slow clients past the limit are closed");
        drop(burst);
        let (body, signature) = signed(&notice("flood-b", now_ms(), &peers));
        assert_eq!(post_notice(&address, Some(&signature), &body).await, 202, "notices are taken again");
        let flood = flood_started.elapsed();

        // Every refusal is counted, by reason.
        for reason in [
            "unsigned",
            "bad_key",
            "group_row",
            "malformed",
            "too_many_keys",
            "bad_signature",
            "stale",
            "replayed",
            "too_large",
        ] {
            assert_eq!(refused(&target, reason).await, sent[reason] as f64, "refusals counted as {reason}");
        }
        let queued = (sent["queued_not_member"] + sent["queued_foreign_stream"]) as f64;
        let judged = Instant::now();
        loop {
            let counted = refused(&target, "not_member").await
                + refused(&target, "foreign_stream").await
                + refused(&target, "busy").await;
            if counted >= queued {
                break;
            }
            assert!(judged.elapsed() < Duration::from_secs(10), "{counted} of {queued} queued notices judged");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(refused(&target, "not_member").await >= 1.0 && refused(&target, "foreign_stream").await >= 1.0);

        // The log stayed small: each reason logged at most once per 10 s, foreign text cut.
        let logged = target.stderr_bytes() - log_before;
        println!("flood of {flood:?}: {logged} bytes of log; refusals {sent:?}");
        assert!(logged < 1024 * 1024, "{logged} bytes of log for the flood");
        let longest = target.stderr_text().lines().map(str::len).max().unwrap_or(0);
        assert!(longest < 2_000, "a log line of {longest} bytes: foreign text must be cut");

        // Leases and renewals untouched, nothing taken.
        let after = counters(&dynamodb, &table, &held).await;
        for shard in &held {
            let renewals = after[shard] - before[shard];
            // Renewals every 500 ms (and checkpoints every 200 ms) move the counter.
            assert!(renewals as f64 >= flood.as_secs_f64(), "{shard}: counter moved {renewals} in {flood:?}");
        }
        assert_eq!(target.held_shards(), held, "the target keeps its leases");
        assert_eq!(peer.held_shards(), peers, "the peer keeps its leases");
        assert_eq!(target.events("lease acquired").len(), acquired_before, "nothing taken on any notice");
        assert!(target.events("lease lost").is_empty() && peer.events("lease lost").is_empty());
        assert_eq!(metric_or_zero(&target, "leasehold_lease_renewals_failed_total").await, 0.0);
        assert_eq!(metric_or_zero(&target, "leasehold_handoff_notices_total{event=\"taken\"}").await, 0.0);

        let written = producer.stop().await;
        wait_for("every record delivered", Duration::from_secs(30), async || {
            distinct(&all_deliveries(&[&target, &peer])).len() >= written.len()
        })
        .await;
        assert_exactly_once(&all_deliveries(&[&target, &peer]), &written);
        assert_running(&mut [&mut target, &mut peer]);
    });
}

#[test]
fn a_thousand_slow_connections_leave_the_probes_and_renewals_alone() {
    enough_files();
    run_test(async {
        let kinesis = Emulator::Kinesalite.client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "slow", 2).await;
        let table = leasehold_testkit::unique_name("slow");
        let config = Emulator::Kinesalite.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
        let worker = spawn_capped(&config, "slow-a");
        wait_for("the worker holds both shards", Duration::from_secs(30), async || worker.held_shards().len() == 2)
            .await;
        let address = worker.metrics_addr().expect("metrics");
        let held = worker.held_shards();
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let before = counters(&dynamodb, &table, &held).await;
        let opened_at = Instant::now();
        let mut slow = slow_connections(&address, 1_000).await;
        println!("1,000 slow connections opened in {:?}", opened_at.elapsed());
        for path in ["/healthz", "/metrics", "/healthz", "/readyz"] {
            let (code, took) = get_within(&address, path, Duration::from_secs(1)).await;
            println!("{path}: {code} in {took:?} with 1,000 slow connections open");
            assert_eq!(code, 200, "{path} answered {code} within {took:?}");
        }
        // Renewals go on meanwhile.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = counters(&dynamodb, &table, &held).await;
        for shard in &held {
            assert!(after[shard] >= before[shard] + 2, "{shard}: counter {} -> {}", before[shard], after[shard]);
        }
        // The worker closes them once its header timeout (5 s) passes.
        let closed = closed_by_server(&mut slow, Duration::from_secs(8)).await;
        println!("{closed} of 1,000 closed by the worker within {:?} of opening", opened_at.elapsed());
        assert_eq!(closed, slow.len(), "slow clients are closed by the header timeout");
        assert_eq!(metric_or_zero(&worker, "leasehold_lease_renewals_failed_total").await, 0.0);
        assert_eq!(worker.held_shards(), held);
    });
}
