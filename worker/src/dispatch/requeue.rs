//! The requeue envelope: how a record copied to the stream's tail carries its history, so it cannot
//! loop forever.
//!
//! A requeued copy keeps the original partition key; its data is the original data behind a one-line
//! header:
//!
//! ```text
//! \0leasehold-requeue requeues=<n> attempts=<m>\n<original data>
//! ```
//!
//! `requeues` counts how many times the record was put back (1 for the first copy), `attempts` the
//! processing attempts made over all copies. The leading NUL byte keeps ordinary text or JSON payloads
//! from being mistaken for a copy. A reader strips the header before the processor sees the record.

use bytes::{BufMut, Bytes, BytesMut};

const MAGIC: &[u8] = b"\0leasehold-requeue ";

/// The history a requeued copy carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct History {
    /// Times the record was put back at the tail.
    pub requeues: u32,
    /// Processing attempts over all copies.
    pub attempts: u32,
}

/// The data of a copy of `data` with `history`.
pub fn wrap(data: &[u8], history: History) -> Bytes {
    let header = format!("requeues={} attempts={}\n", history.requeues, history.attempts);
    let mut out = BytesMut::with_capacity(MAGIC.len() + header.len() + data.len());
    out.put_slice(MAGIC);
    out.put_slice(header.as_bytes());
    out.put_slice(data);
    out.freeze()
}

/// Splits a copy into its history and original data; `None` for data that is not a copy.
pub fn open(data: &Bytes) -> Option<(History, Bytes)> {
    let rest = data.strip_prefix(MAGIC)?;
    let end = rest.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&rest[..end]).ok()?;
    let mut history = History::default();
    for field in header.split(' ') {
        match field.split_once('=')? {
            ("requeues", n) => history.requeues = n.parse().ok()?,
            ("attempts", n) => history.attempts = n.parse().ok()?,
            _ => return None,
        }
    }
    Some((history, data.slice(MAGIC.len() + end + 1..)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_leaves_other_data_alone() {
        let history = History { requeues: 2, attempts: 9 };
        let copy = wrap(b"{\"order\":7}", history);
        assert!(copy.starts_with(b"\0leasehold-requeue requeues=2 attempts=9\n"));
        assert_eq!(open(&copy), Some((history, Bytes::from_static(b"{\"order\":7}"))));
        assert_eq!(open(&Bytes::from_static(b"{\"order\":7}")), None);
        assert_eq!(open(&Bytes::from_static(b"\0leasehold-requeue junk\n")), None);
        let empty = wrap(b"", History { requeues: 1, attempts: 3 });
        assert_eq!(open(&empty).map(|(h, d)| (h.requeues, d.len())), Some((1, 0)));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn any_data_wrapped_opens_to_its_history_and_data(
            data in proptest::collection::vec(any::<u8>(), 0..2048),
            requeues in any::<u32>(),
            attempts in any::<u32>(),
        ) {
            let history = History { requeues, attempts };
            let copy = wrap(&data, history);
            prop_assert_eq!(open(&copy), Some((history, Bytes::from(data))));
        }

        #[test]
        fn what_opens_is_the_end_of_the_data(
            data in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..256),
                ("(requeues|attempts)=[0-9]{0,12}( (requeues|attempts)=[0-9]{0,12})?\n", any::<Vec<u8>>())
                    .prop_map(|(header, rest)| [b"\0leasehold-requeue ".as_slice(), header.as_bytes(), &rest].concat()),
            ]
        ) {
            let data = Bytes::from(data);
            if let Some((_, original)) = open(&data) {
                prop_assert!(data.ends_with(&original));
                prop_assert!(original.len() < data.len());
            }
        }
    }
}
