//! Records a processor emits to `output.stream`, and how each one's partition key is chosen.

use bytes::Bytes;

use super::Record;

/// One record a processor emits while processing an input record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The payload.
    pub data: Bytes,
    /// The key the processor chose, if any (rule 1).
    pub partition_key: Option<String>,
    /// The input record's key when the processor carries it over (rule 2).
    pub carried_key: Option<String>,
}

impl Output {
    /// An output with no key of its own: the consumer's `output.partitionKey`, else a random key.
    pub fn new(data: impl Into<Bytes>) -> Self {
        Self { data: data.into(), partition_key: None, carried_key: None }
    }

    /// The same output under `key`.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// The same output carrying `input`'s partition key (used when it has no key of its own), so it
    /// keeps the input's order among that key's records.
    pub fn carrying_key_of(mut self, input: &Record) -> Self {
        self.carried_key = Some(input.partition_key.clone());
        self
    }

    /// The partition key to publish under: the processor's key; else the carried input key; else the
    /// consumer's fixed `output.partitionKey`; else a fresh random key (spreads over shards, keeps no
    /// order).
    pub fn key(&self, fixed: Option<&str>) -> String {
        self.partition_key
            .clone()
            .or_else(|| self.carried_key.clone())
            .or_else(|| fixed.map(String::from))
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())
    }
}

/// The outputs a processor emits for one input record; published to `output.stream` after the record
/// is processed and before it counts as done.
#[derive(Debug, Default)]
pub struct Outputs(Vec<Output>);

impl Outputs {
    /// Emits `output`.
    pub fn emit(&mut self, output: Output) {
        self.0.push(output);
    }

    /// True when nothing was emitted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The outputs, in emission order.
    pub fn into_vec(self) -> Vec<Output> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn input() -> Record {
        Record {
            stream: Arc::from("orders"),
            shard_id: Arc::from("shardId-000000000000"),
            sequence_number: "1".into(),
            partition_key: "customer-7".into(),
            data: Bytes::from_static(b"x"),
            arrival_ms: None,
            explicit_hash_key: None,
            sub_sequence_number: None,
        }
    }

    #[test]
    fn keys_are_chosen_in_the_documented_order() {
        let own = Output::new("a").with_key("mine").carrying_key_of(&input());
        assert_eq!(own.key(Some("fixed")), "mine", "1: the processor's key");
        let carried = Output::new("a").carrying_key_of(&input());
        assert_eq!(carried.key(Some("fixed")), "customer-7", "2: the carried input key");
        assert_eq!(Output::new("a").key(Some("fixed")), "fixed", "3: the consumer's fixed key");
        let random = Output::new("a");
        assert_ne!(random.key(None), random.key(None), "4: a fresh random key each time");
    }
}
