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
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(committed == generated, "{path} differs from the schema; run `make crds` and commit the result");
}
