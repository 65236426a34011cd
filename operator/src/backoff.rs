//! Backoff of failed reconciles, per object: the first retry after 2 s, doubling to 5 min, with ±20 %
//! jitter so many failing objects spread out; reset by a successful reconcile. A failure is announced
//! (Warning event, warn log) only the first time and when it changes, not on every retry.
//!
//! Written here rather than with `backon` (which the worker's readers use) on purpose: a reconcile is a
//! stateless call, so the delay is a function of the object's failure count kept in a map between
//! calls, where `backon` gives an iterator that would have to be stored per object only to call
//! `next()`; and the jitter is symmetric (±20 %, so many failing objects spread both ways around the
//! nominal delay) with the random unit injected, so the delays are unit-tested exactly, where `backon`'s
//! is additive only and draws from its own generator. The arithmetic is a few lines.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;

/// How the delay grows with consecutive failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Longest delay.
    pub max: Duration,
    /// Relative jitter: each delay is scaled by a factor in `1 ± jitter`, then capped at `max`.
    pub jitter: f64,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self { initial: Duration::from_secs(2), max: Duration::from_secs(300), jitter: 0.2 }
    }
}

impl BackoffPolicy {
    /// The delay after `failures` consecutive failures (1 for the first), before jitter.
    pub fn base_delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }

    /// The delay after `failures` consecutive failures, with `unit` (in `0..1`) choosing the jitter.
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let factor = 1.0 + self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        self.base_delay(failures).mul_f64(factor).min(self.max)
    }
}

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
#[derive(Debug, Default)]
pub struct Failures {
    policy: BackoffPolicy,
    streaks: Mutex<HashMap<String, Streak>>,
}

impl Failures {
    /// A tracker with `policy`.
    pub fn new(policy: BackoffPolicy) -> Self {
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
        let policy = BackoffPolicy::default();
        let delays: Vec<u64> = (1..=10).map(|n| policy.base_delay(n).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(policy.base_delay(u32::MAX), Duration::from_secs(300), "no overflow after many failures");
    }

    #[test]
    fn jitter_stays_within_20_percent_and_under_the_cap() {
        let policy = BackoffPolicy::default();
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
