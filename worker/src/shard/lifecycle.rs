//! A shard's processor through its whole life, in one place: `initialize`, the reading, then exactly
//! one closing hook that fits how the reading ended, bounded by `lease.gracefulTimeout` so a slow hook
//! never holds a handoff or a shutdown past it.

use std::future::Future;

use super::{ShardContext, ShardExit};
use crate::processor::ShardStart;

/// Reads the shard with `read`, calling the processor's lifecycle hooks around it; returns how it ended.
///
/// Hooks: `Ended` → `shard_ended`; `Stopped` (handoff, shutdown) → `shutdown_requested`; `Failed` (the
/// shard cannot be read: the worker gives it up, checkpointing what is done) → `shard_failed`; `Lost`
/// → `lease_lost`. Dropping the returned future (a reader abandoned at the shutdown deadline) drops the
/// processor, which must then let go of what it holds.
pub async fn read_with_hooks<R, F>(context: ShardContext, read: R) -> ShardExit
where
    R: FnOnce(ShardContext) -> F,
    F: Future<Output = ShardExit>,
{
    let processor = context.processor.clone();
    let timeout = context.settings.hook_timeout;
    let key = context.held.key().clone();
    let start = ShardStart { shard: key.clone(), checkpoint: context.start.clone() };
    processor.initialize(&start).await;
    let exit = read(context).await;
    let (hook, closing) = match &exit {
        ShardExit::Ended => ("shard_ended", processor.shard_ended()),
        ShardExit::Stopped { .. } => ("shutdown_requested", processor.shutdown_requested()),
        ShardExit::Failed { reason, .. } => ("shard_failed", processor.shard_failed(reason)),
        ShardExit::Lost => ("lease_lost", processor.lease_lost()),
    };
    if tokio::time::timeout(timeout, closing).await.is_err() {
        tracing::warn!(shard = %key, hook, ?timeout, "processor hook did not return within lease.gracefulTimeout; going on");
    }
    exit
}
