//! The worker crate's top-level modules depend on each other without cycles (each `crate::<module>`
//! reference is an edge), so every module can be read and changed from the bottom up. A cycle
//! (the coordinator and the shard reader importing each other, as they once did) fails this test.

use std::path::Path;

use leasehold_testkit::modules::{cycles, graph};

#[test]
fn top_level_modules_have_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(
        graph.contains_key("coordinator") && graph["coordinator"].contains("shard"),
        "the graph is read: {graph:?}"
    );
    let cycles = cycles(&graph);
    assert!(cycles.is_empty(), "module cycles: {cycles:?}");
}
