//! A worker's configuration (a StreamConsumer spec, YAML) and the same bytes as the JSON the operator
//! gets, parsed and validated.
#![no_main]

use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse::spec(data);
});
