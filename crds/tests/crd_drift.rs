//! The committed CRD YAML must be exactly what the Rust types generate.

#[test]
fn committed_crd_matches_the_types() {
    let generated = leasehold_crds::crd_yaml().expect("CRD serializes");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/streamconsumer.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} differs from the CRD the types generate; run `make crds` and commit the result"
    );
}

#[test]
fn committed_reference_matches_the_schema() {
    let generated = leasehold_crds::reference_markdown().expect("reference renders");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/spec.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(committed == generated, "{path} differs from the schema; run `make reference` and commit the result");
}

/// Every optional field whose values are an enum states its default in its own doc comment, and the
/// CRD keeps that doc: kube's transform of `Option<Enum>` would otherwise put the enum type's
/// description in its place (see `field_doc_wins` in crds/src/spec.rs).
#[test]
fn optional_enum_fields_keep_their_own_doc_and_default() {
    fn walk(path: &str, schema: &serde_json::Value, found: &mut Vec<String>, bare: &mut Vec<String>) {
        let Some(properties) = schema.get("properties").and_then(serde_json::Value::as_object) else { return };
        for (name, child) in properties {
            let field = format!("{path}.{name}");
            if child.get("enum").is_some() && child.get("nullable") == Some(&serde_json::Value::Bool(true)) {
                found.push(field.clone());
                let description = child.get("description").and_then(serde_json::Value::as_str).unwrap_or_default();
                if !description.to_lowercase().contains("default") {
                    bare.push(format!("{field}: {description:?}"));
                }
            }
            walk(&field, child.get("items").unwrap_or(child), found, bare);
        }
    }
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(leasehold_crds::StreamConsumer::crd()).expect("CRD serializes");
    let (mut found, mut bare) = (Vec::new(), Vec::new());
    walk("spec", &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], &mut found, &mut bare);
    for field in [
        "spec.leaseTable.billingMode",
        "spec.leaseTable.deletionPolicy",
        "spec.ordering",
        "spec.reader.mode",
        "spec.retry.onExhausted",
        "spec.startPosition",
    ] {
        assert!(found.iter().any(|f| f == field), "{field} is an optional enum field: {found:?}");
    }
    assert!(bare.is_empty(), "optional enum fields without their own doc and default: {bare:?}");
}
