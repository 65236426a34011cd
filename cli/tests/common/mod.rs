//! Shared pieces of the CLI's end-to-end tests: running the built `leasehold` binary against the
//! emulators, worker processes, and lease rows written as a worker would.

#![allow(dead_code)]

pub mod records;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leasehold_testkit::process::WorkerProcess;
/// The tests' one polling helper (an async closure as the condition).
#[allow(unused_imports)]
pub use leasehold_testkit::process::wait_for;
use leasehold_testkit::{Service, endpoint};
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, ManualClock};

/// Timing for tests: short leases so the group settles quickly.
pub const FAST_TIMING: &str = "lease: {duration: 2s, renewInterval: 500ms, scanInterval: 250ms, shardSyncInterval: 1s, \
                               checkpointInterval: 200ms, gracefulTimeout: 3s}\n";

/// The `leasehold` binary: `LEASEHOLD_BIN` when set (a copy of one's own build, on a machine where
/// others build into the same target directory), else the one built with this test.
pub fn leasehold_binary() -> PathBuf {
    std::env::var_os("LEASEHOLD_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_leasehold")), PathBuf::from)
}

/// The `leasehold` command with test credentials and the emulators' endpoints.
pub fn leasehold() -> Command {
    let mut command = Command::new(leasehold_binary());
    command
        .env("AWS_ACCESS_KEY_ID", "leasehold-test")
        .env("AWS_SECRET_ACCESS_KEY", "leasehold-test")
        .env("AWS_REGION", "us-east-1")
        .env("LEASEHOLD_KINESIS_ENDPOINT", endpoint(Service::Kinesis))
        .env("LEASEHOLD_DYNAMODB_ENDPOINT", endpoint(Service::DynamoDb))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    command
}

/// What a finished `leasehold` run left.
#[derive(Debug)]
pub struct Run {
    /// Exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Stdout parsed as JSON (panics with both outputs when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }

    /// Panics unless the exit code is `code`.
    pub fn expect_code(self, code: i32) -> Self {
        assert_eq!(self.code, code, "exit code\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }
}

fn finished(output: Output) -> Run {
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `leasehold args...` to the end.
pub fn run(args: &[&str]) -> Run {
    finished(leasehold().args(args).output().expect("run leasehold"))
}

/// Runs `leasehold args...` with extra environment.
pub fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = leasehold();
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    finished(command.output().expect("run leasehold"))
}

/// The worker binary: `LEASEHOLD_WORKER_BIN` when set (as in the worker's tests), else the one built
/// next to the test (`cargo test --workspace` and `make test` build it).
pub fn worker_binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("LEASEHOLD_WORKER_BIN") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let debug = exe.parent().and_then(Path::parent).expect("target/debug");
    let binary = debug.join("leasehold-worker");
    assert!(
        binary.exists(),
        "{} is missing: build it first (`cargo build -p leasehold-worker`, or run `make test`)",
        binary.display()
    );
    binary
}

/// A worker config for `stream` and `table` on the emulators.
pub fn config(stream: &str, table: &str, extra: &str) -> String {
    let kinesis = endpoint(Service::Kinesis);
    let dynamodb = endpoint(Service::DynamoDb);
    format!(
        "streams: [{{name: {stream}}}]\naws: {{region: us-east-1, kinesisEndpoint: '{kinesis}', dynamodbEndpoint: '{dynamodb}'}}\n\
         leaseTable: {{name: {table}}}\nprocessor: {{stdout: {{}}}}\n{FAST_TIMING}reader: {{idleTime: 100ms}}\n{extra}"
    )
}

/// Starts a worker process.
pub fn spawn_worker(config: &str, owner: &str) -> WorkerProcess {
    WorkerProcess::spawn(&worker_binary(), config, owner)
}

/// A lease store on `table` writing as `owner`, whose wall clock runs `skew_ms` off (a negative skew
/// writes expiries already past, as a dead worker's look).
pub async fn store(table: &str, owner: &str, skew_ms: i64) -> DynamoLeaseStore {
    let client = leasehold_testkit::dynamodb_client().await;
    let settings = LeaseSettings::new(owner)
        .with_duration(Duration::from_secs(2))
        .with_clock(Arc::new(ManualClock::with_skew_ms(skew_ms)));
    DynamoLeaseStore::new(client, table, settings)
}

/// Runs `test` on a runtime of its own.
pub fn run_test(test: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime").block_on(test);
}

/// `describe --table T --stream S -o json`.
pub fn describe(table: &str, stream: &str) -> serde_json::Value {
    run(&["describe", "--table", table, "--stream", stream, "-o", "json"]).expect_code(0).json()
}

/// The shards of a `describe` JSON, as (shard, checkpoint, state) sorted by shard.
pub fn shard_states(description: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = description["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| {
            (
                s["shard"].as_str().unwrap_or_default().to_string(),
                s["checkpoint"].as_str().unwrap_or_default().to_string(),
                s["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}
