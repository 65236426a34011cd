//! A receiver's 2xx answer read as a batch answer (CloudEvents ids, Lambda's batchItemFailures) and
//! as a single record's answer (its outputs).
#![no_main]

use leasehold_worker::internals::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let outcomes = parse::http_batch_answer(data);
    assert_eq!(outcomes.len(), parse::http_batch().len(), "one outcome per record of the batch");
    let _ = parse::http_answer(data);
});
