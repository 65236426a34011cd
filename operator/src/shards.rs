//! Open shard counts per stream, polled with DescribeStreamSummary at most once per interval (with
//! jitter) per stream, however many consumers read it: Kinesis allows 20 such calls per second per
//! account.

use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// What is known of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamCount {
    /// The stream exists with this many open shards.
    Open(i32),
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

    /// The count for `stream` at `endpoint` (any string identifying the account/region/endpoint).
    pub async fn get(&self, client: &aws_sdk_kinesis::Client, endpoint: &str, stream: &str) -> StreamCount {
        let key = (endpoint.to_string(), stream.to_string());
        if let Some((fresh_until, count)) = self.entries.lock().await.get(&key)
            && Instant::now() < *fresh_until
        {
            return count.clone();
        }
        let count = match client.describe_stream_summary().stream_name(stream).send().await {
            Ok(out) => match out.stream_description_summary {
                Some(summary) => StreamCount::Open(summary.open_shard_count),
                None => StreamCount::Failed("empty DescribeStreamSummary answer".into()),
            },
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
                StreamCount::NotFound
            }
            Err(e) => StreamCount::Failed(crate::aws::error_message(&e)),
        };
        let jitter = rand::rng().random_range(0.8..1.2);
        let fresh_until = Instant::now() + self.interval.mul_f64(jitter);
        self.entries.lock().await.insert(key, (fresh_until, count.clone()));
        count
    }
}
