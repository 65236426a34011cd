//! From Kinesis records to the records a processor sees: KPL aggregates unpacked into their user
//! records (docs/kpl.md), each with the checkpoint that covers it once it and everything before it
//! are done; and, when a reader resumes inside an aggregate, the user records already done left out.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::kpl::{self, HashKeyRange, Opened, Producer};
use crate::lease::Checkpoint;
use crate::metrics::Metrics;
use crate::processor::Record;

/// How long after a failed ListShards the reader delivers KPL aggregates whole before asking again.
const RANGE_RETRY: Duration = Duration::from_secs(10);

/// One shard's unpacking state.
pub(super) struct Unpacker {
    enabled: bool,
    /// Resuming inside this aggregate (sequence number): its user records up to this sub-sequence
    /// are done. Only the first Kinesis record read can be it (the iterator starts at it).
    resume: Option<(String, u32)>,
    /// The shard's hash key range, once listed.
    range: Option<HashKeyRange>,
    range_failed_at: Option<Instant>,
    corrupt_logged: bool,
    metrics: Arc<Metrics>,
    shard: String,
}

impl Unpacker {
    /// The unpacker of a shard read from `start`; `enabled` is `reader.deaggregate`.
    pub(super) fn new(enabled: bool, start: &Checkpoint, metrics: Arc<Metrics>, shard: String) -> Self {
        let resume = match start {
            Checkpoint::SubSequence { sequence, sub_sequence } => Some((sequence.clone(), *sub_sequence)),
            _ => None,
        };
        Self { enabled, resume, range: None, range_failed_at: None, corrupt_logged: false, metrics, shard }
    }

    /// What `record`'s payload is (always plain with de-aggregation off), its user records not yet made.
    pub(super) fn deaggregate(&self, record: &Record) -> Opened {
        if self.enabled { kpl::open(&record.data) } else { Opened::Plain }
    }

    /// True when unpacking `record` needs the shard's hash key range first: a KPL aggregate, whose user
    /// records hashing outside the shard are skipped.
    pub(super) fn wants_range(&self, record: &Record, opened: &Opened) -> bool {
        let Opened::Aggregate(aggregate) = opened else { return false };
        self.range.is_none()
            && self.range_failed_at.is_none_or(|at| at.elapsed() >= RANGE_RETRY)
            && aggregate.producer(&record.partition_key) == Producer::Kpl
    }

    /// Takes the answer of ListShards for this shard. Until a range is known, KPL aggregates are
    /// delivered whole: a repeat is allowed, a loss is not.
    pub(super) fn set_range<E: std::fmt::Display>(&mut self, listed: Result<Option<HashKeyRange>, E>) {
        match listed {
            Ok(Some(range)) => self.range = Some(range),
            Ok(None) => {
                tracing::warn!(shard = %self.shard, "shard not listed; its KPL aggregates are delivered whole");
                self.range = Some(HashKeyRange::FULL);
            }
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "cannot list the shard's hash key range; delivering KPL aggregates whole for now");
                self.range_failed_at = Some(Instant::now());
            }
        }
    }

    /// The records to hand on for one Kinesis record, in order, each with the checkpoint covering it:
    /// all of them at once (the unit tests' view of [`Unpacker::unpack`]).
    #[cfg(test)]
    pub(super) fn expand(&mut self, record: Record, opened: Opened) -> Vec<(Record, Checkpoint)> {
        self.unpack(record, opened).collect()
    }

    /// The records to hand on for one Kinesis record, in order, each with the checkpoint covering it,
    /// each made only when the reader takes it.
    ///
    /// Why lazily: an aggregate of 1 MiB can hold ~175,000 user records; made whole, with their keys and
    /// the aggregate's stream, shard and sequence number copied into each `Record`, that is tens of MB
    /// per Kinesis record. Taken one at a time, only the dispatcher's window of them exist at once.
    pub(super) fn unpack(&mut self, record: Record, opened: Opened) -> Expansion {
        let resume = self.resume.take();
        let sequence = record.sequence_number.clone();
        let aggregate = match opened {
            Opened::Plain => return Expansion::one(record, sequence),
            Opened::Corrupt(reason) => {
                self.metrics.records_not_deaggregated.inc();
                if !std::mem::replace(&mut self.corrupt_logged, true) {
                    tracing::warn!(shard = %self.shard, sequence = %sequence, reason = %reason,
                        "record has the KPL magic bytes but is not a readable aggregate; delivered whole (logged once per shard, counted in leasehold_records_not_deaggregated_total)");
                }
                return Expansion::one(record, sequence);
            }
            Opened::Aggregate(aggregate) => aggregate,
        };
        // As `kpl::for_shard`: only a KPL aggregate's user records outside the shard are skipped.
        let range = (aggregate.producer(&record.partition_key) == Producer::Kpl)
            .then(|| self.range.unwrap_or(HashKeyRange::FULL))
            .filter(|range| *range != HashKeyRange::FULL);
        let inside =
            |index: usize| range.is_none_or(|range| aggregate.hash_key(index).is_some_and(|h| range.contains(h)));
        if range.is_some() {
            let skipped = (0..aggregate.len()).filter(|index| !inside(*index)).count();
            if skipped > 0 {
                self.metrics.skipped_user_records("outside_shard", skipped as u64);
            }
        }
        let done_through = resume.filter(|(at, _)| *at == sequence).map(|(_, sub)| sub as usize);
        let first = done_through.map_or(0, |done| done + 1);
        // The last one delivered covers the whole aggregate, skipped user records after it too.
        let last = (first..aggregate.len()).rev().find(|index| inside(*index));
        Expansion(Inner::Users(Box::new(Users { record, sequence, aggregate, range, next: first, last })))
    }
}

/// The records one Kinesis record gives the dispatcher, made as they are taken ([`Unpacker::unpack`]).
pub(super) struct Expansion(Inner);

enum Inner {
    /// A plain (or corrupt) record: itself, once.
    One(Option<(Record, Checkpoint)>),
    /// An aggregate's user records (boxed: one per Kinesis record, and four times a plain one's size).
    Users(Box<Users>),
}

/// An aggregate being handed on.
struct Users {
    /// The Kinesis record: its stream, shard, sequence number and arrival go into each user record.
    record: Record,
    sequence: String,
    aggregate: kpl::Aggregate,
    /// Set for a KPL aggregate on a shard not covering every hash key: user records outside it are
    /// skipped.
    range: Option<HashKeyRange>,
    /// The next user record to consider.
    next: usize,
    /// The last one to deliver, which covers the whole aggregate; `None` when none is.
    last: Option<usize>,
}

impl Expansion {
    fn one(record: Record, sequence: String) -> Self {
        Expansion(Inner::One(Some((record, Checkpoint::Sequence(sequence)))))
    }
}

impl Iterator for Expansion {
    type Item = (Record, Checkpoint);

    fn next(&mut self) -> Option<Self::Item> {
        let users = match &mut self.0 {
            Inner::One(record) => return record.take(),
            Inner::Users(users) => users,
        };
        let last = users.last?;
        while users.next <= last {
            let index = users.next;
            users.next += 1;
            let aggregate = &users.aggregate;
            if let Some(range) = users.range
                && !aggregate.hash_key(index).is_some_and(|h| range.contains(h))
            {
                continue;
            }
            let user = aggregate.get(index)?;
            let covers = if index == last {
                Checkpoint::Sequence(users.sequence.clone())
            } else {
                Checkpoint::SubSequence { sequence: users.sequence.clone(), sub_sequence: user.sub_sequence }
            };
            let unpacked = Record {
                stream: users.record.stream.clone(),
                shard_id: users.record.shard_id.clone(),
                sequence_number: users.sequence.clone(),
                partition_key: user.partition_key,
                explicit_hash_key: user.explicit_hash_key,
                data: user.data,
                arrival_ms: users.record.arrival_ms,
                sub_sequence_number: Some(user.sub_sequence),
            };
            return Some((unpacked, covers));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn record(sequence: &str, partition_key: &str, data: Bytes) -> Record {
        Record {
            stream: Arc::from("s"),
            shard_id: Arc::from("shardId-000000000000"),
            sequence_number: sequence.into(),
            partition_key: partition_key.into(),
            explicit_hash_key: None,
            data,
            arrival_ms: Some(5),
            sub_sequence_number: None,
        }
    }

    fn unpacker(enabled: bool, start: &Checkpoint) -> Unpacker {
        Unpacker::new(enabled, start, Arc::new(Metrics::default()), "s:shardId-000000000000".into())
    }

    fn run(u: &mut Unpacker, r: Record) -> Vec<(Record, Checkpoint)> {
        let deaggregated = u.deaggregate(&r);
        u.expand(r, deaggregated)
    }

    fn three() -> Bytes {
        kpl::aggregate([("k0", None, &b"a"[..]), ("k1", Some("7"), &b"b"[..]), ("k2", None, &b"c"[..])])
    }

    fn sub(sequence: &str, sub_sequence: u32) -> Checkpoint {
        Checkpoint::SubSequence { sequence: sequence.into(), sub_sequence }
    }

    #[test]
    fn user_records_get_their_own_keys_and_the_last_covers_the_aggregate() {
        let mut u = unpacker(true, &Checkpoint::TrimHorizon);
        let out = run(&mut u, record("10", "k0", three()));
        let got: Vec<_> = out
            .iter()
            .map(|(r, c)| {
                (
                    r.partition_key.as_str(),
                    r.explicit_hash_key.as_deref(),
                    &r.data[..],
                    r.sub_sequence_number,
                    c.clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("k0", None, &b"a"[..], Some(0), sub("10", 0)),
                ("k1", Some("7"), &b"b"[..], Some(1), sub("10", 1)),
                ("k2", None, &b"c"[..], Some(2), Checkpoint::Sequence("10".into())),
            ]
        );
        assert!(out.iter().all(|(r, _)| r.sequence_number == "10" && r.arrival_ms == Some(5)));
        let plain = run(&mut u, record("11", "p", Bytes::from_static(b"plain")));
        assert_eq!(plain.len(), 1);
        assert_eq!((plain[0].0.sub_sequence_number, &plain[0].1), (None, &Checkpoint::Sequence("11".into())));
    }

    #[test]
    fn resuming_inside_an_aggregate_skips_exactly_what_is_done() {
        let mut u = unpacker(true, &sub("10", 0));
        let out = run(&mut u, record("10", "k0", three()));
        assert_eq!(out.iter().map(|(r, _)| r.sub_sequence_number).collect::<Vec<_>>(), vec![Some(1), Some(2)]);
        let again = run(&mut u, record("12", "k0", three()));
        assert_eq!(again.len(), 3, "only the aggregate resumed in is filtered");
        let mut other = unpacker(true, &sub("9", 2));
        assert_eq!(run(&mut other, record("10", "k0", three())).len(), 3, "a different first record: all of it");
    }

    #[test]
    fn off_or_corrupt_delivers_the_kinesis_record_whole_and_counts_corruption() {
        let mut off = unpacker(false, &Checkpoint::TrimHorizon);
        let out = run(&mut off, record("10", "k0", three()));
        assert_eq!((out.len(), out[0].0.data.clone()), (1, three()));
        let mut u = unpacker(true, &Checkpoint::TrimHorizon);
        let mut broken = three().to_vec();
        let last = broken.len() - 1;
        broken[last] ^= 0xFF;
        for n in 0..2 {
            let out = run(&mut u, record(&format!("{n}"), "k0", Bytes::from(broken.clone())));
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].0.sub_sequence_number, None);
        }
        assert_eq!(u.metrics.records_not_deaggregated.get(), 2);
    }

    #[test]
    fn kpl_aggregates_skip_what_hashes_outside_the_shard_and_count_it() {
        // The KPL's aggregates are put under partition key "a"; route by explicit hash keys.
        let data = kpl::aggregate([("x", Some("5"), &b"in"[..]), ("y", Some("500"), &b"out"[..])]);
        let mut u = unpacker(true, &Checkpoint::TrimHorizon);
        let r = record("10", "a", data);
        let deaggregated = u.deaggregate(&r);
        assert!(u.wants_range(&r, &deaggregated));
        u.set_range::<String>(Ok(Some(HashKeyRange { start: 0, end: 100 })));
        assert!(!u.wants_range(&r, &deaggregated));
        let out = u.expand(r, deaggregated);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0.partition_key.as_str(), &out[0].1), ("x", &Checkpoint::Sequence("10".into())));
        assert_eq!(u.metrics.user_records_skipped.get_or_create(&crate::metrics::reason("outside_shard")).get(), 1);
        // Another aggregator's aggregate is delivered whole, wherever its user records hash.
        let other = kpl::aggregate([("x", Some("5"), &b"in"[..]), ("y", Some("500"), &b"out"[..])]);
        assert_eq!(run(&mut u, record("11", "x", other)).len(), 2);
    }

    #[test]
    fn without_a_range_kpl_aggregates_are_delivered_whole() {
        let data = kpl::aggregate([("x", Some("5"), &b"in"[..]), ("y", Some("500"), &b"out"[..])]);
        let mut u = unpacker(true, &Checkpoint::TrimHorizon);
        u.set_range::<String>(Err("throttled".into()));
        let r = record("10", "a", data);
        let deaggregated = u.deaggregate(&r);
        assert!(!u.wants_range(&r, &deaggregated), "not asked again at once");
        assert_eq!(u.expand(r, deaggregated).len(), 2);
    }
}
