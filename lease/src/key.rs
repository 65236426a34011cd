//! The key of a lease row: a stream and one of its shards.

use std::fmt;

/// Identifies one lease row: `<stream>:<shardId>`.
///
/// Shard ids repeat across streams (every stream has a `shardId-000000000000`), so the stream is part
/// of the key. Kinesis stream names cannot contain `:`, which makes the first `:` the separator.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey {
    stream: String,
    shard_id: String,
}

impl LeaseKey {
    /// The key of `shard_id` in `stream`.
    pub fn new(stream: impl Into<String>, shard_id: impl Into<String>) -> Self {
        Self { stream: stream.into(), shard_id: shard_id.into() }
    }

    /// Parses `<stream>:<shardId>`; `None` when either part is missing.
    pub fn parse(text: &str) -> Option<Self> {
        let (stream, shard_id) = text.split_once(':')?;
        (!stream.is_empty() && !shard_id.is_empty()).then(|| Self::new(stream, shard_id))
    }

    /// The stream this shard belongs to.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The shard id within the stream.
    pub fn shard_id(&self) -> &str {
        &self.shard_id
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.stream, self.shard_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        let key = LeaseKey::new("orders", "shardId-000000000001");
        assert_eq!(key.to_string(), "orders:shardId-000000000001");
        assert_eq!(LeaseKey::parse(&key.to_string()), Some(key));
    }

    #[test]
    fn refuses_text_without_both_parts() {
        assert_eq!(LeaseKey::parse("orders"), None);
        assert_eq!(LeaseKey::parse(":shardId-0"), None);
        assert_eq!(LeaseKey::parse("orders:"), None);
    }
}
