//! The `multilang` processor: one child process per shard speaking the Java KCL MultiLangDaemon
//! protocol (JSON lines on stdin/stdout), so existing KCL record processors (amazon_kclpy, aws-kcl for
//! Node) run unchanged, without a JVM.
//!
//! [`MultilangProcessor`] is the factory; each shard's processor owns a session task that owns the
//! shard's child. The child is started, and sent `initialize` with the lease's checkpoint, as soon as
//! the worker holds the shard's lease (as the KCL does), in that task, so a slow child never delays
//! taking other leases. Dropping the shard's processor (an abandoned reader) ends the task and the
//! child with it, so no child outlives its lease.
//!
//! Messages sent: `initialize`, `processRecords`, `shutdownRequested` (graceful revoke, and a shard
//! given up because it cannot be read), `leaseLost`,
//! `shardEnded`. A `processRecords` message carries every record of the shard that is waiting when the
//! child is free: one at a time with `ordering: shard` (or `concurrency: 1`), up to `concurrency`
//! records with `ordering: key` or `none` (distinct keys with `key`), in the order they were handed
//! over. Batches matter for cost: each message costs the child a JSON parse and an answer, and the Java
//! daemon sends a whole GetRecords batch per message. The child answers each message with
//! `{"action":"status","responseFor":...}` and may send `checkpoint` requests in between, with a
//! `sequenceNumber` and, inside a KPL aggregate, a `subSequenceNumber`. Each is checked as the KCL's
//! checkpointer checks it (a number, not before the child's previous checkpoint, not past the last
//! record sent to it) and answered as the KCL's MultiLangDaemon answers it:
//! `{"action":"checkpoint","sequenceNumber":...,"subSequenceNumber":...,"error":null}`, or with
//! `"error":"IllegalArgumentException"` when refused. The worker itself checkpoints every record the
//! child has answered for (inside an aggregate, at its sub-sequence), so a child that never
//! checkpoints loses nothing either. A child that
//! exits or does not answer within the timeout is killed; the records of that message are retried in a
//! fresh child (initialized again), so nothing is lost.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};

use super::{Outputs, ProcessError, ProcessorFactory, Record, ShardProcessor, ShardStart};
use crate::lease::{Checkpoint, LeaseKey};

/// One shard's child process.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// What the child has been sent and has checkpointed.
    positions: Positions,
}

/// Where a child stands: what it may checkpoint.
#[derive(Debug, Default)]
pub(crate) struct Positions {
    /// The last record sent to the child, (sequence, sub-sequence): the furthest it may checkpoint.
    pub(crate) delivered: Option<(String, u64)>,
    /// The child's last accepted checkpoint: it may not go back before it.
    pub(crate) checkpointed: Option<(String, u64)>,
}

/// What one line the child wrote means to the worker waiting for its status for a message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// The status awaited: the message is answered.
    Answered,
    /// A checkpoint request, with the answer to write back.
    Checkpoint(Value),
    /// Anything else (another status, an unknown action, a line that is not JSON): skipped.
    Ignored,
}

/// Makes each shard's processor: a MultiLangDaemon-protocol child per shard.
pub struct MultilangProcessor {
    shared: Arc<Shared>,
}

/// One shard's processor: the handle of its session task.
struct MultilangShard {
    commands: mpsc::UnboundedSender<Command>,
}

/// What every shard's session task needs.
struct Shared {
    command: Vec<String>,
    timeout: Duration,
    checkpoint_requests: AtomicU64,
    restarts: AtomicU64,
}

/// A request to a shard's session task.
enum Command {
    /// Start the child and send `initialize` with this `sequenceNumber` and `subSequenceNumber`.
    Initialize((Value, Value)),
    /// Process a record; the answer goes back when its message has been answered.
    Process(Record, oneshot::Sender<Result<(), ProcessError>>),
    /// Send the closing action (`shutdownRequested`, `leaseLost`, `shardEnded`), end the child, stop.
    Finish(&'static str, oneshot::Sender<()>),
}

/// Most records in one `processRecords` message (the Java daemon's default GetRecords limit).
const MAX_RECORDS_PER_MESSAGE: usize = 10_000;

impl std::fmt::Debug for MultilangProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultilangProcessor").field("command", &self.shared.command).finish()
    }
}

fn failed(message: impl Into<String>) -> ProcessError {
    ProcessError::retryable(message)
}

impl Session {
    async fn start(
        shared: &Shared,
        key: &LeaseKey,
        (sequence, sub_sequence): &(Value, Value),
    ) -> Result<Self, ProcessError> {
        let (program, args) =
            shared.command.split_first().ok_or_else(|| ProcessError::permanent("multilang command is empty"))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot start {program}: {e}")))?;
        let stdin = child.stdin.take().ok_or_else(|| failed("child has no stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| failed("child has no stdout"))?;
        let mut session =
            Session { child, stdin, stdout: BufReader::new(stdout).lines(), positions: Positions::default() };
        let initialize = json!({"action": "initialize", "shardId": key.shard_id(), "sequenceNumber": sequence,
            "subSequenceNumber": sub_sequence});
        session.exchange(&initialize, "initialize", shared).await?;
        Ok(session)
    }

    /// Writes `message` to the child as one line.
    async fn send(&mut self, message: &Value) -> Result<(), ProcessError> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.map_err(|e| failed(format!("child stdin: {e}")))?;
        self.stdin.flush().await.map_err(|e| failed(format!("child stdin: {e}")))
    }

    /// Sends `message` and reads until the child's status for `response_for`, acknowledging
    /// checkpoint requests (counted in `shared`) on the way; bounded by `shared.timeout`.
    async fn exchange(&mut self, message: &Value, response_for: &str, shared: &Shared) -> Result<(), ProcessError> {
        let timeout = shared.timeout;
        self.send(message).await?;
        let answered = tokio::time::timeout(timeout, async {
            loop {
                let Some(line) = self.stdout.next_line().await.map_err(|e| failed(format!("child stdout: {e}")))?
                else {
                    return Err(failed("child exited"));
                };
                match self.positions.read(&line, response_for) {
                    Reply::Answered => return Ok(()),
                    Reply::Checkpoint(ack) => {
                        shared.checkpoint_requests.fetch_add(1, Ordering::Relaxed);
                        self.send(&ack).await?;
                    }
                    Reply::Ignored => {}
                }
            }
        })
        .await;
        answered.unwrap_or_else(|_| Err(failed(format!("child did not answer {response_for} within {timeout:?}"))))
    }

    /// Closes stdin and waits briefly for the child to exit, then kills it.
    async fn close(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

impl Positions {
    /// Reads one line the child wrote while the worker waits for its status for `response_for`,
    /// checking a checkpoint request as the KCL's checkpointer does.
    pub(crate) fn read(&mut self, line: &str, response_for: &str) -> Reply {
        let Ok(reply) = serde_json::from_str::<Value>(line) else {
            tracing::warn!(line, "multilang child wrote a line that is not a protocol message; ignored");
            return Reply::Ignored;
        };
        match reply.get("action").and_then(Value::as_str) {
            Some("status") if reply.get("responseFor").and_then(Value::as_str) == Some(response_for) => Reply::Answered,
            Some("checkpoint") => {
                let sequence = reply.get("sequenceNumber").cloned().unwrap_or(Value::Null);
                let sub_sequence = reply.get("subSequenceNumber").cloned().unwrap_or(Value::Null);
                let error = self.accept_checkpoint(&sequence, &sub_sequence);
                match error {
                    None => tracing::info!(%sequence, %sub_sequence, "multilang child checkpoint acknowledged"),
                    Some(error) => {
                        tracing::warn!(%sequence, %sub_sequence, error, "multilang child checkpoint refused")
                    }
                }
                Reply::Checkpoint(json!({"action": "checkpoint", "sequenceNumber": sequence,
                    "subSequenceNumber": sub_sequence, "error": error}))
            }
            other => {
                tracing::debug!(?other, "multilang message ignored");
                Reply::Ignored
            }
        }
    }

    /// Checks a checkpoint the child asks for as the KCL's checkpointer does; the name of the exception
    /// the KCL would answer with when refused. With no sequence number it means "everything sent".
    fn accept_checkpoint(&mut self, sequence: &Value, sub_sequence: &Value) -> Option<&'static str> {
        const REFUSED: Option<&str> = Some("IllegalArgumentException");
        let position = match (sequence, sub_sequence) {
            // Nothing sent yet: nothing to checkpoint, and no error (`?` answers `None`).
            (Value::Null, _) => self.delivered.clone()?,
            (Value::String(sequence), sub) => {
                let sub = match sub {
                    Value::Null => 0,
                    other => match other.as_u64() {
                        Some(sub) => sub,
                        None => return REFUSED,
                    },
                };
                if sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()) {
                    return REFUSED;
                }
                (sequence.clone(), sub)
            }
            _ => return REFUSED,
        };
        let key = position_key;
        let past_delivered = self.delivered.as_ref().is_none_or(|d| key(&position) > key(d));
        let before_previous = self.checkpointed.as_ref().is_some_and(|c| key(&position) < key(c));
        if past_delivered || before_previous {
            return REFUSED;
        }
        self.checkpointed = Some(position);
        None
    }
}

impl MultilangProcessor {
    /// Runs `command` per shard; a child that does not answer within `timeout` is restarted.
    pub fn new(command: Vec<String>, timeout: Duration) -> Self {
        let shared = Shared { command, timeout, checkpoint_requests: AtomicU64::new(0), restarts: AtomicU64::new(0) };
        Self { shared: Arc::new(shared) }
    }

    /// Checkpoint requests the children have made.
    pub fn checkpoint_requests(&self) -> u64 {
        self.shared.checkpoint_requests.load(Ordering::Relaxed)
    }

    /// Children killed and started again (crashed or stalled).
    pub fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }
}

impl ProcessorFactory for MultilangProcessor {
    fn create(&self, shard: &LeaseKey) -> Arc<dyn ShardProcessor> {
        // Unbounded is safe: every queued record has a caller waiting for it, and the dispatcher bounds
        // how many records are in flight.
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run_session(self.shared.clone(), shard.clone(), receiver));
        Arc::new(MultilangShard { commands })
    }
}

/// The `sequenceNumber` and `subSequenceNumber` of `initialize`: the checkpoint, as the KCL's extended
/// sequence numbers spell it.
fn initial_sequence(checkpoint: &Checkpoint) -> (Value, Value) {
    let sequence = match checkpoint {
        Checkpoint::Sequence(sequence) | Checkpoint::SubSequence { sequence, .. } => Value::from(sequence.as_str()),
        Checkpoint::TrimHorizon => Value::from("TRIM_HORIZON"),
        Checkpoint::Latest => Value::from("LATEST"),
        Checkpoint::AtTimestamp(_) => Value::from("AT_TIMESTAMP"),
        Checkpoint::ShardEnd => Value::from("SHARD_END"),
    };
    (sequence, checkpoint.sub_sequence().map_or(Value::Null, Value::from))
}

impl MultilangShard {
    /// Sends a closing action to the shard's child and waits until it has ended.
    async fn finish(&self, action: &'static str) {
        let (done, finished) = oneshot::channel();
        if self.commands.send(Command::Finish(action, done)).is_ok() {
            // An error only means the task had already ended, and its child with it.
            let _ = finished.await;
        }
    }
}

/// One shard's session: owns the child, sends waiting records together, restarts a failed child.
async fn run_session(shared: Arc<Shared>, key: LeaseKey, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut child = None;
    let mut sequence = (Value::Null, Value::Null);
    let mut finish = None;
    while finish.is_none() {
        let Some(command) = commands.recv().await else { break };
        let mut batch = match command {
            Command::Initialize(at) => {
                sequence = at;
                match Session::start(&shared, &key, &sequence).await {
                    Ok(started) => child = Some(started),
                    Err(e) => {
                        tracing::warn!(shard = %key, error = %e, "multilang child did not start; retried with the first record")
                    }
                }
                continue;
            }
            Command::Process(record, answer) => vec![(record, answer)],
            Command::Finish(action, done) => {
                finish = Some((action, done));
                break;
            }
        };
        while batch.len() < MAX_RECORDS_PER_MESSAGE {
            match commands.try_recv() {
                Ok(Command::Process(record, answer)) => batch.push((record, answer)),
                Ok(Command::Initialize(_)) => {}
                Ok(Command::Finish(action, done)) => {
                    finish = Some((action, done));
                    break;
                }
                Err(_) => break,
            }
        }
        // A caller that stopped waiting (its lease was lost, the worker stops) no longer wants its record.
        batch.retain(|(_, answer)| !answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        let records: Vec<&Record> = batch.iter().map(|(record, _)| record).collect();
        let result = process_records(&shared, &key, &sequence, &mut child, &records).await;
        if let Err(e) = &result {
            // A crashed or stalled child is replaced; the records are retried in the new one.
            tracing::warn!(shard = %key, error = %e, "multilang child failed; restarting it");
            shared.restarts.fetch_add(1, Ordering::Relaxed);
            if let Some(broken) = child.take() {
                broken.close().await;
            }
        }
        for (_, answer) in batch {
            let _ = answer.send(result.clone());
        }
    }
    if let Some(mut running) = child {
        if let Some((action, _)) = &finish {
            let message = json!({"action": action});
            if let Err(e) = running.exchange(&message, action, &shared).await {
                tracing::warn!(shard = %key, action, error = %e, "multilang child did not finish cleanly");
            }
        }
        running.close().await;
    }
    if let Some((_, done)) = finish {
        let _ = done.send(());
    }
}

/// Orders (sequence, sub-sequence) positions: sequence numbers are decimal strings of any length.
fn position_key((sequence, sub): &(String, u64)) -> (usize, &str, u64) {
    let digits = sequence.trim_start_matches('0');
    (digits.len(), digits, *sub)
}

/// One record of a `processRecords` message, as the KCL's `JsonFriendlyRecord` spells it.
fn record_json(record: &Record) -> Value {
    json!({
        "action": "record",
        "data": base64::engine::general_purpose::STANDARD.encode(&record.data),
        "partitionKey": record.partition_key,
        "sequenceNumber": record.sequence_number,
        // The KCL gives plain records sub-sequence 0 too.
        "subSequenceNumber": record.sub_sequence_number.unwrap_or(0),
        "approximateArrivalTimestamp": record.arrival_ms.unwrap_or(0),
    })
}

/// Sends `records` in one `processRecords` message, starting the child first if it is not running.
async fn process_records(
    shared: &Shared,
    key: &LeaseKey,
    sequence: &(Value, Value),
    child: &mut Option<Session>,
    records: &[&Record],
) -> Result<(), ProcessError> {
    let running = match child {
        Some(running) => running,
        None => child.insert(Session::start(shared, key, sequence).await?),
    };
    for record in records {
        let position = (record.sequence_number.clone(), u64::from(record.sub_sequence_number.unwrap_or(0)));
        if running.positions.delivered.as_ref().is_none_or(|d| position_key(&position) > position_key(d)) {
            running.positions.delivered = Some(position);
        }
    }
    let records: Vec<Value> = records.iter().map(|record| record_json(record)).collect();
    let message = json!({"action": "processRecords", "millisBehindLatest": 0, "records": records});
    running.exchange(&message, "processRecords", shared).await
}

#[async_trait]
impl ShardProcessor for MultilangShard {
    async fn initialize(&self, start: &ShardStart) {
        // An error only means the task has ended; the first record reports it.
        let _ = self.commands.send(Command::Initialize(initial_sequence(&start.checkpoint)));
    }

    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let (answer, answered) = oneshot::channel();
        self.commands
            .send(Command::Process(record.clone(), answer))
            .map_err(|_| failed("the multilang session has stopped"))?;
        answered.await.map_err(|_| failed("the multilang session ended before answering"))?
    }

    async fn shard_ended(&self) {
        self.finish("shardEnded").await;
    }

    async fn shutdown_requested(&self) {
        self.finish("shutdownRequested").await;
    }

    async fn shard_failed(&self, _reason: &str) {
        // The KCL protocol has no failure action. The done prefix is still checkpointed, which is what
        // `shutdownRequested` promises (the child may checkpoint); `leaseLost` would forbid it and
        // `shardEnded` would claim the shard was read to its end.
        self.finish("shutdownRequested").await;
    }

    async fn lease_lost(&self) {
        self.finish("leaseLost").await;
    }
}
