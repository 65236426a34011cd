//! The `multilang` processor: one child process per shard speaking the Java KCL MultiLangDaemon
//! protocol (JSON lines on stdin/stdout), so existing KCL record processors (amazon_kclpy, aws-kcl for
//! Node) run unchanged, without a JVM.
//!
//! The child is started, and sent `initialize`, as soon as the worker holds the shard's lease (as the KCL
//! does), in the background so a slow child never delays taking other leases.
//!
//! Messages sent: `initialize`, `processRecords` (one record per message, since the worker hands
//! records over one by one), `shutdownRequested` (graceful revoke), `leaseLost`, `shardEnded`. The child
//! answers each with `{"action":"status","responseFor":...}` and may send `checkpoint` requests in
//! between, which are acknowledged (`{"action":"checkpoint",...,"error":null}`). The worker itself
//! checkpoints every record the child has answered for, so a child that never checkpoints loses nothing
//! either. A child that exits or does not answer within the timeout is killed; the record is retried in
//! a fresh child (initialized again), so nothing is lost.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{ProcessError, Record, RecordProcessor};
use crate::lease::LeaseKey;

/// One shard's child process.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

/// Runs a MultiLangDaemon-protocol child per shard.
pub struct MultilangProcessor {
    command: Arc<[String]>,
    timeout: Duration,
    sessions: std::sync::Mutex<HashMap<LeaseKey, Arc<tokio::sync::Mutex<Option<Session>>>>>,
    checkpoint_requests: Arc<AtomicU64>,
    restarts: AtomicU64,
}

impl std::fmt::Debug for MultilangProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultilangProcessor").field("command", &self.command).finish()
    }
}

fn failed(message: impl Into<String>) -> ProcessError {
    ProcessError::retryable(message)
}

impl Session {
    async fn start(
        command: &[String],
        key: &LeaseKey,
        timeout: Duration,
        requests: &AtomicU64,
    ) -> Result<Self, ProcessError> {
        let (program, args) =
            command.split_first().ok_or_else(|| ProcessError::permanent("multilang command is empty"))?;
        let mut child = Command::new(program)
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
        let initialize = json!({"action": "initialize", "shardId": key.shard_id(), "sequenceNumber": null, "subSequenceNumber": null});
        session.exchange(&initialize, "initialize", timeout, requests).await?;
        Ok(session)
    }

    /// Sends `message` and reads until the child's status for `response_for`, acknowledging
    /// checkpoint requests on the way; bounded by `timeout`.
    async fn exchange(
        &mut self,
        message: &Value,
        response_for: &str,
        timeout: Duration,
        requests: &AtomicU64,
    ) -> Result<(), ProcessError> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.map_err(|e| failed(format!("child stdin: {e}")))?;
        self.stdin.flush().await.map_err(|e| failed(format!("child stdin: {e}")))?;
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
                        requests.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(sequence = ?reply.get("sequenceNumber"), "multilang child checkpoint acknowledged");
                        let ack = json!({"action": "checkpoint", "sequenceNumber": reply.get("sequenceNumber"),
                            "subSequenceNumber": reply.get("subSequenceNumber"), "error": null});
                        let mut ack = ack.to_string();
                        ack.push('\n');
                        self.stdin.write_all(ack.as_bytes()).await.map_err(|e| failed(format!("child stdin: {e}")))?;
                        self.stdin.flush().await.map_err(|e| failed(format!("child stdin: {e}")))?;
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
        Self {
            command: command.into(),
            timeout,
            sessions: std::sync::Mutex::default(),
            checkpoint_requests: Arc::default(),
            restarts: AtomicU64::new(0),
        }
    }

    /// Checkpoint requests the children have made.
    pub fn checkpoint_requests(&self) -> u64 {
        self.checkpoint_requests.load(Ordering::Relaxed)
    }

    /// Children killed and started again (crashed or stalled).
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    fn slot(&self, key: &LeaseKey) -> Arc<tokio::sync::Mutex<Option<Session>>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.entry(key.clone()).or_default().clone()
    }

    /// Sends a closing message (`shutdownRequested`, `leaseLost`, `shardEnded`) and ends the child.
    async fn finish(&self, key: &LeaseKey, action: &str) {
        let slot = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            sessions.remove(key)
        };
        let Some(slot) = slot else { return };
        let Some(mut session) = slot.lock().await.take() else { return };
        if let Err(e) =
            session.exchange(&json!({"action": action}), action, self.timeout, &self.checkpoint_requests).await
        {
            tracing::warn!(shard = %key, action, error = %e, "multilang child did not finish cleanly");
        }
        session.close().await;
    }
}

#[async_trait]
impl RecordProcessor for MultilangProcessor {
    async fn process(&self, record: &Record) -> Result<(), ProcessError> {
        let key = LeaseKey::new(&*record.stream, &*record.shard_id);
        let slot = self.slot(&key);
        let mut session = slot.lock().await;
        if session.is_none() {
            *session = Some(Session::start(&self.command, &key, self.timeout, &self.checkpoint_requests).await?);
        }
        let message = json!({
            "action": "processRecords",
            "millisBehindLatest": 0,
            "records": [{
                "action": "record",
                "data": base64::engine::general_purpose::STANDARD.encode(&record.data),
                "partitionKey": record.partition_key,
                "sequenceNumber": record.sequence_number,
                "subSequenceNumber": 0,
                "approximateArrivalTimestamp": record.arrival_ms.unwrap_or(0),
            }],
        });
        let result = match session.as_mut() {
            Some(running) => {
                running.exchange(&message, "processRecords", self.timeout, &self.checkpoint_requests).await
            }
            None => Err(failed("no child")),
        };
        if let Err(e) = &result {
            // A crashed or stalled child is replaced; the record is retried in the new one.
            tracing::warn!(shard = %key, error = %e, "multilang child failed; restarting it");
            self.restarts.fetch_add(1, Ordering::Relaxed);
            if let Some(broken) = session.take() {
                broken.close().await;
            }
        }
        result
    }

    async fn shard_assigned(&self, shard: &LeaseKey) {
        let slot = self.slot(shard);
        let (command, timeout, requests, key) =
            (self.command.clone(), self.timeout, self.checkpoint_requests.clone(), shard.clone());
        // A child that is finished before it started is dropped with its slot (kill_on_drop).
        tokio::spawn(async move {
            let mut session = slot.lock().await;
            if session.is_none() {
                match Session::start(&command, &key, timeout, &requests).await {
                    Ok(started) => *session = Some(started),
                    Err(e) => {
                        tracing::warn!(shard = %key, error = %e, "multilang child did not start; retried with the first record")
                    }
                }
            }
        });
    }

    async fn shard_revoked(&self, shard: &LeaseKey) {
        self.finish(shard, "shutdownRequested").await;
    }

    async fn shard_lost(&self, shard: &LeaseKey) {
        self.finish(shard, "leaseLost").await;
    }

    async fn shard_ended(&self, shard: &LeaseKey) {
        self.finish(shard, "shardEnded").await;
    }
}
