//! The dead-letter stream: every shard read from its redrive row's checkpoint to the tip.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;

use super::letter::{Copy, Verdict, take};
use super::marks::{StreamMark, read_mark};
use super::{Run, Source};
use crate::shared::error::{CliError, Result};

/// Reads every shard of the dead-letter stream from its redrive row's checkpoint to the tip.
pub(super) async fn read_stream(
    run: &mut Run<'_>,
    stream: &str,
    marks: &mut BTreeMap<String, StreamMark>,
) -> Result<()> {
    let kinesis = run.target.kinesis.clone();
    let failed = |e: String| CliError::Service(format!("reading dead-letter stream {stream}: {e}"));
    let shards = crate::shared::shards::list(&kinesis, stream).await.map_err(|e| match e {
        CliError::NotFound(_) => CliError::NotFound(format!("dead-letter stream {stream} does not exist")),
        other => other,
    })?;
    for shard in shards.into_iter().map(|s| s.id) {
        let mut mark = read_mark(run.target, stream, &shard).await?;
        let iterator = match &mark.checkpoint {
            Some(sequence) => kinesis
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(&shard)
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(sequence),
            None => kinesis
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(&shard)
                .shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let mut iterator = iterator
            .send()
            .await
            .map_err(|e| failed(aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string()))?
            .shard_iterator;
        while let Some(current) = iterator {
            let out = kinesis
                .get_records()
                .shard_iterator(current)
                .send()
                .await
                .map_err(|e| failed(aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string()))?;
            let empty = out.records.is_empty();
            for record in out.records {
                let sequence = record.sequence_number.clone();
                if mark.done.contains(&sequence) {
                    run.count(Source::Stream).read += 1;
                    run.count(Source::Stream).already_redriven += 1;
                    mark.read.push((sequence, true));
                    continue;
                }
                let written = record.approximate_arrival_timestamp.and_then(|t| t.to_millis().ok());
                let copy = Copy::Stream { shard: shard.clone(), sequence: sequence.clone() };
                let settled = match run.judge(Source::Stream, copy, record.data.as_ref(), written).await? {
                    Verdict::Take(pending) => {
                        take(run, pending);
                        false
                    }
                    Verdict::Never => true,
                    Verdict::Later => false,
                };
                mark.read.push((sequence, settled));
            }
            // Caught up: nothing came and nothing is behind.
            if empty && out.millis_behind_latest.unwrap_or(0) == 0 {
                break;
            }
            iterator = out.next_shard_iterator;
            // Kinesis takes 5 GetRecords a second per shard.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        marks.insert(shard, mark);
    }
    Ok(())
}
