//! The fan-out test server against the SDK as the worker uses it: aws-sdk-kinesis pointed at the server
//! for everything, kinesalite behind it.

use std::time::{Duration, Instant};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::operation::subscribe_to_shard::{SubscribeToShardError, SubscribeToShardOutput};
use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError;
use aws_sdk_kinesis::types::{
    ConsumerStatus, ShardIteratorType, StartingPosition, SubscribeToShardEvent, SubscribeToShardEventStream,
};
use leasehold_testkit::fanout::{FanOutControls, FanOutFault, FanOutServer};
use leasehold_testkit::kinesis::{numbered, put_records, split};
use leasehold_testkit::process::wait_for;
use leasehold_testkit::{Service, endpoint, unique_name};

/// How long the server's state may take to follow a client's move.
const WAIT: Duration = Duration::from_secs(5);

/// A fan-out server over kinesalite, a client for it and one fresh stream.
struct Ground {
    _server: FanOutServer,
    controls: FanOutControls,
    client: Client,
    stream: String,
    stream_arn: String,
}

/// A client configured as worker/src/aws/config.rs does, with `attempts` attempts per call (the
/// rule tests take 1, to see each answer the server gives).
async fn client_for(endpoint: String, attempts: u32) -> Client {
    let sdk = leasehold_testkit::sdk_config(endpoint).await;
    let config = aws_sdk_kinesis::config::Builder::from(&sdk)
        .retry_config(RetryConfig::standard().with_max_attempts(attempts))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(3))
                .build(),
        )
        .build();
    Client::from_conf(config)
}

async fn ground(shards: i32, attempts: u32) -> Ground {
    let server = FanOutServer::start(&endpoint(Service::Kinesis)).await.expect("start the fan-out server");
    let client = client_for(server.endpoint(), attempts).await;
    // Created through the server: CreateStream is forwarded to kinesalite.
    let stream = leasehold_testkit::create_stream(&client, "fanout", shards).await;
    let summary = client.describe_stream_summary().stream_name(&stream).send().await.expect("summary");
    let stream_arn = summary.stream_description_summary.expect("summary").stream_arn;
    Ground { controls: server.controls(), _server: server, client, stream, stream_arn }
}

impl Ground {
    /// Registers `name` on the stream and waits until it is ACTIVE; its ARN.
    async fn consumer(&self, name: &str) -> String {
        let registered =
            self.client.register_stream_consumer().stream_arn(&self.stream_arn).consumer_name(name).send().await;
        let consumer = registered.expect("register").consumer.expect("consumer");
        assert_eq!(consumer.consumer_status, ConsumerStatus::Creating);
        let arn = consumer.consumer_arn;
        for _ in 0..100 {
            let described = self.client.describe_stream_consumer().consumer_arn(&arn).send().await.expect("describe");
            if described.consumer_description.expect("description").consumer_status == ConsumerStatus::Active {
                return arn;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("consumer {arn} not ACTIVE within 5 s");
    }

    async fn subscribe(
        &self,
        consumer: &str,
        shard: &str,
        position: StartingPosition,
    ) -> Result<SubscribeToShardOutput, SdkError<SubscribeToShardError, aws_sdk_kinesis::config::http::HttpResponse>>
    {
        self.client.subscribe_to_shard().consumer_arn(consumer).shard_id(shard).starting_position(position).send().await
    }

    async fn put(&self, key: &str, range: std::ops::Range<u64>) {
        let records: Vec<_> = range.map(|n| numbered(key, n)).collect();
        put_records(&self.client, &self.stream, &records).await;
    }
}

const SHARD0: &str = "shardId-000000000000";

fn position(kind: ShardIteratorType, sequence: Option<&str>) -> StartingPosition {
    StartingPosition::builder()
        .r#type(kind)
        .set_sequence_number(sequence.map(str::to_string))
        .build()
        .expect("position")
}

type EventResult = Result<Option<SubscribeToShardEvent>, String>;

/// The next event within `wait`: `Err` for a stream error, `Ok(None)` for the end of the stream; panics
/// when nothing comes.
async fn next_event(output: &mut SubscribeToShardOutput, wait: Duration) -> EventResult {
    match tokio::time::timeout(wait, output.event_stream.recv()).await.expect("an event or an end in time") {
        Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(event))) => Ok(Some(event)),
        Ok(Some(other)) => Err(format!("unexpected event {other:?}")),
        Ok(None) => Ok(None),
        Err(e) => Err(e.into_service_error_or_debug()),
    }
}

trait ServiceErrorOrDebug {
    fn into_service_error_or_debug(self) -> String;
}

impl<R: std::fmt::Debug> ServiceErrorOrDebug for SdkError<SubscribeToShardEventStreamError, R> {
    fn into_service_error_or_debug(self) -> String {
        match self {
            SdkError::ServiceError(e) => format!("service: {:?}", e.err()),
            other => format!("transport: {other:?}"),
        }
    }
}

/// Reads events until `count` records came (or the stream ends); the records' data and the last
/// continuation.
async fn read_records(output: &mut SubscribeToShardOutput, count: usize) -> (Vec<String>, Option<String>) {
    let mut data = Vec::new();
    let mut continuation = None;
    while data.len() < count {
        match next_event(output, Duration::from_secs(10)).await.expect("no stream error") {
            Some(event) => {
                data.extend(event.records.iter().map(|r| String::from_utf8_lossy(r.data.as_ref()).into_owned()));
                continuation = Some(event.continuation_sequence_number);
            }
            None => break,
        }
    }
    (data, continuation)
}

fn expected(key: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|n| format!("{key}:{n}")).collect()
}

fn error_code(error: &SdkError<SubscribeToShardError, aws_sdk_kinesis::config::http::HttpResponse>) -> String {
    match error {
        SdkError::ServiceError(e) => match e.err() {
            SubscribeToShardError::ResourceInUseException(_) => "ResourceInUseException".into(),
            SubscribeToShardError::LimitExceededException(_) => "LimitExceededException".into(),
            SubscribeToShardError::ResourceNotFoundException(_) => "ResourceNotFoundException".into(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn records_arrive_in_order_soon_after_a_put() {
    // Three attempts per call, exactly as the worker's client.
    let ground = ground(1, 3).await;
    let consumer = ground.consumer(&unique_name("c")).await;
    let mut output = ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::Latest, None)).await.expect("sub");
    ground.put("k", 0..200).await;
    let (data, _) = read_records(&mut output, 200).await;
    assert_eq!(data, expected("k", 0..200), "every record once, in order");

    // One record at a time: put -> event through the server.
    let mut latencies = Vec::new();
    for n in 200..220 {
        let started = Instant::now();
        ground.put("k", n..n + 1).await;
        let (data, _) = read_records(&mut output, 1).await;
        latencies.push(started.elapsed());
        assert_eq!(data, expected("k", n..n + 1));
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    eprintln!("put -> event through the fan-out server: p50 {p50:?}, max {:?}", latencies.last());
    assert!(p50 < Duration::from_millis(100), "p50 {p50:?}");
    assert_eq!(ground.controls.subscriptions_started(SHARD0), 1);
    assert_eq!(ground.controls.open_subscriptions(), 1);
    assert_eq!(ground.controls.registered_consumers(), vec![consumer.clone()]);
    assert!(consumer.starts_with(&format!("{}/consumer/", ground.stream_arn)), "{consumer}");
    drop(output);
    wait_for("the open subscriptions: 0", WAIT, async || ground.controls.open_subscriptions() == 0).await;
}

#[tokio::test]
async fn lifetime_end_and_continuation_resume_without_gap_or_repeat() {
    let ground = ground(1, 1).await;
    ground.controls.set_subscription_lifetime(Duration::from_millis(1500));
    ground.controls.set_resubscribe_window(Duration::from_millis(200));
    let consumer = ground.consumer(&unique_name("c")).await;

    // An empty shard, then records written between subscriptions: the continuation of a subscription
    // that saw no record still resumes exactly.
    let mut output =
        ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("sub");
    let started = Instant::now();
    let (data, mut continuation) = read_records(&mut output, usize::MAX).await;
    let lasted = started.elapsed();
    assert!(data.is_empty());
    assert!(lasted >= Duration::from_millis(1400) && lasted < Duration::from_secs(4), "lasted {lasted:?}");
    wait_for("the open subscriptions: 0", WAIT, async || ground.controls.open_subscriptions() == 0).await;

    let mut seen = Vec::new();
    let mut written = 0;
    for round in 0..3 {
        ground.put("k", written..written + 50).await;
        written += 50;
        let from = continuation.clone().expect("a continuation");
        let mut output = ground
            .subscribe(&consumer, SHARD0, position(ShardIteratorType::AfterSequenceNumber, Some(&from)))
            .await
            .expect("resubscribe");
        // Records also arrive while the subscription is open, until its lifetime ends it.
        let writer = {
            let client = ground.client.clone();
            let stream = ground.stream.clone();
            let range = written..written + 30;
            tokio::spawn(async move {
                let records: Vec<_> = range.map(|n| numbered("k", n)).collect();
                put_records(&client, &stream, &records).await;
            })
        };
        written += 30;
        let (data, next) = read_records(&mut output, usize::MAX).await;
        writer.await.expect("writer");
        eprintln!("round {round}: {} records", data.len());
        seen.extend(data);
        continuation = next;
    }
    // What the last subscription may not have had time to see comes with one more.
    let mut output = ground
        .subscribe(
            &consumer,
            SHARD0,
            position(ShardIteratorType::AfterSequenceNumber, Some(&continuation.expect("continuation"))),
        )
        .await
        .expect("last");
    let (rest, _) = read_records(&mut output, written as usize - seen.len()).await;
    seen.extend(rest);
    assert_eq!(seen, expected("k", 0..written), "no gap, no repeat across four subscriptions");
    assert_eq!(ground.controls.subscriptions_started(SHARD0), 5);
}

#[tokio::test]
async fn latest_with_no_record_yet_resumes_at_the_same_place() {
    let ground = ground(1, 1).await;
    ground.controls.set_subscription_lifetime(Duration::from_millis(800));
    ground.controls.set_resubscribe_window(Duration::ZERO);
    ground.controls.set_call_interval(Duration::ZERO);
    let consumer = ground.consumer(&unique_name("c")).await;
    ground.put("old", 0..10).await;
    let mut output = ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::Latest, None)).await.expect("sub");
    let (data, continuation) = read_records(&mut output, usize::MAX).await;
    assert!(data.is_empty());
    ground.put("new", 0..10).await;
    let from = continuation.expect("continuation");
    let mut output = ground
        .subscribe(&consumer, SHARD0, position(ShardIteratorType::AfterSequenceNumber, Some(&from)))
        .await
        .expect("resubscribe");
    let (data, _) = read_records(&mut output, 10).await;
    assert_eq!(data, expected("new", 0..10), "neither the old records nor a gap");
}

#[tokio::test]
async fn the_services_subscription_rules() {
    let ground = ground(2, 1).await;
    ground.controls.set_resubscribe_window(Duration::from_secs(2));
    let consumer = ground.consumer(&unique_name("c")).await;
    let latest = || position(ShardIteratorType::Latest, None);
    let first = ground.subscribe(&consumer, SHARD0, latest()).await.expect("first");
    // A second call within a second: throttled; after it, still in use while the first is open.
    let again = ground.subscribe(&consumer, SHARD0, latest()).await.expect_err("throttled");
    assert_eq!(error_code(&again), "LimitExceededException");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = ground.subscribe(&consumer, SHARD0, latest()).await.expect_err("in use");
    assert_eq!(error_code(&again), "ResourceInUseException");
    // Another shard, or another consumer, is not affected.
    let other_shard = ground.subscribe(&consumer, "shardId-000000000001", latest()).await.expect("other shard");
    let other_consumer = ground.consumer(&unique_name("c2")).await;
    let _other = ground.subscribe(&other_consumer, SHARD0, latest()).await.expect("other consumer");
    drop(other_shard);
    // Closed, but within the window of the first one's start: still in use; after it: accepted.
    drop(first);
    wait_for("the open subscriptions: 1", WAIT, async || ground.controls.open_subscriptions() == 1).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let early = ground.subscribe(&consumer, SHARD0, latest()).await;
    if let Err(e) = &early {
        assert_eq!(error_code(e), "ResourceInUseException");
        tokio::time::sleep(Duration::from_secs(2)).await;
        ground.subscribe(&consumer, SHARD0, latest()).await.expect("after the window");
    }
    // A consumer that does not exist, or is not ACTIVE yet.
    let missing = ground.subscribe(&format!("{consumer}x"), SHARD0, latest()).await.expect_err("missing");
    assert_eq!(error_code(&missing), "ResourceNotFoundException");
    let creating = ground
        .client
        .register_stream_consumer()
        .stream_arn(&ground.stream_arn)
        .consumer_name(unique_name("c3"))
        .send()
        .await
        .expect("register");
    let creating = creating.consumer.expect("consumer").consumer_arn;
    let refused = ground.subscribe(&creating, SHARD0, latest()).await.expect_err("creating");
    assert_eq!(error_code(&refused), "ResourceInUseException");
}

#[tokio::test]
async fn injected_subscribe_faults() {
    let ground = ground(2, 1).await;
    ground.controls.set_call_interval(Duration::ZERO);
    ground.controls.set_resubscribe_window(Duration::ZERO);
    let consumer = ground.consumer(&unique_name("c")).await;
    let latest = || position(ShardIteratorType::Latest, None);
    ground.controls.fail_next_subscribes(Some(SHARD0), FanOutFault::ResourceInUse, 2);
    ground.controls.fail_next_subscribes(None, FanOutFault::LimitExceeded, 1);
    // The other shard sees only the fault for any shard.
    let other = ground.subscribe(&consumer, "shardId-000000000001", latest()).await;
    assert_eq!(error_code(&other.expect_err("any shard")), "LimitExceededException");
    ground.controls.fail_next_subscribes(None, FanOutFault::LimitExceeded, 1);
    for _ in 0..2 {
        let failed = ground.subscribe(&consumer, SHARD0, latest()).await.expect_err("injected");
        assert_eq!(error_code(&failed), "ResourceInUseException");
    }
    let failed = ground.subscribe(&consumer, SHARD0, latest()).await.expect_err("injected");
    assert_eq!(error_code(&failed), "LimitExceededException");
    let _ok = ground.subscribe(&consumer, SHARD0, latest()).await.expect("faults used up");
    assert_eq!(ground.controls.subscriptions_started(SHARD0), 1);
}

#[tokio::test]
async fn a_stalled_subscription_says_nothing_and_stays_open() {
    let ground = ground(1, 1).await;
    ground.controls.set_resubscribe_window(Duration::ZERO);
    let consumer = ground.consumer(&unique_name("c")).await;
    ground.controls.stall_next_subscription(Some(SHARD0));
    let mut stalled =
        ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("stalled");
    ground.put("k", 0..5).await;
    let silent = tokio::time::timeout(Duration::from_secs(3), stalled.event_stream.recv()).await;
    assert!(silent.is_err(), "a stalled subscription delivered {silent:?}");
    assert_eq!(ground.controls.open_subscriptions(), 1);
    // Its replacement reads normally.
    drop(stalled);
    wait_for("the open subscriptions: 0", WAIT, async || ground.controls.open_subscriptions() == 0).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut output =
        ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("replacement");
    let (data, _) = read_records(&mut output, 5).await;
    assert_eq!(data, expected("k", 0..5));
}

#[tokio::test]
async fn dropped_and_failed_subscriptions_end_with_an_error() {
    let ground = ground(2, 1).await;
    let consumer = ground.consumer(&unique_name("c")).await;
    let horizon = || position(ShardIteratorType::TrimHorizon, None);
    let mut cut = ground.subscribe(&consumer, SHARD0, horizon()).await.expect("sub");
    let mut failed = ground.subscribe(&consumer, "shardId-000000000001", horizon()).await.expect("sub");
    // Both deliver their first (empty) event, then the faults.
    assert!(next_event(&mut cut, Duration::from_secs(3)).await.expect("event").is_some());
    assert!(next_event(&mut failed, Duration::from_secs(3)).await.expect("event").is_some());
    ground.controls.drop_subscriptions(Some(SHARD0));
    let error = next_event(&mut cut, Duration::from_secs(3)).await.expect_err("cut");
    assert!(error.starts_with("transport"), "{error}");
    ground.controls.fail_open_subscriptions(None, FanOutFault::InternalFailure);
    let error = next_event(&mut failed, Duration::from_secs(3)).await.expect_err("exception");
    assert!(error.contains("InternalFailureException"), "{error}");
    wait_for("the open subscriptions: 0", WAIT, async || ground.controls.open_subscriptions() == 0).await;
}

#[tokio::test]
async fn shard_end_after_a_split_gives_the_child_shards() {
    let ground = ground(1, 1).await;
    let consumer = ground.consumer(&unique_name("c")).await;
    ground.put("k", 0..20).await;
    split(&ground.client, &ground.stream, SHARD0).await;
    let mut output =
        ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("sub");
    let mut data = Vec::new();
    let children = loop {
        let event = next_event(&mut output, Duration::from_secs(5)).await.expect("event").expect("not ended yet");
        data.extend(event.records.iter().map(|r| String::from_utf8_lossy(r.data.as_ref()).into_owned()));
        if let Some(children) = event.child_shards {
            assert!(event.continuation_sequence_number.is_empty(), "no continuation at the shard's end");
            break children;
        }
    };
    assert_eq!(data, expected("k", 0..20));
    assert_eq!(children.len(), 2, "{children:?}");
    for child in &children {
        assert_eq!(child.parent_shards, vec![SHARD0.to_string()]);
        assert!(child.hash_key_range.is_some());
    }
    assert_eq!(next_event(&mut output, Duration::from_secs(3)).await, Ok(None), "the stream ends after it");
}

#[tokio::test]
async fn a_client_that_does_not_read_holds_the_server_back() {
    let ground = ground(1, 1).await;
    ground.controls.set_records_per_event(50);
    let consumer = ground.consumer(&unique_name("c")).await;
    // 12,000 records of 1 KiB: far more than the socket buffers of a loopback connection hold.
    let payload = "x".repeat(1024);
    let records: Vec<_> = (0..12_000u64).map(|n| ("k".to_string(), format!("k:{n}:{payload}").into_bytes())).collect();
    put_records(&ground.client, &ground.stream, &records).await;
    let mut output =
        ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("sub");
    // The pump pushes until the connection's buffers are full, then waits: the count stops growing.
    let started = Instant::now();
    let pushed = loop {
        let before = ground.controls.records_pushed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = ground.controls.records_pushed();
        if after == before && after > 0 {
            break after;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the pump never waited (pushed {after})");
    };
    eprintln!("pushed before the client read: {pushed} of {}", records.len());
    assert!(pushed < records.len() / 2, "pushed {pushed}");
    let mut count = 0;
    while count < records.len() {
        let event = next_event(&mut output, Duration::from_secs(10)).await.expect("event").expect("open");
        for record in event.records {
            let data = String::from_utf8_lossy(record.data.as_ref()).into_owned();
            assert!(data.starts_with(&format!("k:{count}:")), "record {count} out of order");
            count += 1;
        }
    }
}

#[tokio::test]
async fn other_calls_are_forwarded_to_kinesalite() {
    let ground = ground(2, 1).await;
    let direct = leasehold_testkit::kinesis_client().await;
    let through = ground.client.list_shards().stream_name(&ground.stream).send().await.expect("list through");
    let straight = direct.list_shards().stream_name(&ground.stream).send().await.expect("list direct");
    assert_eq!(through.shards, straight.shards);
    // kinesalite's own errors come back as they are.
    let missing = ground.client.describe_stream().stream_name(unique_name("missing")).send().await;
    let error = missing.expect_err("no such stream");
    assert!(error.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()), "{error:?}");
}

#[tokio::test]
async fn consumers_are_listed_and_deregistered() {
    let ground = ground(1, 1).await;
    let first = ground.consumer(&unique_name("a")).await;
    let second = ground.consumer(&unique_name("b")).await;
    let taken = ground
        .client
        .register_stream_consumer()
        .stream_arn(&ground.stream_arn)
        .consumer_name(first.rsplit('/').next().and_then(|n| n.split(':').next()).expect("name"))
        .send()
        .await;
    assert!(taken.expect_err("same name").as_service_error().is_some_and(|e| e.is_resource_in_use_exception()));
    let listed = ground.client.list_stream_consumers().stream_arn(&ground.stream_arn).send().await.expect("list");
    let arns: Vec<String> = listed.consumers.unwrap_or_default().into_iter().map(|c| c.consumer_arn).collect();
    assert_eq!(arns.len(), 2);
    assert!(arns.contains(&first) && arns.contains(&second));
    let mut open =
        ground.subscribe(&second, SHARD0, position(ShardIteratorType::Latest, None)).await.expect("subscribe");
    ground.client.deregister_stream_consumer().consumer_arn(&second).send().await.expect("deregister");
    let error = loop {
        match next_event(&mut open, Duration::from_secs(3)).await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert!(error.as_ref().is_err_and(|e| e.contains("ResourceNotFoundException")), "{error:?}");
    wait_for("the registered consumers", WAIT, async || ground.controls.registered_consumers() == vec![first.clone()])
        .await;
    let described = ground.client.describe_stream_consumer().consumer_arn(&second).send().await;
    let status = described.ok().and_then(|d| d.consumer_description).map(|d| d.consumer_status);
    assert!(matches!(status, None | Some(ConsumerStatus::Deleting)), "{status:?}");
}

#[tokio::test]
async fn a_later_call_takes_over_when_set_to() {
    let ground = ground(1, 1).await;
    ground.controls.set_takeover(true);
    ground.controls.set_resubscribe_window(Duration::from_millis(500));
    let consumer = ground.consumer(&unique_name("c")).await;
    let latest = || position(ShardIteratorType::Latest, None);
    let mut old = ground.subscribe(&consumer, SHARD0, latest()).await.expect("first");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut new = ground.subscribe(&consumer, SHARD0, latest()).await.expect("takes over");
    let ended = loop {
        match next_event(&mut old, Duration::from_secs(3)).await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert!(ended.as_ref().is_err_and(|e| e.contains("ResourceInUseException")), "{ended:?}");
    assert_eq!(ground.controls.open_subscriptions(), 1);
    ground.put("k", 0..5).await;
    let (data, _) = read_records(&mut new, 5).await;
    assert_eq!(data, expected("k", 0..5));
}

#[tokio::test]
async fn a_client_that_stopped_reading_loses_its_subscription_at_the_end_of_its_lifetime() {
    let ground = ground(1, 1).await;
    ground.controls.set_subscription_lifetime(Duration::from_millis(1500));
    ground.controls.set_resubscribe_window(Duration::ZERO);
    ground.controls.set_records_per_event(50);
    let consumer = ground.consumer(&unique_name("c")).await;
    let payload = "x".repeat(1024);
    let records: Vec<_> = (0..8_000u64).map(|n| ("k".to_string(), format!("k:{n}:{payload}").into_bytes())).collect();
    put_records(&ground.client, &ground.stream, &records).await;
    let stuck = ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("sub");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(ground.controls.open_subscriptions(), 1);
    assert!(ground.controls.records_pushed() < records.len(), "the client's buffers took everything");
    // Its connection still holds undelivered events, but for the service it is over.
    wait_for("the open subscriptions: 0", WAIT, async || ground.controls.open_subscriptions() == 0).await;
    ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::Latest, None)).await.expect("not in use");
    drop(stuck);
}

#[tokio::test]
async fn a_client_that_does_not_read_is_cut_too() {
    let ground = ground(1, 1).await;
    ground.controls.set_records_per_event(50);
    let consumer = ground.consumer(&unique_name("c")).await;
    let payload = "x".repeat(1024);
    let records: Vec<_> = (0..8_000u64).map(|n| ("k".to_string(), format!("k:{n}:{payload}").into_bytes())).collect();
    put_records(&ground.client, &ground.stream, &records).await;
    let mut stuck =
        ground.subscribe(&consumer, SHARD0, position(ShardIteratorType::TrimHorizon, None)).await.expect("sub");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    ground.controls.drop_subscriptions(None);
    wait_for("the open subscriptions: 0", WAIT, async || ground.controls.open_subscriptions() == 0).await;
    // What was already in the socket arrives, then a broken body.
    let mut delivered = 0;
    let error = loop {
        match next_event(&mut stuck, Duration::from_secs(5)).await {
            Ok(Some(event)) => delivered += event.records.len(),
            Ok(None) => panic!("a cut connection ended cleanly"),
            Err(e) => break e,
        }
    };
    assert!(error.starts_with("transport"), "{error}");
    assert!(delivered < records.len(), "delivered {delivered}");
}
