//! A Kinesis record's payload unpacked as a KPL aggregate. The input is tried as it is (magic bytes,
//! lengths, the MD5 trailer) and, framed with the magic bytes and a matching MD5 trailer, as the
//! protobuf body, so mutations reach the protobuf and the key tables rather than dying at the digest.
#![no_main]

use leasehold_worker::internals::kpl::{Deaggregated, MAGIC};
use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;
use md5::{Digest, Md5};

fn check(data: &[u8]) {
    let (deaggregated, for_shard) = parse::kpl_aggregate(data);
    if let Deaggregated::Aggregate(users) = &deaggregated {
        assert!(!users.is_empty(), "an aggregate holds at least one user record");
        // Each user record carries its own copy of its keys: bounded per user record (Kinesis takes
        // partition keys of up to 256 characters and 128-bit hash keys), so a record cannot expand
        // without bound (a 500 KB key shared by 80,000 user records once took 40 GB).
        let copied: usize =
            users.iter().map(|u| u.partition_key.len() + u.explicit_hash_key.as_ref().map_or(0, String::len)).sum();
        assert!(copied <= 256 * data.len(), "{copied} bytes of keys expanded from a {}-byte record", data.len());
        for (i, user) in users.iter().enumerate() {
            assert_eq!(user.sub_sequence as usize, i, "sub-sequence numbers are positions");
            assert!(user.data.len() <= data.len(), "a user record is a part of its aggregate");
        }
        let split = for_shard.expect("an aggregate is sorted for the shard");
        assert_eq!(split.deliver.len() + split.skip.len(), users.len(), "every user record delivered or skipped");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut framed = Vec::with_capacity(MAGIC.len() + data.len() + 16);
    framed.extend_from_slice(&MAGIC);
    framed.extend_from_slice(data);
    framed.extend_from_slice(&Md5::digest(data));
    check(&framed);
});
