//! Failures of worker processes: kill -9, SIGTERM, SIGSTOP past the lease. Lease 2 s, renew 500 ms,
//! scan 250 ms (see `common::FAST_TIMING`). Kill -9 and SIGTERM run with enhanced fan-out too.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::*;
use leasehold_testkit::process::{WorkerProcess, wait_for};

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(500);
const SCAN: Duration = Duration::from_millis(250);

async fn balanced_pair(
    emulator: Emulator,
    shards: i32,
    prefix: &str,
) -> (aws_sdk_kinesis::Client, String, [WorkerProcess; 2]) {
    let kinesis = emulator.client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, shards).await;
    let table = leasehold_testkit::unique_name(prefix);
    let config = emulator.config(&stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let workers = [spawn(&config, &format!("{prefix}-a")), spawn(&config, &format!("{prefix}-b"))];
    let half = usize::try_from(shards / 2).unwrap();
    wait_for("two workers balanced", Duration::from_secs(30), async || {
        workers.iter().all(|w| w.held_shards().len() == half)
    })
    .await;
    (kinesis, stream, workers)
}

async fn killed_workers_shards_resume_elsewhere_within_lease_plus_renew(emulator: Emulator) {
    let (kinesis, stream, [mut victim, survivor]) = balanced_pair(emulator, 4, "kill").await;
    let producer = Producer::start(kinesis.clone(), &stream, 50, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let orphaned = victim.held_shards();
    victim.signal("KILL");
    let killed_at = SystemTime::now();
    victim.wait_exit(Duration::from_secs(5)).expect("killed");
    wait_for("survivor holds every shard", Duration::from_secs(15), async || survivor.held_shards().len() == 4).await;
    let takeovers = metric(&survivor, "leasehold_lease_takeovers_total").await;
    assert_eq!(takeovers, orphaned.len() as f64, "the survivor counts each lease it took over");
    for shard in &orphaned {
        let taken = event_time(&survivor, "lease acquired", shard).expect("taken over");
        let failover = taken.duration_since(killed_at).unwrap_or_default();
        println!("{shard}: failover {failover:?}");
        assert!(
            failover <= LEASE + RENEW + SCAN,
            "{shard} took {failover:?} to move (lease {LEASE:?} + renew {RENEW:?})"
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&[&victim, &survivor])).len() >= written.len()
    })
    .await;
    let deliveries = all_deliveries(&[&victim, &survivor]);
    assert_per_key_order(&[&victim, &survivor]);
    // Repeats come only from the victim's last uncheckpointed stretch: per shard, a suffix of what it
    // processed there; the survivor's own shards repeat nothing.
    let repeats = assert_repeats_only_from_crashes(
        &deliveries,
        &written,
        &[Victim { owner: &victim.owner, crashed_before: None }],
    );
    println!("{repeats} records processed again after the crash");
    // kinesis-mock pushes a shard's records once a second: a crash between an event's records
    // finishing and their checkpoint repeats up to one push (about 250 records a shard here).
    let per_shard = if emulator == Emulator::KinesisMockFanOut { 300 } else { 150 };
    assert!(
        repeats <= per_shard * orphaned.len(),
        "{repeats} redelivered for {} shards; checkpoints every 200 ms (and {per_shard} a shard) should bound this",
        orphaned.len()
    );
}

/// A worker's log lines about leases and handoffs, for a failure message.
fn lease_lines(worker: &WorkerProcess) -> String {
    let text = worker.stderr_text();
    let about = ["lease ", "handoff", "shutting down"];
    text.lines().filter(|l| about.iter().any(|a| l.contains(a))).collect::<Vec<_>>().join("\n")
}

async fn sigterm_moves_shards_at_once_without_duplicates(emulator: Emulator) {
    let (kinesis, stream, [mut leaver, mut stayer]) = balanced_pair(emulator, 4, "term").await;
    let producer = Producer::start(kinesis.clone(), &stream, 50, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let moving = leaver.held_shards();
    leaver.signal("TERM");
    let termed_at = SystemTime::now();
    let status = leaver.wait_exit(Duration::from_secs(10)).expect("leaver exits");
    assert!(status.success(), "graceful exit: {status:?}\n{}", leaver.stderr_text());
    wait_for("stayer holds every shard", Duration::from_secs(10), async || stayer.held_shards().len() == 4).await;
    for shard in &moving {
        let moved =
            event_time(&stayer, "lease acquired", shard).expect("taken").duration_since(termed_at).unwrap_or_default();
        println!("{shard}: moved {moved:?} after SIGTERM");
        assert!(
            moved < LEASE / 2,
            "{shard} took {moved:?}: a graceful move must be well inside one lease\nleaver:\n{}\nstayer:\n{}",
            lease_lines(&leaver),
            lease_lines(&stayer)
        );
    }
    // The leaver told the stayer of each row it freed (one notice a row), rather than leave them to its scans.
    let notices = stayer.events("handoff notice received").len();
    let on_notice = stayer.events("lease freed for this worker by its holder; taking it").len();
    println!("{notices} handoff notices received, {on_notice} rows taken on them");
    if on_notice < notices {
        let text = stayer.stderr_text();
        let about: Vec<&str> = text.lines().filter(|l| l.contains("notice") || l.contains("lease acquired")).collect();
        println!("rows not taken on their notices:\n{}", about.join("\n"));
    }
    assert_eq!(
        notices,
        moving.len(),
        "one notice for each freed row\nleaver:\n{}\nstayer:\n{}",
        lease_lines(&leaver),
        stayer.stderr_text()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&[&leaver, &stayer])).len() >= written.len()
    })
    .await;
    let deliveries = all_deliveries(&[&leaver, &stayer]);
    // A graceful shutdown checkpoints before releasing: no repeats.
    assert_exactly_once(&deliveries, &written);
    assert_per_key_order(&[&leaver, &stayer]);
    assert_eq!(check_handovers(&deliveries), 0);
    assert_running(&mut [&mut stayer]);
}

async fn a_stopped_worker_past_its_lease_stops_its_lost_shards_on_resume(emulator: Emulator) {
    let (kinesis, stream, [sleeper, other]) = balanced_pair(emulator, 4, "stop").await;
    let producer = Producer::start(kinesis.clone(), &stream, 50, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lost = sleeper.held_shards();
    sleeper.signal("STOP");
    wait_for("other takes every shard", Duration::from_secs(15), async || other.held_shards().len() == 4).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resumed_at = Instant::now();
    // The same moment by the machine's clock, to compare with the times the sleeper logged.
    let resumed_wall = SystemTime::now();
    sleeper.signal("CONT");
    wait_for("sleeper notices its losses", Duration::from_secs(5), async || {
        lost.iter().all(|shard| event_time(&sleeper, "lease lost", shard).is_some_and(|at| at >= resumed_wall))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let late: Vec<_> = sleeper
        .deliveries()
        .into_iter()
        .filter(|d| d.seen_at > resumed_at + Duration::from_millis(100))
        .filter(|d| lost.contains(&format!("{}:{}", d.stream, d.shard_id)))
        .filter(|d| {
            event_time(&sleeper, "lease acquired", &format!("{}:{}", d.stream, d.shard_id))
                .is_none_or(|at| at < resumed_wall)
        })
        .collect();
    assert!(late.is_empty(), "processed {} records of lost shards after resuming, e.g. {:?}", late.len(), late.first());
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(30), async || {
        distinct(&all_deliveries(&[&sleeper, &other])).len() >= written.len()
    })
    .await;
    // Only what the sleeper processed before it was stopped (and finished within 100 ms of resuming)
    // may come again, as a suffix per shard.
    let victim = Victim { owner: &sleeper.owner, crashed_before: Some(resumed_at + Duration::from_millis(100)) };
    let repeats = assert_repeats_only_from_crashes(&all_deliveries(&[&sleeper, &other]), &written, &[victim]);
    println!("{repeats} records processed again after the stop");
}

on_every_ground!(
    killed_workers_shards_resume_elsewhere_within_lease_plus_renew,
    sigterm_moves_shards_at_once_without_duplicates
);
// With fan-out a stopped holder's subscription stays open: the new holder is refused
// (ResourceInUseException) until the sleeper resumes, a case of fanout_faults.rs.
on_both_emulators!(a_stopped_worker_past_its_lease_stops_its_lost_shards_on_resume);
