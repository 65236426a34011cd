//! `leasehold reset`: move checkpoints, dry run by default.
//!
//! Read and check everything first, then write, each write conditioned on the row as read (its
//! `lease_counter`, or its absence). A rewind to before a split or merge re-reads the lineage parents
//! first: every listed descendant of a rewound shard is rewound too, rows cleaned up since are created
//! again with their parents, and the worker's own rule ([`leasehold_worker::parents_done`]) then keeps
//! each child waiting until its parents reach `SHARD_END` again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args};
use leasehold_worker::lease::{Checkpoint, Lease, LeaseKey};
use serde::Serialize;

use crate::commands::describe::{State, state};
use crate::shared::error::{CliError, Result};
use crate::shared::output::{Format, columns, structured};
use crate::shared::positions::Positions;
use crate::shared::rows::{RowWrite, write_rows};
use crate::shared::shards::{self, Shard};
use crate::shared::snapshot::{Snapshot, read, read_quiet};
use crate::shared::target::{Target, TargetArgs, resolve};

/// Arguments of `reset`.
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("to").args(["to_earliest", "to_latest", "to_timestamp", "by_duration", "to_sequence", "from_file"])))]
pub struct ResetArgs {
    /// The consumer.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Every shard back to its oldest record (TRIM_HORIZON); the whole lineage is read again,
    /// parents before children.
    #[arg(long)]
    pub to_earliest: bool,
    /// Every open shard to its tip (LATEST); closed shards to SHARD_END.
    #[arg(long)]
    pub to_latest: bool,
    /// Every shard to the first record at or after this time (RFC 3339, e.g. 2026-01-31T12:00:00Z,
    /// or epoch milliseconds).
    #[arg(long, value_name = "TIME")]
    pub to_timestamp: Option<String>,
    /// Every shard back by this much from now (e.g. 30m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = crate::parse_duration)]
    pub by_duration: Option<Duration>,
    /// Set one shard's checkpoint: SHARD=SEQ, where SHARD is a shard id (or stream:shardId) and SEQ
    /// the last sequence number to count as done (SEQ/SUB inside a KPL aggregate; TRIM_HORIZON,
    /// LATEST, SHARD_END also accepted). Repeat for several shards.
    #[arg(long, value_name = "SHARD=SEQ")]
    pub to_sequence: Vec<String>,
    /// Set the checkpoints listed in a file written by `--export`.
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
    /// Only these streams (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub streams: Vec<String>,
    /// Only these shards (comma-separated shard ids or stream:shardId).
    #[arg(long, value_delimiter = ',')]
    pub shards: Vec<String>,
    /// Apply the change (refused while any worker of the group is alive). Without it, a dry run.
    #[arg(long)]
    pub execute: bool,
    /// Save the current checkpoints (of the shards in scope) to FILE first, in the format
    /// `--from-file` reads.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
    /// How long `--execute` watches rows whose heartbeats have expired before trusting that their
    /// workers are gone (default: the group's lease duration).
    #[arg(long, value_name = "DURATION", value_parser = crate::parse_duration)]
    pub watch: Option<Duration>,
    /// Test hook: wait this long between the last read and the first write.
    #[arg(long, hide = true, value_parser = crate::parse_duration)]
    pub pause_before_write: Option<Duration>,
}

/// The position a reset moves to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// Back to this position, with the lineage.
    Rewind(Checkpoint),
    /// Open shards to LATEST, closed ones to SHARD_END.
    Latest,
    /// Explicit positions per shard.
    Explicit(Vec<(String, Checkpoint)>),
}

/// One row's change.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// Stream name.
    pub stream: String,
    /// Shard id.
    pub shard: String,
    /// The checkpoint now (`None`: no row; one is created).
    pub before: Option<String>,
    /// The checkpoint after.
    pub after: String,
    /// The row's state after the reset.
    pub state_after: State,
    /// Why the row is part of the reset, or what to know about it.
    pub note: String,
    /// The row's counter as read (`None`: no row).
    #[serde(skip)]
    pub seen: Option<Lease>,
    /// The checkpoint to write.
    #[serde(skip)]
    pub checkpoint: Checkpoint,
    /// The shard's parents.
    #[serde(skip)]
    pub parents: Vec<String>,
}

impl Change {
    fn key(&self) -> LeaseKey {
        LeaseKey::new(self.stream.as_str(), self.shard.as_str())
    }
}

/// What `reset` printed or did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The lease table.
    pub table: String,
    /// True when nothing was written.
    pub dry_run: bool,
    /// Every change, parents before children.
    pub changes: Vec<Change>,
    /// Rows written (`stream:shard`).
    pub written: Vec<String>,
    /// Where the current checkpoints were saved.
    pub exported_to: Option<String>,
}

fn checkpoint_text(checkpoint: &Checkpoint) -> String {
    match checkpoint.sub_sequence() {
        Some(sub) => format!("{}/{sub}", checkpoint.attribute()),
        None => checkpoint.attribute(),
    }
}

/// Parses `SEQ` or `SEQ/SUB` (or a named position).
fn parse_position(text: &str) -> Result<Checkpoint> {
    let (sequence, sub) = match text.split_once('/') {
        Some((sequence, sub)) => {
            let sub = sub.parse().map_err(|_| CliError::Malformed(format!("sub-sequence {sub:?} is not a number")))?;
            (sequence, Some(sub))
        }
        None => (text, None),
    };
    Checkpoint::from_attributes(sequence, sub).map_err(|e| CliError::Malformed(e.to_string()))
}

/// Parses `--to-timestamp`: RFC 3339 or epoch milliseconds.
fn parse_time(text: &str) -> Result<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let time = humantime::parse_rfc3339_weak(text).map_err(|e| {
        CliError::Malformed(format!("--to-timestamp {text:?} is not RFC 3339 (2026-01-31T12:00:00Z) or epoch ms: {e}"))
    })?;
    let ms = time.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
}

fn mode(args: &ResetArgs) -> Result<Option<Mode>> {
    if args.to_earliest {
        return Ok(Some(Mode::Rewind(Checkpoint::TrimHorizon)));
    }
    if args.to_latest {
        return Ok(Some(Mode::Latest));
    }
    if let Some(text) = &args.to_timestamp {
        return Ok(Some(Mode::Rewind(Checkpoint::AtTimestamp(parse_time(text)?))));
    }
    if let Some(back) = args.by_duration {
        let back_ms = i64::try_from(back.as_millis()).unwrap_or(i64::MAX);
        return Ok(Some(Mode::Rewind(Checkpoint::AtTimestamp(
            crate::shared::snapshot::now_ms().saturating_sub(back_ms),
        ))));
    }
    if !args.to_sequence.is_empty() {
        let mut explicit = Vec::new();
        for entry in &args.to_sequence {
            let (shard, position) = entry
                .split_once('=')
                .ok_or_else(|| CliError::Usage(format!("--to-sequence {entry:?} is not SHARD=SEQ")))?;
            explicit.push((shard.to_string(), parse_position(position)?));
        }
        return Ok(Some(Mode::Explicit(explicit)));
    }
    if let Some(path) = &args.from_file {
        let positions = Positions::load(path)?;
        let mut explicit = Vec::new();
        for position in positions.checkpoints {
            explicit.push((position.key().to_string(), position.checkpoint()?));
        }
        return Ok(Some(Mode::Explicit(explicit)));
    }
    Ok(None)
}

/// The scope: which streams, and a filter on shards.
struct Scope {
    streams: Vec<String>,
    shards: Vec<String>,
}

impl Scope {
    fn shard_in(&self, key: &LeaseKey) -> bool {
        self.shards.is_empty() || self.shards.iter().any(|s| s == key.shard_id() || *s == key.to_string())
    }
}

fn scope(target: &Target, args: &ResetArgs, snapshot: &Snapshot) -> Scope {
    let mut streams: Vec<String> = if !args.streams.is_empty() {
        args.streams.clone()
    } else if !target.streams.is_empty() {
        target.streams.clone()
    } else {
        snapshot.leases.iter().map(|l| l.key.stream().to_string()).collect()
    };
    streams.sort();
    streams.dedup();
    Scope { streams, shards: args.shards.clone() }
}

/// The rows of the table as read, by key.
type Rows<'a> = HashMap<LeaseKey, &'a Lease>;

/// Plans the changes of `mode` over `snapshot` and the streams' listings.
fn plan(
    mode: &Mode,
    scope: &Scope,
    snapshot: &Snapshot,
    listings: &BTreeMap<String, Vec<Shard>>,
) -> Result<Vec<Change>> {
    let rows: Rows = snapshot.leases.iter().map(|l| (l.key.clone(), l)).collect();
    check_named_shards(scope, &rows, listings)?;
    let mut changes: Vec<Change> = Vec::new();
    // Rows of shards the stream no longer lists (trimmed) are left alone.
    for (stream, listing) in listings {
        match mode {
            Mode::Rewind(position) => changes.extend(rewind(stream, listing, position, scope, &rows)),
            Mode::Latest => changes.extend(latest(stream, listing, scope, &rows)),
            Mode::Explicit(_) => {}
        }
    }
    if let Mode::Explicit(entries) = mode {
        explicit(entries, scope, &rows, listings, &mut changes)?;
    }
    judge_states_after(snapshot, &mut changes);
    Ok(changes)
}

/// Every shard named by --shards must exist somewhere: a typo must not pass as "nothing to change".
fn check_named_shards(scope: &Scope, rows: &Rows, listings: &BTreeMap<String, Vec<Shard>>) -> Result<()> {
    for name in &scope.shards {
        let known = listings
            .iter()
            .any(|(stream, listing)| listing.iter().any(|s| s.id == *name || format!("{stream}:{}", s.id) == *name))
            || rows.keys().any(|k| k.shard_id() == name || k.to_string() == *name);
        if !known {
            return Err(CliError::NotFound(format!(
                "--shards names {name}, which is in neither the lease table nor the listing of {}",
                listings.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Ok(())
}

/// The change of row `key` to `after` (a row not read is created with `parents`).
fn change(rows: &Rows, key: &LeaseKey, parents: &[String], after: Checkpoint, note: String) -> Change {
    let seen = rows.get(key).map(|l| (*l).clone());
    Change {
        stream: key.stream().to_string(),
        shard: key.shard_id().to_string(),
        before: seen.as_ref().map(|l| checkpoint_text(&l.checkpoint)),
        after: checkpoint_text(&after),
        state_after: State::Free,
        note,
        parents: seen.as_ref().map(|l| l.parent_shard_ids.clone()).unwrap_or_else(|| parents.to_vec()),
        seen,
        checkpoint: after,
    }
}

/// `--to-*` over one stream: the shards in scope move to `position`, and their listed descendants
/// too (read again after them), parents first.
fn rewind(stream: &str, listing: &[Shard], position: &Checkpoint, scope: &Scope, rows: &Rows) -> Vec<Change> {
    let direct: BTreeSet<String> = listing
        .iter()
        .filter(|s| scope.shard_in(&LeaseKey::new(stream, s.id.as_str())))
        .map(|s| s.id.clone())
        .collect();
    let mut lineage: BTreeMap<String, String> = BTreeMap::new();
    for shard in &direct {
        for kid in shards::descendants(listing, shard) {
            if !direct.contains(&kid) {
                lineage.entry(kid).or_insert_with(|| shard.clone());
            }
        }
    }
    let mut changes = Vec::new();
    for shard in shards::parents_first(listing) {
        let key = LeaseKey::new(stream, shard.id.as_str());
        let note = match (direct.contains(&shard.id), lineage.get(&shard.id)) {
            (true, _) if !rows.contains_key(&key) => "row cleaned up after it ended: created again".into(),
            (true, _) => String::new(),
            (false, Some(ancestor)) => format!("descendant of {ancestor}: read again after it"),
            (false, None) => continue,
        };
        changes.push(change(rows, &key, &shard.parents, position.clone(), note));
    }
    changes
}

/// `--to-latest` over one stream: open shards in scope go to `LATEST`, closed ones with a row to
/// their end, parents first.
fn latest(stream: &str, listing: &[Shard], scope: &Scope, rows: &Rows) -> Vec<Change> {
    let mut changes = Vec::new();
    for shard in shards::parents_first(listing) {
        let key = LeaseKey::new(stream, shard.id.as_str());
        if !scope.shard_in(&key) {
            continue;
        }
        if shard.closed {
            if rows.contains_key(&key) {
                changes.push(change(
                    rows,
                    &key,
                    &shard.parents,
                    Checkpoint::ShardEnd,
                    "closed: skipped to its end".into(),
                ));
            }
        } else {
            changes.push(change(rows, &key, &shard.parents, Checkpoint::Latest, String::new()));
        }
    }
    changes
}

/// Explicit positions (`--to-sequence`, `--from-file`): each named shard, found in one stream's
/// rows or listing, moves to its own position (replacing a change planned for it).
fn explicit(
    entries: &[(String, Checkpoint)],
    scope: &Scope,
    rows: &Rows,
    listings: &BTreeMap<String, Vec<Shard>>,
    changes: &mut Vec<Change>,
) -> Result<()> {
    for (name, position) in entries {
        let candidates: Vec<LeaseKey> = match LeaseKey::parse(name) {
            Some(key) if listings.contains_key(key.stream()) => vec![key],
            _ => listings.keys().map(|stream| LeaseKey::new(stream.as_str(), name.as_str())).collect(),
        };
        let known: Vec<&LeaseKey> = candidates
            .iter()
            .filter(|key| {
                rows.contains_key(key)
                    || listings.get(key.stream()).is_some_and(|l| l.iter().any(|s| s.id == key.shard_id()))
            })
            .collect();
        let key = match known.as_slice() {
            [key] => (*key).clone(),
            [] => {
                return Err(CliError::NotFound(format!(
                    "shard {name} is in neither the lease table nor the listing of {}",
                    listings.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            _ => {
                return Err(CliError::Usage(format!("shard {name} is in several streams: name it as stream:shardId")));
            }
        };
        if !scope.shard_in(&key) {
            continue;
        }
        let parents = listings
            .get(key.stream())
            .and_then(|l| l.iter().find(|s| s.id == key.shard_id()))
            .map(|s| s.parents.clone())
            .unwrap_or_default();
        changes.retain(|c| c.key() != key);
        changes.push(change(rows, &key, &parents, position.clone(), String::new()));
    }
    Ok(())
}

/// The state each changed row will be in, by the worker's rule, over the table as it will be.
fn judge_states_after(snapshot: &Snapshot, changes: &mut [Change]) {
    let mut after: HashMap<LeaseKey, Lease> = snapshot.leases.iter().map(|l| (l.key.clone(), l.clone())).collect();
    for c in changes.iter() {
        let entry = after.entry(c.key()).or_insert_with(|| Lease {
            key: c.key(),
            owner: None,
            expiry_ms: None,
            counter: 0,
            checkpoint: c.checkpoint.clone(),
            parent_shard_ids: c.parents.clone(),
            handoff_to: None,
            stream_created: None,
            lag_ms: None,
            load: None,
            window_records: None,
        });
        entry.checkpoint = c.checkpoint.clone();
    }
    let by_key: HashMap<LeaseKey, &Lease> = after.iter().map(|(k, l)| (k.clone(), l)).collect();
    for c in changes.iter_mut() {
        if let Some(lease) = by_key.get(&c.key()) {
            // The dead holder's name stays on the row until a worker takes it; judge as free.
            let mut free = (*lease).clone();
            free.owner = None;
            c.state_after = state(&free, &by_key);
        }
    }
}

fn render(report: &Report) -> String {
    let rows: Vec<Vec<String>> = report
        .changes
        .iter()
        .map(|c| {
            vec![
                c.stream.clone(),
                c.shard.clone(),
                c.before.clone().unwrap_or_else(|| "(no row)".into()),
                "->".into(),
                c.after.clone(),
                c.state_after.name().to_string(),
                c.note.clone(),
            ]
        })
        .collect();
    let mut out = columns(&["STREAM", "SHARD", "BEFORE", "", "AFTER", "THEN", "NOTE"], &rows);
    if let Some(path) = &report.exported_to {
        out.push_str(&format!("current checkpoints saved to {path}\n"));
    }
    if report.changes.is_empty() {
        out.push_str("nothing to change\n");
    } else if report.dry_run {
        out.push_str(&format!(
            "dry run: {} row(s) would change; nothing written. Add --execute to apply.\n",
            report.changes.len()
        ));
    } else {
        out.push_str(&format!("{} row(s) written.\n", report.written.len()));
    }
    out
}

/// Writes the changes, parents first; stops at the first refusal, saying exactly what was written.
async fn apply(target: &Target, changes: &[Change]) -> Result<Vec<String>> {
    let rows: Vec<RowWrite> = changes
        .iter()
        .map(|c| RowWrite {
            key: c.key(),
            seen: c.seen.clone(),
            checkpoint: c.checkpoint.clone(),
            // A row read keeps its parents; a row re-created (cleaned up since) gets them from the listing.
            parents: c.seen.as_ref().map_or_else(|| c.parents.clone(), |seen| seen.parent_shard_ids.clone()),
        })
        .collect();
    let hint = "\n  the table was changed by someone else since the read: run describe, then the reset again";
    write_rows(&target.store("leasehold-cli"), &rows, hint).await
}

/// Runs `reset`.
pub async fn run(args: &ResetArgs, format: Format) -> Result<()> {
    let target = resolve(&args.target).await?;
    let mode = mode(args)?;
    if mode.is_none() && args.export.is_none() {
        return Err(CliError::Usage(
            "say where to: --to-earliest, --to-latest, --to-timestamp, --by-duration, --to-sequence or --from-file (or --export FILE alone)"
                .into(),
        ));
    }
    let how_to_pause = match &target.resource {
        Some((ns, name)) => format!(
            "Pause them first: `leasehold pause {ns}/{name}` (or kubectl scale --replicas 0), then run the reset again."
        ),
        None => "Stop them first (scale the workers to zero), then run the reset again.".to_string(),
    };
    let snapshot = if args.execute && mode.is_some() {
        read_quiet(&target, args.watch.unwrap_or(target.lease_duration), &how_to_pause).await?
    } else {
        read(&target).await?
    };
    let scope = scope(&target, args, &snapshot);
    let mut exported_to = None;
    if let Some(path) = &args.export {
        let leases: Vec<&Lease> = snapshot
            .leases
            .iter()
            .filter(|l| scope.streams.iter().any(|s| s == l.key.stream()) && scope.shard_in(&l.key))
            .collect();
        Positions::of(&target.table, &leases).save(path)?;
        exported_to = Some(path.display().to_string());
    }
    let changes = match &mode {
        Some(mode) => {
            let mut listings = BTreeMap::new();
            for stream in &scope.streams {
                listings.insert(stream.clone(), shards::list(&target.kinesis, stream).await?);
            }
            plan(mode, &scope, &snapshot, &listings)?
        }
        None => Vec::new(),
    };
    let mut report =
        Report { table: target.table.clone(), dry_run: !args.execute, changes, written: Vec::new(), exported_to };
    if args.execute && !report.changes.is_empty() {
        if let Some(pause) = args.pause_before_write {
            eprintln!("checked; writing in {}", humantime::format_duration(pause));
            tokio::time::sleep(pause).await;
        }
        report.written = apply(&target, &report.changes).await?;
    }
    if !structured(format, &report)? {
        print!("{}", render(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parents: &[&str], closed: bool) -> Shard {
        Shard { id: id.into(), parents: parents.iter().map(|p| p.to_string()).collect(), closed, hash_keys: None }
    }

    fn lease(shard: &str, checkpoint: Checkpoint, parents: &[&str]) -> Lease {
        Lease {
            key: LeaseKey::new("s", shard),
            owner: None,
            expiry_ms: None,
            counter: 3,
            checkpoint,
            parent_shard_ids: parents.iter().map(|p| p.to_string()).collect(),
            handoff_to: None,
            stream_created: None,
            lag_ms: None,
            load: None,
            window_records: None,
        }
    }

    /// 0 split into 1 and 2, merged into 3; 0's row cleaned up, 1 and 2 finished, 3 reading.
    fn lineage() -> (Snapshot, BTreeMap<String, Vec<Shard>>) {
        let listing = vec![
            shard("0", &[], true),
            shard("1", &["0"], true),
            shard("2", &["0"], true),
            shard("3", &["1", "2"], false),
        ];
        let snapshot = Snapshot {
            leases: vec![
                lease("1", Checkpoint::ShardEnd, &["0"]),
                lease("2", Checkpoint::ShardEnd, &["0"]),
                lease("3", Checkpoint::Sequence("77".into()), &["1", "2"]),
            ],
            ..Snapshot::default()
        };
        (snapshot, BTreeMap::from([("s".to_string(), listing)]))
    }

    fn summary(changes: &[Change]) -> Vec<(String, Option<String>, String, State)> {
        changes.iter().map(|c| (c.shard.clone(), c.before.clone(), c.after.clone(), c.state_after)).collect()
    }

    #[test]
    fn a_rewind_recreates_cleaned_up_parents_and_makes_children_wait() {
        let (snapshot, listings) = lineage();
        let scope = Scope { streams: vec!["s".into()], shards: vec![] };
        let changes = plan(&Mode::Rewind(Checkpoint::TrimHorizon), &scope, &snapshot, &listings).expect("plan");
        let th = || "TRIM_HORIZON".to_string();
        assert_eq!(
            summary(&changes),
            vec![
                ("0".into(), None, th(), State::Free),
                ("1".into(), Some("SHARD_END".into()), th(), State::WaitingForParents),
                ("2".into(), Some("SHARD_END".into()), th(), State::WaitingForParents),
                ("3".into(), Some("77".into()), th(), State::WaitingForParents),
            ]
        );
        assert_eq!(changes[0].parents, Vec::<String>::new());
        assert!(changes[0].seen.is_none() && changes[3].seen.as_ref().is_some_and(|l| l.counter == 3));
    }

    #[test]
    fn a_scoped_rewind_takes_the_descendants_along() {
        let (snapshot, listings) = lineage();
        let scope = Scope { streams: vec!["s".into()], shards: vec!["1".into()] };
        let changes = plan(&Mode::Rewind(Checkpoint::AtTimestamp(5)), &scope, &snapshot, &listings).expect("plan");
        let shards: Vec<&str> = changes.iter().map(|c| c.shard.as_str()).collect();
        assert_eq!(shards, vec!["1", "3"]);
        assert_eq!(changes[1].note, "descendant of 1: read again after it");
        assert_eq!(changes[1].state_after, State::WaitingForParents);
    }

    #[test]
    fn to_latest_ends_closed_shards_and_explicit_positions_need_a_known_shard() {
        let (snapshot, listings) = lineage();
        let scope = Scope { streams: vec!["s".into()], shards: vec![] };
        let changes = plan(&Mode::Latest, &scope, &snapshot, &listings).expect("plan");
        let after: Vec<(&str, &str)> = changes.iter().map(|c| (c.shard.as_str(), c.after.as_str())).collect();
        assert_eq!(after, vec![("1", "SHARD_END"), ("2", "SHARD_END"), ("3", "LATEST")]);
        let unknown = Mode::Explicit(vec![("9".into(), Checkpoint::Latest)]);
        assert!(matches!(plan(&unknown, &scope, &snapshot, &listings), Err(CliError::NotFound(_))));
        let typo = Scope { streams: vec!["s".into()], shards: vec!["nope".into()] };
        assert!(matches!(plan(&Mode::Latest, &typo, &snapshot, &listings), Err(CliError::NotFound(_))));
    }
}
