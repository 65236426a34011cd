//! Worker processes for end-to-end tests: spawn the real binary with a config file, collect what it
//! prints (records on stdout, JSON logs on stderr) with the time each line arrived, and signal it.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;

use crate::holds::{LeaseEvent, LeaseEventKind};

/// One record a worker printed with the stdout processor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Stream read.
    pub stream: String,
    /// Shard read.
    pub shard_id: String,
    /// Sequence number.
    pub sequence_number: String,
    /// Partition key.
    pub partition_key: String,
    /// Payload as text.
    pub data: String,
    /// The worker that processed it.
    pub owner: String,
    /// When the test saw the line.
    pub seen_at: Instant,
}

type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

/// The handoff secret every worker a test starts gets (`--handoff-secret-file`), so the groups tests
/// start sign their notices and take each other's.
pub const TEST_HANDOFF_SECRET: &str = "leasehold-test-handoff-secret-0123456789";

/// The file holding [`TEST_HANDOFF_SECRET`], written once (by rename, so no worker reads it half written).
pub fn test_handoff_secret_file() -> PathBuf {
    let dir = std::env::temp_dir().join("leasehold-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("handoff-secret");
    if std::fs::read(&path).ok().as_deref() != Some(TEST_HANDOFF_SECRET.as_bytes()) {
        let partial = dir.join(format!("handoff-secret.{}", crate::unique_name("part")));
        std::fs::write(&partial, TEST_HANDOFF_SECRET).expect("write the handoff secret");
        std::fs::rename(&partial, &path).expect("place the handoff secret");
    }
    path
}

/// A running `leasehold-worker` process; killed when dropped.
pub struct WorkerProcess {
    /// Its owner id (passed with `--owner-id`).
    pub owner: String,
    child: Child,
    stdout: Lines,
    stderr: Lines,
    /// Bytes the process wrote on stderr, kept or not.
    stderr_bytes: Arc<AtomicU64>,
    /// Set by each collector once its stream reached its end (the process closed it).
    closed: [Arc<AtomicBool>; 2],
    _config: PathBuf,
}

/// Collects `reader`'s lines as they arrive, keeping the first `cap` bytes of lines (each cut to
/// 64 KiB) and counting every byte; the flag is set once it reached its end.
fn collect(reader: impl std::io::Read + Send + 'static, cap: u64) -> (Lines, Arc<AtomicU64>, Arc<AtomicBool>) {
    let lines: Lines = Arc::default();
    let closed = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let (sink, done, counted) = (lines.clone(), closed.clone(), bytes.clone());
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut line = Vec::new();
        loop {
            line.clear();
            // At most 64 KiB of one line is held; the rest of it is counted and dropped.
            let read = match (&mut reader).take(64 * 1024).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut total = read as u64;
            if line.last() != Some(&b'\n') {
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    match (&mut reader).take(64 * 1024).read_until(b'\n', &mut rest) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n as u64,
                    }
                    if rest.last() == Some(&b'\n') {
                        break;
                    }
                }
            }
            let before = counted.fetch_add(total, Ordering::SeqCst);
            if before + total <= cap {
                let text = String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r']).to_string();
                sink.lock().expect("lines").push((Instant::now(), text));
            }
        }
        done.store(true, Ordering::SeqCst);
    });
    (lines, bytes, closed)
}

impl WorkerProcess {
    /// Starts `binary --config <file with config_yaml> --owner-id <owner>`, with test AWS credentials,
    /// endpoints on free local ports and the test handoff secret ([`TEST_HANDOFF_SECRET`]).
    pub fn spawn(binary: &Path, config_yaml: &str, owner: &str) -> Self {
        Self::spawn_capped(binary, config_yaml, owner, u64::MAX)
    }

    /// [`spawn`](Self::spawn), keeping at most `stderr_cap` bytes of its log (all of it is counted,
    /// see [`stderr_bytes`](Self::stderr_bytes)): for tests whose failure could be a flood of log.
    pub fn spawn_capped(binary: &Path, config_yaml: &str, owner: &str, stderr_cap: u64) -> Self {
        let dir = std::env::temp_dir().join("leasehold-tests");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config = dir.join(format!("{}.yaml", crate::unique_name(owner)));
        std::fs::write(&config, config_yaml).expect("write config");
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(&config)
            .arg("--owner-id")
            .arg(owner)
            // Any free port: several workers run side by side on one machine.
            .arg("--metrics-addr")
            .arg("127.0.0.1:0")
            .arg("--handoff-addr")
            .arg("127.0.0.1:0")
            .arg("--handoff-secret-file")
            .arg(test_handoff_secret_file())
            .env("AWS_ACCESS_KEY_ID", "leasehold-test")
            .env("AWS_SECRET_ACCESS_KEY", "leasehold-test")
            .env("AWS_REGION", "us-east-1")
            .env("RUST_LOG", std::env::var("LEASEHOLD_TEST_WORKER_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        let (stdout, _, stdout_closed) = collect(child.stdout.take().expect("stdout"), u64::MAX);
        let (stderr, stderr_bytes, stderr_closed) = collect(child.stderr.take().expect("stderr"), stderr_cap);
        Self {
            owner: owner.to_string(),
            child,
            stdout,
            stderr,
            stderr_bytes,
            closed: [stdout_closed, stderr_closed],
            _config: config,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`TERM`, `KILL`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.pid().to_string()).status().expect("kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                // Everything it printed is collected before the caller reads it (on a busy machine the
                // collectors may lag behind the exit); a child of its own holding the pipes open is
                // waited for a second at most.
                let drained = Instant::now() + Duration::from_secs(1);
                while !self.closed.iter().all(|c| c.load(Ordering::SeqCst)) && Instant::now() < drained {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Every record printed so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let lines = self.stdout.lock().expect("lines").clone();
        lines
            .into_iter()
            .filter_map(|(seen_at, line)| {
                let value: serde_json::Value = serde_json::from_str(&line).ok()?;
                let text = |name: &str| value.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                let data = base64::engine::general_purpose::STANDARD.decode(text("data")).ok()?;
                Some(Delivery {
                    stream: text("stream"),
                    shard_id: text("shardId"),
                    sequence_number: text("sequenceNumber"),
                    partition_key: text("partitionKey"),
                    data: String::from_utf8_lossy(&data).into_owned(),
                    owner: text("owner"),
                    seen_at,
                })
            })
            .collect()
    }

    /// Every line the worker has printed on stdout, in order (for processors other than stdout's).
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().expect("lines").iter().map(|(_, line)| line.clone()).collect()
    }

    /// How many lines the worker has printed on stdout (records, with the stdout processor).
    pub fn delivery_count(&self) -> usize {
        self.stdout.lock().expect("lines").len()
    }

    /// When the first and the last stdout line arrived.
    pub fn delivery_span(&self) -> Option<(Instant, Instant)> {
        let lines = self.stdout.lock().expect("lines");
        Some((lines.first()?.0, lines.last()?.0))
    }

    /// Every JSON log line on stderr so far, with when it arrived.
    pub fn logs(&self) -> Vec<(Instant, serde_json::Value)> {
        let lines = self.stderr.lock().expect("lines").clone();
        lines.into_iter().filter_map(|(at, line)| serde_json::from_str(&line).ok().map(|v| (at, v))).collect()
    }

    /// Where the worker serves /metrics, /healthz and /readyz, once it has logged it.
    pub fn metrics_addr(&self) -> Option<String> {
        self.logs().into_iter().find_map(|(_, v)| {
            let serving = v.get("message").and_then(|m| m.as_str()) == Some("serving /metrics, /healthz and /readyz");
            serving.then(|| v.get("address").and_then(|a| a.as_str()).map(str::to_string)).flatten()
        })
    }

    /// Where the worker takes handoff notices, once it has logged it.
    pub fn handoff_addr(&self) -> Option<String> {
        self.logs().into_iter().find_map(|(_, v)| {
            let taking = v.get("message").and_then(|m| m.as_str()) == Some("taking handoff notices");
            taking.then(|| v.get("address").and_then(|a| a.as_str()).map(str::to_string)).flatten()
        })
    }

    /// Bytes the process has written on stderr so far (all of them, kept or not).
    pub fn stderr_bytes(&self) -> u64 {
        self.stderr_bytes.load(Ordering::SeqCst)
    }

    /// Raw stderr, for failure messages.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().expect("lines").iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>().join("\n")
    }

    /// Log lines whose `message` equals `message`, with their `shard` field.
    pub fn events(&self, message: &str) -> Vec<(Instant, String)> {
        self.logs()
            .into_iter()
            .filter(|(_, v)| v.get("message").and_then(|m| m.as_str()) == Some(message))
            .map(|(at, v)| (at, v.get("shard").and_then(|s| s.as_str()).unwrap_or_default().to_string()))
            .collect()
    }

    /// Log lines whose `message` equals `message`, with their `shard` field, stamped with the time the
    /// worker wrote them (its own clock): what to compare with another process's events or with the
    /// test's `SystemTime::now()`. Lines without a timestamp are left out.
    pub fn events_logged(&self, message: &str) -> Vec<(SystemTime, String)> {
        self.logs()
            .into_iter()
            .filter(|(_, v)| v.get("message").and_then(|m| m.as_str()) == Some(message))
            .filter_map(|(_, v)| {
                let shard = v.get("shard").and_then(|s| s.as_str()).unwrap_or_default().to_string();
                Some((crate::holds::logged_at(&v)?, shard))
            })
            .collect()
    }

    /// This worker's lease events (acquired, released, handed over, lost, shard ended) in the order
    /// it logged them, stamped by its own clock.
    pub fn lease_events(&self) -> Vec<LeaseEvent> {
        let mut events: Vec<LeaseEvent> = self
            .logs()
            .into_iter()
            .filter_map(|(_, v)| {
                let kind = LeaseEventKind::of(v.get("message")?.as_str()?)?;
                Some(LeaseEvent {
                    at: crate::holds::logged_at(&v)?,
                    shard: v.get("shard").and_then(|s| s.as_str()).unwrap_or_default().to_string(),
                    kind,
                    counter: v.get("counter").and_then(|c| c.as_u64()),
                    checkpoint: v.get("checkpoint").and_then(|c| c.as_str()).map(str::to_string),
                })
            })
            .collect();
        // One process writes its lines in order; the sort is stable, so equal stamps keep it.
        events.sort_by_key(|e| e.at);
        events
    }

    /// Shards this worker holds now, judged from its `lease acquired` and release/loss logs in the
    /// order it wrote them. To tell whether two workers held a shard at once, use
    /// [`double_holds`](crate::holds::double_holds), not two of these snapshots: another worker's
    /// lines may not have been read yet.
    pub fn held_shards(&self) -> Vec<String> {
        let mut now: Vec<String> = Vec::new();
        for event in self.lease_events() {
            now.retain(|s| *s != event.shard);
            if event.kind == LeaseEventKind::Acquired {
                now.push(event.shard);
            }
        }
        now.sort();
        now
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process a test started (an operator, a helper), killed and reaped when dropped: a test
/// that fails part-way (panics) leaves no process running behind it.
pub struct KillOnDrop(Child);

impl KillOnDrop {
    /// Takes charge of `child`.
    pub fn new(child: Child) -> Self {
        Self(child)
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Resident memory of process `pid` in MiB (Linux `/proc`), 0 when it cannot be read.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// CPU time (user + system) process `pid` has used so far (Linux `/proc`, clock ticks of 10 ms), zero
/// when it cannot be read.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) are separated by single spaces.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = [11, 12].iter().filter_map(|i| fields.get(*i).and_then(|t| t.parse::<u64>().ok())).sum();
    Duration::from_millis(ticks * 10)
}

/// How often [`wait_for`] and [`poll_until`] check their condition.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// Checks `condition` every [`POLL_EVERY`] until it holds, without blocking the thread (a worker or
/// server the test runs in its own runtime goes on meanwhile); how long it took, or None after
/// `timeout`. The tests' one polling loop: [`wait_for`] is it with a panic.
pub async fn poll_until(timeout: Duration, mut condition: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if condition().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    None
}

/// Waits until `condition` holds (an async closure: `async || worker.held_shards().len() == 2`), or
/// panics with `what` after `timeout`; how long it took.
pub async fn wait_for(what: &str, timeout: Duration, condition: impl AsyncFnMut() -> bool) -> Duration {
    match poll_until(timeout, condition).await {
        Some(took) => took,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}
