//! A handoff notice's body, as the notice endpoint reads it.
#![no_main]

use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse::handoff_notice(data);
});
