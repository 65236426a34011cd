//! One consistent read of a lease table: the leases and membership rows (decoded by the lease crate's
//! codec, lag and a member's heartbeat expiry with them), and the rows that could not be read.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_worker::lease::{Lease, LeaseStore, Malformed, Member};

use crate::shared::error::{CliError, Result};
use crate::shared::target::Target;

/// A membership row as read: the lease crate's own [`Member`] (its `fresh` judges the heartbeat's
/// expiry on this machine's wall clock).
pub type MemberRow = Member;

/// What one read of the table showed.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Shard leases, in key order (each with the lag its holder last wrote, `Lease::lag_ms`).
    pub leases: Vec<Lease>,
    /// Rows that could not be read as leases.
    pub malformed: Vec<Malformed>,
    /// Membership rows, by owner.
    pub members: Vec<MemberRow>,
}

/// Now, epoch ms, on this machine's wall clock.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// Reads the whole table once (strongly consistent).
pub async fn read(target: &Target) -> Result<Snapshot> {
    let page = target.store("leasehold-cli").list().await?;
    let mut leases = page.leases;
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    let mut members = page.members;
    members.sort_by(|a, b| a.owner.cmp(&b.owner));
    Ok(Snapshot { leases, malformed: page.malformed, members })
}

/// Workers seen alive: membership rows whose heartbeat expiry lies ahead, or whose counter moved
/// between `before` and `after`; holders of leases whose counter moved, too.
pub fn alive_between(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let now = now_ms();
    let mut alive: Vec<String> = Vec::new();
    let counters: HashMap<&str, u64> = before.members.iter().map(|m| (m.owner.as_str(), m.counter)).collect();
    for member in &after.members {
        if member.fresh(now) || counters.get(member.owner.as_str()).is_some_and(|c| *c != member.counter) {
            alive.push(member.owner.clone());
        }
    }
    let leases: HashMap<String, u64> = before.leases.iter().map(|l| (l.key.to_string(), l.counter)).collect();
    for lease in &after.leases {
        let moved = leases.get(&lease.key.to_string()).is_some_and(|c| *c != lease.counter);
        if moved && let Some(owner) = &lease.owner {
            alive.push(owner.clone());
        }
    }
    alive.sort();
    alive.dedup();
    alive
}

/// Reads the table and makes sure no worker of the group is alive: a member whose heartbeat is fresh
/// refuses at once; otherwise, when the table shows any member or holder, it is read again after
/// `watch` and any counter that moved refuses. Returns the last read, which the writes condition on.
pub async fn read_quiet(target: &Target, watch: Duration, how_to_pause: &str) -> Result<Snapshot> {
    let first = read(target).await?;
    let refuse = |alive: Vec<String>| {
        CliError::Refused(format!(
            "refused: {} worker(s) of {} are alive: {}. {how_to_pause}",
            alive.len(),
            target.name(),
            alive.join(", ")
        ))
    };
    let fresh: Vec<String> = first.members.iter().filter(|m| m.fresh(now_ms())).map(|m| m.owner.clone()).collect();
    if !fresh.is_empty() {
        return Err(refuse(fresh));
    }
    let anyone = !first.members.is_empty() || first.leases.iter().any(|l| l.owner.is_some());
    if !anyone || watch.is_zero() {
        return Ok(first);
    }
    eprintln!(
        "the table shows {} membership row(s) and {} held lease(s) with expired heartbeats; watching their counters for {}...",
        first.members.len(),
        first.leases.iter().filter(|l| l.owner.is_some()).count(),
        humantime::format_duration(watch)
    );
    tokio::time::sleep(watch).await;
    let second = read(target).await?;
    let alive = alive_between(&first, &second);
    if alive.is_empty() { Ok(second) } else { Err(refuse(alive)) }
}
