//! On the second Kinesis emulator (kinesis-mock, which has them): an on-demand stream named by ARN
//! shows its capacity mode in status, and autoscaling follows `UpdateShardCount` 2 -> 4 -> 2 (a stream
//! resharded without splits by hand, as on-demand streams and the console do).

mod support;

use std::time::Duration;

use aws_sdk_kinesis::types::{ScalingType, StreamMode, StreamModeDetails};
use serde_json::json;
use support::{TestNamespace, wait};

const SLOW: Duration = Duration::from_secs(60);

/// AWS settings reaching kinesis-mock for Kinesis and dynalite for DynamoDB.
fn mock_aws() -> serde_json::Value {
    let mut aws = support::aws();
    aws["kinesisEndpoint"] = json!(leasehold_testkit::endpoint(leasehold_testkit::Service::KinesisMock));
    aws
}

#[tokio::test]
async fn status_shows_the_capacity_mode_and_autoscaling_follows_update_shard_count() {
    let ns = TestNamespace::new("op-capacity").await;
    let kinesis = leasehold_testkit::kinesis_mock_client().await;
    let provisioned = leasehold_testkit::create_stream(&kinesis, "op-prov", 2).await;
    let on_demand = leasehold_testkit::unique_name("op-od");
    let mode = StreamModeDetails::builder().stream_mode(StreamMode::OnDemand).build().expect("mode");
    kinesis.create_stream().stream_name(&on_demand).stream_mode_details(mode).send().await.expect("create");
    leasehold_testkit::kinesis::wait_active(&kinesis, &on_demand).await;
    let summary = kinesis.describe_stream_summary().stream_name(&on_demand).send().await.expect("summary");
    let summary = summary.stream_description_summary.expect("summary");
    let (on_demand_arn, on_demand_shards) = (summary.stream_arn, summary.open_shard_count);
    ns.create(
        "capacity",
        json!({"streams": [{"name": provisioned}, {"arn": on_demand_arn}], "aws": mock_aws(),
               "leaseTable": {"name": leasehold_testkit::unique_name("op-capacity")},
               "workers": {"autoscaling": {"shardsPerWorker": 1, "minReplicas": 1, "maxReplicas": 50}},
               "processor": {"stdout": {}}}),
    )
    .await
    .expect("create");
    let capacity = || async {
        let status = ns.consumers().get("capacity").await.ok().and_then(|c| c.status).unwrap_or_default();
        let modes: Vec<(String, String, i32)> =
            status.capacity.into_iter().map(|c| (c.stream, c.mode, c.open_shards)).collect();
        modes
    };
    wait("both streams' capacity in status", SLOW, async || capacity().await.len() == 2).await;
    let modes = capacity().await;
    assert!(modes.contains(&(provisioned.clone(), "PROVISIONED".into(), 2)), "{modes:?}");
    assert!(modes.contains(&(on_demand.clone(), "ON_DEMAND".into(), on_demand_shards)), "{modes:?}");
    let expected = 2 + on_demand_shards;
    wait("one worker per open shard", SLOW, async || ns.replicas("capacity-workers").await == Some(expected)).await;
    let status = ns.consumers().get("capacity").await.expect("consumer").status.expect("status");
    let message =
        status.conditions.iter().find(|c| c.type_ == "StreamReady").map(|c| c.message.clone()).expect("StreamReady");
    assert!(message.contains(&format!("on demand: {on_demand}")), "{message}");

    for target in [4, 2] {
        kinesis
            .update_shard_count()
            .stream_name(&provisioned)
            .target_shard_count(target)
            .scaling_type(ScalingType::UniformScaling)
            .send()
            .await
            .expect("UpdateShardCount");
        leasehold_testkit::kinesis::wait_active(&kinesis, &provisioned).await;
        let replicas = target + on_demand_shards;
        wait(&format!("{replicas} workers after UpdateShardCount {target}"), SLOW, async || {
            ns.replicas("capacity-workers").await == Some(replicas)
        })
        .await;
    }
}
