//! A record's fields as JSON, the one shape shared by the stdout processor's lines and the dead-letter
//! document, so the two cannot drift apart.

use base64::Engine;
use serde::Serialize;

use super::Record;

/// `{"stream","shardId","sequenceNumber","partitionKey","data" (base64)}`; a user record of a KPL
/// aggregate adds `subSequenceNumber` (and `explicitHashKey` when it has one), so plain records keep
/// exactly these fields. Meant to be `#[serde(flatten)]`ed into a document with fields of its own.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RecordJson<'a> {
    stream: &'a str,
    shard_id: &'a str,
    sequence_number: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sub_sequence_number: Option<u32>,
    partition_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    explicit_hash_key: Option<&'a str>,
    data: String,
}

impl<'a> From<&'a Record> for RecordJson<'a> {
    fn from(record: &'a Record) -> Self {
        Self {
            stream: &record.stream,
            shard_id: &record.shard_id,
            sequence_number: &record.sequence_number,
            sub_sequence_number: record.sub_sequence_number,
            partition_key: &record.partition_key,
            explicit_hash_key: record.explicit_hash_key.as_deref(),
            data: base64::engine::general_purpose::STANDARD.encode(&record.data),
        }
    }
}
