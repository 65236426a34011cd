//! The checker: what every worker process printed (records, with owner and the time the test saw each
//! line) against the independent log of every lease write the table accepted (from the proxies), and
//! the rules a run must keep. Returns every broken rule with the history that explains it.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use leasehold_testkit::nemesis::LeaseWrite;
use leasehold_testkit::process::Delivery;
use serde_json::Value;

use crate::cluster::{Cluster, End, Incarnation};

/// What the checker needs of a worker process besides its deliveries.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The incarnation's id.
    pub id: String,
    /// When and how it ended.
    pub end: Option<(Instant, End)>,
    /// Lease-threatening faults it suffered (from, to, what).
    pub faults: Vec<(Instant, Instant, String)>,
    /// Its exit status.
    pub exit: Option<std::process::ExitStatus>,
}

impl Facts {
    /// The facts of `incarnation`.
    pub fn of(incarnation: &Incarnation) -> Self {
        Self {
            id: incarnation.id.clone(),
            end: incarnation.end,
            faults: incarnation.faults.clone(),
            exit: incarnation.exit,
        }
    }
}

/// Every delivery of every incarnation.
pub fn deliveries(incarnations: &[Incarnation]) -> Vec<Seen> {
    incarnations
        .iter()
        .flat_map(|i| i.process.deliveries().into_iter().map(|d| Seen { by: i.id.clone(), delivery: d }))
        .collect()
}
use crate::common::{data_number, sequence_cmp};

/// What a lease write did to its row, read from its request and its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Took the row (`SET lease_owner = :me` on a counter condition).
    Acquire,
    /// Renewed: moves the holder's deadline.
    Renew,
    /// Recorded progress.
    Checkpoint,
    /// Gave the row up (`REMOVE lease_owner`), possibly with a final checkpoint.
    Release,
    /// Gave the row to another owner.
    ReleaseTo,
    /// Asked the holder for a handoff (changes no counter).
    RequestHandoff,
    /// Created the row.
    Create,
    /// Deleted the row.
    Delete,
    /// Anything else.
    Other,
}

/// One accepted write on a shard's row.
#[derive(Debug, Clone)]
pub struct Write {
    /// The incarnation that sent it.
    pub by: String,
    /// What it did.
    pub kind: Kind,
    /// `stream:shard`.
    pub key: String,
    /// The row's counter afterwards (for a delete: the counter it was conditioned on).
    pub counter: u64,
    /// The row's owner afterwards.
    pub owner: Option<String>,
    /// The checkpoint written with it, if any.
    pub checkpoint_written: Option<String>,
    /// The row's checkpoint afterwards (for an acquire: where the new holder starts).
    pub checkpoint_after: Option<String>,
    /// The `lease_expiry` written (the writer's wall clock plus a lease), epoch ms.
    pub expiry_ms: Option<i64>,
    /// When it reached the proxy / went upstream / was answered.
    pub arrived: Instant,
    /// See `arrived`.
    pub forwarded: Instant,
    /// See `arrived`.
    pub answered: Instant,
}

fn s<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut v = value;
    for p in path {
        v = v.get(p)?;
    }
    v.as_str()
}

/// Reads a logged write; None for membership rows (not leases).
pub fn parse(write: &LeaseWrite) -> Option<Write> {
    let request = &write.request;
    let key = s(request, &["Key", "lease_key", "S"]).or_else(|| s(request, &["Item", "lease_key", "S"]))?;
    if key.starts_with('#') {
        return None;
    }
    let expression = s(request, &["UpdateExpression"]).unwrap_or_default();
    let values = &request["ExpressionAttributeValues"];
    let attributes = &write.response["Attributes"];
    // By what the expression does, not its exact text: a write may add clauses (the sub-sequence
    // attribute set or removed with every checkpoint) in any order.
    let removes = expression.split_once("REMOVE").map(|(_, list)| list.split(" SET").next().unwrap_or(list));
    let kind = match write.operation.as_str() {
        "PutItem" => Kind::Create,
        "DeleteItem" => Kind::Delete,
        _ if expression.contains("lease_owner = :to") => Kind::ReleaseTo,
        _ if expression.contains("lease_owner = :me") => Kind::Acquire,
        _ if removes.is_some_and(|list| list.contains("lease_owner")) => Kind::Release,
        _ if expression.starts_with("SET handoff_to") => Kind::RequestHandoff,
        _ if expression.starts_with("SET lease_expiry = :expiry") => Kind::Renew,
        _ if expression.contains("checkpoint = :checkpoint") => Kind::Checkpoint,
        _ => Kind::Other,
    };
    let counter = match kind {
        Kind::Create => s(request, &["Item", "lease_counter", "N"]),
        Kind::Delete => s(values, &[":counter", "N"]),
        _ => s(attributes, &["lease_counter", "N"]),
    }
    .and_then(|n| n.parse().ok())
    .unwrap_or(0);
    let owner = match kind {
        Kind::Create | Kind::Delete => None,
        _ => s(attributes, &["lease_owner", "S"]).map(str::to_string),
    };
    let checkpoint_after = match kind {
        Kind::Create => s(request, &["Item", "checkpoint", "S"]),
        _ => s(attributes, &["checkpoint", "S"]),
    };
    Some(Write {
        by: write.by.clone(),
        kind,
        key: key.to_string(),
        counter,
        owner,
        checkpoint_written: s(values, &[":checkpoint", "S"]).map(str::to_string),
        checkpoint_after: checkpoint_after.map(str::to_string),
        expiry_ms: s(values, &[":expiry", "N"]).and_then(|n| n.parse().ok()),
        arrived: write.arrived,
        forwarded: write.forwarded,
        answered: write.answered,
    })
}

/// Whether checkpoint `checkpoint` covers the record at `sequence` (it was processed before).
pub fn covers(checkpoint: &str, sequence: &str) -> bool {
    match checkpoint {
        "SHARD_END" => true,
        "TRIM_HORIZON" | "LATEST" => false,
        c if c.starts_with("AT_TIMESTAMP") => false,
        c => sequence_cmp(sequence, c) != Ordering::Greater,
    }
}

/// A broken rule: which, what happened, and the lease key and time it concerns (for the history).
#[derive(Debug, Clone)]
pub struct Violation {
    /// The rule's name (as in docs/testing.md).
    pub rule: &'static str,
    /// What broke it.
    pub detail: String,
    /// The lease key concerned, if one.
    pub key: Option<String>,
    /// When it happened.
    pub at: Instant,
}

/// A delivery with the incarnation that printed it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The incarnation's id.
    pub by: String,
    /// The record.
    pub delivery: Delivery,
}

impl Seen {
    fn key(&self) -> String {
        format!("{}:{}", self.delivery.stream, self.delivery.shard_id)
    }
}

/// Margins and durations the rules use.
pub struct Rules {
    /// The workers' lease duration.
    pub lease: Duration,
    /// Allowed lateness of a line the test saw (pipe and scheduling latency on a loaded machine).
    pub margin: Duration,
}

/// What the checker found, and counts for the report.
#[derive(Default)]
pub struct Verdict {
    /// Every broken rule.
    pub violations: Vec<Violation>,
    /// Records written.
    pub expected: usize,
    /// Deliveries seen.
    pub deliveries: usize,
    /// Records processed more than once (each explained by a fault, or a violation).
    pub repeats: usize,
    /// Of the repeats, those after a lease expired with no injected fault on its holder (renewals too
    /// slow on a loaded machine): allowed, reported.
    pub unforced_repeats: usize,
    /// Lease writes logged (shard rows only).
    pub writes: usize,
    /// Takeovers of a row held by another incarnation.
    pub takeovers: usize,
    /// Writes whose `lease_expiry` shows the writer's wall clock more than a minute off (proof that
    /// the skew reached the workers).
    pub skewed_writes: usize,
}

/// Checks every rule over a finished round.
pub fn check(
    seen: &[Seen],
    incarnations: &[Facts],
    log: &[LeaseWrite],
    expected: &[(String, Vec<u8>)],
    rules: &Rules,
) -> Verdict {
    let mut verdict = Verdict { expected: expected.len(), ..Verdict::default() };
    verdict.deliveries = seen.len();
    let by_id: HashMap<&str, &Facts> = incarnations.iter().map(|i| (i.id.as_str(), i)).collect();
    let mut writes: Vec<Write> = log.iter().filter_map(parse).collect();
    verdict.writes = writes.len();
    let (now, now_wall) = (Instant::now(), std::time::SystemTime::now());
    let wall_ms = |at: Instant| {
        let then = now_wall - now.saturating_duration_since(at);
        then.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as i64
    };
    verdict.skewed_writes = writes
        .iter()
        .filter_map(|w| w.expiry_ms.map(|e| e - rules.lease.as_millis() as i64 - wall_ms(w.forwarded)))
        .filter(|skew| skew.abs() > 60_000)
        .count();
    // Commit order per row: the counter every accepted write moved (ties: a handoff request, which
    // moves none, after the write whose counter it saw; a delete after the write it was conditioned on).
    writes.sort_by(|a, b| {
        a.key
            .cmp(&b.key)
            .then(a.counter.cmp(&b.counter))
            .then((a.kind == Kind::Delete).cmp(&(b.kind == Kind::Delete)))
            .then(a.answered.cmp(&b.answered))
    });
    let mut by_key: BTreeMap<&str, Vec<&Write>> = BTreeMap::new();
    for w in &writes {
        by_key.entry(w.key.as_str()).or_default().push(w);
    }
    check_lost(seen, expected, &mut verdict);
    for (key, list) in &by_key {
        check_holders(key, list, &by_id, rules, &mut verdict);
    }
    check_deadlines(seen, &by_key, &by_id, rules, &mut verdict);
    check_order(seen, &by_key, rules, &mut verdict);
    check_repeats(seen, &by_key, &by_id, rules, &mut verdict);
    check_exits(incarnations, &mut verdict);
    verdict
}

/// Nothing lost: every record written was processed at least once.
fn check_lost(seen: &[Seen], expected: &[(String, Vec<u8>)], verdict: &mut Verdict) {
    let processed: HashSet<&str> = seen.iter().map(|s| s.delivery.data.as_str()).collect();
    let missing: Vec<String> = expected
        .iter()
        .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
        .filter(|d| !processed.contains(d.as_str()))
        .collect();
    if !missing.is_empty() {
        verdict.violations.push(Violation {
            rule: "nothing lost",
            detail: format!("{} records never processed, e.g. {:?}", missing.len(), &missing[..missing.len().min(8)]),
            key: None,
            at: Instant::now(),
        });
    }
}

/// One holder at a time, and only the holder writes: replays a row's accepted writes in commit order.
fn check_holders(key: &str, list: &[&Write], by_id: &HashMap<&str, &Facts>, rules: &Rules, verdict: &mut Verdict) {
    // The incarnation holding the row and its deadline: its last acquire or renewal's arrival plus a
    // lease (arrival is no earlier than sending, so this deadline is no earlier than the worker's own).
    let mut holder: Option<(&str, Instant)> = None;
    let mut creates = 0;
    let mut row_owner: Option<&str> = None;
    // A row handed over (ReleaseTo) is the asker's before it acquires it: a worker that stops before
    // reading it releases it unread, conditioned on being its owner (`release_handed_unread`).
    let mut handed_to_writer_unread = false;
    for w in list {
        let handed_unread = std::mem::replace(&mut handed_to_writer_unread, w.kind == Kind::ReleaseTo);
        let owner_changed = w.owner.as_deref() != row_owner;
        if !matches!(w.kind, Kind::Delete | Kind::Create) {
            row_owner = w.owner.as_deref();
        }
        let violation =
            |rule: &'static str, detail: String| Violation { rule, detail, key: Some(key.to_string()), at: w.arrived };
        match w.kind {
            Kind::Create => {
                creates += 1;
                row_owner = None;
                if creates > 1 {
                    verdict.violations.push(violation(
                        "no row resurrected",
                        format!("{key} was created again by {} after its row was deleted", w.by),
                    ));
                }
                holder = None;
            }
            Kind::Delete => {
                holder = None;
                row_owner = None;
            }
            Kind::Acquire | Kind::Other if w.kind == Kind::Acquire || (owner_changed && w.owner.is_some()) => {
                if let Some((previous, deadline)) = holder
                    && previous != w.by
                {
                    verdict.takeovers += 1;
                    // A process that has exited holds nothing (a same-id restart takes its rows at once).
                    let dead = by_id.get(previous).and_then(|i| i.end).is_some_and(|(at, _)| at <= w.forwarded);
                    if deadline > w.forwarded && !dead {
                        verdict.violations.push(violation(
                            "one holder at a time",
                            format!(
                                "{} took {key} {:?} before the deadline of its holder {previous} (last renewal + lease)",
                                w.by,
                                deadline - w.forwarded
                            ),
                        ));
                    }
                }
                holder = Some((w.by.as_str(), w.arrived + rules.lease));
            }
            Kind::Renew => match holder {
                Some((h, _)) if h == w.by => holder = Some((h, w.arrived + rules.lease)),
                _ => verdict
                    .violations
                    .push(violation("only the holder writes", format!("{} renewed {key} held by {holder:?}", w.by))),
            },
            Kind::Checkpoint | Kind::Release | Kind::ReleaseTo => {
                let late = match holder {
                    Some((h, deadline)) if h == w.by => {
                        (w.arrived > deadline + rules.margin).then(|| w.arrived - deadline)
                    }
                    None if handed_unread && w.kind == Kind::Release && w.checkpoint_written.is_none() => None,
                    _ => {
                        verdict.violations.push(violation(
                            "only the holder writes",
                            format!("{} wrote {:?} on {key} held by {holder:?}", w.by, w.kind),
                        ));
                        None
                    }
                };
                if let Some(late) = late {
                    verdict.violations.push(violation(
                        "only the holder writes",
                        format!("{} wrote {:?} on {key} {late:?} after its deadline", w.by, w.kind),
                    ));
                }
                if w.kind != Kind::Checkpoint {
                    holder = None;
                }
            }
            Kind::RequestHandoff | Kind::Acquire | Kind::Other => {}
        }
    }
}

/// The writes of `by` on `key`.
fn writes_of<'a>(by_key: &'a BTreeMap<&str, Vec<&Write>>, key: &str, by: &str) -> Vec<&'a Write> {
    let mut out: Vec<&Write> =
        by_key.get(key).map(|l| l.iter().copied().filter(|w| w.by == by).collect()).unwrap_or_default();
    out.sort_by_key(|w| w.arrived);
    out
}

/// No record processed after the processing worker's lease deadline (its last acquire or renewal
/// before the record, plus a lease, plus the margin), nor after it released the lease. One exception:
/// a line that comes out within the margin of a SIGCONT, when the SIGSTOP came before the deadline. A
/// process frozen mid-record finishes that step when it resumes (between the deadline check before a
/// processor call and the processor's write, however short, a stop can land); every later record is
/// judged as usual.
fn check_deadlines(
    seen: &[Seen],
    by_key: &BTreeMap<&str, Vec<&Write>>,
    by_id: &HashMap<&str, &Facts>,
    rules: &Rules,
    verdict: &mut Verdict,
) {
    let mut cache: HashMap<(String, String), Vec<&Write>> = HashMap::new();
    let mut reported: HashSet<(String, String)> = HashSet::new();
    for s in seen {
        let key = s.key();
        let mine = cache.entry((key.clone(), s.by.clone())).or_insert_with(|| writes_of(by_key, &key, &s.by));
        let t = s.delivery.seen_at;
        let last_renewal = mine.iter().rfind(|w| matches!(w.kind, Kind::Acquire | Kind::Renew) && w.arrived <= t);
        let problem = match last_renewal {
            None => Some("without ever holding its lease".to_string()),
            Some(r) if t > r.arrived + rules.lease + rules.margin => {
                let deadline = r.arrived + rules.lease;
                let frozen_over_it = by_id.get(s.by.as_str()).is_some_and(|facts| {
                    facts.faults.iter().any(|(from, to, what)| {
                        what == "SIGSTOP" && *from <= deadline + rules.margin && t <= *to + rules.margin
                    })
                });
                (!frozen_over_it).then(|| format!("{:?} after its lease deadline", t - deadline))
            }
            Some(r) => mine
                .iter()
                .find(|w| {
                    matches!(w.kind, Kind::Release | Kind::ReleaseTo)
                        && w.arrived >= r.arrived
                        && w.answered + rules.margin < t
                })
                .map(|w| format!("{:?} after releasing its lease", t - w.answered)),
        };
        if let Some(problem) = problem
            && reported.insert((key.clone(), s.by.clone()))
        {
            verdict.violations.push(Violation {
                rule: "nothing processed after the deadline",
                detail: format!(
                    "{} processed {} ({}) {problem} (first such record)",
                    s.by, s.delivery.sequence_number, s.delivery.data
                ),
                key: Some(key),
                at: t,
            });
        }
    }
}

/// Per key, in order: within one holding (an incarnation between two of its acquires of a shard) a
/// key's numbers increase; across holders, a key's next number is never first processed before the
/// one before it (beyond the margin).
fn check_order(seen: &[Seen], by_key: &BTreeMap<&str, Vec<&Write>>, rules: &Rules, verdict: &mut Verdict) {
    let mut acquires: HashMap<(String, String), Vec<Instant>> = HashMap::new();
    let mut last: HashMap<(String, String, usize, String), (u64, String)> = HashMap::new();
    let mut reported = HashSet::new();
    for s in seen {
        let key = s.key();
        let starts = acquires.entry((key.clone(), s.by.clone())).or_insert_with(|| {
            writes_of(by_key, &key, &s.by).iter().filter(|w| w.kind == Kind::Acquire).map(|w| w.arrived).collect()
        });
        let holding = starts.iter().filter(|a| **a <= s.delivery.seen_at).count();
        let n = data_number(&s.delivery.data);
        let slot = (s.by.clone(), key.clone(), holding, s.delivery.partition_key.clone());
        if let Some((previous, sequence)) = last.get(&slot)
            && (n < *previous || (n == *previous && *sequence == s.delivery.sequence_number))
            && reported.insert(slot.clone())
        {
            verdict.violations.push(Violation {
                rule: "per-key order",
                detail: format!(
                    "{} on {key}: key {} went {previous} -> {n} within one holding",
                    s.by, s.delivery.partition_key
                ),
                key: Some(key.clone()),
                at: s.delivery.seen_at,
            });
        }
        last.insert(slot, (n, s.delivery.sequence_number.clone()));
    }
    let mut first: BTreeMap<(String, u64), &Seen> = BTreeMap::new();
    for s in seen {
        let entry = first.entry((s.delivery.partition_key.clone(), data_number(&s.delivery.data))).or_insert(s);
        if s.delivery.seen_at < entry.delivery.seen_at {
            *entry = s;
        }
    }
    let mut previous: Option<(&(String, u64), &Seen)> = None;
    for (id, s) in &first {
        if let Some(((key, n), p)) = previous
            && *key == id.0
            && s.delivery.seen_at + rules.margin < p.delivery.seen_at
        {
            verdict.violations.push(Violation {
                rule: "per-key order",
                detail: format!(
                    "key {key}: {} first processed (by {} on {}) {:?} before {n} (by {} on {})",
                    id.1,
                    s.by,
                    s.delivery.shard_id,
                    p.delivery.seen_at - s.delivery.seen_at,
                    p.by,
                    p.delivery.shard_id
                ),
                key: Some(s.key()),
                at: s.delivery.seen_at,
            });
        }
        previous = Some((id, s));
    }
}

/// A record processed again only inside a crash window: the later processor started from a checkpoint
/// that does not cover it, and the earlier one lost its lease to a fault (killed, stopped, cut off,
/// throttled or delayed) without a release, after processing it.
fn check_repeats(
    seen: &[Seen],
    by_key: &BTreeMap<&str, Vec<&Write>>,
    by_id: &HashMap<&str, &Facts>,
    rules: &Rules,
    verdict: &mut Verdict,
) {
    let mut records: BTreeMap<(String, String), Vec<&Seen>> = BTreeMap::new();
    for s in seen {
        records.entry((s.key(), s.delivery.sequence_number.clone())).or_default().push(s);
    }
    for ((key, sequence), mut list) in records {
        if list.len() < 2 {
            continue;
        }
        verdict.repeats += list.len() - 1;
        list.sort_by_key(|s| s.delivery.seen_at);
        for pair in list.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let violation = |detail: String| Violation {
                rule: "repeats only inside a crash window",
                detail: format!(
                    "{key} {sequence} ({}) by {} then {}: {detail}",
                    earlier.delivery.data, earlier.by, later.by
                ),
                key: Some(key.clone()),
                at: later.delivery.seen_at,
            };
            // Where the later holding started: the later processor's acquire before it.
            let start = writes_of(by_key, &key, &later.by)
                .into_iter()
                .rfind(|w| w.kind == Kind::Acquire && w.arrived <= later.delivery.seen_at);
            let Some(start) = start else { continue }; // reported by the deadline rule
            if start.arrived < earlier.delivery.seen_at && earlier.by == later.by {
                verdict.violations.push(violation("processed twice within one holding".into()));
                continue;
            }
            if let Some(checkpoint) = &start.checkpoint_after
                && covers(checkpoint, &sequence)
            {
                verdict
                    .violations
                    .push(violation(format!("the later holder started from checkpoint {checkpoint}, which covers it")));
                continue;
            }
            // The earlier holding ends at the earlier process's next acquire of the shard (if any): a
            // release inside it is a graceful end, which must have covered what it processed.
            let earlier_writes = writes_of(by_key, &key, &earlier.by);
            let next_acquire = earlier_writes
                .iter()
                .find(|w| w.kind == Kind::Acquire && w.arrived > earlier.delivery.seen_at)
                .map(|w| w.arrived);
            let released = earlier_writes.iter().find(|w| {
                matches!(w.kind, Kind::Release | Kind::ReleaseTo)
                    && w.arrived >= earlier.delivery.seen_at
                    && w.arrived <= start.arrived
                    && next_acquire.is_none_or(|a| w.arrived < a)
            });
            if let Some(release) = released {
                verdict.violations.push(violation(format!(
                    "{} released the lease (final checkpoint {:?}) without covering it",
                    earlier.by, release.checkpoint_written
                )));
                continue;
            }
            // Otherwise the earlier holding ended by losing the lease (the takeover rule checks it had
            // expired). A fault on the earlier process explains it; without one, it expired because its
            // renewals were slow (a loaded machine): allowed, and counted apart.
            let window_from = earlier.delivery.seen_at.checked_sub(rules.lease).unwrap_or(earlier.delivery.seen_at);
            let excused = by_id.get(earlier.by.as_str()).is_some_and(|i| {
                i.faults.iter().any(|(from, to, _)| *from <= start.forwarded && *to + rules.lease >= window_from)
            });
            if !excused {
                verdict.unforced_repeats += 1;
            }
        }
    }
}

/// Every worker stopped with SIGTERM exits cleanly (status 0) within its patience.
fn check_exits(incarnations: &[Facts], verdict: &mut Verdict) {
    for i in incarnations {
        if let Some((at, End::Terminated | End::Final)) = i.end
            && !i.exit.is_some_and(|s| s.success())
        {
            verdict.violations.push(Violation {
                rule: "clean exit on SIGTERM",
                detail: format!("{} exited with {:?} after SIGTERM", i.id, i.exit),
                key: None,
                at,
            });
        }
    }
}

/// The failure report: the seed, each broken rule, and around it the nemesis history, the row's writes
/// and the deliveries concerned.
pub fn report(seed: u64, cluster: &Cluster, verdict: &Verdict, log: &[LeaseWrite], seen: &[Seen]) -> String {
    let mut out = format!(
        "chaos round with seed {seed} broke {} rule(s); replay with LEASEHOLD_CHAOS_SEED={seed} LEASEHOLD_CHAOS_ROUNDS=1 make chaos\n",
        verdict.violations.len()
    );
    let around = Duration::from_secs(6);
    let near = |t: Instant, at: Instant| t + around >= at && t <= at + around;
    for v in verdict.violations.iter().take(8) {
        out.push_str(&format!("\n=== {} at {}: {}\n", v.rule, cluster.at(v.at), v.detail));
        out.push_str("--- nemesis around it:\n");
        for (t, what) in cluster.history.lock().expect("history").iter().filter(|(t, _)| near(*t, v.at)) {
            out.push_str(&format!("  {} {what}\n", cluster.at(*t)));
        }
        if let Some(key) = &v.key {
            out.push_str(&format!("--- accepted writes on {key} around it (arrived / forwarded / answered):\n"));
            let mut writes: Vec<Write> =
                log.iter().filter_map(parse).filter(|w| w.key == *key && near(w.arrived, v.at)).collect();
            writes.sort_by_key(|w| w.counter);
            for w in writes {
                out.push_str(&format!(
                    "  {} {} {} {:?} counter {} owner {:?} checkpoint {:?}\n",
                    cluster.at(w.arrived),
                    cluster.at(w.forwarded),
                    cluster.at(w.answered),
                    w.kind,
                    w.counter,
                    w.owner,
                    w.checkpoint_written.or(w.checkpoint_after)
                ));
            }
            let shard = key.rsplit(':').next().unwrap_or_default();
            out.push_str(&format!("--- deliveries of {shard} within 1 s:\n"));
            let mut lines: Vec<(Instant, String)> = seen
                .iter()
                .filter(|s| {
                    let d = &s.delivery;
                    d.shard_id == shard
                        && d.seen_at + Duration::from_secs(1) >= v.at
                        && d.seen_at <= v.at + Duration::from_secs(1)
                })
                .map(|s| (s.delivery.seen_at, format!("{} {} {}", s.by, s.delivery.sequence_number, s.delivery.data)))
                .collect();
            lines.sort();
            for (t, line) in lines.iter().take(40) {
                out.push_str(&format!("  {} {line}\n", cluster.at(*t)));
            }
        }
    }
    out.push_str("\n--- whole nemesis history:\n");
    for (t, what) in cluster.history.lock().expect("history").iter() {
        out.push_str(&format!("  {} {what}\n", cluster.at(*t)));
    }
    out
}

/// The checker on made-up histories: each rule passes a history that keeps it and fails one that
/// breaks it (so a green chaos round means something).
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "s:shardId-000000000000";

    struct History {
        zero: Instant,
        log: Vec<LeaseWrite>,
        seen: Vec<Seen>,
        facts: Vec<Facts>,
        counter: u64,
    }

    impl History {
        fn new() -> Self {
            let facts = ["a", "b"]
                .iter()
                .map(|id| Facts { id: id.to_string(), end: None, faults: vec![], exit: None })
                .collect();
            Self { zero: Instant::now(), log: vec![], seen: vec![], facts, counter: 0 }
        }

        fn t(&self, ms: u64) -> Instant {
            self.zero + Duration::from_millis(ms)
        }

        fn write(&mut self, by: &str, ms: u64, expression: &str, checkpoint: Option<&str>) {
            self.counter += 1;
            let mut values = json!({":me": {"S": by}});
            let mut attributes = json!({"lease_key": {"S": KEY}, "lease_counter": {"N": self.counter.to_string()}});
            if let Some(c) = checkpoint {
                values[":checkpoint"] = json!({"S": c});
                attributes["checkpoint"] = json!({"S": c});
            }
            if !expression.starts_with("REMOVE lease_owner") {
                attributes["lease_owner"] = json!({"S": by});
            }
            let at = self.t(ms);
            self.log.push(LeaseWrite {
                by: by.into(),
                operation: "UpdateItem".into(),
                request: json!({"Key": {"lease_key": {"S": KEY}}, "UpdateExpression": expression,
                    "ExpressionAttributeValues": values}),
                response: json!({ "Attributes": attributes }),
                arrived: at,
                forwarded: at,
                answered: at + Duration::from_millis(5),
            });
        }

        fn acquire(&mut self, by: &str, ms: u64, from: &str) {
            self.write(
                by,
                ms,
                "SET lease_owner = :me, lease_expiry = :expiry, lease_counter = lease_counter + :one",
                Some(from),
            );
        }

        fn renew(&mut self, by: &str, ms: u64) {
            self.write(by, ms, "SET lease_expiry = :expiry, lease_counter = lease_counter + :one", None);
        }

        fn checkpoint(&mut self, by: &str, ms: u64, at: &str) {
            self.write(by, ms, "SET checkpoint = :checkpoint, lease_counter = lease_counter + :one", Some(at));
        }

        fn release(&mut self, by: &str, ms: u64, at: &str) {
            self.write(
                by,
                ms,
                "REMOVE lease_owner, lease_expiry, handoff_to SET lease_counter = lease_counter + :one",
                Some(at),
            );
        }

        fn deliver(&mut self, by: &str, ms: u64, n: u64) {
            let delivery = Delivery {
                stream: "s".into(),
                shard_id: "shardId-000000000000".into(),
                sequence_number: format!("{}", 100 + n),
                partition_key: "k".into(),
                data: format!("k:{n}"),
                owner: by.into(),
                seen_at: self.t(ms),
            };
            self.seen.push(Seen { by: by.into(), delivery });
        }

        fn stopped(&mut self, by: &str, from: u64, to: u64) {
            let (from, to) = (self.t(from), self.t(to));
            self.facts.iter_mut().find(|f| f.id == by).expect("incarnation").faults.push((from, to, "SIGSTOP".into()));
        }

        fn fault(&mut self, by: &str, from: u64, to: u64) {
            let (from, to) = (self.t(from), self.t(to));
            self.facts.iter_mut().find(|f| f.id == by).expect("incarnation").faults.push((from, to, "SIGKILL".into()));
        }

        fn rules_broken(&self, records: u64) -> Vec<&'static str> {
            let expected: Vec<(String, Vec<u8>)> =
                (0..records).map(|n| ("k".into(), format!("k:{n}").into_bytes())).collect();
            let rules = Rules { lease: Duration::from_secs(2), margin: Duration::from_millis(300) };
            let verdict = check(&self.seen, &self.facts, &self.log, &expected, &rules);
            verdict.violations.iter().map(|v| v.rule).collect()
        }
    }

    /// a processes 0..3 and checkpoints 1; it is killed; b takes over after a's deadline from 1.
    fn crash_and_takeover() -> History {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.deliver("a", 100, 0);
        h.deliver("a", 200, 1);
        h.checkpoint("a", 300, "101");
        h.renew("a", 500);
        h.deliver("a", 600, 2);
        h.fault("a", 700, 700);
        h.acquire("b", 2600, "101");
        h.deliver("b", 2700, 2);
        h.deliver("b", 2800, 3);
        h
    }

    #[test]
    fn a_repeat_after_a_crash_and_a_late_takeover_break_nothing() {
        assert_eq!(crash_and_takeover().rules_broken(4), Vec::<&str>::new());
    }

    #[test]
    fn a_lost_record_is_found() {
        assert_eq!(crash_and_takeover().rules_broken(5), vec!["nothing lost"]);
    }

    #[test]
    fn a_repeat_after_an_unforced_expiry_is_allowed_and_counted() {
        let mut h = crash_and_takeover();
        h.facts[0].faults.clear();
        assert_eq!(h.rules_broken(4), Vec::<&str>::new());
        let expected: Vec<(String, Vec<u8>)> = (0..4).map(|n| ("k".into(), format!("k:{n}").into_bytes())).collect();
        let rules = Rules { lease: Duration::from_secs(2), margin: Duration::from_millis(300) };
        assert_eq!(check(&h.seen, &h.facts, &h.log, &expected, &rules).unforced_repeats, 1);
    }

    #[test]
    fn a_repeat_after_a_graceful_release_is_found() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.deliver("a", 100, 0);
        h.deliver("a", 200, 1);
        h.release("a", 300, "100");
        h.acquire("b", 400, "100");
        h.deliver("b", 500, 1);
        assert_eq!(h.rules_broken(2), vec!["repeats only inside a crash window"]);
    }

    #[test]
    fn a_release_in_a_later_holding_does_not_count_for_an_earlier_one() {
        // a loses the lease after processing 1 unchecked (killed), takes it again, hands it over at
        // once with the same checkpoint, and takes it a third time: the repeat of 1 is the first
        // holding's crash window, not the second holding's release.
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.deliver("a", 100, 0);
        h.checkpoint("a", 150, "100");
        h.deliver("a", 200, 1);
        h.fault("a", 300, 300);
        h.acquire("a", 2400, "100");
        h.write(
            "a",
            2500,
            "REMOVE handoff_to SET lease_owner = :to, lease_expiry = :expiry, lease_counter = lease_counter + :one",
            Some("100"),
        );
        h.acquire("a", 4600, "100");
        h.deliver("a", 4700, 1);
        assert_eq!(h.rules_broken(2), Vec::<&str>::new());
    }

    #[test]
    fn a_repeat_of_a_checkpointed_record_is_found() {
        let mut h = crash_and_takeover();
        h.deliver("b", 2900, 1);
        assert!(h.rules_broken(4).contains(&"repeats only inside a crash window"));
    }

    #[test]
    fn a_takeover_before_the_deadline_is_found() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.renew("a", 1000);
        h.acquire("b", 2500, "TRIM_HORIZON");
        assert_eq!(h.rules_broken(0), vec!["one holder at a time"]);
    }

    #[test]
    fn a_release_lets_the_next_holder_in_at_once() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.deliver("a", 100, 0);
        h.release("a", 200, "100");
        h.acquire("b", 300, "100");
        h.deliver("b", 400, 1);
        assert_eq!(h.rules_broken(2), Vec::<&str>::new());
    }

    #[test]
    fn a_record_finished_right_after_a_sigcont_is_excused_and_later_ones_are_not() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.stopped("a", 1000, 4000);
        h.deliver("a", 4100, 0);
        assert_eq!(h.rules_broken(1), Vec::<&str>::new(), "the step it was frozen in");
        h.deliver("a", 4500, 1);
        assert_eq!(h.rules_broken(2), vec!["nothing processed after the deadline"], "past the margin after SIGCONT");
        let mut late = History::new();
        late.acquire("a", 0, "TRIM_HORIZON");
        late.stopped("a", 2500, 4000);
        late.deliver("a", 4100, 0);
        assert_eq!(late.rules_broken(1), vec!["nothing processed after the deadline"], "stopped after its deadline");
    }

    #[test]
    fn processing_after_the_deadline_is_found() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.deliver("a", 2500, 0);
        assert_eq!(h.rules_broken(1), vec!["nothing processed after the deadline"]);
    }

    #[test]
    fn a_checkpoint_by_a_non_holder_is_found() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.acquire("b", 2100, "TRIM_HORIZON");
        h.checkpoint("a", 2200, "100");
        assert_eq!(h.rules_broken(0), vec!["only the holder writes"]);
    }

    #[test]
    fn a_key_going_backwards_within_a_holding_is_found() {
        let mut h = History::new();
        h.acquire("a", 0, "TRIM_HORIZON");
        h.deliver("a", 100, 1);
        h.deliver("a", 200, 0);
        assert!(h.rules_broken(2).contains(&"per-key order"));
    }
}
