//! docs/worker.md's settings table names every field of the spec the worker reads: a field added to
//! the types without a line in the table (or a table line that names no field) fails here.

use std::collections::BTreeSet;

/// Fields only the operator reads: the worker ignores them (docs/operations.md and docs/reference/spec.md cover them).
const OPERATOR_ONLY: &[&str] = &[
    "leaseTable.billingMode",
    "leaseTable.deletionPolicy",
    "leaseTable.readCapacity",
    "leaseTable.writeCapacity",
    "paused",
    "template",
    "workers",
];

/// The spec's leaf fields as dotted paths (list items without `[]`), from the generated CRD schema.
fn spec_fields() -> BTreeSet<String> {
    let crd: serde_json::Value =
        serde_yaml_ng::from_str(&leasehold_crds::crd_yaml().expect("CRD serializes")).expect("CRD parses");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut fields = BTreeSet::new();
    walk(spec, String::new(), &mut fields);
    fields
}

fn walk(node: &serde_json::Value, path: String, fields: &mut BTreeSet<String>) {
    if let Some(items) = node.get("items") {
        return walk(items, path, fields);
    }
    match node.get("properties").and_then(|p| p.as_object()) {
        Some(properties) => {
            for (name, child) in properties {
                let child_path = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
                walk(child, child_path, fields);
            }
        }
        None => {
            fields.insert(path);
        }
    }
}

/// The fields the first column of worker.md's settings table names: each back-quoted name, `[]`
/// dropped, and a name starting with `.` taken relative to the one before it (`.timeout` after
/// `processor.http.url` is `processor.http.timeout`); flags (`--owner-id`) left out.
fn documented() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/worker.md");
    let text = std::fs::read_to_string(path).expect("docs/worker.md");
    let table = text.split("## Settings the worker uses today").nth(1).expect("the settings section");
    let table = table.split("\n## ").next().unwrap_or_default();
    let mut names = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap_or_default();
        let mut previous = String::new();
        for name in first.split('`').skip(1).step_by(2) {
            let name = name.replace("[]", "");
            if name.starts_with("--") {
                continue;
            }
            let full = match name.strip_prefix('.') {
                Some(rest) => match previous.rsplit_once('.') {
                    Some((parent, _)) => format!("{parent}.{rest}"),
                    None => rest.to_string(),
                },
                None => name,
            };
            previous = full.clone();
            names.insert(full);
        }
    }
    names
}

fn covered(field: &str, by: &BTreeSet<String>) -> bool {
    let mut prefix = field;
    loop {
        if by.contains(prefix) {
            return true;
        }
        match prefix.rsplit_once('.') {
            Some((parent, _)) => prefix = parent,
            None => return false,
        }
    }
}

#[test]
fn every_field_the_worker_reads_is_in_the_settings_table() {
    let documented = documented();
    let operator_only: BTreeSet<String> = OPERATOR_ONLY.iter().map(|s| s.to_string()).collect();
    let missing: Vec<String> = spec_fields()
        .into_iter()
        .filter(|field| !covered(field, &operator_only) && !covered(field, &documented))
        .collect();
    assert!(missing.is_empty(), "fields missing from docs/worker.md's settings table: {missing:?}");
}

#[test]
fn every_name_in_the_settings_table_is_a_field() {
    let fields = spec_fields();
    let unknown: Vec<String> = documented()
        .into_iter()
        .filter(|name| !fields.iter().any(|f| f == name || f.starts_with(&format!("{name}."))))
        .collect();
    assert!(unknown.is_empty(), "docs/worker.md's settings table names fields the spec lacks: {unknown:?}");
}
