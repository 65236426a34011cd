//! A window consumer's end (`spec.window`): when every shard is finished the worker stops and exits 0
//! (docs/operations.md, "Replay").

use std::collections::HashMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::kinesis::Kinesis;
use crate::lease::{Lease, LeaseKey, LeaseStore};
use crate::metrics::Metrics;

/// How a window stands, judged from the stream's open shards and the window's lease rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowProgress {
    /// Rows at `SHARD_END`.
    pub finished: usize,
    /// Rows in the table (shard leases).
    pub rows: usize,
    /// Open shards listed without a row yet (the shard sync has not created it).
    pub open_without_row: usize,
}

impl WindowProgress {
    /// Judges `rows` against the open shards `open` (`<stream>:<shardId>`).
    ///
    /// A window is complete when every row is at `SHARD_END` and every open shard has one. Open shards
    /// are the leaves of the resharding graph, and a child is read only after its parents ended, so
    /// once the leaves are finished every ancestor was too (rows of finished ancestors may have been
    /// cleaned up already; a closed shard always has a listed child).
    pub fn of(open: &[LeaseKey], rows: &[Lease]) -> Self {
        let by_key: HashMap<&LeaseKey, &Lease> = rows.iter().map(|row| (&row.key, row)).collect();
        Self {
            finished: rows.iter().filter(|row| row.checkpoint.is_shard_end()).count(),
            rows: rows.len(),
            open_without_row: open.iter().filter(|key| !by_key.contains_key(key)).count(),
        }
    }

    /// True when every shard of the window is finished.
    pub fn completed(&self) -> bool {
        self.rows > 0 && self.finished == self.rows && self.open_without_row == 0
    }
}

/// The open shards of `streams`, as lease keys.
pub(crate) async fn open_shards(kinesis: &Kinesis, streams: &[String]) -> Result<Vec<LeaseKey>, String> {
    let mut open = Vec::new();
    for stream in streams {
        let shards = kinesis.list_shards(stream).await.map_err(|e| e.to_string())?;
        open.extend(shards.into_iter().filter(|s| !s.closed).map(|s| LeaseKey::new(stream.as_str(), s.id.as_str())));
    }
    Ok(open)
}

/// Checks the window every `interval` (at once first) and cancels `done` once it is complete. A failed
/// check (a listing or scan error) is logged and tried again at the next interval; it never counts as
/// complete.
pub(crate) async fn watch(
    store: std::sync::Arc<dyn LeaseStore>,
    kinesis: Kinesis,
    streams: Vec<String>,
    interval: Duration,
    metrics: std::sync::Arc<Metrics>,
    done: CancellationToken,
) {
    loop {
        let progress = match open_shards(&kinesis, &streams).await {
            Ok(open) => match store.list().await {
                Ok(page) => Ok(WindowProgress::of(&open, &page.leases)),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e),
        };
        match progress {
            Ok(progress) if progress.completed() => {
                metrics.window_completed.set(1);
                tracing::info!(shards = progress.rows, "window completed: every shard is finished; stopping");
                done.cancel();
                return;
            }
            Ok(progress) => tracing::debug!(?progress, "window not completed yet"),
            Err(error) => tracing::warn!(%error, "cannot judge the window's completion; trying again"),
        }
        tokio::select! {
            _ = done.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Checkpoint;

    fn row(shard: &str, checkpoint: Checkpoint) -> Lease {
        crate::test_rows::row(shard).counter(1).checkpoint(checkpoint).lease()
    }

    #[test]
    fn complete_only_when_every_row_and_open_shard_is_finished() {
        let open = [LeaseKey::new("s", "1"), LeaseKey::new("s", "2")];
        assert!(!WindowProgress::of(&open, &[]).completed(), "no rows yet");
        let rows = [row("0", Checkpoint::ShardEnd), row("1", Checkpoint::ShardEnd)];
        let progress = WindowProgress::of(&open, &rows);
        assert_eq!(progress.open_without_row, 1);
        assert!(!progress.completed(), "shard 2 has no row yet");
        let rows = [row("1", Checkpoint::ShardEnd), row("2", Checkpoint::Sequence("9".into()))];
        assert!(!WindowProgress::of(&open, &rows).completed(), "shard 2 is still read");
        let rows = [row("1", Checkpoint::ShardEnd), row("2", Checkpoint::ShardEnd)];
        assert!(WindowProgress::of(&open, &rows).completed());
    }
}
