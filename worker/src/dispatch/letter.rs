//! The dead-letter document, whole and cut.
//!
//! The whole letter is the record's fields (as the stdout processor prints them) and why it is here.
//! A destination that cannot take it (over its size limit, or refusing it as invalid) is sent the cut
//! form instead: the same fields with `data` holding only the payload's first bytes (base64) — as many
//! as fit — and `truncated: true`, `dataBytes` (the whole payload's length), `dataSha256` (hex of the
//! whole payload's SHA-256), `dataObject` (`s3://bucket/key` of the whole letter when the dead-letter
//! bucket took it), the `error` cut to [`CUT_ERROR_BYTES`] and a partition key longer than
//! [`CUT_KEY_BYTES`] cut too (`partitionKeyTruncated: true`). The record's place (stream, shard,
//! sequence and sub-sequence number) is always whole: with it the record can be read again while the
//! stream keeps it.
//!
//! Every letter names the consumer that wrote it by its lease table (`leaseTable`, when the consumer
//! has one): `leasehold redrive` returns only the letters of the consumer it is given, and refuses
//! letters without it unless told to take them (`--accept-unnamed`).

use crate::destination::sha256_hex;
use bytes::Bytes;
use serde::Serialize;

use super::requeue::History;
use crate::processor::{Record, RecordJson};

/// The longest `error` a cut letter carries, bytes.
pub const CUT_ERROR_BYTES: usize = 1024;

/// The longest partition key a cut letter carries, bytes (Kinesis's own limit is 256 characters).
pub const CUT_KEY_BYTES: usize = 1024;

/// The dead-letter document (JSON).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    #[serde(flatten)]
    record: RecordJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arrival_ms: Option<i64>,
    attempts: u32,
    requeues: u32,
    error: &'a str,
    owner: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_table: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    cut: Option<Cut<'a>>,
}

/// What a cut letter adds.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Cut<'a> {
    truncated: bool,
    data_bytes: usize,
    data_sha256: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_object: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    partition_key_truncated: bool,
}

/// The letters of one dead record: the whole one, made once, and cut ones made on demand.
pub struct Letters<'a> {
    record: &'a Record,
    history: History,
    error: &'a str,
    owner: &'a str,
    lease_table: Option<&'a str>,
    whole: Bytes,
    sha256: String,
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn cut_str(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl<'a> Letters<'a> {
    /// The letters of `record` given up after `history`, failing with `error`, by worker `owner`.
    pub fn new(record: &'a Record, history: History, error: &'a str, owner: &'a str) -> Self {
        let document = Document {
            record: RecordJson::from(record),
            arrival_ms: record.arrival_ms,
            attempts: history.attempts,
            requeues: history.requeues,
            error,
            owner,
            lease_table: None,
            cut: None,
        };
        let whole = encode(&document);
        Self { record, history, error, owner, lease_table: None, whole, sha256: sha256_hex(&record.data) }
    }

    /// The same letters naming the consumer's lease table `table` (none: a consumer without one).
    pub fn of_consumer(mut self, table: Option<&'a str>) -> Self {
        if table.is_some() {
            self.lease_table = table;
            self.whole = encode(&Document {
                record: RecordJson::from(self.record),
                arrival_ms: self.record.arrival_ms,
                attempts: self.history.attempts,
                requeues: self.history.requeues,
                error: self.error,
                owner: self.owner,
                lease_table: table,
                cut: None,
            });
        }
        self
    }

    /// The whole letter.
    pub fn whole(&self) -> &Bytes {
        &self.whole
    }

    /// The SHA-256 of the record's payload, hex.
    pub fn data_sha256(&self) -> &str {
        &self.sha256
    }

    /// The cut letter of at most `max` bytes (as long a payload prefix as fits; none with `max` 0 or
    /// too small), naming `object` as where the whole letter is, if it is somewhere.
    pub fn cut(&self, max: usize, object: Option<&str>) -> Bytes {
        let key = cut_str(&self.record.partition_key, CUT_KEY_BYTES);
        let record = Record { partition_key: key.to_string(), data: Bytes::new(), ..self.record.clone() };
        let build = |record: &Record| {
            encode(&Document {
                record: RecordJson::from(record),
                arrival_ms: record.arrival_ms,
                attempts: self.history.attempts,
                requeues: self.history.requeues,
                error: cut_str(self.error, CUT_ERROR_BYTES),
                owner: self.owner,
                lease_table: self.lease_table,
                cut: Some(Cut {
                    truncated: true,
                    data_bytes: self.record.data.len(),
                    data_sha256: &self.sha256,
                    data_object: object,
                    partition_key_truncated: key.len() < self.record.partition_key.len(),
                }),
            })
        };
        let skeleton = build(&record);
        // Base64 takes 4 bytes for every 3; a few bytes of slack for the quotes JSON already counts.
        let mut keep = (max.saturating_sub(skeleton.len()) / 4 * 3).min(self.record.data.len());
        loop {
            if keep == 0 {
                return skeleton;
            }
            let letter = build(&Record { data: self.record.data.slice(..keep), ..record.clone() });
            if letter.len() <= max {
                return letter;
            }
            keep = keep.saturating_sub((letter.len() - max).div_ceil(4) * 3 + 3);
        }
    }
}

/// The JSON of `document`; a document that cannot be encoded (never: every field is plain) says so.
fn encode(document: &Document<'_>) -> Bytes {
    match serde_json::to_vec(document) {
        Ok(data) => Bytes::from(data),
        Err(e) => Bytes::from(format!("{{\"error\":\"cannot encode dead letter: {e}\"}}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use base64::Engine;

    use super::*;

    fn record(data: Vec<u8>, key: &str) -> Record {
        Record {
            stream: Arc::from("orders"),
            shard_id: Arc::from("shardId-000000000001"),
            sequence_number: "4959".into(),
            partition_key: key.into(),
            data: Bytes::from(data),
            arrival_ms: Some(7),
            explicit_hash_key: None,
            sub_sequence_number: Some(2),
        }
    }

    #[test]
    fn a_cut_letter_fits_and_says_what_it_cut() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let long_error = "é".repeat(5_000);
        let record = record(data.clone(), "k");
        let letters = Letters::new(&record, History { requeues: 1, attempts: 4 }, &long_error, "w");
        assert!(letters.whole().len() > 400_000);
        for max in [262_144, 10_000, 1_000, 0] {
            let cut = letters.cut(max, Some("s3://b/k.json"));
            assert!(cut.len() <= max.max(1_500), "{max}: {}", cut.len());
            let letter: serde_json::Value = serde_json::from_slice(&cut).unwrap();
            assert_eq!(letter["truncated"], true);
            assert_eq!(letter["dataBytes"], 300_000);
            assert_eq!(letter["dataSha256"], sha256_hex(&data));
            assert_eq!(letter["dataObject"], "s3://b/k.json");
            assert_eq!(
                (letter["sequenceNumber"].as_str(), letter["subSequenceNumber"].as_u64()),
                (Some("4959"), Some(2))
            );
            assert_eq!(letter["attempts"], 4);
            assert!(letter["error"].as_str().unwrap().len() <= CUT_ERROR_BYTES);
            let prefix = base64::engine::general_purpose::STANDARD.decode(letter["data"].as_str().unwrap()).unwrap();
            assert!(data.starts_with(&prefix));
            if max >= 10_000 {
                assert!(cut.len() + 8 >= max, "as much data as fits: {} of {max}", cut.len());
            }
        }
        let whole: serde_json::Value = serde_json::from_slice(letters.whole()).unwrap();
        assert!(whole.get("truncated").is_none());
        assert!(whole.get("leaseTable").is_none(), "no table named: none written");
        let named = Letters::new(&record, History::default(), "e", "w").of_consumer(Some("orders-leases"));
        for letter in [named.whole().clone(), named.cut(1_000, None)] {
            let letter: serde_json::Value = serde_json::from_slice(&letter).unwrap();
            assert_eq!(letter["leaseTable"], "orders-leases");
        }
        assert_eq!(whole["error"].as_str().unwrap().len(), long_error.len());
    }

    #[test]
    fn a_long_partition_key_is_cut_on_a_character_boundary() {
        let key = "ü".repeat(3_000);
        let record = record(b"x".to_vec(), &key);
        let letters = Letters::new(&record, History::default(), "e", "w");
        let letter: serde_json::Value = serde_json::from_slice(&letters.cut(100_000, None)).unwrap();
        assert_eq!(letter["partitionKeyTruncated"], true);
        assert!(letter.get("dataObject").is_none());
        assert_eq!(letter["partitionKey"].as_str().unwrap().len(), CUT_KEY_BYTES);
        assert_eq!(letter["data"], "eA==", "the whole payload when it fits");
    }
}
