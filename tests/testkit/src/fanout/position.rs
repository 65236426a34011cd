//! Where a kinesalite shard iterator points, as a sequence number a client can resubscribe AFTER.
//!
//! A subscription that delivered no record still owes its client a `ContinuationSequenceNumber`. The
//! service makes one up from its position; here the position is inside kinesalite's shard iterator
//! (AES-256-CBC with kinesalite's fixed key, `<time>/<stream>/<shard>/<sequence>/<padding>`), the
//! sequence number of the next record to read. kinesalite reads AFTER_SEQUENCE_NUMBER `s` from `s` with
//! its time field one second later, so the continuation is the iterator's sequence with its time field
//! one second earlier: resubscribing AFTER it reads from exactly the iterator's position.

use aws_lc_rs::cipher::{AES_256, DecryptionContext, PaddedBlockDecryptingKey, UnboundCipherKey};
use aws_lc_rs::iv::FixedLength;
use base64::Engine;

/// kinesalite's `ITERATOR_PWD_KEY` (db/index.js).
const ITERATOR_KEY: [u8; 32] = [
    0x11, 0x33, 0xa5, 0xa8, 0x33, 0x66, 0x6b, 0x49, 0xab, 0xf2, 0x8c, 0x8b, 0xa3, 0x02, 0x93, 0x0f, 0x0b, 0x2f, 0xb2,
    0x40, 0xdc, 0xcd, 0x43, 0xcf, 0x4d, 0xfb, 0xc0, 0xca, 0x91, 0xf1, 0x77, 0x51,
];
/// kinesalite's `ITERATOR_PWD_IV`.
const ITERATOR_IV: [u8; 16] =
    [0x7b, 0xf1, 0x39, 0xdb, 0xab, 0xbe, 0xa2, 0xd9, 0x99, 0x5d, 0x6f, 0xca, 0xe1, 0xdf, 0xf7, 0xda];
/// Hex digits of a version-2 kinesalite sequence number that hold its time in seconds.
const SEQUENCE_TIME_DIGITS: std::ops::Range<usize> = 29..38;

/// The sequence number that `iterator` will read from, if it is a kinesalite iterator.
fn iterator_sequence(iterator: &str) -> Option<String> {
    let raw = base64::engine::general_purpose::STANDARD.decode(iterator).ok()?;
    let mut ciphertext = raw.get(8..)?.to_vec();
    let key = UnboundCipherKey::new(&AES_256, &ITERATOR_KEY).ok()?;
    let decrypting = PaddedBlockDecryptingKey::cbc_pkcs7(key).ok()?;
    let plain = decrypting.decrypt(&mut ciphertext, DecryptionContext::Iv128(FixedLength::from(ITERATOR_IV))).ok()?;
    let text = std::str::from_utf8(plain).ok()?;
    let pieces: Vec<&str> = text.split('/').collect();
    (pieces.len() == 5).then(|| pieces[3].to_string())
}

/// The continuation sequence number for a subscription whose next read is `iterator`: resubscribing
/// AFTER it starts exactly where `iterator` would.
pub(crate) fn continuation_at(iterator: &str) -> Option<String> {
    let sequence = iterator_sequence(iterator)?;
    let mut hex = decimal_to_hex(&sequence)?;
    // Only version-2 numbers (47 hex digits, ending in 2) are what kinesalite writes today.
    if hex.len() != 47 || !hex.ends_with('2') {
        return None;
    }
    let seconds = u64::from_str_radix(&hex[SEQUENCE_TIME_DIGITS], 16).ok()?.checked_sub(1)?;
    hex.replace_range(SEQUENCE_TIME_DIGITS, &format!("{seconds:09x}"));
    hex_to_decimal(&hex)
}

/// Little-endian base-2^32 digits of a decimal string.
fn decimal_to_hex(decimal: &str) -> Option<String> {
    let mut limbs: Vec<u32> = vec![0];
    for c in decimal.chars() {
        let mut carry = u64::from(c.to_digit(10)?);
        for limb in limbs.iter_mut() {
            let value = u64::from(*limb) * 10 + carry;
            *limb = value as u32;
            carry = value >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    let mut hex: String = limbs.iter().rev().map(|l| format!("{l:08x}")).collect();
    let significant = hex.trim_start_matches('0').len().max(1);
    hex.drain(..hex.len() - significant);
    Some(hex)
}

fn hex_to_decimal(hex: &str) -> Option<String> {
    // Base-10^9 limbs, little-endian.
    let mut limbs: Vec<u32> = vec![0];
    for c in hex.chars() {
        let mut carry = u64::from(c.to_digit(16)?);
        for limb in limbs.iter_mut() {
            let value = u64::from(*limb) * 16 + carry;
            *limb = (value % 1_000_000_000) as u32;
            carry = value / 1_000_000_000;
        }
        while carry > 0 {
            limbs.push((carry % 1_000_000_000) as u32);
            carry /= 1_000_000_000;
        }
    }
    let mut digits = limbs.last().map(|l| l.to_string()).unwrap_or_default();
    for limb in limbs.iter().rev().skip(1) {
        digits.push_str(&format!("{limb:09}"));
    }
    Some(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_hex_round_trip() {
        let sequence = "49590338271490256608559692538361571095921575989136588898";
        let hex = decimal_to_hex(sequence).expect("hex");
        assert_eq!(hex_to_decimal(&hex).as_deref(), Some(sequence));
        assert_eq!(decimal_to_hex("255").as_deref(), Some("ff"));
        assert_eq!(hex_to_decimal("3b9aca00").as_deref(), Some("1000000000"));
    }
}
