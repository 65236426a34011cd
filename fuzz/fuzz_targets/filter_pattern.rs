//! `filter.patterns` compiled and matched: the input is `<patterns JSON>\0<partition key>\0<data>`.
#![no_main]

use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse::filter_pattern(data);
});
