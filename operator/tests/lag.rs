//! Lag on the real control plane with dynalite. Most tests here play the holders, writing lease rows
//! with `lag_ms` straight into the table the operator created (as workers write them at their renewals),
//! and watch what the operator makes of them: the status (`kubectl get scon` with its LAG column), the
//! operator's `/metrics`, and lag autoscaling — replicas rising one step at a time while the lag stays
//! above target, the `LagScaling` condition once every worker reads one shard, the fall back to the
//! shard-count rule only after the lag has stayed under half the target for `scaleDownAfter`, and
//! nothing at all when `lag` is unset. The last one writes nothing into the table: real workers behind a
//! slow http processor measure the lag themselves, and the whole loop runs on it.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use leasehold_crds::StreamConsumerStatus;
use serde_json::json;
use support::observability::{k8s_tool, run};
use support::{TestNamespace, aws, wait};

const SLOW: Duration = Duration::from_secs(60);
const HOUR_MS: i64 = 3_600_000;

fn now_ms() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond()
}

/// Writes the row of `shard` as its holder would: `owner` (none: a free row), a lease running out at
/// `expiry_ms`, and `lag_ms` when measured.
async fn write_row(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    owner: Option<&str>,
    expiry_ms: i64,
    lag_ms: Option<u64>,
) {
    let mut item = HashMap::from([
        ("lease_key".to_string(), AttributeValue::S(key.to_string())),
        ("lease_counter".to_string(), AttributeValue::N("1".into())),
        ("checkpoint".to_string(), AttributeValue::S("TRIM_HORIZON".into())),
    ]);
    if let Some(owner) = owner {
        item.insert("lease_owner".into(), AttributeValue::S(owner.into()));
        item.insert("lease_expiry".into(), AttributeValue::N(expiry_ms.to_string()));
    }
    if let Some(lag) = lag_ms {
        item.insert("lag_ms".into(), AttributeValue::N(lag.to_string()));
    }
    dynamodb.put_item().table_name(table).set_item(Some(item)).send().await.expect("put lease row");
}

async fn status(ns: &TestNamespace, name: &str) -> StreamConsumerStatus {
    ns.consumers().get(name).await.ok().and_then(|c| c.status).unwrap_or_default()
}

async fn table_ready(ns: &TestNamespace, name: &str) {
    wait("TableReady", SLOW, async || ns.condition(name, "TableReady").await.is_some_and(|c| c.0 == "True")).await;
}

fn key(stream: &str, shard: usize) -> String {
    format!("{stream}:shardId-{shard:012}")
}

#[tokio::test]
async fn status_printer_column_and_metrics_follow_the_lease_rows() {
    let ns = TestNamespace::new("lag-status").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-status", 3).await;
    let table = leasehold_testkit::unique_name("lag-status");
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"replicas": 2}, "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    table_ready(&ns, "orders").await;

    let live = now_ms() + HOUR_MS;
    write_row(&dynamodb, &table, &key(&stream, 0), Some("w1"), live, Some(1_500)).await;
    write_row(&dynamodb, &table, &key(&stream, 1), Some("w2"), live, Some(72_000)).await;
    // A free row's lag is nobody's current measure: the shard is unheld, its figure not trusted.
    write_row(&dynamodb, &table, &key(&stream, 2), None, 0, Some(900_000)).await;
    wait("status.lag from the rows", SLOW, async || {
        let lag = status(&ns, "orders").await.lag;
        lag.is_some_and(|l| l.largest.as_deref() == Some("1m12s") && l.unheld_shards == 1)
    })
    .await;
    let lag = status(&ns, "orders").await.lag.expect("lag");
    assert_eq!(lag.largest_ms, Some(72_000));
    assert_eq!(lag.slowest_shard, Some(key(&stream, 1)));
    let age = now_ms() - lag.read_at.0.as_millisecond();
    assert!((0..30_000).contains(&age), "read {age} ms ago");

    // kubectl get scon answers the question.
    let kubeconfig = support::kubeconfig_path();
    let table_text = run(std::process::Command::new(k8s_tool("kubectl"))
        .env("KUBECONFIG", &kubeconfig)
        .args(["get", "scon", "-n", &ns.name]));
    let header = table_text.lines().next().unwrap_or_default();
    let row = table_text.lines().find(|l| l.starts_with("orders")).unwrap_or_default();
    let columns: Vec<&str> = header.split_whitespace().collect();
    let at = columns.iter().position(|c| *c == "LAG").unwrap_or_else(|| panic!("no LAG column: {table_text}"));
    assert_eq!(row.split_whitespace().nth(at), Some("1m12s"), "{table_text}");

    let metrics = ns.ctx.metrics.text();
    let consumer = format!(r#"namespace="{}",name="orders""#, ns.name);
    for line in [
        format!("leasehold_consumer_lag_seconds{{{consumer}}} 72.0"),
        format!(r#"leasehold_consumer_shard_lag_seconds{{{consumer},shard="{}"}} 1.5"#, key(&stream, 0)),
        format!("leasehold_consumer_unheld_shards{{{consumer}}} 1"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line} in\n{metrics}");
    }

    // The slow shard catches up and its neighbour's holder dies: the status and the series follow.
    write_row(&dynamodb, &table, &key(&stream, 1), Some("w2"), live, Some(2_000)).await;
    write_row(&dynamodb, &table, &key(&stream, 0), Some("w1"), now_ms() - HOUR_MS, Some(1_500)).await;
    wait("status.lag follows", SLOW, async || {
        let lag = status(&ns, "orders").await.lag;
        lag.is_some_and(|l| l.largest.as_deref() == Some("2s") && l.unheld_shards == 2)
    })
    .await;
    let metrics = ns.ctx.metrics.text();
    assert!(!metrics.contains(&key(&stream, 0)), "the dead holder's shard lost its series:\n{metrics}");
    assert!(metrics.lines().any(|l| l == format!("leasehold_consumer_unheld_shards{{{consumer}}} 2")), "{metrics}");
    assert!(
        ns.condition("orders", "LagScaling").await.is_none(),
        "no LagScaling condition without workers.autoscaling.lag"
    );
}

/// Replicas of the worker Deployment, sampled every 100 ms until `until` holds or `timeout` passes: the
/// distinct values in the order seen.
async fn replicas_seen(ns: &TestNamespace, name: &str, timeout: Duration, until: impl Fn(i32) -> bool) -> Vec<i32> {
    let started = Instant::now();
    let mut seen: Vec<i32> = Vec::new();
    while started.elapsed() < timeout {
        if let Some(now) = ns.replicas(name).await {
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            if until(now) {
                return seen;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out after {timeout:?}; replicas seen {seen:?}");
}

#[tokio::test]
async fn lag_autoscaling_steps_up_says_when_it_cannot_help_and_falls_back_after_the_window() {
    let ns = TestNamespace::new("lag-scale").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-scale", 4).await;
    let table = leasehold_testkit::unique_name("lag-scale");
    // Four shards per worker: the shard-count rule asks for one worker; lag may add up to three.
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 4, "minReplicas": 1, "maxReplicas": 10,
                           "lag": {"target": "5s", "scaleUpAfter": "2s", "scaleDownAfter": "8s"}}},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    table_ready(&ns, "orders").await;
    wait("one worker by shard count", SLOW, async || ns.replicas("orders-workers").await == Some(1)).await;

    // A slow processor: every shard 20 s behind.
    let live = now_ms() + HOUR_MS;
    for shard in 0..4 {
        write_row(&dynamodb, &table, &key(&stream, shard), Some("w1"), live, Some(20_000)).await;
    }
    let rising = Instant::now();
    let seen = replicas_seen(&ns, "orders-workers", SLOW * 2, |r| r == 4).await;
    assert_eq!(seen, [1, 2, 3, 4], "one step at a time, up to the open shards");
    // Three steps, each after the lag stayed above target for scaleUpAfter (2 s) since the last.
    assert!(rising.elapsed() >= Duration::from_secs(6), "three steps in {:?}", rising.elapsed());
    wait("LagScaling False: one shard per worker", SLOW, async || {
        ns.condition("orders", "LagScaling").await == Some(("False".into(), "OneShardPerWorker".into()))
    })
    .await;
    let scaling = status(&ns, "orders").await.lag_scaling.expect("lagScaling state");
    assert_eq!(scaling.extra_replicas, 3);
    // Steady above target at the ceiling: nothing more moves.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(ns.replicas("orders-workers").await, Some(4));

    let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name);
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes.iter().filter(|n| n.contains("above target 5s")).count() >= 3,
        "an Event per step saying why: {notes:?}"
    );

    // The lag drains: under half the target (2.5 s). The workers stay for scaleDownAfter, then go at once.
    for shard in 0..4 {
        write_row(&dynamodb, &table, &key(&stream, shard), Some("w1"), live, Some(300)).await;
    }
    let drained = Instant::now();
    let seen = replicas_seen(&ns, "orders-workers", SLOW * 2, |r| r == 1).await;
    assert_eq!(seen, [4, 1], "back to the shard-count rule in one change");
    // The window is 8 s from the first read under half the target; reads come every second.
    assert!(drained.elapsed() >= Duration::from_secs(7), "fell after {:?}", drained.elapsed());
    wait("LagScaling True again", SLOW, async || {
        ns.condition("orders", "LagScaling").await.is_some_and(|c| c.0 == "True")
    })
    .await;
}

#[tokio::test]
async fn without_lag_settings_nothing_scales_on_lag() {
    let ns = TestNamespace::new("lag-off").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-off", 4).await;
    let table = leasehold_testkit::unique_name("lag-off");
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 4, "minReplicas": 1, "maxReplicas": 10}},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    table_ready(&ns, "orders").await;
    let live = now_ms() + HOUR_MS;
    for shard in 0..4 {
        write_row(&dynamodb, &table, &key(&stream, shard), Some("w1"), live, Some(600_000)).await;
    }
    wait("the lag is read", SLOW, async || {
        status(&ns, "orders").await.lag.is_some_and(|l| l.largest.as_deref() == Some("10m"))
    })
    .await;
    // Many reconciles (one a second) with a lag far above any target: the shard-count rule alone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(ns.replicas("orders-workers").await, Some(1));
    let status = status(&ns, "orders").await;
    assert_eq!(status.replicas, Some(1));
    assert!(status.lag_scaling.is_none(), "no lag scaling state: {:?}", status.lag_scaling);
    assert!(status.conditions.iter().all(|c| c.type_ != "LagScaling"));
}

/// Sets `lag_ms` on every shard row of `table`, leaving what the holders' conditions check alone.
async fn set_lag(dynamodb: &aws_sdk_dynamodb::Client, table: &str, lag_ms: u64) {
    let Ok(scan) = dynamodb.scan().table_name(table).consistent_read(true).send().await else { return };
    for item in scan.items() {
        let Some(key) = item.get("lease_key").and_then(|k| k.as_s().ok()) else { continue };
        if key.starts_with('#') {
            continue;
        }
        let _ = dynamodb
            .update_item()
            .table_name(table)
            .key("lease_key", AttributeValue::S(key.clone()))
            .update_expression("SET lag_ms = :lag")
            .condition_expression("attribute_exists(lease_key)")
            .expression_attribute_values(":lag", AttributeValue::N(lag_ms.to_string()))
            .send()
            .await;
    }
}

/// With real workers (the stand-in kubelet runs the pods as processes): a lag above target adds a worker
/// that takes leases, the lag draining takes it away after the window, and every record is processed
/// exactly once across both changes (no process fails; scaling down is a SIGTERM, which hands over).
/// The lag is written into the rows by the test, as a slow processor's holder would write it (rewritten
/// every 200 ms over the holders' own measure, which is near 0 here): this pins the operator's side at a
/// known lag. [`a_slow_processors_own_lag_adds_workers_step_by_step_and_they_go_once_it_drains`] runs the
/// same loop with the lag produced by slow processing and measured by the workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_scaling_with_real_workers_processes_every_record_once() {
    use leasehold_testkit::kinesis::{numbered, put_records};
    use support::kubelet::Kubelet;

    let ns = TestNamespace::new("lag-workers").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let dynamodb = leasehold_testkit::dynamodb_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-workers", 2).await;
    let table = leasehold_testkit::unique_name("lag-workers");
    let kubelet = Kubelet::start(ns.client.clone(), &ns.name, "app.kubernetes.io/name=leasehold-worker");
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 2, "minReplicas": 1, "maxReplicas": 2,
                           "lag": {"target": "5s", "scaleUpAfter": "1s", "scaleDownAfter": "3s"}}},
               "startPosition": "TRIM_HORIZON",
               "lease": {"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create consumer");
    let held = |kubelet: &Kubelet| -> Vec<usize> {
        let running = kubelet.running.lock().expect("running");
        running.values().map(|w| w.held_shards().len()).collect()
    };
    wait("one worker holding both shards", SLOW, async || held(&kubelet) == [2]).await;
    let first: Vec<_> = (0..20).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &first).await;

    let writer = {
        let (dynamodb, table) = (dynamodb.clone(), table.clone());
        tokio::spawn(async move {
            loop {
                set_lag(&dynamodb, &table, 30_000).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    wait("a second worker holding a shard", SLOW, async || {
        let mut counts = held(&kubelet);
        counts.sort();
        counts == [1, 1]
    })
    .await;
    writer.abort();
    let second: Vec<_> = (20..40).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &second).await;
    set_lag(&dynamodb, &table, 0).await;
    wait("back to one worker holding both shards", SLOW, async || {
        ns.replicas("orders-workers").await == Some(1) && held(&kubelet) == [2]
    })
    .await;
    let third: Vec<_> = (40..60).flat_map(|n| (0..10).map(move |k| numbered(&format!("key-{k}"), n))).collect();
    put_records(&kinesis, &stream, &third).await;

    let expected = first.len() + second.len() + third.len();
    let deliveries = || {
        let running = kubelet.running.lock().expect("running");
        let finished = kubelet.finished.lock().expect("finished");
        running.values().chain(finished.iter()).flat_map(|w| w.deliveries()).map(|d| d.data).collect::<Vec<String>>()
    };
    wait("every record processed", SLOW, async || deliveries().len() >= expected).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = deliveries();
    let unique: std::collections::HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), expected, "every record processed");
    assert_eq!(all.len(), expected, "no record processed twice");
}

/// The receiving end of the http processor, modelling a downstream whose capacity is per worker: each
/// worker process gets one record through at a time, each taking the current delay, so a worker
/// processes at most one record per delay whatever shards it holds, and more workers genuinely
/// process more. The http processor sends nothing naming the worker (its headers are the CloudEvent's:
/// shard, sequence number, partition key), so the sink finds the sender the way the kernel knows it:
/// the worker process holding the client end of the connection (see [`socket_owner`]).
struct PerWorkerSink {
    delay_ms: std::sync::atomic::AtomicU64,
    /// One turn per worker process (by pid): a worker's records wait for each other here.
    turns: std::sync::Mutex<HashMap<u32, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    /// Every record processed: the sending worker's pid and the record's data, in the order done.
    processed: std::sync::Mutex<Vec<(u32, String)>>,
    /// Requests on connections no worker process of this test could be found for; they are served
    /// under one shared turn, and the test requires none.
    unattributed: std::sync::atomic::AtomicUsize,
}

/// The worker process at the client end of one connection to the [`PerWorkerSink`], found once when
/// the connection is accepted.
#[derive(Clone, Debug)]
struct SinkPeer {
    worker_pid: Option<u32>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tokio::net::TcpListener>> for SinkPeer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        let server_port = stream.io().local_addr().map(|a| a.port()).ok();
        let worker_pid = server_port.and_then(|server| socket_owner(stream.remote_addr().port(), server));
        Self { worker_pid }
    }
}

/// The child process of this test holding the client end of the loopback TCP connection from
/// `client_port` to `server_port`: the socket's inode from `/proc/net/tcp`, then the child with a
/// descriptor on that socket. The workers are this process's children (the stand-in kubelet spawns them).
fn socket_owner(client_port: u16, server_port: u16) -> Option<u32> {
    let port = |address: &str| address.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let sockets = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = sockets.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        (port(local)? == client_port && port(remote)? == server_port).then(|| inode.to_string())
    })?;
    let socket = format!("socket:[{inode}]");
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name in parentheses: the state, then the parent's pid.
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let holds_socket = |pid: u32| {
        let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
        descriptors
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == socket.as_str()))
    };
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(me))
        .find(|pid| holds_socket(*pid))
}

impl PerWorkerSink {
    /// Starts the sink on a free loopback port, records taking `delay` each; returns it and its URL.
    async fn start(delay: Duration) -> (std::sync::Arc<Self>, String) {
        let sink = std::sync::Arc::new(Self {
            delay_ms: std::sync::atomic::AtomicU64::new(u64::try_from(delay.as_millis()).expect("delay")),
            turns: Default::default(),
            processed: Default::default(),
            unattributed: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the sink");
        let url = format!("http://{}/", listener.local_addr().expect("sink address"));
        let app = axum::Router::new().route("/", axum::routing::post(Self::receive)).with_state(sink.clone());
        tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<SinkPeer>()).await.expect("sink serves");
        });
        (sink, url)
    }

    async fn receive(
        axum::extract::State(sink): axum::extract::State<std::sync::Arc<Self>>,
        axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SinkPeer>,
        body: axum::body::Bytes,
    ) -> axum::http::StatusCode {
        use std::sync::atomic::Ordering::Relaxed;
        let worker = peer.worker_pid.unwrap_or_else(|| {
            sink.unattributed.fetch_add(1, Relaxed);
            0
        });
        let turn = sink.turns.lock().expect("turns").entry(worker).or_default().clone();
        let _one_at_a_time = turn.lock().await;
        tokio::time::sleep(Duration::from_millis(sink.delay_ms.load(Relaxed))).await;
        sink.processed.lock().expect("processed").push((worker, String::from_utf8_lossy(&body).into_owned()));
        axum::http::StatusCode::OK
    }

    fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).expect("delay");
        self.delay_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn processed(&self) -> Vec<(u32, String)> {
        self.processed.lock().expect("processed").clone()
    }
}

/// One look at a consumer whose lag is moving: the worker Deployment's replicas, the largest lag in
/// the status and the `LagScaling` condition, `at` after the phase began.
#[derive(Debug)]
struct Sample {
    at: Duration,
    replicas: Option<i32>,
    lag_ms: Option<i64>,
    lag_scaling: Option<(String, String)>,
}

/// Samples consumer `name` (and its Deployment `<name>-workers`) every 100 ms until `until` holds for a
/// sample, or panics after `timeout` with what it saw.
async fn follow(ns: &TestNamespace, name: &str, timeout: Duration, until: impl Fn(&Sample) -> bool) -> Vec<Sample> {
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < timeout {
        let replicas = ns.replicas(&format!("{name}-workers")).await;
        let status = status(ns, name).await;
        let lag_scaling =
            status.conditions.iter().find(|c| c.type_ == "LagScaling").map(|c| (c.status.clone(), c.reason.clone()));
        let sample =
            Sample { at: started.elapsed(), replicas, lag_ms: status.lag.and_then(|l| l.largest_ms), lag_scaling };
        let done = until(&sample);
        samples.push(sample);
        if done {
            return samples;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "timed out after {timeout:?}; replicas seen {:?}, last sample {:?}",
        replica_steps(&samples),
        samples.last()
    );
}

/// The distinct replica counts of `samples` in the order seen, with when each was first seen.
fn replica_steps(samples: &[Sample]) -> Vec<(i32, Duration)> {
    let mut steps: Vec<(i32, Duration)> = Vec::new();
    for sample in samples {
        if let Some(replicas) = sample.replicas
            && steps.last().map(|s| s.0) != Some(replicas)
        {
            steps.push((replicas, sample.at));
        }
    }
    steps
}

/// Every value `spec.replicas` of the Deployment `name` takes, in order, with when the watch saw it. A
/// watch misses no write, where polling can: with a 1 s `scaleUpAfter` two steps come about a second
/// apart (0.18-0.6 s were seen while the operator's stamps in `status.lagScaling` lost their fraction of
/// a second to the API server, before it rounded them up), and a busy machine can stall a poll that long.
fn watch_replicas(ns: &TestNamespace, name: &str) -> std::sync::Arc<std::sync::Mutex<Vec<(Instant, i32)>>> {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let seen: std::sync::Arc<std::sync::Mutex<Vec<(Instant, i32)>>> = Default::default();
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (deployments, sink) = (ns.deployments(), seen.clone());
    tokio::spawn(async move {
        let mut changes = kube::runtime::watcher(deployments, config).applied_objects().boxed();
        while let Some(change) = changes.next().await {
            // A failed watch call is retried by the watcher itself; a value it missed meanwhile would
            // show as a jump and fail the test.
            let Some(replicas) = change.ok().and_then(|d| d.spec?.replicas) else { continue };
            let mut seen = sink.lock().expect("replicas seen");
            if seen.last().map(|(_, r)| *r) != Some(replicas) {
                seen.push((Instant::now(), replicas));
            }
        }
    });
    seen
}

/// The notes of the namespace's `Scaled` Events, oldest first, each after its time (the operator's
/// clock).
async fn scaled_events(ns: &TestNamespace) -> Vec<String> {
    let events = Api::<Event>::namespaced(ns.client.clone(), &ns.name);
    let mut scaled: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scaled"))
        .map(|e| (e.event_time.map(|t| t.0.to_string()).unwrap_or_default(), e.note.unwrap_or_default()))
        .collect();
    scaled.sort();
    scaled.into_iter().map(|(at, note)| format!("{at} {note}")).collect()
}

/// The whole loop with nothing injected: real workers (processes run by the stand-in kubelet) POST
/// every record to a [`PerWorkerSink`] that lets each worker through one record at a time. While it is
/// slow and a producer writes faster than even three workers keep up with, the lag the workers measure
/// and write into their own rows rises above target, and the operator adds workers one step at a time
/// up to `maxReplicas`, each taking shards from the busy one. Then the sink turns fast and the producer
/// stops: the backlog drains, the lag falls to 0, and after `scaleDownAfter` the extra workers go at
/// once. Every record put is processed exactly once throughout (scaling down is a SIGTERM, which hands
/// over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_processors_own_lag_adds_workers_step_by_step_and_they_go_once_it_drains() {
    use leasehold_testkit::kinesis::{numbered, put_records};
    use support::kubelet::Kubelet;

    // One worker gets 10 records/s through, three 30/s; the producer writes 40/s. With three workers
    // on four shards, the one holding two still reads each at 5/s against 10/s written: the lag keeps
    // rising until the sink turns fast.
    const SLOW_RECORD: Duration = Duration::from_millis(100);
    const PRODUCED_PER_TICK: u64 = 4;
    const TICK: Duration = Duration::from_millis(100);
    const TARGET_MS: i64 = 2_000;
    const SCALE_DOWN_AFTER: Duration = Duration::from_secs(3);

    let ns = TestNamespace::new("lag-slow").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "lag-slow", 4).await;
    let table = leasehold_testkit::unique_name("lag-slow");
    let (sink, url) = PerWorkerSink::start(SLOW_RECORD).await;
    let kubelet = Kubelet::start(ns.client.clone(), &ns.name, "app.kubernetes.io/name=leasehold-worker");
    let replicas = watch_replicas(&ns, "orders-workers");
    let replica_values = || replicas.lock().expect("replicas seen").iter().map(|(_, r)| *r).collect::<Vec<i32>>();
    ns.create(
        "orders",
        json!({"streams": [{"name": stream}], "aws": aws(), "leaseTable": {"name": table},
               "workers": {"autoscaling": {"shardsPerWorker": 4, "minReplicas": 1, "maxReplicas": 3,
                           "lag": {"target": "2s", "scaleUpAfter": "1s", "scaleDownAfter": "3s"}}},
               "startPosition": "TRIM_HORIZON",
               "lease": {"duration": "2s", "renewInterval": "500ms", "scanInterval": "250ms", "shardSyncInterval": "1s"},
               "processor": {"http": {"url": url}}}),
    )
    .await
    .expect("create consumer");
    let held = |kubelet: &Kubelet| -> Vec<usize> {
        let running = kubelet.running.lock().expect("running");
        let mut counts: Vec<usize> = running.values().map(|w| w.held_shards().len()).collect();
        counts.sort();
        counts
    };
    wait("one worker holding the four shards", SLOW, async || held(&kubelet) == [4]).await;

    let slow_from = Instant::now();
    let stop_producing = tokio_util::sync::CancellationToken::new();
    let producer = {
        let (kinesis, stream, stop) = (kinesis.clone(), stream.clone(), stop_producing.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut put = 0u64;
            while !stop.is_cancelled() {
                ticks.tick().await;
                // A key per record spreads them over the four shards.
                let batch: Vec<_> = (put..put + PRODUCED_PER_TICK).map(|n| numbered(&format!("k{n}"), n)).collect();
                put_records(&kinesis, &stream, &batch).await;
                put += PRODUCED_PER_TICK;
            }
            put
        })
    };

    // Slow: the lag the workers write rises past the target, and workers come one at a time.
    let rising = follow(&ns, "orders", SLOW * 2, |s| {
        s.replicas == Some(3) && s.lag_scaling == Some(("False".into(), "AtMaxReplicas".into()))
    })
    .await;
    let polled = replica_steps(&rising);
    let peak_ms = rising.iter().filter_map(|s| s.lag_ms).max().unwrap_or(0);
    let crossed = rising.iter().find(|s| s.lag_ms.is_some_and(|l| l > TARGET_MS)).map(|s| s.at);
    let watched: Vec<(f64, i32)> = replicas
        .lock()
        .expect("replicas seen")
        .iter()
        .map(|(at, r)| (at.saturating_duration_since(slow_from).as_secs_f64(), *r))
        .collect();
    eprintln!(
        "slow: replicas watched {watched:?} (s after producing began), polled {polled:?}, lag first above target \
         at {crossed:?}, peak lag {peak_ms} ms"
    );
    let scaled = scaled_events(&ns).await;
    assert_eq!(replica_values(), [1, 2, 3], "one step at a time: {watched:?}, Scaled Events {scaled:#?}");
    assert!(peak_ms > TARGET_MS, "the lag the workers wrote rose above the 2s target: peak {peak_ms} ms");
    let first_step = polled.get(1).map(|s| s.1).unwrap_or_default();
    assert!(crossed.is_some_and(|c| c <= first_step), "the lag was above target before the first step: {crossed:?}");
    // Each new worker took shards from the busy one: three workers share the four shards.
    wait("three workers sharing the shards", SLOW, async || held(&kubelet) == [1, 1, 2]).await;

    // Fast again, and nothing more written: the backlog drains, then the extra workers go at once.
    sink.set_delay(Duration::ZERO);
    stop_producing.cancel();
    let put = producer.await.expect("producer");
    let falling = follow(&ns, "orders", SLOW * 2, |s| s.replicas == Some(1)).await;
    let steps = replica_steps(&falling);
    let drained = falling.iter().find(|s| s.lag_ms.is_some_and(|l| l < TARGET_MS / 2)).map(|s| s.at);
    let fell = falling.last().map(|s| s.at).unwrap_or_default();
    eprintln!("drain: replicas {steps:?}, lag under half the target at {drained:?}, one worker at {fell:?}");
    assert_eq!(replica_values(), [1, 2, 3, 1], "back to the shard-count rule in one change: {steps:?}");
    assert!(drained.is_some_and(|d| d < fell), "the lag drained before the workers went: {drained:?}, {fell:?}");
    // The window starts at the operator's first read under half the target, after the sink turned fast.
    assert!(fell >= SCALE_DOWN_AFTER, "the workers went {fell:?} after the drain began, within the window");
    wait("the lag at 0 and one worker holding the four shards", SLOW, async || {
        status(&ns, "orders").await.lag.is_some_and(|l| l.largest_ms == Some(0)) && held(&kubelet) == [4]
    })
    .await;

    let expected = usize::try_from(put).expect("count");
    wait("every record processed", SLOW, async || sink.processed().len() >= expected).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let processed = sink.processed();
    let unique: std::collections::HashSet<&String> = processed.iter().map(|(_, data)| data).collect();
    let workers: std::collections::HashSet<u32> = processed.iter().map(|(pid, _)| *pid).collect();
    eprintln!(
        "{put} records put, {} processed, {} distinct, by {} worker processes",
        processed.len(),
        unique.len(),
        workers.len()
    );
    for event in scaled_events(&ns).await {
        eprintln!("Scaled: {event}");
    }
    assert_eq!(sink.unattributed.load(std::sync::atomic::Ordering::Relaxed), 0, "every request traced to its worker");
    assert!(workers.len() >= 3, "three workers processed records: {workers:?}");
    assert_eq!(unique.len(), expected, "every record processed");
    assert_eq!(processed.len(), expected, "no record processed twice");
}
