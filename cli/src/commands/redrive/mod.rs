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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::ShardIteratorType;
use base64::Engine;
use bytes::Bytes;
use clap::{Args, ValueEnum};
use leasehold_worker::aws::{s3_client, sdk_config, sqs_client};
use leasehold_worker::internals::lease::term_key;
use leasehold_worker::lease::{LeaseError, LeaseKey, Progress, ProgressRows};
use serde::{Deserialize, Serialize};

use crate::shared::error::{CliError, Result};
use crate::shared::output::{Format, columns, structured};
use crate::shared::snapshot::now_ms;
use crate::shared::target::{Target, TargetArgs, resolve};

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

/// A dead letter as the worker writes it (see `worker/src/dispatch/letter.rs`).
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct LetterJson {
    stream: String,
    shard_id: String,
    sequence_number: String,
    #[serde(default)]
    sub_sequence_number: Option<u32>,
    partition_key: String,
    #[serde(default)]
    explicit_hash_key: Option<String>,
    data: String,
    #[serde(default)]
    truncated: bool,
    #[serde(default)]
    data_sha256: Option<String>,
    #[serde(default)]
    data_object: Option<String>,
    #[serde(default)]
    lease_table: Option<String>,
}

/// A record's place in its source stream: what makes two letters the same record's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Place {
    /// Source stream.
    pub stream: String,
    /// Source shard.
    pub shard_id: String,
    /// Sequence number.
    pub sequence_number: String,
    /// Sub-sequence number (a user record of a KPL aggregate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_sequence_number: Option<u32>,
}

impl Place {
    /// Sorts places as the stream orders them: by stream, shard, then the sequence number as a number.
    fn order_key(&self) -> (&str, &str, usize, &str, u32) {
        let seq = self.sequence_number.trim_start_matches('0');
        (&self.stream, &self.shard_id, seq.len(), seq, self.sub_sequence_number.unwrap_or(0))
    }
}

/// Where one copy of a letter is, and how to mark it.
#[derive(Debug, Clone)]
enum Copy {
    Stream { shard: String, sequence: String },
    Sqs { receipt: String },
    S3 { key: String },
}

/// One record to put back: its fields and the copies of its letter.
#[derive(Debug)]
struct Pending {
    place: Place,
    partition_key: String,
    explicit_hash_key: Option<String>,
    data: Bytes,
    copies: Vec<(Source, Copy)>,
}

/// Counts of one destination.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceCounts {
    /// Letters read.
    pub read: usize,
    /// Already redriven by an earlier run (tagged, or recorded in the redrive row).
    pub already_redriven: usize,
    /// Letters of another consumer (another lease table): left alone.
    pub refused_other_consumer: usize,
    /// Letters naming no lease table (left alone without `--accept-unnamed`).
    pub refused_unnamed: usize,
    /// Cut letters without a readable whole record: cannot be redriven, left alone.
    pub cut_without_record: usize,
    /// Not a dead letter (not its JSON): left alone.
    pub malformed: usize,
    /// Left out by `--shard`, `--since` or `--limit`.
    pub left_out: usize,
    /// Copies of a record already read (from this or another destination).
    pub duplicates: usize,
    /// Letters chosen for redrive.
    pub selected: usize,
    /// Of these, marked redriven (deleted, tagged, recorded) after their put.
    pub marked: usize,
}

/// Letters of one source shard from one destination.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardCount {
    /// Source shard.
    pub shard_id: String,
    /// Destination read.
    pub destination: Source,
    /// Records chosen.
    pub letters: usize,
}

/// A letter shown in the summary.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    /// The record's place.
    #[serde(flatten)]
    pub place: Place,
    /// Its partition key.
    pub partition_key: String,
    /// Payload bytes.
    pub bytes: usize,
    /// The stream it is put on.
    pub to: String,
}

/// What `redrive` did (or would do).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The consumer.
    pub consumer: String,
    /// False for a dry run.
    pub executed: bool,
    /// Counts per destination.
    pub destinations: BTreeMap<String, SourceCounts>,
    /// Records chosen per source shard and destination.
    pub shards: Vec<ShardCount>,
    /// Records chosen (each put once).
    pub records: usize,
    /// Records put back.
    pub put: usize,
    /// The first few records.
    pub first: Vec<Shown>,
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

/// How one letter was judged.
enum Verdict {
    /// Chosen (or a duplicate of a chosen one).
    Take(Pending),
    /// Never this consumer's to redrive (another consumer's, malformed, cut without its record).
    Never,
    /// Left out this time (filters, limit, unnamed): a later run may take it.
    Later,
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

    /// Judges the letter `body` found at `copy` of `source`, written at `written_ms`.
    async fn judge(&mut self, source: Source, copy: Copy, body: &[u8], written_ms: Option<i64>) -> Result<Verdict> {
        self.count(source).read += 1;
        let Ok(letter) = serde_json::from_slice::<LetterJson>(body) else {
            self.count(source).malformed += 1;
            return Ok(Verdict::Never);
        };
        match &letter.lease_table {
            Some(table) if *table != self.target.table => {
                self.count(source).refused_other_consumer += 1;
                return Ok(Verdict::Never);
            }
            None if !self.args.accept_unnamed => {
                self.count(source).refused_unnamed += 1;
                return Ok(Verdict::Later);
            }
            _ => {}
        }
        let place = Place {
            stream: letter.stream.clone(),
            shard_id: letter.shard_id.clone(),
            sequence_number: letter.sequence_number.clone(),
            sub_sequence_number: letter.sub_sequence_number,
        };
        let filtered = (!self.args.shards.is_empty() && !self.args.shards.contains(&place.shard_id))
            || self.since_ms.zip(written_ms).is_some_and(|(since, written)| written < since);
        if filtered {
            self.count(source).left_out += 1;
            return Ok(Verdict::Later);
        }
        if let Some(pending) = self.chosen.get_mut(&place) {
            pending.copies.push((source, copy.clone()));
            self.count(source).duplicates += 1;
            return Ok(Verdict::Take(Pending {
                place,
                partition_key: String::new(),
                explicit_hash_key: None,
                data: Bytes::new(),
                copies: Vec::new(),
            }));
        }
        if self.full() {
            self.count(source).left_out += 1;
            return Ok(Verdict::Later);
        }
        let whole = match self.whole_record(&letter).await? {
            Some(whole) => whole,
            None => {
                self.count(source).cut_without_record += 1;
                return Ok(Verdict::Never);
            }
        };
        self.count(source).selected += 1;
        *self.shard_counts.entry((place.shard_id.clone(), source)).or_default() += 1;
        Ok(Verdict::Take(Pending {
            place,
            partition_key: whole.partition_key,
            explicit_hash_key: whole.explicit_hash_key,
            data: whole.data,
            copies: vec![(source, copy)],
        }))
    }

    /// The record of `letter`: its own fields when whole, else the whole letter its `dataObject` names
    /// (checked against `dataSha256`); `None` when there is no such whole letter.
    async fn whole_record(&self, letter: &LetterJson) -> Result<Option<Record>> {
        if !letter.truncated {
            return Ok(decode_data(&letter.data)
                .map(|data| Record {
                    partition_key: letter.partition_key.clone(),
                    explicit_hash_key: letter.explicit_hash_key.clone(),
                    data,
                })
                .ok());
        }
        let Some((bucket, key)) = letter.data_object.as_deref().and_then(|o| o.strip_prefix("s3://")?.split_once('/'))
        else {
            return Ok(None);
        };
        let object = match self.s3.get_object().bucket(bucket).key(key).send().await {
            Ok(object) => object,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => {
                return Err(CliError::Service(format!(
                    "reading s3://{bucket}/{key}: {}",
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                )));
            }
        };
        let body = object
            .body
            .collect()
            .await
            .map_err(|e| CliError::Service(format!("reading s3://{bucket}/{key}: {e}")))?
            .into_bytes();
        let Ok(whole) = serde_json::from_slice::<LetterJson>(&body) else { return Ok(None) };
        let Ok(data) = decode_data(&whole.data) else { return Ok(None) };
        if whole.truncated || letter.data_sha256.as_deref().is_some_and(|sha| sha != sha256_hex(&data)) {
            return Ok(None);
        }
        Ok(Some(Record { partition_key: whole.partition_key, explicit_hash_key: whole.explicit_hash_key, data }))
    }
}

/// The fields a redriven record is put with.
struct Record {
    partition_key: String,
    explicit_hash_key: Option<String>,
    data: Bytes,
}

/// Hex of the SHA-256 of `bytes`, as letters give `dataSha256`.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn decode_data(text: &str) -> std::result::Result<Bytes, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(text).map(Bytes::from)
}

/// The redrive row of one shard of the dead-letter stream, as read and as it is kept up to date.
#[derive(Debug)]
struct StreamMark {
    key: String,
    /// `lease_counter` as last read or written; `None` while the row does not exist.
    counter: Option<u64>,
    /// Every letter up to this dead-letter sequence number is done (`None`: from the shard's start).
    checkpoint: Option<String>,
    /// Letters done beyond the checkpoint.
    done: BTreeSet<String>,
    /// The letters read this run beyond the checkpoint, in order: (sequence number, settled), settled
    /// being true once the letter needs nothing more (done, or never this consumer's).
    read: Vec<(String, bool)>,
}

impl StreamMark {
    /// The row after `sequence` was done: the checkpoint moved over every settled letter, the rest of
    /// the done ones kept in the set.
    fn settle(&mut self, sequence: &str) {
        if let Some(entry) = self.read.iter_mut().find(|(s, _)| s == sequence) {
            entry.1 = true;
        }
        self.done.insert(sequence.to_string());
        let settled = self.read.iter().take_while(|(_, settled)| *settled).count();
        if settled > 0 {
            let drained: Vec<String> = self.read.drain(..settled).map(|(s, _)| s).collect();
            for sequence in &drained {
                self.done.remove(sequence);
            }
            self.checkpoint = drained.last().cloned();
        }
    }
}

/// The row key of the redrive row of dead-letter stream `stream`'s shard `shard`.
pub fn mark_key(stream: &str, shard: &str) -> String {
    redrive_key(stream, shard).to_string()
}

fn redrive_key(stream: &str, shard: &str) -> LeaseKey {
    term_key(&format!("redrive/{stream}/{shard}"))
}

async fn read_mark(target: &Target, stream: &str, shard: &str) -> Result<StreamMark> {
    let key = redrive_key(stream, shard);
    let progress = target.store("leasehold-cli").read_progress(&key).await.map_err(|e| match e {
        LeaseError::Malformed { reason, .. } => {
            CliError::Malformed(format!("redrive row {key} of {}: {reason}", target.table))
        }
        e => CliError::Service(format!("reading {key}: {e}")),
    })?;
    let Progress { counter, checkpoint, done } = progress;
    Ok(StreamMark { key: key.to_string(), counter, checkpoint, done, read: Vec::new() })
}

/// Writes `mark`, conditional on the counter it was read or last written with.
async fn write_mark(target: &Target, mark: &mut StreamMark) -> Result<()> {
    // The key was made by `mark_key`: `#term:` and a name, so it parses back.
    let key = LeaseKey::parse(&mark.key)
        .ok_or_else(|| CliError::Malformed(format!("redrive row key {} is no lease key", mark.key)))?;
    let progress = Progress { counter: mark.counter, checkpoint: mark.checkpoint.clone(), done: mark.done.clone() };
    match target.store("leasehold-cli").write_progress(&key, &progress).await {
        Ok(next) => {
            mark.counter = Some(next);
            Ok(())
        }
        Err(LeaseError::ConditionFailed { .. }) => Err(CliError::Conflict(format!(
            "redrive row {} changed under this run (another redrive at work?): stopped; records put so far \
             stay put, a re-run skips what was marked",
            mark.key
        ))),
        Err(e) => Err(CliError::Service(format!("writing {}: {e}", mark.key))),
    }
}

/// Runs `redrive`.
pub async fn run(args: &RedriveArgs, format: Format) -> Result<()> {
    let target = resolve(&args.target).await?;
    let sources = sources(args, &target)?;
    let mut aws = target.aws.clone();
    if args.sqs_endpoint.is_some() {
        aws.sqs_endpoint = args.sqs_endpoint.clone();
    }
    if args.s3_endpoint.is_some() {
        aws.s3_endpoint = args.s3_endpoint.clone();
    }
    let sdk = sdk_config(&aws).await;
    let mut run = Run {
        args,
        target: &target,
        sqs: sqs_client(&sdk, &aws),
        s3: s3_client(&sdk, &aws),
        counts: BTreeMap::new(),
        chosen: HashMap::new(),
        shard_counts: BTreeMap::new(),
        since_ms: args.since.map(|since| now_ms() - i64::try_from(since.as_millis()).unwrap_or(i64::MAX)),
        deleted: std::collections::HashSet::new(),
    };
    // The bucket first: its objects are whole, and cut letters elsewhere point at them.
    if let Some((bucket, prefix)) = &sources.bucket {
        read_bucket(&mut run, bucket, prefix).await?;
    }
    let mut marks: BTreeMap<String, StreamMark> = BTreeMap::new();
    if let Some(stream) = &sources.stream {
        read_stream(&mut run, stream, &mut marks).await?;
    }
    let mut receipts = Vec::new();
    if let Some(queue) = &sources.queue {
        receipts = read_queue(&mut run, queue).await?;
    }
    let mut pending: Vec<Pending> = run.chosen.drain().map(|(_, p)| p).collect();
    pending.sort_by(|a, b| a.place.order_key().cmp(&b.place.order_key()));
    let destination = |p: &Pending| args.to.clone().unwrap_or_else(|| p.place.stream.clone());
    let first = pending
        .iter()
        .take(args.show)
        .map(|p| Shown {
            place: p.place.clone(),
            partition_key: p.partition_key.clone(),
            bytes: p.data.len(),
            to: destination(p),
        })
        .collect();
    let mut put = 0usize;
    let mut failure = None;
    if args.execute {
        let mut last_sequence: HashMap<(String, String), String> = HashMap::new();
        for record in &pending {
            let to = destination(record);
            let ordering = last_sequence.get(&(to.clone(), record.partition_key.clone())).cloned();
            let sent = target
                .kinesis
                .put_record()
                .stream_name(&to)
                .partition_key(&record.partition_key)
                .set_explicit_hash_key(record.explicit_hash_key.clone())
                .set_sequence_number_for_ordering(ordering)
                .data(Blob::new(record.data.to_vec()))
                .send()
                .await;
            let sequence = match sent {
                Ok(out) => out.sequence_number,
                Err(e) => {
                    failure = Some(CliError::Service(format!(
                        "putting {}/{}/{} on {to}: {}; stopped, {put} record(s) were put and marked",
                        record.place.stream,
                        record.place.shard_id,
                        record.place.sequence_number,
                        aws_sdk_kinesis::error::DisplayErrorContext(&e)
                    )));
                    break;
                }
            };
            put += 1;
            if args.crash_after_puts.is_some_and(|n| put >= n) {
                eprintln!("crashing after {put} put(s), as --crash-after-puts asks");
                std::process::abort();
            }
            last_sequence.insert((to, record.partition_key.clone()), sequence);
            if let Err(e) = mark(&mut run, record, &mut marks).await {
                failure = Some(e);
                break;
            }
        }
    }
    // Messages not deleted become visible again now (a dry run's, and those left out or refused).
    if let Some(queue) = &sources.queue {
        release(&run.sqs, queue, &receipts, &run.deleted).await?;
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
    print_outcome(&outcome, format)?;
    if args.execute && put > 0 {
        post_event(&target, &outcome).await;
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
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

/// Marks every copy of `record` redriven after its put.
async fn mark(run: &mut Run<'_>, record: &Pending, marks: &mut BTreeMap<String, StreamMark>) -> Result<()> {
    for (source, copy) in &record.copies {
        match copy {
            Copy::Sqs { receipt } => {
                let queue = run.args.queue.clone().or_else(|| {
                    run.target.spec.as_ref().and_then(|s| s.retry.as_ref()).and_then(|r| r.dead_letter_queue.clone())
                });
                let queue = queue.unwrap_or_default();
                run.sqs.delete_message().queue_url(&queue).receipt_handle(receipt).send().await.map_err(|e| {
                    CliError::Service(format!(
                        "deleting a redriven message from {queue}: {}",
                        aws_sdk_sqs::error::DisplayErrorContext(&e)
                    ))
                })?;
                run.deleted.insert(receipt.clone());
            }
            Copy::S3 { key } => {
                let bucket = bucket_name(run);
                tag_redriven(&run.s3, &bucket, key).await?;
            }
            Copy::Stream { shard, sequence } => {
                if let Some(mark) = marks.get_mut(shard) {
                    mark.settle(sequence);
                    write_mark(run.target, mark).await?;
                }
            }
        }
        run.count(*source).marked += 1;
    }
    Ok(())
}

fn bucket_name(run: &Run<'_>) -> String {
    run.args
        .bucket
        .clone()
        .or_else(|| {
            run.target
                .spec
                .as_ref()
                .and_then(|s| s.retry.as_ref())
                .and_then(|r| r.dead_letter_bucket.as_ref())
                .map(|b| b.name.clone())
        })
        .unwrap_or_default()
}

/// Adds the redriven tag to `key`, keeping its other tags.
async fn tag_redriven(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<()> {
    let failed = |e: String| CliError::Service(format!("tagging s3://{bucket}/{key} redriven: {e}"));
    let tags = s3
        .get_object_tagging()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
    let mut set: Vec<aws_sdk_s3::types::Tag> = tags.tag_set.into_iter().filter(|t| t.key != REDRIVEN_TAG).collect();
    set.push(
        aws_sdk_s3::types::Tag::builder()
            .key(REDRIVEN_TAG)
            .value(now_ms().to_string())
            .build()
            .map_err(|e| failed(e.to_string()))?,
    );
    let tagging =
        aws_sdk_s3::types::Tagging::builder().set_tag_set(Some(set)).build().map_err(|e| failed(e.to_string()))?;
    s3.put_object_tagging()
        .bucket(bucket)
        .key(key)
        .tagging(tagging)
        .send()
        .await
        .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
    Ok(())
}

/// Reads every letter object under `prefix` not tagged redriven.
async fn read_bucket(run: &mut Run<'_>, bucket: &str, prefix: &str) -> Result<()> {
    let failed = |e: String| CliError::Service(format!("reading s3://{bucket}/{prefix}: {e}"));
    let mut pages = run.s3.list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
    let mut keys = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
        for object in page.contents.unwrap_or_default() {
            let written = object.last_modified.and_then(|t| t.to_millis().ok());
            if let Some(key) = object.key {
                keys.push((key, written));
            }
        }
    }
    for (key, written) in keys {
        if run.full() {
            run.count(Source::S3).read += 1;
            run.count(Source::S3).left_out += 1;
            continue;
        }
        let tags = run
            .s3
            .get_object_tagging()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
        if tags.tag_set.iter().any(|t| t.key == REDRIVEN_TAG) {
            run.count(Source::S3).read += 1;
            run.count(Source::S3).already_redriven += 1;
            continue;
        }
        let object = run
            .s3
            .get_object()
            .bucket(bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| failed(aws_sdk_s3::error::DisplayErrorContext(&e).to_string()))?;
        let body = object.body.collect().await.map_err(|e| failed(e.to_string()))?.into_bytes();
        if let Verdict::Take(pending) = run.judge(Source::S3, Copy::S3 { key }, &body, written).await? {
            take(run, pending);
        }
    }
    Ok(())
}

/// Keeps a newly chosen record (a duplicate was already added to its first copy).
fn take(run: &mut Run<'_>, pending: Pending) {
    if !pending.copies.is_empty() {
        run.chosen.insert(pending.place.clone(), pending);
    }
}

/// Reads every shard of the dead-letter stream from its redrive row's checkpoint to the tip.
async fn read_stream(run: &mut Run<'_>, stream: &str, marks: &mut BTreeMap<String, StreamMark>) -> Result<()> {
    let kinesis = run.target.kinesis.clone();
    let failed = |e: String| CliError::Service(format!("reading dead-letter stream {stream}: {e}"));
    let shards = crate::shared::shards::list(&kinesis, stream).await.map_err(|e| match e {
        CliError::NotFound(_) => CliError::NotFound(format!("dead-letter stream {stream} does not exist")),
        other => other,
    })?;
    for shard in shards.into_iter().map(|s| s.id) {
        let mut mark = read_mark(run.target, stream, &shard).await?;
        let iterator = match &mark.checkpoint {
            Some(sequence) => kinesis
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(&shard)
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(sequence),
            None => kinesis
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(&shard)
                .shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let mut iterator = iterator
            .send()
            .await
            .map_err(|e| failed(aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string()))?
            .shard_iterator;
        while let Some(current) = iterator {
            let out = kinesis
                .get_records()
                .shard_iterator(current)
                .send()
                .await
                .map_err(|e| failed(aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string()))?;
            let empty = out.records.is_empty();
            for record in out.records {
                let sequence = record.sequence_number.clone();
                if mark.done.contains(&sequence) {
                    run.count(Source::Stream).read += 1;
                    run.count(Source::Stream).already_redriven += 1;
                    mark.read.push((sequence, true));
                    continue;
                }
                let written = record.approximate_arrival_timestamp.and_then(|t| t.to_millis().ok());
                let copy = Copy::Stream { shard: shard.clone(), sequence: sequence.clone() };
                let settled = match run.judge(Source::Stream, copy, record.data.as_ref(), written).await? {
                    Verdict::Take(pending) => {
                        take(run, pending);
                        false
                    }
                    Verdict::Never => true,
                    Verdict::Later => false,
                };
                mark.read.push((sequence, settled));
            }
            // Caught up: nothing came and nothing is behind.
            if empty && out.millis_behind_latest.unwrap_or(0) == 0 {
                break;
            }
            iterator = out.next_shard_iterator;
            // Kinesis takes 5 GetRecords a second per shard.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        marks.insert(shard, mark);
    }
    Ok(())
}

/// Receives every visible message of `queue` (hidden for the visibility timeout while the run works);
/// the receipts of all, with whether each was chosen.
async fn read_queue(run: &mut Run<'_>, queue: &str) -> Result<Vec<(String, bool)>> {
    let failed = |e: String| CliError::Service(format!("reading dead-letter queue {queue}: {e}"));
    let visibility = i32::try_from(run.args.visibility_timeout.as_secs()).unwrap_or(43_200).clamp(1, 43_200);
    let mut receipts = Vec::new();
    loop {
        if run.full() {
            break;
        }
        let out = run
            .sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .visibility_timeout(visibility)
            .wait_time_seconds(1)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(|e| failed(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()))?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for message in messages {
            let (Some(receipt), Some(body)) = (message.receipt_handle, message.body) else { continue };
            let written = message
                .attributes
                .as_ref()
                .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp))
                .and_then(|t| t.parse::<i64>().ok());
            let copy = Copy::Sqs { receipt: receipt.clone() };
            let chosen = match run.judge(Source::Sqs, copy, body.as_bytes(), written).await? {
                Verdict::Take(pending) => {
                    take(run, pending);
                    true
                }
                Verdict::Never | Verdict::Later => false,
            };
            receipts.push((receipt, chosen));
        }
    }
    Ok(receipts)
}

/// Makes every received message not deleted visible again (all of them after a dry run; after
/// `--execute` those left out, refused, or not reached when the run stopped).
async fn release(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    receipts: &[(String, bool)],
    deleted: &std::collections::HashSet<String>,
) -> Result<()> {
    for (receipt, _) in receipts {
        if deleted.contains(receipt) {
            continue;
        }
        let changed =
            sqs.change_message_visibility().queue_url(queue).receipt_handle(receipt).visibility_timeout(0).send().await;
        if let Err(e) = changed {
            // A deleted message's receipt no longer works: only other failures matter.
            let text = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
            if !text.contains("ReceiptHandleIsInvalid") && !text.contains("MessageNotInflight") {
                return Err(CliError::Service(format!("making a message of {queue} visible again: {text}")));
            }
        }
    }
    Ok(())
}

fn print_outcome(outcome: &Outcome, format: Format) -> Result<()> {
    if structured(format, outcome)? {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = outcome
        .destinations
        .iter()
        .map(|(name, c)| {
            vec![
                name.clone(),
                c.read.to_string(),
                c.selected.to_string(),
                c.duplicates.to_string(),
                c.already_redriven.to_string(),
                (c.refused_other_consumer + c.refused_unnamed).to_string(),
                c.cut_without_record.to_string(),
                c.malformed.to_string(),
                c.left_out.to_string(),
                c.marked.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        columns(
            &[
                "DESTINATION",
                "READ",
                "CHOSEN",
                "DUPLICATE",
                "DONE-BEFORE",
                "REFUSED",
                "CUT",
                "MALFORMED",
                "LEFT-OUT",
                "MARKED"
            ],
            &rows
        )
    );
    if !outcome.shards.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = outcome
            .shards
            .iter()
            .map(|s| vec![s.shard_id.clone(), s.destination.name().to_string(), s.letters.to_string()])
            .collect();
        print!("{}", columns(&["SHARD", "FROM", "RECORDS"], &rows));
    }
    if !outcome.first.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = outcome
            .first
            .iter()
            .map(|s| {
                vec![
                    format!("{}/{}", s.place.stream, s.place.shard_id),
                    s.place.sequence_number.clone(),
                    s.partition_key.clone(),
                    s.bytes.to_string(),
                    s.to.clone(),
                ]
            })
            .collect();
        print!("{}", columns(&["SOURCE", "SEQUENCE", "KEY", "BYTES", "TO"], &rows));
    }
    if outcome.executed {
        println!("\n{}: {} record(s) put back of {}", outcome.consumer, outcome.put, outcome.records);
    } else {
        println!("\n{}: {} record(s) to put back (dry run: --execute puts them)", outcome.consumer, outcome.records);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(sequence: &str) -> Place {
        Place {
            stream: "s".into(),
            shard_id: "shardId-0".into(),
            sequence_number: sequence.into(),
            sub_sequence_number: None,
        }
    }

    #[test]
    fn places_sort_by_sequence_number_as_a_number() {
        let mut places = [place("100"), place("99"), place("1000")];
        places.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        let sequences: Vec<&str> = places.iter().map(|p| p.sequence_number.as_str()).collect();
        assert_eq!(sequences, ["99", "100", "1000"]);
    }

    #[test]
    fn the_checkpoint_moves_only_over_a_settled_prefix() {
        let mut mark = StreamMark {
            key: mark_key("dlq", "shardId-0"),
            counter: None,
            checkpoint: None,
            done: BTreeSet::new(),
            read: vec![("1".into(), true), ("2".into(), false), ("3".into(), false), ("4".into(), false)],
        };
        mark.settle("3");
        assert_eq!(mark.checkpoint.as_deref(), Some("1"), "2 is not done: the checkpoint stops before it");
        assert_eq!(mark.done.iter().collect::<Vec<_>>(), ["3"]);
        mark.settle("2");
        assert_eq!(mark.checkpoint.as_deref(), Some("3"));
        assert!(mark.done.is_empty(), "letters under the checkpoint leave the set");
        assert_eq!(mark.read, [("4".to_string(), false)]);
        assert_eq!(mark.key, "#term:redrive/dlq/shardId-0");
    }
}
