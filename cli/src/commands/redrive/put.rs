//! Putting the chosen records back in their source stream's order: one at a time, each `PutRecord`
//! of a key passing the previous one's sequence number as `SequenceNumberForOrdering`, so one key's
//! records land in their original order; every copy of a record's letter is marked after its put.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_kinesis::primitives::Blob;

use super::letter::Pending;
use super::marks::{StreamMark, mark};
use super::{RedriveArgs, Run};
use crate::shared::error::CliError;

/// The stream `record` is put on: `--to`, else its source stream.
pub(super) fn destination(args: &RedriveArgs, record: &Pending) -> String {
    args.to.clone().unwrap_or_else(|| record.place.stream.clone())
}

/// Puts `pending` in order, marking each record's copies after its put; how many were put, and the
/// failure that stopped the run, if one did.
pub(super) async fn put_in_order(
    run: &mut Run<'_>,
    pending: &[Pending],
    marks: &mut BTreeMap<String, StreamMark>,
) -> (usize, Option<CliError>) {
    let mut put = 0usize;
    let mut last_sequence: HashMap<(String, String), String> = HashMap::new();
    for record in pending {
        let to = destination(run.args, record);
        let ordering = last_sequence.get(&(to.clone(), record.partition_key.clone())).cloned();
        let sent = run
            .target
            .kinesis
            .put_record()
            .stream_name(&to)
            .partition_key(&record.partition_key)
            .set_explicit_hash_key(record.explicit_hash_key.clone())
            .set_sequence_number_for_ordering(ordering)
            .data(Blob::new(record.data.to_vec()))
            .send()
            .await;
        let sequence = match sent {
            Ok(out) => out.sequence_number,
            Err(e) => {
                let failure = CliError::Service(format!(
                    "putting {}/{}/{} on {to}: {}; stopped, {put} record(s) were put and marked",
                    record.place.stream,
                    record.place.shard_id,
                    record.place.sequence_number,
                    aws_sdk_kinesis::error::DisplayErrorContext(&e)
                ));
                return (put, Some(failure));
            }
        };
        put += 1;
        if run.args.crash_after_puts.is_some_and(|n| put >= n) {
            eprintln!("crashing after {put} put(s), as --crash-after-puts asks");
            std::process::abort();
        }
        last_sequence.insert((to, record.partition_key.clone()), sequence);
        if let Err(e) = mark(run, record, marks).await {
            return (put, Some(e));
        }
    }
    (put, None)
}
