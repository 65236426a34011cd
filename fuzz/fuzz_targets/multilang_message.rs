//! The lines a multilang child writes back, as the worker reads them while waiting for a status: every
//! line is skipped, answers the message or is a checkpoint request that gets an answer.
#![no_main]

use leasehold_worker::internals::parse::{self, MultilangReply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for reply in parse::multilang_message(data).into_iter().flatten() {
        if let MultilangReply::Checkpoint(ack) = reply {
            assert_eq!(ack["action"], "checkpoint", "a checkpoint request is answered with a checkpoint action");
        }
    }
});
