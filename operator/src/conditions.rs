//! The status conditions, computed in one place from what a reconcile observed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// One condition's verdict before timestamps are attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// True or false.
    pub ok: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl Verdict {
    /// A true condition.
    pub fn ok(reason: &str, message: impl Into<String>) -> Self {
        Self { ok: true, reason: reason.into(), message: message.into() }
    }

    /// A false condition.
    pub fn failed(reason: &str, message: impl Into<String>) -> Self {
        Self { ok: false, reason: reason.into(), message: message.into() }
    }

    /// The verdict of a failed pipeline stage: its reason and message.
    pub fn from_error(error: &crate::error::Error) -> Self {
        Self::failed(error.reason(), error.message())
    }
}

/// The verdicts of one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdicts {
    /// The spec passed the checks the schema cannot express.
    pub spec: Verdict,
    /// The lease table exists and is ACTIVE.
    pub table: Verdict,
    /// Every stream exists.
    pub stream: Verdict,
    /// The worker Deployment has its desired replicas ready.
    pub workers: Verdict,
    /// With `reader.mode: fanOut`, the stream consumer is ACTIVE on every named stream.
    pub consumer: Verdict,
    /// With `workers.autoscaling.lag`: false while the lag is above target and more workers cannot
    /// help. Not part of `Ready`: a lagging consumer still runs.
    pub lag: Option<Verdict>,
    /// With a PROVISIONED lease table: false while its capacity is below what the group needs. Not
    /// part of `Ready`: a throttled table still serves.
    pub capacity: Option<Verdict>,
}

impl Verdicts {
    /// The same verdict for every condition (an invalid spec stops everything).
    pub fn all(verdict: Verdict) -> Self {
        Self {
            spec: verdict.clone(),
            table: verdict.clone(),
            stream: verdict.clone(),
            workers: verdict.clone(),
            consumer: verdict,
            lag: None,
            capacity: None,
        }
    }
}

/// One condition of `verdict`, its transition time carried over from `previous` while its status stays.
pub(crate) fn condition(kind: &str, verdict: &Verdict, generation: Option<i64>, previous: &[Condition]) -> Condition {
    let status = if verdict.ok { "True" } else { "False" };
    // The transition time moves only when the status does (API conventions).
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(Timestamp::now()));
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason: verdict.reason.clone(),
        message: verdict.message.clone(),
        observed_generation: generation,
        last_transition_time,
    }
}

/// `Ready`, `TableReady`, `StreamReady`, `WorkersReady`, `ConsumerReady` from the verdicts; `Ready` is true only when the
/// spec is valid and the others are true, and then names the first thing that is not. `LagScaling`
/// follows them with lag scaling on, and `TableCapacity` with a PROVISIONED table; both leave `Ready` alone.
pub fn conditions(verdicts: &Verdicts, generation: Option<i64>, previous: &[Condition]) -> Vec<Condition> {
    let ready = [&verdicts.spec, &verdicts.table, &verdicts.stream, &verdicts.consumer, &verdicts.workers]
        .into_iter()
        .find(|v| !v.ok)
        .map(|v| Verdict::failed(&v.reason, v.message.clone()))
        .unwrap_or_else(|| Verdict::ok("Running", "table active, streams found, workers ready"));
    let mut all = vec![
        condition("Ready", &ready, generation, previous),
        condition("TableReady", &verdicts.table, generation, previous),
        condition("StreamReady", &verdicts.stream, generation, previous),
        condition("WorkersReady", &verdicts.workers, generation, previous),
        condition("ConsumerReady", &verdicts.consumer, generation, previous),
    ];
    if let Some(lag) = &verdicts.lag {
        all.push(condition("LagScaling", lag, generation, previous));
    }
    if let Some(capacity) = &verdicts.capacity {
        all.push(condition("TableCapacity", capacity, generation, previous));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ok() -> Verdicts {
        Verdicts {
            spec: Verdict::ok("Valid", ""),
            table: Verdict::ok("Active", ""),
            stream: Verdict::ok("Found", ""),
            workers: Verdict::ok("Ready", "2/2"),
            consumer: Verdict::ok("Polling", ""),
            lag: None,
            capacity: None,
        }
    }

    #[test]
    fn ready_names_the_first_problem() {
        let ok = conditions(&all_ok(), Some(3), &[]);
        assert_eq!((ok[0].type_.as_str(), ok[0].status.as_str()), ("Ready", "True"));
        assert_eq!(ok[0].observed_generation, Some(3));
        let missing = Verdicts { stream: Verdict::failed("StreamNotFound", "stream orders not found"), ..all_ok() };
        let c = conditions(&missing, Some(3), &[]);
        assert_eq!((c[0].status.as_str(), c[0].reason.as_str()), ("False", "StreamNotFound"));
        assert_eq!(c[2].type_, "StreamReady");
        assert_eq!(c[2].message, "stream orders not found");
    }

    #[test]
    fn lag_scaling_has_its_own_condition_and_leaves_ready_alone() {
        assert!(conditions(&all_ok(), Some(1), &[]).iter().all(|c| c.type_ != "LagScaling"), "absent when off");
        let stuck = Verdicts { lag: Some(Verdict::failed("OneShardPerWorker", "raise concurrency")), ..all_ok() };
        let c = conditions(&stuck, Some(1), &[]);
        assert_eq!((c[0].type_.as_str(), c[0].status.as_str()), ("Ready", "True"));
        let lag = c.iter().find(|c| c.type_ == "LagScaling").expect("LagScaling");
        assert_eq!((lag.status.as_str(), lag.reason.as_str()), ("False", "OneShardPerWorker"));
    }

    #[test]
    fn table_capacity_has_its_own_condition_and_leaves_ready_alone() {
        assert!(conditions(&all_ok(), Some(1), &[]).iter().all(|c| c.type_ != "TableCapacity"), "absent when off");
        let low = Verdicts { capacity: Some(Verdict::failed("UnderProvisioned", "10 WCU, needs 22")), ..all_ok() };
        let c = conditions(&low, Some(1), &[]);
        assert_eq!((c[0].type_.as_str(), c[0].status.as_str()), ("Ready", "True"));
        let capacity = c.iter().find(|c| c.type_ == "TableCapacity").expect("TableCapacity");
        assert_eq!((capacity.status.as_str(), capacity.reason.as_str()), ("False", "UnderProvisioned"));
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let first = conditions(&all_ok(), Some(1), &[]);
        let mut earlier = first.clone();
        earlier[1].last_transition_time = Time(Timestamp::UNIX_EPOCH);
        let again = conditions(&all_ok(), Some(2), &earlier);
        assert_eq!(again[1].last_transition_time, Time(Timestamp::UNIX_EPOCH));
        let failing = Verdicts { table: Verdict::failed("TableCreating", ""), ..all_ok() };
        assert_ne!(conditions(&failing, Some(2), &earlier)[1].last_transition_time, Time(Timestamp::UNIX_EPOCH));
    }
}
