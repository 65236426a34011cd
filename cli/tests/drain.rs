//! `drain` on the emulators with real worker processes and records flowing: the drained worker hands
//! every lease over (no repeats, no gaps), holds none and takes none back while marked, not even leases
//! freed by a worker leaving; `drain --cancel` puts it back to work; unknown workers, and a drain that
//! would leave nobody to read, are refused.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::records::{Producer, assert_exactly_once, deliveries, distinct};
use common::*;

fn held(description: &serde_json::Value, owner: &str) -> usize {
    description["shards"].as_array().map_or(0, |s| s.iter().filter(|s| s["owner"] == owner).count())
}

fn member<'a>(description: &'a serde_json::Value, owner: &str) -> &'a serde_json::Value {
    description["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["owner"] == owner))
        .unwrap_or_else(|| panic!("no member {owner} in {description}"))
}

/// Runs `leasehold args...` off the runtime's threads (the producer keeps writing meanwhile).
async fn run_async(args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || run(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .expect("leasehold run")
}

fn args(table: &str, stream: &str, rest: &[&str]) -> Vec<String> {
    ["drain", "--table", table, "--stream", stream].iter().chain(rest).map(|s| s.to_string()).collect()
}

/// Three workers reading the table with `scan` (a `lease` setting, empty for the default); drains b.
async fn a_drained_worker_hands_every_lease_over_once_and_takes_none_back_until_cancelled(scan: &str) {
    {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-drain", 6).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-drain").await;
        // A 10 s lease: no lease here moves by expiry (c leaves with SIGTERM), and a loaded machine
        // (renewals late by seconds) must not make one.
        let config = config(&stream, &table, "startPosition: TRIM_HORIZON\n")
            .replace("duration: 2s, renewInterval: 500ms", "duration: 10s, renewInterval: 1s")
            .replace("gracefulTimeout: 3s}", &format!("gracefulTimeout: 3s{scan}}}"));
        let a = spawn_worker(&config, "a");
        let b = spawn_worker(&config, "b");
        let mut c = spawn_worker(&config, "c");
        wait_for("three workers with two leases each", Duration::from_secs(60), async || {
            let d = describe(&table, &stream);
            ["a", "b", "c"].iter().all(|w| held(&d, w) == 2)
        })
        .await;
        let producer = Producer::start(kinesis.clone(), &stream, 12, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_secs(1)).await;

        let started = Instant::now();
        let out = run_async(args(&table, &stream, &["b", "--timeout", "60s", "-o", "json"])).await.expect_code(0);
        let drained_in = started.elapsed();
        // The worker's lines are judged by the times it wrote them (read later, they may arrive after this).
        let drained_at = SystemTime::now();
        let outcome = out.json();
        assert_eq!((outcome["worker"].as_str(), outcome["held"].as_array().map(Vec::len)), (Some("b"), Some(2)));
        assert!(outcome["remaining"].as_array().is_some_and(Vec::is_empty), "{outcome}");
        assert!(out.stderr.contains("b marked draining: 2 lease(s) held"), "{}", out.stderr);
        let d = describe(&table, &stream);
        assert_eq!((held(&d, "a") + held(&d, "c"), held(&d, "b")), (6, 0), "{d}");
        assert_eq!(member(&d, "b")["draining"], true);
        println!("b drained in {drained_in:?}");
        // The command asks on behalf of the least loaded, but a or c, told of the mark, may ask for one
        // of b's leases in the same instant: one may then hold four for a moment, until the other asks
        // it for its surplus.
        let even = wait_for("a and c at three each", Duration::from_secs(30), async || {
            let d = describe(&table, &stream);
            (held(&d, "a"), held(&d, "b"), held(&d, "c")) == (3, 0, 3)
        })
        .await;
        println!("a and c even {even:?} after the drain");

        // While marked, b takes nothing: not at its next scans, and not the leases c frees by leaving.
        tokio::time::sleep(Duration::from_secs(3)).await;
        c.signal("TERM");
        assert!(c.wait_exit(Duration::from_secs(20)).is_some(), "c did not stop");
        wait_for("a holds all six", Duration::from_secs(30), async || held(&describe(&table, &stream), "a") == 6).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let d = describe(&table, &stream);
        assert_eq!((held(&d, "a"), held(&d, "b")), (6, 0), "{d}");
        let taken_back: Vec<String> =
            b.events_logged("lease acquired").into_iter().filter(|(at, _)| *at > drained_at).map(|(_, s)| s).collect();
        assert!(taken_back.is_empty(), "b took {taken_back:?} while draining");
        let refused = run_async(args(&table, &stream, &["a"])).await.expect_code(4);
        assert!(refused.stderr.contains("every other live worker is draining"), "{}", refused.stderr);

        // Cancelled, b takes its share again (by handoff from a).
        let cancelled = run_async(args(&table, &stream, &["b", "--cancel"])).await.expect_code(0);
        assert!(cancelled.stdout.contains("b: drain cancelled"), "{}", cancelled.stdout);
        wait_for("b back at its share", Duration::from_secs(30), async || {
            let d = describe(&table, &stream);
            held(&d, "a") == 3 && held(&d, "b") == 3
        })
        .await;
        assert_eq!(member(&describe(&table, &stream), "b")["draining"], false);
        let again = run_async(args(&table, &stream, &["b", "--cancel"])).await.expect_code(0);
        assert!(again.stdout.contains("b was not draining"), "{}", again.stdout);

        let written = producer.stop().await;
        let workers = [&a, &b, &c];
        let total = written.len();
        wait_for("every record delivered", Duration::from_secs(60), async || {
            distinct(&deliveries(&workers)).len() >= total
        })
        .await;
        let stalls: Vec<(String, usize)> = workers
            .iter()
            .map(|w| {
                (
                    w.owner.clone(),
                    w.events("lease lost").len() + w.events("lease taken over: its holder stopped renewing it").len(),
                )
            })
            .collect();
        println!("leases lost or taken over (a stalled renewal): {stalls:?}");
        assert_exactly_once(&deliveries(&workers), &written);
        println!("{} records, each processed once, across the drain, a leave and the cancel", written.len());
    }
}

#[test]
fn drain_with_the_default_segmented_scan() {
    run_test(a_drained_worker_hands_every_lease_over_once_and_takes_none_back_until_cancelled(""));
}

#[test]
fn drain_with_a_full_scan() {
    run_test(a_drained_worker_hands_every_lease_over_once_and_takes_none_back_until_cancelled(", scan: full"));
}

/// Segments of about 2 rows: the drained worker's own membership row may lie in a segment it does not
/// read; the drain's announcement makes it read the whole table.
#[test]
fn drain_with_a_segmented_scan_of_several_segments() {
    run_test(a_drained_worker_hands_every_lease_over_once_and_takes_none_back_until_cancelled(
        ", scan: segmented, segmentRows: 2",
    ));
}

#[test]
fn drain_refuses_unknown_workers_and_the_last_reader() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-drain-refused", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-drain-refused").await;
        let config = config(&stream, &table, "");
        let a = spawn_worker(&config, "a");
        wait_for("a holds both leases", Duration::from_secs(40), async || held(&describe(&table, &stream), "a") == 2)
            .await;
        let unknown = run_async(args(&table, &stream, &["nobody"])).await.expect_code(3);
        assert!(unknown.stderr.contains("worker nobody is not a live member"), "{}", unknown.stderr);
        let alone = run_async(args(&table, &stream, &["a"])).await.expect_code(4);
        assert!(alone.stderr.contains("it is the only live worker"), "{}", alone.stderr);
        assert_eq!(member(&describe(&table, &stream), "a")["draining"], false, "a refused drain marks nothing");
        let pod = run_async(args(&table, &stream, &["a", "--delete-pod"])).await.expect_code(2);
        assert!(pod.stderr.contains("needs a StreamConsumer"), "{}", pod.stderr);
        drop(a);
    });
}
