//! docs/guides/status.md names every condition reason and event reason the operator writes: the
//! operator's sources are scanned as text for `Verdict::ok("…"` / `Verdict::failed("…"`, the reasons of
//! `Error::reason`, the condition types and the events it publishes. A text scan, so this crate's test
//! needs no build of the operator.

use std::collections::BTreeSet;
use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("operator/src readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("source readable");
            // Unit tests make up reasons of their own.
            let text = text.split("#[cfg(test)]").next().unwrap_or_default().to_string();
            out.push((path.display().to_string(), text));
        }
    }
}

/// The first string literal after each occurrence of `marker` (across line breaks).
fn literals_after(text: &str, marker: &str) -> Vec<String> {
    text.match_indices(marker)
        .filter_map(|(at, _)| {
            let rest = text[at + marker.len()..].trim_start();
            let rest = rest.strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

fn written_by_the_operator() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut names = BTreeSet::new();
    for (path, text) in &files {
        for marker in ["Verdict::ok(", "Verdict::failed("] {
            names.extend(literals_after(text, marker));
        }
        // Events: publish(consumer, EventType::X, "Reason", …).
        for marker in ["EventType::Normal,", "EventType::Warning,"] {
            names.extend(literals_after(text, marker));
        }
        // Condition types: condition("Type", …).
        names.extend(literals_after(text, "condition("));
        if path.ends_with("error.rs") {
            let reasons = text.split("pub fn reason").nth(1).expect("Error::reason");
            names.extend(literals_after(reasons, "=> "));
            let kinds = text.split("pub fn kind").nth(1).expect("Error::kind");
            let kinds = kinds.split("pub fn reason").next().unwrap_or_default();
            names.extend(literals_after(kinds, "=> "));
        }
    }
    names.retain(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()));
    names
}

#[test]
fn every_reason_event_and_condition_is_in_the_status_guide() {
    let names = written_by_the_operator();
    assert!(names.len() > 40, "the scan found too little: {names:?}");
    for expected in ["Running", "TableCreating", "InvalidSpec", "StreamCreated", "LagScaling", "metadata"] {
        assert!(names.contains(expected), "the scan misses {expected}: {names:?}");
    }
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guides/status.md"))
        .expect("docs/guides/status.md");
    let missing: Vec<&String> = names.iter().filter(|n| !page.contains(&format!("`{n}`"))).collect();
    assert!(missing.is_empty(), "docs/guides/status.md does not name {missing:?}");
}
