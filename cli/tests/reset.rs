//! `describe` and `reset` end to end on the emulators, with real worker processes.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use leasehold_testkit::kinesis::{merge, numbered, put_records, split};
use leasehold_worker::lease::{Checkpoint, LeaseKey, NewLease, ShardLeases};

const S0: &str = "shardId-000000000000";
const S1: &str = "shardId-000000000001";

fn records(keys: usize, from: u64, to: u64) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in from..to {
        for k in 0..keys {
            out.push(numbered(&format!("key-{k}"), n));
        }
    }
    out
}

fn number(data: &str) -> u64 {
    data.rsplit(':').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("bad data {data}"))
}

#[test]
fn describe_shows_the_group_and_reset_is_refused_while_a_worker_is_alive() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-describe", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-describe").await;
        put_records(&kinesis, &stream, &records(4, 0, 5)).await;
        let mut worker = spawn_worker(&config(&stream, &table, "startPosition: TRIM_HORIZON\n"), "w1");
        wait_for("the worker reads both shards", Duration::from_secs(30), async || {
            let d = describe(&table, &stream);
            d["summary"]["reading"] == 2 && d["shards"].as_array().is_some_and(|s| s.iter().all(|s| s["owner"] == "w1"))
        })
        .await;
        wait_for("every record processed", Duration::from_secs(30), async || worker.deliveries().len() >= 20).await;
        wait_for("both shards checkpointed", Duration::from_secs(30), async || {
            describe(&table, &stream)["shards"].as_array().is_some_and(|s| {
                s.iter().all(|s| s["checkpoint"].as_str().is_some_and(|c| c.bytes().all(|b| b.is_ascii_digit())))
            })
        })
        .await;

        let d = describe(&table, &stream);
        assert_eq!(d["table"], table.as_str());
        assert_eq!(d["members"][0]["owner"], "w1");
        assert_eq!(d["members"][0]["alive"], true);
        assert_eq!(d["members"][0]["leases"], 2);
        assert_eq!(d["summary"]["liveMembers"], 1);
        for shard in d["shards"].as_array().expect("shards") {
            assert_eq!(shard["stream"], stream.as_str());
            assert_eq!(shard["state"], "reading");
            assert_eq!(shard["ownerAlive"], true);
            // The holder writes its lag into the row with its renewals and checkpoints.
            assert!(shard["lagMs"].as_u64().is_some(), "the row's lag: {shard}");
            assert!(shard["checkpoint"].as_str().is_some_and(|c| c.chars().all(|c| c.is_ascii_digit())), "{shard}");
        }
        // For people: aligned columns, the members and the summary.
        let text = run(&["describe", "--table", &table, "--stream", &stream]).expect_code(0).stdout;
        assert!(text.starts_with("STREAM"), "{text}");
        assert!(text.contains("OWNER") && text.contains("STATE") && text.contains("reading"), "{text}");
        assert!(
            text.contains("2 shards: 2 reading, 0 finished, 0 waiting for parents, 0 free; 1 live member(s)"),
            "{text}"
        );
        let yaml = run(&["describe", "--table", &table, "--stream", &stream, "-o", "yaml"]).expect_code(0).stdout;
        assert!(yaml.contains("liveMembers: 1"), "{yaml}");

        // A dry run is fine while the worker runs; --execute is refused and names it.
        let dry = run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "-o", "json"]).expect_code(0);
        let plan = dry.json();
        assert_eq!(plan["dryRun"], true);
        assert_eq!(plan["changes"].as_array().map(Vec::len), Some(2));
        assert!(plan["changes"].as_array().expect("changes").iter().all(|c| c["after"] == "TRIM_HORIZON"));
        let refused =
            run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "--execute"]).expect_code(4);
        assert!(refused.stderr.contains("w1") && refused.stderr.contains("Stop them first"), "{}", refused.stderr);
        let after = describe(&table, &stream);
        assert!(after["shards"].as_array().expect("shards").iter().all(|s| s["checkpoint"] != "TRIM_HORIZON"));

        // Once the worker has left (SIGTERM: it releases and deletes its membership row), it applies.
        worker.signal("TERM");
        assert!(worker.wait_exit(Duration::from_secs(15)).is_some(), "worker did not stop");
        let done = run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "--execute", "-o", "json"])
            .expect_code(0);
        assert_eq!(done.json()["written"].as_array().map(Vec::len), Some(2));
        let after = describe(&table, &stream);
        assert_eq!(
            shard_states(&after),
            vec![
                (S0.to_string(), "TRIM_HORIZON".to_string(), "free".to_string()),
                (S1.to_string(), "TRIM_HORIZON".to_string(), "free".to_string())
            ]
        );
        // The next worker reads everything again.
        let again = spawn_worker(&config(&stream, &table, ""), "w2");
        wait_for("every record processed again", Duration::from_secs(30), async || again.deliveries().len() >= 20)
            .await;
    });
}

#[test]
fn a_row_that_changes_between_read_and_write_is_not_overwritten() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-race", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-race").await;
        // A holder whose wall clock runs an hour slow: its expiry looks long past, it has no membership
        // row, and it renews while the tool is between its read and its write.
        let ghost = store(&table, "ghost", -3_600_000).await;
        for shard in [S0, S1] {
            let new = NewLease {
                key: LeaseKey::new(stream.as_str(), shard),
                checkpoint: Checkpoint::TrimHorizon,
                parent_shard_ids: vec![],
                stream_created: None,
            };
            assert!(ghost.create_if_absent(&new).await.expect("create"));
        }
        let seen = ghost.get(&LeaseKey::new(stream.as_str(), S1)).await.expect("get").expect("row");
        let held = ghost.acquire(&seen).await.expect("acquire");

        let mut child = leasehold()
            .args(["reset", "--table", &table, "--stream", &stream, "--to-latest", "--execute"])
            .args(["--watch", "500ms", "--pause-before-write", "3s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn leasehold");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut lines = Vec::new();
        loop {
            let line = rx.recv_timeout(Duration::from_secs(20)).expect("the tool said it checked");
            lines.push(line.clone());
            if line.starts_with("checked") {
                break;
            }
        }
        let d = describe(&table, &stream);
        let ghostly = d["shards"].as_array().expect("shards").iter().find(|s| s["shard"] == S1).cloned().expect("row");
        assert_eq!((ghostly["owner"].as_str(), ghostly["ownerAlive"].as_bool()), (Some("ghost"), Some(false)));
        let renewed = ghost.renew(&held).await.expect("renew between the read and the write");
        let status = child.wait().expect("wait");
        lines.extend(rx.try_iter());
        let stderr = lines.join("\n");
        assert_eq!(status.code(), Some(5), "{stderr}");
        assert!(stderr.contains(&format!("written (1): {stream}:{S0}")), "{stderr}");
        assert!(stderr.contains(&format!("not written: {stream}:{S1}")), "{stderr}");
        let row = ghost.get(&LeaseKey::new(stream.as_str(), S1)).await.expect("get").expect("row");
        assert_eq!(
            (row.counter, row.checkpoint, row.owner.as_deref()),
            (renewed.counter, Checkpoint::TrimHorizon, Some("ghost"))
        );
        let other = ghost.get(&LeaseKey::new(stream.as_str(), S0)).await.expect("get").expect("row");
        assert_eq!(other.checkpoint, Checkpoint::Latest);
    });
}

#[test]
fn export_then_from_file_restores_and_explicit_positions_apply() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-export", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-export").await;
        let writer = store(&table, "gone", 0).await;
        let positions = [
            (S0, Checkpoint::Sequence("49500000000000000000000000000000000000000000000000000011".into())),
            (
                S1,
                Checkpoint::SubSequence {
                    sequence: "49500000000000000000000000000000000000000000000000000022".into(),
                    sub_sequence: 3,
                },
            ),
        ];
        for (shard, checkpoint) in &positions {
            let key = LeaseKey::new(stream.as_str(), *shard);
            let new = NewLease {
                key: key.clone(),
                checkpoint: Checkpoint::TrimHorizon,
                parent_shard_ids: vec![],
                stream_created: None,
            };
            writer.create_if_absent(&new).await.expect("create");
            let seen = writer.get(&key).await.expect("get").expect("row");
            let held = writer.acquire(&seen).await.expect("acquire");
            writer.release(&held, Some(checkpoint)).await.expect("release");
        }
        // A row another tool broke is reported, not fatal.
        dynamodb
            .put_item()
            .table_name(&table)
            .item("lease_key", aws_sdk_dynamodb::types::AttributeValue::S(format!("{stream}:shardId-broken")))
            .item("checkpoint", aws_sdk_dynamodb::types::AttributeValue::S("LATEST".into()))
            .send()
            .await
            .expect("put a malformed row");
        let d = describe(&table, &stream);
        assert_eq!(d["summary"]["malformed"], 1);
        assert_eq!(d["malformed"][0]["reason"], "lease_counter is missing");
        let before = shard_states(&describe(&table, &stream));
        let file = std::env::temp_dir().join(format!("{}.json", leasehold_testkit::unique_name("cli-export")));
        let file = file.to_str().expect("path");
        let exported =
            run(&["reset", "--table", &table, "--stream", &stream, "--export", file, "-o", "json"]).expect_code(0);
        assert_eq!(exported.json()["exportedTo"], file);
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).expect("file")).expect("json");
        assert_eq!(saved["checkpoints"][1]["subSequence"], 3);

        run(&["reset", "--table", &table, "--stream", &stream, "--to-latest", "--execute"]).expect_code(0);
        assert!(shard_states(&describe(&table, &stream)).iter().all(|(_, c, _)| c == "LATEST"));
        let restore = run(&["reset", "--table", &table, "--stream", &stream, "--from-file", file]).expect_code(0);
        assert!(restore.stdout.contains("dry run: 2 row(s) would change"), "{}", restore.stdout);
        assert!(restore.stdout.contains("LATEST") && restore.stdout.contains("->"), "{}", restore.stdout);
        run(&["reset", "--table", &table, "--stream", &stream, "--from-file", file, "--execute"]).expect_code(0);
        assert_eq!(shard_states(&describe(&table, &stream)), before);
        let d = describe(&table, &stream);
        let s1 = d["shards"].as_array().expect("shards").iter().find(|s| s["shard"] == S1).cloned().expect("s1");
        assert_eq!(s1["subSequence"], 3);

        // One shard by sequence, scoped; a time back from now; errors with their codes.
        let one = run(&[
            "reset",
            "--table",
            &table,
            "--stream",
            &stream,
            "--to-sequence",
            &format!("{S1}=123/4"),
            "-o",
            "json",
        ])
        .expect_code(0)
        .json();
        assert_eq!(one["changes"].as_array().map(Vec::len), Some(1));
        assert_eq!(one["changes"][0]["after"], "123/4");
        let back = run(&[
            "reset",
            "--table",
            &table,
            "--stream",
            &stream,
            "--by-duration",
            "1h",
            "--shards",
            S0,
            "-o",
            "json",
        ])
        .expect_code(0)
        .json();
        let after = back["changes"][0]["after"].as_str().expect("after").to_string();
        let ms: i64 = after.strip_prefix("AT_TIMESTAMP:").expect("a timestamp").parse().expect("ms");
        let expected = leasehold_testkit_now_ms() - 3_600_000;
        assert!((ms - expected).abs() < 60_000, "{ms} vs {expected}");
        run(&["reset", "--table", &table, "--stream", &stream, "--to-sequence", "shardId-000000000009=1"])
            .expect_code(3);
        run(&["reset", "--table", &table, "--stream", &stream, "--to-sequence", "S0=notanumber"]).expect_code(6);
        run(&["reset", "--table", &table, "--stream", "no-such-stream", "--to-earliest"]).expect_code(3);
        run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "--shards", "shardId-typo"])
            .expect_code(3);
        run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "--to-latest"]).expect_code(2);
        let _ = std::fs::remove_file(file);
    });
}

fn leasehold_testkit_now_ms() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    i64::try_from(now.as_millis()).expect("ms")
}

#[test]
fn reset_to_earliest_after_split_and_merge_reads_parents_before_children() {
    run_test(async {
        let kinesis = leasehold_testkit::kinesis_client().await;
        let dynamodb = leasehold_testkit::dynamodb_client().await;
        let stream = leasehold_testkit::create_stream(&kinesis, "cli-lineage", 2).await;
        let table = leasehold_testkit::create_lease_table(&dynamodb, "cli-lineage").await;
        let keys = 8;
        put_records(&kinesis, &stream, &records(keys, 0, 5)).await;
        split(&kinesis, &stream, S0).await;
        put_records(&kinesis, &stream, &records(keys, 5, 10)).await;
        merge(&kinesis, &stream, "shardId-000000000002", "shardId-000000000003").await;
        put_records(&kinesis, &stream, &records(keys, 10, 15)).await;
        let expected = keys * 15;
        let config = config(&stream, &table, "startPosition: TRIM_HORIZON\n");

        let mut first = spawn_worker(&config, "first");
        wait_for("the first worker processes the whole lineage", Duration::from_secs(60), async || {
            first.deliveries().len() >= expected
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        first.signal("TERM");
        assert!(first.wait_exit(Duration::from_secs(15)).is_some(), "first worker did not stop");

        // The dry run shows the whole lineage rewound, children waiting for their parents.
        let plan = run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "-o", "json"])
            .expect_code(0)
            .json();
        let changes: HashMap<String, (String, String)> = plan["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .map(|c| {
                let s = |f: &str| c[f].as_str().unwrap_or_default().to_string();
                (s("shard"), (s("after"), s("stateAfter")))
            })
            .collect();
        let want = |state: &str| ("TRIM_HORIZON".to_string(), state.to_string());
        assert_eq!(changes.len(), 5, "{plan}");
        assert_eq!(changes[S0], want("free"));
        assert_eq!(changes[S1], want("free"));
        assert_eq!(changes["shardId-000000000002"], want("waiting-for-parents"));
        assert_eq!(changes["shardId-000000000003"], want("waiting-for-parents"));
        assert_eq!(changes["shardId-000000000004"], want("waiting-for-parents"));
        let text = run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest"]).expect_code(0).stdout;
        assert!(text.contains("waiting for parents"), "{text}");

        run(&["reset", "--table", &table, "--stream", &stream, "--to-earliest", "--execute"]).expect_code(0);
        let states: HashMap<String, String> =
            shard_states(&describe(&table, &stream)).into_iter().map(|(shard, _, state)| (shard, state)).collect();
        assert_eq!(states["shardId-000000000004"], "waiting for parents".replace(' ', "-"));

        let second = spawn_worker(&config, "second");
        wait_for("the second worker processes the whole lineage again", Duration::from_secs(60), async || {
            second.deliveries().len() >= expected
        })
        .await;
        let deliveries = second.deliveries();
        let distinct: std::collections::HashSet<&str> = deliveries.iter().map(|d| d.data.as_str()).collect();
        assert_eq!(distinct.len(), expected, "every record of the lineage once more");
        assert_eq!(deliveries.len(), expected, "nothing twice");
        let mut last: HashMap<&str, u64> = HashMap::new();
        for d in &deliveries {
            let n = number(&d.data);
            if let Some(prev) = last.insert(d.partition_key.as_str(), n) {
                assert!(n > prev, "key {} went {prev} -> {n} (shard {})", d.partition_key, d.shard_id);
            }
        }
    });
}
