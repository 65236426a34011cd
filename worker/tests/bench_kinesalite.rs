//! The throughput benches' kinesalite (`kinesalite-loopback.js --bigintSequences`: sequence numbers
//! parsed with BigInt, not bignumber.js) answers as the published kinesalite does. The same calls, on
//! the tests' kinesalite and on one started with the flag, give the same records, the same shard ends
//! and the same errors; and its start-up check refuses a parser that differs from kinesalite's.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use leasehold_testkit::kinesis::{numbered, put_records, split, trim_horizon};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn kinesalite_module() -> PathBuf {
    let module = leasehold_testkit::cache_dir().join("npm-emulators/node_modules/kinesalite");
    assert!(module.is_dir(), "{} is missing: run tests/ground/emulators.sh install (make test does)", module.display());
    module
}

fn loopback_script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/ground/kinesalite-loopback.js"))
}

/// A kinesalite with BigInt sequence numbers on a free port: the process (killed on drop), its
/// endpoint, and what it printed before listening.
async fn bigint_kinesalite() -> (Child, String, Vec<String>) {
    let mut child = Command::new("node")
        .arg(loopback_script())
        .arg(kinesalite_module())
        .args(["--port", "0", "--bigintSequences", "--shardLimit", "1000"])
        .args(["--createStreamMs", "50", "--deleteStreamMs", "50", "--updateStreamMs", "50"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs kinesalite-loopback.js (Node 20: apt-get install nodejs)");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut printed = Vec::new();
    let endpoint = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("kinesalite's stdout") {
            if let Some(address) = line.strip_prefix("kinesalite listening at ") {
                return address.to_string();
            }
            printed.push(line);
        }
        panic!("kinesalite exited before listening: {printed:?}")
    })
    .await
    .expect("kinesalite listening within 30 s");
    (child, endpoint, printed)
}

/// Every answer of a fixed series of calls that parse sequence numbers, with the sequence numbers
/// themselves left out (they carry the time of the call).
async fn answers(client: &Client) -> Vec<String> {
    let stream = leasehold_testkit::create_stream(client, "bigintseq", 2).await;
    let first: Vec<_> = (0..200).map(|n| numbered(&format!("key-{}", n % 13), n)).collect();
    put_records(client, &stream, &first).await;
    split(client, &stream, "shardId-000000000000").await;
    let second: Vec<_> = (200..300).map(|n| numbered(&format!("key-{}", n % 13), n)).collect();
    put_records(client, &stream, &second).await;

    let mut out = Vec::new();
    let shards =
        client.list_shards().stream_name(&stream).send().await.expect("list shards").shards.unwrap_or_default();
    for shard in &shards {
        let iterator = trim_horizon(client, &stream, &shard.shard_id).await;
        let (records, ended) = read_to_end(client, iterator).await;
        out.push(format!("{}: {} records, ended {ended}", shard.shard_id, records.len()));
        out.extend(records.iter().map(|(key, data, _)| format!("{key} {data}")));
        // After the tenth record: the rest, and at it: the rest with it.
        if let Some((_, _, sequence)) = records.get(10) {
            for kind in [ShardIteratorType::AfterSequenceNumber, ShardIteratorType::AtSequenceNumber] {
                let iterator = client
                    .get_shard_iterator()
                    .stream_name(&stream)
                    .shard_id(&shard.shard_id)
                    .shard_iterator_type(kind.clone())
                    .starting_sequence_number(sequence)
                    .send()
                    .await
                    .expect("an iterator at a sequence number")
                    .shard_iterator;
                let (rest, _) = read_to_end(client, iterator).await;
                out.push(format!("{kind:?} the tenth: {} records, first {:?}", rest.len(), rest.first().map(|r| &r.1)));
            }
        }
    }
    for bad in ["12ab", "1e30", "", &"9".repeat(80), "49590338271490256608559692538361571095921575989136588898"] {
        let answer = client
            .get_shard_iterator()
            .stream_name(&stream)
            .shard_id("shardId-000000000001")
            .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
            .starting_sequence_number(bad)
            .send()
            .await;
        out.push(format!(
            "sequence {bad:?}: {}",
            answer.map_or_else(|e| format!("{:?}", e.into_service_error().meta().code()), |_| "ok".into())
        ));
    }
    out
}

/// Reads from `iterator` up to the first empty page: (key, data, sequence number) of every record, and
/// whether the shard ended there (no next iterator).
async fn read_to_end(client: &Client, mut iterator: Option<String>) -> (Vec<(String, String, String)>, bool) {
    let mut records = Vec::new();
    while let Some(current) = iterator {
        let page = client.get_records().shard_iterator(current).send().await.expect("get records");
        iterator = page.next_shard_iterator;
        if page.records.is_empty() {
            break;
        }
        records.extend(
            page.records
                .into_iter()
                .map(|r| (r.partition_key, String::from_utf8_lossy(r.data.as_ref()).into_owned(), r.sequence_number)),
        );
    }
    (records, iterator.is_none())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benches_kinesalite_answers_as_the_published_one() {
    let (_child, endpoint, printed) = bigint_kinesalite().await;
    let compared: usize = printed
        .iter()
        .find_map(|l| l.strip_prefix("kinesalite: sequence numbers parsed with BigInt (same result on "))
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no start-up comparison printed: {printed:?}"));
    assert!(compared >= 12_000, "compared on {compared} inputs");

    let published = answers(&leasehold_testkit::kinesis_client().await).await;
    let bigint = answers(&Client::new(&leasehold_testkit::sdk_config(endpoint).await)).await;
    assert!(published.len() > 300, "the series read the records back: {published:?}");
    assert!(published.iter().any(|a| a.ends_with("ended true")), "the split parent ends: {published:?}");
    assert!(published.iter().any(|a| a.contains("InvalidArgumentException")), "{published:?}");
    assert_eq!(bigint, published);
}

#[tokio::test]
async fn the_start_up_check_refuses_a_parser_that_differs() {
    let module = kinesalite_module();
    let bigint = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/ground/kinesalite-bigint.js"));
    // kinesalite's db with a parser one off in the sequence index of version-2 numbers: install() must
    // throw before replacing it.
    let script = format!(
        "const db = require({db:?}); const original = db.parseSequence;
         db.parseSequence = s => {{ const o = original(s); if (o.version == 2) o.seqIx = String(BigInt(o.seqIx) + 1n); return o }};
         require({bigint:?}).install(db)",
        db = module.join("db/index.js"),
        bigint = bigint,
    );
    let out = Command::new("node").args(["-e", &script]).output().await.expect("node runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a differing parser was installed");
    assert!(stderr.contains("BigInt parseSequence differs on"), "{stderr}");
}
