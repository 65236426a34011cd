//! Open shard counts per stream, polled with DescribeStreamSummary at most once per interval (with
//! jitter) per stream, however many consumers read it: Kinesis allows 20 such calls per second per
//! account.

use std::collections::HashMap;
use std::time::Duration;

use leasehold_crds::StreamSpec;
use leasehold_worker::aws::kinesis::{self, KinesisError, StreamRef};
use rand::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// What is known of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamCount {
    /// The stream exists with this many open shards, in this capacity mode (`PROVISIONED`,
    /// `ON_DEMAND`).
    Open(i32, String),
    /// The stream does not exist.
    NotFound,
    /// The count could not be read.
    Failed(String),
}

/// Shared cache of stream shard counts.
#[derive(Debug)]
pub struct ShardCounts {
    interval: Duration,
    entries: Mutex<HashMap<(String, String), (Instant, StreamCount)>>,
}

impl ShardCounts {
    /// A cache refreshing each stream about every `interval` (±20 % jitter).
    pub fn new(interval: Duration) -> Self {
        Self { interval, entries: Mutex::default() }
    }

    /// The poll interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The count for `stream` (by name, or by ARN when it has one) at `endpoint` (any string
    /// identifying the account/region/endpoint).
    pub async fn get(&self, client: &aws_sdk_kinesis::Client, endpoint: &str, stream: &StreamSpec) -> StreamCount {
        let address = stream.arn.clone().unwrap_or_else(|| stream.stream_name().to_string());
        let key = (endpoint.to_string(), address);
        if let Some((fresh_until, count)) = self.entries.lock().await.get(&key)
            && Instant::now() < *fresh_until
        {
            return count.clone();
        }
        let address = StreamRef { name: stream.stream_name(), arn: stream.arn.as_deref() };
        let count = match kinesis::describe_stream(client, address).await {
            Ok(summary) => {
                // A service or emulator that says nothing of the mode predates on-demand streams.
                let mode = summary
                    .stream_mode_details
                    .map(|m| m.stream_mode.as_str().to_string())
                    .unwrap_or_else(|| "PROVISIONED".into());
                StreamCount::Open(summary.open_shard_count, mode)
            }
            Err(KinesisError::StreamNotFound { .. }) => StreamCount::NotFound,
            Err(e) => StreamCount::Failed(e.to_string()),
        };
        let jitter = rand::rng().random_range(0.8..1.2);
        let fresh_until = Instant::now() + self.interval.mul_f64(jitter);
        self.entries.lock().await.insert(key, (fresh_until, count.clone()));
        count
    }
}
