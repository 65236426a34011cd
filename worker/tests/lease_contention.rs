//! Contention on dynalite: eight workers race for three rows for ten seconds (override with
//! LEASEHOLD_CONTENTION_SECS), acquiring, renewing, checkpointing, releasing and sometimes stalling
//! past their lease. Every successful write is recorded independently of the store; the record must
//! show, for every row, one unbroken chain of writes in which only the holder renews, checkpoints or
//! releases, and another worker takes a lease only after its holder was silent for a lease duration.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_worker::lease::{
    Checkpoint, DynamoLeaseStore, Lease, LeaseError, LeaseKey, LeaseSettings, LeaseStore, NewLease, ShardLeases,
};
use rand::Rng;

const CONTENDERS: usize = 8;
const ROWS: u32 = 3;
const LEASE: Duration = Duration::from_millis(500);
/// Allowance for response latency when checking takeover gaps (see `check_row`).
const LATENCY_SLACK: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Acquire,
    Renew,
    Checkpoint,
    Release,
}

#[derive(Debug, Clone)]
struct Write {
    key: LeaseKey,
    counter: u64,
    owner: String,
    op: Op,
    at: Instant,
    checkpoint: Checkpoint,
}

#[derive(Debug, Default)]
struct Tally {
    refused_acquires: u64,
    refused_stale_writes: u64,
    transient: u64,
}

#[derive(Default)]
struct Record {
    writes: Mutex<Vec<Write>>,
    tally: Mutex<Tally>,
}

impl Record {
    /// Records a successful write by `writer` (for a release, the row itself no longer names it).
    fn write(&self, op: Op, writer: &str, lease: &Lease) {
        let write = Write {
            key: lease.key.clone(),
            counter: lease.counter,
            owner: writer.to_string(),
            op,
            at: Instant::now(),
            checkpoint: lease.checkpoint.clone(),
        };
        self.writes.lock().unwrap().push(write);
    }

    fn tally(&self, f: impl FnOnce(&mut Tally)) {
        f(&mut self.tally.lock().unwrap());
    }
}

async fn contend(id: usize, store: DynamoLeaseStore, record: Arc<Record>, until: Instant) {
    let me = store.settings().owner.clone();
    let mut held: HashMap<LeaseKey, Lease> = HashMap::new();
    let mut stalled_until: HashMap<LeaseKey, Instant> = HashMap::new();
    let mut sequence = 0u64;
    while Instant::now() < until {
        let page = match store.list().await {
            Ok(page) => page,
            Err(_) => {
                record.tally(|t| t.transient += 1);
                continue;
            }
        };
        for lease in page.leases {
            let key = lease.key.clone();
            if stalled_until.get(&key).is_some_and(|t| Instant::now() < *t) {
                continue;
            }
            if let Some(mine) = held.get(&key).cloned() {
                let roll = rand::rng().random_range(0..100);
                sequence += 1;
                let (op, result) = match roll {
                    0..55 => (Op::Renew, store.renew(&mine).await),
                    55..80 => {
                        let checkpoint = Checkpoint::Sequence(format!("{}{:09}", id + 1, sequence));
                        (Op::Checkpoint, store.checkpoint(&mine, &checkpoint).await)
                    }
                    80..90 => {
                        let last = Checkpoint::Sequence(format!("{}{:09}", id + 1, sequence));
                        let final_checkpoint = (roll % 2 == 0).then_some(&last);
                        (Op::Release, store.release(&mine, final_checkpoint).await)
                    }
                    _ => {
                        // Stall: keep the stale copy and fall silent for longer than a lease.
                        stalled_until.insert(key.clone(), Instant::now() + LEASE * 2);
                        continue;
                    }
                };
                match result {
                    Ok(lease) => {
                        record.write(op, &me, &lease);
                        if op == Op::Release {
                            held.remove(&key);
                        } else {
                            held.insert(key.clone(), lease);
                        }
                    }
                    Err(LeaseError::ConditionFailed { .. }) => {
                        held.remove(&key);
                        record.tally(|t| t.refused_stale_writes += 1);
                    }
                    Err(_) => {
                        held.remove(&key);
                        record.tally(|t| t.transient += 1);
                    }
                }
            } else if lease.owner.as_deref() != Some(me.as_str()) || !held.contains_key(&key) {
                match store.acquire(&lease).await {
                    Ok(lease) => {
                        record.write(Op::Acquire, &me, &lease);
                        held.insert(key.clone(), lease);
                    }
                    Err(e) if e.is_not_held() => record.tally(|t| t.refused_acquires += 1),
                    Err(LeaseError::NotObserved { .. }) => record.tally(|t| t.refused_acquires += 1),
                    Err(_) => record.tally(|t| t.transient += 1),
                }
            }
        }
        let pause = rand::rng().random_range(0..20);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

#[derive(Debug, Default)]
struct RowSummary {
    takeovers: u64,
    releases: u64,
}

/// Checks one row's history; panics naming the first violation.
fn check_row(key: &LeaseKey, mut writes: Vec<Write>, final_row: &Lease) -> RowSummary {
    writes.sort_by_key(|w| w.counter);
    let counters: Vec<u64> = writes.iter().map(|w| w.counter).collect();
    let expected: Vec<u64> = (1..=final_row.counter).collect();
    assert_eq!(
        counters, expected,
        "{key}: successful writes must carry counters 1..={} exactly once each (a repeat means two writes \
         succeeded from the same state; a gap means a write nobody recorded)",
        final_row.counter
    );
    let mut summary = RowSummary::default();
    let mut last_checkpoint = Checkpoint::TrimHorizon;
    for pair in writes.windows(2) {
        let (prev, this) = (&pair[0], &pair[1]);
        let prev_holds = prev.op != Op::Release;
        match this.op {
            Op::Renew | Op::Checkpoint | Op::Release => assert!(
                prev_holds && prev.owner == this.owner,
                "{key}: {:?} by {} at counter {} while the row was {} by {}",
                this.op,
                this.owner,
                this.counter,
                if prev_holds { "held" } else { "released" },
                prev.owner
            ),
            Op::Acquire if prev_holds && prev.owner != this.owner => {
                summary.takeovers += 1;
                let silent_for = this.at.saturating_duration_since(prev.at);
                assert!(
                    silent_for + LATENCY_SLACK >= LEASE,
                    "{key}: {} took the lease from {} after only {silent_for:?} of silence",
                    this.owner,
                    prev.owner
                );
            }
            Op::Acquire => {}
        }
        if this.op == Op::Release {
            summary.releases += 1;
        }
        if matches!(this.op, Op::Checkpoint | Op::Release) {
            last_checkpoint = this.checkpoint.clone();
        }
    }
    if final_row.counter > 0 && last_checkpoint != Checkpoint::TrimHorizon {
        assert_eq!(final_row.checkpoint, last_checkpoint, "{key}: the stored checkpoint is the last one written");
    }
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_contenders_never_hold_a_row_together() {
    let seconds: u64 = std::env::var("LEASEHOLD_CONTENTION_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let client = leasehold_testkit::dynamodb_client().await;
    let table = leasehold_testkit::create_lease_table(&client, "contention").await;
    let setup = DynamoLeaseStore::new(client.clone(), table.clone(), LeaseSettings::new("setup"));
    let keys: Vec<LeaseKey> = (0..ROWS).map(|i| LeaseKey::new("race", format!("shardId-{i:012}"))).collect();
    for key in &keys {
        setup
            .create_if_absent(&NewLease {
                key: key.clone(),
                checkpoint: Checkpoint::TrimHorizon,
                parent_shard_ids: vec![],
                stream_created: None,
            })
            .await
            .unwrap();
    }

    let record = Arc::new(Record::default());
    let until = Instant::now() + Duration::from_secs(seconds);
    let contenders: Vec<_> = (0..CONTENDERS)
        .map(|id| {
            let settings = LeaseSettings::new(format!("worker-{id}")).with_duration(LEASE);
            let store = DynamoLeaseStore::new(client.clone(), table.clone(), settings);
            tokio::spawn(contend(id, store, record.clone(), until))
        })
        .collect();
    for contender in contenders {
        contender.await.expect("contender task");
    }

    let writes = std::mem::take(&mut *record.writes.lock().unwrap());
    let tally = std::mem::take(&mut *record.tally.lock().unwrap());
    let total = writes.len();
    let mut by_row: BTreeMap<LeaseKey, Vec<Write>> = BTreeMap::new();
    for write in writes {
        by_row.entry(write.key.clone()).or_default().push(write);
    }
    let (mut takeovers, mut releases) = (0, 0);
    for key in &keys {
        let final_row = setup.get(key).await.unwrap().unwrap();
        let summary = check_row(key, by_row.remove(key).unwrap_or_default(), &final_row);
        takeovers += summary.takeovers;
        releases += summary.releases;
    }
    println!(
        "{total} successful writes in {seconds} s; {takeovers} takeovers after expiry, {releases} releases, \
         {} refused acquires, {} refused stale writes, {} transient errors",
        tally.refused_acquires, tally.refused_stale_writes, tally.transient
    );
    // The run must have exercised every path, or its silence proves nothing.
    assert!(total >= 100 * seconds as usize / 10, "too few writes to mean anything: {total}");
    assert!(takeovers >= 1, "no lease was ever taken over after a stall");
    assert!(releases >= 1, "no lease was ever released");
    assert!(tally.refused_acquires >= 1, "no acquire was ever refused");
    assert!(tally.refused_stale_writes >= 1, "no stale holder ever tried to write");
}
