//! `describe` on dynalite: each shard's load as its holder wrote it with a renewal or a checkpoint, and
//! each member's load (the sum over the leases it holds that carry one), in the table and in `-o json`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use leasehold_worker::lease::{
    Checkpoint, DynamoLeaseStore, GroupRows, Lease, LeaseKey, LeaseSettings, ManualClock, NewLease, ShardLeases,
    ShardLoad,
};

async fn store(table: &str, owner: &str) -> DynamoLeaseStore {
    let client = leasehold_testkit::dynamodb_client().await;
    let settings =
        LeaseSettings::new(owner).with_duration(Duration::from_secs(30)).with_clock(Arc::new(ManualClock::default()));
    DynamoLeaseStore::new(client, table, settings)
}

async fn taken(store: &DynamoLeaseStore, key: &LeaseKey) -> Lease {
    let new = NewLease {
        key: key.clone(),
        checkpoint: Checkpoint::TrimHorizon,
        parent_shard_ids: vec![],
        stream_created: None,
    };
    store.create_if_absent(&new).await.expect("create");
    let seen = store.get(key).await.expect("get").expect("row");
    store.acquire(&seen).await.expect("acquire")
}

fn load(records: u64, bytes: u64, busy: u64) -> ShardLoad {
    ShardLoad { records_per_s: records, bytes_per_s: bytes, busy_ms_per_s: busy }
}

fn json_load(records: u64, bytes: u64, busy: u64) -> serde_json::Value {
    serde_json::json!({"recordsPerSecond": records, "bytesPerSecond": bytes, "busyMsPerSecond": busy})
}

#[test]
fn describe_shows_each_shards_load_and_each_members_sum() {
    run_test(async {
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-describe-load").await;
        let stream = "orders";
        let (a, b) = (store(&table, "a").await, store(&table, "b").await);
        let keys: Vec<LeaseKey> = (0..3).map(|i| LeaseKey::new(stream, format!("shardId-{i:012}"))).collect();
        // a renews shard 0 and checkpoints shard 1, each carrying a load; b holds shard 2, unmeasured.
        let held = taken(&a, &keys[0]).await;
        a.renew(&Lease { load: Some(load(300, 30_000, 600)), ..held }).await.expect("renew");
        let held = taken(&a, &keys[1]).await;
        a.checkpoint(&Lease { load: Some(load(100, 10_000, 200)), ..held }, &Checkpoint::Sequence("7".into()))
            .await
            .expect("checkpoint");
        taken(&b, &keys[2]).await;
        a.heartbeat().await.expect("heartbeat a");
        b.heartbeat().await.expect("heartbeat b");

        let d = describe(&table, stream);
        let shards = d["shards"].as_array().expect("shards");
        let loads: Vec<&serde_json::Value> = shards.iter().map(|s| &s["load"]).collect();
        assert_eq!(
            loads,
            [&json_load(300, 30_000, 600), &json_load(100, 10_000, 200), &serde_json::Value::Null],
            "{d}"
        );
        let member = |owner: &str| {
            d["members"].as_array().and_then(|m| m.iter().find(|m| m["owner"] == owner)).cloned().expect("member")
        };
        assert_eq!(member("a")["load"], json_load(400, 40_000, 800), "{d}");
        assert_eq!(member("a")["leases"], 2);
        assert_eq!(member("b")["load"], serde_json::Value::Null, "b's lease carries no load yet");

        let text = run(&["describe", "--table", &table, "--stream", stream]).expect_code(0).stdout;
        println!("{text}");
        for heading in ["RECORDS/S", "BYTES/S", "BUSY"] {
            assert_eq!(text.matches(heading).count(), 2, "shards and members show {heading}: {text}");
        }
        let line = |prefix: &str| text.lines().find(|l| l.starts_with(prefix)).unwrap_or_default().to_string();
        let words = |l: String| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let shard0 = words(line(&format!("{stream}  ")));
        assert!(shard0.windows(3).any(|w| w == ["300", "30000", "600ms/s"]), "{shard0:?}");
        let a_line = words(line("a "));
        assert!(a_line.windows(3).any(|w| w == ["400", "40000", "800ms/s"]), "{a_line:?}");
        let b_line = words(line("b "));
        assert!(b_line.ends_with(&["-".to_string(), "-".to_string(), "-".to_string()]), "{b_line:?}");
    });
}
