//! KPL aggregates made by AWS's own aggregation library (`aws-kinesis-agg`, installed into the cache by
//! `tests/ground/kpl.sh`), so tests do not share the worker's reading of the format.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

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
pub fn aggregate_with_library(spec: &Value) -> Value {
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

/// One aggregated Kinesis record as the library made it.
#[derive(Debug, Clone)]
pub struct LibraryAggregate {
    /// The partition key the library chose for the Kinesis record.
    pub partition_key: String,
    /// The explicit hash key the library chose, if any.
    pub explicit_hash_key: Option<String>,
    /// The aggregate's bytes (magic, protobuf, MD5).
    pub data: Vec<u8>,
    /// The user records in it, in order: (partition key, data).
    pub users: Vec<(String, Vec<u8>)>,
}

/// Packs `users` with aws-kinesis-agg, at most `per_aggregate` user records per aggregate.
pub fn library_aggregates(users: &[(String, Vec<u8>)], per_aggregate: usize) -> Vec<LibraryAggregate> {
    let records: Vec<Value> =
        users.iter().map(|(key, data)| json!({"partition_key": key, "data_b64": STANDARD.encode(data)})).collect();
    let answer = aggregate_with_library(&json!({"records": records, "max_records": per_aggregate}));
    let mut rest = users;
    answer["aggregates"]
        .as_array()
        .expect("aggregates")
        .iter()
        .map(|a| {
            let count = a["user_records"].as_u64().expect("count") as usize;
            let (mine, after) = rest.split_at(count);
            rest = after;
            LibraryAggregate {
                partition_key: a["partition_key"].as_str().expect("key").to_string(),
                explicit_hash_key: a["explicit_hash_key"].as_str().map(str::to_string),
                data: STANDARD.decode(a["data_b64"].as_str().expect("data")).expect("base64"),
                users: mine.to_vec(),
            }
        })
        .collect()
}

/// Puts each aggregate, in order, as aws-kinesis-agg's users do (under the keys the library chose);
/// returns their sequence numbers.
pub async fn put_aggregates(client: &Client, stream: &str, aggregates: &[LibraryAggregate]) -> Vec<String> {
    let mut sequences = Vec::with_capacity(aggregates.len());
    for aggregate in aggregates {
        let put = client
            .put_record()
            .stream_name(stream)
            .partition_key(&aggregate.partition_key)
            .set_explicit_hash_key(aggregate.explicit_hash_key.clone())
            .data(Blob::new(aggregate.data.clone()))
            .send()
            .await
            .expect("put aggregate");
        sequences.push(put.sequence_number);
    }
    sequences
}
