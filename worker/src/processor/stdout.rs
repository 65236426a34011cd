//! The `stdout` processor: one JSON object per record and line, for demos and debugging.

use std::io::Write;

use async_trait::async_trait;
use serde::Serialize;

use super::record_json::RecordJson;
use super::{Outputs, ProcessError, Record, ShardProcessor};

/// Prints `{"stream","shardId","sequenceNumber","partitionKey","data" (base64),"owner"}` per record;
/// a user record of a KPL aggregate adds `subSequenceNumber` (and `explicitHashKey` when it has one),
/// so plain records print exactly as before.
#[derive(Debug, Clone)]
pub struct StdoutProcessor {
    owner: String,
}

#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    record: RecordJson<'a>,
    owner: &'a str,
}

impl StdoutProcessor {
    /// A processor printing as worker `owner`.
    pub fn new(owner: impl Into<String>) -> Self {
        Self { owner: owner.into() }
    }

    /// The JSON line for `record`, without the newline.
    pub fn line(&self, record: &Record) -> Result<String, ProcessError> {
        let line = Line { record: RecordJson::from(record), owner: &self.owner };
        serde_json::to_string(&line).map_err(|e| ProcessError::permanent(e.to_string()))
    }
}

#[async_trait]
impl ShardProcessor for StdoutProcessor {
    async fn process(&self, record: &Record, _outputs: &mut Outputs) -> Result<(), ProcessError> {
        let mut line = self.line(record)?;
        line.push('\n');
        // One write per line keeps lines whole when several shards print at once.
        std::io::stdout().lock().write_all(line.as_bytes()).map_err(|e| ProcessError::retryable(format!("stdout: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn prints_the_documented_fields() {
        let record = Record {
            stream: Arc::from("orders"),
            shard_id: Arc::from("shardId-000000000001"),
            sequence_number: "4959".into(),
            partition_key: "customer-7".into(),
            data: bytes::Bytes::from_static(b"hello"),
            arrival_ms: None,
            explicit_hash_key: None,
            sub_sequence_number: None,
        };
        let line = StdoutProcessor::new("w1").line(&record).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"stream": "orders", "shardId": "shardId-000000000001", "sequenceNumber": "4959",
                "partitionKey": "customer-7", "data": "aGVsbG8=", "owner": "w1"})
        );
        let user = Record { sub_sequence_number: Some(12), explicit_hash_key: Some("99".into()), ..record };
        let value: serde_json::Value = serde_json::from_str(&StdoutProcessor::new("w1").line(&user).unwrap()).unwrap();
        assert_eq!((value["subSequenceNumber"].as_u64(), value["explicitHashKey"].as_str()), (Some(12), Some("99")));
    }
}
