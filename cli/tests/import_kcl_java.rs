//! `import-kcl` against a lease table written by the real Java KCL 2.5.4 MultiLangDaemon: the KCL is
//! killed mid-stream with a checkpoint inside a KPL aggregate, the CLI imports its checkpoints, and a
//! worker processes every record after them and none before (tests/ground/kcl-import.sh, run with the
//! binaries of this test run). The script installs a JDK and Maven when missing and fetches the KCL's
//! jars from Maven Central; anything it cannot get fails the test, which never skips.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{leasehold_binary, worker_binary};

#[test]
fn the_real_java_kcls_checkpoints_are_imported_and_a_worker_resumes_exactly_after_them() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ground/kcl-import.sh");
    let started = Instant::now();
    let out = Command::new(&script)
        .env("LEASEHOLD_BIN", leasehold_binary())
        .env("LEASEHOLD_WORKER_BIN", worker_binary())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        script.display(),
        out.status
    );
    let result: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON result from the script:\n{stdout}\nstderr:\n{stderr}"));
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["gaps"].as_array().map(Vec::len), Some(0), "{result}");
    assert_eq!(result["leasehold_repeats"], 0, "{result}");
    assert!(result["kcl_processed"].as_u64().is_some_and(|n| n >= 60), "the KCL was under way: {result}");
    println!("real-KCL import in {:?}: {result}", started.elapsed());
}
