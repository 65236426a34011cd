//! What the observability tests share: the chart rendered with every monitoring switch on, its alert
//! groups as a Prometheus rules file, the dashboard's queries, and the Prometheus binaries that
//! `tests/ground/prometheus.sh` unpacks into the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Every monitoring switch of the chart, on.
pub const ALL_ON: &str = "monitoring.podMonitor.enabled=true,monitoring.serviceMonitor.enabled=true,\
monitoring.annotations.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true";

/// The chart's directory.
pub fn chart() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/leasehold").to_string()
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A binary the control-plane script installs (helm, kubectl); panics with the command that installs it.
pub fn k8s_tool(name: &str) -> PathBuf {
    let path = leasehold_testkit::cache_dir().join("k8s-bin").join(name);
    assert!(path.exists(), "{} is missing: install it with `tests/ground/control-plane.sh install`", path.display());
    path
}

/// `prometheus` or `promtool`; panics with the command that installs them.
pub fn prometheus_tool(name: &str) -> PathBuf {
    let path = leasehold_testkit::cache_dir().join("prometheus/bin").join(name);
    assert!(path.exists(), "{} is missing: install it with `tests/ground/prometheus.sh install`", path.display());
    path
}

/// Runs `command`, panicking with its output unless it succeeds; returns its stdout.
pub fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template` of the chart with every monitoring switch on, plus `extra` `--set` values.
pub fn render(extra: &[&str]) -> String {
    let mut command = Command::new(k8s_tool("helm"));
    command.args(["template", "t", &chart(), "--kube-version", "1.34.2", "--set", ALL_ON]);
    for set in extra {
        command.args(["--set", set]);
    }
    run(&mut command)
}

/// The rendered documents, parsed.
pub fn documents(rendered: &str) -> Vec<Value> {
    rendered
        .split("\n---")
        .filter_map(|doc| serde_yaml_ng::from_str::<Value>(doc).ok())
        .filter(|doc| doc.is_object())
        .collect()
}

/// The one rendered object of `kind`.
pub fn object<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = documents.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, rendered {}", found.len());
    found[0]
}

/// Writes the PrometheusRule's groups as a rules file `rules.yaml` in `dir`; returns its path.
pub fn write_rules(documents: &[Value], dir: &Path) -> PathBuf {
    let groups = &object(documents, "PrometheusRule")["spec"]["groups"];
    let file = dir.join("rules.yaml");
    let text = serde_yaml_ng::to_string(&serde_json::json!({ "groups": groups })).expect("rules YAML");
    std::fs::write(&file, text).expect("write rules.yaml");
    file
}

/// Every alert rule of the rendered PrometheusRule.
pub fn alerts(documents: &[Value]) -> Vec<Value> {
    let groups = object(documents, "PrometheusRule")["spec"]["groups"].as_array().cloned().unwrap_or_default();
    groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect()
}

/// The committed dashboard.
pub fn dashboard() -> Value {
    let path = format!("{}/dashboards/leasehold.json", chart());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// The dashboard's panels that query (rows left out), rows' nested panels included.
pub fn query_panels(dashboard: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().cloned().unwrap_or_default() {
        if panel["type"] == "row" {
            out.extend(panel["panels"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(panel);
        }
    }
    out
}

/// A dashboard query as Prometheus takes it: the template variables replaced by what "All" and a
/// one-minute rate window stand for.
pub fn concrete(expr: &str) -> String {
    expr.replace("$namespace", ".*").replace("$consumer", ".*").replace("$__rate_interval", "1m")
}

/// Every dashboard query as (panel title, refId, concrete expression).
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for panel in query_panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        for target in panel["targets"].as_array().cloned().unwrap_or_default() {
            let expr = target["expr"].as_str().unwrap_or_default();
            out.push((title.clone(), target["refId"].as_str().unwrap_or_default().to_string(), concrete(expr)));
        }
    }
    out
}
