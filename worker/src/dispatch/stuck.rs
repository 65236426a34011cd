//! Watching a processing call that does not return: after `lease.gracefulTimeout` it is logged once
//! and counted in `leasehold_records_stuck` until it returns. It is never cancelled: a processor's
//! call may not be safe to drop half-way, and at-least-once delivery would run it again anyway; the
//! shard waits for it, keeping its lease, and a shutdown abandons it at the graceful deadline (the
//! lease is released at the last record done, so the next holder processes the stuck record again).

use std::future::Future;
use std::time::Duration;

use crate::metrics::Metrics;
use crate::processor::Record;

/// Counts a call as stuck until it returns or is dropped (a reader abandoned at shutdown).
struct Stuck<'a>(&'a Metrics);

impl Drop for Stuck<'_> {
    fn drop(&mut self) {
        self.0.records_stuck.dec();
    }
}

/// Awaits `call` (processing `record`), reporting it as stuck once it has run `after` without returning.
pub(super) async fn watch<F: Future>(call: F, record: &Record, after: Duration, metrics: &Metrics) -> F::Output {
    tokio::pin!(call);
    tokio::select! {
        out = &mut call => return out,
        _ = tokio::time::sleep(after) => {}
    }
    tracing::warn!(shard = %record.shard_id, sequence = %record.sequence_number, partition_key = %record.partition_key,
        ?after, "record processing has not returned; the shard waits for it (stuck)");
    metrics.records_stuck.inc();
    let _stuck = Stuck(metrics);
    let out = call.await;
    tracing::info!(shard = %record.shard_id, sequence = %record.sequence_number, "stuck record processing returned");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn record() -> Record {
        Record {
            stream: Arc::from("s"),
            shard_id: Arc::from("shardId-0"),
            sequence_number: "1".into(),
            partition_key: "k".into(),
            data: bytes::Bytes::new(),
            arrival_ms: None,
            explicit_hash_key: None,
            sub_sequence_number: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_the_bound_counts_as_stuck_until_it_returns() {
        let metrics = Metrics::default();
        let record = record();
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let watched = watch(async { rx.await.unwrap_or(0) }, &record, Duration::from_secs(3), &metrics);
        tokio::pin!(watched);
        assert!(tokio::time::timeout(Duration::from_secs(2), &mut watched).await.is_err());
        assert_eq!(metrics.records_stuck.get(), 0, "not stuck before the bound");
        assert!(tokio::time::timeout(Duration::from_secs(2), &mut watched).await.is_err());
        assert_eq!(metrics.records_stuck.get(), 1, "stuck past the bound, still waited for");
        tx.send(7).expect("send");
        assert_eq!(watched.await, 7);
        assert_eq!(metrics.records_stuck.get(), 0, "no longer stuck once it returned");
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_stuck_call_is_no_longer_counted() {
        let metrics = Metrics::default();
        let record = record();
        let hung = watch(std::future::pending::<()>(), &record, Duration::from_secs(1), &metrics);
        assert!(tokio::time::timeout(Duration::from_secs(5), hung).await.is_err());
        assert_eq!(metrics.records_stuck.get(), 0, "dropped at the timeout");
    }
}
