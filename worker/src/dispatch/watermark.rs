//! The checkpoint watermark: the last record of the longest prefix of a shard in which every record
//! is done, however out of order they finished. Each record carries the checkpoint that covers it:
//! its sequence number, or inside a KPL aggregate its (sequence, sub-sequence), the aggregate's last
//! user record carrying the plain sequence number.

use std::collections::VecDeque;

use crate::lease::Checkpoint;

/// An admitted record not yet behind the watermark.
#[derive(Debug)]
struct Slot {
    /// Its checkpoint, once done.
    done: Option<Checkpoint>,
    /// When Kinesis accepted it (epoch ms), when known: how old the oldest unfinished record is.
    arrival_ms: Option<i64>,
}

/// Records admitted in shard order, each done or not; the watermark is the end of the done prefix.
#[derive(Debug, Default)]
pub struct Watermark {
    /// Ordinal of the first slot.
    base: u64,
    /// One slot per admitted record not yet behind the watermark.
    slots: VecDeque<Slot>,
    /// Checkpoint of the last record of the done prefix.
    last: Option<Checkpoint>,
    /// True when `last` moved since the last [`take_advanced`](Self::take_advanced).
    advanced: bool,
    /// The highest ordinal done, in the prefix or beyond it.
    highest: Option<u64>,
}

impl Watermark {
    /// Admits the next record in shard order, which arrived at `arrival_ms`, and returns its ordinal.
    pub fn admit(&mut self, arrival_ms: Option<i64>) -> u64 {
        let ordinal = self.base + self.slots.len() as u64;
        self.slots.push_back(Slot { done: None, arrival_ms });
        ordinal
    }

    /// Marks record `ordinal` done; the watermark moves over every done record at the front.
    pub fn complete(&mut self, ordinal: u64, covers: Checkpoint) {
        let Some(index) = ordinal.checked_sub(self.base).and_then(|i| usize::try_from(i).ok()) else { return };
        if let Some(slot) = self.slots.get_mut(index) {
            slot.done = Some(covers);
            self.highest = self.highest.max(Some(ordinal));
        }
        while self.slots.front().is_some_and(|slot| slot.done.is_some()) {
            self.last = self.slots.pop_front().and_then(|slot| slot.done);
            self.base += 1;
            self.advanced = true;
        }
    }

    /// Records admitted and not yet behind the watermark (done out of order, running or waiting).
    pub fn pending(&self) -> usize {
        self.slots.len()
    }

    /// When the oldest record not yet done arrived (epoch ms): the front of the window, since every
    /// done record at the front is behind the watermark. `None` when none is pending or its arrival is
    /// unknown.
    pub fn oldest_pending_arrival(&self) -> Option<i64> {
        self.slots.front().and_then(|slot| slot.arrival_ms)
    }

    /// The ordinal of the furthest record done, which may lie beyond the done prefix.
    pub fn highest_done(&self) -> Option<u64> {
        self.highest
    }

    /// The last record of the done prefix, if any record is done.
    pub fn last(&self) -> Option<&Checkpoint> {
        self.last.as_ref()
    }

    /// The watermark if it moved since the previous call.
    pub fn take_advanced(&mut self) -> Option<&Checkpoint> {
        if std::mem::take(&mut self.advanced) { self.last.as_ref() } else { None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(text: &str) -> Checkpoint {
        Checkpoint::Sequence(text.into())
    }

    #[test]
    fn inside_an_aggregate_the_mark_is_the_sub_sequence_until_its_last_user_record() {
        let mut marks = Watermark::default();
        let ordinals: Vec<u64> = (0..3).map(|_| marks.admit(None)).collect();
        let sub = |n| Checkpoint::SubSequence { sequence: "9".into(), sub_sequence: n };
        marks.complete(ordinals[0], sub(0));
        assert_eq!(marks.last(), Some(&sub(0)));
        marks.complete(ordinals[2], seq("9"));
        assert_eq!(marks.last(), Some(&sub(0)), "user record 1 is still running");
        marks.complete(ordinals[1], sub(1));
        assert_eq!(marks.last(), Some(&seq("9")), "the whole aggregate done: its plain sequence number");
    }

    #[test]
    fn moves_only_over_a_fully_done_prefix() {
        let mut marks = Watermark::default();
        let ordinals: Vec<u64> = (0..5).map(|_| marks.admit(None)).collect();
        assert_eq!(ordinals, vec![0, 1, 2, 3, 4]);
        marks.complete(2, seq("s2"));
        marks.complete(1, seq("s1"));
        assert_eq!(marks.last(), None, "record 0 is not done: nothing may be checkpointed");
        assert_eq!(marks.take_advanced(), None);
        marks.complete(0, seq("s0"));
        assert_eq!(marks.take_advanced(), Some(&seq("s2")), "0, 1, 2 done");
        assert_eq!(marks.take_advanced(), None, "reported once");
        assert_eq!(marks.pending(), 2);
        marks.complete(4, seq("s4"));
        assert_eq!(marks.last(), Some(&seq("s2")), "3 still running");
        marks.complete(3, seq("s3"));
        assert_eq!(marks.last(), Some(&seq("s4")));
        assert_eq!(marks.pending(), 0);
        assert_eq!(marks.admit(None), 5, "ordinals keep counting");
    }

    #[test]
    fn the_oldest_pending_arrival_is_the_first_record_not_done() {
        let mut marks = Watermark::default();
        let ordinals: Vec<u64> = [100, 200, 300].into_iter().map(|at| marks.admit(Some(at))).collect();
        assert_eq!(marks.oldest_pending_arrival(), Some(100));
        marks.complete(ordinals[1], seq("s1"));
        assert_eq!(marks.oldest_pending_arrival(), Some(100), "done out of order: the first is still pending");
        marks.complete(ordinals[0], seq("s0"));
        assert_eq!(marks.oldest_pending_arrival(), Some(300));
        marks.complete(ordinals[2], seq("s2"));
        assert_eq!(marks.oldest_pending_arrival(), None, "every record done");
    }

    #[test]
    fn random_completion_orders_never_pass_an_unfinished_record() {
        use rand::seq::SliceRandom;
        let mut rng = rand::rng();
        for _ in 0..200 {
            let mut marks = Watermark::default();
            let mut order: Vec<u64> = (0..64).map(|_| marks.admit(None)).collect();
            order.shuffle(&mut rng);
            let mut done = [false; 64];
            for ordinal in order {
                marks.complete(ordinal, seq(&format!("{ordinal:03}")));
                done[ordinal as usize] = true;
                let prefix = done.iter().take_while(|d| **d).count();
                let expected = prefix.checked_sub(1).map(|last| seq(&format!("{last:03}")));
                assert_eq!(marks.last(), expected.as_ref());
            }
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// What a shard's reader and runners do to the watermark: admit the next record, or finish one
    /// (by index into the records admitted so far, done ones and unknown ordinals included).
    #[derive(Debug, Clone)]
    enum Step {
        Admit,
        Complete(usize),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![1 => Just(Step::Admit), 2 => any::<usize>().prop_map(Step::Complete)],
            0..200,
        )
    }

    fn covers(ordinal: u64) -> Checkpoint {
        Checkpoint::Sequence(format!("{ordinal:05}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn the_mark_is_the_end_of_the_done_prefix_and_never_moves_back(steps in steps()) {
            let mut marks = Watermark::default();
            let mut done: Vec<bool> = Vec::new();
            let mut prefix = 0usize;
            for step in steps {
                match step {
                    Step::Admit => {
                        prop_assert_eq!(marks.admit(None), done.len() as u64, "ordinals count up from 0");
                        done.push(false);
                    }
                    Step::Complete(pick) => {
                        // One in eight names an ordinal never admitted, which must be ignored.
                        let ordinal = if pick % 8 == 7 || done.is_empty() {
                            (done.len() + pick % 3) as u64
                        } else {
                            (pick % done.len()) as u64
                        };
                        marks.complete(ordinal, covers(ordinal));
                        if let Some(d) = done.get_mut(ordinal as usize) {
                            *d = true;
                        }
                    }
                }
                let now = done.iter().take_while(|d| **d).count();
                prop_assert!(now >= prefix, "the done prefix never shrinks");
                prefix = now;
                let expected = prefix.checked_sub(1).map(|last| covers(last as u64));
                prop_assert_eq!(marks.last(), expected.as_ref(), "the mark is the prefix's last record: {:?}", done);
                prop_assert_eq!(marks.pending(), done.len() - prefix);
                let highest = done.iter().rposition(|d| *d).map(|i| i as u64);
                prop_assert_eq!(marks.highest_done(), highest);
            }
        }

        #[test]
        fn any_completion_order_ends_at_the_last_record(order in Just((0..64u64).collect::<Vec<_>>()).prop_shuffle()) {
            let mut marks = Watermark::default();
            for _ in 0..64 {
                marks.admit(None);
            }
            let mut last_seen: Option<u64> = None;
            for ordinal in order {
                marks.complete(ordinal, covers(ordinal));
                if let Some(Checkpoint::Sequence(text)) = marks.take_advanced() {
                    let at: u64 = text.parse().map_err(|_| TestCaseError::fail("a sequence"))?;
                    prop_assert!(last_seen.is_none_or(|before| at > before), "advances only forward");
                    last_seen = Some(at);
                }
            }
            prop_assert_eq!(marks.last(), Some(&covers(63)));
            prop_assert_eq!(marks.pending(), 0);
        }
    }
}
