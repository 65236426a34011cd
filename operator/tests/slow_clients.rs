//! The operator's `/healthz` and `/metrics` answer within a second while 1,000 slow clients hold
//! connections open (each sent part of a request's headers and stalled), and the slow ones are closed
//! by the header timeout (issue 31). A stand-in API server answers the operator's start: the CRD
//! exists, every list is empty, every watch stays open.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use leasehold_testkit::process::KillOnDrop;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"streamconsumers.leasehold.io","resourceVersion":"1"},"spec":{"group":"leasehold.io","names":{"kind":"StreamConsumer","plural":"streamconsumers"},"scope":"Namespaced","versions":[]}}"#;
const EMPTY: &str = r#"{"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":"1"},"items":[]}"#;

async fn api(request: Request) -> impl IntoResponse {
    let query = request.uri().query().unwrap_or_default();
    if query.split('&').any(|p| p == "watch=true" || p == "watch=1") {
        // A watch with nothing to tell: held open as an idle API server holds it.
        tokio::time::sleep(Duration::from_secs(120)).await;
        return ([("content-type", "application/json")], String::new());
    }
    let body = if request.uri().path().ends_with("/customresourcedefinitions/streamconsumers.leasehold.io") {
        CRD
    } else {
        EMPTY
    };
    ([("content-type", "application/json")], body.to_string())
}

/// One GET on a fresh connection: the status code (0: no answer).
async fn get(address: &str, path: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(address).await else { return 0 };
    let request = format!("GET {path} HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return 0;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slow_connections_leave_the_operators_probes_answering() {
    let limit = rlimit::increase_nofile_limit(u64::MAX).expect("raise RLIMIT_NOFILE");
    assert!(limit >= 4096, "the test needs 4,096 open files; the hard limit is {limit}");
    let server = leasehold_testkit::server::LocalServer::start(Router::new().fallback(api)).await;
    let endpoint = server.endpoint();
    let kubeconfig = std::env::temp_dir().join(format!("slow-clients-{}.yaml", std::process::id()));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{endpoint}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .expect("kubeconfig");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let address = format!("127.0.0.1:{port}");
    let operator = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold-operator"))
        .args(["--metrics-addr", &address, "--namespace", "slow"])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the operator");
    let _operator = KillOnDrop::new(operator);
    let started = Instant::now();
    while get(&address, "/healthz").await != 200 {
        assert!(started.elapsed() < Duration::from_secs(30), "the operator never answered /healthz");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let opened_at = Instant::now();
    let mut slow = Vec::with_capacity(1_000);
    for _ in 0..1_000 {
        let mut stream = TcpStream::connect(&address).await.expect("connect");
        let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: o\r\nX-Slow: ").await;
        slow.push(stream);
    }
    println!("1,000 slow connections opened in {:?}", opened_at.elapsed());
    for path in ["/healthz", "/metrics", "/healthz"] {
        let asked = Instant::now();
        let code = tokio::time::timeout(Duration::from_secs(1), get(&address, path)).await.unwrap_or(0);
        println!("{path}: {code} in {:?} with 1,000 slow connections open", asked.elapsed());
        assert_eq!(code, 200, "{path} did not answer within a second");
    }
    // Closed by the header timeout (5 s).
    let until = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut closed = 0;
    for stream in &mut slow {
        let mut buffer = [0u8; 64];
        if tokio::time::timeout_at(until, stream.read(&mut buffer)).await.is_ok() {
            closed += 1;
        }
    }
    println!("{closed} of 1,000 closed within {:?} of opening", opened_at.elapsed());
    assert_eq!(closed, slow.len(), "slow clients are closed by the header timeout");
    let _ = std::fs::remove_file(&kubeconfig);
}
