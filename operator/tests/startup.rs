//! The operator refuses to start, saying how to fix it, when the CRD is not installed. A stand-in API
//! server answers 404 for the CRD, as a cluster without it would.

use std::process::Command;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;

async fn not_found() -> impl IntoResponse {
    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"customresourcedefinitions.apiextensions.k8s.io \"streamconsumers.leasehold.io\" not found","reason":"NotFound","details":{"name":"streamconsumers.leasehold.io","group":"apiextensions.k8s.io","kind":"customresourcedefinitions"},"code":404}"#;
    (StatusCode::NOT_FOUND, [("content-type", "application/json")], status)
}

#[tokio::test]
async fn a_missing_crd_stops_the_operator_with_instructions() {
    let server = leasehold_testkit::server::LocalServer::start(Router::new().fallback(not_found)).await;
    let endpoint = server.endpoint();
    let kubeconfig = std::env::temp_dir().join(format!("no-crd-{}.yaml", std::process::id()));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{endpoint}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_leasehold-operator"))
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("run the operator")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("streamconsumers.leasehold.io is not installed"), "{stderr}");
    assert!(stderr.contains("kubectl apply -f crds/streamconsumer.yaml"), "{stderr}");
}
