//! The lease protocol: one row per shard in a shared table, taken and kept with conditional writes, so
//! every shard is processed by exactly one worker at a time (see `docs/lease-protocol.md`).
//!
//! [`LeaseStore`] is one worker's view of a lease table. Two implementations pass one conformance suite:
//! [`MemoryLeaseStore`] (in-process, the default for a single instance) and [`DynamoLeaseStore`]
//! (a DynamoDB table shared by every worker of a consumer).
//!
//! Expiry never depends on clocks agreeing: a worker may take another worker's lease only after it has
//! itself watched the row's `lease_counter` stay unchanged for a whole lease duration on its own
//! monotonic clock, and its write is conditioned on that counter.

mod checkpoint;
mod clock;
mod dynamo;
mod error;
mod held;
mod key;
mod lag;
pub mod load;
mod memory;
mod observer;
pub mod progress;
mod renewal;
pub mod row;
mod settings;

use async_trait::async_trait;

pub use checkpoint::{Checkpoint, InvalidCheckpoint};
pub use clock::{Clock, ManualClock, SystemClock};
pub use dynamo::from_item;
pub use dynamo::{DynamoLeaseStore, TableBilling, create_table, ensure_table, not_a_lease_table};
pub use error::{LeaseError, Result};
pub use held::HeldLease;
pub use key::LeaseKey;
pub use lag::{LagGauge, ShardLag};
pub use load::{LoadGauges, LoadMeter, ShardLoad};
pub use memory::{MemoryLeaseStore, MemoryLeaseTable};
pub use progress::{Progress, ProgressRows};
pub use renewal::renew_until_lost;
pub use row::{Lease, Malformed, Member, NewLease};
// The row format: crate-private; the workspace's tools reach it through the hidden internals module.
pub use row::{changes_key, term_key};
pub use settings::LeaseSettings;
pub use settings::unique_owner_id;

/// Where a listing continues: the raw `lease_key` of the last row of the previous page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageToken(pub String);

/// One page of a table listing.
#[derive(Debug, Clone, Default)]
pub struct LeasePage {
    /// Rows read as leases.
    pub leases: Vec<Lease>,
    /// Rows that could not be read, with their keys; callers skip and report them.
    pub malformed: Vec<Malformed>,
    /// Membership rows of workers (see [`GroupRows::heartbeat`]).
    pub members: Vec<Member>,
    /// Term rows (see `TERM_PREFIX` in the row format): roles held by one worker at a time, observed like leases.
    pub terms: Vec<Lease>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<PageToken>,
}

impl LeasePage {
    /// Appends `page`'s rows to this one; returns where `page` said the listing continues.
    pub fn absorb(&mut self, page: LeasePage) -> Option<PageToken> {
        self.leases.extend(page.leases);
        self.malformed.extend(page.malformed);
        self.members.extend(page.members);
        self.terms.extend(page.terms);
        page.next
    }

    /// Adds one row as read to this page.
    pub fn push(&mut self, row: std::result::Result<row::Row, Malformed>) {
        match row {
            Ok(row::Row::Lease(lease)) => self.leases.push(lease),
            Ok(row::Row::Member(member)) => self.members.push(member),
            Ok(row::Row::Term(term)) => self.terms.push(term),
            Err(malformed) => self.malformed.push(malformed),
        }
    }
}

/// Rows read per page by [`LeaseStore::list`].
pub const DEFAULT_PAGE_SIZE: i32 = 100;

/// Rows read per page by [`LeaseStore::list_segment`]: large, since a Scan page costs its rows' total
/// size rounded up to 4 KB, so fewer pages waste less (DynamoDB still stops a page at 1 MB).
pub const SEGMENT_PAGE_SIZE: i32 = 1000;

/// The shard rows of a lease table: one per shard, taken, kept and given up with conditional writes.
/// Term rows ([`TERM_PREFIX`]) are taken and renewed through the same calls.
///
/// Reads ([`get`](Self::get), [`LeaseStore::list_page`]) also record, on the worker's monotonic
/// clock, since when each row's counter has been unchanged: that record is what lets
/// [`acquire`](Self::acquire) judge another worker's lease expired.
#[async_trait]
pub trait ShardLeases: Send + Sync {
    /// The owner id, lease duration and clock this store works with.
    fn settings(&self) -> &LeaseSettings;

    /// Creates the row of a newly discovered shard unless it exists; true when this call created it.
    async fn create_if_absent(&self, lease: &NewLease) -> Result<bool>;

    /// Reads one row; `None` when absent, [`LeaseError::Malformed`] when unreadable.
    async fn get(&self, key: &LeaseKey) -> Result<Option<Lease>>;

    /// Takes the lease given as last read by this worker. Succeeds when that read showed no owner, or
    /// this worker as owner, or another owner whose counter this worker has seen unchanged for a whole
    /// lease duration; the write is conditioned on that counter. Sets owner, expiry, counter + 1.
    async fn acquire(&self, seen: &Lease) -> Result<Lease>;

    /// Extends a held lease: expiry = now + duration, counter + 1, and `held.lag_ms` written as the
    /// row's [`attr::LAG_MS`] when set (the holder's lag rides on the writes it makes anyway). Refused
    /// unless this worker still holds the row at the counter of `held`.
    async fn renew(&self, held: &Lease) -> Result<Lease>;

    /// Records progress on a held lease; counter + 1, and `held.lag_ms` written as for
    /// [`renew`](Self::renew). Refused unless this worker still holds the row at the counter of `held`.
    async fn checkpoint(&self, held: &Lease, checkpoint: &Checkpoint) -> Result<Lease>;

    /// Gives a held lease up (owner and expiry removed, counter + 1), writing a final checkpoint in the
    /// same write when given. Refused unless this worker still holds the row at the counter of `held`.
    async fn release(&self, held: &Lease, final_checkpoint: Option<&Checkpoint>) -> Result<Lease>;

    /// Hands a held lease straight to worker `to` (owner = `to`, counter + 1, handoff request cleared),
    /// writing a final checkpoint in the same write when given. Refused unless this worker still holds
    /// the row at the counter of `held`. `to` then takes it with [`acquire`](Self::acquire) at once.
    async fn release_to(&self, held: &Lease, to: &str, final_checkpoint: Option<&Checkpoint>) -> Result<Lease>;

    /// Asks the holder of `seen` to hand it over to this worker: sets `handoff_to` without moving the
    /// counter, only if the row is unchanged since `seen` and carries no request but the one `seen`
    /// shows (a caller replaces a request it judged stale: its asker gone or already at its share).
    async fn request_handoff(&self, seen: &Lease) -> Result<Lease>;

    /// Takes back the handoff request this worker wrote on `seen` (removes `handoff_to`, counter left
    /// alone), only if the row is unchanged since `seen` and the request is still this worker's; false
    /// when the row moved on (handed over, or asked for by another), so nothing of this worker's is left.
    async fn withdraw_handoff(&self, seen: &Lease) -> Result<bool>;

    /// Replaces a row with a fresh one (`new`'s checkpoint, parents and stamp; counter + 1; owner and
    /// expiry kept), only if it is unchanged since `seen` was read: a row of a former incarnation of its
    /// stream, swapped in one write so the shard is never without a row. A holder of the old row loses
    /// it at its next write; anyone else takes it only after seeing the counter unchanged for a lease
    /// duration, so a former holder still reading never overlaps with the next one.
    async fn replace(&self, seen: &Lease, new: &NewLease) -> Result<()>;

    /// Deletes a row (cleanup of finished shards), only if it is unchanged since `seen` was read.
    async fn delete(&self, seen: &Lease) -> Result<()>;
}

/// The group's own rows: one membership row per live worker, and the change row.
#[async_trait]
pub trait GroupRows: Send + Sync {
    /// Writes this worker's membership row (creating it, or moving its counter), so that other workers
    /// count it as alive for a lease duration.
    async fn heartbeat(&self) -> Result<()>;

    /// Deletes this worker's membership row (on shutdown).
    async fn leave(&self) -> Result<()>;

    /// Deletes the membership row of a worker this store has seen silent for a lease duration, only if
    /// its counter is still `member.counter`.
    async fn remove_member(&self, member: &Member) -> Result<()>;

    /// Marks worker `worker`'s membership row draining ([`row::attr::MEMBER_DRAINING`], the time of the
    /// mark), if the row exists; the counter is left alone (it is the worker's proof of life, moved only
    /// by its heartbeat). True when this call marked it, false when the mark was there (its time kept);
    /// [`LeaseError::ConditionFailed`] when the worker has no membership row.
    async fn mark_draining(&self, worker: &str) -> Result<bool>;

    /// Removes worker `worker`'s draining mark, counter left alone; false when there was none (or no row).
    async fn unmark_draining(&self, worker: &str) -> Result<bool>;

    /// Moves the counter of the group's change row ([`changes_key`]), creating the row if absent, and
    /// touches nothing else: a signal to workers that read the whole table rarely that the shares
    /// moved (a worker left, shards were created or ended, a lease was taken over).
    async fn announce(&self) -> Result<()>;

    /// The counter of the group's change row, 0 when it is absent. Read eventually consistent (half
    /// the cost of a consistent read): it is a hint to read the whole table, never a judgement.
    async fn changes(&self) -> Result<u64>;

    /// The group's requeue secret (64 hex digits, read strongly consistent), written at random by the
    /// first worker that asks when the table has none: every worker of the consumer signs and checks
    /// requeued copies with it.
    async fn requeue_secret(&self) -> Result<String>;
}

/// One worker's view of a whole lease table: its shard rows, its group rows, and listings that read
/// both. Every write is conditional and every read strongly consistent.
#[async_trait]
pub trait LeaseStore: ShardLeases + GroupRows {
    /// Reads up to `limit` rows of segment `segment` of `total` (a DynamoDB parallel Scan's
    /// `Segment`/`TotalSegments`: the segments split the table, every row in exactly one), starting
    /// after `start`. With `total` 1 the one segment is the whole table.
    async fn list_segment_page(
        &self,
        segment: u32,
        total: u32,
        start: Option<&PageToken>,
        limit: i32,
    ) -> Result<LeasePage>;

    /// Reads up to `limit` rows in key order, starting after `start`.
    async fn list_page(&self, start: Option<&PageToken>, limit: i32) -> Result<LeasePage> {
        self.list_segment_page(0, 1, start, limit).await
    }

    /// Reads the whole table, page by page.
    async fn list(&self) -> Result<LeasePage> {
        read_all_pages(self, 0, 1, DEFAULT_PAGE_SIZE).await
    }

    /// Reads all of segment `segment` of `total`, in pages of [`SEGMENT_PAGE_SIZE`] rows.
    async fn list_segment(&self, segment: u32, total: u32) -> Result<LeasePage> {
        read_all_pages(self, segment, total, SEGMENT_PAGE_SIZE).await
    }
}

/// Reads all of segment `segment` of `total`, in pages of `page_size` rows: the one paging loop of every
/// listing.
async fn read_all_pages<S: LeaseStore + ?Sized>(
    store: &S,
    segment: u32,
    total: u32,
    page_size: i32,
) -> Result<LeasePage> {
    let mut all = LeasePage::default();
    let mut start = None;
    loop {
        let page = store.list_segment_page(segment, total, start.as_ref(), page_size).await?;
        match all.absorb(page) {
            Some(next) => start = Some(next),
            None => return Ok(all),
        }
    }
}
