//! `leasehold replay`: reprocess a window of the past beside the live consumer, which it never
//! touches. A dry run (the default) lists the shards and estimates how many records the window holds;
//! `--execute` creates a window consumer (`spec.window`, docs/operations.md "Replay") from the live
//! one's spec under a new name, follows its progress until `Completed`, and deletes it (the operator's
//! finalizer then deletes its lease table), unless `--keep`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::ShardIteratorType;
use clap::Args;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use leasehold_crds::{
    DeletionPolicy, END_NOW, StreamConsumer, StreamConsumerSpec, WindowSpec, WindowStatus, format_time_ms,
    parse_time_ms, window_table_name,
};
use leasehold_worker::aws::kinesis::{self, StreamRef};
use serde::Serialize;

use crate::shared::error::{CliError, Result};
use crate::shared::output::{Format, columns, structured};
use crate::shared::shards;
use crate::shared::snapshot::now_ms;
use crate::shared::target::{Target, TargetArgs, kube_client, resolve};

/// Arguments of `replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The live consumer whose spec (processor, settings, streams) the window consumer copies.
    #[command(flatten)]
    pub target: TargetArgs,
    /// First arrival time replayed, inclusive: RFC 3339 in UTC (2026-12-03T14:00:00Z) or a duration
    /// ago (2h).
    #[arg(long = "from", value_name = "TIME")]
    pub start: String,
    /// Last arrival time replayed, inclusive: RFC 3339 in UTC, a duration ago, or `now` (the window
    /// consumer's creation time, pinned by the operator).
    #[arg(long = "to", value_name = "TIME", default_value = END_NOW)]
    pub end: String,
    /// Name of the window consumer (default `<consumer>-replay-<from, as yyyymmdd-hhmmss>`).
    #[arg(long)]
    pub name: Option<String>,
    /// Create the window consumer and follow it to the end. Without it, a dry run: the shards and an
    /// estimate of the window's records.
    #[arg(long)]
    pub execute: bool,
    /// Keep the window consumer and its lease table once `Completed` (default: delete both).
    #[arg(long)]
    pub keep: bool,
    /// Create the window consumer and return without following it.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to follow the window before giving up (the window consumer is left running).
    #[arg(long, default_value = "24h", value_parser = crate::parse_duration)]
    pub timeout: Duration,
    /// GetRecords pages (up to 10,000 records each) the dry run reads per shard for its estimate;
    /// beyond them the count is extrapolated by arrival time.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub estimate_pages: u32,
}

/// Longest name a window consumer gets: its Deployment (`<name>-workers`) and the labels carrying the
/// name must stay within Kubernetes' 63 characters.
const MAX_NAME: usize = 55;

/// Records per GetRecords page of the estimate (the service's maximum).
const ESTIMATE_PAGE: i32 = 10_000;

/// How often the progress is read while following a window.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// What `replay` did (or would do).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The live consumer, `namespace/name`.
    pub consumer: String,
    /// The window consumer, `namespace/name`.
    pub replay: String,
    /// Its lease table (named by the operator).
    pub table: String,
    /// First arrival time replayed (RFC 3339).
    pub from: String,
    /// Last arrival time replayed (RFC 3339, or `now`).
    pub to: String,
    /// Whether the window consumer was created.
    pub executed: bool,
    /// The estimate, shard by shard.
    pub shards: Vec<ShardEstimate>,
    /// Records the window holds, summed over the shards' estimates.
    pub records: u64,
    /// True when every shard's count is exact (read to the window's end).
    pub records_exact: bool,
    /// Whether the window consumer reported `Completed`.
    pub completed: bool,
    /// Records replayed, as the window consumer's status counts them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records_replayed: Option<i64>,
    /// Whether the window consumer (and its table) were kept.
    pub kept: bool,
    /// Whether the window consumer was deleted at the end.
    pub deleted: bool,
    /// Notes on what was changed from the live consumer's spec, and warnings.
    pub notes: Vec<String>,
    /// Seconds spent following the window.
    pub waited_seconds: f64,
}

/// One shard's share of the window, estimated.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShardEstimate {
    /// Its stream.
    pub stream: String,
    /// Its id.
    pub shard_id: String,
    /// Kinesis records inside the window (a KPL aggregate counts once).
    pub records: u64,
    /// True when read to the window's end (or the shard's); false when extrapolated.
    pub exact: bool,
    /// Records read for the estimate.
    pub read: u64,
}

/// A time argument as epoch milliseconds: RFC 3339, or a duration before `now_ms`.
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64> {
    if let Some(ms) = parse_time_ms(text) {
        return Ok(ms);
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(now_ms.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX))),
        Err(_) => Err(CliError::Usage(format!(
            "{text:?} is neither an RFC 3339 time in UTC (2026-12-03T14:00:00Z) nor a duration ago (2h)"
        ))),
    }
}

/// The window consumer's default name: `<consumer>-replay-<start as yyyymmdd-hhmmss>`, the
/// consumer's part shortened so the whole fits [`MAX_NAME`].
pub fn default_name(consumer: &str, start_ms: i64) -> String {
    let stamp: String = format_time_ms(start_ms).chars().filter(char::is_ascii_digit).take(14).collect();
    let suffix = format!("-replay-{}-{}", &stamp[..stamp.len().min(8)], &stamp[stamp.len().min(8)..]);
    let mut base: String = consumer.chars().take(MAX_NAME.saturating_sub(suffix.len())).collect();
    while base.ends_with('-') {
        base.pop();
    }
    base + &suffix
}

/// A window consumer's name is a DNS label short enough for its Deployment's labels.
fn check_name(name: &str) -> Result<()> {
    let label = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if label {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "--name {name:?}: a window consumer's name is lowercase letters, digits and '-', at most {MAX_NAME} characters"
        )))
    }
}

/// The window consumer's spec, from the live consumer's: its streams, processor and settings, with the
/// window in place of a start position and a lease table of its own. Also the notes on what changed.
pub fn window_spec(live: &StreamConsumerSpec, window: WindowSpec) -> Result<(StreamConsumerSpec, Vec<String>)> {
    if live.window.is_some() {
        return Err(CliError::Refused("the consumer is itself a window consumer: replay its live consumer".into()));
    }
    if live.stream_pattern.is_some() {
        return Err(CliError::Refused(
            "the consumer reads a streamPattern; a window reads named streams: write the window consumer by hand \
             (docs/operations.md, \"Replay\")"
                .into(),
        ));
    }
    let mut notes = Vec::new();
    let mut spec = live.clone();
    spec.lease_table = None;
    spec.start_position = None;
    spec.start_timestamp = None;
    spec.paused = None;
    if spec.assignment.take().is_some() {
        notes.push("assignment left out: a window reads every shard of its streams".into());
    }
    if spec.reader.mode.take().is_some_and(|m| m == leasehold_crds::ReaderMode::FanOut) {
        notes.push("reader.mode fanOut left out: a window is read by polling".into());
    }
    if spec.retry.as_ref().is_some_and(|r| {
        r.dead_letter_stream.is_some() || r.dead_letter_queue.is_some() || r.dead_letter_bucket.is_some()
    }) {
        notes.push(
            "the window's dead letters go to the live consumer's destinations, naming the window's table: \
             redrive them with --table <window table> while it is kept (--keep)"
                .into(),
        );
    }
    spec.window = Some(window);
    spec.validate().map_err(|errors| {
        let listed: Vec<String> = errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect();
        CliError::Refused(format!("the window consumer's spec would be refused: {}", listed.join("; ")))
    })?;
    Ok((spec, notes))
}

/// The window's records on one shard: read from `AT_TIMESTAMP start`, at most `pages` pages, counting
/// records that arrived by `end`; exact when the read reached a record after `end`, the shard's end
/// or its tip, else extrapolated by arrival time up to `min(end, now)`.
async fn estimate_shard(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    shard: &str,
    (start_ms, end_ms, now): (i64, i64, i64),
    pages: u32,
) -> Result<ShardEstimate> {
    let service = |e: String| CliError::Service(format!("reading {stream}/{shard} for the estimate: {e}"));
    let mut iterator = client
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::AtTimestamp)
        .timestamp(DateTime::from_millis(start_ms))
        .send()
        .await
        .map_err(|e| service(aws_sdk_kinesis::error::DisplayErrorContext(e).to_string()))?
        .shard_iterator;
    let (mut records, mut read, mut last_arrival) = (0u64, 0u64, None::<i64>);
    for _ in 0..pages {
        let Some(current) = iterator.take() else {
            return Ok(ShardEstimate { stream: stream.into(), shard_id: shard.into(), records, exact: true, read });
        };
        let page = client
            .get_records()
            .shard_iterator(current)
            .limit(ESTIMATE_PAGE)
            .send()
            .await
            .map_err(|e| service(aws_sdk_kinesis::error::DisplayErrorContext(e).to_string()))?;
        for record in page.records() {
            read += 1;
            let arrival = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(start_ms);
            if arrival > end_ms {
                return Ok(ShardEstimate { stream: stream.into(), shard_id: shard.into(), records, exact: true, read });
            }
            if arrival >= start_ms {
                records += 1;
                last_arrival = Some(arrival);
            }
        }
        let at_tip = page.records().is_empty() && page.millis_behind_latest().unwrap_or(0) == 0;
        iterator = page.next_shard_iterator;
        if at_tip {
            return Ok(ShardEstimate { stream: stream.into(), shard_id: shard.into(), records, exact: true, read });
        }
    }
    if iterator.is_none() {
        return Ok(ShardEstimate { stream: stream.into(), shard_id: shard.into(), records, exact: true, read });
    }
    Ok(ShardEstimate {
        stream: stream.into(),
        shard_id: shard.into(),
        records: extrapolate(records, start_ms, last_arrival, end_ms.min(now)),
        exact: false,
        read,
    })
}

/// `counted` records arrived from `start_ms` to `last_ms`: as many again per as much time, to `until_ms`.
pub fn extrapolate(counted: u64, start_ms: i64, last_ms: Option<i64>, until_ms: i64) -> u64 {
    let Some(last) = last_ms else { return counted };
    let seen = (last - start_ms).max(1) as f64;
    let span = (until_ms - start_ms).max(0) as f64;
    if span <= seen {
        return counted;
    }
    (counted as f64 * span / seen).round() as u64
}

/// Every shard of the consumer's streams with its estimate.
async fn estimate(target: &Target, (start_ms, end_ms, now): (i64, i64, i64), pages: u32) -> Result<Vec<ShardEstimate>> {
    let mut estimates = Vec::new();
    for stream in &target.streams {
        for shard in shards::list(&target.kinesis, stream).await? {
            estimates.push(estimate_shard(&target.kinesis, stream, &shard.id, (start_ms, end_ms, now), pages).await?);
        }
    }
    Ok(estimates)
}

/// A warning when the window starts before the oldest record a stream still keeps.
async fn retention_notes(target: &Target, start_ms: i64, now: i64) -> Vec<String> {
    let mut notes = Vec::new();
    for stream in &target.streams {
        if let Ok(summary) = kinesis::describe_stream(&target.kinesis, StreamRef::named(stream)).await {
            let kept_ms = i64::from(summary.retention_period_hours()) * 3_600_000;
            if start_ms < now - kept_ms {
                notes.push(format!(
                    "{stream} keeps {} h of records: the window's start is older, so its first records are gone",
                    summary.retention_period_hours()
                ));
            }
        }
    }
    notes
}

/// Runs `replay`.
pub async fn run(args: &ReplayArgs, format: Format) -> Result<()> {
    let target = resolve(&args.target).await?;
    let (ns, live_name) = crate::shared::target::needs_resource(&target, "replay")?;
    let live_spec = target.spec.clone().ok_or_else(|| CliError::NotFound(format!("{ns}/{live_name} has no spec")))?;
    let now = now_ms();
    let start_ms = parse_time(&args.start, now)?;
    let end_ms = if args.end == END_NOW { now } else { parse_time(&args.end, now)? };
    if end_ms <= start_ms {
        return Err(CliError::Usage(format!(
            "--to ({}) must be later than --from ({})",
            format_time_ms(end_ms),
            format_time_ms(start_ms)
        )));
    }
    if start_ms > now {
        return Err(CliError::Usage(format!("--from ({}) is in the future", format_time_ms(start_ms))));
    }
    let name = args.name.clone().unwrap_or_else(|| default_name(&live_name, start_ms));
    check_name(&name)?;
    let end = if args.end == END_NOW { END_NOW.to_string() } else { format_time_ms(end_ms) };
    let window = WindowSpec {
        start: format_time_ms(start_ms),
        end: end.clone(),
        deletion_policy: Some(if args.keep { DeletionPolicy::Retain } else { DeletionPolicy::Delete }),
        tip_slack: None,
    };
    let (spec, mut notes) = window_spec(&live_spec, window)?;
    notes.extend(retention_notes(&target, start_ms, now).await);
    let shards = estimate(&target, (start_ms, end_ms, now), args.estimate_pages).await?;
    let mut outcome = Outcome {
        consumer: format!("{ns}/{live_name}"),
        replay: format!("{ns}/{name}"),
        table: window_table_name(&ns, &name),
        from: format_time_ms(start_ms),
        to: end,
        executed: false,
        records: shards.iter().map(|s| s.records).sum(),
        records_exact: shards.iter().all(|s| s.exact),
        shards,
        completed: false,
        records_replayed: None,
        kept: args.keep,
        deleted: false,
        notes,
        waited_seconds: 0.0,
    };
    if args.execute {
        let api: Api<StreamConsumer> = Api::namespaced(kube_client().await?, &ns);
        create(&api, &live_name, &name, spec).await?;
        outcome.executed = true;
        eprintln!("{ns}/{name}: window consumer created ({} .. {}), table {}", outcome.from, outcome.to, outcome.table);
        let note =
            format!("leasehold replay created the window consumer {name} for {} .. {}", outcome.from, outcome.to);
        crate::shared::target::post_event(&target, "ReplayStarted", "Replay", note).await;
        if !args.no_wait {
            follow(&api, &name, args, &mut outcome).await?;
            let note = format!(
                "the window {} .. {} was replayed by {name}: {} record(s)",
                outcome.from,
                outcome.to,
                outcome.records_replayed.unwrap_or(0)
            );
            crate::shared::target::post_event(&target, "Replayed", "Replay", note).await;
        }
    }
    print(&outcome, format)
}

/// Creates the window consumer `name`, labelled with the consumer it replays; a taken name is refused.
async fn create(api: &Api<StreamConsumer>, live: &str, name: &str, spec: StreamConsumerSpec) -> Result<()> {
    let consumer = StreamConsumer {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some([("leasehold.io/replay-of".to_string(), live.to_string())].into()),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    };
    match api.create(&PostParams::default(), &consumer).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(CliError::Refused(format!(
            "a StreamConsumer named {name} exists already: choose another --name (or delete it)"
        ))),
        Err(kube::Error::Api(status)) if status.code == 422 => {
            Err(CliError::Refused(format!("the API server refused the window consumer: {}", status.message)))
        }
        Err(e) => Err(e.into()),
    }
}

/// Follows the window consumer until `Completed`, printing its progress, then deletes it (unless
/// `--keep`) and waits until it is gone.
async fn follow(api: &Api<StreamConsumer>, name: &str, args: &ReplayArgs, outcome: &mut Outcome) -> Result<()> {
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last = String::new();
    loop {
        let consumer = api.get_opt(name).await?;
        let status = consumer.as_ref().and_then(|c| c.status.clone());
        let window = status.as_ref().and_then(|s| s.window.clone());
        let completed = status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Completed"))
            .is_some_and(|c| c.status == "True");
        outcome.records_replayed = window.as_ref().and_then(|w| w.records_replayed);
        if completed {
            outcome.completed = true;
            break;
        }
        let line = progress_line(window.as_ref());
        if tty {
            eprint!("\r\x1b[2K{line} ({}s)", started.elapsed().as_secs());
        } else if line != last {
            eprintln!("{line}");
        }
        last = line;
        if consumer.is_none() {
            return Err(CliError::NotFound(format!("the window consumer {name} was deleted before it completed")));
        }
        if started.elapsed() > args.timeout {
            if tty {
                eprintln!();
            }
            return Err(CliError::Timeout(format!(
                "{} not completed after {} ({last}); it is left running: follow it with kubectl get streamconsumer {name}",
                outcome.replay,
                humantime::format_duration(args.timeout)
            )));
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
    if tty {
        eprintln!();
    }
    eprintln!("{}: completed, {} record(s) replayed", outcome.replay, outcome.records_replayed.unwrap_or(0));
    if !args.keep {
        api.delete(name, &DeleteParams::default()).await?;
        // The operator's finalizer stops the workers and deletes the window's table first.
        while api.get_opt(name).await?.is_some() {
            if started.elapsed() > args.timeout {
                return Err(CliError::Timeout(format!(
                    "{} completed and was deleted, but is still there after {}: is the operator running?",
                    outcome.replay,
                    humantime::format_duration(args.timeout)
                )));
            }
            tokio::time::sleep(FOLLOW_EVERY).await;
        }
        outcome.deleted = true;
        eprintln!("{}: deleted, with its lease table {}", outcome.replay, outcome.table);
    }
    outcome.waited_seconds = started.elapsed().as_secs_f64();
    Ok(())
}

/// One line of progress from the window's status.
fn progress_line(window: Option<&WindowStatus>) -> String {
    match window {
        Some(w) => format!(
            "{}/{} shard(s) finished, {} record(s) replayed",
            w.finished_shards,
            w.shards,
            w.records_replayed.unwrap_or(0)
        ),
        None => "waiting for the operator to start the window".to_string(),
    }
}

/// Prints the outcome for people or scripts.
fn print(outcome: &Outcome, format: Format) -> Result<()> {
    if structured(format, outcome)? {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = outcome
        .shards
        .iter()
        .map(|s| {
            let records = if s.exact { s.records.to_string() } else { format!("~{}", s.records) };
            vec![s.stream.clone(), s.shard_id.clone(), records]
        })
        .collect();
    print!("{}", columns(&["STREAM", "SHARD", "RECORDS"], &rows));
    let about = if outcome.records_exact { "" } else { "about " };
    println!(
        "window {} .. {}: {about}{} record(s) on {} shard(s); window consumer {}, table {}",
        outcome.from,
        outcome.to,
        outcome.records,
        outcome.shards.len(),
        outcome.replay,
        outcome.table
    );
    for note in &outcome.notes {
        println!("note: {note}");
    }
    if !outcome.executed {
        println!("dry run: nothing created (--execute to replay)");
    } else if outcome.completed {
        let end = if outcome.deleted { "deleted with its table" } else { "kept (--keep)" };
        println!("completed: {} record(s) replayed; {end}", outcome.records_replayed.unwrap_or(0));
    } else {
        println!("created; not followed (--no-wait)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(extra: &str) -> StreamConsumerSpec {
        serde_yaml_ng::from_str(&format!(
            "streams: [{{name: orders}}]\nleaseTable: {{name: orders-leases}}\nprocessor: {{stdout: {{}}}}\n{extra}"
        ))
        .expect("spec")
    }

    fn window() -> WindowSpec {
        WindowSpec {
            start: "2026-12-03T14:00:00.000Z".into(),
            end: "2026-12-03T15:00:00.000Z".into(),
            deletion_policy: Some(DeletionPolicy::Delete),
            tip_slack: None,
        }
    }

    #[test]
    fn times_are_rfc3339_or_a_duration_ago() {
        let now = parse_time_ms("2026-12-03T16:00:00Z").expect("now");
        assert_eq!(parse_time("2026-12-03T14:00:00Z", now).expect("rfc"), now - 2 * 3_600_000);
        assert_eq!(parse_time("2h", now).expect("ago"), now - 2 * 3_600_000);
        assert!(matches!(parse_time("yesterday", now), Err(CliError::Usage(_))));
    }

    #[test]
    fn the_default_name_fits_a_label_and_names_the_start() {
        let start = parse_time_ms("2026-12-03T14:05:09Z").expect("start");
        assert_eq!(default_name("orders", start), "orders-replay-20261203-140509");
        let long = default_name(&"a".repeat(80), start);
        assert!(long.len() <= MAX_NAME && long.ends_with("-replay-20261203-140509"), "{long}");
        check_name(&long).expect("a valid name");
        assert!(check_name("Orders").is_err());
        assert!(check_name(&"a".repeat(MAX_NAME + 1)).is_err());
    }

    #[test]
    fn the_window_copies_the_live_spec_without_its_table_start_or_pause() {
        let live = live("startPosition: TRIM_HORIZON\npaused: true\nconcurrency: 4\nordering: shard\n");
        let (spec, notes) = window_spec(&live, window()).expect("window spec");
        assert_eq!(spec.lease_table, None);
        assert_eq!(spec.start_position, None);
        assert_eq!(spec.paused, None);
        assert_eq!(spec.concurrency, Some(4));
        assert_eq!(spec.processor, live.processor);
        assert_eq!(spec.ordering, live.ordering);
        assert_eq!(spec.window, Some(window()));
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn fan_out_and_assignment_are_left_out_with_a_note() {
        let live = live("reader: {mode: fanOut}\nassignment: {shards: [shardId-000000000000]}\n");
        let (spec, notes) = window_spec(&live, window()).expect("window spec");
        assert_eq!(spec.reader.mode, None);
        assert_eq!(spec.assignment, None);
        assert_eq!(notes.len(), 2, "{notes:?}");
    }

    #[test]
    fn a_pattern_or_a_window_consumer_is_refused() {
        let pattern: StreamConsumerSpec =
            serde_yaml_ng::from_str("streamPattern: '^orders'\nprocessor: {stdout: {}}\n").expect("spec");
        assert!(matches!(window_spec(&pattern, window()), Err(CliError::Refused(_))));
        let (windowed, _) = window_spec(&live(""), window()).expect("window spec");
        assert!(matches!(window_spec(&windowed, window()), Err(CliError::Refused(_))));
    }

    #[test]
    fn a_partial_read_is_extrapolated_by_arrival_time() {
        assert_eq!(extrapolate(100, 0, Some(1_000), 4_000), 400);
        assert_eq!(extrapolate(100, 0, Some(4_000), 4_000), 100);
        assert_eq!(extrapolate(0, 0, None, 4_000), 0);
    }
}
