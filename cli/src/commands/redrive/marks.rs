//! Marking redriven letters: a stream letter in its shard's redrive row of the lease table (a
//! checkpoint over every settled letter, the done ones beyond it in a set, each write conditional on
//! the row's counter); an SQS copy deleted, an S3 copy tagged.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_worker::internals::lease::term_key;
use leasehold_worker::lease::{LeaseError, LeaseKey, Progress, ProgressRows};

use super::Run;
use super::letter::{Copy, Pending};
use super::s3::{bucket_name, tag_redriven};
use crate::shared::error::{CliError, Result};
use crate::shared::target::Target;

/// The redrive row of one shard of the dead-letter stream, as read and as it is kept up to date.
#[derive(Debug)]
pub(super) struct StreamMark {
    pub(super) key: String,
    /// `lease_counter` as last read or written; `None` while the row does not exist.
    pub(super) counter: Option<u64>,
    /// Every letter up to this dead-letter sequence number is done (`None`: from the shard's start).
    pub(super) checkpoint: Option<String>,
    /// Letters done beyond the checkpoint.
    pub(super) done: BTreeSet<String>,
    /// The letters read this run beyond the checkpoint, in order: (sequence number, settled), settled
    /// being true once the letter needs nothing more (done, or never this consumer's).
    pub(super) read: Vec<(String, bool)>,
}

impl StreamMark {
    /// The row after `sequence` was done: the checkpoint moved over every settled letter, the rest of
    /// the done ones kept in the set.
    pub(super) fn settle(&mut self, sequence: &str) {
        if let Some(entry) = self.read.iter_mut().find(|(s, _)| s == sequence) {
            entry.1 = true;
        }
        self.done.insert(sequence.to_string());
        let settled = self.read.iter().take_while(|(_, settled)| *settled).count();
        if settled > 0 {
            let drained: Vec<String> = self.read.drain(..settled).map(|(s, _)| s).collect();
            for sequence in &drained {
                self.done.remove(sequence);
            }
            self.checkpoint = drained.last().cloned();
        }
    }
}

/// The row key of the redrive row of dead-letter stream `stream`'s shard `shard`.
pub fn mark_key(stream: &str, shard: &str) -> String {
    redrive_key(stream, shard).to_string()
}

fn redrive_key(stream: &str, shard: &str) -> LeaseKey {
    term_key(&format!("redrive/{stream}/{shard}"))
}

pub(super) async fn read_mark(target: &Target, stream: &str, shard: &str) -> Result<StreamMark> {
    let key = redrive_key(stream, shard);
    let progress = target.store("leasehold-cli").read_progress(&key).await.map_err(|e| match e {
        LeaseError::Malformed { reason, .. } => {
            CliError::Malformed(format!("redrive row {key} of {}: {reason}", target.table))
        }
        e => CliError::Service(format!("reading {key}: {e}")),
    })?;
    let Progress { counter, checkpoint, done } = progress;
    Ok(StreamMark { key: key.to_string(), counter, checkpoint, done, read: Vec::new() })
}

/// Writes `mark`, conditional on the counter it was read or last written with.
async fn write_mark(target: &Target, mark: &mut StreamMark) -> Result<()> {
    // The key was made by `mark_key`: `#term:` and a name, so it parses back.
    let key = LeaseKey::parse(&mark.key)
        .ok_or_else(|| CliError::Malformed(format!("redrive row key {} is no lease key", mark.key)))?;
    let progress = Progress { counter: mark.counter, checkpoint: mark.checkpoint.clone(), done: mark.done.clone() };
    match target.store("leasehold-cli").write_progress(&key, &progress).await {
        Ok(next) => {
            mark.counter = Some(next);
            Ok(())
        }
        Err(LeaseError::ConditionFailed { .. }) => Err(CliError::Conflict(format!(
            "redrive row {} changed under this run (another redrive at work?): stopped; records put so far \
             stay put, a re-run skips what was marked",
            mark.key
        ))),
        Err(e) => Err(CliError::Service(format!("writing {}: {e}", mark.key))),
    }
}

/// Marks every copy of `record` redriven after its put.
pub(super) async fn mark(run: &mut Run<'_>, record: &Pending, marks: &mut BTreeMap<String, StreamMark>) -> Result<()> {
    for (source, copy) in &record.copies {
        match copy {
            Copy::Sqs { receipt } => {
                let queue = run.args.queue.clone().or_else(|| {
                    run.target.spec.as_ref().and_then(|s| s.retry.as_ref()).and_then(|r| r.dead_letter_queue.clone())
                });
                let queue = queue.unwrap_or_default();
                run.sqs.delete_message().queue_url(&queue).receipt_handle(receipt).send().await.map_err(|e| {
                    CliError::Service(format!(
                        "deleting a redriven message from {queue}: {}",
                        aws_sdk_sqs::error::DisplayErrorContext(&e)
                    ))
                })?;
                run.deleted.insert(receipt.clone());
            }
            Copy::S3 { key } => {
                let bucket = bucket_name(run);
                tag_redriven(&run.s3, &bucket, key).await?;
            }
            Copy::Stream { shard, sequence } => {
                if let Some(mark) = marks.get_mut(shard) {
                    mark.settle(sequence);
                    write_mark(run.target, mark).await?;
                }
            }
        }
        run.count(*source).marked += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_moves_only_over_a_settled_prefix() {
        let mut mark = StreamMark {
            key: mark_key("dlq", "shardId-0"),
            counter: None,
            checkpoint: None,
            done: BTreeSet::new(),
            read: vec![("1".into(), true), ("2".into(), false), ("3".into(), false), ("4".into(), false)],
        };
        mark.settle("3");
        assert_eq!(mark.checkpoint.as_deref(), Some("1"), "2 is not done: the checkpoint stops before it");
        assert_eq!(mark.done.iter().collect::<Vec<_>>(), ["3"]);
        mark.settle("2");
        assert_eq!(mark.checkpoint.as_deref(), Some("3"));
        assert!(mark.done.is_empty(), "letters under the checkpoint leave the set");
        assert_eq!(mark.read, [("4".to_string(), false)]);
        assert_eq!(mark.key, "#term:redrive/dlq/shardId-0");
    }
}
