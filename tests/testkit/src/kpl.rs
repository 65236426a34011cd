//! KPL aggregates made by AWS's own aggregation library (`aws-kinesis-agg`, installed into the cache by
//! `tests/ground/kpl.sh`), so tests do not share the worker's reading of the format.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The python that has aws-kinesis-agg (installed once per test process); panics, failing the test,
/// when it cannot be installed.
pub fn agg_python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("tests/ground/kpl.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/ground/kpl.sh");
        assert!(out.status.success(), "tests/ground/kpl.sh failed: aws-kinesis-agg is needed for this test");
        String::from_utf8(out.stdout).expect("utf8").trim().to_string()
    })
}

/// Runs `tests/ground/kpl-agg.py` on `spec` (its JSON input: records, options) and returns its answer.
pub fn aggregate_with_library(spec: &serde_json::Value) -> serde_json::Value {
    let mut child = Command::new(agg_python())
        .arg(repo_root().join("tests/ground/kpl-agg.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start kpl-agg.py");
    child.stdin.take().expect("stdin").write_all(spec.to_string().as_bytes()).expect("write spec");
    let out = child.wait_with_output().expect("kpl-agg.py");
    assert!(out.status.success(), "kpl-agg.py failed");
    serde_json::from_slice(&out.stdout).expect("kpl-agg.py json")
}
