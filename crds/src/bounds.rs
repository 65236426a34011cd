//! Numeric ranges checked from the CRD's own schema. Each range is written once, in its field's
//! `#[schemars(range(..))]` attribute: the API server enforces it from the CRD, the worker's `--config`
//! check reads it here from the same schema, and a test holds every field's doc comment to it.

use std::sync::LazyLock;

use kube::CustomResourceExt;
use serde_json::Value;

use crate::validate::FieldError;

/// The `spec` property of the served version's schema, built once per process; `None` if the CRD
/// could not be read as JSON (then `check` refuses every spec rather than skip the ranges).
static SPEC_SCHEMA: LazyLock<Option<Value>> = LazyLock::new(|| {
    let crd = serde_json::to_value(crate::StreamConsumer::crd()).ok()?;
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec").cloned()
});

/// The `spec` schema of the CRD (its `properties`, `items`, `minimum` and `maximum` are what this reads).
pub(crate) fn spec_schema() -> Option<&'static Value> {
    SPEC_SCHEMA.as_ref()
}

/// An inclusive range some schema sets on an integer field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bound {
    /// Smallest allowed value, when the schema sets one.
    pub min: Option<i64>,
    /// Largest allowed value, when the schema sets one.
    pub max: Option<i64>,
}

impl Bound {
    /// The range a schema node sets, if any.
    pub fn of(schema: &Value) -> Option<Bound> {
        let read = |key: &str| schema.get(key).and_then(Value::as_f64).map(|n| n as i64);
        let bound = Bound { min: read("minimum"), max: read("maximum") };
        (bound.min.is_some() || bound.max.is_some()).then_some(bound)
    }

    /// True when `value` lies inside.
    pub fn holds(&self, value: i64) -> bool {
        self.min.is_none_or(|min| value >= min) && self.max.is_none_or(|max| value <= max)
    }

    /// How an error states it: `between 1 and 10000`, `1 or more` or `at most 5`.
    pub fn rule(&self) -> String {
        match (self.min, self.max) {
            (Some(min), Some(max)) => format!("between {min} and {max}"),
            _ => self.text(),
        }
    }

    /// How a doc comment states it: `1-10000`, `1 or more` or `at most 5`.
    pub fn text(&self) -> String {
        match (self.min, self.max) {
            (Some(min), Some(max)) => format!("{min}-{max}"),
            (Some(min), None) => format!("{min} or more"),
            (None, Some(max)) => format!("at most {max}"),
            (None, None) => String::new(),
        }
    }
}

/// Pushes an error for every integer of `spec` outside the range its schema sets.
pub(crate) fn check(spec: &Value, errors: &mut Vec<FieldError>) {
    match spec_schema() {
        Some(schema) => walk("spec", spec, schema, errors),
        None => errors.push(FieldError::new("spec", "cannot be checked: the CRD's schema has no spec")),
    }
}

fn walk(path: &str, value: &Value, schema: &Value, errors: &mut Vec<FieldError>) {
    match value {
        Value::Object(fields) => {
            let Some(properties) = schema.get("properties") else { return };
            for (name, field) in fields {
                if let Some(field_schema) = properties.get(name) {
                    walk(&format!("{path}.{name}"), field, field_schema, errors);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = schema.get("items") else { return };
            for (i, item) in items.iter().enumerate() {
                walk(&format!("{path}[{i}]"), item, item_schema, errors);
            }
        }
        Value::Number(number) => {
            if let (Some(bound), Some(n)) = (Bound::of(schema), number.as_i64())
                && !bound.holds(n)
            {
                errors.push(FieldError::new(path, format!("must be {} ({n} given)", bound.rule())));
            }
        }
        _ => {}
    }
}

/// Every field of the schema with a range: its path and the range.
#[cfg(test)]
pub(crate) fn bounded_fields() -> Vec<(String, Bound, String)> {
    fn collect(path: &str, schema: &Value, out: &mut Vec<(String, Bound, String)>) {
        if let Some(bound) = Bound::of(schema) {
            let doc = schema.get("description").and_then(Value::as_str).unwrap_or_default().to_string();
            out.push((path.to_string(), bound, doc));
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, field) in properties {
                collect(&format!("{path}.{name}"), field, out);
            }
        }
        if let Some(items) = schema.get("items") {
            collect(&format!("{path}[]"), items, out);
        }
    }
    let mut out = Vec::new();
    collect("spec", spec_schema().expect("the CRD has a spec schema"), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_sets_the_ranges_the_validator_reads() {
        let fields = bounded_fields();
        let find = |path: &str| fields.iter().find(|(p, ..)| p == path).map(|(_, b, _)| *b);
        assert_eq!(find("spec.concurrency"), Some(Bound { min: Some(1), max: Some(10_000) }));
        assert_eq!(find("spec.processor.http.batch.maxRecords").and_then(|b| b.max), Some(500));
        assert_eq!(find("spec.workers.replicas"), Some(Bound { min: Some(0), max: None }));
        assert!(fields.len() >= 10, "{fields:?}");
    }

    /// The doc comment is what `kubectl explain` and docs/reference/spec.md show: it must say the
    /// range the schema enforces, in the same words.
    #[test]
    fn every_bounded_field_s_doc_states_its_range() {
        let wrong: Vec<String> = bounded_fields()
            .into_iter()
            .filter(|(_, bound, doc)| !doc.contains(&bound.text()))
            .map(|(path, bound, doc)| format!("{path}: schema {} but doc {doc:?}", bound.text()))
            .collect();
        assert!(wrong.is_empty(), "docs that do not state their field's range:\n{}", wrong.join("\n"));
    }

    #[test]
    fn out_of_range_numbers_are_refused_with_their_path() {
        let spec: Value = serde_json::json!({
            "concurrency": 0,
            "streams": [{"name": "a", "createIfMissing": {"shards": 10001}}],
            "workers": {"replicas": -1},
            "reader": {"maxRecords": 10000},
        });
        let mut errors = Vec::new();
        check(&spec, &mut errors);
        let fields: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            fields,
            vec![
                "spec.concurrency: must be between 1 and 10000 (0 given)",
                "spec.streams[0].createIfMissing.shards: must be between 1 and 10000 (10001 given)",
                "spec.workers.replicas: must be 0 or more (-1 given)",
            ]
        );
    }
}
