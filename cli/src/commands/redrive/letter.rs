//! A dead letter, read and judged: whose it is, whether it is whole (a cut letter's whole record read
//! from the bucket and checked against its hash), its record's place in the source stream, and
//! whether this run takes it.

use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{Run, Source};
use crate::shared::error::{CliError, Result};

/// A dead letter as the worker writes it (see `worker/src/dispatch/letter.rs`).
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
struct LetterJson {
    stream: String,
    shard_id: String,
    sequence_number: String,
    #[serde(default)]
    sub_sequence_number: Option<u32>,
    partition_key: String,
    #[serde(default)]
    explicit_hash_key: Option<String>,
    data: String,
    #[serde(default)]
    truncated: bool,
    #[serde(default)]
    data_sha256: Option<String>,
    #[serde(default)]
    data_object: Option<String>,
    #[serde(default)]
    lease_table: Option<String>,
}

/// A record's place in its source stream: what makes two letters the same record's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Place {
    /// Source stream.
    pub stream: String,
    /// Source shard.
    pub shard_id: String,
    /// Sequence number.
    pub sequence_number: String,
    /// Sub-sequence number (a user record of a KPL aggregate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_sequence_number: Option<u32>,
}

impl Place {
    /// Sorts places as the stream orders them: by stream, shard, then the sequence number as a number.
    pub(super) fn order_key(&self) -> (&str, &str, usize, &str, u32) {
        let seq = self.sequence_number.trim_start_matches('0');
        (&self.stream, &self.shard_id, seq.len(), seq, self.sub_sequence_number.unwrap_or(0))
    }
}

/// Where one copy of a letter is, and how to mark it.
#[derive(Debug, Clone)]
pub(super) enum Copy {
    Stream { shard: String, sequence: String },
    Sqs { receipt: String },
    S3 { key: String },
}

/// One record to put back: its fields and the copies of its letter.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) place: Place,
    pub(super) partition_key: String,
    pub(super) explicit_hash_key: Option<String>,
    pub(super) data: Bytes,
    pub(super) copies: Vec<(Source, Copy)>,
}

/// How one letter was judged.
pub(super) enum Verdict {
    /// Chosen (or a duplicate of a chosen one).
    Take(Pending),
    /// Never this consumer's to redrive (another consumer's, malformed, cut without its record).
    Never,
    /// Left out this time (filters, limit, unnamed): a later run may take it.
    Later,
}

impl Run<'_> {
    /// Judges the letter `body` found at `copy` of `source`, written at `written_ms`.
    pub(super) async fn judge(
        &mut self,
        source: Source,
        copy: Copy,
        body: &[u8],
        written_ms: Option<i64>,
    ) -> Result<Verdict> {
        self.count(source).read += 1;
        let Ok(letter) = serde_json::from_slice::<LetterJson>(body) else {
            self.count(source).malformed += 1;
            return Ok(Verdict::Never);
        };
        match &letter.lease_table {
            Some(table) if *table != self.target.table => {
                self.count(source).refused_other_consumer += 1;
                return Ok(Verdict::Never);
            }
            None if !self.args.accept_unnamed => {
                self.count(source).refused_unnamed += 1;
                return Ok(Verdict::Later);
            }
            _ => {}
        }
        let place = Place {
            stream: letter.stream.clone(),
            shard_id: letter.shard_id.clone(),
            sequence_number: letter.sequence_number.clone(),
            sub_sequence_number: letter.sub_sequence_number,
        };
        let filtered = (!self.args.shards.is_empty() && !self.args.shards.contains(&place.shard_id))
            || self.since_ms.zip(written_ms).is_some_and(|(since, written)| written < since);
        if filtered {
            self.count(source).left_out += 1;
            return Ok(Verdict::Later);
        }
        if let Some(pending) = self.chosen.get_mut(&place) {
            pending.copies.push((source, copy.clone()));
            self.count(source).duplicates += 1;
            return Ok(Verdict::Take(Pending {
                place,
                partition_key: String::new(),
                explicit_hash_key: None,
                data: Bytes::new(),
                copies: Vec::new(),
            }));
        }
        if self.full() {
            self.count(source).left_out += 1;
            return Ok(Verdict::Later);
        }
        let whole = match self.whole_record(&letter).await? {
            Some(whole) => whole,
            None => {
                self.count(source).cut_without_record += 1;
                return Ok(Verdict::Never);
            }
        };
        self.count(source).selected += 1;
        *self.shard_counts.entry((place.shard_id.clone(), source)).or_default() += 1;
        Ok(Verdict::Take(Pending {
            place,
            partition_key: whole.partition_key,
            explicit_hash_key: whole.explicit_hash_key,
            data: whole.data,
            copies: vec![(source, copy)],
        }))
    }

    /// The record of `letter`: its own fields when whole, else the whole letter its `dataObject` names
    /// (checked against `dataSha256`); `None` when there is no such whole letter.
    async fn whole_record(&self, letter: &LetterJson) -> Result<Option<Record>> {
        if !letter.truncated {
            return Ok(decode_data(&letter.data)
                .map(|data| Record {
                    partition_key: letter.partition_key.clone(),
                    explicit_hash_key: letter.explicit_hash_key.clone(),
                    data,
                })
                .ok());
        }
        let Some((bucket, key)) = letter.data_object.as_deref().and_then(|o| o.strip_prefix("s3://")?.split_once('/'))
        else {
            return Ok(None);
        };
        let object = match self.s3.get_object().bucket(bucket).key(key).send().await {
            Ok(object) => object,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => {
                return Err(CliError::Service(format!(
                    "reading s3://{bucket}/{key}: {}",
                    aws_sdk_s3::error::DisplayErrorContext(&e)
                )));
            }
        };
        let body = object
            .body
            .collect()
            .await
            .map_err(|e| CliError::Service(format!("reading s3://{bucket}/{key}: {e}")))?
            .into_bytes();
        let Ok(whole) = serde_json::from_slice::<LetterJson>(&body) else { return Ok(None) };
        let Ok(data) = decode_data(&whole.data) else { return Ok(None) };
        if whole.truncated || letter.data_sha256.as_deref().is_some_and(|sha| sha != sha256_hex(&data)) {
            return Ok(None);
        }
        Ok(Some(Record { partition_key: whole.partition_key, explicit_hash_key: whole.explicit_hash_key, data }))
    }
}

/// The fields a redriven record is put with.
struct Record {
    partition_key: String,
    explicit_hash_key: Option<String>,
    data: Bytes,
}

/// Hex of the SHA-256 of `bytes`, as letters give `dataSha256`.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn decode_data(text: &str) -> std::result::Result<Bytes, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD.decode(text).map(Bytes::from)
}

/// Keeps a newly chosen record (a duplicate was already added to its first copy).
pub(super) fn take(run: &mut Run<'_>, pending: Pending) {
    if !pending.copies.is_empty() {
        run.chosen.insert(pending.place.clone(), pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(sequence: &str) -> Place {
        Place {
            stream: "s".into(),
            shard_id: "shardId-0".into(),
            sequence_number: sequence.into(),
            sub_sequence_number: None,
        }
    }

    #[test]
    fn places_sort_by_sequence_number_as_a_number() {
        let mut places = [place("100"), place("99"), place("1000")];
        places.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        let sequences: Vec<&str> = places.iter().map(|p| p.sequence_number.as_str()).collect();
        assert_eq!(sequences, ["99", "100", "1000"]);
    }
}
