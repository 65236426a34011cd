//! What the workspace's own crates, tests and benches reach that is not the worker's public API: the
//! dispatcher, KPL aggregates and the lease rows' format. Hidden from the docs, with no stability
//! promise; an embedder has no use for it.

/// The record dispatcher and runner (the dispatch benchmark drives them without a worker).
pub mod dispatch {
    pub use crate::dispatch::{
        DispatchSettings, Dispatcher, Envelope, History, Opened, RecordRunner, RequeueKey, open_requeued,
        parse_requeued,
    };
}

/// KPL aggregated records: reading them (the CLI's import of KCL checkpoints) and making them (tests
/// and benches).
pub mod kpl {
    pub use crate::kpl::*;
}

/// The lease table's row format: attribute values, membership and term rows (the CLI reads and writes
/// rows; tests look at them).
pub mod lease {
    pub use crate::lease::row::{AttrValue, Attributes, MEMBER_PREFIX, TERM_PREFIX, changes_key, term_key};
}

/// The fair shares every worker computes alike (the CLI's `drain` deals a worker's leases as the
/// workers themselves would).
pub mod balance {
    pub use crate::coordinator::balance::{active, targets};
}

/// The http processor's answer reader: a pure function of the body's bytes (fuzz targets call it).
pub mod http {
    pub use crate::processor::http::{Answer, AnswerError, AnswerOutput, Failed, MAX_ANSWER_BYTES, parse_answer};
}

/// The multilang processor's message reader: a pure function of one line's bytes (fuzz targets call
/// it).
pub mod multilang {
    pub use crate::processor::multilang::{MAX_LINE_BYTES, Message, NotAMessage, parse_message};
}

/// Handoff notices: the signed format, for tests that send notices and for fuzz targets
/// ([`parse_notice`](handoff::parse_notice) reads a body with no signature, clock or membership).
pub mod handoff {
    pub use crate::coordinator::{
        HandoffNotice, HandoffSecret, MAX_BODY_BYTES, MAX_NOTICE_AGE, MAX_NOTICE_KEYS, NOTICE_PATH, Refusal,
        SIGNATURE_HEADER, SecretError, now_ms, parse_notice, sign_notice, verify_notice,
    };
}

/// Every parser of what others wrote, one function per parser, each taking the raw input as read and
/// running the worker's own code path on it: what the fuzz targets (`fuzz/`) call. The bodies stay
/// one or two calls so the targets follow the parsers wherever they move.
pub mod parse {
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::Arc;

    use aws_sdk_dynamodb::primitives::Blob;
    use aws_sdk_dynamodb::types::AttributeValue;
    use bytes::Bytes;
    use serde_json::Value;

    use crate::config::{ConfigError, WorkerConfig};
    use crate::coordinator::{Refusal, parse_notice};
    use crate::dispatch::requeue::{open as open_requeue, wrap as wrap_requeue};
    use crate::dispatch::{History, Opened, RequeueKey, parse_requeued};
    use crate::kpl::{self, Deaggregated, ForShard, HashKeyRange};
    use crate::lease::row::{self, Row};
    use crate::lease::{Checkpoint, InvalidCheckpoint, Lease, LeaseKey, Malformed};
    use crate::processor::multilang::{Message, NotAMessage, parse_message};
    use crate::processor::{Output, ProcessError, Record};

    /// One Kinesis record's payload unpacked as the reader unpacks it (KPL aggregate or not), and the
    /// user records a reader of the lower half of the hash key range delivers from a KPL-made aggregate.
    pub fn kpl_aggregate(data: &[u8]) -> (Deaggregated, Option<ForShard>) {
        let deaggregated = kpl::deaggregate(&Bytes::copy_from_slice(data));
        let lower_half = HashKeyRange { start: 0, end: u128::MAX / 2 };
        let for_shard = match &deaggregated {
            Deaggregated::Aggregate(users) => Some(kpl::for_shard("a", users.clone(), lower_half)),
            _ => None,
        };
        (deaggregated, for_shard)
    }

    /// The records of [`http_batch_answer`]'s batch: two streams sharing ids, a KPL user record.
    pub fn http_batch() -> Vec<Record> {
        let record = |stream: &str, sequence: &str, key: &str, sub_sequence_number| Record {
            stream: Arc::from(stream),
            shard_id: Arc::from("shardId-000000000001"),
            sequence_number: sequence.into(),
            partition_key: key.into(),
            explicit_hash_key: None,
            data: Bytes::from_static(b"{\"order\":7}"),
            arrival_ms: Some(1_700_000_000_123),
            sub_sequence_number,
        };
        vec![
            record("orders", "1", "a", None),
            record("orders", "2", "b", None),
            record("refunds", "1", "c", None),
            record("orders", "3", "d", Some(0)),
            record("orders", "3", "d", Some(1)),
        ]
    }

    /// A 2xx answer to a batch ([`http_batch`]): each record's outputs, or why it failed.
    pub fn http_batch_answer(body: &[u8]) -> Vec<Result<Vec<Output>, ProcessError>> {
        crate::processor::batch_outcomes(body, &http_batch())
    }

    /// A 2xx answer to a single record's request: the outputs it carries.
    pub fn http_answer(body: &[u8]) -> Result<Vec<Output>, ProcessError> {
        crate::processor::parse_outputs(body, &http_batch()[0])
    }

    /// Each line (split at `\n`, as read) a multilang child wrote, read as a protocol message.
    pub fn multilang_message(data: &[u8]) -> Vec<Result<Message, NotAMessage>> {
        data.split(|b| *b == b'\n').map(parse_message).collect()
    }

    /// A `filter.patterns` list (JSON; one pattern object counts as a list of one) compiled, and
    /// matched against a record. The input is `<patterns>\0<partition key>\0<data>`.
    pub fn filter_pattern(data: &[u8]) -> Option<bool> {
        let mut parts = data.splitn(3, |b| *b == 0);
        let (patterns, key, record) =
            (parts.next()?, parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        let patterns = match serde_json::from_slice::<Value>(patterns).ok()? {
            Value::Array(list) => list,
            one => vec![one],
        };
        let filter = leasehold_crds::filter::RecordFilter::new(&patterns).ok()?;
        Some(filter.matches(&String::from_utf8_lossy(key), record))
    }

    /// A lease table item in DynamoDB's JSON (`{"lease_key": {"S": "s:shardId-0"}, ...}`, every type
    /// DynamoDB has) read as the store reads it: `None` when the input is not such an item; a
    /// membership row reads as `Ok(None)`.
    pub fn lease_row(data: &[u8]) -> Option<Result<Option<Lease>, Malformed>> {
        let item = dynamo_item(&serde_json::from_slice::<Value>(data).ok()?)?;
        Some(row::decode_row(&crate::lease::from_item(&item)).map(|row| match row {
            Row::Lease(lease) | Row::Term(lease) => Some(lease),
            Row::Member(_) => None,
        }))
    }

    /// A `checkpoint` attribute's text read, and with a sub-sequence when the input is `<text>/<n>`.
    pub fn checkpoint(data: &[u8]) -> Result<Checkpoint, InvalidCheckpoint> {
        let text = std::str::from_utf8(data).map_err(|_| InvalidCheckpoint(String::from_utf8_lossy(data).into()))?;
        match text.rsplit_once('/').and_then(|(text, sub)| Some((text, sub.parse().ok()?))) {
            Some((text, sub_sequence)) => Checkpoint::from_attributes(text, Some(sub_sequence)),
            None => text.parse(),
        }
    }

    /// A handoff notice's body as the endpoint reads it (shape and bounds; no signature, clock or
    /// membership), and the lease keys it names.
    pub fn handoff_notice(body: &[u8]) -> Result<(String, Vec<Option<LeaseKey>>), Refusal> {
        let notice = parse_notice(body)?;
        Ok((notice.from, notice.leases.iter().map(|text| LeaseKey::parse(text)).collect()))
    }

    /// The key the requeue targets sign and check copies with.
    fn requeue_key() -> RequeueKey {
        RequeueKey::from_hex(&"5a".repeat(32)).unwrap_or_else(RequeueKey::random)
    }

    /// A record's data read for the requeue header, unverified: (requeues, attempts, original data).
    pub fn requeue_header(data: &[u8]) -> Option<(u32, u32, Bytes)> {
        let envelope = parse_requeued(&Bytes::copy_from_slice(data))?;
        Some((envelope.history.requeues, envelope.history.attempts, envelope.data))
    }

    /// A record's data (keyed `k`) checked as a copy signed under the targets' key.
    pub fn requeue_open(data: &[u8]) -> Opened {
        open_requeue(&requeue_key(), "k", &Bytes::copy_from_slice(data))
    }

    /// The data of a copy of `data` (keyed `k`) signed under the targets' key: what [`requeue_header`]
    /// and [`requeue_open`] must read back.
    pub fn requeue_wrap(data: &[u8], requeues: u32, attempts: u32) -> Bytes {
        wrap_requeue(&requeue_key(), "k", data, History { requeues, attempts })
    }

    /// A spec read and validated; `None` when the bytes are not text (YAML) or not a spec (JSON).
    pub type SpecRead = Option<Result<WorkerConfig, ConfigError>>;

    /// A worker's configuration text (a StreamConsumer spec in YAML) parsed and validated, as the
    /// worker reads its file; and the same bytes as the JSON the API server serves the operator.
    pub fn spec(data: &[u8]) -> (SpecRead, SpecRead) {
        let yaml = std::str::from_utf8(data).ok().map(|text| WorkerConfig::parse(text, Path::new("fuzz.yaml")));
        let json = serde_json::from_slice::<leasehold_crds::StreamConsumerSpec>(data).ok().map(WorkerConfig::from_spec);
        (yaml, json)
    }

    /// DynamoDB's JSON form of an item (`{"name": {"S": "text"}, ...}`) as the SDK's item; `None` when
    /// it is not one.
    fn dynamo_item(json: &Value) -> Option<HashMap<String, AttributeValue>> {
        json.as_object()?.iter().map(|(name, value)| Some((name.clone(), dynamo_value(value)?))).collect()
    }

    fn dynamo_value(json: &Value) -> Option<AttributeValue> {
        let (kind, value) = json.as_object().filter(|o| o.len() == 1)?.iter().next()?;
        let strings =
            |v: &Value| v.as_array()?.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<Vec<_>>>();
        let blob = |v: &Value| v.as_str().map(|s| Blob::new(s.as_bytes()));
        Some(match kind.as_str() {
            "S" => AttributeValue::S(value.as_str()?.into()),
            "N" => AttributeValue::N(value.as_str()?.into()),
            "SS" => AttributeValue::Ss(strings(value)?),
            "NS" => AttributeValue::Ns(strings(value)?),
            "B" => AttributeValue::B(blob(value)?),
            "BS" => AttributeValue::Bs(value.as_array()?.iter().map(blob).collect::<Option<_>>()?),
            "BOOL" => AttributeValue::Bool(value.as_bool()?),
            "NULL" => AttributeValue::Null(value.as_bool()?),
            "L" => AttributeValue::L(value.as_array()?.iter().map(dynamo_value).collect::<Option<_>>()?),
            "M" => AttributeValue::M(dynamo_item(value)?),
            _ => return None,
        })
    }
}
