//! The Helm chart: lint and template offline, then install into the local control plane in a namespace
//! enforcing the restricted Pod Security Standard, and run the operator under the chart's own
//! ServiceAccount token to prove its RBAC is enough.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::config::{AuthInfo, Kubeconfig};
use serde::Deserialize;
use serde_json::json;
use support::{aws, wait};

fn tool(name: &str) -> PathBuf {
    let path = leasehold_testkit::cache_dir().join("k8s-bin").join(name);
    assert!(path.exists(), "{} is missing: install it with `tests/ground/control-plane.sh install`", path.display());
    path
}

fn chart() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/leasehold").to_string()
}

fn kubeconfig() -> String {
    support::kubeconfig_path().display().to_string()
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_chart_lints_and_renders_and_its_crd_matches_the_types() {
    run(Command::new(tool("helm")).args(["lint", "--strict", &chart()]));
    let one = run(Command::new(tool("helm")).args(["template", "t", &chart(), "--kube-version", "1.34.2"]));
    assert!(!one.contains("--leader-elect"), "one replica needs no election");
    let two = run(Command::new(tool("helm")).args([
        "template",
        "t",
        &chart(),
        "--kube-version",
        "1.34.2",
        "--set",
        "replicas=2",
    ]));
    assert!(two.contains("--leader-elect"));
    let refused = Command::new(tool("helm"))
        .args(["template", "t", &chart(), "--kube-version", "1.34.2", "--set", "replicas=0"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "values.schema.json must refuse replicas 0");
    // With watchNamespace, nothing cluster-wide grants rights on workloads: the one ClusterRole reads the CRD.
    let scoped = run(Command::new(tool("helm")).args([
        "template",
        "t",
        &chart(),
        "--kube-version",
        "1.34.2",
        "--set",
        "watchNamespace=shop",
    ]));
    let kinds = |yaml: &str, kind: &str| -> Vec<serde_json::Value> {
        serde_yaml_ng::Deserializer::from_str(yaml)
            .filter_map(|doc| serde_json::Value::deserialize(doc).ok())
            .filter(|doc| doc["kind"] == kind)
            .collect()
    };
    let cluster_roles = kinds(&scoped, "ClusterRole");
    assert_eq!(cluster_roles.len(), 1, "{cluster_roles:?}");
    let cluster_resources: Vec<&serde_json::Value> =
        cluster_roles[0]["rules"].as_array().unwrap().iter().flat_map(|r| r["resources"].as_array().unwrap()).collect();
    assert_eq!(cluster_resources, vec![&json!("customresourcedefinitions")], "{cluster_roles:?}");
    let roles = kinds(&scoped, "Role");
    let workload_role = roles.iter().find(|r| r["metadata"]["namespace"] == "shop").expect("a Role in shop");
    let resources: Vec<&serde_json::Value> =
        workload_role["rules"].as_array().unwrap().iter().flat_map(|r| r["resources"].as_array().unwrap()).collect();
    for resource in ["streamconsumers", "deployments", "configmaps", "events"] {
        assert!(resources.contains(&&json!(resource)), "the Role grants {resource}: {resources:?}");
    }
    assert!(kinds(&scoped, "RoleBinding").iter().any(|b| b["metadata"]["namespace"] == "shop"));
    // Without it, the ClusterRole carries the workload rules as before.
    let everywhere = kinds(&one, "ClusterRole");
    assert!(everywhere[0]["rules"].as_array().unwrap().len() > 1);
    let restricted = run(Command::new(tool("helm")).args([
        "template",
        "t",
        &chart(),
        "--kube-version",
        "1.34.2",
        "--set",
        "restrictTemplates=true",
    ]));
    assert!(restricted.contains("--restrict-templates") && !one.contains("--restrict-templates"));
    // NetworkPolicies: none by default; the operator's own and the workers' flag when switched on.
    assert!(kinds(&one, "NetworkPolicy").is_empty() && !one.contains("--worker-network-policy"));
    let policed = run(Command::new(tool("helm")).args([
        "template",
        "t",
        &chart(),
        "--kube-version",
        "1.34.2",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.metricsFrom.podLabels.app=prometheus",
        "--set",
        "workerNetworkPolicy.enabled=true",
        "--set",
        "workerNetworkPolicy.metricsFrom.namespaceLabels.team=monitoring",
    ]));
    let policies = kinds(&policed, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "{policies:?}");
    let ingress = &policies[0]["spec"]["ingress"][0];
    assert_eq!(ingress["ports"][0]["port"], "metrics");
    assert_eq!(ingress["from"][0]["podSelector"]["matchLabels"]["app"], "prometheus");
    assert!(policed.contains("--worker-network-policy"));
    assert!(policed.contains("--metrics-from-namespace-labels=team=monitoring"));
    let committed = std::fs::read_to_string(format!("{}/crds/streamconsumer.yaml", chart())).unwrap();
    assert_eq!(committed, leasehold_crds::crd_yaml().unwrap(), "the chart's CRD drifted: run `make crds`");
}

#[tokio::test]
async fn the_chart_installs_and_the_operator_runs_with_its_rbac() {
    installs_and_runs_with_its_rbac(false).await;
}

#[tokio::test]
async fn with_watch_namespace_the_operator_runs_on_a_role_alone() {
    installs_and_runs_with_its_rbac(true).await;
}

/// Installs the chart (with `watchNamespace` set to the watched namespace when `scoped`), then runs the
/// operator binary as the chart's ServiceAccount and checks it deploys workers and writes status.
async fn installs_and_runs_with_its_rbac(scoped: bool) {
    let client = support::client().await;
    support::install_crd(&client).await;
    let release_ns = support::create_namespace(&client, "chart", true).await;
    let release = format!("lh{}{}", std::process::id(), if scoped { "s" } else { "" });
    let watched = support::create_namespace(&client, "chart-app", false).await;
    let mut install = vec![
        "install".to_string(),
        release.clone(),
        chart(),
        "--namespace".into(),
        release_ns.clone(),
        "--kubeconfig".into(),
        kubeconfig(),
        "--wait=false".into(),
        // The pod is only admitted here (node_chart.rs runs it): unschedulable, so the real node never runs
        // an operator that watches every namespace beside the other tests' operators.
        "--set".into(),
        "nodeSelector.leasehold\\.io/stand-in=unschedulable".into(),
    ];
    if scoped {
        install.extend(["--set".into(), format!("watchNamespace={watched}")]);
    }
    run(Command::new(tool("helm")).args(&install));

    // The operator's pod is admitted under the restricted standard.
    let pods = Api::<Pod>::namespaced(client.clone(), &release_ns);
    wait("operator pod admitted", Duration::from_secs(30), async || {
        pods.list(&ListParams::default().labels("app.kubernetes.io/name=leasehold-operator"))
            .await
            .map(|l| l.items.len())
            .unwrap_or(0)
            == 1
    })
    .await;

    // Run the operator as the chart's ServiceAccount.
    let token = run(Command::new(tool("kubectl")).args([
        "create",
        "token",
        &format!("{release}-leasehold"),
        "--namespace",
        &release_ns,
        "--kubeconfig",
        &kubeconfig(),
    ]));
    let mut config = Kubeconfig::read_from(kubeconfig()).unwrap();
    for named in &mut config.auth_infos {
        named.auth_info = Some(AuthInfo { token: Some(token.trim().to_string().into()), ..AuthInfo::default() });
    }
    let sa_kubeconfig = std::env::temp_dir().join(format!("{release}-kubeconfig"));
    std::fs::write(&sa_kubeconfig, serde_yaml_ng::to_string(&config).unwrap()).unwrap();

    let mut operator = support::spawn_operator(
        std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-operator")),
        &watched,
        &sa_kubeconfig,
        "1s",
    );
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "chart", 1).await;
    let consumer = support::consumer(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": leasehold_testkit::unique_name("chart")},
               "processor": {"stdout": {}}}),
    );
    let consumers = Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &watched);
    consumers.create(&PostParams::default(), &consumer).await.unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), &watched);
    wait("workers deployed and status written under the chart's RBAC", Duration::from_secs(30), async || {
        deployments.get_opt("orders-workers").await.ok().flatten().is_some()
            && support::condition(&consumers, "orders", "TableReady").await.is_some_and(|c| c.0 == "True")
    })
    .await;
    let _ = operator.kill();
    let _ = operator.wait();
    run(Command::new(tool("helm")).args([
        "uninstall",
        &release,
        "--namespace",
        &release_ns,
        "--kubeconfig",
        &kubeconfig(),
    ]));
}
