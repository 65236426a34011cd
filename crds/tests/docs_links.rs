//! Every relative link of the hand-written pages (README.md, CHANGELOG.md, docs/**/*.md, the chart's
//! README) names a file that exists, and every `#anchor` into a Markdown page names one of its headings
//! (GitHub's anchors: lower case, spaces to dashes, other punctuation dropped, `-1`, `-2` for repeats).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Pages other branches of the same change add (the uninstall guide, the provisioned-capacity page):
/// links to them are allowed while they are missing. Empty this once they are merged.
const ADDED_ELSEWHERE: &[&str] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the repository")
}

fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("charts/leasehold/README.md")];
    if root.join("CHANGELOG.md").exists() {
        pages.push(root.join("CHANGELOG.md"));
    }
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/ readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The text outside fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let mut in_code = false;
            for part in line.split('`') {
                if !in_code {
                    out.push_str(part);
                }
                in_code = !in_code;
            }
            out.push('\n');
        }
    }
    out
}

/// The targets of `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            found.push(target.to_string());
        }
    }
    found
}

fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).expect("page readable");
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

#[test]
fn every_relative_link_resolves() {
    let root = root();
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page readable");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() { page.clone() } else { page.parent().expect("a dir").join(file) };
            let shown = format!("{}: {target}", page.strip_prefix(&root).unwrap_or(&page).display());
            let Ok(resolved) = resolved.canonicalize() else {
                let relative = page.parent().expect("a dir").join(file);
                let pending = ADDED_ELSEWHERE.iter().any(|p| normalize(&relative) == root.join(p));
                if !pending {
                    broken.push(format!("{shown} (no such file)"));
                }
                continue;
            };
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&resolved).contains(anchor)
            {
                broken.push(format!("{shown} (no heading for #{anchor})"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_guide_is_reachable_from_the_readme_in_two_clicks() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut reached: BTreeSet<PathBuf> = BTreeSet::new();
    for target in links(&readme) {
        let file = target.split('#').next().unwrap_or_default();
        if let Ok(first) = root.join(file).canonicalize() {
            reached.insert(first.clone());
            if first.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&first).expect("linked page");
                for second in links(&text) {
                    let file = second.split('#').next().unwrap_or_default();
                    if let Ok(path) = first.parent().expect("a dir").join(file).canonicalize() {
                        reached.insert(path);
                    }
                }
            }
        }
    }
    let guides = std::fs::read_dir(root.join("docs/guides")).expect("docs/guides");
    let mut wanted: Vec<PathBuf> = guides.map(|e| e.expect("entry").path()).collect();
    wanted.push(root.join("docs/tutorial.md"));
    let missing: Vec<String> = wanted
        .iter()
        .map(|p| p.canonicalize().expect("exists"))
        .filter(|p| !reached.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(missing.is_empty(), "guides more than two clicks from README.md: {missing:?}");
}
