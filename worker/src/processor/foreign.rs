//! Text written by others (a receiver's answer, a child's stray output) as it may appear in logs and
//! error messages: cut to a sane length, with its full length noted, so a hostile or buggy neighbour
//! cannot fill the log or a dead letter with megabytes of its own.

/// The longest excerpt of foreign text kept in a log line or an error message, in characters.
pub(crate) const EXCERPT_CHARS: usize = 300;

/// `text` (any bytes, decoded lossily) cut to `max` characters; a cut excerpt ends with `…` and the
/// full length in bytes.
pub(crate) fn excerpt(text: &[u8], max: usize) -> String {
    // Decoding only a prefix keeps the work bounded: a UTF-8 character is at most 4 bytes.
    let prefix = &text[..text.len().min(max.saturating_mul(4))];
    let decoded = String::from_utf8_lossy(prefix);
    match decoded.char_indices().nth(max) {
        None if prefix.len() == text.len() => decoded.into_owned(),
        None => format!("{decoded}… ({} bytes in all)", text.len()),
        Some((end, _)) => format!("{}… ({} bytes in all)", &decoded[..end], text.len()),
    }
}

/// [`excerpt`] of `text` with the default length.
pub(crate) fn short(text: &str) -> String {
    excerpt(text.as_bytes(), EXCERPT_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_whole_and_long_text_is_cut_with_its_length() {
        assert_eq!(excerpt(b"all of it", 20), "all of it");
        assert_eq!(excerpt(b"abcdef", 3), "abc… (6 bytes in all)");
        let long = "é".repeat(1000);
        let cut = excerpt(long.as_bytes(), 10);
        assert_eq!(cut, format!("{}… (2000 bytes in all)", "é".repeat(10)));
        assert_eq!(excerpt(b"\xff\xfeok", 10), "\u{fffd}\u{fffd}ok", "not UTF-8: decoded lossily");
        assert!(short(&"x".repeat(10_000_000)).len() < EXCERPT_CHARS + 40);
    }
}
