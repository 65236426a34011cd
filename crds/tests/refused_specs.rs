//! `validate` refuses every spec of `refused-specs.json`, naming the field the API server names (the
//! operator's cluster tests send the same cases to a real kube-apiserver), and accepts the accepted
//! ones: the worker and the CRD agree.

use leasehold_crds::StreamConsumerSpec;
use serde_json::Value;

fn cases() -> Value {
    serde_json::from_str(include_str!("refused-specs.json")).expect("refused-specs.json parses")
}

/// The base spec with `patch` applied (a null removes the field).
fn patched(base: &Value, patch: &Value) -> Value {
    let mut spec = base.clone();
    for (key, value) in patch.as_object().expect("a patch is an object") {
        match value {
            Value::Null => {
                spec.as_object_mut().expect("object").remove(key);
            }
            value => spec[key] = value.clone(),
        }
    }
    spec
}

#[test]
fn validate_refuses_what_the_api_server_refuses_naming_the_same_field() {
    let all = cases();
    let cases = all["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30, "the list is loaded");
    for case in cases {
        let spec = patched(&all["base"], &case["patch"]);
        let field = case["field"].as_str().expect("field");
        let parsed: StreamConsumerSpec = serde_json::from_value(spec.clone()).expect("the worker parses it");
        let errors = parsed.validate().expect_err(&format!("validate must refuse {spec}"));
        assert!(
            errors.iter().any(|e| e.field.starts_with(field)),
            "{spec}: validate names {:?}, the API server {field}",
            errors.iter().map(|e| e.field.as_str()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn validate_accepts_what_the_api_server_accepts() {
    let all = cases();
    for patch in all["accepted"].as_array().expect("accepted") {
        let spec = patched(&all["base"], patch);
        let parsed: StreamConsumerSpec = serde_json::from_value(spec.clone()).expect("parses");
        if let Err(errors) = parsed.validate() {
            panic!("{spec} must be valid: {errors:?}");
        }
    }
}
