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
//!
//! The key tables and the user records are the producer's to fill, so nothing here grows with what
//! they claim, only with the record's own size: [`open`] checks an aggregate whole (a key Kinesis would
//! refuse makes it corrupt) and keeps a compact index of it; the reader then makes its user records one
//! at a time as the dispatcher takes them. [`deaggregate`] makes them all at once, for tools and tests.

mod wire;

use bytes::{Buf, Bytes};
use md5::{Digest, Md5};
use prost::Message;
use prost::encoding::{DecodeContext, WireType, check_wire_type, decode_key, decode_varint, skip_field};

/// The four bytes that open every aggregated record.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
/// Length of the MD5 trailer.
const DIGEST_LEN: usize = 16;

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
    /// An explicit hash key that is not a decimal number in 0..2^128 of at most 39 digits.
    #[error("user record {record} has explicit hash key {key:?}, not a decimal number below 2^128")]
    ExplicitHashKey {
        /// Index of the user record.
        record: usize,
        /// The key as found (its first 64 characters and its length when longer).
        key: String,
    },
    /// A partition key longer than Kinesis takes ([`MAX_PARTITION_KEY_CHARS`]).
    #[error("user record {record} names partition key {index}, of {chars} characters (Kinesis takes at most 256)")]
    PartitionKeyTooLong {
        /// Index of the user record.
        record: usize,
        /// The index it names.
        index: u64,
        /// The key's length in characters.
        chars: usize,
    },
    /// A key table entry that is not UTF-8.
    #[error("entry {index} of the {field} is not UTF-8")]
    NotUtf8 {
        /// The table.
        field: &'static str,
        /// The entry.
        index: usize,
    },
    /// Over 4 GiB: no Kinesis record is near this (the reader's offsets are 32-bit).
    #[error("{len} bytes: larger than any Kinesis record")]
    TooLarge {
        /// The record's length.
        len: usize,
    },
    /// A valid aggregate of no user records: delivering it whole keeps the Kinesis record visible.
    #[error("aggregate holds no user records")]
    Empty,
    /// More user records than sub-sequence numbers (cannot happen within Kinesis's record size).
    #[error("more than 2^32 user records")]
    TooManyRecords,
}

/// Unpacks `data`, the payload of one Kinesis record, into every one of its user records at once.
///
/// Pure, and safe on any bytes: the fuzz target's entry point. The reader does not use it (it builds a
/// whole expansion); it uses [`open`] and takes the user records one at a time.
///
/// The checks follow the Java KCL's `AggregatorUtil.deaggregate`: magic bytes, more than 16 bytes after
/// them, MD5 trailer, protobuf (required fields present), key indexes in their tables; and, beyond the
/// KCL, keys Kinesis itself would refuse ([`MAX_PARTITION_KEY_CHARS`], [`MAX_EXPLICIT_HASH_KEY_LEN`]).
pub fn deaggregate(data: &Bytes) -> Deaggregated {
    match open(data) {
        Opened::Plain => Deaggregated::Plain,
        Opened::Aggregate(aggregate) => Deaggregated::Aggregate(aggregate.user_records().collect()),
        Opened::Corrupt(corruption) => Deaggregated::Corrupt(corruption),
    }
}

/// The longest partition key a user record may have, in characters: Kinesis takes 1 to 256 (PutRecord).
/// A longer one can only come from a producer filling the key table itself; it makes the aggregate corrupt.
pub const MAX_PARTITION_KEY_CHARS: usize = 256;

/// The longest explicit hash key, in decimal digits: 2^128 - 1 has 39. Kinesis takes
/// `0|([1-9]\d{0,38})`; leading zeros are taken here as long as the key stays within 39 digits.
pub const MAX_EXPLICIT_HASH_KEY_LEN: usize = 39;

/// What one Kinesis record's payload turned out to be, user records not yet unpacked.
#[derive(Debug, Clone)]
pub enum Opened {
    /// Not an aggregate (no magic bytes): deliver the record as it is.
    Plain,
    /// A valid aggregate of at least one user record: every check is done, taking them cannot fail.
    Aggregate(Aggregate),
    /// Magic bytes, but not a readable aggregate: deliver it as one plain record, count it and log it.
    Corrupt(Corruption),
}

/// Checks `data`, the payload of one Kinesis record, and leaves its user records to be taken one at a
/// time ([`Aggregate::get`], [`Aggregate::user_records`]).
///
/// The memory it holds beyond `data` (which it shares, not copies) is bounded by `data`'s size: one copy
/// of the key tables' text, 4 bytes per key-table entry and 16 bytes per user record (docs/kpl.md).
/// Whether an aggregate is corrupt is decided here, before any user record is handed out, so a corrupt
/// one can still be delivered whole.
pub fn open(data: &Bytes) -> Opened {
    if !data.starts_with(&MAGIC) {
        return Opened::Plain;
    }
    match Aggregate::read(data) {
        Ok(aggregate) => Opened::Aggregate(aggregate),
        Err(corruption) => Opened::Corrupt(corruption),
    }
}

/// A checked aggregate: its key tables and where each user record's data lies, its data unread.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// The protobuf bytes: a slice of the Kinesis record; user-record payloads are slices of it.
    body: Bytes,
    partition_keys: Table,
    explicit_hash_keys: Table,
    /// The value of each explicit hash key table entry (0 for an invalid one, which no slot names).
    explicit_hash_values: Vec<u128>,
    slots: Vec<Slot>,
}

/// One user record of a checked aggregate.
#[derive(Debug, Clone, Copy)]
struct Slot {
    partition_key: u32,
    /// [`NO_EXPLICIT_HASH_KEY`] when it has none.
    explicit_hash_key: u32,
    data_start: u32,
    data_len: u32,
}

const NO_EXPLICIT_HASH_KEY: u32 = u32::MAX;

/// A key table: its entries one after another in one string (copied once from the protobuf), each
/// marked valid or not. 5 bytes per entry beyond the text, where a `Vec<String>` takes 24 and an
/// allocation.
#[derive(Debug, Clone, Default)]
struct Table {
    text: String,
    ends: Vec<u32>,
    valid: Vec<bool>,
}

impl Table {
    fn len(&self) -> usize {
        self.ends.len()
    }

    /// Entry `index`; it exists (slots only name entries that do).
    fn get(&self, index: usize) -> &str {
        let start = if index == 0 { 0 } else { self.ends[index - 1] as usize };
        &self.text[start..self.ends[index] as usize]
    }

    /// The entry a user record names, when the table has it.
    fn position(&self, index: u64) -> Option<usize> {
        usize::try_from(index).ok().filter(|i| *i < self.len())
    }

    /// Appends an entry read from the protobuf (`field` names the table for the error).
    fn push(&mut self, entry: &[u8], field: &'static str, valid: fn(&str) -> bool) -> Result<(), Corruption> {
        let text = std::str::from_utf8(entry).map_err(|_| Corruption::NotUtf8 { field, index: self.len() })?;
        self.text.push_str(text);
        // The text is at most the body's length, checked to fit in 32 bits.
        self.ends.push(self.text.len() as u32);
        self.valid.push(valid(text));
        Ok(())
    }
}

fn partition_key_valid(key: &str) -> bool {
    key.len() <= MAX_PARTITION_KEY_CHARS
        || (key.len() <= 4 * MAX_PARTITION_KEY_CHARS && key.chars().count() <= MAX_PARTITION_KEY_CHARS)
}

fn explicit_hash_key_value(key: &str) -> Option<u128> {
    let digits = !key.is_empty() && key.len() <= MAX_EXPLICIT_HASH_KEY_LEN && key.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| key.parse().ok()).flatten()
}

/// At most this many characters of a foreign string go into an error (and so into a log line).
const SHOWN_CHARS: usize = 64;

/// `text`, cut to [`SHOWN_CHARS`] characters with its length in bytes said when longer.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}... ({} bytes)", &text[..cut], text.len()),
    }
}

/// One user record's fields as the protobuf has them (`data` as a span of the body).
#[derive(Default)]
struct RecordView {
    partition_key_index: Option<u64>,
    explicit_hash_key_index: Option<u64>,
    data: Option<(usize, usize)>,
    tag_without_key: bool,
}

/// The next length-delimited field of `buf`, as a slice of it; errors as prost reports them.
fn length_delimited(wire_type: WireType, buf: &mut Bytes) -> Result<Bytes, prost::DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    // Skipping on a copy reports a length past the end exactly as prost's own decoding does.
    skip_field(WireType::LengthDelimited, 1, &mut buf.clone(), DecodeContext::default())?;
    let len = decode_varint(buf)?;
    // `skip_field` checked that `len` bytes remain.
    Ok(buf.copy_to_bytes(len as usize))
}

/// Decodes one `Record` message (`buf`, found at `offset` in the body) as prost would, without keeping
/// its tags: each is decoded, checked for its required key, and dropped.
fn record_view(mut buf: Bytes, offset: usize) -> Result<RecordView, prost::DecodeError> {
    let len = buf.len();
    let mut view = RecordView::default();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match tag {
            1 | 2 => {
                check_wire_type(WireType::Varint, wire_type)?;
                let value = Some(decode_varint(&mut buf)?);
                if tag == 1 {
                    view.partition_key_index = value;
                } else {
                    view.explicit_hash_key_index = value;
                }
            }
            3 => {
                let data = length_delimited(wire_type, &mut buf)?;
                let end = offset + (len - buf.remaining());
                view.data = Some((end - data.len(), data.len()));
            }
            4 => {
                let tag = wire::Tag::decode(length_delimited(wire_type, &mut buf)?)?;
                view.tag_without_key |= tag.key.is_none();
            }
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
        }
    }
    Ok(view)
}

impl Aggregate {
    /// Checks an aggregate in two passes over its protobuf, keeping no decoded user record: the key
    /// tables (which may come anywhere in the message), then each user record against them.
    fn read(data: &Bytes) -> Result<Self, Corruption> {
        if data.len() <= MAGIC.len() + DIGEST_LEN {
            return Err(Corruption::TooShort { len: data.len() });
        }
        let body_end = data.len() - DIGEST_LEN;
        if u32::try_from(body_end).is_err() {
            return Err(Corruption::TooLarge { len: data.len() });
        }
        // A slice of `data`: user-record payloads are slices of it too, without copying.
        let body = data.slice(MAGIC.len()..body_end);
        if Md5::digest(&body)[..] != data[body_end..] {
            return Err(Corruption::DigestMismatch);
        }
        let mut partition_keys = Table::default();
        let mut explicit_hash_keys = Table::default();
        let mut records = 0usize;
        let mut buf = body.clone();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            match tag {
                1 => partition_keys.push(
                    &length_delimited(wire_type, &mut buf)?,
                    "partition_key_table",
                    partition_key_valid,
                )?,
                2 => explicit_hash_keys.push(
                    &length_delimited(wire_type, &mut buf)?,
                    "explicit_hash_key_table",
                    |key| explicit_hash_key_value(key).is_some(),
                )?,
                3 => {
                    length_delimited(wire_type, &mut buf)?;
                    records += 1;
                }
                _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
            }
        }
        if records == 0 {
            return Err(Corruption::Empty);
        }
        let explicit_hash_values = (0..explicit_hash_keys.len())
            .map(|i| explicit_hash_key_value(explicit_hash_keys.get(i)).unwrap_or(0))
            .collect();
        let mut aggregate = Aggregate {
            body: body.clone(),
            partition_keys,
            explicit_hash_keys,
            explicit_hash_values,
            slots: Vec::new(),
        };
        aggregate.slots.reserve_exact(records);
        // A protobuf error anywhere outranks a user record's fault, as when prost decodes it whole.
        let mut fault = None;
        let mut record = 0usize;
        let mut buf = body.clone();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag != 3 {
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
                continue;
            }
            let field = length_delimited(wire_type, &mut buf)?;
            let offset = body.len() - buf.remaining() - field.len();
            let view = record_view(field, offset)?;
            if fault.is_none() {
                match aggregate.slot(record, view) {
                    Ok(slot) => aggregate.slots.push(slot),
                    Err(corruption) => fault = Some(corruption),
                }
            }
            record += 1;
        }
        match fault {
            Some(corruption) => Err(corruption),
            None => Ok(aggregate),
        }
    }

    /// Checks user record number `record` against the key tables.
    fn slot(&self, record: usize, view: RecordView) -> Result<Slot, Corruption> {
        let missing = |field| Corruption::MissingField { record, field };
        u32::try_from(record).map_err(|_| Corruption::TooManyRecords)?;
        let index = view.partition_key_index.ok_or_else(|| missing("partition_key_index"))?;
        let (data_start, data_len) = view.data.ok_or_else(|| missing("data"))?;
        if view.tag_without_key {
            return Err(missing("tags.key"));
        }
        let table_len = self.partition_keys.len();
        let partition_key =
            self.partition_keys.position(index).ok_or(Corruption::PartitionKeyIndex { record, index, table_len })?;
        if !self.partition_keys.valid[partition_key] {
            let chars = self.partition_keys.get(partition_key).chars().count();
            return Err(Corruption::PartitionKeyTooLong { record, index, chars });
        }
        let explicit_hash_key = match view.explicit_hash_key_index {
            None => NO_EXPLICIT_HASH_KEY,
            Some(index) => {
                let table_len = self.explicit_hash_keys.len();
                let at = self.explicit_hash_keys.position(index).ok_or(Corruption::ExplicitHashKeyIndex {
                    record,
                    index,
                    table_len,
                })?;
                if !self.explicit_hash_keys.valid[at] {
                    return Err(Corruption::ExplicitHashKey { record, key: shown(self.explicit_hash_keys.get(at)) });
                }
                at as u32
            }
        };
        // Offsets within the body, which fits in 32 bits; so do table positions.
        Ok(Slot {
            partition_key: partition_key as u32,
            explicit_hash_key,
            data_start: data_start as u32,
            data_len: data_len as u32,
        })
    }

    /// How many user records it holds (at least one).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always false: an aggregate of no user records is [`Corruption::Empty`].
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The partition key of user record `index`, if it exists.
    pub fn partition_key(&self, index: usize) -> Option<&str> {
        self.slots.get(index).map(|slot| self.partition_keys.get(slot.partition_key as usize))
    }

    /// The hash key Kinesis routes user record `index` by (its explicit hash key, else the MD5 of its
    /// partition key), if it exists.
    pub fn hash_key(&self, index: usize) -> Option<u128> {
        let slot = self.slots.get(index)?;
        Some(match slot.explicit_hash_key {
            NO_EXPLICIT_HASH_KEY => partition_key_hash(self.partition_keys.get(slot.partition_key as usize)),
            at => self.explicit_hash_values[at as usize],
        })
    }

    /// User record `index`, made now: its keys copied (at most [`MAX_PARTITION_KEY_CHARS`] characters and
    /// [`MAX_EXPLICIT_HASH_KEY_LEN`] digits), its data a slice of the Kinesis record.
    pub fn get(&self, index: usize) -> Option<UserRecord> {
        let slot = *self.slots.get(index)?;
        let partition_key = self.partition_keys.get(slot.partition_key as usize);
        let (explicit_hash_key, hash_key) = match slot.explicit_hash_key {
            NO_EXPLICIT_HASH_KEY => (None, partition_key_hash(partition_key)),
            at => (Some(self.explicit_hash_keys.get(at as usize).to_string()), self.explicit_hash_values[at as usize]),
        };
        let start = slot.data_start as usize;
        Some(UserRecord {
            partition_key: partition_key.to_string(),
            explicit_hash_key,
            hash_key,
            data: self.body.slice(start..start + slot.data_len as usize),
            // At most 2^32 slots: `slot` refused more.
            sub_sequence: index as u32,
        })
    }

    /// Every user record in order, each made when the iterator reaches it.
    pub fn user_records(&self) -> impl Iterator<Item = UserRecord> + '_ {
        (0..self.len()).filter_map(|index| self.get(index))
    }

    /// Who made it, judged from the Kinesis record's own partition key (see [`producer`]).
    pub fn producer(&self, outer_partition_key: &str) -> Producer {
        producer_of(outer_partition_key, self.partition_key(0))
    }
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
    producer_of(outer_partition_key, records.first().map(|first| first.partition_key.as_str()))
}

fn producer_of(outer_partition_key: &str, first_partition_key: Option<&str>) -> Producer {
    match first_partition_key {
        Some(first) if outer_partition_key == "a" && first != "a" => Producer::Kpl,
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

#[cfg(test)]
mod proptests;
