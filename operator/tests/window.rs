//! Window consumers (`spec.window`) through the operator, on the real control plane with the emulators
//! and a stand-in kubelet running the worker pods as processes: records put before, inside and after a
//! window; a live consumer reads the stream all along. Two windows over the same span, one with
//! `deletionPolicy: Delete` (default) and one with `Retain`: each processes exactly the window's records
//! once, `status.window` shows every shard finished and the records counted, `Completed` is True
//! (`WindowFinished`) with a `WindowCompleted` event, the Deployment is scaled to zero, and the
//! window's table is deleted (Delete) or kept (Retain). The live consumer processes nothing twice.

mod support;

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use leasehold_crds::window_table_name;
use leasehold_testkit::kinesis::put_records;
use leasehold_testkit::process::wait_for as wait;
use serde_json::json;
use support::kubelet::Kubelet;
use support::windows::{GAP, batch, counts, deliveries_of, now_rfc3339, payloads};
use support::{TestNamespace, aws};

const SLOW: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_replays_its_records_once_completes_scales_to_zero_and_applies_its_table_policy() {
    let ns = TestNamespace::new("window").await;
    let kubelet = Kubelet::start(ns.client.clone(), &ns.name, "app.kubernetes.io/name=leasehold-worker");
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "window-op", 2).await;
    let lease = json!({"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"});
    let live_table = leasehold_testkit::unique_name("window-live");
    ns.create(
        "live",
        json!({
            "streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": live_table, "deletionPolicy": "Delete"},
            "startPosition": "TRIM_HORIZON", "lease": lease, "processor": {"stdout": {}}
        }),
    )
    .await
    .expect("live consumer");

    let before = batch(0);
    put_records(&kinesis, &stream, &before).await;
    tokio::time::sleep(GAP).await;
    let start = now_rfc3339();
    tokio::time::sleep(GAP).await;
    let inside = batch(100);
    put_records(&kinesis, &stream, &inside).await;
    tokio::time::sleep(GAP).await;
    let end = now_rfc3339();
    tokio::time::sleep(GAP).await;
    let after = batch(200);
    put_records(&kinesis, &stream, &after).await;

    for (name, policy) in [("replay-delete", "Delete"), ("replay-retain", "Retain")] {
        ns.create(
            name,
            json!({
                "streams": [{"name": stream}], "aws": aws(), "lease": lease, "processor": {"stdout": {}},
                "window": {"start": start, "end": end, "tipSlack": "2s", "deletionPolicy": policy}
            }),
        )
        .await
        .expect("window consumer");
    }

    for name in ["replay-delete", "replay-retain"] {
        wait(&format!("{name} Completed"), SLOW, async || {
            ns.condition(name, "Completed").await.is_some_and(|(status, _)| status == "True")
        })
        .await;
        assert_eq!(ns.condition(name, "Completed").await.map(|c| c.1).as_deref(), Some("WindowFinished"));
        wait(&format!("{name} scaled to zero"), SLOW, async || {
            ns.replicas(&format!("{name}-workers")).await == Some(0)
        })
        .await;
        let consumer = ns.consumers().get(name).await.expect("window consumer");
        let window = consumer.status.and_then(|s| s.window).expect("status.window");
        assert!(window.completed, "{window:?}");
        assert_eq!(window.shards, 2, "{window:?}");
        assert_eq!(window.finished_shards, 2, "{window:?}");
        assert!(window.progress.iter().all(|p| p.state == "finished" && p.checkpoint == "SHARD_END"), "{window:?}");
        assert_eq!(window.records_replayed, Some(inside.len() as i64), "records counted in the rows: {window:?}");
        assert_eq!(window.table.as_deref(), Some(window_table_name(&ns.name, name).as_str()));

        // Exactly the window's records, once each.
        let replayed = counts(&deliveries_of(&kubelet, name));
        let expected = payloads(&inside);
        for payload in &expected {
            assert_eq!(replayed.get(payload), Some(&1), "{name}: {payload} replayed once");
        }
        assert_eq!(replayed.len(), expected.len(), "{name}: no record outside the window processed");

        let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name);
        let listed = events.list(&ListParams::default()).await.expect("events").items;
        let completed = listed
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("WindowCompleted")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .count();
        assert_eq!(completed, 1, "{name}: one WindowCompleted event");
    }

    // Delete: the table goes once the workers are gone; Retain: it stays.
    let deleted = window_table_name(&ns.name, "replay-delete");
    wait("the Delete window's table deleted", SLOW, async || {
        dynamodb.describe_table().table_name(&deleted).send().await.is_err()
    })
    .await;
    let consumer = ns.consumers().get("replay-delete").await.expect("window consumer");
    assert!(consumer.status.and_then(|s| s.window).is_some_and(|w| w.table_deleted), "status says the table is gone");
    let kept = window_table_name(&ns.name, "replay-retain");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(dynamodb.describe_table().table_name(&kept).send().await.is_ok(), "Retain keeps the table");
    let consumer = ns.consumers().get("replay-retain").await.expect("window consumer");
    let window = consumer.status.and_then(|s| s.window).expect("status.window");
    assert!(!window.table_deleted);
    assert_eq!(window.deletion_policy.as_deref(), Some("Retain"));
    assert_eq!(ns.replicas("replay-retain-workers").await, Some(0), "the completed window stays at zero workers");

    // The live consumer, untouched by the windows, read everything exactly once.
    let all: Vec<String> = payloads(&before).into_iter().chain(payloads(&inside)).chain(payloads(&after)).collect();
    wait("the live consumer reads every record", SLOW, async || {
        counts(&deliveries_of(&kubelet, "live")).len() >= all.len()
    })
    .await;
    let live = counts(&deliveries_of(&kubelet, "live"));
    for payload in &all {
        assert_eq!(live.get(payload), Some(&1), "live: {payload} processed once");
    }
    let _ = dynamodb.delete_table().table_name(&kept).send().await;
}
