//! Hostile multilang children (issue 30): a child writing one 100 MB line, or a line that never ends,
//! commits a protocol error (it is killed and its records retried in a fresh child) while the worker's
//! peak memory stays within 64 MiB of where it was; a child flooding stdout with lines that are not
//! protocol messages gets a few of them logged, each cut short, and loses nothing.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::{WorkerProcess, wait_for};

/// Peak resident memory of `pid` (VmHWM) in MiB.
fn peak_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("VmHWM");
    kib / 1024.0
}

/// A child that answers every message; on its first `processRecords` (a marker in `dir` remembers
/// it, over restarts) it misbehaves as `mode` says before doing its work: `long` writes one line of
/// 100 MB, `endless` a line that never ends (256 MiB, then it waits to be killed), `noise` 5,000
/// lines of 2,000 characters that are not protocol messages. It logs `initialize` to
/// `dir/initialized` and each record it completes to `dir/done`.
fn child(dir: &Path, mode: &str) -> PathBuf {
    let script = dir.join("child.py");
    let body = format!(
        r#"import base64, json, os, sys, time
DIR = {dir:?}
MODE = {mode:?}
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    action = msg["action"]
    if action == "initialize":
        open(os.path.join(DIR, "initialized"), "a").close()
    if action == "processRecords":
        marker = os.path.join(DIR, "misbehaved")
        if not os.path.exists(marker):
            open(marker, "w").close()
            if MODE == "long":
                chunk = "x" * (1 << 20)
                for _ in range(100):
                    sys.stdout.write(chunk)
                sys.stdout.write("\n"); sys.stdout.flush()
            elif MODE == "endless":
                # No newline, ever; capped at 256 MiB so an unbounded reader fails the bound, not the
                # machine. Then it waits to be killed.
                chunk = "x" * 65536
                for _ in range(4096):
                    sys.stdout.write(chunk)
                sys.stdout.flush()
                time.sleep(3600)
            elif MODE == "noise":
                junk = "not json " * 222
                for n in range(5000):
                    sys.stdout.write(f"{{n}} {{junk}}\n")
                sys.stdout.flush()
        with open(os.path.join(DIR, "done"), "a") as f:
            f.write("".join(base64.b64decode(r["data"]).decode() + "\n" for r in msg["records"]))
    send({{"action": "status", "responseFor": action}})
"#,
        dir = dir.display().to_string(),
    );
    std::fs::write(&script, body).unwrap();
    script
}

/// Runs a worker whose multilang child misbehaves as `mode` says, over 20 records written once its
/// child is initialized; returns the worker, the records written, what the children completed, and
/// how far the worker's peak memory rose.
async fn run(mode: &str) -> (WorkerProcess, Vec<String>, Vec<String>, f64) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, &format!("ml{mode}"), 1).await;
    let dir = std::env::temp_dir().join(leasehold_testkit::unique_name(&format!("ml{mode}")));
    std::fs::create_dir_all(&dir).unwrap();
    let script = child(&dir, mode);
    let processor =
        format!("processor: {{multilang: {{command: ['python3', '{}'], timeout: 20s}}}}\n", script.display());
    let config = config(&stream, None, "startPosition: TRIM_HORIZON\nretry: {backoff: 100ms}\n")
        .replace("processor: {stdout: {}}\n", &processor);
    let worker = spawn(&config, &format!("ml{mode}-1"));
    wait_for("the child initialized", Duration::from_secs(30), async || dir.join("initialized").exists()).await;
    // Settled: the worker has started, holds its lease and runs its child.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = peak_mib(worker.pid());
    let written = records(2, 0, 10);
    put_records(&kinesis, &stream, &written).await;
    let done = || std::fs::read_to_string(dir.join("done")).unwrap_or_default();
    wait_for("every record done", Duration::from_secs(90), async || done().lines().count() >= written.len()).await;
    // A repeat would show in this time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rise = peak_mib(worker.pid()) - before;
    assert!(dir.join("misbehaved").exists(), "the child misbehaved");
    let written = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    let done = done().lines().map(String::from).collect();
    (worker, written, done, rise)
}

/// A child writing an over-long line is killed as for any protocol error; the next child does its
/// records, once each, in order; the worker's memory does not follow the line.
async fn over_long_line(mode: &str) {
    let (mut worker, written, done, rise) = run(mode).await;
    assert_running(&mut [&mut worker]);
    assert_eq!(done, written, "every record once, in order, by the child that took over");
    assert!(rise <= 64.0, "{mode}: peak memory rose by {rise:.1} MiB, over 64 MiB");
    println!("{mode}: the worker's peak memory rose by {rise:.1} MiB");
    let logs = worker.stderr_text();
    assert!(logs.contains("child wrote a line longer than 4194304 bytes: a protocol error"), "{logs}");
    assert_eq!(logs.matches("multilang child failed; restarting it").count(), 1, "one restart:\n{logs}");
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "no log line holds the child's line: the longest is {longest} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_writing_a_100_mb_line_is_restarted_and_the_worker_stays_small() {
    over_long_line("long").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_writing_an_endless_line_is_restarted_and_the_worker_stays_small() {
    over_long_line("endless").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_lines_that_are_not_messages_is_logged_cut_and_rate_limited() {
    let (mut worker, written, done, rise) = run("noise").await;
    assert_running(&mut [&mut worker]);
    assert_eq!(done, written, "noise is ignored: every record once, in order, in the same child");
    assert!(rise <= 64.0, "peak memory rose by {rise:.1} MiB");
    // The suppressed count is logged when the child ends.
    worker.signal("TERM");
    let status = worker.wait_exit(Duration::from_secs(30)).expect("exits");
    let logs = worker.stderr_text();
    assert!(status.success(), "{logs}");
    assert!(!logs.contains("multilang child failed"), "noise is no protocol error:\n{logs}");
    let noise: Vec<&str> = logs.lines().filter(|l| l.contains("not a protocol message; ignored")).collect();
    assert_eq!(noise.len(), 20, "20 of the 5,000 lines logged");
    assert!(noise.iter().all(|l| l.len() < 1500 && l.contains("bytes in all")), "each cut: {:?}", noise[0]);
    assert!(noise[0].contains("2000"), "with its full length: {}", noise[0]);
    let summary = logs.lines().find(|l| l.contains("not protocol messages; not logged")).expect("a summary");
    assert!(summary.contains("4980"), "the rest counted: {summary}");
}
