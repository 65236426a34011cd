//! The chart's monitoring objects against the Prometheus Operator's own CRD schemas: the CRDs
//! (`tests/ground/prometheus.sh crds`, from its Go module) are installed into the local control plane and
//! the objects `helm template` renders with every switch on are applied for real in a fresh namespace,
//! so the API server validates each field (an unknown or misspelled field is refused: the apply is
//! strict). A broken rule is refused too, proving the schemas are enforced rather than skipped.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::observability::*;

const OPERATOR_VERSION: &str = "v0.85.0";

fn crd_dir() -> PathBuf {
    let dir = leasehold_testkit::cache_dir().join(format!("prometheus/crds-{OPERATOR_VERSION}"));
    assert!(
        dir.join(".complete").exists(),
        "{} is missing: fetch the CRDs with `tests/ground/prometheus.sh crds` (or run `make test`)",
        dir.display()
    );
    dir
}

fn kubectl(args: &[&str]) -> Command {
    let mut command = Command::new(k8s_tool("kubectl"));
    command.arg("--kubeconfig").arg(support::kubeconfig_path()).args(args);
    command
}

#[tokio::test]
async fn rendered_monitoring_objects_validate_against_the_prometheus_operator_crds() {
    let client = support::client().await;
    // Server-side: the CRDs are too large for client-side apply's last-applied annotation.
    run(kubectl(&["apply", "--server-side", "--force-conflicts", "--field-manager", "leasehold-tests", "-f"])
        .arg(crd_dir()));
    for crd in ["podmonitors", "servicemonitors", "prometheusrules"] {
        run(&mut kubectl(&[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            &format!("crd/{crd}.monitoring.coreos.com"),
        ]));
    }
    let namespace = support::create_namespace(&client, "monitoring", false).await;
    let mut command = Command::new(k8s_tool("helm"));
    command.args(["template", "t", &chart(), "--kube-version", "1.34.2", "--namespace", &namespace]);
    command.args(["--set", ALL_ON, "--set", "monitoring.labels.release=kube-prometheus-stack"]);
    command.args(["--set", "monitoring.podMonitor.namespaces[0]=shop"]);
    for template in ["monitoring.yaml", "prometheusrule.yaml", "dashboard.yaml"] {
        command.args(["--show-only", &format!("templates/{template}")]);
    }
    let rendered = run(&mut command);
    let kinds: Vec<String> = documents(&rendered).iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
    assert_eq!(kinds, ["PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"]);
    let file = std::env::temp_dir().join(format!("{namespace}.yaml"));
    std::fs::write(&file, &rendered).unwrap();
    let applied = run(kubectl(&[
        "apply",
        "--server-side",
        "--validate=strict",
        "--field-manager",
        "leasehold-tests",
        "-n",
        &namespace,
        "-f",
    ])
    .arg(&file));
    for object in
        ["podmonitor.monitoring.coreos.com/t-leasehold-workers", "prometheusrule.monitoring.coreos.com/t-leasehold"]
    {
        assert!(applied.contains(object), "{object} not applied:\n{applied}");
    }
    // What the API server stored is what was rendered (nothing pruned as unknown).
    let stored = run(&mut kubectl(&["get", "prometheusrule", "t-leasehold", "-n", &namespace, "-o", "json"]));
    let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    let rendered_rule = documents(&rendered).into_iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    assert_eq!(stored["spec"], rendered_rule["spec"], "the stored rule differs from the rendered one");

    // A rule with a malformed duration is refused by the same schema.
    let broken = rendered.replacen("for: 10m", "for: ten minutes", 1);
    let broken_file = std::env::temp_dir().join(format!("{namespace}-broken.yaml"));
    std::fs::write(&broken_file, broken).unwrap();
    let refused = kubectl(&["apply", "--server-side", "--field-manager", "leasehold-tests", "-n", &namespace, "-f"])
        .arg(&broken_file)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a PrometheusRule with `for: ten minutes` was accepted: schemas not enforced");
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(broken_file);
    let _ = kubectl(&["delete", "namespace", &namespace, "--wait=false"]).output();
}
