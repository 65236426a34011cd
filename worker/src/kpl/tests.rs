//! Unit tests on aggregates made by AWS's `aws-kinesis-agg` 1.2.3 (committed under
//! worker/tests/fixtures/kpl/; worker/tests/kpl.rs remakes them with the library and compares), and on
//! broken ones derived from them.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use super::*;

/// One fixture: the user records given to the library, and the aggregates it made of them.
struct Fixture {
    input: Vec<(String, Option<String>, Vec<u8>)>,
    aggregates: Vec<(String, Bytes, usize)>,
}

fn fixture(text: &str) -> Fixture {
    let json: Value = serde_json::from_str(text).expect("fixture json");
    let b64 = |v: &Value| STANDARD.decode(v.as_str().expect("base64 string")).expect("base64");
    let input = json["input"]["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            let key = r["partition_key"].as_str().expect("key").to_string();
            (key, r.get("explicit_hash_key").and_then(Value::as_str).map(str::to_string), b64(&r["data_b64"]))
        })
        .collect();
    let aggregates = json["output"]["aggregates"]
        .as_array()
        .expect("aggregates")
        .iter()
        .map(|a| {
            let key = a["partition_key"].as_str().expect("key").to_string();
            let count = a["user_records"].as_u64().expect("count") as usize;
            (key, Bytes::from(b64(&a["data_b64"])), count)
        })
        .collect();
    Fixture { input, aggregates }
}

const SEVERAL_KEYS: &str = include_str!("../../tests/fixtures/kpl/several_keys.json");
const EXPLICIT_HASH_KEYS: &str = include_str!("../../tests/fixtures/kpl/explicit_hash_keys.json");
const EMPTY_DATA: &str = include_str!("../../tests/fixtures/kpl/empty_data.json");
const ONE_RECORD: &str = include_str!("../../tests/fixtures/kpl/one_record.json");
const THOUSAND_RECORDS: &str = include_str!("../../tests/fixtures/kpl/thousand_records.json");
const SPLIT_BY_SIZE: &str = include_str!("../../tests/fixtures/kpl/split_by_size.json");

/// Decodes every aggregate of the fixture and checks it yields exactly the library's input, in order,
/// sub-sequences counting from 0 in each aggregate.
fn assert_round_trip(text: &str) -> Vec<Vec<UserRecord>> {
    let fixture = fixture(text);
    let mut expected = fixture.input.iter();
    let mut decoded = Vec::new();
    for (_, data, count) in &fixture.aggregates {
        let Deaggregated::Aggregate(records) = deaggregate(data) else {
            panic!("not an aggregate: {:?}", deaggregate(data));
        };
        assert_eq!(records.len(), *count);
        for (n, record) in records.iter().enumerate() {
            let (key, explicit, payload) = expected.next().expect("more user records than given");
            assert_eq!(&record.partition_key, key);
            assert_eq!(&record.explicit_hash_key, explicit);
            assert_eq!(&record.data[..], &payload[..]);
            assert_eq!(record.sub_sequence as usize, n);
            let hash = match explicit {
                Some(k) => k.parse().expect("explicit hash key"),
                None => partition_key_hash(key),
            };
            assert_eq!(record.hash_key, hash);
        }
        decoded.push(records);
    }
    assert!(expected.next().is_none(), "fewer user records than given");
    decoded
}

#[test]
fn several_keys_share_the_key_table() {
    let decoded = assert_round_trip(SEVERAL_KEYS);
    assert_eq!(decoded.len(), 1);
    assert_eq!(decoded[0].len(), 8);
    assert_eq!(&decoded[0][7].data[..], b"\xff\x00\xfe binary");
    assert_eq!(decoded[0][5].partition_key, "δέλτα");
}

#[test]
fn explicit_hash_keys_are_kept_and_route() {
    let decoded = assert_round_trip(EXPLICIT_HASH_KEYS);
    let hashes: Vec<u128> = decoded[0].iter().map(|r| r.hash_key).collect();
    assert_eq!(hashes[0], 0);
    assert_eq!(hashes[2], u128::MAX);
    assert_eq!(hashes[3], 1 << 127);
    assert_eq!(decoded[0][1].explicit_hash_key, None);
}

#[test]
fn empty_data_is_an_empty_payload() {
    let decoded = assert_round_trip(EMPTY_DATA);
    assert!(decoded[0].iter().all(|r| r.data.is_empty()));
    assert_eq!(decoded[0].len(), 3);
}

#[test]
fn one_record_aggregate() {
    let decoded = assert_round_trip(ONE_RECORD);
    assert_eq!(
        decoded,
        vec![vec![UserRecord {
            partition_key: "solo".into(),
            explicit_hash_key: None,
            hash_key: partition_key_hash("solo"),
            data: Bytes::from_static(b"only one"),
            sub_sequence: 0,
        }]]
    );
}

#[test]
fn thousand_records_in_order() {
    let decoded = assert_round_trip(THOUSAND_RECORDS);
    assert_eq!(decoded.iter().map(Vec::len).sum::<usize>(), 1000);
}

#[test]
fn sub_sequences_restart_in_each_aggregate() {
    let decoded = assert_round_trip(SPLIT_BY_SIZE);
    assert!(decoded.len() > 1, "the library split 30 records at 200 bytes");
    assert!(decoded.iter().all(|records| records[0].sub_sequence == 0));
}

#[test]
fn user_record_payloads_are_slices_of_the_kinesis_record() {
    let fixture = fixture(SEVERAL_KEYS);
    let data = &fixture.aggregates[0].1;
    let Deaggregated::Aggregate(records) = deaggregate(data) else { panic!("not an aggregate") };
    let whole = data.as_ptr_range();
    for record in records.iter().filter(|r| !r.data.is_empty()) {
        assert!(whole.contains(&record.data.as_ptr()), "payload copied");
    }
}

#[test]
fn partition_key_hash_is_big_endian_md5() {
    // int.from_bytes(hashlib.md5(key.encode()).digest(), "big"), computed in Python.
    assert_eq!(partition_key_hash("alpha"), 58606826522850340945736240254012750329);
    assert_eq!(partition_key_hash(""), 281949768489412648962353822266799178366);
    assert_eq!(partition_key_hash("δέλτα"), 272737687314500582509573530068755163201);
}

#[test]
fn non_aggregates_are_plain() {
    for data in [&b""[..], b"hello", b"\xf3\x89\x9a", b"\xf3\x89\x9a\xc3 not quite", b"{\"json\":1}"] {
        assert_eq!(deaggregate(&Bytes::copy_from_slice(data)), Deaggregated::Plain, "{data:?}");
    }
}

fn several_keys_aggregate() -> Bytes {
    fixture(SEVERAL_KEYS).aggregates[0].1.clone()
}

/// Magic, `body`, and the MD5 of `body`: a well-framed aggregate whatever the body holds.
fn framed(body: &[u8]) -> Bytes {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(body);
    out.extend_from_slice(&Md5::digest(body));
    Bytes::from(out)
}

fn corruption(data: &Bytes) -> Corruption {
    match deaggregate(data) {
        Deaggregated::Corrupt(c) => c,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn wrong_md5_is_corrupt() {
    let good = several_keys_aggregate();
    let mut trailer_flipped = good.to_vec();
    *trailer_flipped.last_mut().expect("byte") ^= 1;
    assert_eq!(corruption(&Bytes::from(trailer_flipped)), Corruption::DigestMismatch);
    let mut body_flipped = good.to_vec();
    body_flipped[10] ^= 0x40;
    assert_eq!(corruption(&Bytes::from(body_flipped)), Corruption::DigestMismatch);
    let cut = good.slice(..good.len() - 5);
    assert_eq!(corruption(&cut), Corruption::DigestMismatch);
}

#[test]
fn truncated_protobuf_is_corrupt() {
    let good = several_keys_aggregate();
    let body = &good[MAGIC.len()..good.len() - DIGEST_LEN];
    for cut in [body.len() - 1, body.len() / 2, 3] {
        // A correct MD5 over a cut body: the protobuf itself must be refused.
        let c = corruption(&framed(&body[..cut]));
        assert!(matches!(c, Corruption::Protobuf(_)), "cut at {cut}: {c:?}");
    }
}

#[test]
fn too_short_for_a_body_is_corrupt() {
    assert_eq!(corruption(&Bytes::from_static(&MAGIC)), Corruption::TooShort { len: 4 });
    // The MD5 of an empty body, framed: the KCL reads this as plain as well (nothing after the digest).
    assert_eq!(corruption(&framed(b"")), Corruption::TooShort { len: 20 });
}

fn encode(message: &wire::AggregatedRecord) -> Bytes {
    framed(&message.encode_to_vec())
}

fn user(partition_key_index: u64, explicit_hash_key_index: Option<u64>) -> wire::Record {
    wire::Record {
        partition_key_index: Some(partition_key_index),
        explicit_hash_key_index,
        data: Some(Bytes::from_static(b"x")),
        tags: Vec::new(),
    }
}

#[test]
fn bad_indexes_are_corrupt() {
    let keys = vec!["k".to_string()];
    let message = wire::AggregatedRecord {
        partition_key_table: keys.clone(),
        explicit_hash_key_table: vec!["7".into()],
        records: vec![user(0, None), user(1, None)],
    };
    assert_eq!(corruption(&encode(&message)), Corruption::PartitionKeyIndex { record: 1, index: 1, table_len: 1 });
    let message = wire::AggregatedRecord {
        partition_key_table: keys.clone(),
        explicit_hash_key_table: vec!["7".into()],
        records: vec![user(0, Some(0)), user(0, Some(u64::MAX))],
    };
    assert_eq!(
        corruption(&encode(&message)),
        Corruption::ExplicitHashKeyIndex { record: 1, index: u64::MAX, table_len: 1 }
    );
    for key in ["-1", "340282366920938463463374607431768211456", "seven", ""] {
        let message = wire::AggregatedRecord {
            partition_key_table: keys.clone(),
            explicit_hash_key_table: vec![key.into()],
            records: vec![user(0, Some(0))],
        };
        assert_eq!(corruption(&encode(&message)), Corruption::ExplicitHashKey { record: 0, key: key.into() });
    }
}

#[test]
fn missing_required_fields_are_corrupt() {
    let keys = vec!["k".to_string()];
    let mut no_index = user(0, None);
    no_index.partition_key_index = None;
    let mut no_data = user(0, None);
    no_data.data = None;
    let mut tag_without_key = user(0, None);
    tag_without_key.tags.push(wire::Tag { key: None, value: Some("v".into()) });
    for (record, field) in [(no_index, "partition_key_index"), (no_data, "data"), (tag_without_key, "tags.key")] {
        let message = wire::AggregatedRecord {
            partition_key_table: keys.clone(),
            explicit_hash_key_table: Vec::new(),
            records: vec![user(0, None), record],
        };
        assert_eq!(corruption(&encode(&message)), Corruption::MissingField { record: 1, field });
    }
}

#[test]
fn tags_are_read_and_ignored() {
    let mut tagged = user(0, None);
    tagged.tags.push(wire::Tag { key: Some("t".into()), value: None });
    let message = wire::AggregatedRecord {
        partition_key_table: vec!["k".into()],
        explicit_hash_key_table: Vec::new(),
        records: vec![tagged],
    };
    let Deaggregated::Aggregate(records) = deaggregate(&encode(&message)) else { panic!("not an aggregate") };
    assert_eq!(records.len(), 1);
}

#[test]
fn aggregate_of_no_user_records_is_corrupt() {
    let message = wire::AggregatedRecord {
        partition_key_table: vec!["k".into()],
        explicit_hash_key_table: Vec::new(),
        records: Vec::new(),
    };
    assert_eq!(corruption(&encode(&message)), Corruption::Empty);
}

fn record_at(partition_key: &str, hash_key: u128, sub_sequence: u32) -> UserRecord {
    UserRecord {
        partition_key: partition_key.into(),
        explicit_hash_key: Some(hash_key.to_string()),
        hash_key,
        data: Bytes::new(),
        sub_sequence,
    }
}

#[test]
fn hash_key_range_includes_both_ends() {
    let range = HashKeyRange::parse("100", "200").expect("range");
    assert!(range.contains(100) && range.contains(200) && range.contains(150));
    assert!(!range.contains(99) && !range.contains(201));
    assert!(HashKeyRange::FULL.contains(0) && HashKeyRange::FULL.contains(u128::MAX));
    assert_eq!(HashKeyRange::parse("0", "340282366920938463463374607431768211455"), Ok(HashKeyRange::FULL));
    assert!(HashKeyRange::parse("2", "1").is_err());
    assert!(HashKeyRange::parse("0", "340282366920938463463374607431768211456").is_err());
    assert!(HashKeyRange::parse("x", "1").is_err());
}

#[test]
fn outside_range_names_sub_sequences() {
    let range = HashKeyRange { start: 100, end: 200 };
    let records = vec![record_at("p", 150, 0), record_at("q", 99, 1), record_at("r", 200, 2), record_at("s", 201, 3)];
    assert_eq!(outside_range(&records, range), vec![1, 3]);
}

#[test]
fn kpl_aggregates_skip_only_what_hashes_outside() {
    let range = HashKeyRange { start: 100, end: 200 };
    let records = vec![record_at("p", 150, 0), record_at("q", 99, 1), record_at("r", 200, 2), record_at("s", 201, 3)];
    assert_eq!(producer("a", &records), Producer::Kpl);
    let split = for_shard("a", records.clone(), range);
    assert_eq!(split.deliver, vec![records[0].clone(), records[2].clone()]);
    assert_eq!(split.skip, vec![records[1].clone(), records[3].clone()]);
}

#[test]
fn other_aggregators_deliver_everything() {
    let range = HashKeyRange { start: 100, end: 200 };
    let records = vec![record_at("p", 150, 0), record_at("q", 99, 1)];
    // aws-kinesis-agg puts an aggregate under its first user record's key.
    assert_eq!(producer("p", &records), Producer::Other);
    assert_eq!(for_shard("p", records.clone(), range), ForShard { deliver: records.clone(), skip: vec![] });
    // A KPL aggregate whose first user key is "a" looks like another aggregator's: deliver (maybe twice).
    let first_a = vec![record_at("a", 150, 0), record_at("q", 99, 1)];
    assert_eq!(producer("a", &first_a), Producer::Other);
    assert_eq!(for_shard("a", first_a.clone(), range).deliver, first_a);
}

#[test]
fn library_aggregates_are_recognised_by_producer() {
    let fixture = fixture(SEVERAL_KEYS);
    let (outer_key, data, _) = &fixture.aggregates[0];
    let Deaggregated::Aggregate(records) = deaggregate(data) else { panic!("not an aggregate") };
    assert_eq!(outer_key, "alpha");
    assert_eq!(producer(outer_key, &records), Producer::Other);
}

#[test]
fn our_aggregates_decode_to_what_was_packed() {
    let packed = aggregate([("a", None, &b"1"[..]), ("b", Some("42"), &b"22"[..]), ("a", None, &b""[..])]);
    let Deaggregated::Aggregate(records) = deaggregate(&packed) else { panic!("not an aggregate") };
    let got: Vec<_> = records
        .iter()
        .map(|r| (r.partition_key.as_str(), r.explicit_hash_key.as_deref(), &r.data[..], r.sub_sequence))
        .collect();
    assert_eq!(got, vec![("a", None, &b"1"[..], 0), ("b", Some("42"), &b"22"[..], 1), ("a", None, &b""[..], 2)]);
}

#[test]
fn keys_longer_than_kinesis_takes_are_corrupt() {
    let at_limit = "é".repeat(256);
    let message = wire::AggregatedRecord {
        partition_key_table: vec![at_limit.clone()],
        explicit_hash_key_table: vec![format!("{:0>39}", 7)],
        records: vec![user(0, Some(0))],
    };
    let Deaggregated::Aggregate(users) = deaggregate(&encode(&message)) else { panic!("256 characters are taken") };
    assert_eq!((users[0].partition_key.as_str(), users[0].hash_key), (at_limit.as_str(), 7));
    let message = wire::AggregatedRecord {
        partition_key_table: vec!["k".into(), "k".repeat(257)],
        explicit_hash_key_table: vec![],
        records: vec![user(0, None)],
    };
    assert_eq!(corruption(&encode(&message)), Corruption::PartitionKeyTooLong { index: 1, chars: 257 });
    let zeros = format!("{:0>1000}", 7);
    let message = wire::AggregatedRecord {
        partition_key_table: vec!["k".into()],
        explicit_hash_key_table: vec![zeros.clone()],
        records: vec![user(0, Some(0))],
    };
    assert_eq!(corruption(&encode(&message)), Corruption::ExplicitHashKey { record: 0, key: zeros[..40].into() });
}
