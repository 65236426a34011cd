//! A record's data read for the requeue header: unverified parsing and the signed check never panic,
//! only a copy this key signed opens as genuine; and any data wrapped with a history opens to the same
//! history and data.
#![no_main]

use leasehold_worker::internals::dispatch::Opened;
use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((_, _, original)) = parse::requeue_header(data) {
        assert!(data.ends_with(&original), "the original data is the end of the copy");
    }
    // Arbitrary bytes are never taken for a copy this consumer signed (the fuzzer cannot find the MAC).
    assert!(!matches!(parse::requeue_open(data), Opened::Genuine(..)), "a forged copy opened as genuine");
    let (requeues, attempts) = match data {
        [a, b, ..] => (u32::from(*a) << 24 | 7, u32::from(*b) * 0x0101_0101),
        _ => (1, 1),
    };
    let copy = parse::requeue_wrap(data, requeues, attempts);
    let opened = parse::requeue_header(&copy);
    assert_eq!(opened, Some((requeues, attempts, bytes::Bytes::copy_from_slice(data))));
    match parse::requeue_open(&copy) {
        Opened::Genuine(history, original) => {
            assert_eq!((history.requeues, history.attempts, &original[..]), (requeues, attempts, data));
        }
        other => panic!("a signed copy must open as genuine: {other:?}"),
    }
});
