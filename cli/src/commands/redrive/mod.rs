//! `leasehold redrive`: read a consumer's dead letters from its destinations (the dead-letter stream,
//! SQS queue and S3 bucket of `spec.retry`) and put each original record back: onto its source stream
//! under its own partition key (so the live consumer processes it again), or onto `--to`.
//!
//! - **Whose letters**: a letter names its consumer's lease table (`leaseTable`); letters of another
//!   table are refused (counted, left where they are), letters naming none (written before letters
//!   carried it, or by a consumer without a table) only with `--accept-unnamed`.
//! - **Cut letters**: the whole record is read from the letter's `dataObject` (the bucket's copy) and
//!   checked against `dataSha256`; a cut letter without one cannot be redriven (counted, left).
//! - **Once**: letters of one record (its stream, shard, sequence and sub-sequence number) read from
//!   several destinations, or twice from one, are put once; every copy is then marked: an SQS message
//!   deleted, an S3 object tagged `leasehold.io/redriven`, a stream letter recorded in the row
//!   `#term:redrive/<dead-letter stream>/<shard>` of the lease table (`checkpoint`: every letter up to
//!   it is done; `redrive_done`: letters done beyond it), written with a conditional write on its
//!   `lease_counter` after each put. A mark follows its put: a crash between the two leaves that one
//!   letter unmarked, and a re-run puts it again (at most one record per crash is repeated).
//! - **Order**: letters are put one at a time, in the order of their place in the source stream, each
//!   `PutRecord` of a key passing the previous one's sequence number as `SequenceNumberForOrdering`, so
//!   one key's records land in their original order.
//!
//! A dry run (the default) reads and counts only; with an SQS queue it does receive the messages
//! (with a visibility timeout) and makes them visible again at once: SQS has no other way to read.

mod letter;
mod marks;
mod put;
mod s3;
mod sqs;
mod stream;
mod summary;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use clap::{Args, ValueEnum};
use leasehold_worker::aws::{s3_client, sdk_config, sqs_client};
use serde::Serialize;

use crate::shared::error::{CliError, Result};
use crate::shared::output::Format;
use crate::shared::snapshot::now_ms;
use crate::shared::target::{Target, TargetArgs, resolve};
use letter::Pending;
pub use letter::Place;
use marks::StreamMark;
pub use marks::mark_key;
pub use summary::{Outcome, ShardCount, Shown, SourceCounts};

/// The tag a redriven S3 letter gets (its value: when, Unix milliseconds).
pub const REDRIVEN_TAG: &str = "leasehold.io/redriven";

/// Where dead letters are read from.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The dead-letter stream (`retry.deadLetterStream`).
    Stream,
    /// The SQS queue (`retry.deadLetterQueue`).
    Sqs,
    /// The S3 bucket (`retry.deadLetterBucket`).
    S3,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Stream => "stream",
            Source::Sqs => "sqs",
            Source::S3 => "s3",
        }
    }
}

/// Arguments of `redrive`.
#[derive(Args, Debug)]
pub struct RedriveArgs {
    /// The consumer.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Read only these destinations (repeat; default: every one the spec or the flags below name).
    #[arg(long = "from", value_enum)]
    pub from: Vec<Source>,
    /// The dead-letter stream (default: the spec's `retry.deadLetterStream`).
    #[arg(long, value_name = "STREAM")]
    pub dead_letter_stream: Option<String>,
    /// The dead-letter queue URL (default: the spec's `retry.deadLetterQueue`).
    #[arg(long, value_name = "URL")]
    pub queue: Option<String>,
    /// The dead-letter bucket (default: the spec's `retry.deadLetterBucket.name`).
    #[arg(long, value_name = "BUCKET")]
    pub bucket: Option<String>,
    /// The bucket's key prefix (default: the spec's `retry.deadLetterBucket.prefix`).
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// SQS endpoint URL (emulators, VPC endpoints); overrides a StreamConsumer's.
    #[arg(long, env = "LEASEHOLD_SQS_ENDPOINT")]
    pub sqs_endpoint: Option<String>,
    /// S3 endpoint URL (emulators, VPC endpoints); overrides a StreamConsumer's.
    #[arg(long, env = "LEASEHOLD_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Only letters written within this long before now (`2h`, `1d`).
    #[arg(long, value_parser = crate::parse_duration)]
    pub since: Option<Duration>,
    /// Only letters of records from this source shard (repeat).
    #[arg(long = "shard", value_name = "SHARD_ID")]
    pub shards: Vec<String>,
    /// Redrive at most this many records.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Put the records on this stream instead of each one's source stream.
    #[arg(long, value_name = "STREAM")]
    pub to: Option<String>,
    /// Put the records back (without it: a dry run that changes nothing).
    #[arg(long)]
    pub execute: bool,
    /// Also take letters that name no lease table (written before letters carried `leaseTable`).
    #[arg(long)]
    pub accept_unnamed: bool,
    /// How long received SQS messages stay hidden from others while the run works on them.
    #[arg(long, default_value = "10m", value_parser = crate::parse_duration)]
    pub visibility_timeout: Duration,
    /// How many letters the summary shows.
    #[arg(long, default_value_t = 5)]
    pub show: usize,
    /// Crash (abort the process) right after this many puts, before marking the last one: for tests
    /// of a re-run after a crash.
    #[arg(long, hide = true)]
    pub crash_after_puts: Option<usize>,
}

/// The destinations to read, resolved from the flags and the spec.
struct Sources {
    stream: Option<String>,
    queue: Option<String>,
    bucket: Option<(String, String)>,
}

fn sources(args: &RedriveArgs, target: &Target) -> Result<Sources> {
    let retry = target.spec.as_ref().and_then(|s| s.retry.clone()).unwrap_or_default();
    let wanted = |source: Source| args.from.is_empty() || args.from.contains(&source);
    let stream = args.dead_letter_stream.clone().or(retry.dead_letter_stream).filter(|_| wanted(Source::Stream));
    let queue = args.queue.clone().or(retry.dead_letter_queue).filter(|_| wanted(Source::Sqs));
    let bucket = match (&args.bucket, retry.dead_letter_bucket) {
        (Some(name), spec) => {
            Some((name.clone(), args.prefix.clone().or(spec.and_then(|b| b.prefix)).unwrap_or_default()))
        }
        (None, Some(spec)) => Some((spec.name, args.prefix.clone().or(spec.prefix).unwrap_or_default())),
        (None, None) => None,
    }
    .filter(|_| wanted(Source::S3));
    for source in &args.from {
        let named = match source {
            Source::Stream => stream.is_some(),
            Source::Sqs => queue.is_some(),
            Source::S3 => bucket.is_some(),
        };
        if !named {
            return Err(CliError::Usage(format!(
                "--from {} but {} names no such destination (give --dead-letter-stream, --queue or --bucket)",
                source.name(),
                target.name()
            )));
        }
    }
    if stream.is_none() && queue.is_none() && bucket.is_none() {
        return Err(CliError::Usage(format!(
            "{} names no dead-letter destination (give --dead-letter-stream, --queue or --bucket)",
            target.name()
        )));
    }
    Ok(Sources { stream, queue, bucket })
}

/// The run's state: clients, filters, what was read.
struct Run<'a> {
    args: &'a RedriveArgs,
    target: &'a Target,
    sqs: aws_sdk_sqs::Client,
    s3: aws_sdk_s3::Client,
    counts: BTreeMap<Source, SourceCounts>,
    chosen: HashMap<Place, Pending>,
    shard_counts: BTreeMap<(String, Source), usize>,
    since_ms: Option<i64>,
    /// Receipts of the SQS messages deleted after their put.
    deleted: std::collections::HashSet<String>,
}

impl Run<'_> {
    fn count(&mut self, source: Source) -> &mut SourceCounts {
        self.counts.entry(source).or_default()
    }

    fn full(&self) -> bool {
        self.args.limit.is_some_and(|limit| self.chosen.len() >= limit)
    }
}

impl<'a> Run<'a> {
    /// The run's clients (the SQS and S3 endpoints of the flags over the consumer's), nothing read.
    async fn new(args: &'a RedriveArgs, target: &'a Target) -> Run<'a> {
        let mut aws = target.aws.clone();
        if args.sqs_endpoint.is_some() {
            aws.sqs_endpoint = args.sqs_endpoint.clone();
        }
        if args.s3_endpoint.is_some() {
            aws.s3_endpoint = args.s3_endpoint.clone();
        }
        let sdk = sdk_config(&aws).await;
        Run {
            args,
            target,
            sqs: sqs_client(&sdk, &aws),
            s3: s3_client(&sdk, &aws),
            counts: BTreeMap::new(),
            chosen: HashMap::new(),
            shard_counts: BTreeMap::new(),
            since_ms: args.since.map(|since| now_ms() - i64::try_from(since.as_millis()).unwrap_or(i64::MAX)),
            deleted: std::collections::HashSet::new(),
        }
    }
}

/// Runs `redrive`: read every destination's letters (judging each), put the chosen records back in
/// their stream's order with `--execute` (marking every copy after its put), print.
pub async fn run(args: &RedriveArgs, format: Format) -> Result<()> {
    let target = resolve(&args.target).await?;
    let sources = sources(args, &target)?;
    let mut run = Run::new(args, &target).await;
    let (mut marks, receipts) = read(&mut run, &sources).await?;
    let mut pending: Vec<Pending> = run.chosen.drain().map(|(_, p)| p).collect();
    pending.sort_by(|a, b| a.place.order_key().cmp(&b.place.order_key()));
    let first = pending
        .iter()
        .take(args.show)
        .map(|p| Shown {
            place: p.place.clone(),
            partition_key: p.partition_key.clone(),
            bytes: p.data.len(),
            to: put::destination(args, p),
        })
        .collect();
    let (put, failure) = if args.execute { put::put_in_order(&mut run, &pending, &mut marks).await } else { (0, None) };
    // Messages not deleted become visible again now (a dry run's, and those left out or refused).
    if let Some(queue) = &sources.queue {
        sqs::release(&run.sqs, queue, &receipts, &run.deleted).await?;
    }
    let outcome = Outcome {
        consumer: target.name(),
        executed: args.execute,
        destinations: run.counts.iter().map(|(s, c)| (s.name().to_string(), c.clone())).collect(),
        shards: run
            .shard_counts
            .iter()
            .map(|((shard, source), letters)| ShardCount {
                shard_id: shard.clone(),
                destination: *source,
                letters: *letters,
            })
            .collect(),
        records: pending.len(),
        put,
        first,
    };
    summary::print_outcome(&outcome, format)?;
    if args.execute && put > 0 {
        post_event(&target, &outcome).await;
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Reads the destinations: the bucket first (its objects are whole, and cut letters elsewhere point
/// at them), then the stream, then the queue; the stream's redrive rows and the queue's receipts
/// (with whether each message was chosen).
async fn read(run: &mut Run<'_>, sources: &Sources) -> Result<(BTreeMap<String, StreamMark>, Vec<(String, bool)>)> {
    if let Some((bucket, prefix)) = &sources.bucket {
        s3::read_bucket(run, bucket, prefix).await?;
    }
    let mut marks: BTreeMap<String, StreamMark> = BTreeMap::new();
    if let Some(stream) = &sources.stream {
        stream::read_stream(run, stream, &mut marks).await?;
    }
    let mut receipts = Vec::new();
    if let Some(queue) = &sources.queue {
        receipts = sqs::read_queue(run, queue).await?;
    }
    Ok((marks, receipts))
}

/// Posts a `Redriven` event on the StreamConsumer, when the consumer is one and the cluster answers
/// (a warning on stderr otherwise: the records are put either way).
async fn post_event(target: &Target, outcome: &Outcome) {
    let from: Vec<String> =
        outcome.destinations.iter().filter(|(_, c)| c.marked > 0).map(|(n, c)| format!("{n} {}", c.marked)).collect();
    let note = format!(
        "leasehold redrive put {} dead-lettered record(s) back (letters marked: {})",
        outcome.put,
        from.join(", ")
    );
    crate::shared::target::post_event(target, "Redriven", "Redrive", note).await;
}
