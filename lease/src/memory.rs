//! The in-process lease store: the default for a single instance; empty again after a restart.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::checkpoint::Checkpoint;
use super::error::{LeaseError, Result};
use super::key::LeaseKey;
use super::observer::{Observer, ensure_holder};
use super::progress::{Progress, ProgressRows, decode_progress, encode_progress};
use super::row::{
    AttrValue, Attributes, Lease, Member, NewLease, attr, changes_key, decode, decode_member, decode_requeue_secret,
    decode_row, encode_new, encode_replacement, encode_requeue_row, member_key, member_row_key, put_checkpoint,
    raw_key, requeue_key_row, stored_counter,
};
use super::settings::LeaseSettings;
use super::{GroupRows, LeasePage, LeaseStore, PageToken, ShardLeases};

/// An in-memory lease table. Clones share the rows, so several stores (one per simulated worker) can
/// contend for them exactly as workers contend for a DynamoDB table.
#[derive(Debug, Clone, Default)]
pub struct MemoryLeaseTable {
    rows: Arc<Mutex<BTreeMap<String, Attributes>>>,
}

impl MemoryLeaseTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store writing into this table as the worker described by `settings`.
    pub fn store(&self, settings: LeaseSettings) -> MemoryLeaseStore {
        MemoryLeaseStore { table: self.clone(), settings, observer: Observer::default() }
    }

    /// Writes a row as given, unchecked: for tests and repairs (a malformed row is kept as it is).
    pub fn put_raw(&self, attrs: Attributes) {
        self.rows().insert(raw_key(&attrs), attrs);
    }

    fn rows(&self) -> MutexGuard<'_, BTreeMap<String, Attributes>> {
        // Every mutation below completes before the guard drops, so a poisoned lock holds no torn row.
        self.rows.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Which of `total` segments the row `key` falls in: FNV-1a of the key, as DynamoDB places a row in a
/// parallel Scan's segment by a hash of its key (any fixed hash splits the table the same way).
fn segment_of(key: &str, total: u32) -> u32 {
    let hash = key
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    u32::try_from(hash % u64::from(total.max(1))).unwrap_or(0)
}

/// Writes the holder's lag and load into a row, when it measured them.
fn put_lag(row: &mut Attributes, held: &Lease) {
    if let Some(lag_ms) = held.lag_ms {
        row.insert(attr::LAG_MS.into(), AttrValue::N(lag_ms.to_string()));
    }
    for (name, value) in held.load.as_ref().map(super::row::load_values).into_iter().flatten() {
        row.insert(name.into(), AttrValue::N(value.to_string()));
    }
    if let Some(records) = held.window_records {
        row.insert(attr::WINDOW_RECORDS.into(), AttrValue::N(records.to_string()));
    }
}

/// A [`LeaseStore`] over a [`MemoryLeaseTable`].
#[derive(Debug)]
pub struct MemoryLeaseStore {
    table: MemoryLeaseTable,
    settings: LeaseSettings,
    observer: Observer,
}

impl MemoryLeaseStore {
    /// A store over a table of its own.
    pub fn new(settings: LeaseSettings) -> Self {
        MemoryLeaseTable::new().store(settings)
    }

    /// The table this store writes to.
    pub fn table(&self) -> &MemoryLeaseTable {
        &self.table
    }

    /// Applies `change` to the row, and adds one to its counter, if the row's counter is `counter` (and,
    /// when given, its owner is `owner`) — the same condition the DynamoDB store sends.
    fn update_if(
        &self,
        key: &LeaseKey,
        operation: &'static str,
        counter: u64,
        owner: Option<&str>,
        change: impl FnOnce(&mut Attributes),
    ) -> Result<Lease> {
        let refused = || LeaseError::ConditionFailed { key: key.clone(), operation };
        let mut rows = self.table.rows();
        let row = rows.get_mut(&key.to_string()).ok_or_else(refused)?;
        // DynamoDB evaluates the condition on the stored attributes; a row that does not decode cannot
        // satisfy `lease_counter = :counter`, so it is refused the same way.
        let current = decode(row).map_err(|_| refused())?;
        if current.counter != counter || owner.is_some_and(|o| current.owner.as_deref() != Some(o)) {
            return Err(refused());
        }
        change(row);
        row.insert(attr::LEASE_COUNTER.into(), AttrValue::N((counter + 1).to_string()));
        Ok(decode(row)?)
    }

    fn after_write(&self, key: &LeaseKey, result: Result<Lease>) -> Result<Lease> {
        self.observer.after_write(key, result, self.settings.clock.monotonic())
    }

    /// Deletes the row `key` if its counter is still `counter`: the one conditional delete, of shard
    /// and membership rows alike.
    fn delete_if_unchanged(&self, key: &LeaseKey, counter: u64, operation: &'static str) -> Result<()> {
        let mut rows = self.table.rows();
        let row_key = key.to_string();
        if rows.get(&row_key).and_then(stored_counter) != Some(counter) {
            return Err(LeaseError::ConditionFailed { key: key.clone(), operation });
        }
        rows.remove(&row_key);
        drop(rows);
        self.observer.forget(key);
        Ok(())
    }
}

#[async_trait]
impl ShardLeases for MemoryLeaseStore {
    fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    async fn create_if_absent(&self, lease: &NewLease) -> Result<bool> {
        let mut rows = self.table.rows();
        let key = lease.key.to_string();
        if rows.contains_key(&key) {
            return Ok(false);
        }
        rows.insert(key, encode_new(lease));
        Ok(true)
    }

    async fn replace(&self, seen: &Lease, new: &NewLease) -> Result<()> {
        let mut rows = self.table.rows();
        let key = seen.key.to_string();
        let unchanged =
            rows.get(&key).and_then(|attrs| decode(attrs).ok()).is_some_and(|row| row.counter == seen.counter);
        if !unchanged || new.key != seen.key {
            return Err(LeaseError::ConditionFailed { key: seen.key.clone(), operation: "replace" });
        }
        rows.insert(key, encode_replacement(seen, new));
        self.observer.forget(&seen.key);
        Ok(())
    }

    async fn get(&self, key: &LeaseKey) -> Result<Option<Lease>> {
        let attrs = self.table.rows().get(&key.to_string()).cloned();
        let Some(attrs) = attrs else { return Ok(None) };
        let lease = decode(&attrs)?;
        self.observer.observe(&lease, self.settings.clock.monotonic());
        Ok(Some(lease))
    }

    async fn acquire(&self, seen: &Lease) -> Result<Lease> {
        self.observer.may_acquire(seen, &self.settings)?;
        let owner = self.settings.owner.clone();
        let expiry = self.settings.expiry_ms();
        let result = self.update_if(&seen.key, "acquire", seen.counter, None, |row| {
            row.insert(attr::LEASE_OWNER.into(), AttrValue::S(owner));
            row.insert(attr::LEASE_EXPIRY.into(), AttrValue::N(expiry.to_string()));
        });
        self.after_write(&seen.key, result)
    }

    async fn renew(&self, held: &Lease) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let expiry = self.settings.expiry_ms();
        let result = self.update_if(&held.key, "renew", held.counter, Some(&self.settings.owner), |row| {
            row.insert(attr::LEASE_EXPIRY.into(), AttrValue::N(expiry.to_string()));
            put_lag(row, held);
        });
        self.after_write(&held.key, result)
    }

    async fn checkpoint(&self, held: &Lease, checkpoint: &Checkpoint) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let result = self.update_if(&held.key, "checkpoint", held.counter, Some(&self.settings.owner), |row| {
            put_checkpoint(row, checkpoint);
            put_lag(row, held);
        });
        self.after_write(&held.key, result)
    }

    async fn release(&self, held: &Lease, final_checkpoint: Option<&Checkpoint>) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let result = self.update_if(&held.key, "release", held.counter, Some(&self.settings.owner), |row| {
            row.remove(attr::LEASE_OWNER);
            row.remove(attr::LEASE_EXPIRY);
            row.remove(attr::HANDOFF_TO);
            if let Some(checkpoint) = final_checkpoint {
                put_checkpoint(row, checkpoint);
            }
        });
        self.after_write(&held.key, result)
    }

    async fn release_to(&self, held: &Lease, to: &str, final_checkpoint: Option<&Checkpoint>) -> Result<Lease> {
        ensure_holder(held, &self.settings)?;
        let expiry = self.settings.expiry_ms();
        let result = self.update_if(&held.key, "release to", held.counter, Some(&self.settings.owner), |row| {
            row.insert(attr::LEASE_OWNER.into(), AttrValue::S(to.into()));
            row.insert(attr::LEASE_EXPIRY.into(), AttrValue::N(expiry.to_string()));
            row.remove(attr::HANDOFF_TO);
            if let Some(checkpoint) = final_checkpoint {
                put_checkpoint(row, checkpoint);
            }
        });
        self.after_write(&held.key, result)
    }

    async fn request_handoff(&self, seen: &Lease) -> Result<Lease> {
        let refused = || LeaseError::ConditionFailed { key: seen.key.clone(), operation: "request handoff" };
        let mut rows = self.table.rows();
        let row = rows.get_mut(&seen.key.to_string()).ok_or_else(refused)?;
        let current = decode(row).map_err(|_| refused())?;
        let unchanged = current.counter == seen.counter && current.owner == seen.owner;
        if !unchanged || seen.owner.is_none() || current.handoff_to != seen.handoff_to {
            return Err(refused());
        }
        row.insert(attr::HANDOFF_TO.into(), AttrValue::S(self.settings.owner.clone()));
        Ok(decode(row)?)
    }

    async fn withdraw_handoff(&self, seen: &Lease) -> Result<bool> {
        let mut rows = self.table.rows();
        let Some(row) = rows.get_mut(&seen.key.to_string()) else { return Ok(false) };
        let Ok(current) = decode(row) else { return Ok(false) };
        if current.counter != seen.counter || current.handoff_to.as_deref() != Some(self.settings.owner.as_str()) {
            return Ok(false);
        }
        row.remove(attr::HANDOFF_TO);
        Ok(true)
    }

    async fn delete(&self, seen: &Lease) -> Result<()> {
        self.delete_if_unchanged(&seen.key, seen.counter, "delete")
    }
}

#[async_trait]
impl ProgressRows for MemoryLeaseStore {
    async fn read_progress(&self, key: &LeaseKey) -> Result<Progress> {
        match self.table.rows().get(&key.to_string()) {
            None => Ok(Progress::default()),
            Some(row) => Ok(decode_progress(row)?),
        }
    }

    async fn write_progress(&self, key: &LeaseKey, progress: &Progress) -> Result<u64> {
        let mut rows = self.table.rows();
        let stored = rows.get(&key.to_string()).map(stored_counter);
        let unchanged = match (stored, progress.counter) {
            (None, None) => true,
            (Some(counter), Some(expected)) => counter == Some(expected),
            _ => false,
        };
        if !unchanged {
            return Err(LeaseError::ConditionFailed { key: key.clone(), operation: "write progress" });
        }
        let next = progress.counter.map_or(1, |c| c + 1);
        rows.insert(key.to_string(), encode_progress(key, progress, next));
        Ok(next)
    }
}

#[async_trait]
impl GroupRows for MemoryLeaseStore {
    async fn heartbeat(&self) -> Result<()> {
        let key = member_row_key(&self.settings.owner);
        let mut rows = self.table.rows();
        let row = rows.entry(key.clone()).or_default();
        let counter = decode_member(row).map(|m| m.counter + 1).unwrap_or(1);
        row.insert(attr::LEASE_KEY.into(), AttrValue::S(key));
        row.insert(attr::LEASE_OWNER.into(), AttrValue::S(self.settings.owner.clone()));
        row.insert(attr::LEASE_EXPIRY.into(), AttrValue::N(self.settings.expiry_ms().to_string()));
        row.insert(attr::LEASE_COUNTER.into(), AttrValue::N(counter.to_string()));
        if let Some(address) = &self.settings.address {
            row.insert(attr::MEMBER_ADDRESS.into(), AttrValue::S(address.clone()));
        }
        Ok(())
    }

    async fn leave(&self) -> Result<()> {
        self.table.rows().remove(&member_row_key(&self.settings.owner));
        Ok(())
    }

    async fn announce(&self) -> Result<()> {
        let key = changes_key();
        let mut rows = self.table.rows();
        let row = rows.entry(key.to_string()).or_insert_with(|| {
            encode_new(&NewLease {
                key: key.clone(),
                checkpoint: Checkpoint::TrimHorizon,
                parent_shard_ids: vec![],
                stream_created: None,
            })
        });
        let counter = decode(row).map(|l| l.counter + 1).unwrap_or(1);
        row.insert(attr::LEASE_COUNTER.into(), AttrValue::N(counter.to_string()));
        Ok(())
    }

    async fn changes(&self) -> Result<u64> {
        let rows = self.table.rows();
        Ok(rows.get(&changes_key().to_string()).and_then(|row| decode(row).ok()).map_or(0, |l| l.counter))
    }

    async fn remove_member(&self, member: &Member) -> Result<()> {
        self.delete_if_unchanged(&member_key(&member.owner), member.counter, "remove member")
    }

    async fn mark_draining(&self, worker: &str) -> Result<bool> {
        let mut rows = self.table.rows();
        let row = rows
            .get_mut(&member_row_key(worker))
            .filter(|row| matches!(row.get(attr::LEASE_OWNER), Some(AttrValue::S(owner)) if owner == worker))
            .ok_or_else(|| LeaseError::ConditionFailed { key: member_key(worker), operation: "mark draining" })?;
        if row.contains_key(attr::MEMBER_DRAINING) {
            return Ok(false);
        }
        row.insert(attr::MEMBER_DRAINING.into(), AttrValue::N(self.settings.clock.wall_ms().to_string()));
        Ok(true)
    }

    async fn unmark_draining(&self, worker: &str) -> Result<bool> {
        let mut rows = self.table.rows();
        Ok(rows.get_mut(&member_row_key(worker)).and_then(|row| row.remove(attr::MEMBER_DRAINING)).is_some())
    }

    async fn requeue_secret(&self) -> Result<String> {
        let mut rows = self.table.rows();
        let row = rows
            .entry(requeue_key_row().to_string())
            .or_insert_with(|| encode_requeue_row(&super::row::new_requeue_secret()));
        Ok(decode_requeue_secret(row)?)
    }
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn list_segment_page(
        &self,
        segment: u32,
        total: u32,
        start: Option<&PageToken>,
        limit: i32,
    ) -> Result<LeasePage> {
        let limit = usize::try_from(limit.max(1)).unwrap_or(1);
        let rows = self.table.rows();
        let lower = match start {
            Some(token) => Bound::Excluded(token.0.clone()),
            None => Bound::Unbounded,
        };
        let mut page = LeasePage::default();
        let mut range =
            rows.range((lower, Bound::Unbounded)).filter(|(key, _)| segment_of(key, total) == segment).peekable();
        for (key, attrs) in range.by_ref().take(limit) {
            page.push(decode_row(attrs));
            page.next = Some(PageToken(key.clone()));
        }
        if range.peek().is_none() {
            page.next = None;
        }
        drop(rows);
        self.observer.observe_page(&mut page, self.settings.clock.monotonic(), self.settings.duration);
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_requeue_secret_is_made_once_and_shared_by_the_table() {
        let table = MemoryLeaseTable::new();
        let (a, b) = (table.store(LeaseSettings::new("a")), table.store(LeaseSettings::new("b")));
        let secret = a.requeue_secret().await.unwrap();
        assert_eq!(secret.len(), 64);
        assert_eq!(b.requeue_secret().await.unwrap(), secret, "every worker of the table reads the same key");
        assert_eq!(a.requeue_secret().await.unwrap(), secret, "made once");
        let page = a.list().await.unwrap();
        assert!(page.leases.is_empty(), "the key's row is no lease");
        assert!(page.terms.iter().any(|t| t.key == requeue_key_row()), "it is a term-shaped row");
        let other = MemoryLeaseTable::new().store(LeaseSettings::new("a"));
        assert_ne!(other.requeue_secret().await.unwrap(), secret, "another table, another key");
    }
}
