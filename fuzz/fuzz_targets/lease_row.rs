//! A lease table item (DynamoDB's JSON form of an item) decoded as the store decodes a row.
#![no_main]

use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(Ok(Some(lease))) = parse::lease_row(data) {
        // What a row says is what it reads back as: its checkpoint, as text, parses to itself.
        let text = match lease.checkpoint.sub_sequence() {
            Some(sub) => format!("{}/{sub}", lease.checkpoint.attribute()),
            None => lease.checkpoint.attribute(),
        };
        assert_eq!(parse::checkpoint(text.as_bytes()), Ok(lease.checkpoint));
    }
});
