//! The chart's observability, offline: every monitoring object renders when switched on and none when
//! off; the alert rules pass `promtool check rules` and the unit tests of
//! operator/tests/prometheus/alerts.test.yaml (`promtool test rules`), one per alert, each firing when it
//! should and quiet when it should not; every alert has a severity, a summary and a runbook that exists
//! in docs/operations.md; the Grafana dashboard is structurally sound (the lint Grafana's own
//! dashboard-linter would do, which the Go module proxy does not serve: docs/testing.md) and every
//! query parses as PromQL. The live check against a real Prometheus is prometheus_live.rs.

mod support;

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;
use support::observability::*;

#[test]
fn monitoring_objects_render_only_when_switched_on() {
    let off = run(Command::new(k8s_tool("helm")).args(["template", "t", &chart(), "--kube-version", "1.34.2"]));
    for absent in ["monitoring.coreos.com", "prometheus.io/scrape", "grafana_dashboard"] {
        assert!(!off.contains(absent), "{absent} rendered with the defaults");
    }
    let on = documents(&render(&["monitoring.labels.release=kube-prometheus-stack"]));
    for kind in ["PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        assert_eq!(object(&on, kind)["metadata"]["labels"]["release"], "kube-prometheus-stack", "{kind} labels");
    }
    let pod_monitor = object(&on, "PodMonitor");
    assert_eq!(pod_monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "leasehold-worker");
    assert_eq!(pod_monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
    let relabel = &pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0];
    assert_eq!(relabel["targetLabel"], "consumer", "alerts and dashboard group by consumer");
    // The ServiceMonitor selects the operator's metrics Service by that Service's labels.
    let service = on
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "t-leasehold-metrics")
        .expect("metrics Service");
    let selector = object(&on, "ServiceMonitor")["spec"]["selector"]["matchLabels"].as_object().cloned().unwrap();
    for (key, value) in &selector {
        assert_eq!(&service["metadata"]["labels"][key], value, "ServiceMonitor selects the Service by {key}");
    }
    assert_eq!(service["metadata"]["annotations"]["prometheus.io/scrape"], "true");
    let deployment = object(&on, "Deployment");
    assert_eq!(deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"], "8080");
    let config_map = on
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("dashboard ConfigMap labelled for Grafana's sidecar");
    let embedded: Value = serde_json::from_str(config_map["data"]["leasehold.json"].as_str().unwrap()).unwrap();
    assert_eq!(embedded, dashboard(), "the ConfigMap carries dashboards/leasehold.json as it is");
    // The schema refuses what it does not know.
    for bad in [
        "monitoring.prometheusRule.alerts.recordsStuck.severity=page",
        "monitoring.prometheusRule.alerts.shardBehindLatest.for=ten",
        "monitoring.podMonitor.unknown=1",
    ] {
        let refused = Command::new(k8s_tool("helm"))
            .args(["template", "t", &chart(), "--kube-version", "1.34.2", "--set", bad])
            .output()
            .unwrap();
        assert!(!refused.status.success(), "values.schema.json must refuse {bad}");
    }
    run(Command::new(k8s_tool("helm")).args(["lint", "--strict", &chart(), "--set", ALL_ON]));
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let docs = documents(&render(&[]));
    let dir = std::env::temp_dir().join(format!("leasehold-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = write_rules(&docs, &dir);
    run(Command::new(prometheus_tool("promtool")).arg("check").arg("rules").arg(&rules));
    let tests = repo().join("operator/tests/prometheus/alerts.test.yaml");
    std::fs::copy(&tests, dir.join("alerts.test.yaml")).unwrap();
    let out =
        run(Command::new(prometheus_tool("promtool")).current_dir(&dir).args(["test", "rules", "alerts.test.yaml"]));
    assert!(out.contains("SUCCESS"), "{out}");

    // One unit test per alert: every alert named in the test file, both firing and quiet.
    let text = std::fs::read_to_string(&tests).unwrap();
    let unit: Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in unit["tests"].as_array().unwrap() {
        for check in case["alert_rule_test"].as_array().unwrap() {
            let name = check["alertname"].as_str().unwrap().to_string();
            if check["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                firing.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let names: BTreeSet<String> = alerts(&docs).iter().map(|a| a["alert"].as_str().unwrap().to_string()).collect();
    assert_eq!(names.len(), 11, "{names:?}");
    assert_eq!(firing, names, "every alert has a unit test in which it fires");
    assert_eq!(quiet, names, "every alert has a unit test in which it stays quiet");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_alert_has_severity_summary_and_a_runbook_in_operations_md() {
    let docs = documents(&render(&[]));
    let operations = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    // GitHub's anchors of the headings: lower case, spaces to dashes, punctuation dropped.
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect();
    for alert in alerts(&docs) {
        let name = alert["alert"].as_str().unwrap();
        assert!(name.starts_with("Leasehold"), "{name}");
        assert!(
            ["info", "warning", "critical"].contains(&alert["labels"]["severity"].as_str().unwrap_or_default()),
            "{name} has a severity"
        );
        assert!(alert["annotations"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{name} has a summary");
        assert!(alert["annotations"]["description"].as_str().is_some_and(|s| !s.is_empty()), "{name}: description");
        let url = alert["annotations"]["runbook_url"].as_str().unwrap_or_default();
        let (page, anchor) = url.split_once('#').unwrap_or_else(|| panic!("{name}: runbook_url {url} has no anchor"));
        assert!(page.ends_with("docs/operations.md"), "{name}: runbook {url}");
        assert_eq!(anchor, name.to_lowercase(), "{name}: the anchor is the alert's name");
        assert!(anchors.contains(anchor), "{name}: docs/operations.md has no heading for #{anchor}");
    }
    // Thresholds are values: a changed threshold reaches the expression.
    let changed = documents(&render(&["monitoring.prometheusRule.alerts.shardBehindLatest.seconds=42"]));
    let behind = alerts(&changed).into_iter().find(|a| a["alert"] == "LeaseholdShardBehindLatest").unwrap();
    assert!(behind["expr"].as_str().unwrap().ends_with("> 42"), "{behind}");
    let without = documents(&render(&["monitoring.prometheusRule.alerts.recordsStuck.enabled=false"]));
    assert!(alerts(&without).iter().all(|a| a["alert"] != "LeaseholdRecordsStuck"), "an alert can be switched off");
}

#[test]
fn the_dashboard_is_well_formed_and_its_queries_parse() {
    let dash = dashboard();
    for field in ["title", "uid", "schemaVersion", "panels", "templating", "time"] {
        assert!(!dash[field].is_null(), "dashboard.{field} missing");
    }
    assert_eq!(dash["uid"], "leasehold", "a fixed uid keeps links stable across imports");
    let variables: Vec<&str> =
        dash["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(variables, ["datasource", "namespace", "consumer"]);
    let panels = query_panels(&dash);
    let mut ids = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_i64().expect("panel id")), "duplicate panel id {}", panel["id"]);
        let grid = &panel["gridPos"];
        for key in ["h", "w", "x", "y"] {
            assert!(grid[key].is_u64(), "panel {} gridPos.{key}", panel["title"]);
        }
        assert!(grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24, "panel {} too wide", panel["title"]);
    }
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut rules = Vec::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap();
        assert!(panel["description"].as_str().is_some_and(|d| !d.is_empty()), "{title}: description");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}: uses the datasource variable");
        assert!(!panel["fieldConfig"]["defaults"]["unit"].is_null(), "{title}: unit");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(refs.insert(target["refId"].as_str().unwrap()), "{title}: duplicate refId");
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}: target datasource");
            // Worker series are filtered by both variables; the operator's own are cluster-wide; its
            // per-consumer series name the StreamConsumer `name`.
            if expr.contains("leasehold_consumer_") {
                assert!(
                    expr.contains(r#"namespace=~"$namespace""#) && expr.contains(r#"name=~"$consumer""#),
                    "{title}: {expr} ignores the namespace or consumer variable"
                );
            } else if !expr.contains("leasehold_operator_") {
                assert!(
                    expr.contains(r#"namespace=~"$namespace""#) && expr.contains(r#"consumer=~"$consumer""#),
                    "{title}: {expr} ignores the namespace or consumer variable"
                );
            }
            if expr.contains("rate(") || expr.contains("increase(") || expr.contains("changes(") {
                assert!(expr.contains("[$__rate_interval]"), "{title}: {expr} should use $__rate_interval");
            }
            rules.push(serde_json::json!({
                "record": format!("dashboard:{}:{}", rules.len(), target["refId"].as_str().unwrap()),
                "expr": concrete(expr),
            }));
        }
    }
    // promtool parses every query (as a recording rule): a syntax error fails here.
    let dir = std::env::temp_dir().join(format!("leasehold-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("dashboard-rules.yaml");
    let text = serde_yaml_ng::to_string(&serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}));
    std::fs::write(&file, text.unwrap()).unwrap();
    run(Command::new(prometheus_tool("promtool")).arg("check").arg("rules").arg(&file));
    let _ = std::fs::remove_dir_all(&dir);
}
