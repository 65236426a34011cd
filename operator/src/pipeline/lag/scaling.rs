//! Scaling on lag (`workers.autoscaling.lag`), decided by a pure function whose state lives in the
//! status ([`LagScalingStatus`]), so a restarted operator carries on where the last one stopped.
//!
//! While the largest lag stays above the target, one more worker than the shard-count rule every
//! `scaleUpAfter`, up to min(maxReplicas, open shards): a shard is read by one worker, so workers beyond
//! the open shards would hold nothing. Once the lag has stayed under half the target for
//! `scaleDownAfter`, back to the shard-count rule. Between half the target and the target nothing
//! moves (the hysteresis band), and a lag nobody measured (no holder wrote one, or the table could not
//! be read) changes nothing either.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use leasehold_crds::{LagScalingStatus, LagTarget};

use super::reading::human;
use crate::conditions::Verdict;

/// What a reconcile knows when it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The largest lag of a held shard, `None` when unknown.
    pub largest: Option<Duration>,
    /// Workers by the shard-count rule.
    pub base: i32,
    /// Open shards, when counted.
    pub open_shards: Option<i32>,
    /// `workers.autoscaling.maxReplicas`.
    pub max_replicas: i32,
    /// The operator's clock.
    pub now: Timestamp,
}

/// What lag scaling decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Workers to run.
    pub replicas: i32,
    /// The state to keep in the status.
    pub state: LagScalingStatus,
    /// The `LagScaling` condition: false when the lag is above target and more workers cannot help.
    pub verdict: Verdict,
    /// Why the extra workers changed, when they did (the note of the scaling Event).
    pub why: Option<String>,
}

/// Where the lag stands against the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Band {
    Unknown,
    Above(Duration),
    Between(Duration),
    UnderHalf(Duration),
}

/// Milliseconds from `since` to `now` (0 when `since` lies ahead).
fn elapsed_ms(since: &Time, now: Timestamp) -> i64 {
    (now.as_millisecond() - since.0.as_millisecond()).max(0)
}

/// `now` as kept in the status: rounded up to the whole second, since the API server keeps whole seconds
/// of a `Time` and would otherwise round it down, ending every window up to a second early.
fn stamp(now: Timestamp) -> Time {
    const SECOND_NS: i128 = 1_000_000_000;
    let up = (now.as_nanosecond() + SECOND_NS - 1).div_euclid(SECOND_NS) * SECOND_NS;
    Time(Timestamp::from_nanosecond(up).unwrap_or(now))
}

fn reached(since: Option<&Time>, now: Timestamp, wait: Duration) -> bool {
    since.is_some_and(|t| elapsed_ms(t, now) >= i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
}

/// The decision for `observed`, from the state the last reconcile left (`previous`).
pub fn decide(target: &LagTarget, previous: &LagScalingStatus, observed: &Observed) -> Decision {
    let now = observed.now;
    let ceiling = observed.max_replicas.min(observed.open_shards.unwrap_or(observed.max_replicas)).max(observed.base);
    let room = ceiling - observed.base;
    let mut state = LagScalingStatus { extra_replicas: previous.extra_replicas.clamp(0, room), ..previous.clone() };
    let band = match observed.largest {
        None => Band::Unknown,
        Some(lag) if lag > target.target => Band::Above(lag),
        Some(lag) if lag < target.target / 2 => Band::UnderHalf(lag),
        Some(lag) => Band::Between(lag),
    };
    let mut why = None;
    match band {
        Band::Unknown => {}
        Band::Above(lag) => {
            state.below_half_since = None;
            let above_since = state.above_target_since.get_or_insert_with(|| stamp(now)).clone();
            // Each step waits a whole scaleUpAfter, counted from the crossing or from the last step.
            let window_start = match &state.last_step_at {
                Some(step) if step.0 > above_since.0 => step.clone(),
                _ => above_since,
            };
            if state.extra_replicas < room && reached(Some(&window_start), now, target.scale_up_after) {
                state.extra_replicas += 1;
                state.last_step_at = Some(stamp(now));
                why = Some(format!(
                    "lag {} above target {} for {}: one more worker ({} by shard count + {} for lag)",
                    human(lag),
                    human(target.target),
                    human(Duration::from_millis(elapsed_ms(&window_start, now).unsigned_abs())),
                    observed.base,
                    state.extra_replicas
                ));
            }
        }
        Band::Between(_) => {
            state.above_target_since = None;
            state.below_half_since = None;
        }
        Band::UnderHalf(lag) => {
            state.above_target_since = None;
            let since = state.below_half_since.get_or_insert_with(|| stamp(now)).clone();
            if state.extra_replicas > 0 && reached(Some(&since), now, target.scale_down_after) {
                why = Some(format!(
                    "lag {} under half the target {} for {}: back to the shard-count rule ({} workers, {} fewer)",
                    human(lag),
                    human(target.target),
                    human(target.scale_down_after),
                    observed.base,
                    state.extra_replicas
                ));
                state.extra_replicas = 0;
                state.last_step_at = None;
            }
        }
    }
    let replicas = observed.base + state.extra_replicas;
    let verdict = verdict(target, band, replicas, ceiling, observed);
    Decision { replicas, state, verdict, why }
}

/// The `LagScaling` condition of a decision.
fn verdict(target: &LagTarget, band: Band, replicas: i32, ceiling: i32, observed: &Observed) -> Verdict {
    let target_text = human(target.target);
    match band {
        Band::Unknown => Verdict::ok("NotMeasured", "no holder has written a lag yet"),
        Band::Above(lag) if replicas >= ceiling && observed.open_shards.is_some_and(|open| open <= replicas) => {
            Verdict::failed(
                "OneShardPerWorker",
                format!(
                    "lag {} above target {target_text}, but each of the {replicas} workers already reads one of the {} open shards: more workers cannot help; raise concurrency (records of a shard processed at once) or split the stream",
                    human(lag),
                    observed.open_shards.unwrap_or(replicas)
                ),
            )
        }
        Band::Above(lag) if replicas >= ceiling => Verdict::failed(
            "AtMaxReplicas",
            format!(
                "lag {} above target {target_text} with maxReplicas ({replicas}) workers: raise maxReplicas",
                human(lag)
            ),
        ),
        Band::Above(lag) => Verdict::ok(
            "AboveTarget",
            format!(
                "lag {} above target {target_text}: one more worker every {} while it stays above ({replicas} now)",
                human(lag),
                human(target.scale_up_after)
            ),
        ),
        Band::Between(lag) | Band::UnderHalf(lag) => {
            Verdict::ok("BelowTarget", format!("lag {} under target {target_text} ({replicas} workers)", human(lag)))
        }
    }
}

#[cfg(test)]
mod tests;
