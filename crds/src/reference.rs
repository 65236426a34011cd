//! The StreamConsumer reference (`docs/reference/spec.md`): its spec and status, generated from the
//! CRD's schema so it cannot drift from the types.

use serde_json::Value;

fn type_of(schema: &Value) -> String {
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => format!("list of {}", schema.get("items").map(type_of).unwrap_or_else(|| "any".into())),
        Some(kind) => kind.to_string(),
        None if schema.get("x-kubernetes-preserve-unknown-fields").is_some() => "object".into(),
        None => schema.get("enum").map(|_| "string".into()).unwrap_or_else(|| "any".into()),
    }
}

fn constraints(schema: &Value) -> String {
    let mut notes = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().filter_map(Value::as_str).map(|v| format!("`{v}`")).collect();
        notes.push(format!("one of {}", values.join(", ")));
    }
    // The schema writes bounds as floats (`1.0`); an integer field reads better without the `.0`.
    let bound = |name: &str| schema.get(name).and_then(Value::as_f64).map(|b| format!("{b}"));
    match (bound("minimum"), bound("maximum")) {
        (Some(min), Some(max)) => notes.push(format!("{min} to {max}")),
        (Some(min), None) => notes.push(format!("at least {min}")),
        (None, Some(max)) => notes.push(format!("at most {max}")),
        (None, None) => {}
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        notes.push(format!("matches `{pattern}`"));
    }
    let count = |name: &str| schema.get(name).and_then(Value::as_u64);
    match (count("minItems"), count("maxItems")) {
        (Some(min), Some(max)) => notes.push(format!("{min} to {max} items")),
        (Some(min), None) => notes.push(format!("at least {min} item(s)")),
        (None, Some(max)) => notes.push(format!("at most {max} items")),
        (None, None) => {}
    }
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set") {
        notes.push("each item once".into());
    }
    if let Some(pattern) = schema.pointer("/items/pattern").and_then(Value::as_str) {
        notes.push(format!("items match `{pattern}`"));
    }
    if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        for rule in rules {
            if let Some(message) = rule.get("message").and_then(Value::as_str) {
                notes.push(format!("rule: {message}"));
            }
        }
    }
    notes.join("; ")
}

fn walk(path: &str, schema: &Value, required: &[String], rows: &mut Vec<String>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return };
    for (name, child) in properties {
        let field = format!("{path}.{name}");
        let description = child.get("description").and_then(Value::as_str).unwrap_or_default().replace('\n', " ");
        let mark = if required.contains(name) { " (required)" } else { "" };
        rows.push(format!(
            "| `{field}`{mark} | {} | {} | {} |",
            type_of(child),
            description.replace('|', "\\|"),
            constraints(child).replace('|', "\\|")
        ));
        // A list's fields are its items' fields, written `field[].name`.
        let (inner, inner_path) = if child.get("type").and_then(Value::as_str) == Some("array") {
            (child.get("items"), format!("{field}[]"))
        } else {
            (Some(child), field)
        };
        if let Some(inner) = inner {
            walk(&inner_path, inner, &required_of(inner), rows);
        }
    }
}

/// The names of the properties `schema` requires.
fn required_of(schema: &Value) -> Vec<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

/// The reference page of `spec` and `status` as Markdown.
pub fn reference_markdown() -> Result<String, serde_json::Error> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(crate::StreamConsumer::crd())?;
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let schema = &root["spec"];
    let mut rows = Vec::new();
    walk("spec", schema, &required_of(schema), &mut rows);
    let mut status_rows = Vec::new();
    walk("status", &root["status"], &required_of(&root["status"]), &mut status_rows);
    let spec_rules: Vec<String> = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|rules| {
            rules.iter().filter_map(|r| r.get("message").and_then(Value::as_str)).map(|m| format!("- {m}")).collect()
        })
        .unwrap_or_default();
    let table = "| field | type | description | constraints |\n|---|---|---|---|";
    Ok(format!(
        "# StreamConsumer reference (`leasehold.io/v1alpha1`)\n\n\
         Generated from the CRD schema (`crds/src`) by `make reference` (or `make crds`); do not edit by hand \
         (a test fails when it drifts). The same spec is the worker's `--config` file.\n\n\
         ## Spec\n\n\
         Rules across fields, checked by the API server:\n\n{}\n\n{table}\n{}\n\n\
         ## Status\n\n\
         Written by the operator; read it with `kubectl get streamconsumer NAME -o yaml`.\n\n{table}\n{}\n",
        spec_rules.join("\n"),
        rows.join("\n"),
        status_rows.join("\n")
    ))
}
