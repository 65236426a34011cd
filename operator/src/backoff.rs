//! Backoff of failed reconciles, per object: the first retry after 2 s, doubling to 5 min, with ±20 %
//! jitter so many failing objects spread out; reset by a successful reconcile. A failure is announced
//! (Warning event, warn log) only the first time and when it changes, not on every retry.
//!
//! The delays are the workspace's one backoff ([`leasehold_worker::backoff`], which says why it is not
//! `backon`): a reconcile is a stateless call, so the delay is asked for by the object's failure count,
//! kept in a map between calls, with the random unit injected so the delays are unit-tested exactly.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use leasehold_worker::backoff::{Backoff, Jitter};
use rand::Rng;

/// How the delay grows with consecutive failures: 2 s doubling to 5 min, each scaled by `1 ± 0.2`
/// (then capped at 5 min).
pub const RECONCILE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(2), Duration::from_secs(300)).with_jitter(Jitter::Spread(0.2));

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Consecutive failures of this object, this one included.
    pub failures: u32,
    /// When to try again.
    pub delay: Duration,
    /// True for the first failure and when it differs from the previous one: publish a Warning.
    pub announce: bool,
}

#[derive(Debug)]
struct Streak {
    failures: u32,
    signature: String,
}

/// Consecutive failures per object (keyed by UID), shared by the reconciles of every object.
#[derive(Debug)]
pub struct Failures {
    policy: Backoff,
    streaks: Mutex<HashMap<String, Streak>>,
}

impl Default for Failures {
    fn default() -> Self {
        Self::new(RECONCILE_BACKOFF)
    }
}

impl Failures {
    /// A tracker with `policy`.
    pub fn new(policy: Backoff) -> Self {
        Self { policy, streaks: Mutex::default() }
    }

    /// Records a failure of `object` described by `signature` (same text = same failure).
    pub fn failed(&self, object: &str, signature: &str) -> Retry {
        self.failed_with(object, signature, rand::rng().random())
    }

    fn failed_with(&self, object: &str, signature: &str, unit: f64) -> Retry {
        let mut streaks = self.streaks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let streak = streaks.entry(object.to_string()).or_insert(Streak { failures: 0, signature: String::new() });
        let announce = streak.failures == 0 || streak.signature != signature;
        streak.failures = streak.failures.saturating_add(1);
        if announce {
            streak.signature = signature.to_string();
        }
        Retry { failures: streak.failures, delay: self.policy.delay(streak.failures, unit), announce }
    }

    /// Records a success of `object` (or its deletion): the next failure starts over.
    pub fn succeeded(&self, object: &str) {
        self.streaks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(object);
    }

    /// Objects failing right now.
    pub fn failing(&self) -> usize {
        self.streaks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_from_2s_to_a_5_minute_cap() {
        let policy = RECONCILE_BACKOFF;
        let delays: Vec<u64> = (1..=10).map(|n| policy.base_delay(n).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(policy.base_delay(u32::MAX), Duration::from_secs(300), "no overflow after many failures");
    }

    #[test]
    fn jitter_stays_within_20_percent_and_under_the_cap() {
        let policy = RECONCILE_BACKOFF;
        assert_eq!(policy.delay(1, 0.0), Duration::from_millis(1600));
        assert_eq!(policy.delay(1, 0.5), Duration::from_secs(2));
        assert_eq!(policy.delay(1, 1.0), Duration::from_millis(2400));
        assert_eq!(policy.delay(20, 1.0), Duration::from_secs(300), "the cap holds with jitter");
        for _ in 0..1000 {
            let delay = policy.delay(3, rand::rng().random());
            assert!((Duration::from_millis(6400)..=Duration::from_millis(9600)).contains(&delay), "{delay:?}");
        }
    }

    #[test]
    fn repeats_grow_and_are_announced_once_until_the_failure_changes() {
        let failures = Failures::default();
        let retry = |sig: &str| failures.failed_with("uid-1", sig, 0.5);
        let first = retry("table: refused");
        assert_eq!((first.failures, first.delay, first.announce), (1, Duration::from_secs(2), true));
        let second = retry("table: refused");
        assert_eq!((second.failures, second.delay, second.announce), (2, Duration::from_secs(4), false));
        assert!(!retry("table: refused").announce);
        let changed = retry("table: throttled");
        assert_eq!((changed.failures, changed.announce), (4, true), "a new failure is announced, the streak goes on");
        assert!(!retry("table: throttled").announce);
        assert_eq!(failures.failed_with("uid-2", "table: refused", 0.5).delay, Duration::from_secs(2), "per object");
    }

    #[test]
    fn a_success_resets_the_streak() {
        let failures = Failures::default();
        for _ in 0..5 {
            failures.failed_with("uid-1", "x", 0.5);
        }
        failures.succeeded("uid-1");
        assert_eq!(failures.failing(), 0);
        let again = failures.failed_with("uid-1", "x", 0.5);
        assert_eq!((again.failures, again.delay, again.announce), (1, Duration::from_secs(2), true));
    }
}
