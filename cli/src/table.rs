//! One consistent read of a lease table: the leases (decoded by the worker's own codec), the rows that
//! could not be read, the membership rows, and what the worker's codec does not carry (lag, expiry,
//! since when a member drains).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use leasehold_worker::internals::lease::{MEMBER_PREFIX, attr};
use leasehold_worker::lease::{Lease, LeaseStore, Malformed};

use crate::error::{CliError, Result, sdk_message};
use crate::target::Target;

/// The attribute holding a shard's lag in milliseconds, written by holders once the lag issue lands;
/// shown when present.
pub const LAG_ATTRIBUTE: &str = "lag_ms";

/// A membership row as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRow {
    /// The worker's owner id.
    pub owner: String,
    /// Its heartbeat counter.
    pub counter: u64,
    /// The expiry its last heartbeat wrote (epoch ms, the worker's wall clock).
    pub expiry_ms: Option<i64>,
    /// When it was marked draining (epoch ms), while it is.
    pub draining_since_ms: Option<i64>,
}

impl MemberRow {
    /// True while it carries the draining mark.
    pub fn is_draining(&self) -> bool {
        self.draining_since_ms.is_some()
    }

    /// True while its last heartbeat's expiry lies ahead on this machine's wall clock.
    pub fn fresh(&self, now_ms: i64) -> bool {
        self.expiry_ms.is_some_and(|expiry| expiry > now_ms)
    }
}

/// What one read of the table showed.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Shard leases, in key order.
    pub leases: Vec<Lease>,
    /// Rows that could not be read as leases.
    pub malformed: Vec<Malformed>,
    /// Membership rows.
    pub members: Vec<MemberRow>,
    /// Lag (ms) by `lease_key`, for rows that carry it.
    pub lag_ms: HashMap<String, i64>,
}

/// Now, epoch ms, on this machine's wall clock.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).unwrap_or(0)
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Option<i64> {
    item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok())
}

/// Reads the whole table (strongly consistent).
pub async fn read(target: &Target) -> Result<Snapshot> {
    let store = target.store("leasehold-cli");
    let page = store.list().await?;
    let mut leases = page.leases;
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    let mut snapshot = Snapshot { leases, malformed: page.malformed, ..Snapshot::default() };
    // The codec keeps neither a member's expiry nor a lag: a second, projected read for those.
    let mut start = None;
    loop {
        let out = target
            .dynamodb
            .scan()
            .table_name(&target.table)
            .consistent_read(true)
            .projection_expression("#k, #c, #e, #l, #d")
            .expression_attribute_names("#k", attr::LEASE_KEY)
            .expression_attribute_names("#c", attr::LEASE_COUNTER)
            .expression_attribute_names("#e", attr::LEASE_EXPIRY)
            .expression_attribute_names("#l", LAG_ATTRIBUTE)
            .expression_attribute_names("#d", attr::MEMBER_DRAINING)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| CliError::Service(format!("scan of {}: {}", target.table, sdk_message(&e))))?;
        for item in out.items.unwrap_or_default() {
            let Some(key) = item.get(attr::LEASE_KEY).and_then(|v| v.as_s().ok()) else { continue };
            if let Some(owner) = key.strip_prefix(MEMBER_PREFIX) {
                snapshot.members.push(MemberRow {
                    owner: owner.to_string(),
                    counter: number(&item, attr::LEASE_COUNTER).and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
                    expiry_ms: number(&item, attr::LEASE_EXPIRY),
                    draining_since_ms: number(&item, attr::MEMBER_DRAINING),
                });
            } else if let Some(lag) = number(&item, LAG_ATTRIBUTE) {
                snapshot.lag_ms.insert(key.clone(), lag);
            }
        }
        match out.last_evaluated_key {
            Some(key) if !key.is_empty() => start = Some(key),
            _ => break,
        }
    }
    snapshot.members.sort_by(|a, b| a.owner.cmp(&b.owner));
    Ok(snapshot)
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
