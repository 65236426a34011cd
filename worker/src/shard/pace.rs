//! Keeping GetRecords calls on one shard at least a fixed gap apart (Kinesis allows 5 per second).

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
