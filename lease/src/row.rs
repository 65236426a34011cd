//! A lease row: its attributes, and the codec between them and [`Lease`].
//!
//! Both stores keep rows as attribute maps ([`Attributes`]), so a malformed row is detected by the same
//! code whichever store holds it.

use std::collections::HashMap;

use super::checkpoint::Checkpoint;
use super::key::LeaseKey;
use super::load::{MAX_FIGURE, ShardLoad};

/// Attribute names of a lease row; fixed, since operators read them.
pub mod attr {
    /// Hash key: `<stream>:<shardId>` (S).
    pub const LEASE_KEY: &str = "lease_key";
    /// The worker holding the lease (S); absent when the lease is free.
    pub const LEASE_OWNER: &str = "lease_owner";
    /// Wall-clock time the lease runs out, epoch ms (N), written by the holder; informational, since
    /// expiry is judged by watching `lease_counter` on the reader's own monotonic clock.
    pub const LEASE_EXPIRY: &str = "lease_expiry";
    /// Incremented by every successful write to the row (N).
    pub const LEASE_COUNTER: &str = "lease_counter";
    /// Last position fully processed (S), see [`Checkpoint`](super::Checkpoint).
    pub const CHECKPOINT: &str = "checkpoint";
    /// With a sequence-number `checkpoint`, inside a KPL aggregate: the last user record of that Kinesis
    /// record that is done (N, 0..n-1). Absent: the whole Kinesis record is done.
    pub const CHECKPOINT_SUBSEQUENCE: &str = "checkpoint_subsequence";
    /// Shard ids of the shard's parents (SS), absent for a shard without parents. A child is read only
    /// after every parent has checkpoint `SHARD_END`.
    pub const PARENT_SHARD_IDS: &str = "parent_shard_ids";
    /// A worker asking the holder to hand the lease over (S); written without moving the counter, so
    /// it never disturbs the holder's renewals or anyone's expiry watch. Cleared by the handover.
    pub const HANDOFF_TO: &str = "handoff_to";
    /// When the stream this row belongs to was created, epoch ms (N): which incarnation of a stream
    /// name the row's checkpoint is about. A row stamped with another creation time than the stream's
    /// (deleted and recreated under the same name) is replaced, never applied. Absent on rows written
    /// before it existed, which count as the current stream's.
    pub const STREAM_CREATED: &str = "stream_created";
    /// How far behind the holder was on this shard when it last wrote the row, in milliseconds (N):
    /// the age of the oldest record read but not yet finished, folded with the service's
    /// `millisBehindLatest` (docs/lease-protocol.md). Written on renewals and checkpoints the holder
    /// makes anyway; absent until a holder has measured it.
    pub const LAG_MS: &str = "lag_ms";
    /// The holder's moving figure of the shard's records per second (N), written with `lag_ms`
    /// (see `lease::load`); absent until measured. With `LOAD_BYTES` and `LOAD_BUSY`, all or none.
    pub const LOAD_RECORDS: &str = "load_records";
    /// The holder's moving figure of the shard's record bytes per second (N).
    pub const LOAD_BYTES: &str = "load_bytes";
    /// The holder's moving figure of its processor's busy milliseconds per second on the shard (N).
    pub const LOAD_BUSY: &str = "load_busy";
    /// Window consumers (`spec.window`): records of the shard handed to the processor so far (N), as
    /// its holders counted them, written with `lag_ms` (no extra write). A holder taking the lease over
    /// counts on from it, so repeats after a crash are counted again. Absent on live consumers' rows.
    pub const WINDOW_RECORDS: &str = "window_records";
    /// On a membership row: where the worker takes handoff notices (S, `host:port` of its HTTP
    /// endpoints), so a worker that releases leases to it can tell it at once. Absent when unknown.
    pub const MEMBER_ADDRESS: &str = "member_address";
    /// On a membership row: when the worker was asked to drain, epoch ms (N), written by `leasehold
    /// drain` and removed by `drain --cancel`. While it is present the worker takes no lease and hands
    /// every lease it holds to the others, who leave it out of their fair shares. Written without
    /// moving the counter (the counter is the worker's own proof of life); the heartbeat leaves it be.
    pub const MEMBER_DRAINING: &str = "member_draining";
    /// On a progress row (`lease::progress`, `leasehold redrive`'s rows): the sequence numbers done
    /// beyond its checkpoint (SS).
    pub const PROGRESS_DONE: &str = "redrive_done";
    /// On the group's requeue-key row ([`requeue_key_row`](super::requeue_key_row)): the key requeued
    /// copies are signed with, 64 hex digits (S). Written once, by the first worker that needs it.
    pub const REQUEUE_SECRET: &str = "requeue_secret";
}

/// `lease_key` prefix of membership rows: one per live worker, `#worker:<owner>`, renewed like a lease
/// so workers can count each other. `#` cannot appear in a stream name, so these never collide with
/// shard rows.
pub const MEMBER_PREFIX: &str = "#worker:";

/// `lease_key` prefix of term rows: a role one worker of the group holds at a time (the shard
/// discovery, `#term:discovery`), taken, renewed and expired exactly like a shard's lease, but never
/// listed among the leases nor balanced.
pub const TERM_PREFIX: &str = "#term:";

/// The key of the term row named `name` (`#term:<name>`).
pub fn term_key(name: &str) -> LeaseKey {
    LeaseKey::new(TERM_PREFIX.trim_end_matches(':'), name)
}

/// The key of the group's change row (`#term:changes`): a term-shaped row nobody holds, whose counter
/// [`GroupRows::announce`](super::GroupRows::announce) moves.
pub fn changes_key() -> LeaseKey {
    term_key("changes")
}

/// The key of the group's requeue-key row (`#term:requeue-key`): a term-shaped row nobody holds,
/// holding [`attr::REQUEUE_SECRET`].
pub fn requeue_key_row() -> LeaseKey {
    term_key("requeue-key")
}

/// A fresh requeue secret: 32 random bytes as 64 hex digits (what `dispatch`'s `RequeueKey` reads).
pub fn new_requeue_secret() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// The attributes of a fresh requeue-key row holding `secret`.
pub fn encode_requeue_row(secret: &str) -> Attributes {
    let mut attrs = encode_new(&NewLease {
        key: requeue_key_row(),
        checkpoint: Checkpoint::TrimHorizon,
        parent_shard_ids: vec![],
        stream_created: None,
    });
    attrs.insert(attr::REQUEUE_SECRET.into(), AttrValue::S(secret.to_string()));
    attrs
}

/// The secret of a requeue-key row as stored; a row without one is [`Malformed`].
pub fn decode_requeue_secret(attrs: &Attributes) -> Result<String, Malformed> {
    match string(attrs, attr::REQUEUE_SECRET) {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(Malformed { key: raw_key(attrs), reason: "requeue_secret is missing".into() }),
        Err(reason) => Err(Malformed { key: raw_key(attrs), reason }),
    }
}

/// One attribute value, in the subset of DynamoDB's types a lease row uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    /// A string (`S`).
    S(String),
    /// A number, kept as its decimal text (`N`).
    N(String),
    /// A string set (`SS`).
    Ss(Vec<String>),
    /// Any other DynamoDB type, named; never valid in a lease row.
    Other(&'static str),
}

/// A lease row as attribute name -> value.
pub type Attributes = HashMap<String, AttrValue>;

/// The state of one lease row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Which stream and shard the row is for.
    pub key: LeaseKey,
    /// The worker holding it, `None` when free.
    pub owner: Option<String>,
    /// Wall-clock expiry the holder wrote (epoch ms); `None` when free.
    pub expiry_ms: Option<i64>,
    /// Incremented by every successful write.
    pub counter: u64,
    /// Last position fully processed.
    pub checkpoint: Checkpoint,
    /// The shard's parents, empty for a shard that has none.
    pub parent_shard_ids: Vec<String>,
    /// A worker that asked the holder to hand this lease over.
    pub handoff_to: Option<String>,
    /// When the row's stream was created (epoch ms), `None` on rows written before it was recorded.
    pub stream_created: Option<i64>,
    /// The holder's last measure of the shard's lag ([`attr::LAG_MS`]), `None` when never written.
    pub lag_ms: Option<u64>,
    /// The holder's last measure of the shard's load ([`attr::LOAD_RECORDS`] and the two beside it),
    /// `None` when never written.
    pub load: Option<ShardLoad>,
    /// Window consumers: records handed to the processor ([`attr::WINDOW_RECORDS`]), `None` when never
    /// written.
    pub window_records: Option<u64>,
}

impl Lease {
    /// The row of `key` at `checkpoint` as first written: no owner, counter 0, nothing measured yet
    /// (the base that tests and builders change with struct update syntax).
    pub fn unheld(key: LeaseKey, checkpoint: Checkpoint) -> Self {
        Lease {
            key,
            owner: None,
            expiry_ms: None,
            counter: 0,
            checkpoint,
            parent_shard_ids: Vec::new(),
            handoff_to: None,
            stream_created: None,
            lag_ms: None,
            load: None,
            window_records: None,
        }
    }

    /// True when `owner` holds this lease according to this copy of the row.
    pub fn is_held_by(&self, owner: &str) -> bool {
        self.owner.as_deref() == Some(owner)
    }
}

/// A row to create for a newly discovered shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLease {
    /// Which stream and shard the row is for.
    pub key: LeaseKey,
    /// Where processing starts.
    pub checkpoint: Checkpoint,
    /// The shard's parents, empty for a shard that has none.
    pub parent_shard_ids: Vec<String>,
    /// When the shard's stream was created (epoch ms), as described when the row was planned.
    pub stream_created: Option<i64>,
}

/// Why a row could not be read as a [`Lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// The row's `lease_key` as stored (possibly not a valid key).
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

fn string(attrs: &Attributes, name: &str) -> Result<Option<String>, String> {
    match attrs.get(name) {
        None => Ok(None),
        Some(AttrValue::S(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{name} must be a string, found {}", type_name(other))),
    }
}

fn number<T: std::str::FromStr>(attrs: &Attributes, name: &str) -> Result<Option<T>, String> {
    match attrs.get(name) {
        None => Ok(None),
        Some(AttrValue::N(n)) => n.parse().map(Some).map_err(|_| format!("{name} = {n} is out of range")),
        Some(other) => Err(format!("{name} must be a number, found {}", type_name(other))),
    }
}

fn type_name(value: &AttrValue) -> &'static str {
    match value {
        AttrValue::S(_) => "S",
        AttrValue::N(_) => "N",
        AttrValue::Ss(_) => "SS",
        AttrValue::Other(name) => name,
    }
}

/// The row's `lease_key` as text, for reporting a row that may be malformed.
pub fn raw_key(attrs: &Attributes) -> String {
    match attrs.get(attr::LEASE_KEY) {
        Some(AttrValue::S(s)) => s.clone(),
        Some(other) => format!("<{} lease_key>", type_name(other)),
        None => "<missing lease_key>".into(),
    }
}

/// Reads a row; a row missing a required attribute or holding a wrong type is [`Malformed`].
pub fn decode(attrs: &Attributes) -> Result<Lease, Malformed> {
    let malformed = |reason: String| Malformed { key: raw_key(attrs), reason };
    let key_text =
        string(attrs, attr::LEASE_KEY).map_err(malformed)?.ok_or_else(|| malformed("lease_key is missing".into()))?;
    let key = LeaseKey::parse(&key_text)
        .ok_or_else(|| malformed(format!("lease_key {key_text:?} is not <stream>:<shardId>")))?;
    let owner = string(attrs, attr::LEASE_OWNER).map_err(malformed)?;
    let expiry_ms = number(attrs, attr::LEASE_EXPIRY).map_err(malformed)?;
    let counter = number(attrs, attr::LEASE_COUNTER)
        .map_err(malformed)?
        .ok_or_else(|| malformed("lease_counter is missing".into()))?;
    let sub_sequence = number(attrs, attr::CHECKPOINT_SUBSEQUENCE).map_err(malformed)?;
    let checkpoint =
        string(attrs, attr::CHECKPOINT).map_err(malformed)?.ok_or_else(|| malformed("checkpoint is missing".into()))?;
    let checkpoint = Checkpoint::from_attributes(&checkpoint, sub_sequence).map_err(|e| malformed(e.to_string()))?;
    let parent_shard_ids = match attrs.get(attr::PARENT_SHARD_IDS) {
        None => Vec::new(),
        Some(AttrValue::Ss(ids)) => ids.clone(),
        Some(other) => {
            return Err(malformed(format!("parent_shard_ids must be a string set, found {}", type_name(other))));
        }
    };
    let handoff_to = string(attrs, attr::HANDOFF_TO).map_err(malformed)?;
    let stream_created = number(attrs, attr::STREAM_CREATED).map_err(malformed)?;
    let lag_ms = number(attrs, attr::LAG_MS).map_err(malformed)?;
    let load = decode_load(attrs).map_err(malformed)?;
    let window_records = number(attrs, attr::WINDOW_RECORDS).map_err(malformed)?;
    Ok(Lease {
        key,
        owner,
        expiry_ms,
        counter,
        checkpoint,
        parent_shard_ids,
        handoff_to,
        stream_created,
        lag_ms,
        load,
        window_records,
    })
}

/// The three load attributes of `load`, as a holder's write sets them.
pub fn load_values(load: &ShardLoad) -> [(&'static str, u64); 3] {
    [
        (attr::LOAD_RECORDS, load.records_per_s),
        (attr::LOAD_BYTES, load.bytes_per_s),
        (attr::LOAD_BUSY, load.busy_ms_per_s),
    ]
}

/// The load a row carries: all three attributes or none; each a number no larger than [`MAX_FIGURE`]
/// (a row is outside input: a figure no shard can carry is refused, never summed).
fn decode_load(attrs: &Attributes) -> Result<Option<ShardLoad>, String> {
    let records = number::<u64>(attrs, attr::LOAD_RECORDS)?;
    let bytes = number::<u64>(attrs, attr::LOAD_BYTES)?;
    let busy = number::<u64>(attrs, attr::LOAD_BUSY)?;
    for (name, value) in [(attr::LOAD_RECORDS, records), (attr::LOAD_BYTES, bytes), (attr::LOAD_BUSY, busy)] {
        if value.is_some_and(|v| v > MAX_FIGURE) {
            return Err(format!("{name} is larger than {MAX_FIGURE}"));
        }
    }
    match (records, bytes, busy) {
        (None, None, None) => Ok(None),
        (Some(records_per_s), Some(bytes_per_s), Some(busy_ms_per_s)) => {
            Ok(Some(ShardLoad { records_per_s, bytes_per_s, busy_ms_per_s }))
        }
        _ => Err("load_records, load_bytes and load_busy must be written together".into()),
    }
}

/// A worker's membership row as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The worker's owner id.
    pub owner: String,
    /// Incremented by every heartbeat.
    pub counter: u64,
    /// False once this reader has seen the counter unchanged for a whole lease duration.
    pub alive: bool,
    /// Where the worker takes handoff notices ([`attr::MEMBER_ADDRESS`]), when it said.
    pub address: Option<String>,
    /// True while the row carries [`attr::MEMBER_DRAINING`]: the worker hands its leases away.
    pub draining: bool,
    /// The expiry its last heartbeat wrote (epoch ms, the worker's wall clock): for tools that judge
    /// liveness from one read; workers judge by the counter on their own clock.
    pub expiry_ms: Option<i64>,
}

impl Member {
    /// True while its last heartbeat's expiry lies ahead of `now_ms` (a wall clock, epoch ms).
    pub fn fresh(&self, now_ms: i64) -> bool {
        self.expiry_ms.is_some_and(|expiry| expiry > now_ms)
    }
}

/// True when the row is a membership row rather than a shard's lease.
pub fn is_member_row(attrs: &Attributes) -> bool {
    matches!(attrs.get(attr::LEASE_KEY), Some(AttrValue::S(key)) if key.starts_with(MEMBER_PREFIX))
}

/// Reads a membership row (`alive` is left true; the store judges it).
pub fn decode_member(attrs: &Attributes) -> Result<Member, Malformed> {
    let malformed = |reason: String| Malformed { key: raw_key(attrs), reason };
    let key = raw_key(attrs);
    let owner = key.strip_prefix(MEMBER_PREFIX).unwrap_or_default().to_string();
    let counter = number(attrs, attr::LEASE_COUNTER)
        .map_err(malformed)?
        .ok_or_else(|| malformed("lease_counter is missing".into()))?;
    let address = string(attrs, attr::MEMBER_ADDRESS).map_err(malformed)?;
    let draining = number::<i64>(attrs, attr::MEMBER_DRAINING).map_err(malformed)?.is_some();
    let expiry_ms = number(attrs, attr::LEASE_EXPIRY).map_err(malformed)?;
    Ok(Member { owner, counter, alive: true, address, draining, expiry_ms })
}

/// A row of the table as read: a shard's lease or a worker's membership.
pub enum Row {
    /// A shard's lease row.
    Lease(Lease),
    /// A worker's membership row (`alive` left true; the store judges it).
    Member(Member),
    /// A term row (see [`TERM_PREFIX`]).
    Term(Lease),
}

/// Reads any row of the table, telling membership rows from leases.
pub fn decode_row(attrs: &Attributes) -> Result<Row, Malformed> {
    if is_member_row(attrs) {
        return decode_member(attrs).map(Row::Member);
    }
    let lease = decode(attrs)?;
    Ok(if lease.key.stream() == TERM_PREFIX.trim_end_matches(':') { Row::Term(lease) } else { Row::Lease(lease) })
}

/// The row's `lease_counter`, whatever kind of row it is; `None` when missing or not a number (such a
/// row cannot satisfy a condition on its counter).
pub fn stored_counter(attrs: &Attributes) -> Option<u64> {
    number(attrs, attr::LEASE_COUNTER).ok().flatten()
}

/// The `lease_key` text of a worker's membership row.
pub fn member_row_key(owner: &str) -> String {
    format!("{MEMBER_PREFIX}{owner}")
}

/// The key under which a worker's membership row is kept (and observed).
pub fn member_key(owner: &str) -> LeaseKey {
    LeaseKey::new(MEMBER_PREFIX.trim_end_matches(':'), owner)
}

/// Writes `checkpoint` into a row: its `checkpoint` attribute, and its sub-sequence or none.
pub fn put_checkpoint(attrs: &mut Attributes, checkpoint: &Checkpoint) {
    attrs.insert(attr::CHECKPOINT.into(), AttrValue::S(checkpoint.attribute()));
    match checkpoint.sub_sequence() {
        Some(sub_sequence) => attrs.insert(attr::CHECKPOINT_SUBSEQUENCE.into(), AttrValue::N(sub_sequence.to_string())),
        None => attrs.remove(attr::CHECKPOINT_SUBSEQUENCE),
    };
}

/// The attributes of a freshly created row (counter 0, no owner).
pub fn encode_new(lease: &NewLease) -> Attributes {
    let mut attrs = Attributes::new();
    attrs.insert(attr::LEASE_KEY.into(), AttrValue::S(lease.key.to_string()));
    attrs.insert(attr::LEASE_COUNTER.into(), AttrValue::N("0".into()));
    put_checkpoint(&mut attrs, &lease.checkpoint);
    if !lease.parent_shard_ids.is_empty() {
        attrs.insert(attr::PARENT_SHARD_IDS.into(), AttrValue::Ss(lease.parent_shard_ids.clone()));
    }
    if let Some(created) = lease.stream_created {
        attrs.insert(attr::STREAM_CREATED.into(), AttrValue::N(created.to_string()));
    }
    attrs
}

/// The attributes of `new` replacing the row `seen` (a former incarnation's): the counter moves on and the
/// owner and expiry stay, so the former holder's next write is refused while anyone else takes the row
/// only once it has seen that counter unchanged for a lease duration, as for any expired lease. A free
/// row stays free.
pub fn encode_replacement(seen: &Lease, new: &NewLease) -> Attributes {
    let mut attrs = encode_new(new);
    // Wrapping: the counter only has to differ from the one seen (a hostile row may hold u64::MAX).
    attrs.insert(attr::LEASE_COUNTER.into(), AttrValue::N(seen.counter.wrapping_add(1).to_string()));
    if let Some(owner) = &seen.owner {
        attrs.insert(attr::LEASE_OWNER.into(), AttrValue::S(owner.clone()));
    }
    if let Some(expiry) = seen.expiry_ms {
        attrs.insert(attr::LEASE_EXPIRY.into(), AttrValue::N(expiry.to_string()));
    }
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, AttrValue)]) -> Attributes {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn new_row_decodes_to_a_free_lease() {
        let new = NewLease {
            key: LeaseKey::new("s", "shardId-000000000002"),
            checkpoint: Checkpoint::TrimHorizon,
            parent_shard_ids: vec!["shardId-000000000000".into()],
            stream_created: Some(1_700_000_000_123),
        };
        let lease = decode(&encode_new(&new)).expect("valid row");
        assert_eq!(lease.stream_created, Some(1_700_000_000_123));
        assert_eq!(lease.key, new.key);
        assert_eq!((lease.owner, lease.expiry_ms, lease.counter), (None, None, 0));
        assert_eq!(lease.parent_shard_ids, new.parent_shard_ids);
    }

    #[test]
    fn a_sub_sequence_is_its_own_attribute_and_needs_a_sequence() {
        let mut attrs = encode_new(&NewLease {
            key: LeaseKey::new("s", "shardId-000000000000"),
            checkpoint: Checkpoint::TrimHorizon,
            parent_shard_ids: vec![],
            stream_created: None,
        });
        let inside = Checkpoint::SubSequence { sequence: "123".into(), sub_sequence: 41 };
        put_checkpoint(&mut attrs, &inside);
        assert_eq!(attrs.get(attr::CHECKPOINT), Some(&AttrValue::S("123".into())));
        assert_eq!(attrs.get(attr::CHECKPOINT_SUBSEQUENCE), Some(&AttrValue::N("41".into())));
        assert_eq!(decode(&attrs).map(|l| l.checkpoint), Ok(inside));
        put_checkpoint(&mut attrs, &Checkpoint::Sequence("124".into()));
        assert_eq!(attrs.get(attr::CHECKPOINT_SUBSEQUENCE), None, "a whole record done clears it");
        attrs.insert(attr::CHECKPOINT.into(), AttrValue::S("SHARD_END".into()));
        attrs.insert(attr::CHECKPOINT_SUBSEQUENCE.into(), AttrValue::N("3".into()));
        assert!(decode(&attrs).is_err(), "SHARD_END with a sub-sequence is malformed");
    }

    #[test]
    fn wrong_types_and_missing_attributes_are_malformed_with_their_key() {
        let cases = [
            (
                row(&[("lease_key", AttrValue::S("s:0".into())), ("checkpoint", AttrValue::S("LATEST".into()))]),
                "lease_counter is missing",
            ),
            (
                row(&[
                    ("lease_key", AttrValue::S("s:0".into())),
                    ("lease_counter", AttrValue::S("7".into())),
                    ("checkpoint", AttrValue::S("LATEST".into())),
                ]),
                "lease_counter must be a number, found S",
            ),
            (
                row(&[
                    ("lease_key", AttrValue::S("s:0".into())),
                    ("lease_counter", AttrValue::N("-1".into())),
                    ("checkpoint", AttrValue::S("LATEST".into())),
                ]),
                "lease_counter = -1 is out of range",
            ),
            (
                row(&[("lease_key", AttrValue::S("nocolon".into())), ("lease_counter", AttrValue::N("1".into()))]),
                "is not <stream>:<shardId>",
            ),
        ];
        for (attrs, reason) in cases {
            let err = decode(&attrs).expect_err("malformed");
            assert!(err.reason.contains(reason), "{err:?} should say {reason}");
            assert_eq!(err.key, raw_key(&attrs));
        }
    }

    #[test]
    fn a_load_round_trips_and_bad_ones_are_refused() {
        let base = || {
            row(&[
                ("lease_key", AttrValue::S("s:0".into())),
                ("lease_counter", AttrValue::N("1".into())),
                ("checkpoint", AttrValue::S("LATEST".into())),
            ])
        };
        assert_eq!(decode(&base()).map(|l| l.load), Ok(None), "no load written yet");
        for load in [
            ShardLoad::default(),
            ShardLoad { records_per_s: 1200, bytes_per_s: 1_048_576, busy_ms_per_s: 3500 },
            ShardLoad { records_per_s: MAX_FIGURE, bytes_per_s: MAX_FIGURE, busy_ms_per_s: MAX_FIGURE },
        ] {
            let mut attrs = base();
            for (name, value) in load_values(&load) {
                attrs.insert(name.into(), AttrValue::N(value.to_string()));
            }
            assert_eq!(decode(&attrs).map(|l| l.load), Ok(Some(load)));
        }
        let bad: [(&[(&str, &str)], &str); 5] = [
            (&[("load_records", "1"), ("load_bytes", "2")], "written together"),
            (&[("load_records", "1"), ("load_bytes", "2"), ("load_busy", "-3")], "load_busy = -3 is out of range"),
            (&[("load_records", "1099511627777"), ("load_bytes", "2"), ("load_busy", "3")], "load_records is larger"),
            (&[("load_records", "1"), ("load_bytes", "99999999999999999999999"), ("load_busy", "3")], "out of range"),
            (&[("load_records", "1.5"), ("load_bytes", "2"), ("load_busy", "3")], "out of range"),
        ];
        for (values, reason) in bad {
            let mut attrs = base();
            for (name, value) in values {
                attrs.insert((*name).into(), AttrValue::N((*value).into()));
            }
            let err = decode(&attrs).expect_err("malformed");
            assert!(err.reason.contains(reason), "{err:?} should say {reason}");
        }
        let mut attrs = base();
        attrs.insert(attr::LOAD_BUSY.into(), AttrValue::S("hot".into()));
        assert!(decode(&attrs).is_err(), "a load of the wrong type is malformed");
    }

    #[test]
    fn a_membership_row_says_whether_its_worker_drains() {
        let mut attrs =
            row(&[("lease_key", AttrValue::S("#worker:w1".into())), ("lease_counter", AttrValue::N("4".into()))]);
        assert_eq!(decode_member(&attrs).map(|m| (m.owner, m.draining)), Ok(("w1".into(), false)));
        attrs.insert(attr::MEMBER_DRAINING.into(), AttrValue::N("1700000000000".into()));
        assert_eq!(decode_member(&attrs).map(|m| m.draining), Ok(true));
        attrs.insert(attr::MEMBER_DRAINING.into(), AttrValue::S("yes".into()));
        assert!(decode_member(&attrs).is_err(), "a mark of the wrong type is malformed, like any attribute");
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::checkpoint::properties::any_checkpoint;

    fn any_new_lease() -> impl Strategy<Value = NewLease> {
        (
            "[a-zA-Z0-9_.-]{1,128}",
            "\\PC{1,64}",
            any_checkpoint(),
            proptest::collection::vec("shardId-[0-9]{12}", 0..3),
            proptest::option::of(any::<i64>()),
        )
            .prop_map(|(stream, shard, checkpoint, parent_shard_ids, stream_created)| NewLease {
                key: LeaseKey::new(stream, shard),
                checkpoint,
                parent_shard_ids,
                stream_created,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn a_new_row_decodes_to_what_was_encoded(new in any_new_lease()) {
            let lease = decode(&encode_new(&new)).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(&lease.key, &new.key);
            prop_assert_eq!(&lease.checkpoint, &new.checkpoint);
            prop_assert_eq!(&lease.parent_shard_ids, &new.parent_shard_ids);
            prop_assert_eq!(lease.stream_created, new.stream_created);
            prop_assert_eq!((lease.owner, lease.expiry_ms, lease.counter, lease.handoff_to, lease.lag_ms),
                (None, None, 0, None, None));
        }

        #[test]
        fn a_replacement_keeps_owner_and_expiry_and_moves_the_counter(
            seen in any_new_lease(),
            new in any_new_lease(),
            owner in proptest::option::of("[a-z0-9-]{1,40}"),
            expiry_ms in proptest::option::of(any::<i64>()),
            counter in prop_oneof![any::<u64>(), Just(0), Just(u64::MAX)],
        ) {
            let mut seen = decode(&encode_new(&seen)).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            (seen.owner, seen.expiry_ms, seen.counter) = (owner, expiry_ms, counter);
            let lease = decode(&encode_replacement(&seen, &new)).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(&lease.checkpoint, &new.checkpoint);
            prop_assert_eq!((&lease.owner, lease.expiry_ms), (&seen.owner, seen.expiry_ms));
            prop_assert_ne!(lease.counter, seen.counter, "the former holder's next write must be refused");
        }

        #[test]
        fn a_checkpoint_written_over_any_other_reads_back(first in any_checkpoint(), then in any_checkpoint()) {
            let mut attrs = encode_new(&NewLease {
                key: LeaseKey::new("s", "shardId-000000000000"),
                checkpoint: first,
                parent_shard_ids: vec![],
                stream_created: None,
            });
            put_checkpoint(&mut attrs, &then);
            prop_assert_eq!(decode(&attrs).map(|l| l.checkpoint), Ok(then));
        }
    }
}
