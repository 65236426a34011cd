//! docs/uninstall.md's steps, as docs/uninstall.sh runs them, on the local control plane: with the
//! operator running, the StreamConsumers go and their tables follow their deletionPolicy (Delete: gone,
//! Retain: kept); with the operator gone, the `leasehold.io/lease-table` finalizer that would block the
//! deletion forever is cleared and the table is kept. The CRD step is run with `--keep-crd`: the
//! control plane is shared by every test running at once, and deleting the CRD would delete their
//! consumers too (the script's CRD step is one `kubectl delete crd`).

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use support::{TestNamespace, wait};

const SLOW: Duration = Duration::from_secs(60);

/// Runs docs/uninstall.sh on `namespace`, off the test's runtime thread (the in-process operator runs on
/// it and must keep reconciling meanwhile).
async fn uninstall(namespace: &str, timeout: &str) -> std::process::Output {
    let script = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/uninstall.sh"));
    let kubectl = leasehold_testkit::cache_dir().join("k8s-bin/kubectl");
    assert!(kubectl.exists(), "kubectl is missing: tests/ground/control-plane.sh install");
    let mut command = Command::new(script);
    command
        .args(["--namespace", namespace, "--keep-crd", "--timeout", timeout])
        .env("KUBECTL", kubectl)
        .env("KUBECONFIG", support::kubeconfig_path());
    tokio::task::spawn_blocking(move || command.output().expect("uninstall.sh runs")).await.expect("joined")
}

async fn table_exists(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> bool {
    dynamodb.describe_table().table_name(table).send().await.is_ok()
}

#[tokio::test]
async fn the_uninstall_guide_removes_consumers_by_their_policy_and_clears_a_stuck_finalizer() {
    let ns = TestNamespace::new("op-uninstall").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-uninstall", 1).await;
    let spec = |table: &str, policy: &str| {
        json!({"streams": [{"name": stream}], "aws": support::aws(),
               "leaseTable": {"name": table, "deletionPolicy": policy}, "processor": {"stdout": {}}})
    };
    let (deleted, retained, stuck) = (
        leasehold_testkit::unique_name("op-unin-del"),
        leasehold_testkit::unique_name("op-unin-ret"),
        leasehold_testkit::unique_name("op-unin-stuck"),
    );
    ns.create("deleted", spec(&deleted, "Delete")).await.expect("create");
    ns.create("retained", spec(&retained, "Retain")).await.expect("create");
    for name in ["deleted", "retained"] {
        wait(&format!("{name}: TableReady"), SLOW, || async {
            ns.condition(name, "TableReady").await.is_some_and(|c| c.0 == "True")
        })
        .await;
    }

    // With the operator running: each consumer's policy is applied.
    let started = std::time::Instant::now();
    let run = uninstall(&ns.name, "150").await;
    eprintln!("uninstall.sh took {:?}: {}", started.elapsed(), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "uninstall.sh: {}", String::from_utf8_lossy(&run.stderr));
    assert!(ns.consumers().list(&Default::default()).await.expect("list").items.is_empty(), "no StreamConsumer");
    // dynalite, like DynamoDB, shows a deleted table as DELETING for a moment.
    wait("deletionPolicy: Delete deleted the table", Duration::from_secs(20), || async {
        !table_exists(&dynamodb, &deleted).await
    })
    .await;
    assert!(table_exists(&dynamodb, &retained).await, "deletionPolicy: Retain kept the table");
    assert!(
        !String::from_utf8_lossy(&run.stderr).contains("still held"),
        "no finalizer had to be cleared: {}",
        String::from_utf8_lossy(&run.stderr)
    );

    // The operator gone first: the finalizer blocks the deletion until the guide's step clears it.
    ns.create("stuck", spec(&stuck, "Delete")).await.expect("create");
    wait("stuck: TableReady and the finalizer on", SLOW, || async {
        let consumer = ns.consumers().get("stuck").await.ok();
        let finalized = consumer.as_ref().is_some_and(|c| {
            c.metadata.finalizers.as_deref().unwrap_or_default().iter().any(|f| f == leasehold_operator::FINALIZER)
        });
        finalized && ns.condition("stuck", "TableReady").await.is_some_and(|c| c.0 == "True")
    })
    .await;
    ns.stop_operator();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let run = uninstall(&ns.name, "3").await;
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "uninstall.sh: {stderr}");
    assert!(stderr.contains(&format!("{}/stuck is still held by leasehold.io/lease-table", ns.name)), "{stderr}");
    assert!(stderr.contains(&format!("lease table {stuck} is kept")), "{stderr}");
    assert!(ns.consumers().get_opt("stuck").await.expect("get").is_none(), "no stuck StreamConsumer");
    assert!(table_exists(&dynamodb, &stuck).await, "with the operator gone, the table is kept whatever the policy");
    for table in [&retained, &stuck] {
        dynamodb.delete_table().table_name(table.as_str()).send().await.expect("clean up");
    }
}
