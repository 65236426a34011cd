//! The checkpoint watermark: the last record of the longest prefix of a shard in which every record
//! is done, however out of order they finished.

use std::collections::VecDeque;

/// Records admitted in shard order, each done or not; the watermark is the end of the done prefix.
#[derive(Debug, Default)]
pub struct Watermark {
    /// Ordinal of the first slot.
    base: u64,
    /// One slot per admitted record not yet behind the watermark: its sequence number once done.
    slots: VecDeque<Option<String>>,
    /// Sequence number of the last record of the done prefix.
    last: Option<String>,
    /// True when `last` moved since the last [`take_advanced`](Self::take_advanced).
    advanced: bool,
    /// The highest ordinal done, in the prefix or beyond it.
    highest: Option<u64>,
}

impl Watermark {
    /// Admits the next record in shard order and returns its ordinal.
    pub fn admit(&mut self) -> u64 {
        let ordinal = self.base + self.slots.len() as u64;
        self.slots.push_back(None);
        ordinal
    }

    /// Marks record `ordinal` done; the watermark moves over every done record at the front.
    pub fn complete(&mut self, ordinal: u64, sequence: String) {
        let Some(index) = ordinal.checked_sub(self.base).and_then(|i| usize::try_from(i).ok()) else { return };
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Some(sequence);
            self.highest = self.highest.max(Some(ordinal));
        }
        while let Some(Some(_)) = self.slots.front() {
            self.last = self.slots.pop_front().flatten();
            self.base += 1;
            self.advanced = true;
        }
    }

    /// Records admitted and not yet behind the watermark (done out of order, running or waiting).
    pub fn pending(&self) -> usize {
        self.slots.len()
    }

    /// The ordinal of the furthest record done, which may lie beyond the done prefix.
    pub fn highest_done(&self) -> Option<u64> {
        self.highest
    }

    /// The last record of the done prefix, if any record is done.
    pub fn last(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// The watermark if it moved since the previous call.
    pub fn take_advanced(&mut self) -> Option<&str> {
        if std::mem::take(&mut self.advanced) { self.last.as_deref() } else { None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_only_over_a_fully_done_prefix() {
        let mut marks = Watermark::default();
        let ordinals: Vec<u64> = (0..5).map(|_| marks.admit()).collect();
        assert_eq!(ordinals, vec![0, 1, 2, 3, 4]);
        marks.complete(2, "s2".into());
        marks.complete(1, "s1".into());
        assert_eq!(marks.last(), None, "record 0 is not done: nothing may be checkpointed");
        assert_eq!(marks.take_advanced(), None);
        marks.complete(0, "s0".into());
        assert_eq!(marks.take_advanced(), Some("s2"), "0, 1, 2 done");
        assert_eq!(marks.take_advanced(), None, "reported once");
        assert_eq!(marks.pending(), 2);
        marks.complete(4, "s4".into());
        assert_eq!(marks.last(), Some("s2"), "3 still running");
        marks.complete(3, "s3".into());
        assert_eq!(marks.last(), Some("s4"));
        assert_eq!(marks.pending(), 0);
        assert_eq!(marks.admit(), 5, "ordinals keep counting");
    }

    #[test]
    fn random_completion_orders_never_pass_an_unfinished_record() {
        use rand::seq::SliceRandom;
        let mut rng = rand::rng();
        for _ in 0..200 {
            let mut marks = Watermark::default();
            let mut order: Vec<u64> = (0..64).map(|_| marks.admit()).collect();
            order.shuffle(&mut rng);
            let mut done = [false; 64];
            for ordinal in order {
                marks.complete(ordinal, format!("{ordinal:03}"));
                done[ordinal as usize] = true;
                let prefix = done.iter().take_while(|d| **d).count();
                let expected = prefix.checked_sub(1).map(|last| format!("{last:03}"));
                assert_eq!(marks.last(), expected.as_deref());
            }
        }
    }
}
