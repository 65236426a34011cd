//! A handoff notice's body, as the notice endpoint reads it.
#![no_main]

use leasehold_worker::internals::handoff::{MAX_BODY_BYTES, MAX_NOTICE_KEYS};
use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((from, keys)) = parse::handoff_notice(data) {
        assert!(data.len() <= MAX_BODY_BYTES, "a body over the limit is refused");
        assert!(from.len() <= 256, "the sender is bounded");
        assert!(!keys.is_empty() && keys.len() <= MAX_NOTICE_KEYS, "1..={MAX_NOTICE_KEYS} keys");
        for key in keys {
            let key = key.expect("every key a notice carries is a shard row");
            assert!(!key.stream().starts_with('#'), "never a group row");
        }
    }
});
