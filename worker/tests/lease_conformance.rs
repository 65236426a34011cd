//! One conformance suite for every lease store: the same test bodies run against `MemoryLeaseStore`
//! and against `DynamoLeaseStore` on dynalite (which must be running: `make emulators`).
//!
//! Each worker in a test has its own `ManualClock`, so expiry is driven by moving monotonic clocks
//! rather than by sleeping, and clock skew is a constructor argument.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use leasehold_worker::internals::lease::{AttrValue, Attributes};
use leasehold_worker::lease::{
    Checkpoint, DynamoLeaseStore, Lease, LeaseError, LeaseKey, LeaseSettings, LeaseStore, ManualClock,
    MemoryLeaseTable, NewLease, ShardLoad,
};

const LEASE: Duration = Duration::from_secs(10);
const HOUR_MS: i64 = 3_600_000;

/// A fresh, empty lease table and a way to open stores on it.
#[async_trait]
trait Harness: Sized + Send + Sync {
    async fn new() -> Self;
    fn store(&self, owner: &str, clock: Arc<ManualClock>) -> Box<dyn LeaseStore>;
    fn progress(&self, owner: &str) -> Box<dyn leasehold_worker::lease::ProgressRows>;
    async fn put_raw(&self, attrs: Attributes);
}

struct Memory(MemoryLeaseTable);

#[async_trait]
impl Harness for Memory {
    async fn new() -> Self {
        Memory(MemoryLeaseTable::new())
    }
    fn store(&self, owner: &str, clock: Arc<ManualClock>) -> Box<dyn LeaseStore> {
        Box::new(self.0.store(LeaseSettings::new(owner).with_duration(LEASE).with_clock(clock)))
    }
    fn progress(&self, owner: &str) -> Box<dyn leasehold_worker::lease::ProgressRows> {
        Box::new(self.0.store(LeaseSettings::new(owner)))
    }
    async fn put_raw(&self, attrs: Attributes) {
        self.0.put_raw(attrs);
    }
}

struct Dynamo {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

#[async_trait]
impl Harness for Dynamo {
    async fn new() -> Self {
        let client = leasehold_testkit::dynamodb_client().await;
        let table = leasehold_testkit::create_lease_table(&client, "conformance").await;
        Dynamo { client, table }
    }
    fn store(&self, owner: &str, clock: Arc<ManualClock>) -> Box<dyn LeaseStore> {
        let settings = LeaseSettings::new(owner).with_duration(LEASE).with_clock(clock);
        Box::new(DynamoLeaseStore::new(self.client.clone(), self.table.clone(), settings))
    }
    fn progress(&self, owner: &str) -> Box<dyn leasehold_worker::lease::ProgressRows> {
        Box::new(DynamoLeaseStore::new(self.client.clone(), self.table.clone(), LeaseSettings::new(owner)))
    }
    async fn put_raw(&self, attrs: Attributes) {
        let item = attrs
            .into_iter()
            .map(|(name, value)| {
                let value = match value {
                    AttrValue::S(s) => AttributeValue::S(s),
                    AttrValue::N(n) => AttributeValue::N(n),
                    AttrValue::Ss(ss) => AttributeValue::Ss(ss),
                    AttrValue::Other(_) => AttributeValue::Bool(true),
                };
                (name, value)
            })
            .collect();
        self.client.put_item().table_name(&self.table).set_item(Some(item)).send().await.expect("put raw row");
    }
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::default())
}

fn key(shard: u32) -> LeaseKey {
    LeaseKey::new("orders", format!("shardId-{shard:012}"))
}

fn new_lease(key: &LeaseKey) -> NewLease {
    NewLease { key: key.clone(), checkpoint: Checkpoint::TrimHorizon, parent_shard_ids: vec![], stream_created: None }
}

async fn created(store: &dyn LeaseStore, key: &LeaseKey) -> Lease {
    assert!(store.create_if_absent(&new_lease(key)).await.expect("create"));
    read(store, key).await
}

async fn read(store: &dyn LeaseStore, key: &LeaseKey) -> Lease {
    store.get(key).await.expect("get").expect("row exists")
}

fn raw(pairs: &[(&str, AttrValue)]) -> Attributes {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

// ---- the cases ----

async fn create_if_absent_creates_once<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let k = key(0);
    let lease = NewLease {
        key: k.clone(),
        checkpoint: Checkpoint::Latest,
        parent_shard_ids: vec!["shardId-000000000007".into(), "shardId-000000000008".into()],
        stream_created: None,
    };
    assert!(a.create_if_absent(&lease).await.unwrap());
    let first = read(&*a, &k).await;
    assert!(!a.create_if_absent(&new_lease(&k)).await.unwrap(), "second create must report the row exists");
    let second = read(&*a, &k).await;
    assert_eq!(first, second, "second create must not touch the row");
    assert_eq!((second.owner, second.expiry_ms, second.counter), (None, None, 0));
    assert_eq!(second.checkpoint, Checkpoint::Latest);
    let mut parents = second.parent_shard_ids;
    parents.sort();
    assert_eq!(parents, vec!["shardId-000000000007", "shardId-000000000008"]);
    assert!(a.get(&key(1)).await.unwrap().is_none());
}

async fn replace_swaps_an_unchanged_row_and_revokes_its_holder<H: Harness>(h: &H) {
    let (a, b_clock) = (h.store("a", clock()), clock());
    let b = h.store("b", b_clock.clone());
    let k = key(0);
    let seen = created(&*a, &k).await;
    let held = a.acquire(&seen).await.expect("taken");
    let held = a.checkpoint(&held, &Checkpoint::Sequence("42".into())).await.expect("checkpoint");
    let fresh = NewLease { stream_created: Some(1_700_000_000_000), ..new_lease(&k) };
    assert!(b.replace(&seen, &fresh).await.expect_err("stale copy").is_not_held(), "refused on a changed row");
    let former = read(&*b, &k).await;
    b.replace(&former, &fresh).await.expect("replaced");
    let row = read(&*b, &k).await;
    assert_eq!(
        (row.checkpoint.clone(), row.stream_created, row.counter),
        (Checkpoint::TrimHorizon, Some(1_700_000_000_000), held.counter + 1)
    );
    // The former holder stays the owner: nobody else takes the row before it has been silent for a lease.
    assert_eq!((row.owner.as_deref(), row.expiry_ms), (Some("a"), held.expiry_ms), "owner and expiry kept");
    assert!(a.renew(&held).await.expect_err("the old holder").is_not_held(), "the holder of the old row lost it");
    assert!(
        a.checkpoint(&held, &Checkpoint::Sequence("43".into())).await.expect_err("no old checkpoint").is_not_held()
    );
    b_clock.advance(LEASE - Duration::from_millis(1));
    assert!(matches!(b.acquire(&row).await, Err(LeaseError::HeldByOther { .. })), "a takeover waits out the lease");
    b_clock.advance(Duration::from_millis(1));
    let taken = b.acquire(&row).await.expect("taken after a silent lease duration");
    assert_eq!((taken.owner.as_deref(), taken.checkpoint), (Some("b"), Checkpoint::TrimHorizon));
    // A free row stays free when replaced, and the former holder itself may take its replaced row at once.
    let (k2, fresh2) = (key(1), NewLease { stream_created: Some(1_700_000_000_000), ..new_lease(&key(1)) });
    let free = created(&*a, &k2).await;
    a.replace(&free, &fresh2).await.expect("free row replaced");
    assert_eq!(read(&*a, &k2).await.owner, None, "a free row stays free");
    let k3 = key(2);
    let mine = a.acquire(&created(&*a, &k3).await).await.expect("taken");
    a.replace(&mine, &NewLease { stream_created: Some(1_700_000_000_000), ..new_lease(&k3) }).await.expect("replaced");
    let retaken = a.acquire(&read(&*a, &k3).await).await.expect("the owner retakes its replaced row at once");
    assert_eq!(retaken.checkpoint, Checkpoint::TrimHorizon);
}

async fn acquire_free_row_sets_owner_expiry_and_counter<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let k = key(0);
    let seen = created(&*a, &k).await;
    let before = a.settings().clock.wall_ms();
    let held = a.acquire(&seen).await.expect("free row is taken");
    assert_eq!(held.owner.as_deref(), Some("a"));
    assert_eq!(held.counter, seen.counter + 1);
    let expiry = held.expiry_ms.expect("expiry written");
    assert!(expiry >= before + 10_000 && expiry <= a.settings().clock.wall_ms() + 10_000, "expiry = now + duration");
    assert_eq!(read(&*a, &k).await, held);
}

async fn live_lease_of_another_is_refused<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let seen = read(&*b, &k).await;
    match b.acquire(&seen).await {
        Err(LeaseError::HeldByOther { owner, remaining, .. }) => {
            assert_eq!(owner, "a");
            assert_eq!(remaining, LEASE);
        }
        other => panic!("expected HeldByOther, got {other:?}"),
    }
    assert_eq!(read(&*a, &k).await, held, "a refused acquire writes nothing");
}

async fn owner_retakes_its_own_lease_at_once<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    // The same stable owner id in a new process (fresh store, fresh clock) takes it back immediately.
    let restarted = h.store("a", clock());
    let seen = read(&*restarted, &k).await;
    let retaken = restarted.acquire(&seen).await.expect("own lease is retaken without waiting");
    assert_eq!(retaken.counter, held.counter + 1);
    assert_eq!(retaken.owner.as_deref(), Some("a"));
}

async fn takeover_after_counter_unchanged_for_a_lease_duration<H: Harness>(h: &H) {
    let (a, b_clock) = (h.store("a", clock()), clock());
    let b = h.store("b", b_clock.clone());
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let seen = read(&*b, &k).await;
    b_clock.advance(LEASE - Duration::from_millis(1));
    assert!(matches!(b.acquire(&seen).await, Err(LeaseError::HeldByOther { .. })), "not yet a whole duration");
    b_clock.advance(Duration::from_millis(1));
    let taken = b.acquire(&seen).await.expect("expired by observation");
    assert_eq!(taken.owner.as_deref(), Some("b"));
    assert_eq!(taken.counter, held.counter + 1);
    // The old holder has lost it: every holder write is refused and leaves b's row as it is.
    assert!(matches!(a.renew(&held).await, Err(LeaseError::ConditionFailed { .. })));
    assert!(matches!(
        a.checkpoint(&held, &Checkpoint::Sequence("42".into())).await,
        Err(LeaseError::ConditionFailed { .. })
    ));
    assert!(matches!(a.release(&held, None).await, Err(LeaseError::ConditionFailed { .. })));
    assert_eq!(read(&*b, &k).await, taken);
}

async fn renewal_restarts_the_observation<H: Harness>(h: &H) {
    let (a, b_clock) = (h.store("a", clock()), clock());
    let b = h.store("b", b_clock.clone());
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    read(&*b, &k).await;
    b_clock.advance(LEASE / 2);
    let held = a.renew(&held).await.expect("holder renews");
    let seen = read(&*b, &k).await;
    b_clock.advance(LEASE / 2 + Duration::from_secs(1));
    // More than a duration since b first looked, but the counter moved half-way: still live.
    assert!(matches!(b.acquire(&seen).await, Err(LeaseError::HeldByOther { .. })));
    b_clock.advance(LEASE);
    let seen = read(&*b, &k).await;
    assert_eq!(seen.counter, held.counter);
    b.acquire(&seen).await.expect("a stopped renewing for a whole duration");
}

async fn fast_wall_clock_cannot_steal_a_live_lease<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let b = h.store("b", Arc::new(ManualClock::with_skew_ms(HOUR_MS)));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let seen = read(&*b, &k).await;
    assert!(
        seen.expiry_ms.unwrap() < b.settings().clock.wall_ms(),
        "by b's wall clock the lease looks expired an hour ago"
    );
    assert!(matches!(b.acquire(&seen).await, Err(LeaseError::HeldByOther { .. })));
    assert_eq!(read(&*a, &k).await, held);
    a.renew(&held).await.expect("a still holds it");
}

async fn slow_wall_clock_still_takes_a_dead_lease<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let b_clock = Arc::new(ManualClock::with_skew_ms(-HOUR_MS));
    let b = h.store("b", b_clock.clone());
    let k = key(0);
    a.acquire(&created(&*a, &k).await).await.unwrap();
    let seen = read(&*b, &k).await;
    assert!(seen.expiry_ms.unwrap() > b.settings().clock.wall_ms(), "by b's wall clock the lease looks live");
    b_clock.advance(LEASE);
    b.acquire(&seen).await.expect("judged on the counter, not the wall clock");
}

async fn takeover_is_conditioned_on_the_observed_counter<H: Harness>(h: &H) {
    let (a, b_clock) = (h.store("a", clock()), clock());
    let b = h.store("b", b_clock.clone());
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let stale = read(&*b, &k).await;
    let renewed = a.renew(&held).await.unwrap();
    b_clock.advance(LEASE * 2);
    // b's last read is a whole duration old, but a renewed since: the conditional write must lose.
    assert!(matches!(b.acquire(&stale).await, Err(LeaseError::ConditionFailed { .. })));
    assert_eq!(read(&*a, &k).await, renewed);
}

async fn acquire_needs_this_workers_own_read<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    // b never read the row: a copy handed over from elsewhere proves nothing about expiry.
    assert!(matches!(b.acquire(&held).await, Err(LeaseError::NotObserved { .. })));
}

async fn holder_writes_require_holding_the_row<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    // A copy showing a as owner is refused locally...
    assert!(matches!(b.renew(&held).await, Err(LeaseError::NotOwner { .. })));
    // ...and a forged copy naming b as owner is refused by the table's condition.
    let forged = Lease { owner: Some("b".into()), ..held.clone() };
    assert!(matches!(b.renew(&forged).await, Err(LeaseError::ConditionFailed { .. })));
    assert!(matches!(b.checkpoint(&forged, &Checkpoint::ShardEnd).await, Err(LeaseError::ConditionFailed { .. })));
    assert!(matches!(b.release(&forged, None).await, Err(LeaseError::ConditionFailed { .. })));
    // A stale copy of a's own lease is refused too.
    let renewed = a.renew(&held).await.unwrap();
    assert!(matches!(a.checkpoint(&held, &Checkpoint::ShardEnd).await, Err(LeaseError::ConditionFailed { .. })));
    assert_eq!(read(&*a, &k).await, renewed);
}

async fn counters_strictly_increase_with_every_write<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let mut counters = vec![created(&*a, &k).await.counter];
    let held = a.acquire(&read(&*a, &k).await).await.unwrap();
    counters.push(held.counter);
    let held = a.renew(&held).await.unwrap();
    counters.push(held.counter);
    let held = a.checkpoint(&held, &Checkpoint::Sequence("100".into())).await.unwrap();
    counters.push(held.counter);
    let free = a.release(&held, None).await.unwrap();
    counters.push(free.counter);
    let taken = b.acquire(&read(&*b, &k).await).await.unwrap();
    counters.push(taken.counter);
    assert_eq!(counters, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(read(&*a, &k).await.counter, 5);
}

async fn release_frees_the_row_and_keeps_the_checkpoint<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let held = a.checkpoint(&held, &Checkpoint::Sequence("7".into())).await.unwrap();
    let free = a.release(&held, None).await.expect("holder releases");
    assert_eq!((free.owner.clone(), free.expiry_ms), (None, None));
    assert_eq!(free.checkpoint, Checkpoint::Sequence("7".into()));
    // Free again: another worker takes it without waiting out any duration.
    let taken = b.acquire(&read(&*b, &k).await).await.expect("released row is free");
    // Release with a final checkpoint writes both at once.
    let free = b.release(&taken, Some(&Checkpoint::ShardEnd)).await.unwrap();
    assert_eq!(free.checkpoint, Checkpoint::ShardEnd);
    assert_eq!(read(&*a, &k).await, free);
}

async fn every_checkpoint_form_is_stored<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let k = key(0);
    let mut held = a.acquire(&created(&*a, &k).await).await.unwrap();
    for checkpoint in [
        Checkpoint::Sequence("49590338271490256608559692538361571095921575989136588898".into()),
        Checkpoint::AtTimestamp(1_700_000_000_123),
        Checkpoint::Latest,
        Checkpoint::TrimHorizon,
        Checkpoint::ShardEnd,
    ] {
        held = a.checkpoint(&held, &checkpoint).await.unwrap();
        assert_eq!(read(&*a, &k).await.checkpoint, checkpoint);
    }
}

async fn sub_sequence_checkpoints_round_trip_and_clear<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let mut held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let inside = |sub_sequence| Checkpoint::SubSequence { sequence: "4959033827149025660855".into(), sub_sequence };
    // Inside an aggregate, then the whole aggregate done: the sub-sequence attribute goes away.
    for checkpoint in [inside(0), inside(499), Checkpoint::Sequence("4959033827149025660855".into()), inside(3)] {
        held = a.checkpoint(&held, &checkpoint).await.unwrap();
        assert_eq!(held.checkpoint, checkpoint, "the row as written");
        assert_eq!(read(&*b, &k).await.checkpoint, checkpoint, "the row as another worker reads it");
    }
    // Final checkpoints of a release and a handover carry the sub-sequence too, or clear it.
    let free = a.release(&held, Some(&inside(7))).await.unwrap();
    assert_eq!(read(&*b, &k).await.checkpoint, inside(7));
    let taken = b.acquire(&read(&*b, &k).await).await.unwrap();
    assert_eq!(taken.checkpoint, free.checkpoint);
    let handed = b.release_to(&taken, "a", Some(&Checkpoint::ShardEnd)).await.unwrap();
    assert_eq!(read(&*a, &k).await.checkpoint, Checkpoint::ShardEnd);
    assert_eq!(handed.checkpoint, Checkpoint::ShardEnd);
    // A sub-sequence beside a checkpoint that is not a sequence number is a malformed row.
    h.put_raw(raw(&[
        ("lease_key", AttrValue::S(key(1).to_string())),
        ("lease_counter", AttrValue::N("1".into())),
        ("checkpoint", AttrValue::S("TRIM_HORIZON".into())),
        ("checkpoint_subsequence", AttrValue::N("2".into())),
    ]))
    .await;
    assert!(matches!(a.get(&key(1)).await, Err(LeaseError::Malformed { .. })), "TRIM_HORIZON with a sub-sequence");
}

async fn keys_keep_two_streams_apart<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let orders = LeaseKey::new("orders", "shardId-000000000000");
    let payments = LeaseKey::new("payments", "shardId-000000000000");
    let held = a.acquire(&created(&*a, &orders).await).await.unwrap();
    let other = created(&*b, &payments).await;
    assert_eq!(other.owner, None, "same shard id in another stream is another row");
    let other = b.acquire(&other).await.expect("free row of the other stream");
    a.checkpoint(&held, &Checkpoint::Sequence("1".into())).await.unwrap();
    b.checkpoint(&other, &Checkpoint::Sequence("2".into())).await.unwrap();
    assert_eq!(read(&*a, &orders).await.checkpoint, Checkpoint::Sequence("1".into()));
    assert_eq!(read(&*a, &payments).await.checkpoint, Checkpoint::Sequence("2".into()));
    let mut keys: Vec<String> = a.list().await.unwrap().leases.iter().map(|l| l.key.to_string()).collect();
    keys.sort();
    assert_eq!(keys, vec!["orders:shardId-000000000000", "payments:shardId-000000000000"]);
}

async fn listing_pages_through_every_row<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    for shard in 0..7 {
        a.create_if_absent(&new_lease(&key(shard))).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut start = None;
    loop {
        let page = a.list_page(start.as_ref(), 3).await.unwrap();
        assert!(page.leases.len() <= 3);
        pages += 1;
        seen.extend(page.leases.into_iter().map(|l| l.key));
        match page.next {
            Some(next) => start = Some(next),
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    seen.sort();
    assert_eq!(seen, (0..7).map(key).collect::<Vec<_>>());
    assert!(pages >= 3, "7 rows at 3 a page take at least 3 pages, took {pages}");
    assert_eq!(a.list().await.unwrap().leases.len(), 7);
}

async fn malformed_rows_are_reported_with_their_key_and_skipped<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let good = key(0);
    a.create_if_absent(&new_lease(&good)).await.unwrap();
    let s = |v: &str| AttrValue::S(v.into());
    let n = |v: &str| AttrValue::N(v.into());
    h.put_raw(raw(&[("lease_key", s("orders:no-counter")), ("checkpoint", s("LATEST"))])).await;
    h.put_raw(raw(&[("lease_key", s("orders:text-counter")), ("lease_counter", s("3")), ("checkpoint", s("LATEST"))]))
        .await;
    h.put_raw(raw(&[
        ("lease_key", s("orders:bad-checkpoint")),
        ("lease_counter", n("1")),
        ("checkpoint", s("AT_TIMESTAMP:x")),
    ]))
    .await;
    h.put_raw(raw(&[("lease_key", s("no-separator")), ("lease_counter", n("1")), ("checkpoint", s("LATEST"))])).await;
    h.put_raw(raw(&[
        ("lease_key", s("orders:bool-owner")),
        ("lease_counter", n("1")),
        ("checkpoint", s("LATEST")),
        ("lease_owner", AttrValue::Other("BOOL")),
    ]))
    .await;
    let page = a.list().await.expect("listing survives malformed rows");
    assert_eq!(page.leases.iter().map(|l| l.key.clone()).collect::<Vec<_>>(), vec![good.clone()]);
    let mut malformed: Vec<(String, String)> = page.malformed.into_iter().map(|m| (m.key, m.reason)).collect();
    malformed.sort();
    let keys: Vec<&str> = malformed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        vec!["no-separator", "orders:bad-checkpoint", "orders:bool-owner", "orders:no-counter", "orders:text-counter"]
    );
    for (key, reason) in &malformed {
        assert!(!reason.is_empty(), "{key} needs a reason");
    }
    match a.get(&LeaseKey::new("orders", "text-counter")).await {
        Err(LeaseError::Malformed { key, reason }) => {
            assert_eq!(key, "orders:text-counter");
            assert!(reason.contains("lease_counter"), "{reason}");
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
    // The good row still works as usual.
    a.acquire(&read(&*a, &good).await).await.expect("good row unaffected");
}

async fn delete_requires_an_unchanged_row<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let k = key(0);
    let stale = created(&*b, &k).await;
    let held = a.acquire(&read(&*a, &k).await).await.unwrap();
    assert!(matches!(b.delete(&stale).await, Err(LeaseError::ConditionFailed { .. })));
    assert_eq!(read(&*a, &k).await, held);
    let free = a.release(&held, Some(&Checkpoint::ShardEnd)).await.unwrap();
    b.delete(&read(&*b, &k).await).await.expect("unchanged row is deleted");
    assert!(a.get(&k).await.unwrap().is_none());
    assert!(matches!(
        a.acquire(&free).await,
        Err(LeaseError::NotObserved { .. }) | Err(LeaseError::ConditionFailed { .. })
    ));
}

async fn handoff_request_leaves_the_counter_and_release_to_transfers<H: Harness>(h: &H) {
    let (a, b, c) = (h.store("a", clock()), h.store("b", clock()), h.store("c", clock()));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let seen = read(&*b, &k).await;
    let before_any_request = read(&*c, &k).await;
    let asked = b.request_handoff(&seen).await.expect("request on a held row");
    assert_eq!(asked.handoff_to.as_deref(), Some("b"));
    assert_eq!(asked.counter, held.counter, "a request must not move the counter");
    // One request at a time: a copy that does not show b's request cannot replace it; a copy that shows
    // it can (the caller judged it stale), and b then puts its own back the same way.
    assert!(matches!(c.request_handoff(&before_any_request).await, Err(LeaseError::ConditionFailed { .. })));
    let replaced = c.request_handoff(&read(&*c, &k).await).await.expect("a seen request may be replaced");
    assert_eq!(replaced.handoff_to.as_deref(), Some("c"));
    assert!(matches!(b.request_handoff(&asked).await, Err(LeaseError::ConditionFailed { .. })), "b's copy is stale");
    let asked = b.request_handoff(&read(&*b, &k).await).await.unwrap();
    assert_eq!((asked.handoff_to.as_deref(), asked.counter), (Some("b"), held.counter));
    // The holder's renewal still succeeds and shows the request.
    let held = a.renew(&held).await.expect("request does not disturb the holder");
    assert_eq!(held.handoff_to.as_deref(), Some("b"));
    let given = a.release_to(&held, "b", Some(&Checkpoint::Sequence("9".into()))).await.expect("hand over");
    assert_eq!((given.owner.as_deref(), given.handoff_to.as_deref()), (Some("b"), None));
    assert_eq!(given.checkpoint, Checkpoint::Sequence("9".into()));
    assert!(matches!(a.renew(&held).await, Err(LeaseError::ConditionFailed { .. })), "a no longer holds it");
    let taken = b.acquire(&read(&*b, &k).await).await.expect("b takes its handed-over lease at once");
    assert_eq!(taken.counter, given.counter + 1);
    let free = b.release(&taken, None).await.unwrap();
    assert!(matches!(c.request_handoff(&read(&*c, &k).await).await, Err(LeaseError::ConditionFailed { .. })));
    assert_eq!(free.owner, None);
}

async fn membership_rows_count_live_workers<H: Harness>(h: &H) {
    let (a, b_clock) = (h.store("a", clock()), clock());
    let b = h.store("b", b_clock.clone());
    a.create_if_absent(&new_lease(&key(0))).await.unwrap();
    a.heartbeat().await.unwrap();
    b.heartbeat().await.unwrap();
    let page = b.list().await.unwrap();
    assert_eq!(page.leases.len(), 1, "membership rows are not leases");
    let mut members: Vec<(String, bool)> = page.members.iter().map(|m| (m.owner.clone(), m.alive)).collect();
    members.sort();
    assert_eq!(members, vec![("a".into(), true), ("b".into(), true)]);
    // a keeps beating, then falls silent for a whole duration on b's clock.
    b_clock.advance(LEASE / 2);
    a.heartbeat().await.unwrap();
    b.list().await.unwrap();
    b_clock.advance(LEASE / 2 + Duration::from_secs(1));
    let alive = |page: &leasehold_worker::lease::LeasePage, who: &str| {
        page.members.iter().find(|m| m.owner == who).map(|m| m.alive)
    };
    assert_eq!(alive(&b.list().await.unwrap(), "a"), Some(true), "a beat half a duration ago");
    b_clock.advance(LEASE);
    let page = b.list().await.unwrap();
    assert_eq!(alive(&page, "a"), Some(false), "a silent for a whole duration");
    let dead = page.members.iter().find(|m| m.owner == "a").unwrap().clone();
    // A copy older than the row is refused as a condition, the same in both stores.
    let stale = leasehold_worker::lease::Member { counter: dead.counter - 1, ..dead.clone() };
    assert!(
        matches!(b.remove_member(&stale).await, Err(LeaseError::ConditionFailed { .. })),
        "a stale member copy must be refused as ConditionFailed"
    );
    b.remove_member(&dead).await.expect("dead member removed");
    b.leave().await.unwrap();
    assert!(b.list().await.unwrap().members.is_empty());
}

async fn heartbeats_keep_a_draining_mark<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    a.heartbeat().await.unwrap();
    let before = a.list().await.unwrap().members.into_iter().find(|m| m.owner == "a").expect("a's row");
    assert!(!before.draining);
    // `leasehold drain` marks the row without moving its counter.
    let marked: Attributes = [
        ("lease_key", AttrValue::S("#worker:a".into())),
        ("lease_owner", AttrValue::S("a".into())),
        ("lease_counter", AttrValue::N(before.counter.to_string())),
        ("member_draining", AttrValue::N("1700000000000".into())),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    h.put_raw(marked).await;
    a.heartbeat().await.unwrap();
    let after = a.list().await.unwrap().members.into_iter().find(|m| m.owner == "a").expect("a's row");
    assert!(after.draining, "a heartbeat must not wipe the draining mark");
    assert_eq!(after.counter, before.counter + 1, "and it still moves the counter");
    a.leave().await.unwrap();
    assert!(a.list().await.unwrap().members.is_empty(), "leaving takes the mark with the row");
}

async fn segments_split_the_table_and_watch_expiry_like_a_whole_read<H: Harness>(h: &H) {
    let (a, b_clock) = (h.store("a", clock()), clock());
    let b = h.store("b", b_clock.clone());
    for shard in 0..40 {
        a.create_if_absent(&new_lease(&key(shard))).await.unwrap();
    }
    a.heartbeat().await.unwrap();
    let term = leasehold_worker::internals::lease::term_key("discovery");
    a.create_if_absent(&new_lease(&term)).await.unwrap();
    let whole = b.list().await.unwrap();
    assert_eq!((whole.leases.len(), whole.members.len(), whole.terms.len()), (40, 1, 1), "a term row is no lease");
    for total in [1u32, 2, 3, 7] {
        let mut seen: Vec<String> = Vec::new();
        let mut members = 0;
        let mut terms = 0;
        let mut nonempty = 0;
        for segment in 0..total {
            let page = b.list_segment(segment, total).await.unwrap();
            nonempty += usize::from(!page.leases.is_empty());
            seen.extend(page.leases.iter().map(|l| l.key.to_string()));
            members += page.members.len();
            terms += page.terms.len();
        }
        seen.sort();
        let mut want: Vec<String> = whole.leases.iter().map(|l| l.key.to_string()).collect();
        want.sort();
        assert_eq!(seen, want, "{total} segments hold every lease row exactly once");
        assert_eq!((members, terms), (1, 1), "and every other row exactly once");
        assert!(nonempty >= usize::try_from(total).unwrap().min(2), "the rows are spread over the segments");
    }
    // A segment read records what it saw as a whole read does: a lease and the term row taken over
    // after their counters stood still for a duration on the reader's own clock, not before.
    let lease = a.acquire(&read(a.as_ref(), &key(5)).await).await.unwrap();
    let term_row = a.get(&term).await.unwrap().unwrap();
    let held_term = a.acquire(&term_row).await.unwrap();
    let in_segment = |page: &leasehold_worker::lease::LeasePage, k: &LeaseKey| {
        page.leases.iter().chain(&page.terms).find(|l| &l.key == k).cloned()
    };
    let mut found = Vec::new();
    for k in [&lease.key, &held_term.key] {
        for segment in 0..3 {
            if let Some(row) = in_segment(&b.list_segment(segment, 3).await.unwrap(), k) {
                found.push((segment, row));
            }
        }
    }
    assert_eq!(found.len(), 2);
    for (_, row) in &found {
        assert!(matches!(b.acquire(row).await, Err(LeaseError::HeldByOther { .. })), "live: {row:?}");
    }
    b_clock.advance(LEASE);
    for (segment, row) in &found {
        let again = in_segment(&b.list_segment(*segment, 3).await.unwrap(), &row.key).unwrap();
        let taken = b.acquire(&again).await.expect("still for a duration on b's clock");
        assert_eq!(taken.owner.as_deref(), Some("b"));
    }
    assert!(a.renew(&lease).await.unwrap_err().is_not_held(), "the former holder's renewal is refused");
}

async fn announcing_moves_only_the_change_rows_counter<H: Harness>(h: &H) {
    let (a, b) = (h.store("a", clock()), h.store("b", clock()));
    let changes = leasehold_worker::internals::lease::changes_key();
    assert!(b.get(&changes).await.unwrap().is_none(), "no row before the first change");
    assert_eq!(b.changes().await.unwrap(), 0, "no change announced yet");
    a.announce().await.unwrap();
    let first = b.get(&changes).await.unwrap().expect("the first announce creates the row");
    assert_eq!(b.changes().await.unwrap(), first.counter);
    b.announce().await.unwrap();
    a.announce().await.unwrap();
    let row = b.get(&changes).await.unwrap().unwrap();
    assert_eq!(row.counter, first.counter + 2, "every announce moves the counter by one, whoever writes it");
    assert_eq!(b.changes().await.unwrap(), row.counter);
    assert_eq!((row.owner, row.handoff_to), (None, None), "nobody holds the change row");
    let page = b.list().await.unwrap();
    assert!(page.leases.is_empty() && page.members.is_empty(), "it is neither a lease nor a member");
    assert_eq!(page.terms.iter().filter(|t| t.key == changes).count(), 1, "it reads as a term row");
}

async fn drain_marks_are_set_once_and_leave_the_counter<H: Harness>(h: &H) {
    let (a, tool) = (h.store("a", clock()), h.store("leasehold-cli", clock()));
    assert!(
        matches!(tool.mark_draining("a").await, Err(LeaseError::ConditionFailed { .. })),
        "no membership row, no mark"
    );
    assert!(!tool.unmark_draining("a").await.unwrap(), "no row: nothing to remove");
    a.heartbeat().await.unwrap();
    let member = |page: leasehold_worker::lease::LeasePage| page.members.into_iter().find(|m| m.owner == "a").unwrap();
    let before = member(tool.list().await.unwrap());
    assert!(!before.draining && before.expiry_ms.is_some(), "a fresh row, its expiry read: {before:?}");
    assert!(tool.mark_draining("a").await.unwrap(), "the first mark writes");
    assert!(!tool.mark_draining("a").await.unwrap(), "the second finds it there");
    let marked = member(tool.list().await.unwrap());
    assert!(marked.draining);
    assert_eq!(marked.counter, before.counter, "a mark never moves the worker's proof of life");
    a.heartbeat().await.unwrap();
    assert!(member(a.list().await.unwrap()).draining, "the heartbeat keeps the mark");
    assert!(tool.unmark_draining("a").await.unwrap(), "the mark removed");
    assert!(!tool.unmark_draining("a").await.unwrap(), "and only once");
    let after = member(tool.list().await.unwrap());
    assert!(!after.draining);
    assert_eq!(after.counter, before.counter + 1, "only the heartbeat moved the counter");
}

async fn a_handoff_request_is_withdrawn_only_by_its_asker_on_an_unchanged_row<H: Harness>(h: &H) {
    let (a, b, c) = (h.store("a", clock()), h.store("b", clock()), h.store("c", clock()));
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    let asked = b.request_handoff(&read(&*b, &k).await).await.unwrap();
    assert!(!c.withdraw_handoff(&asked).await.unwrap(), "c did not ask: b's request stays");
    assert_eq!(read(&*c, &k).await.handoff_to.as_deref(), Some("b"));
    assert!(b.withdraw_handoff(&asked).await.unwrap(), "b takes its request back");
    let now = read(&*b, &k).await;
    assert_eq!((now.handoff_to, now.counter), (None, asked.counter), "removed without moving the counter");
    assert!(!b.withdraw_handoff(&asked).await.unwrap(), "nothing left to withdraw");
    // A row that moved on since the request (renewed here) keeps whatever it carries now.
    let asked = b.request_handoff(&read(&*b, &k).await).await.unwrap();
    let renewed = a.renew(&held).await.unwrap();
    assert!(!b.withdraw_handoff(&asked).await.unwrap(), "the row moved on: refused");
    assert_eq!(read(&*b, &k).await.handoff_to.as_deref(), Some("b"), "the request is still on the row");
    assert!(b.withdraw_handoff(&read(&*b, &k).await).await.unwrap());
    assert!(renewed.is_held_by("a"));
}

async fn progress_rows_are_written_only_over_the_counter_read<H: Harness>(h: &H) {
    use leasehold_worker::lease::Progress;
    let (a, b) = (h.progress("a"), h.progress("b"));
    let k = leasehold_worker::internals::lease::term_key("redrive/dlq/shardId-0");
    let absent = a.read_progress(&k).await.unwrap();
    assert_eq!(absent, Progress::default(), "no row: from the start, nothing done");
    let mut first = absent.clone();
    first.done.insert("7".into());
    assert_eq!(a.write_progress(&k, &first).await.unwrap(), 1, "the first write creates the row");
    assert!(
        matches!(b.write_progress(&k, &absent).await, Err(LeaseError::ConditionFailed { .. })),
        "a second creator is refused"
    );
    let read = b.read_progress(&k).await.unwrap();
    assert_eq!((read.counter, read.checkpoint.as_deref(), read.done.len()), (Some(1), None, 1));
    let moved = Progress { checkpoint: Some("9".into()), done: Default::default(), ..read.clone() };
    assert_eq!(b.write_progress(&k, &moved).await.unwrap(), 2);
    assert!(
        matches!(a.write_progress(&k, &read).await, Err(LeaseError::ConditionFailed { .. })),
        "a write over a stale counter is refused"
    );
    let last = a.read_progress(&k).await.unwrap();
    assert_eq!((last.counter, last.checkpoint.as_deref(), last.done.is_empty()), (Some(2), Some("9"), true));
}

async fn renewals_and_checkpoints_carry_the_load<H: Harness>(h: &H) {
    let a = h.store("a", clock());
    let k = key(0);
    let held = a.acquire(&created(&*a, &k).await).await.unwrap();
    assert_eq!(read(&*a, &k).await.load, None, "no load before the holder measured one");
    let measured = ShardLoad { records_per_s: 300, bytes_per_s: 30_000, busy_ms_per_s: 750 };
    let renewed = a.renew(&Lease { load: Some(measured), ..held }).await.unwrap();
    assert_eq!(renewed.load, Some(measured));
    assert_eq!(read(&*a, &k).await.load, Some(measured), "a renewal writes the load");
    let later = ShardLoad { records_per_s: 100, bytes_per_s: 10_000, busy_ms_per_s: 250 };
    let checkpointed =
        a.checkpoint(&Lease { load: Some(later), ..renewed }, &Checkpoint::Sequence("42".into())).await.unwrap();
    let row = read(&*a, &k).await;
    assert_eq!((row.load, row.checkpoint.clone()), (Some(later), Checkpoint::Sequence("42".into())));
    assert_eq!(row, checkpointed);
    // A write that measured nothing (a lease just taken) leaves the last figure in place.
    let renewed = a.renew(&Lease { load: None, ..checkpointed }).await.unwrap();
    assert_eq!(read(&*a, &k).await.load, Some(later));
    assert_eq!(renewed.counter, row.counter + 1);
}

macro_rules! conformance {
    ($harness:ident: $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let harness = <super::$harness as super::Harness>::new().await;
                super::$case(&harness).await;
            }
        )*
    };
}

macro_rules! suite {
    ($($module:ident => $harness:ident),*) => {
        $(
            mod $module {
                conformance!($harness:
                    create_if_absent_creates_once,
                    acquire_free_row_sets_owner_expiry_and_counter,
                    live_lease_of_another_is_refused,
                    owner_retakes_its_own_lease_at_once,
                    takeover_after_counter_unchanged_for_a_lease_duration,
                    renewal_restarts_the_observation,
                    fast_wall_clock_cannot_steal_a_live_lease,
                    slow_wall_clock_still_takes_a_dead_lease,
                    takeover_is_conditioned_on_the_observed_counter,
                    acquire_needs_this_workers_own_read,
                    holder_writes_require_holding_the_row,
                    counters_strictly_increase_with_every_write,
                    release_frees_the_row_and_keeps_the_checkpoint,
                    every_checkpoint_form_is_stored,
                    sub_sequence_checkpoints_round_trip_and_clear,
                    keys_keep_two_streams_apart,
                    listing_pages_through_every_row,
                    malformed_rows_are_reported_with_their_key_and_skipped,
                    delete_requires_an_unchanged_row,
                    replace_swaps_an_unchanged_row_and_revokes_its_holder,
                    handoff_request_leaves_the_counter_and_release_to_transfers,
                    membership_rows_count_live_workers,
                    heartbeats_keep_a_draining_mark,
                    segments_split_the_table_and_watch_expiry_like_a_whole_read,
                    announcing_moves_only_the_change_rows_counter,
                    drain_marks_are_set_once_and_leave_the_counter,
                    a_handoff_request_is_withdrawn_only_by_its_asker_on_an_unchanged_row,
                    progress_rows_are_written_only_over_the_counter_read,
                    renewals_and_checkpoints_carry_the_load,
                );
            }
        )*
    };
}

suite!(memory => Memory, dynamodb => Dynamo);
