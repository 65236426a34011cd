//! `leasehold describe`: one row per shard, the live members and a summary.

use std::collections::HashMap;
use std::time::Duration;

use leasehold_worker::lease::{Lease, LeaseKey, ShardLoad};
use serde::Serialize;

use crate::shared::error::Result;
use crate::shared::output::{Format, bold, colour, columns, structured};
use crate::shared::snapshot::{Snapshot, now_ms, read};
use crate::shared::target::Target;

/// What a shard's row says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Held by a worker that reads it.
    Reading,
    /// Read to its end (`SHARD_END`).
    Finished,
    /// A parent has not been read to its end yet; nobody may read it.
    WaitingForParents,
    /// Nobody holds it; the next worker to scan takes it.
    Free,
}

impl State {
    /// The state's name as printed.
    pub fn name(self) -> &'static str {
        match self {
            State::Reading => "reading",
            State::Finished => "finished",
            State::WaitingForParents => "waiting for parents",
            State::Free => "free",
        }
    }
}

/// The state of `lease` among `rows`, by the worker's own rule for parents.
pub fn state(lease: &Lease, rows: &HashMap<LeaseKey, &Lease>) -> State {
    if lease.checkpoint.is_shard_end() {
        State::Finished
    } else if !leasehold_worker::parents_done(lease, rows) {
        State::WaitingForParents
    } else if lease.owner.is_some() {
        State::Reading
    } else {
        State::Free
    }
}

/// A load as described: one shard's, as its holder last measured it, or a member's (the sum over the
/// leases it holds whose rows carry one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadView {
    /// Kinesis records read per second.
    pub records_per_second: u64,
    /// Bytes of record data per second.
    pub bytes_per_second: u64,
    /// Milliseconds per second the processor spent on the records.
    pub busy_ms_per_second: u64,
}

impl From<ShardLoad> for LoadView {
    fn from(load: ShardLoad) -> Self {
        Self {
            records_per_second: load.records_per_s,
            bytes_per_second: load.bytes_per_s,
            busy_ms_per_second: load.busy_ms_per_s,
        }
    }
}

/// The sum of the loads of `leases` that carry one; `None` when none does.
pub fn total_load<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Option<LoadView> {
    let measured: Vec<ShardLoad> = leases.into_iter().filter_map(|l| l.load).collect();
    (!measured.is_empty()).then(|| ShardLoad::sum(&measured).into())
}

/// One shard as described.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardRow {
    /// Stream name.
    pub stream: String,
    /// Shard id.
    pub shard: String,
    /// Holder, if any.
    pub owner: Option<String>,
    /// True while the holder's heartbeat is fresh; false for a holder that went silent (its lease
    /// moves once another worker has watched it stand still for a lease duration).
    pub owner_alive: bool,
    /// `checkpoint` as stored.
    pub checkpoint: String,
    /// `checkpoint_subsequence`, inside a KPL aggregate.
    pub sub_sequence: Option<u32>,
    /// Lag in ms, when the row carries it.
    pub lag_ms: Option<i64>,
    /// The shard's load as its holder last measured it, when the row carries one.
    pub load: Option<LoadView>,
    /// Parent shard ids.
    pub parents: Vec<String>,
    /// A pending handoff request: the asker.
    pub handoff_to: Option<String>,
    /// What the row says.
    pub state: State,
    /// The row's `lease_counter`.
    pub counter: u64,
}

/// One member as described.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    /// Owner id.
    pub owner: String,
    /// Heartbeat expiry still ahead (by this machine's clock).
    pub alive: bool,
    /// Marked draining (`leasehold drain`): it takes no lease and hands its own away.
    pub draining: bool,
    /// Leases it holds.
    pub leases: usize,
    /// The sum of the loads of the leases it holds (those whose rows carry one): `None` when none does.
    pub load: Option<LoadView>,
}

/// The one-line summary.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Shard rows.
    pub shards: usize,
    /// Rows being read.
    pub reading: usize,
    /// Rows read to their end.
    pub finished: usize,
    /// Rows waiting for parents.
    pub waiting_for_parents: usize,
    /// Free rows.
    pub free: usize,
    /// Live members.
    pub live_members: usize,
    /// Rows that could not be read.
    pub malformed: usize,
    /// Largest lag among rows that carry it (ms).
    pub max_lag_ms: Option<i64>,
}

/// A row that could not be read.
#[derive(Debug, Serialize)]
pub struct MalformedRow {
    /// Its `lease_key` as stored.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Everything `describe` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// `namespace/name`, when a StreamConsumer.
    pub consumer: Option<String>,
    /// Lease table.
    pub table: String,
    /// One per shard row.
    pub shards: Vec<ShardRow>,
    /// Membership rows.
    pub members: Vec<MemberView>,
    /// Unreadable rows.
    pub malformed: Vec<MalformedRow>,
    /// Counts.
    pub summary: Summary,
}

/// Builds the description of a snapshot.
pub fn describe(target: &Target, snapshot: &Snapshot) -> Description {
    let rows: HashMap<LeaseKey, &Lease> = snapshot.leases.iter().map(|l| (l.key.clone(), l)).collect();
    let now = now_ms();
    let alive = |owner: &str| snapshot.members.iter().any(|m| m.owner == owner && m.fresh(now));
    let mut summary =
        Summary { shards: snapshot.leases.len(), malformed: snapshot.malformed.len(), ..Summary::default() };
    let shards: Vec<ShardRow> = snapshot
        .leases
        .iter()
        .map(|lease| {
            let state = state(lease, &rows);
            match state {
                State::Reading => summary.reading += 1,
                State::Finished => summary.finished += 1,
                State::WaitingForParents => summary.waiting_for_parents += 1,
                State::Free => summary.free += 1,
            }
            let lag_ms = lease.lag_ms.and_then(|ms| i64::try_from(ms).ok());
            summary.max_lag_ms = summary.max_lag_ms.max(lag_ms);
            ShardRow {
                stream: lease.key.stream().to_string(),
                shard: lease.key.shard_id().to_string(),
                owner: lease.owner.clone(),
                owner_alive: lease.owner.as_deref().is_some_and(alive),
                checkpoint: lease.checkpoint.attribute(),
                sub_sequence: lease.checkpoint.sub_sequence(),
                lag_ms,
                load: lease.load.map(LoadView::from),
                parents: lease.parent_shard_ids.clone(),
                handoff_to: lease.handoff_to.clone(),
                state,
                counter: lease.counter,
            }
        })
        .collect();
    let members: Vec<MemberView> = snapshot
        .members
        .iter()
        .map(|m| MemberView {
            owner: m.owner.clone(),
            alive: m.fresh(now),
            draining: m.draining,
            leases: snapshot.leases.iter().filter(|l| l.is_held_by(&m.owner)).count(),
            load: total_load(snapshot.leases.iter().filter(|l| l.is_held_by(&m.owner))),
        })
        .collect();
    summary.live_members = members.iter().filter(|m| m.alive).count();
    Description {
        consumer: target.resource.as_ref().map(|(ns, name)| format!("{ns}/{name}")),
        table: target.table.clone(),
        shards,
        members,
        malformed: snapshot
            .malformed
            .iter()
            .map(|m| MalformedRow { key: m.key.clone(), reason: m.reason.clone() })
            .collect(),
        summary,
    }
}

fn dash(value: Option<&str>) -> String {
    value.filter(|v| !v.is_empty()).unwrap_or("-").to_string()
}

/// A load's three cells: records/s, bytes/s, busy ms/s (dashes when unmeasured).
fn load_cells(load: Option<&LoadView>) -> [String; 3] {
    match load {
        Some(l) => {
            [l.records_per_second.to_string(), l.bytes_per_second.to_string(), format!("{}ms/s", l.busy_ms_per_second)]
        }
        None => ["-".into(), "-".into(), "-".into()],
    }
}

/// The description as text for people.
pub fn render(description: &Description, colour: bool) -> String {
    let rows: Vec<Vec<String>> = description
        .shards
        .iter()
        .map(|s| {
            let checkpoint = match s.sub_sequence {
                Some(sub) => format!("{}/{sub}", s.checkpoint),
                None => s.checkpoint.clone(),
            };
            let lag =
                s.lag_ms.map(|ms| humantime::format_duration(Duration::from_millis(ms.max(0) as u64)).to_string());
            let state = if colour && s.state == State::WaitingForParents {
                bold(s.state.name(), true)
            } else {
                s.state.name().to_string()
            };
            let mut row = vec![
                s.stream.clone(),
                s.shard.clone(),
                match &s.owner {
                    Some(owner) if !s.owner_alive => format!("{owner} (silent)"),
                    owner => dash(owner.as_deref()),
                },
                checkpoint,
                dash(lag.as_deref()),
            ];
            row.extend(load_cells(s.load.as_ref()));
            row.extend([dash(Some(&s.parents.join(","))), dash(s.handoff_to.as_deref()), state]);
            row
        })
        .collect();
    let mut out = columns(
        &[
            "STREAM",
            "SHARD",
            "OWNER",
            "CHECKPOINT",
            "LAG",
            "RECORDS/S",
            "BYTES/S",
            "BUSY",
            "PARENTS",
            "HANDOFF",
            "STATE",
        ],
        &rows,
    );
    for row in &description.malformed {
        out.push_str(&format!("malformed row {}: {}\n", row.key, row.reason));
    }
    out.push('\n');
    if description.members.is_empty() {
        out.push_str("MEMBERS: none\n");
    } else {
        let members: Vec<Vec<String>> = description
            .members
            .iter()
            .map(|m| {
                let heartbeat = if m.alive { "alive" } else { "silent" };
                let heartbeat = if m.draining { format!("{heartbeat}, draining") } else { heartbeat.to_string() };
                let mut row = vec![m.owner.clone(), heartbeat, m.leases.to_string()];
                row.extend(load_cells(m.load.as_ref()));
                row
            })
            .collect();
        out.push_str(&columns(&["MEMBER", "HEARTBEAT", "LEASES", "RECORDS/S", "BYTES/S", "BUSY"], &members));
    }
    let s = &description.summary;
    let lag = s
        .max_lag_ms
        .map(|ms| format!(", max lag {}", humantime::format_duration(Duration::from_millis(ms.max(0) as u64))))
        .unwrap_or_default();
    out.push_str(&format!(
        "\n{} shards: {} reading, {} finished, {} waiting for parents, {} free; {} live member(s){}{}\n",
        s.shards,
        s.reading,
        s.finished,
        s.waiting_for_parents,
        s.free,
        s.live_members,
        if s.malformed > 0 { format!(", {} malformed row(s)", s.malformed) } else { String::new() },
        lag
    ));
    out
}

/// Runs `describe`.
pub async fn run(target: &Target, format: Format) -> Result<()> {
    let snapshot = read(target).await?;
    let description = describe(target, &snapshot);
    if !structured(format, &description)? {
        print!("{}", render(&description, colour()));
    }
    Ok(())
}
