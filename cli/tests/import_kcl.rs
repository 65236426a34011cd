//! `import-kcl` against lease tables built per the Java KCL's own serializers
//! (`DynamoDBLeaseSerializer`, `DynamoDBMultiStreamLeaseSerializer`): single-stream rows with a
//! pending checkpoint, a KPL aggregate checkpointed at a sub-sequence, a 3.x non-lease row,
//! multi-stream keys; then a Leasehold worker resumes exactly after the KCL's checkpoints.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use aws_sdk_kinesis::primitives::Blob;
use common::*;

const S0: &str = "shardId-000000000000";
const S1: &str = "shardId-000000000001";
/// Explicit hash keys that land in the first and the second of two shards.
const LOW: &str = "0";
const HIGH: &str = "340282366920938463463374607431768211455";

async fn kcl_table(client: &aws_sdk_dynamodb::Client) -> String {
    let name = leasehold_testkit::unique_name("kcl-app");
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("leaseKey")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute"),
        )
        .key_schema(
            KeySchemaElement::builder().attribute_name("leaseKey").key_type(KeyType::Hash).build().expect("key"),
        )
        .send()
        .await
        .expect("create KCL table");
    for _ in 0..200 {
        let out = client.describe_table().table_name(&name).send().await.ok();
        if out.and_then(|t| t.table).and_then(|t| t.table_status) == Some(TableStatus::Active) {
            return name;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("KCL table {name} not ACTIVE");
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A lease row as the KCL 2.x/3.x `DynamoDBLeaseSerializer.toDynamoRecord` writes it.
fn kcl_row(
    key: &str,
    owner: &str,
    counter: i64,
    checkpoint: &str,
    sub: i64,
    pending: Option<&str>,
) -> HashMap<String, AttributeValue> {
    let mut item: HashMap<String, AttributeValue> = [
        ("leaseKey", s(key)),
        ("leaseOwner", s(owner)),
        ("leaseCounter", n(counter)),
        ("ownerSwitchesSinceCheckpoint", n(0)),
        ("checkpoint", s(checkpoint)),
        ("checkpointSubSequenceNumber", n(sub)),
        ("entityType", s("LEASE")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(pending) = pending {
        item.insert("pendingCheckpoint".into(), s(pending));
        item.insert("pendingCheckpointSubSequenceNumber".into(), n(0));
    }
    item
}

async fn put_item(client: &aws_sdk_dynamodb::Client, table: &str, item: HashMap<String, AttributeValue>) {
    client.put_item().table_name(table).set_item(Some(item)).send().await.expect("put KCL row");
}

async fn put(kinesis: &aws_sdk_kinesis::Client, stream: &str, hash: &str, data: Vec<u8>) -> String {
    kinesis
        .put_record()
        .stream_name(stream)
        .partition_key("pk")
        .explicit_hash_key(hash)
        .data(Blob::new(data))
        .send()
        .await
        .expect("put record")
        .sequence_number
}

#[test]
fn kcl_checkpoints_are_imported_and_a_worker_resumes_exactly_after_them() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-kcl", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-kcl").await;
        let from = kcl_table(&dynamodb).await;

        // Shard 0: ten plain records; shard 1: a plain one, a KPL aggregate of three, a plain one.
        let mut low = Vec::new();
        for i in 0..10 {
            low.push(put(&kinesis, &stream, LOW, format!("r{i}").into_bytes()).await);
        }
        put(&kinesis, &stream, HIGH, b"p0".to_vec()).await;
        let users: Vec<(String, Vec<u8>)> =
            (0..3).map(|i| (format!("user-{i}"), format!("u{i}").into_bytes())).collect();
        let aggregate = leasehold_worker::internals::kpl::aggregate(
            users.iter().map(|(pk, d)| (pk.as_str(), Some(HIGH), d.as_slice())),
        );
        let aggregate_seq = put(&kinesis, &stream, HIGH, aggregate.to_vec()).await;
        put(&kinesis, &stream, HIGH, b"p1".to_vec()).await;

        // The KCL processed r0..r4 (a two-phase checkpoint prepared at r6) and u0, u1 of the aggregate.
        put_item(&dynamodb, &from, kcl_row(S0, "kcl-a", 7, &low[4], 0, Some(&low[6]))).await;
        put_item(&dynamodb, &from, kcl_row(S1, "kcl-a", 9, &aggregate_seq, 1, None)).await;
        let metrics: HashMap<String, AttributeValue> =
            [("leaseKey".to_string(), s("kcl-a")), ("entityType".to_string(), s("WORKER_METRICS_STATS"))]
                .into_iter()
                .collect();
        put_item(&dynamodb, &from, metrics).await;

        let args = ["import-kcl", "--table", &table, "--stream", &stream, "--from", &from];
        let dry = run(&[&args[..], &["-o", "json"]].concat()).expect_code(0).json();
        assert_eq!(dry["dryRun"], true);
        assert_eq!(dry["skipped"], serde_json::json!(["kcl-a"]));
        let imports = dry["imports"].as_array().expect("imports");
        assert_eq!(imports.len(), 2);
        assert_eq!(imports[0]["shard"], S0);
        assert_eq!(imports[0]["after"], low[4].as_str());
        assert!(imports[0]["note"].as_str().is_some_and(|n| n.contains("pending checkpoint")), "{dry}");
        assert_eq!(imports[1]["after"], format!("{aggregate_seq}/1"));
        let text = run(&args).expect_code(0).stdout;
        assert!(text.contains("dry run: 2 checkpoint(s) would be imported"), "{text}");

        // Refused while the KCL application renews its leases.
        let child = leasehold()
            .args(args)
            .args(["--execute", "--watch", "3s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        tokio::time::sleep(Duration::from_secs(1)).await;
        put_item(&dynamodb, &from, kcl_row(S0, "kcl-a", 8, &low[4], 0, Some(&low[6]))).await;
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(stderr.contains("kcl-a") && stderr.contains("--force"), "{stderr}");
        assert!(describe(&table, &stream)["shards"].as_array().is_some_and(Vec::is_empty), "nothing written");

        // Stopped: imported.
        let done = run(&[&args[..], &["--execute", "--watch", "1s", "-o", "json"]].concat()).expect_code(0).json();
        assert_eq!(done["written"].as_array().map(Vec::len), Some(2));
        let d = describe(&table, &stream);
        let shards = d["shards"].as_array().expect("shards");
        assert_eq!(
            (shards[0]["checkpoint"].as_str(), shards[0]["subSequence"].as_u64()),
            (Some(low[4].as_str()), None)
        );
        assert_eq!(
            (shards[1]["checkpoint"].as_str(), shards[1]["subSequence"].as_u64()),
            (Some(aggregate_seq.as_str()), Some(1))
        );

        // A Leasehold worker (told to start at TRIM_HORIZON, which the imported checkpoints override)
        // processes everything after the KCL's checkpoints and nothing before.
        let worker = spawn_worker(&config(&stream, &table, "startPosition: TRIM_HORIZON\n"), "after-kcl");
        wait_for("the records after the KCL's checkpoints", Duration::from_secs(30), async || {
            worker.deliveries().len() >= 7
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let got: Vec<String> = worker.deliveries().into_iter().map(|d| d.data).collect();
        let want: BTreeSet<String> = ["r5", "r6", "r7", "r8", "r9", "u2", "p1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(got.len(), 7, "no repeats: {got:?}");
        assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want);
    });
}

#[test]
fn multi_stream_keys_other_streams_and_malformed_rows() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-kcl-multi", 2).await;
        let other = leasehold_testkit::create_stream(&kinesis, "cli-kcl-other", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-kcl-multi").await;
        let summary = kinesis.describe_stream_summary().stream_name(&stream).send().await.expect("describe");
        let epoch = summary.stream_description_summary.expect("summary").stream_creation_timestamp.secs();
        let seq = put(&kinesis, &stream, HIGH, b"m0".to_vec()).await;

        // Multi-stream rows (DynamoDBMultiStreamLeaseSerializer adds streamName and shardId).
        let multi = kcl_table(&dynamodb).await;
        for (shard, checkpoint) in [(S0, "TRIM_HORIZON"), (S1, seq.as_str())] {
            let mut row = kcl_row(&format!("123456789012:{stream}:{epoch}:{shard}"), "kcl-b", 3, checkpoint, 0, None);
            row.insert("streamName".into(), s(&format!("123456789012:{stream}:{epoch}")));
            row.insert("shardId".into(), s(shard));
            put_item(&dynamodb, &multi, row).await;
        }
        let plan = run(&["import-kcl", "--table", &table, "--stream", &stream, "--from", &multi, "-o", "json"])
            .expect_code(0)
            .json();
        let after: Vec<&str> =
            plan["imports"].as_array().expect("imports").iter().filter_map(|i| i["after"].as_str()).collect();
        assert_eq!(after, vec!["TRIM_HORIZON", seq.as_str()]);
        run(&["import-kcl", "--table", &table, "--stream", &stream, "--from", &multi, "--execute", "--watch", "0s"])
            .expect_code(0);
        let states = shard_states(&describe(&table, &stream));
        assert_eq!(states[1].1, seq);

        // The consumer reads another stream than the KCL application did.
        let wrong = run(&["import-kcl", "--table", &table, "--stream", &other, "--from", &multi]).expect_code(3);
        assert!(wrong.stderr.contains(&format!("is about stream {stream}")), "{}", wrong.stderr);
        // A single-stream table whose checkpoints are not sequence numbers of the stream given.
        let single = kcl_table(&dynamodb).await;
        put_item(&dynamodb, &single, kcl_row(S1, "kcl-c", 1, &seq, 0, None)).await;
        let foreign = run(&["import-kcl", "--table", &table, "--stream", &other, "--from", &single]).expect_code(3);
        assert!(foreign.stderr.contains("another stream"), "{}", foreign.stderr);
        // A stream recreated since the KCL's rows were written.
        let stale = kcl_table(&dynamodb).await;
        put_item(
            &dynamodb,
            &stale,
            kcl_row(&format!("123456789012:{stream}:{}:{S0}", epoch - 100), "x", 1, "LATEST", 0, None),
        )
        .await;
        run(&["import-kcl", "--table", &table, "--stream", &stream, "--from", &stale]).expect_code(3);
        // A malformed row and a missing table.
        let broken = kcl_table(&dynamodb).await;
        put_item(&dynamodb, &broken, [("leaseKey".to_string(), s(S0))].into_iter().collect()).await;
        let malformed = run(&["import-kcl", "--table", &table, "--stream", &stream, "--from", &broken]).expect_code(6);
        assert!(malformed.stderr.contains("checkpoint is missing"), "{}", malformed.stderr);
        run(&["import-kcl", "--table", &table, "--stream", &stream, "--from", "no-such-kcl-table"]).expect_code(3);
    });
}
