//! The system under test: worker slots, each a sequence of worker processes (incarnations) behind a
//! DynamoDB proxy of their own (which logs every accepted lease write) and a Kinesis proxy per slot.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_testkit::Service;
use leasehold_testkit::nemesis::{ChaosProxy, Faults, WriteLog};
use leasehold_testkit::process::WorkerProcess;

use crate::common::with_endpoint;

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Killed with SIGKILL by the nemesis.
    Killed,
    /// Stopped with SIGTERM by the nemesis (a graceful stop).
    Terminated,
    /// Stopped with SIGTERM at the end of the round.
    Final,
}

/// One worker process.
pub struct Incarnation {
    /// `<slot>.<n>`: unique in the round.
    pub id: String,
    /// The process.
    pub process: WorkerProcess,
    /// Its DynamoDB proxy (only this process uses it, so every write logged there is this process's).
    pub dynamo: ChaosProxy,
    /// When and how it ended (the instant the test saw it exit).
    pub end: Option<(Instant, End)>,
    /// Faults that can cost it its leases (kill, stop, DynamoDB cut, throttling or delay), each a
    /// window (from, to) with what it was: the only excuses for a repeat.
    pub faults: Vec<(Instant, Instant, String)>,
    /// Its exit status, once it ended.
    pub exit: Option<std::process::ExitStatus>,
}

/// A place for one worker at a time.
pub struct Slot {
    /// `w<i>`.
    pub name: String,
    /// The owner id the next same-id restart uses.
    pub owner: String,
    /// Incarnations started so far.
    pub started: u32,
    /// The running process, if any.
    pub current: Option<Incarnation>,
    /// This slot's Kinesis proxy (kept across incarnations).
    pub kinesis: ChaosProxy,
    /// The file libfaketime reads the clock offset from, for slots whose workers run under it.
    pub skew_file: Option<PathBuf>,
    /// A soak's long-lived slot: the nemesis never kills, stops or terminates its worker (every other
    /// fault still reaches it), so its memory and descriptors are watched over the whole run.
    pub stayer: bool,
}

/// A whole round's state shared by the nemesis, the producer and the checker.
pub struct Cluster {
    /// When the round started (the zero of every printed time).
    pub start: Instant,
    /// The stream read.
    pub stream: String,
    /// The config of every worker, with the emulators' endpoints (replaced per process by its proxies).
    pub config: String,
    /// Every accepted lease write of every process.
    pub log: WriteLog,
    /// What the nemesis did, when.
    pub history: Mutex<Vec<(Instant, String)>>,
    /// The worker slots.
    pub slots: Vec<tokio::sync::Mutex<Slot>>,
    /// Incarnations that have ended (kept so their output stays readable).
    pub ended: Mutex<Vec<Incarnation>>,
    faketime: Option<PathBuf>,
    binary: PathBuf,
}

impl Cluster {
    /// Slots `w0..w<count>`; the first `skewed` run their workers under libfaketime (`faketime` the
    /// library's path) with a clock offset file the nemesis rewrites.
    pub async fn new(
        stream: &str,
        config: String,
        count: usize,
        skewed: usize,
        faketime: Option<PathBuf>,
        dir: &std::path::Path,
    ) -> Self {
        let kinesis = leasehold_testkit::endpoint(Service::Kinesis);
        let mut slots = Vec::new();
        for i in 0..count {
            let name = format!("w{i}");
            let skew_file = (i < skewed && faketime.is_some()).then(|| dir.join(format!("{name}.faketime")));
            if let Some(file) = &skew_file {
                std::fs::write(file, "+0\n").expect("skew file");
            }
            let kinesis = ChaosProxy::start(&kinesis, &name, Arc::new(Faults::default()), None).await;
            slots.push(tokio::sync::Mutex::new(Slot {
                owner: name.clone(),
                name,
                started: 0,
                current: None,
                kinesis,
                skew_file,
                stayer: false,
            }));
        }
        Self {
            start: Instant::now(),
            stream: stream.to_string(),
            config,
            log: WriteLog::default(),
            history: Mutex::default(),
            slots,
            ended: Mutex::default(),
            binary: PathBuf::from(env!("CARGO_BIN_EXE_leasehold-worker")),
            faketime,
        }
    }

    /// Seconds since the round started, for printing.
    pub fn at(&self, instant: Instant) -> String {
        format!("{:>7.3}s", instant.saturating_duration_since(self.start).as_secs_f64())
    }

    /// Notes a nemesis action in the history (and prints it when the run is verbose).
    pub fn note(&self, what: String) {
        let now = Instant::now();
        if std::env::var_os("LEASEHOLD_CHAOS_VERBOSE").is_some() {
            eprintln!("[chaos {}] {what}", self.at(now));
        }
        self.history.lock().expect("history").push((now, what));
    }

    /// Starts a new incarnation in `slot` (which must be empty), with a new owner id when `new_owner`.
    pub async fn start_worker(&self, slot: &mut Slot, new_owner: bool) {
        assert!(slot.current.is_none(), "{} already runs a worker", slot.name);
        if new_owner {
            slot.owner = format!("{}-{}", slot.name, slot.started);
        }
        let id = format!("{}.{}", slot.name, slot.started);
        slot.started += 1;
        let dynamo = ChaosProxy::start(
            &leasehold_testkit::endpoint(Service::DynamoDb),
            &id,
            Arc::new(Faults::default()),
            Some(self.log.clone()),
        )
        .await;
        let config = with_endpoint(&self.config, Service::DynamoDb, &dynamo.endpoint());
        let config = with_endpoint(&config, Service::Kinesis, &slot.kinesis.endpoint());
        let binary = match (&slot.skew_file, &self.faketime) {
            (Some(file), Some(library)) => self.faketime_wrapper(&id, library, file),
            _ => self.binary.clone(),
        };
        let process = WorkerProcess::spawn(&binary, &config, &slot.owner);
        self.note(format!("start {id} as owner {} (pid {})", slot.owner, process.pid()));
        slot.current = Some(Incarnation { id, process, dynamo, end: None, faults: Vec::new(), exit: None });
    }

    /// A script that runs the worker binary under libfaketime, the wall clock offset read from `file`
    /// (the monotonic clock left alone: that is what a skewed machine clock looks like). `exec` keeps
    /// the pid, so signals reach the worker itself.
    fn faketime_wrapper(&self, id: &str, library: &std::path::Path, file: &std::path::Path) -> PathBuf {
        let script =
            std::env::temp_dir().join("leasehold-tests").join(format!("{}.sh", leasehold_testkit::unique_name(id)));
        let text = format!(
            "#!/bin/sh\nexport LD_PRELOAD='{}' FAKETIME_TIMESTAMP_FILE='{}' FAKETIME_DONT_FAKE_MONOTONIC=1 \
             FAKETIME_CACHE_DURATION=1\nexec '{}' \"$@\"\n",
            library.display(),
            file.display(),
            self.binary.display()
        );
        std::fs::write(&script, text).expect("write faketime wrapper");
        let status = std::process::Command::new("chmod").arg("+x").arg(&script).status().expect("chmod");
        assert!(status.success(), "chmod +x {}", script.display());
        script
    }

    /// Ends `slot`'s worker with `signal` (`KILL` or `TERM`), waits for it to exit (SIGKILL after
    /// `patience` if it does not), and files it with the ended ones. Returns false when it had to be
    /// killed after a SIGTERM.
    pub async fn stop_worker(&self, slot: &mut Slot, signal: &str, end: End, patience: Duration) -> bool {
        let Some(mut incarnation) = slot.current.take() else { return true };
        // Throttling and delays end here; a cut stays if the nemesis set it (a stop while cut off).
        let faults = incarnation.dynamo.faults();
        faults.set_throttle_permille(0);
        faults.set_delay(Duration::ZERO);
        let signalled = Instant::now();
        incarnation.process.signal(signal);
        let mut clean = true;
        let mut status = wait_exit(&mut incarnation.process, patience).await;
        if status.is_none() {
            clean = false;
            self.note(format!("{} did not exit within {patience:?} of SIG{signal}; SIGKILL", incarnation.id));
            incarnation.process.signal("KILL");
            status = wait_exit(&mut incarnation.process, Duration::from_secs(10)).await;
        }
        let now = Instant::now();
        self.note(format!("{} exited after SIG{signal}: {status:?}", incarnation.id));
        incarnation.end = Some((now, if clean { end } else { End::Killed }));
        incarnation.exit = status;
        if !clean || end == End::Killed {
            incarnation.faults.push((signalled, now, format!("SIG{signal}")));
        }
        self.ended.lock().expect("ended").push(incarnation);
        clean
    }

    /// Every incarnation, ended ones first; the slots' running ones only once they have ended too.
    pub fn take_all(&self) -> Vec<Incarnation> {
        std::mem::take(&mut *self.ended.lock().expect("ended"))
    }
}

/// Waits for `process` to exit without holding up the runtime's other tasks (the proxies run there).
pub async fn wait_exit(process: &mut WorkerProcess, timeout: Duration) -> Option<std::process::ExitStatus> {
    tokio::task::block_in_place(|| process.wait_exit(timeout))
}
