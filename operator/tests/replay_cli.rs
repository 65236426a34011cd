//! `leasehold replay` end to end: the CLI binary against the real control plane, this test's
//! in-process operator, a stand-in kubelet running the worker pods as processes, and the emulators.
//! Records are put before, inside and after a window while a live consumer reads the stream. The dry
//! run counts the window's records exactly and creates nothing; `--execute` creates a window consumer
//! from the live one's spec, follows it to `Completed`, and deletes it with its table; `--keep` keeps
//! both; a taken name is refused. Each window processes exactly its records once; the live consumer
//! processes nothing twice.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use leasehold_crds::window_table_name;
use leasehold_testkit::kinesis::put_records;
use serde_json::{Value, json};
use support::kubelet::{Kubelet, cli_binary};
use support::windows::{GAP, batch, counts, deliveries_of, now_rfc3339, payloads};
use support::{TestNamespace, aws, kubeconfig_path, wait};

const SLOW: Duration = Duration::from_secs(90);

/// What a finished `leasehold` run left: exit code, stdout, stderr.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

/// Runs `leasehold args...` to its end, off the runtime's threads (the operator runs on them).
async fn leasehold(args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || {
        let output = Command::new(cli_binary())
            .args(&args)
            .env("KUBECONFIG", kubeconfig_path())
            .env("AWS_ACCESS_KEY_ID", "leasehold-test")
            .env("AWS_SECRET_ACCESS_KEY", "leasehold-test")
            .env("AWS_REGION", "us-east-1")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run leasehold");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    })
    .await
    .expect("leasehold ran")
}

fn replay_args(consumer: &str, start: &str, end: &str, extra: &[&str]) -> Vec<String> {
    ["replay", consumer, "--from", start, "--to", end, "-o", "json"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_estimates_then_replays_exactly_the_window_once_and_cleans_up() {
    let ns = TestNamespace::new("replay-cli").await;
    let kubelet = Kubelet::start(ns.client.clone(), &ns.name, "app.kubernetes.io/name=leasehold-worker");
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "replay-cli", 2).await;
    let lease = json!({"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"});
    let live_table = leasehold_testkit::unique_name("replay-live");
    ns.create(
        "live",
        json!({
            "streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": live_table, "deletionPolicy": "Delete"},
            "startPosition": "TRIM_HORIZON", "lease": lease, "processor": {"stdout": {}}, "concurrency": 2
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
    let live = format!("{}/live", ns.name);

    // The dry run: every shard, the window's records counted exactly, nothing created.
    let dry = leasehold(replay_args(&live, &start, &end, &[])).await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let dry = dry.json();
    assert_eq!(dry["executed"], false, "{dry:#}");
    assert_eq!(dry["records"], inside.len(), "the window's records: {dry:#}");
    assert_eq!(dry["recordsExact"], true, "{dry:#}");
    assert_eq!(dry["shards"].as_array().map(Vec::len), Some(2), "{dry:#}");
    assert!(dry["replay"].as_str().is_some_and(|r| r.starts_with(&format!("{live}-replay-"))), "{dry:#}");
    let listed = ns.consumers().list(&ListParams::default()).await.expect("consumers").items;
    assert_eq!(listed.len(), 1, "a dry run creates nothing");

    // --execute: created, followed to Completed, deleted with its table.
    let replayed = leasehold(replay_args(&live, &start, &end, &["--execute", "--name", "replay-a"])).await;
    assert_eq!(replayed.code, 0, "{}", replayed.stderr);
    assert!(replayed.stderr.contains("shard(s) finished"), "progress is shown: {}", replayed.stderr);
    let outcome = replayed.json();
    assert_eq!(outcome["executed"], true, "{outcome:#}");
    assert_eq!(outcome["completed"], true, "{outcome:#}");
    assert_eq!(outcome["recordsReplayed"], inside.len(), "{outcome:#}");
    assert_eq!(outcome["deleted"], true, "{outcome:#}");
    assert!(ns.consumers().get_opt("replay-a").await.expect("get").is_none(), "the window consumer is gone");
    let table = window_table_name(&ns.name, "replay-a");
    assert_eq!(outcome["table"], table.as_str());
    assert!(dynamodb.describe_table().table_name(&table).send().await.is_err(), "its table is gone");
    let expected = payloads(&inside);
    let once = |consumer: &str| {
        let replayed = counts(&deliveries_of(&kubelet, consumer));
        for payload in &expected {
            assert_eq!(replayed.get(payload), Some(&1), "{consumer}: {payload} replayed once");
        }
        assert_eq!(replayed.len(), expected.len(), "{consumer}: no record outside the window processed");
    };
    once("replay-a");

    // --keep: the window consumer stays, Completed, with its table; its name is then taken.
    let kept = leasehold(replay_args(&live, &start, &end, &["--execute", "--keep", "--name", "replay-b"])).await;
    assert_eq!(kept.code, 0, "{}", kept.stderr);
    let outcome = kept.json();
    assert_eq!((outcome["completed"].clone(), outcome["deleted"].clone()), (json!(true), json!(false)), "{outcome:#}");
    assert_eq!(ns.condition("replay-b", "Completed").await.map(|c| c.0).as_deref(), Some("True"));
    let kept_table = window_table_name(&ns.name, "replay-b");
    assert!(dynamodb.describe_table().table_name(&kept_table).send().await.is_ok(), "--keep keeps the table");
    once("replay-b");
    let taken = leasehold(replay_args(&live, &start, &end, &["--execute", "--name", "replay-b"])).await;
    assert_eq!(taken.code, 4, "a taken name is refused: {}", taken.stderr);
    assert!(taken.stderr.contains("exists already"), "{}", taken.stderr);

    // The live consumer's events tell of both replays, each started and finished once.
    let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name);
    let listed = events.list(&ListParams::default()).await.expect("events").items;
    for reason in ["ReplayStarted", "Replayed"] {
        let on_live = listed
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("live")
            })
            .count();
        assert_eq!(on_live, 2, "{reason} events on the live consumer");
    }

    // The live consumer, untouched by the windows, read everything exactly once.
    let all: Vec<String> = payloads(&before).into_iter().chain(payloads(&inside)).chain(payloads(&after)).collect();
    wait("the live consumer reads every record", SLOW, async || {
        counts(&deliveries_of(&kubelet, "live")).len() >= all.len()
    })
    .await;
    let live_counts = counts(&deliveries_of(&kubelet, "live"));
    for payload in &all {
        assert_eq!(live_counts.get(payload), Some(&1), "live: {payload} processed once");
    }
    let _ = dynamodb.delete_table().table_name(&kept_table).send().await;
}
