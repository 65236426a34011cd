//! Where a group's shards come from and how a held one is read: the seam between the coordinator's
//! decisions and Kinesis. The coordinator sees only [`ShardSource`], so its decisions (taking,
//! balancing, handing over, failing over, the segmented scan's whole reads and terms) are tested over
//! the memory store with a paused clock and a stand-in source (`tests/`), with no emulator and no
//! process.

use std::time::Duration;

use async_trait::async_trait;

use crate::discovery::{Incarnation, ShardSync, SyncReport};
use crate::kinesis::Kinesis;
use crate::lease::{Lease, LeaseStore};
use crate::shard::{ShardContext, ShardExit, ShardReader};

/// The shards of the streams a group reads, and the reading of one of them.
#[async_trait]
pub(crate) trait ShardSource: Send + Sync {
    /// Brings the table's shard rows in step with the streams: rows of new shards created, rows of
    /// finished shards whose children have started removed. `rows` are the shard rows as just read.
    async fn sync(&self, store: &dyn LeaseStore, rows: &[Lease]) -> SyncReport;

    /// Which incarnation of `stream` exists now (its creation time), from a description at most
    /// `max_age` old.
    async fn incarnation(&self, stream: &str, max_age: Duration) -> Incarnation;

    /// Reads a held shard until it ends, its lease is lost, it fails, or `context.stop` asks it to stop.
    /// The processor's lifecycle hooks are the caller's.
    async fn read(&self, context: ShardContext) -> ShardExit;
}

/// The shards of real streams: listed and described through Kinesis, read by polling or fan-out.
pub(crate) struct KinesisShards {
    kinesis: Kinesis,
    sync: ShardSync,
}

impl KinesisShards {
    /// Shards listed by `sync`, read through `kinesis`.
    pub(crate) fn new(kinesis: Kinesis, sync: ShardSync) -> Self {
        Self { kinesis, sync }
    }
}

#[async_trait]
impl ShardSource for KinesisShards {
    async fn sync(&self, store: &dyn LeaseStore, rows: &[Lease]) -> SyncReport {
        self.sync.sync(store, rows).await
    }

    async fn incarnation(&self, stream: &str, max_age: Duration) -> Incarnation {
        self.sync.incarnation(stream, max_age).await
    }

    async fn read(&self, context: ShardContext) -> ShardExit {
        ShardReader::new(self.kinesis.clone(), context).read().await
    }
}
