//! A `checkpoint` attribute (and `<text>/<sub-sequence>`) read; whatever reads is written back as text
//! that reads the same.
#![no_main]

use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(checkpoint) = parse::checkpoint(data) {
        let text = match checkpoint.sub_sequence() {
            Some(sub) => format!("{}/{sub}", checkpoint.attribute()),
            None => checkpoint.attribute(),
        };
        assert_eq!(parse::checkpoint(text.as_bytes()).as_ref(), Ok(&checkpoint), "{text:?}");
    }
});
