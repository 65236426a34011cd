//! Judging expiry by observation: since when, on this worker's monotonic clock, each row's counter has
//! stayed the same. Shared by both stores so both enforce the same takeover rule.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::LeasePage;
use super::error::{LeaseError, Result};
use super::key::LeaseKey;
use super::row::{Lease, Member, member_key};
use super::settings::LeaseSettings;

#[derive(Debug, Clone, Copy)]
struct Seen {
    counter: u64,
    since: Duration,
}

/// What one worker has seen of each row's counter.
#[derive(Debug, Default)]
pub struct Observer {
    seen: Mutex<HashMap<LeaseKey, Seen>>,
}

impl Observer {
    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseKey, Seen>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts/removes).
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that `key`'s counter was `counter` at monotonic time `now`; returns since when it has
    /// been that.
    fn sighting(&self, key: LeaseKey, counter: u64, now: Duration) -> Duration {
        let mut seen = self.seen();
        let entry = seen.entry(key).or_insert(Seen { counter, since: now });
        if entry.counter != counter {
            *entry = Seen { counter, since: now };
        }
        entry.since
    }

    /// Records a read or a successful write of `lease` at monotonic time `now`.
    pub fn observe(&self, lease: &Lease, now: Duration) {
        self.sighting(lease.key.clone(), lease.counter, now);
    }

    /// Forgets a row (deleted, or a write on it failed so the last copy is stale).
    pub fn forget(&self, key: &LeaseKey) {
        self.seen().remove(key);
    }

    /// Records the outcome of a write on `key` at monotonic time `now`, and passes it on: the row as
    /// written, or, after a refused or unanswered write, nothing, since our copy is stale and the
    /// caller must read again.
    pub fn after_write(&self, key: &LeaseKey, result: Result<Lease>, now: Duration) -> Result<Lease> {
        match &result {
            Ok(lease) => self.observe(lease, now),
            Err(_) => self.forget(key),
        }
        result
    }

    /// Records a membership row read at monotonic time `now` and says whether the worker is alive: its
    /// counter moved within the last lease duration (or was first seen less than one ago).
    fn member_alive(&self, member: &Member, now: Duration, duration: Duration) -> bool {
        let since = self.sighting(member_key(&member.owner), member.counter, now);
        now.saturating_sub(since) < duration
    }

    /// Records a page read at monotonic time `now`: every lease observed, every member judged alive or
    /// not against `duration`.
    pub fn observe_page(&self, page: &mut LeasePage, now: Duration, duration: Duration) {
        page.leases.iter().chain(&page.terms).for_each(|lease| self.observe(lease, now));
        for member in &mut page.members {
            member.alive = self.member_alive(member, now, duration);
        }
    }

    /// Whether `settings.owner` may take `lease` now, judged only on this worker's observations.
    pub fn may_acquire(&self, lease: &Lease, settings: &LeaseSettings) -> Result<()> {
        let seen = self.seen().get(&lease.key).copied();
        let seen = match seen {
            Some(seen) if seen.counter == lease.counter => seen,
            _ => return Err(LeaseError::NotObserved { key: lease.key.clone(), counter: lease.counter }),
        };
        let owner = match &lease.owner {
            None => return Ok(()),
            Some(owner) if *owner == settings.owner => return Ok(()),
            Some(owner) => owner,
        };
        let unchanged_for = settings.clock.monotonic().saturating_sub(seen.since);
        if unchanged_for >= settings.duration {
            Ok(())
        } else {
            Err(LeaseError::HeldByOther {
                key: lease.key.clone(),
                owner: owner.clone(),
                remaining: settings.duration - unchanged_for,
            })
        }
    }
}

/// Refuses, without a round trip, a holder operation on a copy that shows another owner.
pub fn ensure_holder(held: &Lease, settings: &LeaseSettings) -> Result<()> {
    if held.is_held_by(&settings.owner) {
        Ok(())
    } else {
        Err(LeaseError::NotOwner { key: held.key.clone(), owner: settings.owner.clone() })
    }
}
