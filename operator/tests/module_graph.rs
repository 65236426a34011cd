//! The operator crate's top-level modules depend on each other without cycles (each `crate::<module>`
//! reference is an edge): the pipeline's stages use the context and the table code, never the
//! controller that runs them.

use std::path::Path;

use leasehold_testkit::modules::{cycles, graph};

#[test]
fn top_level_modules_have_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(graph.contains_key("pipeline") && graph["controller"].contains("pipeline"), "the graph is read: {graph:?}");
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "module cycles: {cycles:?}");
}
