//! `drain` on the emulators with real worker processes: a worker at its fair share keeps its leases
//! (the group's balance rule), so the command times out saying how to finish and withdraws its
//! requests; unknown and lone workers are refused.

mod common;

use std::time::Duration;

use common::*;

fn held(description: &serde_json::Value, owner: &str) -> usize {
    description["shards"].as_array().map_or(0, |s| s.iter().filter(|s| s["owner"] == owner).count())
}

#[test]
fn drain_asks_for_handoffs_withdraws_unanswered_requests_and_refuses_what_it_cannot_do() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-drain", 4).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-drain").await;
        let config = config(&stream, &table, "");
        let a = spawn_worker(&config, "a");
        let mut b = spawn_worker(&config, "b");
        wait_until("two workers with two leases each", Duration::from_secs(40), || async {
            let d = describe(&table, &stream);
            held(&d, "a") == 2 && held(&d, "b") == 2
        })
        .await;
        let args = ["drain", "--table", &table, "--stream", &stream];

        let out = run(&[&args[..], &["a", "--timeout", "3s"]].concat()).expect_code(8);
        assert!(out.stderr.contains("a: 2 lease(s) held; 2 handoff request(s) written"), "{}", out.stderr);
        assert!(out.stderr.contains("fair share") && out.stderr.contains("delete its pod"), "{}", out.stderr);
        let d = describe(&table, &stream);
        assert!(d["shards"].as_array().expect("shards").iter().all(|s| s["handoffTo"].is_null()), "withdrawn: {d}");
        assert_eq!((held(&d, "a"), held(&d, "b")), (2, 2));

        let unknown = run(&[&args[..], &["nobody"]].concat()).expect_code(3);
        assert!(unknown.stderr.contains("worker nobody is not a live member"), "{}", unknown.stderr);

        b.signal("TERM");
        assert!(b.wait_exit(Duration::from_secs(15)).is_some(), "b did not stop");
        wait_until("a holds every lease", Duration::from_secs(30), || async {
            held(&describe(&table, &stream), "a") == 4
        })
        .await;
        let alone = run(&[&args[..], &["a"]].concat()).expect_code(4);
        assert!(alone.stderr.contains("only live worker"), "{}", alone.stderr);
        drop(a);
    });
}
