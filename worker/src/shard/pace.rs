//! Pacing GetRecords on one shard: calls at least a fixed gap apart (Kinesis allows 5 per second), and
//! a page limit that shrinks when a page cannot arrive within the SDK's attempt timeout.

use std::time::Duration;

use tokio::time::Instant;

/// When the next call on a shard may go out.
#[derive(Debug)]
pub struct Pace {
    gap: Duration,
    last: Option<Instant>,
}

impl Pace {
    /// Calls at least `gap` apart.
    pub fn new(gap: Duration) -> Self {
        Self { gap, last: None }
    }

    /// The instant to wait for before the next call, if any.
    pub fn until_next(&self) -> Option<Instant> {
        self.last.map(|last| last + self.gap).filter(|next| *next > Instant::now())
    }

    /// Records that a call went out now.
    pub fn called(&mut self) {
        self.last = Some(Instant::now());
    }

    /// Books the next call: the instant it may go out (now, or the gap after the last), recorded as
    /// the last call's.
    pub fn reserve(&mut self) -> Instant {
        let at = self.until_next().unwrap_or_else(Instant::now);
        self.last = Some(at);
        at
    }
}

/// The lowest page limit a timed-out call shrinks it to.
pub const PAGE_FLOOR: i32 = 10;
/// Successful calls in a row after which a shrunk page limit grows again.
const GROW_AFTER: u32 = 4;
/// The first page's limit when `maxRecords` is larger: a small first page arrives sooner (a busy
/// Kinesis serves 10,000 records of every shard of a worker at once in about a second), so processing
/// starts while the larger pages after it are read.
pub const FIRST_PAGE: i32 = 1000;

/// The GetRecords page limit of one shard. A page that takes longer than the attempt timeout to arrive
/// (a loaded or delayed Kinesis, big records) would be asked for again whole and time out forever, so
/// the shard would never move: the limit halves after each timed-out call, down to [`PAGE_FLOOR`], and
/// grows back by half after every [`GROW_AFTER`] successful calls, up to the configured `maxRecords`.
/// It starts at [`FIRST_PAGE`] (or `maxRecords` when smaller) and doubles after each successful call
/// until it reaches `maxRecords` or a call times out (a slow start, as TCP's).
#[derive(Debug)]
pub struct PageLimit {
    max: i32,
    current: i32,
    streak: u32,
    starting: bool,
}

impl PageLimit {
    /// Starts at [`FIRST_PAGE`], or the configured limit `max` when smaller.
    pub fn new(max: i32) -> Self {
        let max = max.max(1);
        Self { max, current: max.min(FIRST_PAGE), streak: 0, starting: true }
    }

    /// Records to ask for in the next call.
    pub fn get(&self) -> i32 {
        self.current
    }

    /// After a call that timed out: halves the limit (not below the floor); true when it changed.
    pub fn timed_out(&mut self) -> bool {
        self.streak = 0;
        self.starting = false;
        let next = (self.current / 2).max(PAGE_FLOOR.min(self.max));
        let changed = next != self.current;
        self.current = next;
        changed
    }

    /// After a successful call; true when the limit grew.
    pub fn succeeded(&mut self) -> bool {
        if self.current >= self.max {
            self.starting = false;
            return false;
        }
        if self.starting {
            self.current = self.current.saturating_mul(2).min(self.max);
            return true;
        }
        self.streak += 1;
        if self.streak < GROW_AFTER {
            return false;
        }
        self.streak = 0;
        self.current = (self.current + self.current / 2).max(self.current + 1).min(self.max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_limit_starts_small_and_doubles_until_reached_or_a_timeout() {
        let mut limit = PageLimit::new(10_000);
        let mut seen = vec![limit.get()];
        while limit.succeeded() {
            seen.push(limit.get());
        }
        assert_eq!(seen, [1000, 2000, 4000, 8000, 10_000]);
        let mut cut = PageLimit::new(10_000);
        cut.succeeded();
        cut.timed_out();
        assert_eq!(cut.get(), 1000);
        assert!(!cut.succeeded(), "after a timeout it grows back by the cautious rule only");
    }

    #[test]
    fn a_timed_out_call_halves_the_page_down_to_the_floor() {
        let mut limit = PageLimit::new(1000);
        assert_eq!(limit.get(), 1000);
        let mut seen = Vec::new();
        while limit.timed_out() {
            seen.push(limit.get());
        }
        assert_eq!(seen, [500, 250, 125, 62, 31, 15, 10]);
        assert!(!limit.timed_out(), "the floor holds");
        assert_eq!(limit.get(), PAGE_FLOOR);
    }

    #[test]
    fn successes_grow_the_page_back_to_the_configured_limit() {
        let mut limit = PageLimit::new(100);
        limit.timed_out();
        limit.timed_out();
        assert_eq!(limit.get(), 25);
        let mut calls = 0;
        let mut grown = Vec::new();
        while limit.get() < 100 {
            calls += 1;
            if limit.succeeded() {
                grown.push(limit.get());
            }
            assert!(calls < 100, "never grew back");
        }
        assert_eq!(grown, [37, 55, 82, 100], "by half every {GROW_AFTER} successes, capped");
        assert_eq!(calls, 4 * GROW_AFTER as usize);
        assert!(!limit.succeeded(), "no growth past the configured limit");
    }

    #[test]
    fn a_timeout_restarts_the_streak_and_a_small_limit_is_its_own_floor() {
        let mut limit = PageLimit::new(40);
        limit.timed_out();
        for _ in 0..GROW_AFTER - 1 {
            assert!(!limit.succeeded());
        }
        limit.timed_out();
        assert_eq!(limit.get(), 10);
        for _ in 0..GROW_AFTER - 1 {
            assert!(!limit.succeeded(), "the streak started again");
        }
        assert!(limit.succeeded());
        let mut small = PageLimit::new(4);
        assert!(!small.timed_out(), "a configured limit under the floor is not shrunk");
        assert_eq!(small.get(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_are_kept_a_gap_apart() {
        let mut pace = Pace::new(Duration::from_millis(200));
        assert_eq!(pace.until_next(), None, "the first call goes at once");
        pace.called();
        let next = pace.until_next().expect("second call waits");
        assert_eq!(next - Instant::now(), Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(pace.until_next(), None);
    }
}
