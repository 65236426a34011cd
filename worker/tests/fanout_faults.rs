//! The faults of enhanced fan-out, each injected by the testkit's fan-out server under one worker
//! process: refused subscriptions (ResourceInUseException, LimitExceededException), subscriptions
//! ending at their lifetime, a silent (stalled) subscription, a cut connection, a shard whose
//! subscription cannot be re-established (given up), a handoff whose new holder is refused at first,
//! and a slow processor holding the event stream back. No process crashes: every record exactly
//! once. (The group, kill -9, SIGTERM and resharding under fan-out are the `fan_out` cases of
//! runtime_group.rs, runtime_failover.rs and runtime_scaling.rs.)

mod common;

use std::time::{Duration, Instant};

use common::fanout::*;
use common::*;
use leasehold_testkit::fanout::{FanOutControls, FanOutFault, FanOutServer};
use leasehold_testkit::process::{WorkerProcess, rss_mib, wait_for};

const SHARD0: &str = "shardId-000000000000";

/// One fan-out worker on a new stream of `shards` shards, reading from the oldest record.
async fn one_worker(
    server: &FanOutServer,
    prefix: &str,
    shards: i32,
    extra: &str,
) -> (aws_sdk_kinesis::Client, String, WorkerProcess) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, shards).await;
    let table = leasehold_testkit::unique_name(prefix);
    let config = fan_out_config(server, &stream, Some(&table), &format!("startPosition: TRIM_HORIZON\n{extra}"));
    let worker = spawn(&config, prefix);
    (kinesis, stream, worker)
}

/// Writes for `run`, then checks every record was processed exactly once and in key order.
async fn produce_and_check(kinesis: &aws_sdk_kinesis::Client, stream: &str, worker: &mut WorkerProcess, run: Duration) {
    let producer = Producer::start(kinesis.clone(), stream, 20, Duration::from_millis(50));
    tokio::time::sleep(run).await;
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&worker.deliveries()).len() >= written.len()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_exactly_once(&worker.deliveries(), &written);
    assert_per_key_order(&[worker]);
    assert_running(&mut [worker]);
}

/// The counter `name{reason="<reason>"}` of `worker`.
async fn by_reason(worker: &WorkerProcess, name: &str, reason: &str) -> f64 {
    metric(worker, &format!("leasehold_{name}_total{{reason=\"{reason}\"}}")).await
}

fn quick_resubscribe(controls: &FanOutControls) {
    // The service refuses a resubscription within 5 s of the last one; with lifetimes cut to seconds
    // that window is cut too, or every test would wait it out.
    controls.set_resubscribe_window(Duration::from_millis(300));
    controls.set_call_interval(Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_in_use_and_limit_exceeded_are_retried_with_backoff_and_counted() {
    let server = fan_out_server().await;
    let controls = server.controls();
    controls.fail_next_subscribes(None, FanOutFault::ResourceInUse, 3);
    controls.fail_next_subscribes(None, FanOutFault::LimitExceeded, 3);
    let (kinesis, stream, mut worker) = one_worker(&server, "foretry", 1, "").await;
    produce_and_check(&kinesis, &stream, &mut worker, Duration::from_secs(4)).await;
    assert!(by_reason(&worker, "fanout_subscribe_failures", "resource_in_use").await >= 3.0);
    assert!(by_reason(&worker, "fanout_subscribe_failures", "limit_exceeded").await >= 3.0);
    assert!(worker.stderr_text().contains("SubscribeToShard failed; retrying"), "logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_ending_at_their_lifetime_are_renewed_with_no_gap_and_no_repeat() {
    let server = fan_out_server().await;
    let controls = server.controls();
    controls.set_subscription_lifetime(Duration::from_secs(2));
    quick_resubscribe(&controls);
    let (kinesis, stream, mut worker) = one_worker(&server, "folife", 2, "").await;
    wait_for("both shards held", Duration::from_secs(30), async || worker.held_shards().len() == 2).await;
    produce_and_check(&kinesis, &stream, &mut worker, Duration::from_secs(9)).await;
    let started = controls.subscriptions_started(SHARD0);
    println!("{started} subscriptions of {SHARD0}");
    assert!(started >= 4, "a 2 s lifetime over ~10 s means several subscriptions, got {started}");
    assert!(by_reason(&worker, "fanout_subscriptions_replaced", "ended").await >= 6.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscription_is_dropped_after_the_idle_timeout_and_replaced_with_nothing_lost() {
    let server = fan_out_server().await;
    let controls = server.controls();
    quick_resubscribe(&controls);
    // The very first subscription never says anything.
    controls.stall_next_subscription(Some(SHARD0));
    let (kinesis, stream, mut worker) = one_worker(&server, "fostall", 1, "").await;
    let producer = Producer::start(kinesis.clone(), &stream, 20, Duration::from_millis(50));
    wait_for("records flow once the stalled first subscription is replaced", Duration::from_secs(30), async || {
        !worker.deliveries().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Mid-stream: the connection is cut and the subscription that replaces it stalls.
    controls.stall_next_subscription(Some(SHARD0));
    let cut_at = Instant::now();
    controls.drop_subscriptions(Some(SHARD0));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&worker.deliveries()).len() >= written.len()
    })
    .await;
    let resumed = worker.deliveries().into_iter().filter(|d| d.seen_at > cut_at).map(|d| d.seen_at).min();
    println!("records resumed {:?} after the cut", resumed.map(|at| at - cut_at));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_exactly_once(&worker.deliveries(), &written);
    assert_per_key_order(&[&worker]);
    assert!(by_reason(&worker, "fanout_subscriptions_replaced", "idle").await >= 2.0, "both stalls detected");
    assert!(by_reason(&worker, "fanout_subscriptions_replaced", "broken").await >= 1.0, "the cut detected");
    assert!(worker.stderr_text().contains("subscription dropped"), "logged");
    assert_running(&mut [&mut worker]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_and_exception_events_are_resubscribed_after_the_last_event() {
    let server = fan_out_server().await;
    let controls = server.controls();
    quick_resubscribe(&controls);
    let (kinesis, stream, mut worker) = one_worker(&server, "fodrop", 2, "").await;
    wait_for("both shards held", Duration::from_secs(30), async || worker.held_shards().len() == 2).await;
    let producer = Producer::start(kinesis.clone(), &stream, 20, Duration::from_millis(50));
    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        wait_for("both shards subscribed", Duration::from_secs(20), async || controls.open_subscriptions() == 2).await;
        if round % 2 == 0 {
            controls.drop_subscriptions(None);
        } else {
            controls.fail_open_subscriptions(None, FanOutFault::InternalFailure);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = producer.stop().await;
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&worker.deliveries()).len() >= written.len()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_exactly_once(&worker.deliveries(), &written);
    assert_per_key_order(&[&worker]);
    assert!(by_reason(&worker, "fanout_subscriptions_replaced", "broken").await >= 8.0, "4 rounds x 2 shards");
    assert_running(&mut [&mut worker]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_subscription_cannot_be_reestablished_within_a_lease_is_released() {
    let server = fan_out_server().await;
    let controls = server.controls();
    // Refused for longer than a lease (6 s holds at most 6 attempts of 200 ms..2 s backoffs), then
    // accepted again by the reader of the shard taken anew.
    controls.fail_next_subscribes(Some(SHARD0), FanOutFault::ResourceInUse, 8);
    let (kinesis, stream, mut worker) = one_worker(&server, "fogiveup", 2, "").await;
    let shard = format!("{stream}:{SHARD0}");
    wait_for("the shard given up", Duration::from_secs(30), async || {
        worker.events("lease released").iter().any(|(_, s)| *s == shard)
    })
    .await;
    assert!(metric(&worker, "leasehold_fanout_shards_given_up_total").await >= 1.0);
    assert!(worker.stderr_text().contains("giving the shard up"), "logged");
    // The shard is taken again once free, and read once subscriptions are accepted.
    produce_and_check(&kinesis, &stream, &mut worker, Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_handoff_refused_with_resource_in_use_at_first_repeats_nothing() {
    let server = fan_out_server().await;
    let controls = server.controls();
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "foterm", 4).await;
    let table = leasehold_testkit::unique_name("foterm");
    let config = fan_out_config(&server, &stream, Some(&table), "startPosition: TRIM_HORIZON\n");
    let [mut leaver, mut stayer] = [spawn(&config, "foterm-a"), spawn(&config, "foterm-b")];
    wait_for("balanced", Duration::from_secs(40), async || {
        leaver.held_shards().len() == 2 && stayer.held_shards().len() == 2
    })
    .await;
    let producer = Producer::start(kinesis.clone(), &stream, 20, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // As the service answers while the previous holder's subscription is open or younger than 5 s.
    let moving = leaver.held_shards();
    for shard in &moving {
        controls.fail_next_subscribes(shard.rsplit(':').next(), FanOutFault::ResourceInUse, 2);
    }
    leaver.signal("TERM");
    let status = leaver.wait_exit(Duration::from_secs(10)).expect("leaver exits");
    assert!(status.success(), "graceful exit: {status:?}\n{}", leaver.stderr_text());
    wait_for("stayer holds every shard", Duration::from_secs(15), async || stayer.held_shards().len() == 4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = producer.stop().await;
    let both = [&leaver, &stayer];
    wait_for("every record delivered", Duration::from_secs(60), async || {
        distinct(&all_deliveries(&both)).len() >= written.len()
    })
    .await;
    let deliveries = all_deliveries(&both);
    assert_exactly_once(&deliveries, &written);
    assert_eq!(check_handovers(&deliveries), 0);
    let refused = by_reason(&stayer, "fanout_subscribe_failures", "resource_in_use").await;
    assert!(refused >= 2.0 * moving.len() as f64, "every refusal counted, {refused}");
    assert_running(&mut [&mut stayer]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_processor_holds_the_event_stream_back_instead_of_buffering_it() {
    let server = fan_out_server().await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "foslow", 1).await;
    // A 20 MB backlog of 2 KB records, far more than one event (1000 records) and the window.
    let backlog: Vec<(String, Vec<u8>)> = records(100, 0, 100)
        .into_iter()
        .map(|(key, mut data)| {
            data.resize(2048, b'x');
            (key, data)
        })
        .collect();
    for chunk in backlog.chunks(400) {
        leasehold_testkit::kinesis::put_records(&kinesis, &stream, chunk).await;
    }
    // An http processor taking 20 ms per record: about 50 records/s.
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            "ok"
        }),
    );
    let sink = leasehold_testkit::server::LocalServer::start(app).await;
    let table = leasehold_testkit::unique_name("foslow");
    let config = fan_out_config(&server, &stream, Some(&table), "startPosition: TRIM_HORIZON\n")
        .replace("processor: {stdout: {}}", &format!("processor: {{http: {{url: '{}/'}}}}", sink.endpoint()));
    let mut worker = spawn(&config, "foslow");
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric_or_zero(&worker, "leasehold_records_processed_total").await == 0.0 {
        assert!(Instant::now() < deadline, "no record processed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let at_first = rss_mib(worker.pid());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let later = rss_mib(worker.pid());
    let processed = metric(&worker, "leasehold_records_processed_total").await;
    println!(
        "RSS {at_first:.1} MiB at the first record, {later:.1} MiB 10 s later; {processed} of {} processed",
        backlog.len()
    );
    assert!(processed < backlog.len() as f64 / 2.0, "the processor is the bottleneck");
    assert!(
        later - at_first < 16.0,
        "memory grew {:.1} MiB while 40 MB waited: the stream was not held back",
        later - at_first
    );
    assert_running(&mut [&mut worker]);
}
