//! `import-kcl` against a lease table written by the real Java KCL 3.x MultiLangDaemon (multilang
//! 3.1.3): the same run as import_kcl_java.rs (KCL killed mid-stream with a checkpoint inside a KPL
//! aggregate, import, a worker resumes exactly after the checkpoints), with the KCL 3.x's tables in the
//! separate moto of tests/ground/moto-kcl.sh (dynalite refuses the GSI its lease table needs). The
//! script fails, and this test with it, when that moto or anything the KCL 3.x needs is missing.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{leasehold_binary, worker_binary};

#[test]
fn the_real_java_kcl_3x_checkpoints_are_imported_and_a_worker_resumes_exactly_after_them() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ground/kcl-import.sh");
    let started = Instant::now();
    let out = Command::new(&script)
        .env("KCL_VERSION", "3.1.3")
        .env("LEASEHOLD_BIN", leasehold_binary())
        .env("LEASEHOLD_WORKER_BIN", worker_binary())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{} (KCL 3.1.3) failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        script.display(),
        out.status
    );
    let result: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON result from the script:\n{stdout}\nstderr:\n{stderr}"));
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["kcl_version"], "3.1.3", "{result}");
    assert_eq!(result["gaps"].as_array().map(Vec::len), Some(0), "{result}");
    assert_eq!(result["leasehold_repeats"], 0, "{result}");
    assert!(result["kcl_processed"].as_u64().is_some_and(|n| n >= 60), "the KCL was under way: {result}");
    // It was the KCL 3.x that wrote the table: its coordinator and worker-metrics tables exist beside it.
    let tables = result["kcl_tables"].as_array().cloned().unwrap_or_default();
    for suffix in ["-CoordinatorState", "-WorkerMetricStats"] {
        assert!(tables.iter().any(|t| t.as_str().is_some_and(|t| t.ends_with(suffix))), "no {suffix} table: {result}");
    }
    println!("real-KCL 3.x import in {:?}: {result}", started.elapsed());
}
