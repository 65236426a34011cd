//! `leasehold import-kcl`: copy the checkpoints of a Java KCL lease table (KCL 2.x and 3.x rows, as
//! its `DynamoDBLeaseSerializer` and `DynamoDBMultiStreamLeaseSerializer` write them) into the
//! consumer's lease table, so a KCL application switches with no gap and no reprocessing.
//!
//! A KCL row is `leaseKey` (`shardId-…`, or `account:stream:creationEpoch:shardId` for a multi-stream
//! application), `leaseOwner`, `leaseCounter`, `checkpoint` (a sequence number or `TRIM_HORIZON`,
//! `LATEST`, `AT_TIMESTAMP`, `SHARD_END`), `checkpointSubSequenceNumber`, `pendingCheckpoint`,
//! `parentShardId`, `childShardIds`, and since 3.x `entityType` (rows other than `LEASE` are not
//! leases). The KCL resumes a shard AT the checkpoint's sequence number and drops every user record
//! whose (sequence, sub-sequence) is not above the checkpoint's, and ignores a pending checkpoint on
//! restart (it only records that a two-phase checkpoint was prepared): this import does the same.
//!
//! The KCL 3.x adds to its lease rows `checkpointOwner` (set while a graceful handoff is in flight:
//! `leaseOwner` names the next owner, `checkpointOwner` the one still processing and checkpointing),
//! `throughputKBps`, `startingHashKey`/`endingHashKey`, and keeps its worker metrics and coordinator
//! state in two other tables (`<app>-WorkerMetricStats`, `<app>-CoordinatorState`), never read here.
//! The checkpoint of a row in handoff is the one to resume from; both owners count as holders.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_kinesis::types::ShardIteratorType;
use clap::Args;
use leasehold_worker::aws::kinesis::{self, StreamRef};
use leasehold_worker::aws::{dynamodb_client, sdk_config};
use leasehold_worker::internals::kpl::{Opened, open};
use leasehold_worker::lease::{Checkpoint, Lease, LeaseKey};
use serde::Serialize;

use crate::shared::error::{CliError, Result, sdk_message};
use crate::shared::output::{Format, columns, structured};
use crate::shared::rows::{RowWrite, write_rows};
use crate::shared::shards::{self, Shard};
use crate::shared::snapshot::read_quiet;
use crate::shared::target::{Target, TargetArgs, resolve};

/// Arguments of `import-kcl`.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The consumer to import into.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The KCL application's lease table (its application name).
    #[arg(long = "from", value_name = "KCL_TABLE")]
    pub from: String,
    /// The stream a single-stream KCL application read (default: the consumer's only stream).
    #[arg(long, value_name = "STREAM")]
    pub kcl_stream: Option<String>,
    /// Write the checkpoints (refused while the KCL application or Leasehold workers are alive).
    #[arg(long)]
    pub execute: bool,
    /// Import even though the KCL application seems to hold leases (its counters moved).
    #[arg(long)]
    pub force: bool,
    /// The DynamoDB endpoint of the KCL table when it is not the consumer's (an emulator, another
    /// account's VPC endpoint); default: the consumer's DynamoDB.
    #[arg(long, value_name = "URL")]
    pub from_dynamodb_endpoint: Option<String>,
    /// How long to watch the KCL rows' lease counters before judging the application stopped (the
    /// KCL's own failover time; default 10s).
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    pub watch: Duration,
}

/// One KCL lease row as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KclLease {
    /// `leaseKey` as stored.
    pub lease_key: String,
    /// The stream (from a multi-stream key, else the one given).
    pub stream: Option<String>,
    /// The stream's creation epoch (seconds) from a multi-stream key.
    pub creation_epoch: Option<i64>,
    /// Shard id.
    pub shard: String,
    /// `leaseOwner` (during a KCL 3.x handoff, the next owner).
    pub owner: Option<String>,
    /// `checkpointOwner` (KCL 3.x): the owner still checkpointing while a graceful handoff is in flight.
    pub checkpoint_owner: Option<String>,
    /// `leaseCounter`.
    pub counter: i64,
    /// `checkpoint`.
    pub checkpoint: String,
    /// `checkpointSubSequenceNumber` (0 when absent).
    pub sub_sequence: i64,
    /// `pendingCheckpoint`, if a two-phase checkpoint was prepared.
    pub pending: Option<String>,
    /// `parentShardId`.
    pub parents: Vec<String>,
}

/// What reading a KCL table gave.
#[derive(Debug, Default)]
pub struct KclTable {
    /// Lease rows.
    pub leases: Vec<KclLease>,
    /// Rows of other entity types (KCL 3.x), skipped.
    pub skipped: Vec<String>,
}

fn s(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    item.get(name).and_then(|v| v.as_s().ok()).cloned()
}

fn n(item: &HashMap<String, AttributeValue>, name: &str) -> Result<Option<i64>, String> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::N(text)) => text.parse().map(Some).map_err(|_| format!("{name} = {text} is not a number")),
        Some(_) => Err(format!("{name} is not a number")),
    }
}

/// Reads one KCL row; `Ok(None)` for a row that is not a lease.
pub fn parse_row(item: &HashMap<String, AttributeValue>) -> Result<Option<KclLease>, (String, String)> {
    let key = s(item, "leaseKey").unwrap_or_else(|| "<no leaseKey>".into());
    let bad = |reason: String| (key.clone(), reason);
    if let Some(entity) = s(item, "entityType")
        && entity != "LEASE"
    {
        return Ok(None);
    }
    if item.get("leaseKey").and_then(|v| v.as_s().ok()).is_none() {
        return Err(bad("leaseKey is missing or not a string".into()));
    }
    let parts: Vec<&str> = key.split(':').collect();
    let (stream, creation_epoch, shard) = match parts.as_slice() {
        [shard] => (None, None, shard.to_string()),
        [_account, stream, epoch, shard] => {
            let epoch = epoch.parse().map_err(|_| bad(format!("creation epoch {epoch:?} is not a number")))?;
            (Some(stream.to_string()), Some(epoch), shard.to_string())
        }
        _ => return Err(bad("leaseKey is neither shardId-… nor account:stream:creationEpoch:shardId".into())),
    };
    let checkpoint = s(item, "checkpoint").ok_or_else(|| bad("checkpoint is missing".into()))?;
    let counter = n(item, "leaseCounter").map_err(&bad)?.unwrap_or(0);
    let sub_sequence = n(item, "checkpointSubSequenceNumber").map_err(&bad)?.unwrap_or(0);
    let parents = item.get("parentShardId").and_then(|v| v.as_ss().ok()).cloned().unwrap_or_default();
    Ok(Some(KclLease {
        lease_key: key.clone(),
        stream,
        creation_epoch,
        shard,
        owner: s(item, "leaseOwner"),
        checkpoint_owner: s(item, "checkpointOwner").filter(|o| !o.is_empty()),
        counter,
        checkpoint,
        sub_sequence,
        pending: s(item, "pendingCheckpoint").filter(|p| !p.is_empty()),
        parents,
    }))
}

/// Reads the whole KCL table (strongly consistent); a malformed lease row fails the read.
pub async fn read_kcl(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<KclTable> {
    let mut out = KclTable::default();
    let mut start = None;
    loop {
        let page =
            client.scan().table_name(table).consistent_read(true).set_exclusive_start_key(start).send().await.map_err(
                |e| {
                    if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) {
                        CliError::NotFound(format!("KCL lease table {table} does not exist"))
                    } else {
                        CliError::Service(format!("scan of KCL table {table}: {}", sdk_message(&e)))
                    }
                },
            )?;
        for item in page.items.unwrap_or_default() {
            match parse_row(&item) {
                Ok(Some(lease)) => out.leases.push(lease),
                Ok(None) => out.skipped.push(s(&item, "leaseKey").unwrap_or_default()),
                Err((key, reason)) => {
                    return Err(CliError::Malformed(format!("malformed KCL row {key} in {table}: {reason}")));
                }
            }
        }
        match page.last_evaluated_key {
            Some(key) if !key.is_empty() => start = Some(key),
            _ => break,
        }
    }
    Ok(out)
}

/// How the record at `sequence` of `shard` is packed: `Ok(Some(n))` user records for a KPL aggregate,
/// `Ok(Some(1))` for a plain record, `Ok(None)` when it cannot be read (trimmed, no permission), and
/// `Err` when the sequence number is not one of this shard's (another stream's table): Kinesis refuses
/// it, or (kinesalite) no record answers at it.
async fn user_records(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    shard: &str,
    sequence: &str,
) -> std::result::Result<Option<usize>, String> {
    let iterator = client
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(sequence)
        .send()
        .await;
    let iterator = match iterator {
        Ok(out) => out.shard_iterator,
        Err(e) => {
            let message = sdk_message(&e);
            return if message.starts_with("InvalidArgumentException") { Err(message) } else { Ok(None) };
        }
    };
    let Some(mut iterator) = iterator else { return Ok(None) };
    // A page may come back empty on a sparse shard: follow it a few times before concluding.
    let mut record = None;
    for _ in 0..3 {
        let Ok(out) = client.get_records().shard_iterator(&iterator).limit(1).send().await else { return Ok(None) };
        if let Some(first) = out.records.into_iter().next() {
            record = Some(first);
            break;
        }
        match out.next_shard_iterator {
            Some(next) => iterator = next,
            None => break,
        }
    }
    let Some(record) = record.filter(|r| r.sequence_number == sequence) else {
        return Err(format!("no record {sequence} in {stream}/{shard}"));
    };
    let data = bytes::Bytes::from(record.data.into_inner());
    // `open` counts the user records without making them (a hostile aggregate holds ~175,000).
    Ok(Some(match open(&data) {
        Opened::Aggregate(users) => users.len(),
        _ => 1,
    }))
}

/// The Leasehold checkpoint equal to a KCL checkpoint, with a note when something was decided.
async fn translate(target: &Target, stream: &str, lease: &KclLease, force: bool) -> Result<(Checkpoint, String)> {
    let mut note = match &lease.pending {
        Some(pending) => format!("pending checkpoint {pending} ignored, as the KCL does on restart"),
        None => String::new(),
    };
    if let Some(from) = &lease.checkpoint_owner {
        let to = lease.owner.as_deref().unwrap_or("nobody");
        if !note.is_empty() {
            note.push_str("; ");
        }
        note.push_str(&format!("KCL 3.x handoff from {from} to {to} was in flight: its checkpoint taken as is"));
    }
    let mut add = |text: &str| {
        if !note.is_empty() {
            note.push_str("; ");
        }
        note.push_str(text);
    };
    let checkpoint = match lease.checkpoint.as_str() {
        "TRIM_HORIZON" => Checkpoint::TrimHorizon,
        "LATEST" => Checkpoint::Latest,
        "SHARD_END" => Checkpoint::ShardEnd,
        "AT_TIMESTAMP" => {
            add(
                "the KCL's AT_TIMESTAMP start keeps its time in the application's config, not the row: starting at TRIM_HORIZON",
            );
            Checkpoint::TrimHorizon
        }
        sequence if !sequence.is_empty() && sequence.bytes().all(|b| b.is_ascii_digit()) => {
            let sub = u32::try_from(lease.sub_sequence).map_err(|_| {
                CliError::Malformed(format!(
                    "KCL row {}: checkpointSubSequenceNumber {} out of range",
                    lease.lease_key, lease.sub_sequence
                ))
            })?;
            let packed = match user_records(&target.kinesis, stream, &lease.shard, sequence).await {
                Ok(packed) => packed,
                Err(_) if force => None,
                Err(message) => {
                    return Err(CliError::NotFound(format!(
                        "KCL row {}: checkpoint {sequence} is not a record of {stream}/{} ({message}): is the KCL table about another stream? (--force imports it as is)",
                        lease.lease_key, lease.shard
                    )));
                }
            };
            match packed {
                // A plain record, or an aggregate whose last user record is done: the whole record.
                Some(users) if (sub as usize) + 1 >= users => Checkpoint::Sequence(sequence.to_string()),
                Some(_) => Checkpoint::SubSequence { sequence: sequence.to_string(), sub_sequence: sub },
                None if sub == 0 => {
                    add("record not readable (trimmed?): taken as done whole");
                    Checkpoint::Sequence(sequence.to_string())
                }
                None => Checkpoint::SubSequence { sequence: sequence.to_string(), sub_sequence: sub },
            }
        }
        other => {
            return Err(CliError::Malformed(format!(
                "KCL row {}: checkpoint {other:?} is not a sequence number or a sentinel",
                lease.lease_key
            )));
        }
    };
    Ok((checkpoint, note))
}

/// One row of the import.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Import {
    /// The KCL row's `leaseKey`.
    pub kcl_key: String,
    /// Stream.
    pub stream: String,
    /// Shard id.
    pub shard: String,
    /// The KCL's checkpoint (`sequence/sub` with a sub-sequence).
    pub kcl_checkpoint: String,
    /// The consumer's checkpoint now (`None`: no row).
    pub before: Option<String>,
    /// The checkpoint written.
    pub after: String,
    /// What was decided.
    pub note: String,
    #[serde(skip)]
    seen: Option<Lease>,
    #[serde(skip)]
    checkpoint: Checkpoint,
    #[serde(skip)]
    parents: Vec<String>,
}

/// What `import-kcl` printed or did.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The KCL table.
    pub from: String,
    /// The consumer's table.
    pub table: String,
    /// True when nothing was written.
    pub dry_run: bool,
    /// One per KCL lease row imported, parents first.
    pub imports: Vec<Import>,
    /// KCL rows that are not leases (skipped).
    pub skipped: Vec<String>,
    /// KCL rows of shards the stream no longer lists (skipped).
    pub unlisted: Vec<String>,
    /// Rows written.
    pub written: Vec<String>,
}

fn text(checkpoint: &Checkpoint) -> String {
    match checkpoint.sub_sequence() {
        Some(sub) => format!("{}/{sub}", checkpoint.attribute()),
        None => checkpoint.attribute(),
    }
}

/// The stream's creation time, epoch seconds.
async fn created_epoch(client: &aws_sdk_kinesis::Client, stream: &str) -> Result<Option<i64>> {
    let summary = kinesis::describe_stream(client, StreamRef::named(stream))
        .await
        .map_err(|e| CliError::Service(format!("describing {stream}: {e}")))?;
    Ok(Some(summary.stream_creation_timestamp.secs()))
}

/// Watches the KCL rows' counters for `watch`; the owners of rows whose counter moved.
async fn kcl_alive(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    first: &KclTable,
    watch: Duration,
) -> Result<Vec<String>> {
    if !first.leases.iter().any(|l| l.owner.is_some() || l.checkpoint_owner.is_some()) || watch.is_zero() {
        return Ok(Vec::new());
    }
    eprintln!("watching the KCL table's lease counters for {}...", humantime::format_duration(watch));
    tokio::time::sleep(watch).await;
    let second = read_kcl(client, table).await?;
    let before: HashMap<&str, i64> = first.leases.iter().map(|l| (l.lease_key.as_str(), l.counter)).collect();
    let mut alive: Vec<String> = second
        .leases
        .iter()
        .filter(|l| before.get(l.lease_key.as_str()) != Some(&l.counter))
        .flat_map(|l| l.owner.iter().chain(l.checkpoint_owner.iter()).cloned())
        .collect();
    alive.sort();
    alive.dedup();
    Ok(alive)
}

/// Runs `import-kcl`: read the KCL table, group its leases by stream, refuse while either group is
/// alive, plan one import per listed shard (parents first), write them with `--execute`, print.
pub async fn run(args: &ImportArgs, format: Format) -> Result<()> {
    let target = resolve(&args.target).await?;
    let kcl_dynamodb = kcl_client(args, &target).await;
    let kcl = read_kcl(&kcl_dynamodb, &args.from).await?;
    if kcl.leases.is_empty() {
        return Err(CliError::NotFound(format!("KCL table {} holds no lease rows", args.from)));
    }
    let by_stream = by_stream(args, &target, &kcl)?;
    // The KCL application must be stopped, then the consumer's own workers too.
    if args.execute && !args.force {
        let alive = kcl_alive(&kcl_dynamodb, &args.from, &kcl, args.watch).await?;
        if !alive.is_empty() {
            return Err(CliError::Refused(format!(
                "refused: the KCL application still holds leases in {} (owners {}): stop it first, or pass --force",
                args.from,
                alive.join(", ")
            )));
        }
    }
    let how = "Stop them before importing: the import only writes while the group is empty.";
    let snapshot = if args.execute {
        read_quiet(&target, target.lease_duration, how).await?
    } else {
        crate::shared::snapshot::read(&target).await?
    };
    let rows: HashMap<LeaseKey, &Lease> = snapshot.leases.iter().map(|l| (l.key.clone(), l)).collect();
    let mut imports = Vec::new();
    let mut unlisted = Vec::new();
    for (stream, leases) in &by_stream {
        let (stream_imports, stream_unlisted) = plan_stream(args, &target, stream, leases, &rows).await?;
        imports.extend(stream_imports);
        unlisted.extend(stream_unlisted);
    }
    let mut report = Report {
        from: args.from.clone(),
        table: target.table.clone(),
        dry_run: !args.execute,
        imports,
        skipped: kcl.skipped,
        unlisted,
        written: Vec::new(),
    };
    if args.execute {
        report.written = write(&target, &report.imports).await?;
    }
    if !structured(format, &report)? {
        print!("{}", render(&report));
    }
    Ok(())
}

/// The client that reads the KCL table: the consumer's, or one at `--from-dynamodb-endpoint`.
async fn kcl_client(args: &ImportArgs, target: &Target) -> aws_sdk_dynamodb::Client {
    match &args.from_dynamodb_endpoint {
        Some(endpoint) => {
            let mut aws = target.aws.clone();
            aws.dynamodb_endpoint = Some(endpoint.clone());
            dynamodb_client(&sdk_config(&aws).await, &aws)
        }
        None => target.dynamodb.clone(),
    }
}

/// The KCL leases by the stream each is about (a single-stream application's rows name none: the
/// stream is `--kcl-stream`'s or the consumer's only one); refused when a stream is not the consumer's.
fn by_stream<'a>(args: &ImportArgs, target: &Target, kcl: &'a KclTable) -> Result<BTreeMap<String, Vec<&'a KclLease>>> {
    let single_stream = match (&args.kcl_stream, target.streams.as_slice()) {
        (Some(stream), _) => Some(stream.clone()),
        (None, [only]) => Some(only.clone()),
        _ => None,
    };
    let mut by_stream: BTreeMap<String, Vec<&KclLease>> = BTreeMap::new();
    for lease in &kcl.leases {
        let stream = match (&lease.stream, &single_stream) {
            (Some(stream), _) => stream.clone(),
            (None, Some(stream)) => stream.clone(),
            (None, None) => {
                return Err(CliError::Usage(format!(
                    "KCL table {} is a single-stream application's: say which stream it read with --kcl-stream",
                    args.from
                )));
            }
        };
        by_stream.entry(stream).or_default().push(lease);
    }
    if !target.streams.is_empty()
        && let Some(other) = by_stream.keys().find(|s| !target.streams.contains(s))
    {
        return Err(CliError::NotFound(format!(
            "KCL table {} is about stream {other}, which {} does not read (it reads {})",
            args.from,
            target.name(),
            target.streams.join(", ")
        )));
    }
    Ok(by_stream)
}

/// Plans the imports of one stream's KCL leases, parents first, and the keys of those of shards no
/// longer listed: refused when the table is about an earlier stream of that name or another stream.
async fn plan_stream(
    args: &ImportArgs,
    target: &Target,
    stream: &str,
    leases: &[&KclLease],
    rows: &HashMap<LeaseKey, &Lease>,
) -> Result<(Vec<Import>, Vec<String>)> {
    let listing: Vec<Shard> = shards::list(&target.kinesis, stream).await?;
    let epochs: Vec<i64> = leases.iter().filter_map(|l| l.creation_epoch).collect();
    if let Some(epoch) = epochs.first()
        && let Some(created) = created_epoch(&target.kinesis, stream).await?
        && created != *epoch
    {
        return Err(CliError::NotFound(format!(
            "KCL table {} is about an earlier stream named {stream} (created at epoch {epoch}; the stream now was created at {created})",
            args.from
        )));
    }
    let listed: HashMap<&str, &Shard> = listing.iter().map(|s| (s.id.as_str(), s)).collect();
    if leases.iter().all(|l| !listed.contains_key(l.shard.as_str())) {
        return Err(CliError::NotFound(format!(
            "KCL table {} is not about stream {stream}: none of its shards ({}) is a shard of {stream}",
            args.from,
            leases.iter().map(|l| l.shard.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    let order: HashMap<&str, usize> =
        shards::parents_first(&listing).iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    let mut leases: Vec<&&KclLease> = leases.iter().collect();
    leases.sort_by_key(|l| order.get(l.shard.as_str()).copied().unwrap_or(usize::MAX));
    let (mut imports, mut unlisted) = (Vec::new(), Vec::new());
    for lease in leases {
        let Some(shard) = listed.get(lease.shard.as_str()) else {
            unlisted.push(lease.lease_key.clone());
            continue;
        };
        let (checkpoint, note) = translate(target, stream, lease, args.force).await?;
        let key = LeaseKey::new(stream, lease.shard.as_str());
        let seen = rows.get(&key).map(|l| (*l).clone());
        let parents = if lease.parents.is_empty() { shard.parents.clone() } else { lease.parents.clone() };
        imports.push(Import {
            kcl_key: lease.lease_key.clone(),
            stream: stream.to_string(),
            shard: lease.shard.clone(),
            kcl_checkpoint: if lease.sub_sequence > 0 {
                format!("{}/{}", lease.checkpoint, lease.sub_sequence)
            } else {
                lease.checkpoint.clone()
            },
            before: seen.as_ref().map(|l| text(&l.checkpoint)),
            after: text(&checkpoint),
            note,
            seen,
            checkpoint,
            parents,
        });
    }
    Ok((imports, unlisted))
}

/// The report as a table for people, with what was skipped and what was (or would be) written.
fn render(report: &Report) -> String {
    let rows: Vec<Vec<String>> = report
        .imports
        .iter()
        .map(|i| {
            vec![
                i.kcl_key.clone(),
                i.stream.clone(),
                i.shard.clone(),
                i.kcl_checkpoint.clone(),
                "->".into(),
                i.after.clone(),
                i.before.clone().unwrap_or_else(|| "(no row)".into()),
                i.note.clone(),
            ]
        })
        .collect();
    let mut out = columns(&["KCL LEASE", "STREAM", "SHARD", "KCL CHECKPOINT", "", "AFTER", "WAS", "NOTE"], &rows);
    if !report.skipped.is_empty() {
        out.push_str(&format!(
            "skipped {} KCL row(s) that are not leases: {}\n",
            report.skipped.len(),
            report.skipped.join(", ")
        ));
    }
    if !report.unlisted.is_empty() {
        out.push_str(&format!(
            "skipped {} KCL lease(s) of shards no longer listed: {}\n",
            report.unlisted.len(),
            report.unlisted.join(", ")
        ));
    }
    if report.dry_run {
        out.push_str(&format!(
            "dry run: {} checkpoint(s) would be imported; nothing written. Add --execute to apply.\n",
            report.imports.len()
        ));
    } else {
        out.push_str(&format!("{} checkpoint(s) imported.\n", report.written.len()));
    }
    out
}

/// Writes the imports, parents first, each conditioned on the row as read.
async fn write(target: &Target, imports: &[Import]) -> Result<Vec<String>> {
    let rows: Vec<RowWrite> = imports
        .iter()
        .map(|import| RowWrite {
            key: LeaseKey::new(import.stream.as_str(), import.shard.as_str()),
            seen: import.seen.clone(),
            checkpoint: import.checkpoint.clone(),
            parents: import.parents.clone(),
        })
        .collect();
    write_rows(&target.store("leasehold-cli"), &rows, "").await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pairs: &[(&str, AttributeValue)]) -> HashMap<String, AttributeValue> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn rows_are_read_as_the_kcl_serializers_write_them() {
        let single = item(&[
            ("leaseKey", AttributeValue::S("shardId-000000000001".into())),
            ("leaseOwner", AttributeValue::S("worker-1".into())),
            ("leaseCounter", AttributeValue::N("42".into())),
            ("ownerSwitchesSinceCheckpoint", AttributeValue::N("0".into())),
            ("checkpoint", AttributeValue::S("4959".into())),
            ("checkpointSubSequenceNumber", AttributeValue::N("3".into())),
            ("pendingCheckpoint", AttributeValue::S("4960".into())),
            ("pendingCheckpointSubSequenceNumber", AttributeValue::N("0".into())),
            ("parentShardId", AttributeValue::Ss(vec!["shardId-000000000000".into()])),
            ("entityType", AttributeValue::S("LEASE".into())),
        ]);
        let lease = parse_row(&single).expect("valid").expect("a lease");
        assert_eq!((lease.stream, lease.shard.as_str(), lease.counter), (None, "shardId-000000000001", 42));
        assert_eq!(
            (lease.checkpoint.as_str(), lease.sub_sequence, lease.pending.as_deref()),
            ("4959", 3, Some("4960"))
        );
        assert_eq!(lease.parents, vec!["shardId-000000000000".to_string()]);

        let multi = item(&[
            ("leaseKey", AttributeValue::S("123456789012:orders:1700000000:shardId-000000000002".into())),
            ("leaseCounter", AttributeValue::N("1".into())),
            ("checkpoint", AttributeValue::S("SHARD_END".into())),
            ("streamName", AttributeValue::S("123456789012:orders:1700000000".into())),
            ("shardId", AttributeValue::S("shardId-000000000002".into())),
        ]);
        let lease = parse_row(&multi).expect("valid").expect("a lease");
        assert_eq!((lease.stream.as_deref(), lease.creation_epoch), (Some("orders"), Some(1_700_000_000)));
        assert_eq!(lease.shard, "shardId-000000000002");

        // A KCL 3.1.3 row as the real MultiLangDaemon wrote it (tests/ground/kcl-import.py, on moto),
        // caught in a graceful handoff.
        let v3 = item(&[
            ("leaseKey", AttributeValue::S("shardId-000000000000".into())),
            ("leaseOwner", AttributeValue::S("worker-2".into())),
            ("checkpointOwner", AttributeValue::S("worker-1".into())),
            ("leaseCounter", AttributeValue::N("7".into())),
            ("ownerSwitchesSinceCheckpoint", AttributeValue::N("0".into())),
            ("checkpoint", AttributeValue::S("49680795670138427747013735913843604773898527250088722434".into())),
            ("checkpointSubSequenceNumber", AttributeValue::N("1".into())),
            ("startingHashKey", AttributeValue::S("0".into())),
            ("endingHashKey", AttributeValue::S("170141183460469231731687303715884105727".into())),
            ("throughputKBps", AttributeValue::N("12.5".into())),
        ]);
        let lease = parse_row(&v3).expect("valid").expect("a lease");
        assert_eq!((lease.owner.as_deref(), lease.checkpoint_owner.as_deref()), (Some("worker-2"), Some("worker-1")));
        assert_eq!((lease.sub_sequence, lease.counter), (1, 7));

        let other = item(&[
            ("leaseKey", AttributeValue::S("worker-1".into())),
            ("entityType", AttributeValue::S("WORKER_METRICS".into())),
        ]);
        assert_eq!(parse_row(&other), Ok(None));
        let broken = item(&[("leaseKey", AttributeValue::S("shardId-000000000003".into()))]);
        assert_eq!(parse_row(&broken).map_err(|(_, reason)| reason), Err("checkpoint is missing".to_string()));
    }
}
