//! The coordinator's decisions over the memory store, a stand-in shard source and a paused clock: whole
//! groups of coordinators in one test, in every mode (full, segmented, manual assignment), with no
//! emulator and no process. The clock is tokio's, paused: it moves only when every task waits, straight
//! to the next timer, so minutes of lease time pass in milliseconds and every run takes the same steps.
//! The lease store judges expiry on the same clock ([`PausedClock`]).

mod stand_ins;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Balance, Coordinator, CoordinatorSettings, Mode};
use crate::dispatch::RecordRunner;
use crate::lease::{LeaseKey, LeaseSettings, LeaseStore, MemoryLeaseStore, MemoryLeaseTable, ShardLeases};
use crate::metrics::Metrics;
use crate::shard::ReaderSettings;
use stand_ins::{Ignore, PausedClock, Severable, StandInShards};

const STREAM: &str = "orders";
const LEASE: Duration = Duration::from_secs(3);

fn settings(mode: Mode) -> CoordinatorSettings {
    CoordinatorSettings {
        renew_interval: Duration::from_secs(1),
        scan_interval: Duration::from_millis(500),
        shard_sync_interval: Duration::from_secs(2),
        graceful_timeout: Duration::from_secs(2),
        handoff_timeout: Duration::from_secs(5),
        reader: ReaderSettings::default(),
        mode,
        balance: Balance::Count,
    }
}

const SEGMENTED: Mode = Mode::Segmented { rows_per_segment: 4 };

/// A running coordinator of the group.
struct Worker {
    store: Arc<Severable>,
    shutdown: CancellationToken,
    run: JoinHandle<()>,
}

/// Coordinators sharing one memory table and one stand-in source.
struct Group {
    table: MemoryLeaseTable,
    shards: Arc<StandInShards>,
    clock: Arc<PausedClock>,
    workers: BTreeMap<String, Worker>,
}

impl Group {
    fn new(shards: StandInShards) -> Self {
        Self {
            table: MemoryLeaseTable::new(),
            shards: Arc::new(shards),
            clock: Arc::new(PausedClock { start: Instant::now() }),
            workers: BTreeMap::new(),
        }
    }

    fn start(&mut self, owner: &str, settings: CoordinatorSettings) {
        let lease = LeaseSettings::new(owner).with_duration(LEASE).with_clock(self.clock.clone());
        let store = Arc::new(Severable {
            inner: self.table.store(lease),
            cut: AtomicBool::new(false),
            whole_reads: AtomicU64::new(0),
        });
        let metrics: Arc<Metrics> = Arc::default();
        let runner = Arc::new(RecordRunner::new(metrics.clone()));
        let processors = Arc::new(|_: &LeaseKey| Ignore);
        let coordinator = Coordinator::new(store.clone(), self.shards.clone(), runner, metrics, processors, settings);
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(coordinator.run(shutdown.clone()));
        self.workers.insert(owner.into(), Worker { store, shutdown, run });
    }

    /// Shuts `owner` down as SIGTERM does, and waits for it to have given everything back.
    async fn stop(&mut self, owner: &str) {
        let worker = self.workers.remove(owner).expect("a running worker");
        worker.shutdown.cancel();
        worker.run.await.expect("coordinator ran to its end");
    }

    /// Cuts `owner` off from the table: it can no longer renew, read or release.
    fn cut(&self, owner: &str) {
        self.workers[owner].store.cut.store(true, Ordering::SeqCst);
    }

    /// Lets `owner` reach the table again.
    fn heal(&self, owner: &str) {
        self.workers[owner].store.cut.store(false, Ordering::SeqCst);
    }

    /// Shards read now per worker: a row handed to a worker counts once it reads the shard.
    fn holders(&self) -> BTreeMap<String, usize> {
        self.shards.reading_now()
    }

    /// A store reading the table as an onlooker.
    fn onlooker(&self) -> MemoryLeaseStore {
        self.table.store(LeaseSettings::new("onlooker").with_clock(self.clock.clone()))
    }

    /// Waits (on the paused clock) until the holders are `expected`; how long it took.
    async fn until_held(&self, expected: &[(&str, usize)], limit: Duration) -> Duration {
        let expected: BTreeMap<String, usize> =
            expected.iter().filter(|(_, n)| *n > 0).map(|(o, n)| ((*o).to_string(), *n)).collect();
        self.until(&format!("holders {expected:?}"), limit, |holders| *holders == expected).await
    }

    /// Waits (on the paused clock) until the holders satisfy `done`; how long it took.
    async fn until(&self, what: &str, limit: Duration, done: impl Fn(&BTreeMap<String, usize>) -> bool) -> Duration {
        let started = Instant::now();
        loop {
            let holders = self.holders();
            if done(&holders) {
                return started.elapsed();
            }
            assert!(started.elapsed() < limit, "{what} not reached within {limit:?}: holders {holders:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop_all(mut self) {
        let owners: Vec<String> = self.workers.keys().cloned().collect();
        for owner in owners {
            self.stop(&owner).await;
        }
        assert_eq!(self.shards.overlaps(), Vec::<String>::new(), "no shard read by two workers at once");
        assert_eq!(self.shards.restarts(), Vec::<String>::new(), "every reading resumed where the last one left");
    }
}

async fn group_splits_evenly_and_a_newcomer_gets_its_share_by_handoff(mode: Mode) {
    let mut group = Group::new(StandInShards::open(6));
    group.start("w1", settings(mode.clone()));
    group.until_held(&[("w1", 6)], Duration::from_secs(10)).await;
    group.start("w2", settings(mode.clone()));
    group.until_held(&[("w1", 3), ("w2", 3)], Duration::from_secs(20)).await;
    group.start("w3", settings(mode.clone()));
    group.until_held(&[("w1", 2), ("w2", 2), ("w3", 2)], Duration::from_secs(20)).await;
    // Every move was a handoff, the new holder starting where the old one stopped (checked by
    // `stop_all`), and each join moved only the newcomer's share: 3 shards to w2, then 2 to w3.
    let readings = group.shards.readings();
    let moved = readings.iter().filter(|r| r.owner != "w1").count();
    assert_eq!(moved, 3 + 2, "no shard moved but to a newcomer: {readings:#?}");
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn full_scans_split_a_group_evenly_by_handoff() {
    group_splits_evenly_and_a_newcomer_gets_its_share_by_handoff(Mode::Full).await;
}

#[tokio::test(start_paused = true)]
async fn segmented_scans_split_a_group_evenly_by_handoff() {
    group_splits_evenly_and_a_newcomer_gets_its_share_by_handoff(SEGMENTED).await;
}

async fn a_cut_off_workers_shards_move_after_one_lease(mode: Mode) {
    let mut group = Group::new(StandInShards::open(12));
    for owner in ["w1", "w2", "w3"] {
        group.start(owner, settings(mode.clone()));
    }
    group.until_held(&[("w1", 4), ("w2", 4), ("w3", 4)], Duration::from_secs(30)).await;
    group.cut("w2");
    let moved = group.until_held(&[("w1", 6), ("w2", 0), ("w3", 6)], Duration::from_secs(30)).await;
    println!("cut off: shards held elsewhere {moved:?} after the cut (lease {LEASE:?})");
    // Expiry is judged on the counter seen unchanged for a lease: no sooner (the takeover would
    // overlap a live holder), and soon after (a scan interval or two).
    assert!(moved >= LEASE, "taken over after {moved:?}, before a lease ({LEASE:?}) ran out");
    assert!(moved <= LEASE + Duration::from_secs(2), "taken over {moved:?} after the cut");
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn full_scans_take_a_cut_off_workers_shards_after_one_lease() {
    a_cut_off_workers_shards_move_after_one_lease(Mode::Full).await;
}

#[tokio::test(start_paused = true)]
async fn segmented_scans_take_a_cut_off_workers_shards_after_one_lease() {
    a_cut_off_workers_shards_move_after_one_lease(SEGMENTED).await;
}

async fn shutdown_hands_every_lease_over_at_once(mode: Mode) {
    let mut group = Group::new(StandInShards::open(6));
    group.start("w1", settings(mode.clone()));
    group.start("w2", settings(mode.clone()));
    group.until_held(&[("w1", 3), ("w2", 3)], Duration::from_secs(20)).await;
    let stopped = Instant::now();
    group.stop("w1").await;
    let moved = group.until_held(&[("w2", 6)], Duration::from_secs(10)).await + stopped.elapsed();
    println!("SIGTERM: shards held elsewhere {moved:?} after the stop");
    // Released, not expired: the peer takes the rows long before a lease could run out.
    assert!(moved < LEASE / 2, "held elsewhere {moved:?} after SIGTERM");
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn full_scans_hand_every_lease_over_at_shutdown() {
    shutdown_hands_every_lease_over_at_once(Mode::Full).await;
}

#[tokio::test(start_paused = true)]
async fn segmented_scans_hand_every_lease_over_at_shutdown() {
    shutdown_hands_every_lease_over_at_once(SEGMENTED).await;
}

async fn a_child_is_read_only_after_its_parents_ended(mode: Mode) {
    let mut shards = StandInShards::open(2);
    shards.shards.push(("parent-a".into(), vec![]));
    shards.shards.push(("parent-b".into(), vec![]));
    shards.shards.push(("child".into(), vec!["parent-a".into(), "parent-b".into()]));
    shards.ending = ["parent-a".to_string(), "parent-b".to_string()].into();
    let mut group = Group::new(shards);
    group.start("w1", settings(mode.clone()));
    group.start("w2", settings(mode.clone()));
    // Three open shards in the end (two plus the child) split 2/1.
    group
        .until("the open shards split 2/1", Duration::from_secs(30), |holders| {
            holders.values().sum::<usize>() == 3 && holders.len() == 2
        })
        .await;
    let readings = group.shards.readings();
    let at = |shard: &str| readings.iter().position(|r| r.shard == shard).expect("read");
    assert!(at("child") > at("parent-a") && at("child") > at("parent-b"), "child after its parents: {readings:?}");
    assert_eq!(readings.iter().filter(|r| r.shard.starts_with("parent")).count(), 2, "each parent read once");
    let store = group.onlooker();
    for parent in ["parent-a", "parent-b"] {
        let row = store.get(&LeaseKey::new(STREAM, parent)).await.expect("read").expect("row");
        assert!(row.checkpoint.is_shard_end() && row.owner.is_none(), "{parent}: {row:?}");
    }
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn full_scans_read_a_child_only_after_its_parents_ended() {
    a_child_is_read_only_after_its_parents_ended(Mode::Full).await;
}

#[tokio::test(start_paused = true)]
async fn segmented_scans_read_a_child_only_after_its_parents_ended() {
    a_child_is_read_only_after_its_parents_ended(SEGMENTED).await;
}

#[tokio::test(start_paused = true)]
async fn manual_assignment_runs_exactly_the_assigned_shards_without_membership() {
    let mut group = Group::new(StandInShards::open(4));
    let assigned = |shards: &[&str]| CoordinatorSettings {
        mode: Mode::Assigned(shards.iter().map(|s| LeaseKey::new(STREAM, *s)).collect()),
        ..settings(SEGMENTED)
    };
    group.start("w1", assigned(&["shard-00"]));
    group.start("w2", assigned(&["shard-01", "shard-02", "shard-03"]));
    group.until_held(&[("w1", 1), ("w2", 3)], Duration::from_secs(10)).await;
    // Nobody balances: over many scans the split stays as assigned.
    tokio::time::sleep(Duration::from_secs(30)).await;
    group.until_held(&[("w1", 1), ("w2", 3)], Duration::ZERO).await;
    let store = group.onlooker();
    let page = store.list().await.expect("read");
    assert!(page.members.is_empty(), "no membership rows: {:?}", page.members);
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_segmented_group_at_rest_reads_the_whole_table_rarely() {
    let quiet = || CoordinatorSettings { shard_sync_interval: Duration::from_secs(10), ..settings(SEGMENTED) };
    let mut group = Group::new(StandInShards::open(12));
    for owner in ["w1", "w2", "w3"] {
        group.start(owner, quiet());
    }
    group.until_held(&[("w1", 4), ("w2", 4), ("w3", 4)], Duration::from_secs(30)).await;
    let whole_reads =
        |group: &Group| -> u64 { group.workers.values().map(|w| w.store.whole_reads.load(Ordering::SeqCst)).sum() };
    let before = whole_reads(&group);
    let minute = Duration::from_secs(60);
    tokio::time::sleep(minute).await;
    let read = whole_reads(&group) - before;
    // With full scans each worker reads it every scan interval: 3 x 120 a minute. Segmented, each reads
    // it once every max(shardSyncInterval, 4 x scanInterval x workers) = 10 s, and the term holder for
    // its shard syncs (every 10 s): about 24 a minute, a fifteenth.
    let full = 3 * (minute.as_millis() / settings(SEGMENTED).scan_interval.as_millis()) as u64;
    assert!(read <= full / 10, "{read} whole reads a minute at rest (full scans: {full})");
    group.until_held(&[("w1", 4), ("w2", 4), ("w3", 4)], Duration::ZERO).await;
    group.stop_all().await;
}

async fn a_worker_stopped_right_after_a_handoff_frees_the_rows_it_was_handed(mode: Mode) {
    let mut group = Group::new(StandInShards::open(6));
    group.start("w1", settings(mode.clone()));
    group.until_held(&[("w1", 6)], Duration::from_secs(10)).await;
    group.start("w2", settings(mode.clone()));
    // The moment a row names w2 as its holder (handed over by w1) before w2 reads it.
    let onlooker = group.onlooker();
    let started = Instant::now();
    loop {
        let page = onlooker.list().await.expect("read");
        let handed = page.leases.iter().filter(|l| l.is_held_by("w2")).count();
        if handed > group.holders().get("w2").copied().unwrap_or(0) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no row handed to w2");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = Instant::now();
    group.stop("w2").await;
    let moved = group.until_held(&[("w1", 6)], Duration::from_secs(10)).await + stopped.elapsed();
    println!("stopped after a handoff: shards read again {moved:?} after the stop");
    assert!(moved < LEASE / 2, "w1 read every shard again {moved:?} after w2 stopped");
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn full_scans_get_back_rows_handed_to_a_worker_that_stopped_before_reading_them() {
    a_worker_stopped_right_after_a_handoff_frees_the_rows_it_was_handed(Mode::Full).await;
}

#[tokio::test(start_paused = true)]
async fn segmented_scans_get_back_rows_handed_to_a_worker_that_stopped_before_reading_them() {
    a_worker_stopped_right_after_a_handoff_frees_the_rows_it_was_handed(SEGMENTED).await;
}

async fn a_lost_shards_reader_still_finishing_is_not_doubled_when_the_row_comes_back(mode: Mode) {
    // w1's readers go on 10 s after their leases are lost: w1 is cut off, w2 takes everything over and
    // stops (the rows are free), w1 comes back while its old readers still finish. A second reader of a
    // shard in w1 would process what the first still processes, and the first one's end would be
    // taken for the second's (it was: the chaos suite's seed 7774758893317915278).
    let mut shards = StandInShards::open(2);
    shards.linger_after_loss = Duration::from_secs(10);
    let mut group = Group::new(shards);
    group.start("w1", settings(mode.clone()));
    group.until_held(&[("w1", 2)], Duration::from_secs(10)).await;
    group.start("w2", settings(mode.clone()));
    group.until_held(&[("w1", 1), ("w2", 1)], Duration::from_secs(20)).await;
    group.cut("w1");
    let onlooker = group.onlooker();
    let started = Instant::now();
    while onlooker.list().await.expect("read").leases.iter().filter(|l| l.is_held_by("w2")).count() < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "w2 did not take w1's shard over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    group.stop("w2").await;
    group.heal("w1");
    // Its old reader ends 10 s after the loss; then w1 reads both shards, each once.
    tokio::time::sleep(Duration::from_secs(30)).await;
    group.until_held(&[("w1", 2)], Duration::ZERO).await;
    let readings = group.shards.readings();
    assert_eq!(
        readings.iter().filter(|r| r.owner == "w1").count(),
        2 + 2,
        "w1 read each shard once more: {readings:#?}"
    );
    group.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn full_scans_never_run_two_readers_of_a_shard_in_one_worker() {
    a_lost_shards_reader_still_finishing_is_not_doubled_when_the_row_comes_back(Mode::Full).await;
}

#[tokio::test(start_paused = true)]
async fn segmented_scans_never_run_two_readers_of_a_shard_in_one_worker() {
    a_lost_shards_reader_still_finishing_is_not_doubled_when_the_row_comes_back(SEGMENTED).await;
}
