//! The Helm chart's own operator pods on the real node (tests/ground/node.sh) with the local image
//! (`make images`, `image.pullPolicy=Never`), in a namespace enforcing the restricted Pod Security
//! profile: two replicas Running, one leader holding the Lease and Ready, and the operator's own token
//! (a TokenRequest for the chart's ServiceAccount) refused what the chart's RBAC does not grant.

mod node;
mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use node::Node;
use support::wait;

const SLOW: Duration = Duration::from_secs(90);

fn bin(name: &str) -> PathBuf {
    leasehold_testkit::cache_dir().join("k8s-bin").join(name)
}

fn run(program: &PathBuf, args: &[&str]) -> std::process::Output {
    Command::new(program)
        .args(args)
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn ok(program: &PathBuf, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(output.status.success(), "{} {args:?}: {}", program.display(), String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

async fn list(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(selector)).await.map(|l| l.items).unwrap_or_default()
}

fn ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_operator_pods_elect_one_leader_with_only_the_charts_rbac() {
    let node = Node::get();
    node.assert_image(&format!("ghcr.io/leasehold/operator:{}", env!("CARGO_PKG_VERSION")));
    let client = support::client().await;
    support::install_crd(&client).await;
    let ns = support::create_namespace(&client, "chart", true).await;
    let release = ns.clone();
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/leasehold");
    ok(
        &bin("helm"),
        &[
            "install",
            &release,
            chart.to_str().expect("path"),
            "--namespace",
            &ns,
            "--skip-crds",
            "--set",
            "replicas=2",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            &format!("watchNamespace={ns}"),
        ],
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let selector = format!("app.kubernetes.io/instance={release}");

    // Admitted under `restricted`, both Running; the leader holds the Lease and is Ready.
    wait("two operator pods Running", SLOW, async || {
        let now = list(&pods, &selector).await;
        now.len() == 2 && now.iter().all(running)
    })
    .await;
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let names: Vec<String> = list(&pods, &selector).await.iter().map(|p| p.name_any()).collect();
    wait("one replica holding the leader Lease", SLOW, async || {
        let holder = leases.get_opt("leasehold-operator").await.ok().flatten().and_then(|l| l.spec?.holder_identity);
        holder.is_some_and(|h| names.contains(&h))
    })
    .await;
    let leader =
        leases.get("leasehold-operator").await.expect("lease").spec.and_then(|s| s.holder_identity).expect("holder");
    wait("the leader Ready (its probes pass)", SLOW, async || {
        list(&pods, &selector).await.iter().any(|p| p.name_any() == leader && ready(p))
    })
    .await;
    for pod in list(&pods, &selector).await {
        let restarts = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map(|c| c[0].restart_count);
        assert_eq!(restarts, Some(0), "{} restarted", pod.name_any());
    }
    let standby: Vec<String> = names.iter().filter(|n| **n != leader).cloned().collect();
    assert_eq!(standby.len(), 1, "one leader and one standby among {names:?}");

    // The operator's token: what the chart grants works, anything else is refused.
    let kubectl = bin("kubectl");
    // The chart's ServiceAccount is named after the release and the chart.
    let account = format!("{release}-leasehold");
    let token = ok(&kubectl, &["create", "token", &account, "--namespace", &ns, "--duration", "10m"]);
    let server = ok(&kubectl, &["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"]);
    let ca = leasehold_testkit::state_dir().join("control-plane/pki/ca.crt");
    let as_operator = |args: &[&str]| {
        Command::new(&kubectl)
            .args(["--kubeconfig", "/dev/null", "--server", &server, "--token", &token])
            .arg("--certificate-authority")
            .arg(&ca)
            .args(args)
            .output()
            .expect("kubectl")
    };
    let allowed = as_operator(&["get", "streamconsumers", "--namespace", &ns]);
    assert!(
        allowed.status.success(),
        "the chart's RBAC lets it list StreamConsumers: {}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let forbidden = as_operator(&["get", "secrets", "--namespace", "kube-system"]);
    let stderr = String::from_utf8_lossy(&forbidden.stderr);
    assert!(!forbidden.status.success() && stderr.contains("Forbidden"), "reading secrets was not refused: {stderr}");

    ok(&bin("helm"), &["uninstall", &release, "--namespace", &ns]);
    wait("operator pods gone", SLOW, async || list(&pods, &selector).await.is_empty()).await;
}
