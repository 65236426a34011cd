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
//! Messages sent: `initialize`, `processRecords`, `shutdownRequested` (graceful revoke), `leaseLost`,
//! `shardEnded`. A `processRecords` message carries every record of the shard that is waiting when the
//! child is free: one at a time with `ordering: shard` (or `concurrency: 1`), up to `concurrency`
//! records with `ordering: key` or `none` (distinct keys with `key`), in the order they were handed
//! over. Batches matter for cost: each message costs the child a JSON parse and an answer, and the Java
//! daemon sends a whole GetRecords batch per message. The child answers each message with
//! `{"action":"status","responseFor":...}` and may send `checkpoint` requests in between, which are
//! acknowledged (`{"action":"checkpoint",...,"error":null}`). The worker itself checkpoints every record
//! the child has answered for, so a child that never checkpoints loses nothing either. A child that
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
    /// Start the child and send `initialize` with this `sequenceNumber`.
    Initialize(Value),
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
    async fn start(shared: &Shared, key: &LeaseKey, sequence: &Value) -> Result<Self, ProcessError> {
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
        let mut session = Session { child, stdin, stdout: BufReader::new(stdout).lines() };
        let initialize = json!({"action": "initialize", "shardId": key.shard_id(), "sequenceNumber": sequence, "subSequenceNumber": null});
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
                let Some(line) = self.stdout.next_line().await.map_err(|e| failed(format!("child stdout: {e}")))? else {
                    return Err(failed("child exited"));
                };
                let Ok(reply) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!(line, "multilang child wrote a line that is not a protocol message; ignored");
                    continue;
                };
                match reply.get("action").and_then(Value::as_str) {
                    Some("status") if reply.get("responseFor").and_then(Value::as_str) == Some(response_for) => return Ok(()),
                    Some("checkpoint") => {
                        shared.checkpoint_requests.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(sequence = ?reply.get("sequenceNumber"), "multilang child checkpoint acknowledged");
                        let ack = json!({"action": "checkpoint", "sequenceNumber": reply.get("sequenceNumber"),
                            "subSequenceNumber": reply.get("subSequenceNumber"), "error": null});
                        self.send(&ack).await?;
                    }
                    other => tracing::debug!(?other, "multilang message ignored"),
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

/// The `sequenceNumber` of `initialize`: the checkpoint, as the KCL's extended sequence numbers spell it.
fn initial_sequence(checkpoint: &Checkpoint) -> Value {
    match checkpoint {
        Checkpoint::Sequence(sequence) => Value::from(sequence.as_str()),
        Checkpoint::TrimHorizon => Value::from("TRIM_HORIZON"),
        Checkpoint::Latest => Value::from("LATEST"),
        Checkpoint::AtTimestamp(_) => Value::from("AT_TIMESTAMP"),
        Checkpoint::ShardEnd => Value::from("SHARD_END"),
    }
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
    let mut sequence = Value::Null;
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

/// Sends `records` in one `processRecords` message, starting the child first if it is not running.
async fn process_records(
    shared: &Shared,
    key: &LeaseKey,
    sequence: &Value,
    child: &mut Option<Session>,
    records: &[&Record],
) -> Result<(), ProcessError> {
    let running = match child {
        Some(running) => running,
        None => child.insert(Session::start(shared, key, sequence).await?),
    };
    let records: Vec<Value> = records
        .iter()
        .map(|record| {
            json!({
                "action": "record",
                "data": base64::engine::general_purpose::STANDARD.encode(&record.data),
                "partitionKey": record.partition_key,
                "sequenceNumber": record.sequence_number,
                "subSequenceNumber": 0,
                "approximateArrivalTimestamp": record.arrival_ms.unwrap_or(0),
            })
        })
        .collect();
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

    async fn lease_lost(&self) {
        self.finish("leaseLost").await;
    }
}
