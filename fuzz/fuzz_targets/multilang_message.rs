//! The lines a multilang child writes back, each read as a protocol message: a status, a checkpoint
//! request, another action, or not a message (a protocol error of that child), never a panic.
#![no_main]

use leasehold_worker::internals::multilang::{MAX_LINE_BYTES, Message};
use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (line, read) in data.split(|b| *b == b'\n').zip(parse::multilang_message(data)) {
        assert!(line.len() <= MAX_LINE_BYTES || read.is_err(), "a line over the limit is no message");
        if let Ok(Message::Status { response_for }) = read {
            assert!(response_for.len() <= line.len(), "the answered action comes from the line");
        }
    }
});
