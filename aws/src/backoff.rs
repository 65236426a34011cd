//! Waiting between retries, written once for every retry loop of the worker and the operator: a delay
//! that starts at `initial` and doubles up to `max`, with the jitter the caller asks for. A loop takes
//! [`Backoff::delays`] (an endless iterator); a stateless caller that keeps its own failure count (the
//! operator's reconciles) asks [`Backoff::delay`] for the n-th delay.
//!
//! Written here rather than with `backon` (which the worker used before) on purpose: a reconcile is a
//! stateless call, so its delay must be a function of a failure count kept between calls, where
//! `backon` gives an iterator that would have to be stored per object only to call `next()`; the
//! operator's jitter is symmetric (±20 %, so many failing objects spread both ways around the nominal
//! delay), where `backon`'s is additive only; and the random unit is injected, so the delays are
//! unit-tested exactly, where `backon` draws from its own generator. The arithmetic is a few lines;
//! one helper for both kinds of callers beats two.
//!
//! Lives in `leasehold-aws` because the shared Kinesis calls (`crate::kinesis`) retry with it too; the
//! worker re-exports it as `leasehold_worker::backoff`.

use std::time::Duration;

/// How a delay is varied at random, so that many retrying parties do not retry in step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Exactly the doubling delays (the record retry policy's `retry.backoff`, which users read).
    None,
    /// Up to this fraction of the delay added (`1.0`: up to double it); may exceed `max` by as much.
    Added(f64),
    /// Scaled by a factor in `1 ± fraction`, then capped at `max`.
    Spread(f64),
}

/// Delays that start at `initial` and double up to `max`, with [`Jitter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay (kept as it is even above `max`; the next ones are capped).
    pub initial: Duration,
    /// The longest delay before jitter.
    pub max: Duration,
    /// How each delay varies.
    pub jitter: Jitter,
}

impl Backoff {
    /// From `initial` doubling to `max`, without jitter.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max, jitter: Jitter::None }
    }

    /// The same delays with `jitter`.
    pub const fn with_jitter(self, jitter: Jitter) -> Self {
        Self { jitter, ..self }
    }

    /// The delay before the `attempt`-th retry (1 for the first), before jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        if attempt <= 1 {
            return self.initial;
        }
        let doublings = (attempt - 1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }

    /// The delay before the `attempt`-th retry, with `unit` (in `0..1`) choosing the jitter.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.base_delay(attempt);
        let unit = unit.clamp(0.0, 1.0);
        match self.jitter {
            Jitter::None => base,
            Jitter::Added(fraction) => base.saturating_add(base.mul_f64(fraction * unit)),
            Jitter::Spread(fraction) => base.mul_f64(1.0 + fraction * (2.0 * unit - 1.0)).min(self.max),
        }
    }

    /// The delays before each retry in turn, without end, the jitter drawn at random.
    pub fn delays(self) -> Delays {
        Delays { backoff: self, attempt: 0 }
    }
}

/// The endless delays of a [`Backoff`], one per retry.
#[derive(Debug, Clone)]
pub struct Delays {
    backoff: Backoff,
    attempt: u32,
}

impl Delays {
    /// Starts over from the first delay (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.attempt = self.attempt.saturating_add(1);
        let unit = if self.backoff.jitter == Jitter::None { 0.0 } else { rand::random::<f64>() };
        Some(self.backoff.delay(self.attempt, unit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn delays_double_from_the_first_to_the_cap() {
        let delays: Vec<Duration> = Backoff::new(ms(100), ms(1000)).delays().take(6).collect();
        assert_eq!(delays, [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]);
        assert_eq!(Backoff::new(ms(100), ms(1000)).base_delay(u32::MAX), ms(1000), "no overflow");
    }

    #[test]
    fn a_first_delay_above_the_cap_is_kept_and_the_next_are_capped() {
        let delays: Vec<Duration> = Backoff::new(ms(5000), ms(1000)).delays().take(3).collect();
        assert_eq!(delays, [ms(5000), ms(1000), ms(1000)]);
    }

    #[test]
    fn added_jitter_adds_up_to_its_fraction_even_past_the_cap() {
        let backoff = Backoff::new(ms(200), ms(5000)).with_jitter(Jitter::Added(0.5));
        assert_eq!(backoff.delay(1, 0.0), ms(200));
        assert_eq!(backoff.delay(1, 1.0), ms(300));
        assert_eq!(backoff.delay(9, 1.0), ms(7500));
        for delay in backoff.delays().take(1000) {
            assert!((ms(200)..=ms(7500)).contains(&delay), "{delay:?}");
        }
    }

    #[test]
    fn spread_jitter_goes_both_ways_and_stays_under_the_cap() {
        let backoff = Backoff::new(ms(2000), ms(300_000)).with_jitter(Jitter::Spread(0.2));
        assert_eq!(backoff.delay(1, 0.0), ms(1600));
        assert_eq!(backoff.delay(1, 0.5), ms(2000));
        assert_eq!(backoff.delay(1, 1.0), ms(2400));
        assert_eq!(backoff.delay(20, 1.0), ms(300_000));
    }

    #[test]
    fn reset_starts_over() {
        let mut delays = Backoff::new(ms(10), ms(1000)).delays();
        delays.nth(4);
        delays.reset();
        assert_eq!(delays.next(), Some(ms(10)));
    }
}
