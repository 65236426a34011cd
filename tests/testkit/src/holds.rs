//! Who held which lease when, judged by the processes' own records rather than by when the test read
//! their lines: each worker's JSON log lines carry the time the worker wrote them (one machine, one
//! clock) and the row's `counter` its lease writes left (the table's own order of writes). A test that
//! compares events of *different* processes must use these: the collector threads that read each
//! process's output lag behind it by different amounts on a busy machine, so the order in which lines
//! arrive says nothing about the order in which the processes acted.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::process::{Delivery, WorkerProcess};

/// What a lease log line says happened to the worker's hold of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEventKind {
    /// `lease acquired` (with the counter the acquire wrote).
    Acquired,
    /// `lease released` (with the counter the release wrote).
    Released,
    /// `lease handed over` (with the counter the release to the taker wrote).
    HandedOver,
    /// `lease lost`: the worker stopped reading; nothing tells where among the row's writes.
    Lost,
    /// `shard ended`: the reader reached the shard's end; the release follows.
    Ended,
}

impl LeaseEventKind {
    /// The log message of each kind, as the worker writes it.
    pub const MESSAGES: [(&'static str, LeaseEventKind); 5] = [
        ("lease acquired", LeaseEventKind::Acquired),
        ("lease released", LeaseEventKind::Released),
        ("lease handed over", LeaseEventKind::HandedOver),
        ("lease lost", LeaseEventKind::Lost),
        ("shard ended", LeaseEventKind::Ended),
    ];

    /// The kind of a log line's `message`, if it is a lease event.
    pub fn of(message: &str) -> Option<Self> {
        Self::MESSAGES.iter().find(|(m, _)| *m == message).map(|(_, kind)| *kind)
    }
}

/// One lease event a worker logged, stamped by the worker itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEvent {
    /// When the worker wrote the line (its `timestamp`, by the machine's one clock).
    pub at: SystemTime,
    /// The lease (`stream:shardId`).
    pub shard: String,
    /// What happened.
    pub kind: LeaseEventKind,
    /// The row's counter after the write, where the line says it (acquire, release, handover).
    pub counter: Option<u64>,
    /// The checkpoint the line names (an acquire's: where reading resumes).
    pub checkpoint: Option<String>,
}

/// The time a worker's JSON log line was written: its `timestamp` field (RFC 3339, UTC).
pub fn logged_at(line: &serde_json::Value) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(line.get("timestamp")?.as_str()?).ok()
}

/// One worker's hold of one lease: from its acquire to its end (None: still held when the logs were read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The worker.
    pub owner: String,
    /// The lease.
    pub shard: String,
    /// When it logged the acquire, and the counter the acquire wrote.
    pub from: (SystemTime, Option<u64>),
    /// When it logged the end, and the counter of the release when it was one.
    pub to: Option<(SystemTime, Option<u64>)>,
    /// The checkpoint it resumed after (`TRIM_HORIZON`, `LATEST`, a sequence number, ...).
    pub resumed_after: Option<String>,
}

impl Hold {
    /// Whether `later` (a hold by another worker, acquired after this one in the row's order) began
    /// while this one still ran: by the row's counters when both writes are known (a release that
    /// succeeded after another worker's acquire is a protocol bug), else by the workers' own clocks.
    fn overlapped_by(&self, later: &Hold) -> bool {
        match self.to {
            None => true,
            Some((_, Some(released))) if later.from.1.is_some() => later.from.1.is_some_and(|c| c <= released),
            Some((ended, _)) => later.from.0 < ended,
        }
    }
}

/// Every hold of every lease by `worker`, in the order the worker logged them.
pub fn holds(worker: &WorkerProcess) -> Vec<Hold> {
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<Hold> = Vec::new();
    for event in worker.lease_events() {
        match event.kind {
            LeaseEventKind::Acquired => {
                if let Some(i) = open.remove(&event.shard) {
                    out[i].to = Some((event.at, None));
                }
                open.insert(event.shard.clone(), out.len());
                out.push(Hold {
                    owner: worker.owner.clone(),
                    shard: event.shard,
                    from: (event.at, event.counter),
                    to: None,
                    resumed_after: event.checkpoint,
                });
            }
            _ => {
                if let Some(i) = open.remove(&event.shard) {
                    out[i].to = Some((event.at, event.counter));
                } else if let Some(last) = out.iter_mut().rev().find(|h| h.shard == event.shard)
                    && last.to.is_some_and(|(_, counter)| counter.is_none())
                {
                    // The release after a `shard ended`: the hold ran until that write.
                    last.to = Some((event.at, event.counter));
                }
            }
        }
    }
    out
}

/// Pairs of holds of one lease by two different workers at once, judged by the row's counters and the
/// workers' own clocks (see [`Hold`]). Read the logs once they are complete (the workers stopped and
/// [`WorkerProcess::wait_exit`] returned, or at least every worker has logged past the holds in
/// question): a hold whose end is not read yet counts as still running.
pub fn double_holds(workers: &[&WorkerProcess]) -> Vec<(Hold, Hold)> {
    let mut by_shard: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    for worker in workers {
        for hold in holds(worker) {
            by_shard.entry(hold.shard.clone()).or_default().push(hold);
        }
    }
    let mut out = Vec::new();
    for list in by_shard.values_mut() {
        // The row's order of acquires (each acquire raises the counter), else the workers' clocks.
        list.sort_by_key(|h| (h.from.1, h.from.0));
        for (i, earlier) in list.iter().enumerate() {
            for later in &list[i + 1..] {
                if later.owner != earlier.owner && earlier.overlapped_by(later) {
                    out.push((earlier.clone(), later.clone()));
                }
            }
        }
    }
    out
}

/// Sequence numbers compared as the big decimal numbers they are.
fn sequence_after(sequence: &str, checkpoint: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // `TRIM_HORIZON`, `LATEST`, `AT_TIMESTAMP:..`: the hold read from the start of what it was given.
    // After part of an aggregate (`<sequence>/<sub>`), the rest of that record is read again.
    let (checkpoint, within) = match checkpoint.split_once('/') {
        Some((sequence, _)) => (sequence, true),
        None => (checkpoint, false),
    };
    if !digits(checkpoint) {
        return true;
    }
    let (record, resumed) = ((sequence.len(), sequence), (checkpoint.len(), checkpoint));
    record > resumed || (within && record == resumed)
}

/// Every delivery of `workers` in the order the records were processed, rebuilt without trusting the
/// order in which the test read the lines of different processes: each record sorts by the start (by
/// its worker's own clock) of the hold it was processed under, then by its place in its worker's own
/// output (one pipe keeps one process's order). A record's hold is the last of its worker's holds of
/// its shard that resumed before the record's sequence number. Exact for runs without repeats, where
/// a record's first delivery is the one that counts.
pub fn in_processing_order(workers: &[&WorkerProcess]) -> Vec<Delivery> {
    // (when its hold began by its worker's clock, which worker, its place in that worker's output)
    type Place = (Option<SystemTime>, usize, usize);
    let mut keyed: Vec<(Place, Delivery)> = Vec::new();
    for (w, worker) in workers.iter().enumerate() {
        let holds = holds(worker);
        for (i, delivery) in worker.deliveries().into_iter().enumerate() {
            let shard = format!("{}:{}", delivery.stream, delivery.shard_id);
            let started = holds
                .iter()
                .filter(|h| h.shard == shard)
                .rfind(|h| h.resumed_after.as_deref().is_none_or(|c| sequence_after(&delivery.sequence_number, c)))
                .map(|h| h.from.0);
            keyed.push(((started, w, i), delivery));
        }
    }
    keyed.sort_by_key(|(key, _)| *key);
    keyed.into_iter().map(|(_, d)| d).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hold(owner: &str, from: (u64, Option<u64>), to: Option<(u64, Option<u64>)>) -> Hold {
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        Hold {
            owner: owner.into(),
            shard: "s:0".into(),
            from: (at(from.0), from.1),
            to: to.map(|(ms, c)| (at(ms), c)),
            resumed_after: None,
        }
    }

    #[test]
    fn a_handover_logged_after_the_takers_acquire_is_no_double_hold() {
        // The giver's line comes 5 ms after the taker's: the counters say the release came first.
        let giver = hold("a", (0, Some(3)), Some((105, Some(9))));
        let taker = hold("b", (100, Some(10)), None);
        assert!(!giver.overlapped_by(&taker));
    }

    #[test]
    fn an_acquire_before_the_holders_release_is_a_double_hold() {
        let holder = hold("a", (0, Some(3)), Some((105, Some(9))));
        assert!(holder.overlapped_by(&hold("b", (100, Some(8)), None)));
        assert!(hold("a", (0, Some(3)), None).overlapped_by(&hold("b", (100, Some(8)), None)));
    }

    #[test]
    fn a_loss_is_judged_by_the_workers_clocks() {
        let loser = hold("a", (0, Some(3)), Some((200, None)));
        assert!(loser.overlapped_by(&hold("b", (100, Some(5)), None)));
        assert!(!loser.overlapped_by(&hold("b", (300, Some(5)), None)));
    }

    #[test]
    fn a_record_belongs_to_the_hold_that_resumed_before_it() {
        assert!(sequence_after("49590", "TRIM_HORIZON"));
        assert!(sequence_after("100", "99"));
        assert!(!sequence_after("99", "100"));
        assert!(sequence_after("100", "100/3"));
        assert!(!sequence_after("99", "100/3"));
    }

    #[test]
    fn the_workers_timestamps_parse() {
        let line = serde_json::json!({"timestamp": "2026-12-03T09:49:26.123456Z", "message": "lease acquired"});
        let at = logged_at(&line).expect("parsed");
        let ms = at.duration_since(SystemTime::UNIX_EPOCH).expect("after 1970").as_millis();
        assert_eq!(ms % 1000, 123);
    }
}
