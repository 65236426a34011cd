//! Membership rows: a worker killed with -9 never removes its own `#worker:<owner>` row, so the
//! survivors remove it once it has been silent for a lease duration; rows do not pile up and every
//! scan stops reading them. A worker that shuts down removes its own.

mod common;

use std::time::Duration;

use common::*;
use leasehold_testkit::process::wait_for;
use leasehold_worker::internals::lease::MEMBER_PREFIX;
use leasehold_worker::lease::{DynamoLeaseStore, LeaseSettings, LeaseStore};

/// Owners with a membership row in the store's table (none while the workers have not created it).
async fn members(store: &DynamoLeaseStore) -> Vec<String> {
    let Ok(page) = store.list().await else { return Vec::new() };
    let mut owners: Vec<String> = page.members.into_iter().map(|m| m.owner).collect();
    owners.sort();
    owners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_workers_membership_row_is_removed_by_the_survivors() {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "members", 2).await;
    let table = leasehold_testkit::unique_name("members");
    let config = config(&stream, Some(&table), "");
    let survivor = spawn(&config, "survivor");
    let mut victim = spawn(&config, "victim");
    let client = leasehold_testkit::dynamodb_client().await;
    let store = DynamoLeaseStore::new(client, table.clone(), LeaseSettings::new("observer"));
    let both = vec!["survivor".to_string(), "victim".to_string()];
    let started = std::time::Instant::now();
    while members(&store).await != both {
        assert!(started.elapsed() < Duration::from_secs(20), "both workers beat: {:?}", members(&store).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for("one shard each", Duration::from_secs(20), async || {
        survivor.held_shards().len() == 1 && victim.held_shards().len() == 1
    })
    .await;

    victim.signal("KILL");
    let _ = victim.wait_exit(Duration::from_secs(5));
    let killed = std::time::Instant::now();
    // A lease duration (2 s) of silence seen by the survivor, then one scan.
    while members(&store).await != vec!["survivor".to_string()] {
        assert!(killed.elapsed() < Duration::from_secs(10), "victim's row still there: {:?}", members(&store).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for("the survivor holds both shards", Duration::from_secs(10), async || survivor.held_shards().len() == 2)
        .await;
    assert!(survivor.stderr_text().contains("membership row of a silent worker removed"), "the removal is logged");

    let mut survivor = survivor;
    survivor.signal("TERM");
    survivor.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(members(&store).await.is_empty(), "a worker leaving removes its own row ({MEMBER_PREFIX}survivor)");
}
