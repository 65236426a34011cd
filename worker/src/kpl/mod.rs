//! KPL de-aggregation: unpacks the user records that the Kinesis Producer Library (and AWS's
//! `aws-kinesis-agg` libraries) pack into one Kinesis record, as the Java KCL does.
//!
//! An aggregated Kinesis record is `F3 89 9A C2`, then a protobuf `AggregatedRecord`
//! (`worker/proto/kpl.proto`), then the 16-byte MD5 of the protobuf bytes. Anything else is a plain
//! record. A record that starts with the magic bytes but fails a check is [`Deaggregated::Corrupt`]: the
//! caller delivers it whole, as one plain record, exactly as the KCL does, so nothing is lost.
//!
//! After a split or merge, an aggregate may hold user records that hash outside the shard it was read
//! from; [`for_shard`] decides which of them the reader delivers (docs/kpl.md says why).

mod wire;

use bytes::Bytes;
use md5::{Digest, Md5};
use prost::Message;

/// The four bytes that open every aggregated record.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
/// Length of the MD5 trailer.
const DIGEST_LEN: usize = 16;
/// The longest partition key Kinesis takes, in characters: a longer one in a key table was not written
/// by a producer, and each user record naming it would copy it.
const MAX_PARTITION_KEY_CHARS: usize = 256;
/// The longest explicit hash key: 2^128 - 1 has 39 decimal digits.
const MAX_EXPLICIT_HASH_KEY_LEN: usize = 39;

/// One user record unpacked from an aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// Its own partition key (from the aggregate's key table).
    pub partition_key: String,
    /// Its explicit hash key, when the producer gave one.
    pub explicit_hash_key: Option<String>,
    /// The 128-bit key Kinesis routes it by: the explicit hash key, else the MD5 of the partition key.
    pub hash_key: u128,
    /// Its payload.
    pub data: Bytes,
    /// Its position in the aggregate (0..n-1): with the Kinesis sequence number, its checkpoint.
    pub sub_sequence: u32,
}

/// What one Kinesis record's payload turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deaggregated {
    /// Not an aggregate (no magic bytes): deliver the record as it is.
    Plain,
    /// An aggregate of at least one user record, in the order the producer added them.
    Aggregate(Vec<UserRecord>),
    /// Magic bytes, but not a readable aggregate: deliver it as one plain record, count it and log it.
    Corrupt(Corruption),
}

/// Why a record that opens with the magic bytes is not a readable aggregate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    /// No room for a protobuf body before the MD5 trailer (the KCL reads such a record as plain too).
    #[error("{len} bytes: too short for magic, protobuf and a 16-byte MD5")]
    TooShort {
        /// The record's length.
        len: usize,
    },
    /// The trailer is not the MD5 of the protobuf bytes.
    #[error("MD5 trailer does not match the protobuf bytes")]
    DigestMismatch,
    /// The protobuf bytes do not decode as an `AggregatedRecord`.
    #[error("unreadable protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// A field the format marks `required` is absent.
    #[error("user record {record} lacks the required field {field}")]
    MissingField {
        /// Index of the user record.
        record: usize,
        /// The missing field.
        field: &'static str,
    },
    /// A user record names a partition key the table does not have.
    #[error("user record {record} names partition key {index} of a table of {table_len}")]
    PartitionKeyIndex {
        /// Index of the user record.
        record: usize,
        /// The index it names.
        index: u64,
        /// Entries in the partition key table.
        table_len: usize,
    },
    /// A user record names an explicit hash key the table does not have.
    #[error("user record {record} names explicit hash key {index} of a table of {table_len}")]
    ExplicitHashKeyIndex {
        /// Index of the user record.
        record: usize,
        /// The index it names.
        index: u64,
        /// Entries in the explicit hash key table.
        table_len: usize,
    },
    /// An explicit hash key that is not a decimal number in 0..2^128.
    #[error("user record {record} has explicit hash key {key:?}, not a decimal number below 2^128")]
    ExplicitHashKey {
        /// Index of the user record.
        record: usize,
        /// The key as found.
        key: String,
    },
    /// A partition key longer than Kinesis takes (256 characters).
    #[error("partition key {index} of the table has {chars} characters; Kinesis takes at most 256")]
    PartitionKeyTooLong {
        /// Its index in the partition key table.
        index: usize,
        /// Its length in characters.
        chars: usize,
    },
    /// A valid aggregate of no user records: delivering it whole keeps the Kinesis record visible.
    #[error("aggregate holds no user records")]
    Empty,
    /// More user records than sub-sequence numbers (cannot happen within Kinesis's record size).
    #[error("more than 2^32 user records")]
    TooManyRecords,
}

/// Unpacks `data`, the payload of one Kinesis record.
///
/// The checks follow the Java KCL's `AggregatorUtil.deaggregate`: magic bytes, more than 16 bytes after
/// them, MD5 trailer, protobuf (required fields present), key indexes in their tables.
pub fn deaggregate(data: &Bytes) -> Deaggregated {
    if !data.starts_with(&MAGIC) {
        return Deaggregated::Plain;
    }
    match unpack(data) {
        Ok(records) => Deaggregated::Aggregate(records),
        Err(corruption) => Deaggregated::Corrupt(corruption),
    }
}

fn unpack(data: &Bytes) -> Result<Vec<UserRecord>, Corruption> {
    if data.len() <= MAGIC.len() + DIGEST_LEN {
        return Err(Corruption::TooShort { len: data.len() });
    }
    let body_end = data.len() - DIGEST_LEN;
    // A slice of `data`: prost then hands out user-record payloads as slices of it too, without copying.
    let body = data.slice(MAGIC.len()..body_end);
    if Md5::digest(&body)[..] != data[body_end..] {
        return Err(Corruption::DigestMismatch);
    }
    let message = wire::AggregatedRecord::decode(body)?;
    if message.records.is_empty() {
        return Err(Corruption::Empty);
    }
    let wire::AggregatedRecord { partition_key_table, explicit_hash_key_table, records } = message;
    let too_long = |key: &&String| key.len() > MAX_PARTITION_KEY_CHARS && key.chars().count() > MAX_PARTITION_KEY_CHARS;
    if let Some((index, key)) = partition_key_table.iter().enumerate().find(|(_, key)| too_long(key)) {
        return Err(Corruption::PartitionKeyTooLong { index, chars: key.chars().count() });
    }
    records
        .into_iter()
        .enumerate()
        .map(|(record, r)| {
            let missing = |field| Corruption::MissingField { record, field };
            let sub_sequence = u32::try_from(record).map_err(|_| Corruption::TooManyRecords)?;
            let index = r.partition_key_index.ok_or_else(|| missing("partition_key_index"))?;
            let data = r.data.ok_or_else(|| missing("data"))?;
            if r.tags.iter().any(|tag| tag.key.is_none()) {
                return Err(missing("tags.key"));
            }
            let partition_key = table_entry(&partition_key_table, index)
                .ok_or(Corruption::PartitionKeyIndex { record, index, table_len: partition_key_table.len() })?
                .clone();
            let (explicit_hash_key, hash_key) = match r.explicit_hash_key_index {
                None => (None, partition_key_hash(&partition_key)),
                Some(index) => {
                    let key = table_entry(&explicit_hash_key_table, index).ok_or(Corruption::ExplicitHashKeyIndex {
                        record,
                        index,
                        table_len: explicit_hash_key_table.len(),
                    })?;
                    // Leading zeros parse too: the length bounds what each user record copies (and logs).
                    let hash_key =
                        key.parse().ok().filter(|_| key.len() <= MAX_EXPLICIT_HASH_KEY_LEN).ok_or_else(|| {
                            Corruption::ExplicitHashKey {
                                record,
                                key: key.chars().take(MAX_EXPLICIT_HASH_KEY_LEN + 1).collect(),
                            }
                        })?;
                    (Some(key.clone()), hash_key)
                }
            };
            Ok(UserRecord { partition_key, explicit_hash_key, hash_key, data, sub_sequence })
        })
        .collect()
}

fn table_entry(table: &[String], index: u64) -> Option<&String> {
    usize::try_from(index).ok().and_then(|i| table.get(i))
}

/// Packs user records (partition key, explicit hash key, data) into one aggregated record's payload,
/// with one key-table entry per distinct key: for tests and benchmarks (producers use the KPL or
/// `aws-kinesis-agg`).
pub fn aggregate<'a>(records: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a [u8])>) -> Bytes {
    fn index(table: &mut Vec<String>, key: &str) -> u64 {
        let at = table.iter().position(|k| k == key).unwrap_or_else(|| {
            table.push(key.to_string());
            table.len() - 1
        });
        at as u64
    }
    let mut message = wire::AggregatedRecord::default();
    for (partition_key, explicit_hash_key, data) in records {
        let partition_key_index = Some(index(&mut message.partition_key_table, partition_key));
        let explicit_hash_key_index = explicit_hash_key.map(|k| index(&mut message.explicit_hash_key_table, k));
        message.records.push(wire::Record {
            partition_key_index,
            explicit_hash_key_index,
            data: Some(Bytes::copy_from_slice(data)),
            tags: Vec::new(),
        });
    }
    let body = message.encode_to_vec();
    let mut out = Vec::with_capacity(MAGIC.len() + body.len() + DIGEST_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&body);
    out.extend_from_slice(&Md5::digest(&body));
    Bytes::from(out)
}

/// The hash key Kinesis gives a partition key: its MD5 read as a big-endian 128-bit number.
pub fn partition_key_hash(partition_key: &str) -> u128 {
    u128::from_be_bytes(Md5::digest(partition_key.as_bytes()).into())
}

/// A shard's hash key range, both ends included (as ListShards reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashKeyRange {
    /// The smallest hash key of the shard.
    pub start: u128,
    /// The largest hash key of the shard.
    pub end: u128,
}

/// A hash key range whose ends are not decimal numbers in 0..2^128, or whose start is past its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid hash key range {start:?}..={end:?}")]
pub struct InvalidHashKeyRange {
    /// The starting hash key as given.
    pub start: String,
    /// The ending hash key as given.
    pub end: String,
}

impl HashKeyRange {
    /// Every hash key: a stream of one shard.
    pub const FULL: HashKeyRange = HashKeyRange { start: 0, end: u128::MAX };

    /// Parses the decimal `StartingHashKey` and `EndingHashKey` of a shard.
    pub fn parse(start: &str, end: &str) -> Result<Self, InvalidHashKeyRange> {
        let invalid = || InvalidHashKeyRange { start: start.to_string(), end: end.to_string() };
        let range =
            HashKeyRange { start: start.parse().map_err(|_| invalid())?, end: end.parse().map_err(|_| invalid())? };
        if range.start > range.end {
            return Err(invalid());
        }
        Ok(range)
    }

    /// Whether `hash_key` belongs to the shard.
    pub fn contains(&self, hash_key: u128) -> bool {
        (self.start..=self.end).contains(&hash_key)
    }
}

/// The sub-sequence numbers of the user records that hash outside `range`.
pub fn outside_range(records: &[UserRecord], range: HashKeyRange) -> Vec<u32> {
    records.iter().filter(|r| !range.contains(r.hash_key)).map(|r| r.sub_sequence).collect()
}

/// Who made an aggregate, as far as the Kinesis record shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Producer {
    /// The KPL: it puts again every user record that landed on a shard not covering its hash key.
    Kpl,
    /// Any other aggregator (`aws-kinesis-agg`, or the KPL's case we cannot tell apart): it counts every
    /// user record delivered once the put succeeds.
    Other,
}

/// Tells a KPL aggregate from another aggregator's by the Kinesis record's own partition key.
///
/// The KPL puts every aggregate under the one-byte partition key `"a"`, routing it with the first user
/// record's hash as explicit hash key (amazon-kinesis-producer `KinesisRecord::partition_key`);
/// `aws-kinesis-agg` puts it under the first user record's partition key. When the first user record's
/// key is itself `"a"` the two look alike, and we answer [`Producer::Other`]: delivering a record
/// twice is allowed, losing one is not.
pub fn producer(outer_partition_key: &str, records: &[UserRecord]) -> Producer {
    match records.first() {
        Some(first) if outer_partition_key == "a" && first.partition_key != "a" => Producer::Kpl,
        _ => Producer::Other,
    }
}

/// An aggregate's user records sorted by what the reader of one shard does with them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ForShard {
    /// Delivered to the processor, in order.
    pub deliver: Vec<UserRecord>,
    /// Left out: user records of a KPL aggregate that hash outside the shard, which the KPL has put
    /// again to the right shard. A checkpoint counts them as done.
    pub skip: Vec<UserRecord>,
}

/// Decides, for an aggregate read from a shard covering `range`, which user records to deliver.
///
/// Every user record inside the range is delivered. One outside it is skipped only when the KPL made
/// the aggregate (the KPL puts it again, to the shard that covers it, so delivering it here would repeat
/// it out of order); any other producer considers it delivered, so it is delivered here, its only copy.
/// The Java KCL instead drops the whole aggregate as soon as one user record hashes outside (docs/kpl.md).
pub fn for_shard(outer_partition_key: &str, records: Vec<UserRecord>, range: HashKeyRange) -> ForShard {
    if producer(outer_partition_key, &records) == Producer::Other {
        return ForShard { deliver: records, skip: Vec::new() };
    }
    let (deliver, skip) = records.into_iter().partition(|r| range.contains(r.hash_key));
    ForShard { deliver, skip }
}

#[cfg(test)]
mod tests;
