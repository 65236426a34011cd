//! The chart's dashboard and alerts against a real Prometheus (Debian's, `tests/ground/prometheus.sh`)
//! on loopback, scraping a real operator (on the local control plane) and real worker processes (on the
//! emulators): every dashboard query and every alert expression must return at least one series, so a
//! misspelled metric or label fails here. The workers are set up so that every series a query names
//! exists: a consumer group reading and checkpointing, a consumer whose processor answers 500 (records
//! skipped), a fan-out consumer whose subscriptions are refused and replaced, a StreamConsumer whose
//! lease table cannot be reached (reconcile failures) and one over the group's table (the operator's lag
//! and unheld-shard series). Targets carry the labels the chart's PodMonitor
//! gives worker series (namespace, pod, consumer). Prometheus also loads the rendered rules, which must
//! all evaluate without error, and the skipped records fire LeaseholdRecordsDropped for their consumer
//! only.
//!
//! `LEASEHOLD_DASHBOARD_DATA=<file>` also writes every panel's series over the run to that file (what
//! docs/plots/plot.py draws as docs/plots/dashboard.png); `LEASEHOLD_DASHBOARD_SECONDS` lengthens the run.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use kube::Api;
use kube::api::PostParams;
use leasehold_testkit::Service;
use leasehold_testkit::fanout::{FanOutFault, FanOutServer};
use leasehold_testkit::process::{WorkerProcess, wait_for};
use leasehold_testkit::server::LocalServer;
use serde_json::{Value, json};
use support::observability::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAMESPACE: &str = "leasehold-live";
const TIMING: &str = "lease: {duration: 6s, renewInterval: 1s, scanInterval: 250ms, shardSyncInterval: 1s, \
                      checkpointInterval: 200ms, gracefulTimeout: 3s}\n";

/// A Prometheus server process, killed when dropped.
struct Prometheus {
    child: Child,
    address: String,
    _dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GET over HTTP/1.0, so that Prometheus answers with a plain body (no chunked encoding).
async fn get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_string()))
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (address, labels) every second and evaluating `rules`.
    async fn start(targets: &[(String, BTreeMap<&str, String>)], rules: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("leasehold-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let dir = TempDir(dir);
        std::fs::write(dir.0.join("rules.yaml"), rules).unwrap();
        let static_configs: Vec<Value> =
            targets.iter().map(|(address, labels)| json!({"targets": [address], "labels": labels})).collect();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": ["rules.yaml"],
            // As the chart's ServiceMonitor: the operator's per-consumer series keep their own namespace.
            "scrape_configs": [{"job_name": "leasehold", "honor_labels": true, "static_configs": static_configs}],
        });
        std::fs::write(dir.0.join("prometheus.yml"), serde_yaml_ng::to_string(&config).unwrap()).unwrap();
        let address = format!("127.0.0.1:{}", support::free_port());
        let child = Command::new(prometheus_tool("prometheus"))
            .current_dir(&dir.0)
            .arg("--config.file=prometheus.yml")
            .arg("--storage.tsdb.path=data")
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start prometheus: {e}"));
        let prometheus = Self { child, address, _dir: dir };
        let started = Instant::now();
        while get(&prometheus.address, "/-/ready").await.map(|r| r.0) != Some(200) {
            assert!(started.elapsed() < Duration::from_secs(30), "Prometheus not ready: {}", prometheus.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.0.join("prometheus.log")).unwrap_or_default()
    }

    /// The API's `data` for `path`, panicking on an error answer.
    async fn api(&self, path: &str) -> Value {
        let (status, body) = get(&self.address, path).await.unwrap_or_else(|| panic!("no answer for {path}"));
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(status == 200 && answer["status"] == "success", "{path}: {status} {body}");
        answer["data"].clone()
    }

    /// The series an instant query returns.
    async fn query(&self, query: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(query))).await;
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

/// The alert expression with each threshold lowered to the floor (every value here is >= 0), split at
/// `or` into its sides: each side must find series.
fn floored_sides(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for side in expr.split(" or ") {
        let cut = [" > ", " == "].iter().filter_map(|op| side.rfind(op)).max().expect("a comparison");
        out.push(format!("{} >= 0", &side[..cut]));
    }
    out
}

fn labels(consumer: &str, pod: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([("namespace", NAMESPACE.to_string()), ("consumer", consumer.to_string()), ("pod", pod.to_string())])
}

fn worker_config(stream: &str, kinesis: &str, table: Option<&str>, processor: &str, extra: &str) -> String {
    let dynamodb = leasehold_testkit::endpoint(Service::DynamoDb);
    let table = table.map(|t| format!("leaseTable: {{name: {t}}}\n")).unwrap_or_default();
    format!(
        "streams: [{{name: {stream}}}]\naws: {{region: us-east-1, kinesisEndpoint: '{kinesis}', dynamodbEndpoint: '{dynamodb}'}}\n\
         {table}processor: {processor}\nstartPosition: TRIM_HORIZON\n{TIMING}{extra}"
    )
}

/// Writes a lag of 1.5 s into every shard row of `table`, every second, until aborted.
async fn write_lag_into_rows(table: String) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    loop {
        let items = dynamodb.scan().table_name(&table).consistent_read(true).send().await.ok();
        for item in items.iter().flat_map(|out| out.items()) {
            let Some(key) = item.get("lease_key").and_then(|k| k.as_s().ok()) else { continue };
            if key.starts_with('#') || !item.contains_key("lease_owner") {
                continue;
            }
            let _ = dynamodb
                .update_item()
                .table_name(&table)
                .key("lease_key", AttributeValue::S(key.clone()))
                .update_expression("SET lag_ms = :lag")
                .condition_expression("attribute_exists(lease_key)")
                .expression_attribute_values(":lag", AttributeValue::N("1500".into()))
                .send()
                .await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn metrics_address(worker: &WorkerProcess) -> String {
    wait_for("the worker's metrics address", Duration::from_secs(30), async || worker.metrics_addr().is_some()).await;
    worker.metrics_addr().expect("address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_alert_expression_finds_series_on_a_real_prometheus() {
    let run_for = std::env::var("LEASEHOLD_DASHBOARD_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20u64);
    let worker_binary = support::kubelet::worker_binary();
    let kinesalite = leasehold_testkit::endpoint(Service::Kinesis);
    let kinesis = leasehold_testkit::kinesis_client().await;

    // The operator, with a consumer whose lease table cannot be reached: reconciles fail at `table`.
    let client = support::client().await;
    support::install_crd(&client).await;
    let namespace = support::create_namespace(&client, "prom", false).await;
    let operator_address = format!("127.0.0.1:{}", support::free_port());
    let mut operator = support::start_operator(support::operator_command(
        std::path::Path::new(env!("CARGO_BIN_EXE_leasehold-operator")),
        &namespace,
        &support::kubeconfig_path(),
        "1s",
        &operator_address,
    ));
    let mut broken_aws = support::aws();
    broken_aws["dynamodbEndpoint"] = json!("http://127.0.0.1:9");
    let consumer = support::stand_in_consumer(
        "unreachable",
        json!({"streams": [{"name": "absent"}], "aws": broken_aws, "leaseTable": {"name": "unreachable"},
               "processor": {"stdout": {}}}),
    );
    Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &consumer)
        .await
        .unwrap();

    // orders: two workers sharing a lease table, reading and checkpointing.
    let orders = leasehold_testkit::create_stream(&kinesis, "promorders", 2).await;
    let table = leasehold_testkit::unique_name("promorders");
    let orders_config = worker_config(&orders, &kinesalite, Some(&table), "{stdout: {}}", "");
    let group = [
        WorkerProcess::spawn(&worker_binary, &orders_config, "orders-workers-a"),
        WorkerProcess::spawn(&worker_binary, &orders_config, "orders-workers-b"),
    ];
    // failing: its processor answers 500; one attempt, then the record is skipped.
    let sink =
        LocalServer::start(Router::new().route("/records", post(|| async { StatusCode::INTERNAL_SERVER_ERROR }))).await;
    let failing_stream = leasehold_testkit::create_stream(&kinesis, "promfail", 1).await;
    let failing = WorkerProcess::spawn(
        &worker_binary,
        &worker_config(
            &failing_stream,
            &kinesalite,
            None,
            &format!("{{http: {{url: '{}/records', timeout: 1s}}}}", sink.endpoint()),
            "retry: {maxAttempts: 1, backoff: 10ms, onExhausted: skip}\n",
        ),
        "failing-workers-a",
    );
    // fanout: enhanced fan-out whose first subscriptions are refused and whose subscriptions end quickly.
    let server = FanOutServer::start(&kinesalite).await.expect("fan-out server starts");
    let controls = server.controls();
    controls.fail_next_subscribes(None, FanOutFault::ResourceInUse, 2);
    controls.set_subscription_lifetime(Duration::from_secs(2));
    controls.set_resubscribe_window(Duration::from_millis(300));
    controls.set_call_interval(Duration::from_millis(200));
    let fanout_stream = leasehold_testkit::create_stream(&kinesis, "promfanout", 1).await;
    let fanout = WorkerProcess::spawn(
        &worker_binary,
        &worker_config(
            &fanout_stream,
            &server.endpoint(),
            None,
            "{stdout: {}}",
            "reader: {mode: fanOut, subscriptionIdleTimeout: 3s}\n",
        ),
        "fanout-workers-a",
    );

    // The operator also runs a StreamConsumer over the orders group's table: it reads the rows into its
    // lag and unheld-shard series. Until every worker writes its lag, the test writes one into the rows
    // (an update that leaves what the holders' conditions check alone).
    Api::<leasehold_crds::StreamConsumer>::namespaced(client.clone(), &namespace)
        .create(
            &PostParams::default(),
            &support::stand_in_consumer(
                "orders",
                json!({"streams": [{"name": orders}], "aws": support::aws(), "leaseTable": {"name": table},
                       "processor": {"stdout": {}}}),
            ),
        )
        .await
        .unwrap();
    let lag_writer = tokio::spawn(write_lag_into_rows(table.clone()));

    let mut targets = vec![(
        operator_address.clone(),
        BTreeMap::from([("namespace", namespace.clone()), ("pod", "operator".to_string())]),
    )];
    for (worker, consumer) in [(&group[0], "orders"), (&group[1], "orders"), (&failing, "failing"), (&fanout, "fanout")]
    {
        targets.push((metrics_address(worker).await, labels(consumer, &worker.owner)));
    }
    let docs = documents(&render(&[]));
    let rules_dir = std::env::temp_dir().join(format!("leasehold-live-rules-{}", std::process::id()));
    std::fs::create_dir_all(&rules_dir).unwrap();
    let rules = std::fs::read_to_string(write_rules(&docs, &rules_dir)).unwrap();
    let _ = std::fs::remove_dir_all(&rules_dir);
    let prometheus = Prometheus::start(&targets, &rules).await;
    let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();

    // Records for every consumer, while Prometheus scrapes.
    let deadline = Instant::now() + Duration::from_secs(run_for);
    let mut n = 0u64;
    while Instant::now() < deadline {
        for stream in [&orders, &failing_stream, &fanout_stream] {
            let batch: Vec<(String, Vec<u8>)> =
                (0..20).map(|i| leasehold_testkit::kinesis::numbered(&format!("k{}", i % 7), n + i)).collect();
            leasehold_testkit::kinesis::put_records(&kinesis, stream, &batch).await;
        }
        n += 20;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Every query must find series; wait for the scrapes to catch up, then report all that still fail.
    let dash = dashboard();
    let mut checks: Vec<(String, String)> = dashboard_queries(&dash)
        .into_iter()
        .map(|(title, reference, expr)| (format!("panel '{title}' query {reference}"), expr))
        .collect();
    for alert in alerts(&docs) {
        let name = alert["alert"].as_str().unwrap().to_string();
        for side in floored_sides(alert["expr"].as_str().unwrap()) {
            checks.push((format!("alert {name}"), side));
        }
    }
    let waited = Instant::now();
    let mut empty: Vec<String>;
    loop {
        empty = Vec::new();
        for (what, expr) in &checks {
            if prometheus.query(expr).await.is_empty() {
                empty.push(format!("{what}: {expr}"));
            }
        }
        if empty.is_empty() || waited.elapsed() > Duration::from_secs(90) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(
        empty.is_empty(),
        "{} of {} queries found no series on the live Prometheus:\n{}\nscraped names: {:?}",
        empty.len(),
        checks.len(),
        empty.join("\n"),
        prometheus.api("/api/v1/label/__name__/values").await
    );
    assert!(checks.len() >= 30, "{} checks", checks.len());
    // Every name the worker and the operator export was reviewed against Prometheus' naming conventions:
    // charts/leasehold/CHANGELOG.md lists it, as conforming or with its intended rename.
    let changelog = std::fs::read_to_string(format!("{}/CHANGELOG.md", chart())).unwrap();
    let names = prometheus.api("/api/v1/label/__name__/values").await;
    let mut unreviewed = Vec::new();
    for name in names.as_array().unwrap().iter().filter_map(Value::as_str).filter(|n| n.starts_with("leasehold_")) {
        let base = ["_bucket", "_sum", "_count"].iter().fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
        if !changelog.contains(&format!("`{base}`")) && !changelog.contains(&format!("`{base}{{")) {
            unreviewed.push(base.to_string());
        }
    }
    assert!(unreviewed.is_empty(), "metrics missing from the chart CHANGELOG's naming review: {unreviewed:?}");
    // And each is on a generated reference page (docs/reference/*-metrics.md, from the registries).
    let pages = ["worker-metrics.md", "operator-metrics.md"]
        .map(|page| {
            std::fs::read_to_string(format!("{}/../docs/reference/{page}", env!("CARGO_MANIFEST_DIR"))).unwrap()
        })
        .concat();
    let mut off_the_pages = Vec::new();
    for name in names.as_array().unwrap().iter().filter_map(Value::as_str).filter(|n| n.starts_with("leasehold_")) {
        let base = ["_bucket", "_sum", "_count"].iter().fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
        if !pages.contains(&format!("| `{base}` |")) {
            off_the_pages.push(base.to_string());
        }
    }
    assert!(off_the_pages.is_empty(), "scraped metrics missing from docs/reference/: {off_the_pages:?}");
    // The check can fail: a misspelled name finds nothing.
    assert!(prometheus.query("sum by (consumer) (leasehold_records_procesed_total)").await.is_empty());

    // Prometheus loaded the chart's rules and evaluates each without error.
    let groups = prometheus.api("/api/v1/rules").await["groups"].as_array().cloned().unwrap_or_default();
    let evaluated: Vec<Value> =
        groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect();
    assert_eq!(evaluated.len(), alerts(&docs).len(), "rules loaded: {groups:?}");
    for rule in &evaluated {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    // With the chart's default thresholds, the skipped records fire LeaseholdRecordsDropped (its `for` is
    // 0) for the failing consumer, and for no other.
    let firing = r#"ALERTS{alertname="LeaseholdRecordsDropped", alertstate="firing"}"#;
    let waited = Instant::now();
    while prometheus.query(firing).await.is_empty() && waited.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let consumers: Vec<Value> =
        prometheus.query(firing).await.iter().map(|s| s["metric"]["consumer"].clone()).collect();
    assert_eq!(consumers, [json!("failing")], "LeaseholdRecordsDropped firing for {consumers:?}");

    if let Ok(file) = std::env::var("LEASEHOLD_DASHBOARD_DATA") {
        let end = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
        let mut panels = Vec::new();
        for panel in query_panels(&dash) {
            let mut series = Vec::new();
            for target in panel["targets"].as_array().unwrap() {
                let expr = concrete(target["expr"].as_str().unwrap()).replace("[1m]", "[10s]");
                let path = format!("/api/v1/query_range?query={}&start={started}&end={end}&step=2", encode(&expr));
                for result in prometheus.api(&path).await["result"].as_array().cloned().unwrap_or_default() {
                    series.push(json!({"legend": target["legendFormat"], "metric": result["metric"], "values": result["values"]}));
                }
            }
            panels.push(
                json!({"title": panel["title"], "unit": panel["fieldConfig"]["defaults"]["unit"], "series": series}),
            );
        }
        std::fs::write(&file, serde_json::to_string(&json!({"seconds": end - started, "panels": panels})).unwrap())
            .unwrap();
    }

    lag_writer.abort();
    let _ = operator.kill();
    let _ = operator.wait();
    drop(group);
    drop(failing);
    drop(fanout);
}
