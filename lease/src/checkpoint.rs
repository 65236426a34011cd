//! Where a shard's processing has got to, as stored in the `checkpoint` attribute (and, inside a KPL
//! aggregate, the `checkpoint_subsequence` attribute).

use std::fmt;
use std::str::FromStr;

/// The position recorded in a lease row's `checkpoint` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// Nothing processed yet; start at the oldest record (`TRIM_HORIZON`).
    TrimHorizon,
    /// Nothing processed yet; start at the tip of the shard (`LATEST`).
    Latest,
    /// Nothing processed yet; start at the first record at or after this time (`AT_TIMESTAMP:<ms>`).
    AtTimestamp(i64),
    /// Every record up to and including this sequence number is processed.
    Sequence(String),
    /// Inside a KPL aggregate: every record before the Kinesis record `sequence`, and its user records
    /// up to and including `sub_sequence`, are processed; the rest of that aggregate is not. Stored as
    /// `checkpoint` = `sequence` and `checkpoint_subsequence` = `sub_sequence`.
    SubSequence {
        /// The Kinesis sequence number of the aggregate.
        sequence: String,
        /// The last user record of it that is done (its position, 0..n-1).
        sub_sequence: u32,
    },
    /// The shard is closed and every record in it is processed (`SHARD_END`).
    ShardEnd,
}

impl Checkpoint {
    /// True once the shard has been read to its end.
    pub fn is_shard_end(&self) -> bool {
        matches!(self, Checkpoint::ShardEnd)
    }

    /// The text of the `checkpoint` attribute: everything but the sub-sequence.
    pub fn attribute(&self) -> String {
        match self {
            Checkpoint::SubSequence { sequence, .. } => sequence.clone(),
            other => other.to_string(),
        }
    }

    /// The `checkpoint_subsequence` attribute: set only inside an aggregate.
    pub fn sub_sequence(&self) -> Option<u32> {
        match self {
            Checkpoint::SubSequence { sub_sequence, .. } => Some(*sub_sequence),
            _ => None,
        }
    }

    /// The checkpoint stored as `checkpoint` = `text` and `checkpoint_subsequence` = `sub_sequence`; a
    /// sub-sequence is only valid with a sequence number.
    pub fn from_attributes(text: &str, sub_sequence: Option<u32>) -> Result<Self, InvalidCheckpoint> {
        match (text.parse::<Checkpoint>()?, sub_sequence) {
            (checkpoint, None) => Ok(checkpoint),
            (Checkpoint::Sequence(sequence), Some(sub_sequence)) => {
                Ok(Checkpoint::SubSequence { sequence, sub_sequence })
            }
            (_, Some(sub_sequence)) => Err(InvalidCheckpoint(format!("{text} with sub-sequence {sub_sequence}"))),
        }
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::TrimHorizon => f.write_str("TRIM_HORIZON"),
            Checkpoint::Latest => f.write_str("LATEST"),
            Checkpoint::AtTimestamp(ms) => write!(f, "AT_TIMESTAMP:{ms}"),
            Checkpoint::Sequence(sequence) => f.write_str(sequence),
            // For logs only: the row keeps the two parts in two attributes.
            Checkpoint::SubSequence { sequence, sub_sequence } => write!(f, "{sequence}/{sub_sequence}"),
            Checkpoint::ShardEnd => f.write_str("SHARD_END"),
        }
    }
}

/// Why a `checkpoint` attribute could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid checkpoint {0:?}: expected TRIM_HORIZON, LATEST, AT_TIMESTAMP:<ms>, SHARD_END or a sequence number")]
pub struct InvalidCheckpoint(pub String);

impl FromStr for Checkpoint {
    type Err = InvalidCheckpoint;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "TRIM_HORIZON" => Ok(Checkpoint::TrimHorizon),
            "LATEST" => Ok(Checkpoint::Latest),
            "SHARD_END" => Ok(Checkpoint::ShardEnd),
            _ => {
                if let Some(ms) = text.strip_prefix("AT_TIMESTAMP:") {
                    return ms.parse().map(Checkpoint::AtTimestamp).map_err(|_| InvalidCheckpoint(text.into()));
                }
                // Kinesis sequence numbers are decimal strings of up to 128 digits.
                let is_sequence = !text.is_empty() && text.len() <= 128 && text.bytes().all(|b| b.is_ascii_digit());
                if is_sequence { Ok(Checkpoint::Sequence(text.into())) } else { Err(InvalidCheckpoint(text.into())) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_round_trips() {
        for checkpoint in [
            Checkpoint::TrimHorizon,
            Checkpoint::Latest,
            Checkpoint::AtTimestamp(1_700_000_000_000),
            Checkpoint::Sequence("49590338271490256608559692538361571095921575989136588898".into()),
            Checkpoint::ShardEnd,
        ] {
            assert_eq!(checkpoint.to_string().parse::<Checkpoint>(), Ok(checkpoint));
        }
    }

    #[test]
    fn sub_sequences_round_trip_through_their_two_attributes() {
        let inside = Checkpoint::SubSequence { sequence: "4959".into(), sub_sequence: 7 };
        assert_eq!((inside.attribute(), inside.sub_sequence()), ("4959".to_string(), Some(7)));
        assert_eq!(Checkpoint::from_attributes("4959", Some(7)), Ok(inside));
        assert_eq!(Checkpoint::from_attributes("4959", None), Ok(Checkpoint::Sequence("4959".into())));
        assert_eq!(Checkpoint::ShardEnd.sub_sequence(), None);
        assert!(Checkpoint::from_attributes("SHARD_END", Some(1)).is_err(), "a sub-sequence needs a sequence");
    }

    #[test]
    fn garbage_is_refused() {
        for text in ["", "AT_TIMESTAMP:soon", "12a4", "latest"] {
            assert_eq!(text.parse::<Checkpoint>(), Err(InvalidCheckpoint(text.into())));
        }
    }
}

#[cfg(test)]
pub mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Any checkpoint a row can hold, sub-sequences included.
    pub fn any_checkpoint() -> impl Strategy<Value = Checkpoint> {
        prop_oneof![
            Just(Checkpoint::TrimHorizon),
            Just(Checkpoint::Latest),
            Just(Checkpoint::ShardEnd),
            any::<i64>().prop_map(Checkpoint::AtTimestamp),
            "[0-9]{1,128}".prop_map(Checkpoint::Sequence),
            ("[0-9]{1,128}", any::<u32>())
                .prop_map(|(sequence, sub_sequence)| Checkpoint::SubSequence { sequence, sub_sequence }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn a_checkpoint_reads_back_from_its_attributes(checkpoint in any_checkpoint()) {
            let read = Checkpoint::from_attributes(&checkpoint.attribute(), checkpoint.sub_sequence());
            prop_assert_eq!(read, Ok(checkpoint.clone()));
            if checkpoint.sub_sequence().is_none() {
                prop_assert_eq!(checkpoint.to_string().parse::<Checkpoint>(), Ok(checkpoint));
            }
        }

        #[test]
        fn any_text_that_reads_is_written_back_as_text_that_reads_the_same(
            text in prop_oneof![
                "(TRIM_HORIZON|LATEST|SHARD_END|AT_TIMESTAMP:)?[-+]?[0-9]{0,130}",
                any::<String>(),
            ]
        ) {
            if let Ok(checkpoint) = text.parse::<Checkpoint>() {
                prop_assert_eq!(checkpoint.attribute().parse::<Checkpoint>(), Ok(checkpoint));
            }
        }
    }
}
