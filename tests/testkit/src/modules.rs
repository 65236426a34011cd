//! The module graph of a crate's `src/`: each top-level module's `crate::<module>` references are its
//! edges, so a test can assert the modules depend on each other without cycles (worker and operator).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Module -> the other top-level modules its files name as `crate::<module>`.
pub fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src").flatten() {
        let path = entry.path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        if name == "lib" || name == "main" {
            continue;
        }
        let list = files.entry(name).or_default();
        if path.is_dir() { sources(&path, list) } else { list.push(path) }
    }
    let single = regex::Regex::new(r"crate::(\w+)").expect("regex");
    let grouped = regex::Regex::new(r"crate::\{([^}]*)\}").expect("regex");
    let word = regex::Regex::new(r"(?:^|,)\s*(\w+)").expect("regex");
    let mut edges: BTreeMap<String, BTreeSet<String>> = files.keys().map(|m| (m.clone(), BTreeSet::new())).collect();
    for (module, paths) in &files {
        for path in paths {
            let text = std::fs::read_to_string(path).expect("read source");
            let mut named: Vec<String> = single.captures_iter(&text).map(|c| c[1].to_string()).collect();
            for group in grouped.captures_iter(&text) {
                named.extend(word.captures_iter(&group[1]).map(|c| c[1].to_string()));
            }
            for other in named {
                if other != *module && files.contains_key(&other) {
                    edges.get_mut(module).expect("module").insert(other);
                }
            }
        }
    }
    edges
}

/// A path of modules from `from` back to itself, if there is one.
pub fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in &graph[&at] {
            if next == from {
                return Some([path.clone(), vec![from.to_string()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

/// Every cycle through a top-level module of `graph`.
pub fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    graph.keys().filter_map(|m| cycle_through(graph, m)).collect()
}
