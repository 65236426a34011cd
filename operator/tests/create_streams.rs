//! `createIfMissing` with the operator, on the local control plane: missing streams (the consumed one,
//! the output and the dead-letter stream) are created with the shape asked for, on kinesalite
//! (`shards`) and kinesis-mock (`onDemand`), and the workers are created only once they are ACTIVE;
//! an existing stream of another shape is left as it is and reported in `StreamReady` (`ShapeDiffers`).

mod support;

use std::time::Duration;

use aws_sdk_kinesis::types::{StreamMode, StreamStatus};
use serde_json::json;
use support::{TestNamespace, wait};

const SLOW: Duration = Duration::from_secs(60);

/// (status, on demand, open shards) of `stream`, None while it does not exist.
async fn shape(client: &aws_sdk_kinesis::Client, stream: &str) -> Option<(StreamStatus, bool, i32)> {
    let summary = client.describe_stream_summary().stream_name(stream).send().await.ok()?.stream_description_summary?;
    let on_demand = summary.stream_mode_details.is_some_and(|m| m.stream_mode == StreamMode::OnDemand);
    Some((summary.stream_status, on_demand, summary.open_shard_count))
}

fn spec(
    aws: serde_json::Value,
    stream: &str,
    output: &str,
    dead: &str,
    create: serde_json::Value,
) -> serde_json::Value {
    json!({
        "streams": [{"name": stream, "createIfMissing": create}], "aws": aws,
        "leaseTable": {"name": leasehold_testkit::unique_name("op-create")},
        "workers": {"autoscaling": {"shardsPerWorker": 1, "minReplicas": 1, "maxReplicas": 10}},
        "processor": {"stdout": {}},
        "output": {"stream": output, "createIfMissing": create},
        "retry": {"onExhausted": "deadLetter", "deadLetterStream": dead, "deadLetterStreamCreateIfMissing": create}
    })
}

#[tokio::test]
async fn the_operator_creates_missing_streams_with_shards_on_kinesalite() {
    let ns = TestNamespace::new("op-create").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let (stream, output, dead) = (
        leasehold_testkit::unique_name("op-created"),
        leasehold_testkit::unique_name("op-created-out"),
        leasehold_testkit::unique_name("op-created-dlq"),
    );
    assert!(shape(&kinesis, &stream).await.is_none());
    ns.create("created", spec(support::aws(), &stream, &output, &dead, json!({"shards": 3}))).await.expect("create");
    wait("the stream created with 3 shards", SLOW, async || {
        shape(&kinesis, &stream).await == Some((StreamStatus::Active, false, 3))
    })
    .await;
    for other in [&output, &dead] {
        wait("the output and dead-letter streams created", SLOW, async || {
            shape(&kinesis, other).await == Some((StreamStatus::Active, false, 3))
        })
        .await;
    }
    wait("one worker per shard of the created stream", SLOW, async || ns.replicas("created-workers").await == Some(3))
        .await;
    wait("StreamReady", SLOW, async || {
        ns.condition("created", "StreamReady")
            .await
            .is_some_and(|(status, reason)| status == "True" && reason == "Found")
    })
    .await;
}

#[tokio::test]
async fn the_operator_creates_a_missing_on_demand_stream_on_kinesis_mock() {
    let ns = TestNamespace::new("op-create-od").await;
    let kinesis = leasehold_testkit::kinesis_mock_client().await;
    let mut aws = support::aws();
    aws["kinesisEndpoint"] = json!(leasehold_testkit::endpoint(leasehold_testkit::Service::KinesisMock));
    let (stream, output, dead) = (
        leasehold_testkit::unique_name("op-created-od"),
        leasehold_testkit::unique_name("op-created-od-out"),
        leasehold_testkit::unique_name("op-created-od-dlq"),
    );
    ns.create("created-od", spec(aws, &stream, &output, &dead, json!({"onDemand": true}))).await.expect("create");
    for name in [&stream, &output, &dead] {
        wait("each stream created on demand", SLOW, async || {
            shape(&kinesis, name)
                .await
                .is_some_and(|(status, on_demand, _)| status == StreamStatus::Active && on_demand)
        })
        .await;
    }
    let (_, _, shards) = shape(&kinesis, &stream).await.expect("created");
    wait("workers follow the on-demand stream's shards", SLOW, async || {
        ns.replicas("created-od-workers").await == Some(shards.min(10))
    })
    .await;
}

#[tokio::test]
async fn an_existing_stream_of_another_shape_is_left_as_it_is_and_reported() {
    let ns = TestNamespace::new("op-existing").await;
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, "op-existing", 1).await;
    let (output, dead) =
        (leasehold_testkit::unique_name("op-existing-out"), leasehold_testkit::unique_name("op-existing-dlq"));
    leasehold_testkit::create_named_stream(&kinesis, &output, 1).await;
    leasehold_testkit::create_named_stream(&kinesis, &dead, 1).await;
    ns.create("existing", spec(support::aws(), &stream, &output, &dead, json!({"shards": 4}))).await.expect("create");
    wait("ShapeDiffers in StreamReady", SLOW, async || {
        ns.condition("existing", "StreamReady").await.is_some_and(|(s, reason)| s == "True" && reason == "ShapeDiffers")
    })
    .await;
    wait("the workers run on the stream as it is", SLOW, async || ns.replicas("existing-workers").await == Some(1))
        .await;
    let status = ns.consumers().get("existing").await.expect("consumer").status.expect("status");
    let message = status.conditions.iter().find(|c| c.type_ == "StreamReady").map(|c| c.message.clone()).unwrap();
    assert!(message.contains(&format!("{stream} has 1 open shard(s); createIfMissing asks for 4")), "{message}");
    for name in [&stream, &output, &dead] {
        assert_eq!(shape(&kinesis, name).await, Some((StreamStatus::Active, false, 1)), "{name} untouched");
    }
}
