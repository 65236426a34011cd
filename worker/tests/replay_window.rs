//! A window consumer (`spec.window`) on kinesalite + dynalite, beside the live group on its own table:
//! records put before, inside and after the window, a split inside it. The window's worker processes
//! exactly the window's records, once, finishes every shard (`SHARD_END`) and exits 0 by itself; the
//! live worker reads everything exactly once all along.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use leasehold_testkit::kinesis::{put_records, split};
use leasehold_testkit::process::wait_for;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

/// Now as RFC 3339 in UTC with milliseconds.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis()
}

/// Gap around the window's bounds: wider than any rounding of ApproximateArrivalTimestamp.
const GAP: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_replays_exactly_its_records_across_a_split_while_the_live_group_reads_on() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "window", 2).await;
    let live_table = leasehold_testkit::unique_name("window-live");
    let live = spawn(&config(&stream, Some(&live_table), "startPosition: TRIM_HORIZON\n"), "live-1");

    let before = records(8, 0, 10);
    put_records(&kinesis, &stream, &before).await;
    tokio::time::sleep(GAP).await;
    let start = now_rfc3339();
    tokio::time::sleep(GAP).await;
    let inside_parents = records(8, 100, 10);
    put_records(&kinesis, &stream, &inside_parents).await;
    split(&kinesis, &stream, "shardId-000000000000").await;
    let inside_children = records(8, 200, 10);
    put_records(&kinesis, &stream, &inside_children).await;
    tokio::time::sleep(GAP).await;
    let end = now_rfc3339();
    let end_at = now_ms();
    tokio::time::sleep(GAP).await;
    let after = records(8, 300, 10);
    put_records(&kinesis, &stream, &after).await;

    let window_table = leasehold_testkit::unique_name("window-replay");
    let extra = format!("window: {{start: '{start}', end: '{end}', tipSlack: 2s}}\n");
    let mut window = spawn(&config(&stream, Some(&window_table), &extra), "window-1");
    let exit = window.wait_exit(Duration::from_secs(90)).expect("the window's worker exits by itself once done");
    assert!(exit.success(), "the window's worker exits 0 when every shard is finished: {exit:?}");
    assert!(now_ms() > end_at, "it cannot finish before the window ends");

    // Exactly the window's records, once each, none from before or after it.
    let inside: Vec<_> = inside_parents.iter().chain(&inside_children).cloned().collect();
    let replayed = window.deliveries();
    assert_exactly_once(&replayed, &inside);
    assert_eq!(replayed.len(), inside.len(), "no record outside the window was processed");
    assert_per_key_order(&[&window]);

    // Every row of the window's table is finished; the parent split inside the window among them.
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let store = DynamoLeaseStore::new(dynamodb, window_table, LeaseSettings::new("reader"));
    let rows = store.list().await.expect("window rows").leases;
    assert!(rows.len() >= 2, "rows of the window: {rows:?}");
    assert!(rows.iter().all(|r| r.checkpoint.is_shard_end()), "every window shard finished: {rows:?}");
    let completed = window.events("window completed: every shard is finished; stopping");
    assert_eq!(completed.len(), 1, "the worker logs its completion once");

    // The live group, untouched by the window, reads everything exactly once.
    let all: Vec<_> = before.iter().chain(&inside).chain(&after).cloned().collect();
    wait_for("the live worker reads every record", Duration::from_secs(60), async || {
        distinct(&live.deliveries()).len() >= all.len()
    })
    .await;
    assert_exactly_once(&live.deliveries(), &all);
}

/// A window's worker killed (-9) part-way: a second one on the same table takes the leases once they
/// expire, resumes each shard from its last checkpoint and finishes the window. Every record of the
/// window is processed, repeats only the crashed worker's unfinished suffix, and none outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_worker_killed_part_way_is_resumed_from_its_checkpoints() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "window-crash", 2).await;
    put_records(&kinesis, &stream, &records(4, 0, 5)).await;
    tokio::time::sleep(GAP).await;
    let start = now_rfc3339();
    tokio::time::sleep(GAP).await;
    let inside = records(8, 100, 25);
    put_records(&kinesis, &stream, &inside).await;
    tokio::time::sleep(GAP).await;
    let end = now_rfc3339();
    tokio::time::sleep(GAP).await;
    put_records(&kinesis, &stream, &records(4, 300, 5)).await;

    // 5 records a page, at most 5 pages a second per shard: the window takes seconds to read, so the
    // kill lands in the middle of it.
    let table = leasehold_testkit::unique_name("window-crash");
    let extra = format!(
        "reader: {{maxRecords: 5, idleTime: 100ms}}\nwindow: {{start: '{start}', end: '{end}', tipSlack: 2s}}\n"
    );
    let config = config(&stream, Some(&table), &extra);
    let mut victim = spawn(&config, "window-crash-1");
    wait_for("the first window worker is part-way", Duration::from_secs(60), async || {
        distinct(&victim.deliveries()).len() >= 40
    })
    .await;
    victim.signal("KILL");
    victim.wait_exit(Duration::from_secs(5)).expect("killed");
    let done_by_victim = distinct(&victim.deliveries()).len();
    assert!(done_by_victim < inside.len(), "the kill came part-way: {done_by_victim} of {}", inside.len());

    let mut heir = spawn(&config, "window-crash-2");
    let exit = heir.wait_exit(Duration::from_secs(90)).expect("the second window worker finishes the window");
    assert!(exit.success(), "it exits 0 once every shard is finished: {exit:?}");
    let deliveries = all_deliveries(&[&victim, &heir]);
    let repeats = assert_repeats_only_from_crashes(
        &deliveries,
        &inside,
        &[Victim { owner: &victim.owner, crashed_before: None }],
    );
    assert_eq!(distinct(&deliveries).len(), inside.len(), "no record outside the window was processed");
    assert!(!heir.deliveries().is_empty(), "the second worker resumed the window");
    println!("killed after {done_by_victim} of {} records; {repeats} processed again", inside.len());
    assert_per_key_order(&[&heir]);
}
