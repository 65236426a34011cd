//! Property tests: aggregate ⇄ user records round trips for any key tables and user records within
//! Kinesis's limits (tables in any order, interleaved, with entries no record names), keys over the
//! limits refused, and for any bytes after the magic: no panic, exactly what a whole prost decoding of
//! the protobuf allows (so never more user records than the protobuf holds), the lazy view ([`open`])
//! and the whole one ([`deaggregate`]) agreeing.

use proptest::collection::vec;
use proptest::prelude::*;
use prost::encoding::{WireType, encode_key, encode_varint};

use super::*;

/// Magic, `body`, and the MD5 of `body`.
fn framed(body: &[u8]) -> Bytes {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(body);
    out.extend_from_slice(&Md5::digest(body));
    Bytes::from(out)
}

/// The reading before the lazy one, kept as the oracle: prost decodes the whole message, then each user
/// record is checked, with the key limits added. `None` for a corrupt aggregate.
fn reference(data: &Bytes) -> Option<Vec<UserRecord>> {
    if data.len() <= MAGIC.len() + DIGEST_LEN {
        return None;
    }
    let body_end = data.len() - DIGEST_LEN;
    let body = data.slice(MAGIC.len()..body_end);
    if Md5::digest(&body)[..] != data[body_end..] {
        return None;
    }
    let message = wire::AggregatedRecord::decode(body).ok()?;
    if message.records.is_empty() {
        return None;
    }
    let entry = |table: &[String], index: Option<u64>| index.and_then(|i| table.get(usize::try_from(i).ok()?).cloned());
    let mut out = Vec::new();
    for (n, r) in message.records.iter().enumerate() {
        let partition_key = entry(&message.partition_key_table, r.partition_key_index)?;
        let data = r.data.clone()?;
        if r.tags.iter().any(|t| t.key.is_none()) || partition_key.chars().count() > MAX_PARTITION_KEY_CHARS {
            return None;
        }
        let (explicit_hash_key, hash_key) = match r.explicit_hash_key_index {
            None => (None, partition_key_hash(&partition_key)),
            Some(i) => {
                let key = entry(&message.explicit_hash_key_table, Some(i))?;
                let digits = key.len() <= MAX_EXPLICIT_HASH_KEY_LEN && key.bytes().all(|b| b.is_ascii_digit());
                let value: u128 = if digits { key.parse().ok()? } else { return None };
                (Some(key), value)
            }
        };
        out.push(UserRecord { partition_key, explicit_hash_key, hash_key, data, sub_sequence: n as u32 });
    }
    Some(out)
}

/// `deaggregate` and `open` agree with each other and with [`reference`]; returns the user records.
fn check_against_reference(data: &Bytes) -> Result<Option<Vec<UserRecord>>, TestCaseError> {
    let whole = deaggregate(data);
    let expected = reference(data);
    match (&whole, &expected) {
        (Deaggregated::Aggregate(got), Some(want)) => prop_assert_eq!(got, want),
        (Deaggregated::Corrupt(_), None) => {}
        (Deaggregated::Plain, _) => prop_assert!(!data.starts_with(&MAGIC)),
        (got, want) => return Err(TestCaseError::fail(format!("deaggregate gave {got:?}, the reference {want:?}"))),
    }
    match (open(data), &whole) {
        (Opened::Aggregate(aggregate), Deaggregated::Aggregate(records)) => {
            prop_assert_eq!(aggregate.len(), records.len());
            prop_assert!(!aggregate.is_empty());
            for (i, record) in records.iter().enumerate() {
                prop_assert_eq!(aggregate.get(i), Some(record.clone()));
                prop_assert_eq!(aggregate.hash_key(i), Some(record.hash_key));
                prop_assert_eq!(aggregate.partition_key(i), Some(record.partition_key.as_str()));
            }
            prop_assert!(aggregate.get(records.len()).is_none());
            for outer in ["a", "other"] {
                prop_assert_eq!(aggregate.producer(outer), producer(outer, records));
            }
        }
        (Opened::Corrupt(a), Deaggregated::Corrupt(b)) => prop_assert_eq!(&a, b),
        (Opened::Plain, Deaggregated::Plain) => {}
        (lazy, whole) => return Err(TestCaseError::fail(format!("open gave {lazy:?}, deaggregate {whole:?}"))),
    }
    Ok(match whole {
        Deaggregated::Aggregate(records) => Some(records),
        _ => None,
    })
}

/// A partition key Kinesis takes: 1 to 256 characters, any of them (up to 1 KiB of UTF-8).
fn partition_key() -> impl Strategy<Value = String> {
    prop_oneof![
        vec(any::<char>(), 1..=MAX_PARTITION_KEY_CHARS).prop_map(|c| c.into_iter().collect()),
        vec(prop::sample::select(vec!['a', 'b', 'é', '𝄞']), 1..=3).prop_map(|c| c.into_iter().collect()),
        Just("𝄞".repeat(MAX_PARTITION_KEY_CHARS)),
    ]
}

/// An explicit hash key as Kinesis takes it.
fn explicit_hash_key() -> impl Strategy<Value = String> {
    prop_oneof![any::<u128>(), Just(0u128), Just(u128::MAX)].prop_map(|k| k.to_string())
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..24)
}

/// The bytes of one top-level field of an `AggregatedRecord`, as prost writes it.
fn field_bytes(message: wire::AggregatedRecord) -> Vec<u8> {
    message.encode_to_vec()
}

/// One protobuf field with any tag among those the format knows (and one more), any wire type and
/// any payload: a length-delimited payload may itself be a sequence of such fields (a user record or
/// a tag, well formed or not).
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Fixed32(u32),
    Fixed64(u32),
    Bytes(u32, Vec<u8>),
    Nested(u32, Vec<Field>),
    /// A tag number with a wire type that never opens a field (6, 7) or closes a group unopened.
    Broken(u8),
}

fn field(depth: u32) -> BoxedStrategy<Field> {
    let tag = 1u32..=5;
    let leaf = prop_oneof![
        (tag.clone(), prop_oneof![0u64..4, any::<u64>()]).prop_map(|(t, v)| Field::Varint(t, v)),
        tag.clone().prop_map(Field::Fixed32),
        tag.clone().prop_map(Field::Fixed64),
        (tag.clone(), prop_oneof![vec(any::<u8>(), 0..8), Just(b"k".to_vec()), Just(b"7".to_vec())])
            .prop_map(|(t, v)| Field::Bytes(t, v)),
        any::<u8>().prop_map(Field::Broken),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        3 => leaf,
        2 => (tag, vec(field(depth - 1), 0..6)).prop_map(|(t, f)| Field::Nested(t, f)),
    ]
    .boxed()
}

fn encode_fields(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        match f {
            Field::Varint(tag, value) => {
                encode_key(*tag, WireType::Varint, out);
                encode_varint(*value, out);
            }
            Field::Fixed32(tag) => {
                encode_key(*tag, WireType::ThirtyTwoBit, out);
                out.extend_from_slice(&[1, 2, 3, 4]);
            }
            Field::Fixed64(tag) => {
                encode_key(*tag, WireType::SixtyFourBit, out);
                out.extend_from_slice(&[1; 8]);
            }
            Field::Bytes(tag, bytes) => {
                encode_key(*tag, WireType::LengthDelimited, out);
                encode_varint(bytes.len() as u64, out);
                out.extend_from_slice(bytes);
            }
            Field::Nested(tag, inner) => {
                let mut body = Vec::new();
                encode_fields(inner, &mut body);
                encode_key(*tag, WireType::LengthDelimited, out);
                encode_varint(body.len() as u64, out);
                out.extend_from_slice(&body);
            }
            Field::Broken(byte) => out.push(byte | 0x06),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// What `aggregate` packs, `deaggregate` and `open` give back: keys, explicit hash keys, data, order.
    #[test]
    fn packed_user_records_come_back_as_given(
        given in vec((partition_key(), proptest::option::of(explicit_hash_key()), payload()), 1..48)
    ) {
        let packed = aggregate(given.iter().map(|(k, e, d)| (k.as_str(), e.as_deref(), &d[..])));
        let records = check_against_reference(&packed)?.expect("an aggregate");
        prop_assert_eq!(records.len(), given.len());
        for (i, (record, (key, explicit, data))) in records.iter().zip(&given).enumerate() {
            prop_assert_eq!(&record.partition_key, key);
            prop_assert_eq!(&record.explicit_hash_key, explicit);
            prop_assert_eq!(&record.data[..], &data[..]);
            prop_assert_eq!(record.sub_sequence as usize, i);
            let hash = explicit.as_ref().map_or_else(|| partition_key_hash(key), |e| e.parse().expect("u128"));
            prop_assert_eq!(record.hash_key, hash);
        }
    }

    /// Key tables of any content (duplicates, entries no record names) and top-level fields in any
    /// interleaving: each user record gets the entries its indexes name.
    #[test]
    fn interleaved_tables_resolve_by_index(
        keys in vec(partition_key(), 1..12),
        hash_keys in vec(explicit_hash_key(), 0..6),
        records in vec((any::<usize>(), proptest::option::of(any::<usize>()), payload()), 1..24),
        order in vec(any::<u8>(), 0..64),
    ) {
        let mut fields: [Vec<Vec<u8>>; 3] = Default::default();
        for key in &keys {
            fields[0].push(field_bytes(wire::AggregatedRecord { partition_key_table: vec![key.clone()], ..Default::default() }));
        }
        for key in &hash_keys {
            fields[1].push(field_bytes(wire::AggregatedRecord { explicit_hash_key_table: vec![key.clone()], ..Default::default() }));
        }
        let mut expected = Vec::new();
        for (i, (k, e, data)) in records.iter().enumerate() {
            let k = k % keys.len();
            let e = e.filter(|_| !hash_keys.is_empty()).map(|e| e % hash_keys.len());
            let record = wire::Record {
                partition_key_index: Some(k as u64),
                explicit_hash_key_index: e.map(|e| e as u64),
                data: Some(Bytes::copy_from_slice(data)),
                tags: Vec::new(),
            };
            fields[2].push(field_bytes(wire::AggregatedRecord { records: vec![record], ..Default::default() }));
            let explicit = e.map(|e| hash_keys[e].clone());
            let hash_key = explicit.as_ref().map_or_else(|| partition_key_hash(&keys[k]), |e| e.parse().expect("u128"));
            expected.push(UserRecord {
                partition_key: keys[k].clone(),
                explicit_hash_key: explicit,
                hash_key,
                data: Bytes::copy_from_slice(data),
                sub_sequence: i as u32,
            });
        }
        // Each table keeps its own order; `order` picks which table's next entry comes next.
        let mut body = Vec::new();
        let mut next = [0usize; 3];
        let mut picks = order.iter().map(|p| usize::from(*p) % 3);
        while next.iter().zip(&fields).any(|(n, f)| *n < f.len()) {
            let pick = picks.next().unwrap_or(0);
            let pick = (0..3).map(|d| (pick + d) % 3).find(|t| next[*t] < fields[*t].len()).expect("one left");
            body.extend_from_slice(&fields[pick][next[pick]]);
            next[pick] += 1;
        }
        let got = check_against_reference(&framed(&body))?.expect("an aggregate");
        prop_assert_eq!(got, expected);
    }

    /// A user record naming a partition key over 256 characters, or an explicit hash key that is not
    /// a decimal of at most 39 digits below 2^128, makes the aggregate corrupt; unnamed, such entries
    /// are harmless.
    #[test]
    fn keys_kinesis_would_refuse_make_the_aggregate_corrupt(
        long in (MAX_PARTITION_KEY_CHARS + 1..2000).prop_map(|n| "k".repeat(n)),
        bad_hash in prop_oneof![
            Just(String::new()), Just("+5".to_string()), Just("-1".to_string()),
            Just("340282366920938463463374607431768211456".to_string()),
            (40usize..200).prop_map(|n| "0".repeat(n)), "[0-9a-z ]{1,50}".prop_filter("not a valid key", |s| explicit_hash_key_value(s).is_none()),
        ],
        named in any::<bool>(),
    ) {
        let base = |records| wire::AggregatedRecord {
            partition_key_table: vec!["ok".into(), long.clone()],
            explicit_hash_key_table: vec!["7".into(), bad_hash.clone()],
            records,
        };
        let user = |k: u64, e: Option<u64>| wire::Record {
            partition_key_index: Some(k), explicit_hash_key_index: e, data: Some(Bytes::from_static(b"x")), tags: Vec::new(),
        };
        let long_named = framed(&base(vec![user(0, Some(0)), user(u64::from(named), None)]).encode_to_vec());
        let bad_named = framed(&base(vec![user(0, None), user(0, Some(u64::from(named)))]).encode_to_vec());
        for data in [long_named, bad_named] {
            let records = check_against_reference(&data)?;
            prop_assert_eq!(records.is_none(), named);
        }
        let Deaggregated::Corrupt(c) = deaggregate(&framed(&base(vec![user(1, None)]).encode_to_vec())) else {
            return Err(TestCaseError::fail("a long key named: corrupt"));
        };
        prop_assert_eq!(c, Corruption::PartitionKeyTooLong { record: 0, index: 1, chars: long.len() });
    }

    /// Any bytes after the magic, with a right or wrong MD5: no panic, and exactly what prost's whole
    /// decoding allows.
    #[test]
    fn any_bytes_after_the_magic(body in vec(any::<u8>(), 0..512), right_md5 in any::<bool>()) {
        let data = if right_md5 {
            framed(&body)
        } else {
            let mut raw = MAGIC.to_vec();
            raw.extend_from_slice(&body);
            Bytes::from(raw)
        };
        check_against_reference(&data)?;
    }

    /// Protobuf-shaped garbage (fields of the format's tags with any wire type, records and tags nested
    /// in them, well formed or not) under a right MD5: as prost's whole decoding allows, never more user
    /// records than the message holds.
    #[test]
    fn protobuf_shaped_garbage(fields in vec(field(2), 0..24)) {
        let mut body = Vec::new();
        encode_fields(&fields, &mut body);
        let data = framed(&body);
        if let Some(records) = check_against_reference(&data)? {
            let held = wire::AggregatedRecord::decode(&body[..]).map(|m| m.records.len()).unwrap_or(0);
            prop_assert!(records.len() <= held);
        }
    }
}
