//! The requeue envelope: how a record copied to the stream's tail carries its history, so it cannot
//! loop forever, and a proof that a worker of the consumer wrote it, so a producer cannot forge one.
//!
//! A requeued copy keeps the original partition key; its data is the original data behind a one-line
//! header:
//!
//! ```text
//! \0leasehold-requeue requeues=<n> attempts=<m> mac=<64 hex digits>\n<original data>
//! ```
//!
//! `requeues` counts how many times the record was put back (1 for the first copy), `attempts` the
//! processing attempts made over all copies. `mac` is HMAC-SHA256, under the consumer's requeue key,
//! of the history, the partition key and the original data (see [`tag`]). The leading NUL byte keeps
//! ordinary text or JSON payloads from being mistaken for a copy. A reader strips the header before
//! the processor sees the record, once the proof checks; a header whose proof does not check (a
//! producer's forgery, or a copy signed under another key) leaves the record an ordinary one, its bytes
//! as they are.
//!
//! The key is the group's: every worker of a consumer reads the same one (kept in the lease table, see
//! `GroupRows::requeue_secret`), so any of them verifies the copies of any other, across restarts.

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8] = b"\0leasehold-requeue ";

/// The longest header line read after the magic (`requeues=` and `attempts=` of ten digits each and
/// `mac=` of 64 hex digits take 99 bytes); a longer one is not a copy.
const MAX_HEADER: usize = 128;

/// What the proof covers before the history, so a tag made for anything else never verifies here.
const DOMAIN: &[u8] = b"leasehold-requeue/1\0";

/// Bytes of a requeue key.
pub const KEY_BYTES: usize = 32;

/// The key requeued copies are signed with; the same for every worker of a consumer.
#[derive(Clone, PartialEq, Eq)]
pub struct RequeueKey([u8; KEY_BYTES]);

impl std::fmt::Debug for RequeueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequeueKey(..)")
    }
}

impl RequeueKey {
    /// A fresh random key.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// The key written as `hex` (64 hex digits, as [`RequeueKey::to_hex`] writes it).
    pub fn from_hex(hex: &str) -> Option<Self> {
        let mut key = [0u8; KEY_BYTES];
        hex::decode_to_slice(hex.trim(), &mut key).ok()?;
        Some(Self(key))
    }

    /// The key as 64 hex digits (how the lease table keeps it).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// Where a runner gets its consumer's requeue key (read once, when first needed).
#[async_trait]
pub trait KeySource: Send + Sync {
    /// The consumer's key, created if it has none yet; an error is retried.
    async fn requeue_key(&self) -> Result<RequeueKey, String>;
}

/// The history a requeued copy carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct History {
    /// Times the record was put back at the tail.
    pub requeues: u32,
    /// Processing attempts over all copies.
    pub attempts: u32,
}

/// A requeue header as parsed, before its proof is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The history it claims.
    pub history: History,
    /// The proof it carries.
    pub mac: [u8; 32],
    /// The original data behind the header.
    pub data: Bytes,
}

/// True when `data` opens like a copy (the magic), so that reading it needs the key.
pub fn looks_like_copy(data: &[u8]) -> bool {
    data.starts_with(MAGIC)
}

/// The proof of a copy of `data` under `partition_key` with `history`: HMAC-SHA256 under `key` of
/// the domain, `requeues` and `attempts` (4 bytes each, big-endian), the key's length (8 bytes,
/// big-endian), the key and the data.
pub fn tag(key: &RequeueKey, partition_key: &str, data: &[u8], history: History) -> [u8; 32] {
    mac(key, partition_key, data, history).finalize().into_bytes().into()
}

fn mac(key: &RequeueKey, partition_key: &str, data: &[u8], history: History) -> Hmac<Sha256> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.0).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    mac.update(DOMAIN);
    mac.update(&history.requeues.to_be_bytes());
    mac.update(&history.attempts.to_be_bytes());
    mac.update(&(partition_key.len() as u64).to_be_bytes());
    mac.update(partition_key.as_bytes());
    mac.update(data);
    mac
}

/// The data of a copy of `data` (keyed `partition_key`) with `history`, signed under `key`.
pub fn wrap(key: &RequeueKey, partition_key: &str, data: &[u8], history: History) -> Bytes {
    let proof = tag(key, partition_key, data, history);
    let header = format!("requeues={} attempts={} mac={}\n", history.requeues, history.attempts, hex::encode(proof));
    let mut out = BytesMut::with_capacity(MAGIC.len() + header.len() + data.len());
    out.put_slice(MAGIC);
    out.put_slice(header.as_bytes());
    out.put_slice(data);
    out.freeze()
}

/// A counter of the header: 1 to 10 ASCII digits that fit a `u32` (no sign, no spaces).
fn counter(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Parses a requeue header without checking its proof (the pure entry point, for fuzzing and for
/// reading copies off a stream); `None` for data that is not a well-formed copy. Each field must
/// appear exactly once; the header line is at most [`MAX_HEADER`] bytes.
pub fn parse(data: &Bytes) -> Option<Envelope> {
    let rest = data.strip_prefix(MAGIC)?;
    let end = rest[..rest.len().min(MAX_HEADER + 1)].iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&rest[..end]).ok()?;
    let (mut requeues, mut attempts, mut proof) = (None, None, None);
    for field in header.split(' ') {
        let slot_taken = match field.split_once('=')? {
            ("requeues", n) => requeues.replace(counter(n)?).is_some(),
            ("attempts", n) => attempts.replace(counter(n)?).is_some(),
            ("mac", hex) => {
                let mut mac = [0u8; 32];
                hex::decode_to_slice(hex, &mut mac).ok()?;
                proof.replace(mac).is_some()
            }
            _ => return None,
        };
        if slot_taken {
            return None;
        }
    }
    let history = History { requeues: requeues?, attempts: attempts? };
    Some(Envelope { history, mac: proof?, data: data.slice(MAGIC.len() + end + 1..) })
}

/// [`parse`] as history and original data (what tests and fuzz targets read); the proof is not checked.
pub fn open_unverified(data: &Bytes) -> Option<(History, Bytes)> {
    parse(data).map(|envelope| (envelope.history, envelope.data))
}

/// What a record's data is, read with the consumer's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// No requeue header: an ordinary record.
    Plain,
    /// A copy a worker of this consumer wrote: its history and original data.
    Genuine(History, Bytes),
    /// Opens like a copy, but the header is malformed or its proof does not check: an ordinary record,
    /// its bytes as they are.
    Forged,
}

/// Reads `data` (keyed `partition_key`) as a copy signed under `key`.
pub fn open(key: &RequeueKey, partition_key: &str, data: &Bytes) -> Opened {
    if !looks_like_copy(data) {
        return Opened::Plain;
    }
    let Some(envelope) = parse(data) else { return Opened::Forged };
    // `verify_slice` compares in constant time.
    match mac(key, partition_key, &envelope.data, envelope.history).verify_slice(&envelope.mac) {
        Ok(()) => Opened::Genuine(envelope.history, envelope.data),
        Err(_) => Opened::Forged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_leaves_other_data_alone() {
        let key = RequeueKey::random();
        let history = History { requeues: 2, attempts: 9 };
        let copy = wrap(&key, "k", b"{\"order\":7}", history);
        assert!(copy.starts_with(b"\0leasehold-requeue requeues=2 attempts=9 mac="));
        assert_eq!(open(&key, "k", &copy), Opened::Genuine(history, Bytes::from_static(b"{\"order\":7}")));
        assert_eq!(open_unverified(&copy), Some((history, Bytes::from_static(b"{\"order\":7}"))));
        assert_eq!(open(&key, "k", &Bytes::from_static(b"{\"order\":7}")), Opened::Plain);
        assert_eq!(open(&key, "k", &Bytes::from_static(b"\0leasehold-requeue junk\n")), Opened::Forged);
        let empty = wrap(&key, "k", b"", History { requeues: 1, attempts: 3 });
        assert!(matches!(open(&key, "k", &empty), Opened::Genuine(History { requeues: 1, .. }, d) if d.is_empty()));
        assert_eq!(RequeueKey::from_hex(&key.to_hex()), Some(key));
    }

    #[test]
    fn a_producer_cannot_forge_or_alter_a_copy() {
        let key = RequeueKey::random();
        let history = History { requeues: 1, attempts: 2 };
        // The old, unsigned header and a signed header under another key are forgeries.
        let unsigned = Bytes::from_static(b"\0leasehold-requeue requeues=9 attempts=99\nx");
        assert_eq!(open(&key, "k", &unsigned), Opened::Forged);
        let other = wrap(&RequeueKey::random(), "k", b"x", history);
        assert_eq!(open(&key, "k", &other), Opened::Forged);
        // A genuine copy with its history, data or key changed no longer verifies.
        let copy = wrap(&key, "k", b"x", history);
        let text = String::from_utf8(copy.to_vec()).unwrap();
        let raised = Bytes::from(text.replace("requeues=1", "requeues=3"));
        assert_eq!(open(&key, "k", &raised), Opened::Forged);
        let mut altered = copy.to_vec();
        *altered.last_mut().unwrap() = b'y';
        assert_eq!(open(&key, "k", &Bytes::from(altered)), Opened::Forged);
        assert_eq!(open(&key, "other-key", &copy), Opened::Forged);
    }

    #[test]
    fn parse_is_bounded_and_strict() {
        let mac = "0".repeat(64);
        let ok = |header: &str| parse(&Bytes::from(format!("\0leasehold-requeue {header}\ndata")));
        assert!(ok(&format!("requeues=1 attempts=2 mac={mac}")).is_some());
        assert!(ok(&format!("attempts=2 mac={mac} requeues=4294967295")).is_some(), "any order, u32::MAX");
        assert!(ok(&format!("requeues=4294967296 attempts=2 mac={mac}")).is_none(), "past u32");
        assert!(ok(&format!("requeues=+1 attempts=2 mac={mac}")).is_none(), "digits only");
        assert!(ok(&format!("requeues=1 requeues=1 attempts=2 mac={mac}")).is_none(), "once each");
        assert!(ok(&format!("requeues=1 mac={mac}")).is_none(), "every field");
        assert!(ok("requeues=1 attempts=2 mac=00").is_none(), "a whole mac");
        let long = format!("\0leasehold-requeue requeues=1 attempts=2 mac={mac}{}\n", " ".repeat(MAX_HEADER));
        assert!(parse(&Bytes::from(long)).is_none(), "a header past its bound");
        assert!(parse(&Bytes::from_static(b"\0leasehold-requeue ")).is_none());
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
            let key = RequeueKey::random();
            let copy = wrap(&key, "k", &data, history);
            prop_assert_eq!(open(&key, "k", &copy), Opened::Genuine(history, Bytes::from(data.clone())));
            prop_assert_eq!(open(&RequeueKey::random(), "k", &copy), Opened::Forged, "another key's copy");
            prop_assert_eq!(open(&key, "other", &copy), Opened::Forged, "another key's record");
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
            prop_assert_ne!(
                std::mem::discriminant(&open(&RequeueKey::random(), "k", &data)),
                std::mem::discriminant(&Opened::Genuine(History::default(), Bytes::new())),
                "no unsigned data opens as genuine"
            );
            if let Some((_, original)) = open_unverified(&data) {
                prop_assert!(data.ends_with(&original));
                prop_assert!(original.len() < data.len());
            }
        }
    }
}
