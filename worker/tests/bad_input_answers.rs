//! Hostile http answers (issue 30): a receiver that cuts its answers mid-body (closing or resetting the
//! connection before its Content-Length), in batch and single-record mode, and answers longer than the
//! 6 MiB limit. The receiver is a raw TCP server, so it can send what no HTTP library would: headers
//! declaring more than it sends. A cut answer must fail the call (retryably), never acknowledge a
//! record nor drop its outputs; every record named done in a readable answer is done exactly once.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use common::*;
use leasehold_testkit::kinesis::{put_records, read_all};
use leasehold_worker::processor::{HttpProcessor, Outputs, ShardProcessor};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One request the receiver read.
struct Request {
    /// Header names in lower case.
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// How the receiver ends a cut answer.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Closes the connection (FIN) half-way through the body.
    Close,
    /// Resets the connection (RST, SO_LINGER 0) half-way through the body.
    Reset,
}

/// What the receiver answers to one request.
enum Reply {
    /// `status` with the whole `body` (Content-Length); the connection is kept.
    Whole(u16, Vec<u8>),
    /// 200 declaring the whole `body`'s length, sending its first half, then ending the connection.
    Cut(Vec<u8>, Ending),
    /// 200 with `body` in chunks of 64 KiB (no Content-Length); the connection is kept.
    Chunked(Vec<u8>),
}

type Decide = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

/// A raw HTTP/1.1 server on localhost answering each request with `decide`; its base URL.
async fn receiver(decide: Decide) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, decide.clone()));
        }
    });
    format!("http://{address}")
}

/// Serves one connection until the client closes it or an answer is cut.
async fn serve(stream: TcpStream, decide: Decide) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut headers = HashMap::new();
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let Some((name, value)) = line.trim_end().split_once(':') else { break };
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
        let length: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let reply = decide(&Request { headers, body });
        let stream = reader.get_mut();
        let head = |length: Option<usize>| match length {
            Some(n) => format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {n}\r\n\r\n"),
            None => "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".into(),
        };
        match reply {
            Reply::Whole(status, body) => {
                let head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n", body.len());
                if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(&body).await.is_err() {
                    return;
                }
            }
            Reply::Chunked(body) => {
                if stream.write_all(head(None).as_bytes()).await.is_err() {
                    return;
                }
                for chunk in body.chunks(64 * 1024) {
                    let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
                    if stream.write_all(&framed).await.is_err() {
                        return;
                    }
                }
                if stream.write_all(b"0\r\n\r\n").await.is_err() {
                    return;
                }
            }
            Reply::Cut(body, ending) => {
                let _ = stream.write_all(head(Some(body.len())).as_bytes()).await;
                let _ = stream.write_all(&body[..body.len() / 2]).await;
                let _ = stream.flush().await;
                if let Ending::Reset = ending {
                    // Give the client the half it was sent before the reset discards it.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = stream.set_zero_linger();
                }
                return;
            }
        }
    }
}

/// Every sending of one record the receiver saw: whether its answer was cut, and whether a readable
/// answer acknowledged it.
#[derive(Debug, Default, Clone)]
struct Sendings(Vec<(bool, bool)>);

type Seen = Arc<Mutex<HashMap<String, Sendings>>>;

const KEYS: usize = 8;
const PER_KEY: u64 = 25;

/// Poison records (one per key): always named failed, or always cut.
fn poison(data: &str) -> bool {
    data.ends_with(":7")
}

/// The worker config: one shard of `stream`, `ordering: none`, 3 attempts 1 s apart then the
/// dead-letter stream `dead`, outputs to `out`, processor.http = `http`.
fn worker_config(stream: &str, dead: &str, out: &str, concurrency: usize, http: &str) -> String {
    config(
        stream,
        None,
        &format!(
            "startPosition: TRIM_HORIZON\nordering: none\nconcurrency: {concurrency}\n\
             retry: {{maxAttempts: 3, backoff: 1s, onExhausted: deadLetter, deadLetterStream: {dead}}}\n\
             output: {{stream: {out}}}\n"
        ),
    )
    .replace("processor: {stdout: {}}", &format!("processor: {{http: {http}}}"))
}

/// Waits until `out` holds `outputs` records and `dead` holds `letters`, then a little longer (so a
/// repeat would show), and returns both streams' data.
async fn settled(
    kinesis: &aws_sdk_kinesis::Client,
    out: &str,
    dead: &str,
    outputs: usize,
    letters: usize,
) -> (Vec<String>, Vec<serde_json::Value>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (o, d) = (read_all(kinesis, out).await.len(), read_all(kinesis, dead).await.len());
        if o >= outputs && d >= letters {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{o} of {outputs} outputs, {d} of {letters} dead letters");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let outputs = read_all(kinesis, out).await.into_iter().map(|r| r.data).collect();
    let letters =
        read_all(kinesis, dead).await.iter().map(|r| serde_json::from_str(&r.data).expect("JSON letter")).collect();
    (outputs, letters)
}

fn decoded(text: &str) -> String {
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(text).expect("base64")).expect("utf8")
}

/// The outputs are each non-poison record once; the letters each poison record once, after 3 attempts.
fn assert_outcome(written: &[(String, Vec<u8>)], outputs: &[String], letters: &[serde_json::Value]) {
    let mut expected: Vec<String> =
        written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).filter(|d| !poison(d)).collect();
    expected.sort();
    let mut outputs = outputs.to_vec();
    outputs.sort();
    assert_eq!(outputs.len(), expected.len(), "each done record's output exactly once");
    assert_eq!(outputs, expected, "the outputs of every non-poison record, once each, none of a poison one");
    let mut dead: Vec<String> = letters.iter().map(|l| decoded(l["data"].as_str().expect("data"))).collect();
    dead.sort();
    let expected: Vec<String> = (0..KEYS).map(|k| format!("key-{k}:7")).collect();
    assert_eq!(dead, expected, "every poison record dead-lettered exactly once, and nothing else");
    assert!(letters.iter().all(|l| l["attempts"] == 3), "after its 3 attempts: {letters:?}");
}

/// Every non-poison record: its first answer was cut, it was sent again and acknowledged by exactly one
/// readable answer. Every poison record: sent 3 times (maxAttempts), acknowledged by none.
fn assert_sendings(seen: &Seen, written: &[(String, Vec<u8>)]) {
    let seen = seen.lock().unwrap();
    for (_, data) in written {
        let data = String::from_utf8_lossy(data).into_owned();
        let sendings = &seen.get(&data).unwrap_or_else(|| panic!("{data} never sent")).0;
        let acknowledged = sendings.iter().filter(|(_, ack)| *ack).count();
        assert!(sendings[0].0, "{data}: its first answer was cut");
        assert!(sendings.iter().all(|(cut, ack)| !(*cut && *ack)), "{data}: a cut answer acknowledged nothing");
        if poison(&data) {
            assert_eq!((sendings.len(), acknowledged), (3, 0), "{data}: 3 attempts, none acknowledged: {sendings:?}");
        } else {
            assert!(sendings.len() >= 2, "{data}: the cut answer was not taken as done: {sendings:?}");
            assert_eq!(acknowledged, 1, "{data}: acknowledged by exactly one readable answer: {sendings:?}");
        }
    }
}

/// A stream with the test's records, an output stream and a dead-letter stream.
async fn streams(prefix: &str) -> (aws_sdk_kinesis::Client, String, String, String, Vec<(String, Vec<u8>)>) {
    let kinesis = leasehold_testkit::kinesis_client().await;
    let stream = leasehold_testkit::create_stream(&kinesis, prefix, 1).await;
    let dead = leasehold_testkit::create_stream(&kinesis, &format!("{prefix}-dlq"), 1).await;
    let out = leasehold_testkit::create_stream(&kinesis, &format!("{prefix}-out"), 1).await;
    let written = records(KEYS, 0, PER_KEY);
    put_records(&kinesis, &stream, &written).await;
    (kinesis, stream, dead, out, written)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_cutting_its_batch_answers_acknowledges_nothing_and_poison_is_dead_lettered() {
    let (kinesis, stream, dead, out, written) = streams("cutbatch").await;
    // A batch holding a record sent for the first time gets its answer cut half-way (closed or reset,
    // in turn); other batches are answered whole. Every answer names the poison records in Lambda's
    // batchItemFailures and gives every other record one output, its own data.
    let seen: Seen = Arc::default();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (log, count) = (seen.clone(), requests.clone());
    let decide: Decide = Arc::new(move |request| {
        let events: Vec<serde_json::Value> = serde_json::from_slice(&request.body).expect("a batch");
        let mut seen = log.lock().unwrap();
        let datas: Vec<String> = events.iter().map(|e| decoded(e["data_base64"].as_str().unwrap())).collect();
        let first_time = datas.iter().any(|d| !seen.contains_key(d));
        let mut failures = Vec::new();
        let mut outputs = Vec::new();
        for (event, data) in events.iter().zip(&datas) {
            let acknowledged = !first_time && !poison(data);
            seen.entry(data.clone()).or_default().0.push((first_time, acknowledged));
            if poison(data) {
                failures.push(serde_json::json!({"itemIdentifier": event["sequencenumber"]}));
            } else {
                outputs.push(serde_json::json!({"id": event["id"], "data": event["data_base64"]}));
            }
        }
        let answer = serde_json::json!({"batchItemFailures": failures, "outputs": outputs}).to_string().into_bytes();
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match first_time {
            true => Reply::Cut(answer, if n % 2 == 0 { Ending::Close } else { Ending::Reset }),
            false => Reply::Whole(200, answer),
        }
    });
    let url = receiver(decide).await;
    let http = format!("{{url: '{url}/batch', timeout: 5s, batch: {{maxRecords: 64, maxDelay: 20ms}}}}");
    let mut worker = spawn(&worker_config(&stream, &dead, &out, 200, &http), "cutbatch-1");
    let (outputs, letters) = settled(&kinesis, &out, &dead, written.len() - KEYS, KEYS).await;
    assert_running(&mut [&mut worker]);
    assert_outcome(&written, &outputs, &letters);
    assert_sendings(&seen, &written);
    let logs = worker.stderr_text();
    assert!(logs.contains("http answer unreadable; the call failed"), "the cut answers are logged:\n{logs}");
    let processed = metric(&worker, "leasehold_records_processed_total").await;
    assert_eq!(processed as usize, written.len() - KEYS, "done exactly once each, never at a cut answer");
    let failed = metric(&worker, "leasehold_records_failed_total").await;
    assert!(
        failed as usize >= written.len() + 2 * KEYS,
        "each record's cut attempt and the poison's two more: {failed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_cutting_its_answers_to_single_records_drops_no_outputs() {
    let (kinesis, stream, dead, out, written) = streams("cutsingle").await;
    // Every answer carries one output, the record's data; a poison record's answer is always cut, every
    // other record's the first time only.
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let decide: Decide = Arc::new(move |request| {
        let data = String::from_utf8_lossy(&request.body).into_owned();
        assert!(request.headers.contains_key("ce-id"), "binary mode");
        let mut seen = log.lock().unwrap();
        let sendings = seen.entry(data.clone()).or_default();
        let cut = poison(&data) || sendings.0.is_empty();
        sendings.0.push((cut, !cut));
        let encoded = base64::engine::general_purpose::STANDARD.encode(&request.body);
        let answer = serde_json::json!({"outputs": [{"data": encoded}]}).to_string().into_bytes();
        match cut {
            true => Reply::Cut(answer, if sendings.0.len().is_multiple_of(2) { Ending::Reset } else { Ending::Close }),
            false => Reply::Whole(200, answer),
        }
    });
    let url = receiver(decide).await;
    let http = format!("{{url: '{url}/records', timeout: 5s}}");
    let mut worker = spawn(&worker_config(&stream, &dead, &out, 32, &http), "cutsingle-1");
    let (outputs, letters) = settled(&kinesis, &out, &dead, written.len() - KEYS, KEYS).await;
    assert_running(&mut [&mut worker]);
    assert_outcome(&written, &outputs, &letters);
    assert_sendings(&seen, &written);
    for (data, sendings) in seen.lock().unwrap().iter().filter(|(d, _)| !poison(d)) {
        assert_eq!(sendings.0.len(), 2, "{data}: the cut attempt, then one whole answer");
    }
    let processed = metric(&worker, "leasehold_records_processed_total").await;
    assert_eq!(processed as usize, written.len() - KEYS);
    assert!(worker.stderr_text().contains("broke off"), "the cut is named in the log");
}

/// 7 MiB of plain text: a harmless answer, but longer than the limit.
fn too_long() -> Vec<u8> {
    vec![b'x'; 7 * 1024 * 1024]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_limit_fails_the_call_and_is_named_in_the_log() {
    // In process: a declared Content-Length over the limit, and chunks adding up to more, both fail the
    // call retryably; an answer just under the limit is read.
    let decide: Decide = Arc::new(|request| match request.body.as_slice() {
        b"declared" => Reply::Whole(200, too_long()),
        b"chunked" => Reply::Chunked(too_long()),
        _ => Reply::Chunked(vec![b' '; 6 * 1024 * 1024 - 1]),
    });
    let url = receiver(decide).await;
    let processor = HttpProcessor::new(&format!("{url}/records"), Duration::from_secs(5)).expect("processor");
    let mut record = leasehold_worker::processor::Record {
        stream: Arc::from("orders"),
        shard_id: Arc::from("shardId-000000000000"),
        sequence_number: "1".into(),
        partition_key: "k".into(),
        explicit_hash_key: None,
        data: bytes::Bytes::from_static(b"declared"),
        arrival_ms: None,
        sub_sequence_number: None,
    };
    for data in [&b"declared"[..], b"chunked"] {
        record.data = bytes::Bytes::copy_from_slice(data);
        let error = processor.process(&record, &mut Outputs::default()).await.expect_err("over the limit");
        assert!(error.retryable && error.message.contains("6291456"), "{error:?}");
        assert!(error.message.contains(&url), "names the receiver: {error:?}");
    }
    record.data = bytes::Bytes::from_static(b"under");
    processor.process(&record, &mut Outputs::default()).await.expect("an answer under the limit is read");

    // A worker: the first answer to key-0:3 is declared too long, to key-1:3 chunked too long; every
    // other answer is whole, and every record is done exactly once.
    let (kinesis, stream, dead, out, written) = streams("toolong").await;
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let log = seen.clone();
    let decide: Decide = Arc::new(move |request| {
        let data = String::from_utf8_lossy(&request.body).into_owned();
        let mut seen = log.lock().unwrap();
        let sendings = seen.entry(data.clone()).or_default();
        *sendings += 1;
        let encoded = base64::engine::general_purpose::STANDARD.encode(&request.body);
        let answer = serde_json::json!({"outputs": [{"data": encoded}]}).to_string().into_bytes();
        match (*sendings, data.as_str()) {
            (1, "key-0:3") => Reply::Whole(200, too_long()),
            (1, "key-1:3") => Reply::Chunked(too_long()),
            _ => Reply::Whole(200, answer),
        }
    });
    let url = receiver(decide).await;
    let http = format!("{{url: '{url}/records', timeout: 5s}}");
    let mut worker = spawn(&worker_config(&stream, &dead, &out, 8, &http), "toolong-1");
    let (mut outputs, letters) = settled(&kinesis, &out, &dead, written.len(), 0).await;
    assert_running(&mut [&mut worker]);
    assert!(letters.is_empty(), "nothing dead-lettered: {letters:?}");
    let mut expected: Vec<String> = written.iter().map(|(_, d)| String::from_utf8_lossy(d).into_owned()).collect();
    expected.sort();
    outputs.sort();
    assert_eq!(outputs, expected, "every record's output exactly once");
    let sent = |data: &str| seen.lock().unwrap()[data];
    assert_eq!((sent("key-0:3"), sent("key-1:3")), (2, 2), "each too-long answer failed its call, sent again");
    let logs = worker.stderr_text();
    let named: Vec<&str> = logs.lines().filter(|l| l.contains("http answer unreadable; the call failed")).collect();
    assert_eq!(named.len(), 2, "each over-long answer logged once:\n{logs}");
    assert!(named.iter().any(|l| l.contains(&url) && l.contains("declares 7340032 bytes")), "{named:?}");
    assert!(named.iter().any(|l| l.contains(&url) && l.contains("longer than")), "{named:?}");
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "no log line holds the answer: the longest is {longest} bytes");
    let processed = metric(&worker, "leasehold_records_processed_total").await;
    assert_eq!(processed as usize, written.len());
}
